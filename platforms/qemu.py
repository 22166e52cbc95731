"""Run a BundleIO `.bpte` on QEMU with the platform's runner firmware (platforms/firmware_recipe.py,
kernels/native/runner.py).

QEMU's `mps3-an547` machine is the Corstone-300 FPGA image (SSE-300, Cortex-M55 with MVE) without
an Ethos-U model; a CPU-only program for another core runs on the QEMU machine for that core
(platforms/qemu_machines/: Arm's MPS2 images of the M3, M4, M7 and M33), the same runner built
with the core's flags. One firmware serves every program with the same operators: the harness writes a
mailbox (where the image lies, which regions hold the planned buffers and the CPU weights, the
tolerances) and the `.bpte` into memory with QEMU's `-device loader`, as the FVP's
`--data FILE@ADDRESS` would, and reads the runner's log back (the mailbox layout and the log
format: platforms/runner_protocol.py).

Instructions, not cycles: QEMU has no timing model. With `-icount shift=0` its virtual clock
advances 1 ns per executed instruction; the runner reads SysTick (32 MHz in that clock) around
each `Method::execute()` and calibrates ticks against a loop of known length, so the figure is the
inference's instruction count to within one tick (about 31 instructions). It is a lower bound on
the M55's cycles only as far as the core retires at most one instruction per cycle.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from platforms.fvp import parse_runner_log
from platforms.platform import MemoryRegion, Platform, load_platform
from platforms.qemu_npu_bridge import BridgeServer
from kernels.native.errors import QemuUnavailable
from kernels.native.operators import read_operators
from kernels.native.runner import Firmware
from kernels.native.toolchains import find_qemu
from kernels.native.runner import build_runner
from platforms.firmware_recipe import (FirmwareConfig, NoEthosUInQemu, NoRunnerForPlatform,
                                       core_name, load_firmware_config, platform_title,
                                       ram_regions, runner_spec)
from platforms.qemu_machines import qemu_runner
from platforms.runner_protocol import (CALIBRATION, CASE_DIGEST, CASE_RESULT, CASE_TICKS,
                                       CONSTANT_SEGMENT, ET_LOG_PREFIX, EXECUTE, EXIT_MEANING,
                                       MAILBOX, MAILBOX_MAGIC, MAILBOX_PLANNED, MAILBOX_VERSION,
                                       PLANNED_BUFFER, TRACE_CLOCK, TRACE_EXECUTE, TRACE_TENSOR,
                                       TRACE_TICKS, QemuCase, QemuTraceEntry)

METHOD = "Corstone-300 CPU in QEMU: real kernels, no timing"
METHOD_DETAIL = (
    "ExecuTorch runtime with the portable and Cortex-M (CMSIS-NN, MVE) kernels, cross-compiled for "
    "the Cortex-M55 and run on QEMU mps3-an547; BundleIO compares each output with the host twin's; "
    "instructions counted with -icount (a lower bound on cycles, not cycles); no Ethos-U"
)
DEFAULT_TIMEOUT_S = 600

_IMAGE_ALIGNMENT = 64

# The Ethos-U delegate's id as serialized in the program's backend_delegates table.
_ETHOS_U_BACKEND_ID = b"EthosUBackend"


@dataclass(frozen=True)
class QemuResult:
    """What one QEMU run of a .bpte showed.

    passed is True when every bundled case matched and nothing went wrong, False on a mismatch or
    any error, None for a plain .pte (no expected outputs). instructions is the median per
    inference (icount: a lower bound on cycles, not cycles)."""

    passed: bool | None
    instructions: int | None
    log: str = field(repr=False)
    build_seconds: float
    run_seconds: float
    cases: tuple[QemuCase, ...] = ()
    errors: tuple[str, ...] = ()
    exit_code: int | None = None
    instructions_per_tick: float | None = None
    firmware: Firmware | None = field(default=None, repr=False)
    trace: tuple[QemuTraceEntry, ...] = field(default=(), repr=False)
    # The trace build's clock as the runner named it: "SysTick ticks" (QEMU: the trace's
    # instructions are these ticks calibrated) or "DWT cycles"; None without a trace.
    trace_clock: str | None = None
    method: str = METHOD
    placement: Mapping[str, str] = field(default_factory=dict)  # image/planned/runtime -> region
    # Where the runner read the program's constant segment (the CPU weights) from, as it logged
    # it: the region holding that address, the address, the bytes. None without a constant segment.
    weights_region: str | None = None
    weights_address: int | None = None
    weights_bytes: int | None = None
    # Each planned buffer as the runner logged it: (mem_id, bytes, region holding its address,
    # address); the region is read from the address, not from the runner's own label.
    planned_buffers: tuple[tuple[int, int, str | None, int], ...] = ()
    # A hybrid program's NPU over the bridge: the accelerator, the invocations it served and
    # the NPU commands the functional model executed over the whole run (every case, repeat).
    npu: str | None = None
    npu_invocations: int = 0
    npu_commands: int = 0
    # What ran it: the runner's platform ("Corstone-300"), the core text (FirmwareConfig.core_text)
    # and, for a build of a core QEMU lacks, why running it on QEMU's core is sound.
    runner: str = "Corstone-300"
    core: str = ""
    core_note: str = ""
    # Where the memory map came from when it is a QEMU machine's rather than the platform's
    # (a core the platform's runner is not built for): the plan's placement is not reproduced.
    memory_note: str = ""
    # Cases whose expected outputs take a device's float values at a rounding boundary (what
    # the bundle's writer says; empty when every expectation is the twin's own run)
    expectation_note: str = ""

    def summary(self) -> str:
        counted = (f", {self.instructions:,} instructions per inference (icount; not cycles)"
                   if self.instructions else "")
        if self.passed:
            return f"PASS ({len(self.cases)} cases){counted} [{self.method}]"
        if self.passed is None:
            return f"no verdict: a plain .pte has no expected outputs{counted} [{self.method}]"
        failed = [str(case.index) for case in self.cases if case.passed is False]
        details = [ET_LOG_PREFIX.sub("", line) for line in self.errors if " differ" in line]
        if failed:
            what = f"case {', '.join(failed)} of {len(self.cases)} differs from the bundled outputs"
            what += f" ({details[0]})" if details else ""
        else:
            what = ET_LOG_PREFIX.sub("", self.errors[0]) if self.errors else "no PASS reported"
        return f"FAIL: {what}{counted} [{self.method}]"


def program_has_ethos_u(image_path: str | Path) -> bool:
    """Whether the program (or the program inside a .bpte) delegates to the Ethos-U backend."""
    return _ETHOS_U_BACKEND_ID in Path(image_path).read_bytes()


def _plan_regions(operators_txt: Path) -> dict:
    """The regions the plan chose for the .pte ("image"), each planned buffer ("planned": the
    arenas' regions in mem_id order) and the CPU weights ("weights": the constant segment,
    copied at boot), from plan.json beside operators.txt."""
    plan_path = operators_txt.parent / "plan.json"
    chosen: dict = {}
    if plan_path.is_file():
        summary = json.loads(plan_path.read_text()).get("summary", {})
        for item in summary.get("memory", {}).get("items", []):
            name = str(item.get("item", ""))
            if name.startswith(".pte") and item.get("region"):
                chosen["image"] = item["region"]
            elif name.startswith("cpu weights") and item.get("region"):
                chosen["weights"] = item["region"]
        arenas = (summary.get("memory_placement") or {}).get("arenas") or []
        if arenas:
            chosen["planned"] = tuple(a["region"] for a in sorted(arenas,
                                                                  key=lambda a: a["mem_id"]))
    return chosen


def run_bpte_on_qemu(
    bpte_path: str | Path,
    operators_txt: str | Path,
    platform: Platform | str = "corstone300",
    *,
    timeout_s: int = DEFAULT_TIMEOUT_S,
    rtol: float = 0.0,
    atol: float = 0.0,
    repeats: int = 1,
    third_party: str | Path | None = None,
    cache_dir: str | Path | None = None,
    jobs: int | None = None,
    trace: bool = False,
    npu_handler=None,
    npu: str | None = None,
    npu_fast_scratch_bytes: int = 0,
    cpu: str | None = None,
) -> QemuResult:
    """Build or reuse the runner for the program's operators and run the .bpte on QEMU.

    With `trace`, the result also holds each instruction's instructions and its outputs' CRC-32
    (`QemuResult.trace`), to find the first operator whose bytes differ from the host twin's,
    and each inference's whole Method::execute, with starts on the trace clock's timeline
    (`QemuResult.trace_clock`; the tracer's own work removed): what a profile is made of.
    The .bpte goes where the plan put the .pte (plan.json beside operators.txt), the planned
    buffers where it put the arena, and the program's constant segment (the CPU weights) is copied
    at boot to where it put the CPU weights when that is not the image's region
    (`QemuResult.weights_region` says where the runner read them from); tolerances 0 and 0 demand
    byte-equal outputs. Raises a
    QemuUnavailable ("not run: ...") when the check cannot run here, including for programs
    with Ethos-U delegates unless `npu_handler` serves them.

    A hybrid program runs with `npu_handler` (platforms/qemu_npu_bridge.NpuHandler) and `npu`
    (the accelerator, e.g. "ethos-u55-128"): the firmware's NPU build links EthosUBackend and the
    Ethos-U core driver and hands each command stream to the handler over semihosting;
    `npu_fast_scratch_bytes` is the fast scratch (base address 2) it sets aside.
    `QemuResult.npu_invocations` and `.npu_commands` count what the handler ran.

    `cpu` is the core the program was compiled for (the platform's default when None): the
    platform's runner runs it when built for that core, else the QEMU machine that runs the
    core's build (platforms/qemu_machines/), with that machine's memory map instead of the
    plan's placement (`QemuResult.memory_note` says so)."""
    bpte_path, operators_txt = Path(bpte_path), Path(operators_txt)
    platform = load_platform(platform) if isinstance(platform, str) else platform
    compiled_for = platform.name
    platform, config = qemu_runner(platform, cpu)
    npu_product = None
    if program_has_ethos_u(bpte_path):
        if npu_handler is None:
            raise NoEthosUInQemu(
                f"{bpte_path.name} delegates to the Ethos-U and QEMU's {platform.name} model has "
                "no Ethos-U; nothing was run (use the FVP, or compile with --npu none)"
            )
        npu_product = config.npu_product(npu)
        if npu_product is None:
            raise NoEthosUInQemu(
                f"{bpte_path.name} delegates to the {npu or 'Ethos-U'}; the {platform.name} "
                f"runner's NPU bridge serves {', '.join(config.npu_products) or 'no NPU'}; "
                "nothing was run")
    qemu = find_qemu()
    firmware = build_runner(read_operators(operators_txt),
                            runner_spec(platform, config, npu_product), third_party=third_party,
                            cache_dir=cache_dir, jobs=jobs, trace=trace)

    # A QEMU machine's map has none of the plan's regions (they are the platform's).
    chosen = {} if config.machine_map else _plan_regions(operators_txt)
    image_region = platform.memory(chosen.get("image", config.default_program_region))
    ram = {r.name for r in ram_regions(platform, config)}
    planned = tuple(r if r in ram else config.default_planned_region
                    for r in chosen.get("planned", (config.default_planned_region,)))
    if len(planned) > MAILBOX_PLANNED:
        raise QemuUnavailable(f"the plan has {len(planned)} arenas; the runner places at most "
                              f"{MAILBOX_PLANNED}; nothing was run")
    weights_region = chosen.get("weights", image_region.name)
    if weights_region != image_region.name and weights_region not in ram:
        platform.memory(weights_region)  # raises PlatformError for a region the platform lacks
        raise QemuUnavailable(
            f"the plan puts the CPU weights in {weights_region}, which the runner cannot write on "
            f"QEMU's {config.qemu_machine}; nothing was run"
        )
    image_address = program_address(platform, config, firmware, image_region, bpte_path.stat().st_size)

    mailbox = MAILBOX.pack(
        MAILBOX_MAGIC, MAILBOX_VERSION, image_address, bpte_path.stat().st_size,
        *(r.encode() for r in planned + ("",) * (MAILBOX_PLANNED - len(planned))),
        config.runtime_region.encode(), rtol, atol, max(1, repeats),
        b"" if weights_region == image_region.name else weights_region.encode(),
        npu_fast_scratch_bytes if npu_product else 0,
    )
    with tempfile.TemporaryDirectory(prefix="orchestrate-qemu-") as folder:
        mailbox_path = Path(folder) / "mailbox.bin"
        mailbox_path.write_bytes(mailbox)
        argv = [str(qemu), *(arg.format(elf=firmware.elf) for arg in config.qemu_args),
                "-device", qemu_loader(mailbox_path, firmware.mailbox_address),
                "-device", qemu_loader(bpte_path.resolve(), image_address)]
        run = run_qemu_process(argv, folder, timeout_s, npu_handler if npu_product else None)
    log, errors, exit_code, run_seconds, bridge = (run.log, list(run.errors), run.exit_code,
                                                  run.run_seconds, run.bridge)
    result = _result(log, exit_code, errors, firmware, run_seconds, config.method(platform.name),
                     (config.core_text, config.cpu_note),
                     {"image": image_region.name, "planned": ",".join(planned),
                      "runtime": config.runtime_region, "weights": weights_region},
                     image_address, platform)
    if config.machine_map:
        result = dataclasses.replace(result, memory_note=(
            f"QEMU {config.qemu_machine}'s own memory map, not the plan's placement (which names "
            f"{compiled_for}'s regions): image in {image_region.name}, planned buffers in "
            f"{','.join(planned)}, allocators in {config.runtime_region}"))
    if bridge is None:
        return result
    # The handler says whether it executed an Ethos-U85's command streams (--npu-model
    # stream|both: the U85 model) or computed its partitions' TOSA graphs.
    streamed = bool(getattr(npu_handler, "executes_stream", False))
    return dataclasses.replace(result, method=npu_method(npu, config, platform.name, streamed),
                               npu=npu, npu_invocations=bridge.log.invocations,
                               npu_commands=bridge.log.commands)


def npu_method(npu: str | None, config: FirmwareConfig, platform_name: str,
               u85_stream: bool = False) -> str:
    """The method's name for a hybrid program run with the NPU bridge: what computed the NPU's
    half on the host (the Ethos-U55/U65 functional model; an Ethos-U85's command stream in the
    U85 model with `u85_stream`, else its TOSA graphs)."""
    family = (npu or "ethos-u").split("-")
    family = f"Ethos-{family[1].upper()}" if len(family) > 1 else "Ethos-U"
    cpu = (f"{core_name(config.qemu_cpu)} on QEMU" if config.cpu == config.qemu_cpu else
           f"{core_name(config.cpu)} build on QEMU's {core_name(config.qemu_cpu)}")
    if (npu or "").startswith(("ethos-u55", "ethos-u65")):
        return f"{cpu} + {family} functional model over semihosting"
    if u85_stream:
        return (f"{cpu} + {family} command streams in the Ethos-U85 model over semihosting (a "
                "partition the model does not execute completely: its TOSA graph)")
    return (f"{cpu} + {family} partitions as TOSA graphs in the TOSA reference model "
            "over semihosting (the command stream is not executed)")


def qemu_loader(path: Path, address: int) -> str:
    """QEMU's generic loader placing `path` as raw bytes at `address`. Its option parser treats
    a comma as a separator; a doubled comma is a literal one."""
    return f"loader,file={str(path).replace(',', ',,')},addr={address:#x},force-raw=on"


def program_address(platform: Platform, config: FirmwareConfig, firmware: Firmware,
                   region: MemoryRegion, image_bytes: int) -> int:
    """Where the image goes in `region`: the platform's FVP load address when it lies there (the
    same place the FVP path uses), else the region's first free address."""
    if config.qemu_backing(region.base_address, region.size_bytes) is None:
        raise NoRunnerForPlatform(f"QEMU's {config.qemu_machine} has no memory for region {region.name}")
    start = firmware.free_start.get(region.name, region.base_address)
    if (platform.fvp_load_address is not None
            and start <= platform.fvp_load_address < region.base_address + region.size_bytes):
        start = platform.fvp_load_address
    address = (start + _IMAGE_ALIGNMENT - 1) // _IMAGE_ALIGNMENT * _IMAGE_ALIGNMENT
    end = region.base_address + region.size_bytes
    if address + image_bytes > end:
        raise QemuUnavailable(
            f"the {image_bytes}-byte image does not fit in {region.name} at {address:#x} "
            f"({end - address} bytes left)"
        )
    return address


def _result(log: str, exit_code: int | None, errors: list[str], firmware: Firmware,
            run_seconds: float, method: str, core: tuple[str, str], placement: dict[str, str], image_address: int,
            platform: Platform | None = None) -> QemuResult:
    parsed = parse_runner_log(log)
    weights_region = weights_address = weights_bytes = None
    if constants := CONSTANT_SEGMENT.search(log):
        weights_bytes, weights_address = int(constants[1]), int(constants[3], 16)
        weights_region = _region_at(platform, weights_address) or constants[2]
    ratio = None
    if calibration := CALIBRATION.search(log):
        instructions, ticks = int(calibration[1]), int(calibration[2])
        ratio = instructions / ticks if ticks else None
    ticks_by_case: dict[int, int] = {}
    for match in CASE_TICKS.finditer(log):
        ticks_by_case.setdefault(int(match[1]), int(match[2]))
    verdicts = {int(m[1]): m[2] == "PASS" for m in CASE_RESULT.finditer(log)}
    digests: dict[int, dict[int, int]] = {}
    for match in CASE_DIGEST.finditer(log):
        digests.setdefault(int(match[2]), {})[int(match[1])] = int(match[3], 16)
    cases = tuple(
        QemuCase(index, verdicts.get(index), round(ticks * ratio) if ratio else None, ticks,
                 tuple(digests.get(index, {}).get(o) for o in range(len(digests.get(index, {})))))
        for index, ticks in sorted(ticks_by_case.items())
    )
    all_errors = [*parsed.errors, *errors]
    if exit_code not in (0, None) and exit_code in EXIT_MEANING:
        all_errors.append(f"runner exit code {exit_code}: {EXIT_MEANING[exit_code]}")
    elif exit_code not in (0, None):
        all_errors.append(f"QEMU exited with code {exit_code}")
    if not log.strip():
        all_errors.append("the runner printed nothing")
    if parsed.fail_lines or all_errors or exit_code != 0:
        passed: bool | None = False
    elif verdicts and all(verdicts.values()) and len(verdicts) == len(cases):
        passed = True
    else:
        passed = None
    trace: list[QemuTraceEntry] = []
    clock = TRACE_CLOCK.search(log)
    # Instructions from SysTick ticks only: DWT cycles are cycles.
    per_tick = ratio if clock is not None and clock[1] == "SysTick ticks" else None
    for line in log.splitlines():
        if ticks_match := TRACE_TICKS.search(line):
            case, instruction, kind, kernel, ticks, start, kernel_ticks, kernel_start = (
                ticks_match.groups())
            trace.append(QemuTraceEntry(
                int(case), int(instruction), kind, "" if kernel == "-" else kernel, int(ticks),
                round(int(ticks) * per_tick) if per_tick else None,
                round(int(kernel_ticks) * per_tick) if per_tick else None, (),
                start_ticks=int(start), kernel_ticks=int(kernel_ticks),
                kernel_start_ticks=int(kernel_start)))
        elif execute := TRACE_EXECUTE.search(line):
            case, ticks, start = (int(group) for group in execute.groups())
            trace.append(QemuTraceEntry(case, -1, EXECUTE, "", ticks,
                                        round(ticks * per_tick) if per_tick else None, None, (),
                                        start_ticks=start))
        elif (tensor := TRACE_TENSOR.search(line)) and trace:
            last = trace[-1]
            trace[-1] = dataclasses.replace(
                last, tensors=(*last.tensors, (int(tensor[3]), int(tensor[4], 16))))
    counts = sorted(case.instructions for case in cases if case.instructions is not None)
    return QemuResult(
        passed=passed,
        instructions=counts[len(counts) // 2] if counts else None,
        log=log,
        build_seconds=firmware.build_seconds,
        run_seconds=run_seconds,
        cases=cases,
        errors=tuple(parsed.fail_lines) + tuple(all_errors),
        exit_code=exit_code,
        instructions_per_tick=ratio,
        firmware=firmware,
        trace=tuple(trace),
        trace_clock=clock[1] if clock is not None else None,
        method=method,
        runner=platform_title(platform.name) if platform is not None else "Corstone-300",
        core=core[0],
        core_note=core[1],
        placement=MappingProxyType({**placement, "image_address": f"{image_address:#x}"}),
        weights_region=weights_region,
        weights_address=weights_address,
        weights_bytes=weights_bytes,
        planned_buffers=tuple(
            (int(m[1]), int(m[2]), _region_at(platform, int(m[4], 16)) if m[4] != "(nil)"
             else None, int(m[4], 16) if m[4] != "(nil)" else 0)
            for m in PLANNED_BUFFER.finditer(log)),
    )


def _region_at(platform: Platform | None, address: int) -> str | None:
    """The platform region holding `address` (the firmware uses the platform YAML's addresses)."""
    for region in platform.memories if platform is not None else ():
        if region.base_address <= address < region.base_address + region.size_bytes:
            return region.name
    return None


@dataclass(frozen=True)
class ElfRun:
    """One QEMU run of a self-contained firmware (`orchestrate firmware`'s example main): its
    semihosting console and exit code."""

    exit_code: int | None
    log: str = field(repr=False)
    errors: tuple[str, ...]
    run_seconds: float
    bridge: BridgeServer | None = field(default=None, repr=False)  # its log: what the NPU ran


def run_elf(elf: str | Path, platform: Platform | str = "corstone300", *,
            timeout_s: int = DEFAULT_TIMEOUT_S, npu_handler=None,
            config: FirmwareConfig | None = None) -> ElfRun:
    """Run an ELF that needs nothing loaded beside it on the platform's QEMU machine (the
    machine and arguments of its runner/firmware.yaml, or of `config`: a QEMU machine's,
    platforms/qemu_machines/); with `npu_handler`, the NPU bridge serves its Ethos-U invocations
    (platforms/qemu_npu_bridge.py). Raises QemuUnavailable when QEMU or the platform's recipe is
    missing."""
    if config is None:
        platform = load_platform(platform) if isinstance(platform, str) else platform
        config = load_firmware_config(platform)
    qemu = find_qemu()
    argv = [str(qemu), *(arg.format(elf=Path(elf).resolve()) for arg in config.qemu_args)]
    with tempfile.TemporaryDirectory(prefix="orchestrate-qemu-") as folder:
        return run_qemu_process(argv, folder, timeout_s, npu_handler)


def run_qemu_process(argv: list[str], folder: str, timeout_s: int, npu_handler) -> ElfRun:
    """QEMU in `folder` (semihosting opens host files relative to it: the NPU bridge's FIFOs),
    with the bridge serving `npu_handler` when given; a timeout kills it and says so."""
    errors: list[str] = []
    started = time.monotonic()
    bridge = None
    if npu_handler is not None:
        bridge = BridgeServer(folder, npu_handler).__enter__()
    try:
        completed = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False,
                                   cwd=folder)
        output, stderr, exit_code = completed.stdout, completed.stderr, completed.returncode
    except subprocess.TimeoutExpired as expired:
        output, stderr, exit_code = expired.stdout or b"", expired.stderr or b"", None
        errors.append(f"QEMU still running after {timeout_s} s; killed")
    finally:
        if bridge is not None:
            bridge.stop()
    run_seconds = time.monotonic() - started
    if bridge is not None:
        errors += [f"NPU bridge: {line}" for line in bridge.log.errors]
    qemu_errors = stderr.decode("utf-8", errors="replace").strip()
    errors += [f"qemu: {line}" for line in qemu_errors.splitlines()] if qemu_errors else []
    return ElfRun(exit_code, output.decode("utf-8", errors="replace"), tuple(errors), run_seconds,
                  bridge)
