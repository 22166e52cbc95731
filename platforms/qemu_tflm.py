"""Run a `.tflite` file in the incumbent's runtime on QEMU: TensorFlow Lite Micro with its
CMSIS-NN kernels, built for the same core, board support and memory map as our runner
(kernels/native/tflm.py), on the same QEMU machine (platforms/qemu_machines/ or the platform's
runner/firmware.yaml). A Vela-compiled file's `ethos-u` operators run through TFLM's Ethos-U
kernel and the same Ethos-U core driver, whose command streams the same semihosting bridge hands
to the host (platforms/qemu_npu_bridge.py) with the caller's `npu_handler`.

The model goes where our runner puts a program image (the machine's program region, at the
platform's FVP load address where it lies there), TFLM's tensor arena into the free part of the
machine's planned-buffer region; TFLM sizes the arena itself and reports what it used. The
inputs travel as a host file (every case's input tensors, in order) and the outputs come back
the same way; per-inference figures are executed instructions from the icount-driven SysTick,
as for our runner (platforms/qemu.py).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kernels.native.runner import Firmware
from kernels.native.tflm import build_tflm_runner
from kernels.native.tflm_release import TflmRelease, build_tflm_release
from kernels.native.toolchains import find_qemu
from platforms.firmware_recipe import NoEthosUInQemu, runner_spec
from platforms.platform import Platform, load_platform
from platforms.qemu import (DEFAULT_TIMEOUT_S, ElfRun, npu_method, program_address,
                            qemu_loader, run_elf, run_qemu_process)
from platforms.qemu_machines import qemu_runner
from platforms.runner_protocol import (CALIBRATION, CASE_TICKS, EXIT_MEANING, TFLM_ARENA,
                                       TFLM_ERROR, TFLM_INPUT_FILE, TFLM_MAILBOX,
                                       TFLM_MAILBOX_MAGIC, TFLM_MAILBOX_VERSION,
                                       TFLM_OUTPUT_FILE, TFLM_PROFILE, TFLM_PROFILE_ROW)

ETHOS_U_OPERATOR = "ethos-u"


@dataclass(frozen=True)
class TflmQemuResult:
    """One QEMU run of TFLM: every case's output bytes (all output tensors, in order), the
    instructions of each inference (icount), TFLM's arena as it reported it, and the firmware."""

    ok: bool
    outputs: tuple[bytes, ...]  # one per case
    instructions: tuple[int, ...]  # one per inference (cases x repeats)
    arena_used_bytes: int | None
    arena_bytes: int | None
    arena_region: str | None
    log: str = field(repr=False)
    errors: tuple[str, ...]
    exit_code: int | None
    run_seconds: float
    firmware: Firmware = field(repr=False)
    method: str
    core: str
    npu: str | None = None
    npu_invocations: int = 0
    npu_commands: int = 0
    # With `profile`: each inference's operators as TFLM's MicroProfiler timed them, (tag,
    # instructions) in execution order.
    operators: tuple[tuple[tuple[str, int], ...], ...] = ()

    @property
    def median_instructions(self) -> int | None:
        counts = sorted(self.instructions)
        return counts[len(counts) // 2] if counts else None


def run_tflite_on_qemu(
    tflite_path: str | Path,
    operators: Iterable[str],
    cases: Sequence[bytes],
    platform: Platform | str = "corstone300",
    *,
    cpu: str | None = None,
    npu: str | None = None,
    npu_handler=None,
    npu_fast_scratch_bytes: int = 0,
    repeats: int = 1,
    profile: bool = False,
    arena_bytes: int = 0,
    timeout_s: int = DEFAULT_TIMEOUT_S,
    third_party: str | Path | None = None,
    cache_dir: str | Path | None = None,
    jobs: int | None = None,
) -> TflmQemuResult:
    """Run `tflite_path` (whose operators are `operators`: builtin names, and "ethos-u" for a
    Vela-compiled file) on each input case (the bytes of every input tensor, in order) in TFLM
    on QEMU. A file with Vela's operators needs `npu` (the accelerator it was compiled for) and
    `npu_handler` (what computes each command stream on the host). With `profile`, TFLM's
    MicroProfiler times every operator (`TflmQemuResult.operators`); its own work is then in the
    inference's figures, so a profiled run is not the one to read instructions from.
    `arena_bytes` bounds TFLM's arena (0: all the region leaves free). Raises
    QemuUnavailable ("not run: ...") when the run cannot happen here."""
    tflite_path = Path(tflite_path)
    platform = load_platform(platform) if isinstance(platform, str) else platform
    platform, config = qemu_runner(platform, cpu)
    operators = tuple(sorted(set(operators)))
    npu_product = None
    if ETHOS_U_OPERATOR in operators:
        npu_product = config.npu_product(npu)
        if npu_handler is None or npu_product is None:
            raise NoEthosUInQemu(
                f"{tflite_path.name} holds Vela's ethos-u operators for {npu or 'an Ethos-U'}; "
                f"the {platform.name} runner's NPU bridge serves "
                f"{', '.join(config.npu_products) or 'no NPU'}; nothing was run")
    firmware = build_tflm_runner(operators, runner_spec(platform, config, npu_product),
                                 third_party=third_party, cache_dir=cache_dir, jobs=jobs)
    qemu = find_qemu()
    size = tflite_path.stat().st_size
    image_region = platform.memory(config.default_program_region)
    model_address = program_address(platform, config, firmware, image_region, size)
    arena_region = config.default_planned_region
    mailbox = TFLM_MAILBOX.pack(TFLM_MAILBOX_MAGIC, TFLM_MAILBOX_VERSION, model_address, size,
                                arena_region.encode(), arena_bytes, len(cases), max(1, repeats),
                                npu_fast_scratch_bytes if npu_product else 0, int(profile))
    with tempfile.TemporaryDirectory(prefix="orchestrate-tflm-") as folder:
        mailbox_path = Path(folder) / "mailbox.bin"
        mailbox_path.write_bytes(mailbox)
        (Path(folder) / TFLM_INPUT_FILE).write_bytes(b"".join(cases))
        argv = [str(qemu), *(arg.format(elf=firmware.elf) for arg in config.qemu_args),
                "-device", qemu_loader(mailbox_path, firmware.mailbox_address),
                "-device", qemu_loader(tflite_path.resolve(), model_address)]
        run = run_qemu_process(argv, folder, timeout_s, npu_handler if npu_product else None)
        output_path = Path(folder) / TFLM_OUTPUT_FILE
        produced = output_path.read_bytes() if output_path.is_file() else b""
    log = run.log
    errors = [m[1] for m in TFLM_ERROR.finditer(log)] + list(run.errors)
    if run.exit_code not in (0, None):
        errors.append(f"runner exit code {run.exit_code}: "
                      f"{EXIT_MEANING.get(run.exit_code, 'QEMU failed')}")
    ratio = None
    if calibration := CALIBRATION.search(log):
        ratio = int(calibration[1]) / int(calibration[2]) if int(calibration[2]) else None
    instructions = tuple(round(int(m[2]) * ratio) for m in CASE_TICKS.finditer(log)) \
        if ratio else ()
    arena = TFLM_ARENA.search(log)
    operators, current = [], None
    for line in log.splitlines():
        if TFLM_PROFILE.match(line):
            current = []
            operators.append(current)
        elif current is not None and (row := TFLM_PROFILE_ROW.match(line)):
            current.append((row[2], round(int(row[3]) * ratio) if ratio else int(row[3])))
        elif line.startswith("Inference[") or line.startswith("Program complete"):
            current = None
    per_case = len(produced) // len(cases) if cases and len(produced) % len(cases) == 0 else 0
    outputs = tuple(produced[i * per_case:(i + 1) * per_case] for i in range(len(cases))) \
        if per_case else ()
    if not errors and len(outputs) != len(cases):
        errors.append(f"the runner wrote {len(produced)} output bytes for {len(cases)} cases")
    ok = run.exit_code == 0 and not errors
    method = (npu_method(npu, config, platform.name, True) if npu_product else
              config.method(platform.name))
    bridge = run.bridge
    return TflmQemuResult(
        ok=ok, outputs=outputs, instructions=instructions,
        arena_used_bytes=int(arena[1]) if arena else None,
        arena_bytes=int(arena[2]) if arena else None,
        arena_region=arena[3] if arena else None,
        log=log, errors=tuple(errors), exit_code=run.exit_code, run_seconds=run.run_seconds,
        firmware=firmware, method=f"TensorFlow Lite Micro: {method}",
        core=config.core_text, npu=npu if npu_product else None,
        npu_invocations=bridge.log.invocations if bridge is not None else 0,
        npu_commands=bridge.log.commands if bridge is not None else 0,
        operators=tuple(tuple(inference) for inference in operators))


def smallest_tflm_arena(tflite_path: str | Path, operators: Iterable[str],
                        platform: Platform | str = "corstone300", *, used_bytes: int,
                        cpu: str | None = None, npu: str | None = None, npu_handler=None,
                        npu_fast_scratch_bytes: int = 0,
                        timeout_s: int = DEFAULT_TIMEOUT_S) -> int | None:
    """The smallest arena (16-byte steps) in which TFLM's AllocateTensors succeeds for the file,
    found by running it on QEMU with no input: more than the `arena_used_bytes()` it reports
    (`used_bytes`), because its memory planner's scratch lives in the arena while it plans. None
    when even a 64-times larger arena fails."""
    def allocates(size: int) -> bool:
        return run_tflite_on_qemu(tflite_path, operators, [], platform, cpu=cpu, npu=npu,
                                  npu_handler=npu_handler,
                                  npu_fast_scratch_bytes=npu_fast_scratch_bytes,
                                  arena_bytes=size, timeout_s=min(timeout_s, 60)).ok

    failing, fitting, step = 0, (used_bytes + 15) // 16 * 16, 64
    while not allocates(fitting):
        failing, fitting, step = fitting, fitting + step, step * 2
        if fitting > 64 * max(used_bytes, 1024):
            return None
    while fitting - failing > 16:
        middle = (failing + fitting) // 32 * 16
        if middle <= failing:
            break
        if allocates(middle):
            fitting = middle
        else:
            failing = middle
    return fitting


def tflm_release_image(
    tflite_path: str | Path,
    operators: Iterable[str],
    platform: Platform | str = "corstone300",
    *,
    arena_bytes: int,
    cpu: str | None = None,
    npu: str | None = None,
    npu_fast_scratch_bytes: int = 0,
    run: bool = False,
    timeout_s: int = DEFAULT_TIMEOUT_S,
    third_party: str | Path | None = None,
    cache_dir: str | Path | None = None,
    jobs: int | None = None,
) -> tuple[TflmRelease, ElfRun | None]:
    """TFLM's release image of `tflite_path` for the QEMU machine run_tflite_on_qemu uses
    (kernels/native/tflm_release.py), with a tensor arena of `arena_bytes` (what TFLM reported
    using); `run` also runs it there when it needs no NPU (an NPU build drives the NPU's
    registers, which QEMU does not model). Raises what the build raises."""
    platform = load_platform(platform) if isinstance(platform, str) else platform
    platform, config = qemu_runner(platform, cpu)
    operators = tuple(sorted(set(operators)))
    npu_product = config.npu_product(npu) if ETHOS_U_OPERATOR in operators else None
    if ETHOS_U_OPERATOR in operators and npu_product is None:
        raise NoEthosUInQemu(f"the {platform.name} runner's recipe has no {npu or 'Ethos-U'}; "
                             "no release image was built")
    if npu_product is not None and (config.npu_irq is None or not config.npu_base_address):
        # as `orchestrate firmware` refuses a hardware build there: a driver at address 0
        # is no image of anything
        raise NoEthosUInQemu(f"the {platform.name} recipe (runner/firmware.yaml) names no NPU "
                             "register address and interrupt (npu: base_address, irq): no "
                             "release image with the NPU's driver was built")
    release = build_tflm_release(
        tflite_path, operators, runner_spec(platform, config, npu_product),
        arena_bytes=arena_bytes, npu_irq=config.npu_irq,
        npu_accelerator=npu if npu_product else None,
        fast_scratch_bytes=npu_fast_scratch_bytes if npu_product else 0,
        third_party=third_party, cache_dir=cache_dir, jobs=jobs)
    ran = (run_elf(release.elf, platform, config=config, timeout_s=timeout_s)
           if run and npu_product is None else None)
    return release, ran
