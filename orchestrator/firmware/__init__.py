"""`orchestrate firmware`: from a compiled `.pte` to a firmware project a product team builds.

This room owns the step from a checked artifacts folder to a firmware project (`project.py`,
writing what `generated.py` renders from a `FirmwareSpec`, `spec.py`): the program's inputs and
outputs read from the `.pte` (kernels.program_view), the
memory placement read from the plan the compile wrote, the example inputs, the atomic write of
the project folder, its build (CMake), its run on QEMU (`run_on_qemu`) and its measured
footprint (`footprint.py`, `orchestrate size --firmware`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kernels.cache_root import cache_root
from kernels.dtypes import SCALAR_TYPE_NAMES
from kernels.native.errors import FirmwareBuildError, QemuUnavailable
from kernels.native.sources import find_third_party
from kernels.native.toolchains import find_toolchain
from kernels.program_view import ProgramView, Value
from kernels.safe_files import DataFileError, load_json
from orchestrator.artifacts.manifest import Manifest
from orchestrator.device_runs.qemu import fast_scratch_bytes, installed_platform
from orchestrator.device_runs.qemu_npu import QemuNpuHandler
from orchestrator.errors import NotRun, UserError
from orchestrator.firmware.project import build_project, write_project
from orchestrator.sources.loader import load_calibration
from orchestrator.termination import deferred, removed_on_stop
from orchestrator.firmware.spec import (BUILD_DIR, ELF_NAME, NPU_DEVICES, PROFILES, RECORD_NAME,
                                        FirmwareSpec, IoTensor, PlannedBuffer)
from orchestrator.verification.twin import load_twin
from platforms.firmware_recipe import board_recipe
from platforms.qemu import run_elf
from platforms.qemu_machines import (QemuMachine, machine_config, machine_for_core,
                                     machine_platform, machine_recipe, machines)

# The method pool holds the runtime's per-method structures: an EValue per value (16 B on a
# 32-bit core), a TensorImpl with its sizes, dim order and strides per tensor, the argument
# lists and kernel pointers per instruction. Measured on QEMU (the example main prints
# model_method_pool_used): DS-CNN CPU-only, 244 values, 66 tensors, 16 instructions: 9,056 B,
# where the terms below give 9,127 B; the pool gets a quarter more and 1 KiB, rounded up to
# KiB. `--method-pool-bytes` overrides; model_init returns MODEL_ERROR_METHOD when it is short.
_POOL_PER_VALUE = 16
_POOL_PER_TENSOR = 48
_POOL_PER_TENSOR_DIM = 9
_POOL_PER_INSTRUCTION = 48
_POOL_MARGIN = 1.25
_POOL_BASE = 1024
_EXAMPLE_SEED = 0
# The example frames of a program with state when none are asked for: enough to see the state
# carried, and a reset.
_STATE_FRAMES = 4
_SHOWN_BYTES = 16  # of each output, in --run's per-frame lines


@dataclass(frozen=True)
class FirmwareResult:
    folder: Path
    record: dict
    elf: Path | None  # None when not built


def program_io(view: ProgramView, io_quant: dict) -> tuple[tuple[IoTensor, ...],
                                                           tuple[IoTensor, ...]]:
    """The method's tensor inputs and outputs with the int8 scales and zero points the compile
    recorded (--io int8)."""
    def tensors(values: tuple[Value, ...], kind: str) -> tuple[IoTensor, ...]:
        found = []
        for index, value in enumerate(values):
            if not value.is_tensor:
                raise UserError(f"the program's {kind} {index} is a {value.kind}, not a tensor; "
                                "`orchestrate firmware` hands tensors only")
            dtype = SCALAR_TYPE_NAMES.get(value.scalar_type)
            if dtype is None:
                raise UserError(f"the program's {kind} {index} has element type number "
                                f"{value.scalar_type}, which the firmware API does not carry")
            scale = io_quant.get(f"{kind}{index}_scale")
            zero = io_quant.get(f"{kind}{index}_zp")
            found.append(IoTensor(f"{kind}{index}", dtype, tuple(value.sizes),
                                  tuple(value.dim_order) or tuple(range(len(value.sizes))),
                                  float(scale) if scale is not None else None,
                                  int(zero) if zero is not None else None))
        return tuple(found)

    return tensors(view.input_values, "input"), tensors(view.output_values, "output")


def example_inputs(inputs: tuple[IoTensor, ...], frames: int = 1) -> tuple[tuple[bytes, ...], str]:
    """`frames` deterministic inputs per program input, as bytes in the program's layout, one
    frame after the other."""
    generator = np.random.default_rng(_EXAMPLE_SEED)
    data = []
    for tensor in inputs:
        count = tensor.elements * frames
        if tensor.dtype.startswith("float"):
            values = generator.uniform(-1.0, 1.0, count).astype(
                np.float32 if tensor.dtype == "float32" else np.float64)
        elif tensor.dtype == "bool":
            values = generator.integers(0, 2, count).astype(np.bool_)
        else:
            info = np.iinfo(np.dtype(tensor.dtype))
            values = generator.integers(info.min, info.max, count, endpoint=True,
                                        dtype=np.dtype(tensor.dtype))
        data.append(values.tobytes())
    return tuple(data), (f"generated: uniform random, seed {_EXAMPLE_SEED}, float in [-1, 1), "
                         "integers over their range, bytes in each input's dim order"
                         + (f", {frames} frames" if frames > 1 else ""))


def file_inputs(path: str, inputs: tuple[IoTensor, ...],
                frames: int | None) -> tuple[tuple[bytes, ...], int, str]:
    """The example inputs from a file of samples (.pt/.npz or a folder of them, as --calibration
    reads them), in order: the first `frames` (default all) of them, each in the program's
    dtype (float samples quantized by an int8 input's scale) and layout, one after the other."""
    # kernels.dtypes names are torch's (int8, float32, bool, ...)
    examples = tuple(torch.zeros(t.sizes, dtype=torch.float32 if t.scale is not None
                                 else getattr(torch, t.dtype)) for t in inputs)
    try:
        loaded = load_calibration(path, examples)
    except UserError as error:  # its line speaks of calibration samples, which these are not
        raise UserError(f"--inputs: {str(error).removeprefix('calibration ')}") from None
    if frames is not None and frames > len(loaded.samples):
        raise UserError(f"--frames {frames}: {path} holds {len(loaded.samples)} sample(s); "
                        "give at most that many, or more samples")
    samples = loaded.samples[:frames] if frames is not None else loaded.samples
    data = []
    for position, tensor in enumerate(inputs):
        chunks = []
        for sample in samples:
            value = sample[position]
            if tensor.scale is not None and value.dtype.is_floating_point:
                info = torch.iinfo(getattr(torch, tensor.dtype))
                value = torch.clamp(torch.round(value / tensor.scale) + tensor.zero_point,
                                    info.min, info.max).to(getattr(torch, tensor.dtype))
            if value.dtype != getattr(torch, tensor.dtype):
                raise UserError(f"{path}: input {position} is {value.dtype}, the program's "
                                f"{tensor.name} takes {tensor.dtype}; convert the samples")
            chunks.append(value.permute(tensor.dim_order).contiguous().numpy().tobytes())
        data.append(b"".join(chunks))
    return tuple(data), len(samples), f"{loaded.source}, {len(samples)} in order"


def segment_data_bytes(pte: bytes) -> int:
    """Bytes of the segments after the program flatbuffer, from the `.pte`'s extended header
    ("eh00" at offset 8: header length u32, program size u64, segment base offset u64, segment
    data size u64, little-endian; ExecuTorch's PTE file format); 0 without one."""
    if len(pte) < 40 or pte[8:12] != b"eh00":
        return 0
    length = int.from_bytes(pte[12:16], "little")
    if length < 32:
        return 0
    return int.from_bytes(pte[32:40], "little")


def method_pool_bytes(view: ProgramView) -> int:
    tensors = [value for value in view.values if value.is_tensor]
    need = (_POOL_PER_VALUE * len(view.values)
            + sum(_POOL_PER_TENSOR + _POOL_PER_TENSOR_DIM * len(t.sizes) for t in tensors)
            + _POOL_PER_INSTRUCTION * len(view.instructions))
    total = int(need * _POOL_MARGIN) + _POOL_BASE
    return (total + 1023) // 1024 * 1024


def firmware_spec(manifest: Manifest, profile: str, method_pool: int | None,
                  lto: bool, platform, npu_device: str, frames: int | None = None,
                  inputs_file: str | None = None) -> FirmwareSpec:
    """`frames` example inputs (default: all of `inputs_file`'s samples, else 1, or 4 for a
    program with state), from `inputs_file` or generated."""
    pte = manifest.pte_path.read_bytes()
    view = ProgramView.read(pte)
    backends = {delegate.backend for delegate in view.delegates}
    if backends - {"EthosUBackend"}:
        raise NotRun(f"{manifest.pte_path.name} delegates to {', '.join(sorted(backends))}; "
                     "`orchestrate firmware` links the EthosUBackend only; nothing was written")
    npu = str(manifest.target.get("npu") or "") if view.delegates else ""
    try:
        plan = load_json(manifest.file("plan.json"))
    except (DataFileError, ValueError) as error:
        raise UserError(f"refusing to make firmware: {manifest.folder}/plan.json is unreadable "
                        f"({error}); re-run `orchestrate compile`") from None
    summary = plan.get("summary", {}) if isinstance(plan, dict) else {}
    placement = summary.get("memory_placement") or {}
    memory = summary.get("memory") or {}
    arenas = {int(a["mem_id"]): str(a["region"]) for a in placement.get("arenas", ())}
    sizes = view.non_const_buffer_sizes
    planned = tuple(PlannedBuffer(mem_id, arenas.get(mem_id, str(placement.get("arena_region"))),
                                  int(sizes[mem_id]))
                    for mem_id in range(1, len(sizes)))
    weights_region = placement.get("weights_region") if placement.get("weights_copied") else None
    # The copy takes the segment as the loader asks for it, alignment padding included (the
    # plan's weight figure counts the tensors: MobileNet's is 16 B short of its segment).
    weights_bytes = segment_data_bytes(pte) or int(memory.get("weight_bytes") or 0)
    inputs, outputs = program_io(view, dict(manifest.data.get("io_quantization") or {}))
    if inputs_file is not None:
        examples, frames, example_source = file_inputs(inputs_file, inputs, frames)
    else:
        frames = frames or (_STATE_FRAMES if view.state_values else 1)
        examples, example_source = example_inputs(inputs, frames)
    operators = tuple(line.strip() for line in manifest.read("operators.txt").decode().splitlines()
                      if line.strip() and not line.startswith("#"))
    name = re.sub(r"\W", "_", manifest.pte_path.stem) or "model"
    # The temp pool holds each instruction's scratch in turn: CMSIS-NN's buffers and the NPU
    # scratch EthosUBackend takes for a delegate call (Vela's, plus its 16-byte alignment).
    npu_scratch = int(memory.get("npu_scratch_bytes") or 0)
    temp_bytes = max(int(memory.get("cmsis_scratch_bytes") or 0),
                     npu_scratch + 16 if npu_scratch else 0, 1024)
    temp_region = next((str(item["region"]) for item in memory.get("items", ())
                        if str(item.get("item", "")).startswith("npu scratch")
                        and item.get("region")), None)
    return FirmwareSpec(
        program_name=name, pte=pte, pte_sha256=hashlib.sha256(pte).hexdigest(), method=view.name,
        operators=operators, inputs=inputs, outputs=outputs,
        image_region=str(placement.get("image_region")),
        planned=planned, weights_region=weights_region, weights_bytes=weights_bytes,
        temp_pool_bytes=temp_bytes, temp_region=temp_region,
        npu_partitions=len(view.delegates), npu_accelerator=npu or None,
        npu_product=("-".join(npu.split("-")[:2]) if npu else None), npu_device=npu_device,
        fast_scratch_bytes=fast_scratch_bytes(platform, dict(manifest.target)) if npu else 0,
        method_pool_bytes=method_pool or method_pool_bytes(view),
        example_inputs=examples, example_source=example_source, profile=profile,
        plan_source="plan.json memory placement of the compile", lto=lto,
        cpu=str(manifest.target.get("cpu") or "") or None, frames=frames,
        state_bytes=view.state_bytes,
    )


def make_firmware(pte_path: str | Path, out_dir: str | Path, *, profile: str = "release",
                  platform: str | None = None, third_party: str | Path | None = None,
                  build: bool = True, method_pool: int | None = None,
                  lto: bool | None = None, npu_device: str = "hardware",
                  run: bool = False, frames: int | None = None,
                  inputs_file: str | None = None) -> FirmwareResult:
    """Write the firmware project of a compiled `.pte` into `out_dir` (new, or one this command
    wrote before), and build it unless `build` is False. Nothing is left half-written: the
    project is made in a sibling temporary folder and renamed into place. With `run` (the
    caller runs it on QEMU next), what makes a QEMU run impossible is refused before anything
    is written or built. The example main runs `frames` inputs in turn (from `inputs_file`, a
    file of samples, or generated; see `firmware_spec`)."""
    if profile not in PROFILES:
        raise UserError(f"unknown --profile {profile!r}; choose {' or '.join(PROFILES)}")
    if npu_device not in NPU_DEVICES:
        raise UserError(f"unknown --npu-device {npu_device!r}; choose {' or '.join(NPU_DEVICES)}")
    manifest = Manifest.load(pte_path, action="make firmware")
    target_platform = installed_platform(dict(manifest.target), platform)
    spec = firmware_spec(manifest, profile, method_pool,
                         lto if lto is not None else profile == "release", target_platform,
                         npu_device, frames, inputs_file)
    out = Path(out_dir)
    if out.exists() and not (out / RECORD_NAME).is_file():
        raise UserError(f"refusing to write into {out}: it exists and is not a folder "
                        "`orchestrate firmware` wrote; choose a new -o")
    if not out.parent.is_dir():
        raise UserError(f"output folder {out.parent} does not exist; create it or choose another -o")
    try:
        recipe = board_recipe(target_platform, spec.cpu)
    except QemuUnavailable as error:
        raise NotRun(f"firmware for {target_platform.name}: {error}") from None
    if run and spec.npu_partitions and npu_device != "qemu-bridge":
        raise UserError(f"--run runs the firmware on QEMU, which does not model the NPU's "
                        f"registers that --npu-device {npu_device} drives; add --npu-device "
                        "qemu-bridge to run it on QEMU, or drop --run and run it on an FVP or "
                        "the board")
    check_machine = None
    if run and not recipe.qemu_runs_it:
        check_machine = _check_machine(recipe.cpu) if not spec.npu_partitions else None
        if check_machine is None:
            raise NotRun(f"not run: QEMU has no machine with {target_platform.name}'s memory map "
                         f"that runs a {recipe.cpu} build (its board recipe: {recipe.source}); "
                         "`verify --qemu` runs the program on its core's own QEMU machine; drop "
                         "--run and run the ELF on the board")
    try:
        # The project itself is generated from the sources (kernel registration from their
        # operator YAMLs, the program schema's headers), so writing it needs them; only the
        # build needs the compiler.
        sources = find_third_party(third_party)
    except QemuUnavailable as error:
        detail = str(error).removeprefix("not run: ")
        raise NotRun(f"not run: firmware for {target_platform.name}: writing the project needs "
                     "the third-party sources (its kernel registration and schema headers are "
                     f"generated from them), even with --no-build: {detail}") from None
    try:
        toolchain = find_toolchain()
    except QemuUnavailable as error:
        if build:
            detail = str(error).removeprefix("not run: ")
            raise NotRun(f"not run: firmware for {target_platform.name}: {detail}; or write "
                         "the project alone with --no-build") from None
        toolchain = None
    with removed_on_stop(lambda: tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-")) \
            as staging:
        try:
            record = write_project(spec, target_platform, staging, sources, toolchain,
                                   cache_root())
            elf = None
            if build:
                build_project(staging, spec, target_platform)
                record = load_record(staging)
                elf = staging / BUILD_DIR / ELF_NAME
                if check_machine is not None:
                    record = _write_check_copy(staging, spec, check_machine, recipe.cpu, sources,
                                               toolchain)
            with deferred():
                if out.exists():
                    shutil.rmtree(out)
                os.replace(staging, out)
        except QemuUnavailable as error:
            shutil.rmtree(staging, ignore_errors=True)
            raise NotRun(f"firmware for {target_platform.name}: {error}") from None
        except FirmwareBuildError as error:
            shutil.rmtree(staging, ignore_errors=True)
            raise UserError(f"the firmware project did not build: {error}") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    _fix_build_paths(out, staging)
    if record.get("qemu_check"):
        _fix_build_paths(out / record["qemu_check"], staging / record["qemu_check"])
    return FirmwareResult(out, record, out / BUILD_DIR / ELF_NAME if elf else None)


def _check_machine(cpu: str) -> QemuMachine | None:
    """The QEMU machine that runs a `cpu` build, or None."""
    try:
        return machine_for_core(cpu)
    except QemuUnavailable:
        return None


def _write_check_copy(folder: Path, spec: FirmwareSpec, machine: QemuMachine, cpu: str,
                      sources, toolchain) -> dict:
    """For `--run` of a project no QEMU machine runs with its platform's memory map (a board
    QEMU does not model, like the pico2's 512 KiB SRAM; or a core the platform's QEMU machine
    is not): the same project, sources, kernels, flags and program, built for `machine`'s memory
    map (image, planned buffers and pools in its regions, weights read in place) in
    `folder/qemu-<machine>/`; the project's firmware.json names it, and the run takes it.
    The project's own layout is not what runs."""
    check = folder / f"qemu-{machine.name}"
    check_spec = dataclasses.replace(
        spec, image_region=machine.program_region, weights_region=None, temp_region=None,
        planned=tuple(dataclasses.replace(b, region=machine.planned_region) for b in spec.planned),
        plan_source=f"QEMU {machine.name}'s regions (the check copy of a {spec.plan_source})")
    recipe, platform = machine_recipe(machine, cpu), machine_platform(machine)
    write_project(check_spec, platform, check, sources, toolchain, cache_root(), recipe=recipe)
    build_project(check, check_spec, platform, recipe=recipe)
    check_record = load_record(check)
    check_record["qemu_machine"] = machine.name
    (check / RECORD_NAME).write_text(json.dumps(check_record, indent=1) + "\n")
    record = load_record(folder)
    record["qemu_check"] = check.name
    (folder / RECORD_NAME).write_text(json.dumps(record, indent=1) + "\n")
    return record


def _run_folder(folder: Path, record: dict) -> tuple[Path, dict]:
    """The project, or the QEMU check copy its firmware.json names (a folder inside it)."""
    name = record.get("qemu_check")
    if not name:
        return folder, record
    if not isinstance(name, str) or not re.fullmatch(r"qemu-[\w.-]+", name) \
            or name.removeprefix("qemu-") not in machines():
        raise UserError(f"{folder / RECORD_NAME} names a QEMU check copy {name!r} that is no "
                        "QEMU machine's; re-run `orchestrate firmware --run`")
    return folder / name, load_record(folder / name)


def _fix_build_paths(out: Path, staging: Path) -> None:
    """CMake's cache remembers the folder it configured; a rebuild in the final folder must
    reconfigure from scratch."""
    cache = out / BUILD_DIR / "CMakeCache.txt"
    if cache.is_file() and str(staging) in cache.read_text(errors="replace"):
        cache.unlink()
        shutil.rmtree(out / BUILD_DIR / "CMakeFiles", ignore_errors=True)


def load_record(folder: str | Path) -> dict:
    """firmware.json of a project `orchestrate firmware` wrote."""
    path = Path(folder) / RECORD_NAME
    try:
        record = load_json(path)
    except (DataFileError, ValueError, OSError) as error:
        raise UserError(f"{folder} is not a firmware project written by `orchestrate firmware` "
                        f"({error}); run `orchestrate firmware PROGRAM.pte -o {folder}`") from None
    if not isinstance(record, dict) or record.get("firmware_version") != 1:
        raise UserError(f"{path} is not a firmware record this version reads; re-run "
                        "`orchestrate firmware`")
    return record


@dataclass(frozen=True)
class FirmwareRun:
    exit_code: int | None
    outputs: tuple[bytes, ...]  # the first frame's
    stack_used_bytes: int | None
    method_pool_used_bytes: int | None
    inference_ticks: int | None  # the first frame's
    log: str
    errors: tuple[str, ...]
    frames: tuple[tuple[bytes, ...], ...] = ()  # each frame's outputs, in order
    frame_ticks: tuple[int, ...] = ()
    after_reset: tuple[bytes, ...] | None = None  # the first frame again, after model_reset()


def run_on_qemu(folder: str | Path, timeout_s: int = 300,
                pte_path: str | Path | None = None) -> FirmwareRun:
    """Run a built project's example main on QEMU: each frame's outputs' bytes and measured
    figures. A program with NPU partitions needs its checked `.pte` (`pte_path`, the one the
    project was made from): the host computes each invocation the firmware's bridge hands over."""
    folder, record = _run_folder(Path(folder), load_record(folder))
    handler = _npu_handler(record, pte_path) if record.get("npu") else None
    elf = folder / BUILD_DIR / ELF_NAME
    if not elf.is_file():
        raise UserError(f"{elf} is missing: build the project first "
                        f"(cmake -S {folder} -B {folder / BUILD_DIR} && cmake --build "
                        f"{folder / BUILD_DIR})")
    if not record.get("qemu_runs_it"):
        raise NotRun(f"not run: {record.get('platform')} has no QEMU machine in this installation "
                     f"(its board recipe: {record.get('board')}); run the ELF on the board")
    machine = machines().get(str(record.get("qemu_machine") or ""))
    try:
        if machine is not None:
            result = run_elf(elf, timeout_s=timeout_s, npu_handler=handler,
                             config=machine_config(machine, str(record.get("cpu"))))
        else:
            result = run_elf(elf, installed_platform({"platform": record.get("platform")}),
                             timeout_s=timeout_s, npu_handler=handler)
    except QemuUnavailable as error:
        raise NotRun(str(error)) from None
    # The example main prints "frame: K" (or "reset_frame: 0"), then the frame's ticks and each
    # output's "output: I" line followed by its bytes in hex.
    runs: list[tuple[str, list[bytes], list[int]]] = []
    figures = {}
    lines = result.log.splitlines()
    for position, line in enumerate(lines):
        key, _, value = line.partition(": ")
        if key in ("frame", "reset_frame") or (key == "output" and not runs):
            runs.append((key, [], []))
        if key == "output" and position + 1 < len(lines):
            runs[-1][1].append(bytes.fromhex(lines[position + 1].strip()))
        elif key == "inference_systick_ticks" and value.strip().isdigit() and runs:
            runs[-1][2].append(int(value))
        elif value.strip().isdigit():
            figures[key] = int(value)
    frames = tuple(tuple(outputs) for key, outputs, _ in runs if key != "reset_frame")
    ticks = tuple(t[0] for key, _, t in runs if key != "reset_frame" and t)
    reset = next((tuple(outputs) for key, outputs, _ in runs if key == "reset_frame"), None)
    return FirmwareRun(result.exit_code, frames[0] if frames else (),
                       figures.get("stack_used_bytes"), figures.get("method_pool_used_bytes"),
                       ticks[0] if ticks else figures.get("inference_systick_ticks"), result.log, tuple(result.errors),
                       frames, ticks, reset)


def _npu_handler(record: dict, pte_path: str | Path | None) -> QemuNpuHandler:
    npu = record["npu"]
    if npu.get("device") != "qemu-bridge":
        raise NotRun("not run: the firmware drives the NPU's registers (--npu-device hardware), "
                     "which QEMU does not model; make it with --npu-device qemu-bridge to run it "
                     "on QEMU, or run it on an FVP or the board")
    if pte_path is None:
        raise NotRun("not run: a program with NPU partitions runs on QEMU with its .pte beside "
                     "(`orchestrate firmware PROGRAM.pte ... --run`)")
    manifest = Manifest.load(pte_path, action="run the firmware")
    if hashlib.sha256(manifest.pte_path.read_bytes()).hexdigest() != record.get("pte_sha256"):
        raise UserError(f"{pte_path} is not the program the firmware embeds (SHA-256 differs "
                        "from firmware.json)")
    return QemuNpuHandler(load_twin(manifest.pte_path), str(manifest.target.get("npu")))


def example_input_bytes(folder: str | Path) -> tuple[bytes, ...]:
    """The example inputs a project embeds (example_io.c), as bytes."""
    text = (Path(folder) / "example_io.c").read_text()
    found = re.findall(r"example_input\d+\[\d+\][^=]*= \{([0-9,]*)\};", text)
    return tuple(bytes(int(v) for v in body.split(",") if v) for body in found)


def record_json(result: FirmwareResult) -> str:
    return json.dumps(result.record, indent=1)


def logical_input(data: bytes, tensor: IoTensor) -> torch.Tensor:
    """The logical tensor whose bytes, laid out in the input's dim order, are `data`."""
    dtype = {"float32": np.float32, "float64": np.float64, "bool": np.bool_}.get(
        tensor.dtype, np.dtype(tensor.dtype) if tensor.dtype in ("int8", "uint8", "int16", "int32",
                                                                  "int64") else None)
    if dtype is None:
        raise UserError(f"{tensor.name}: element type {tensor.dtype} has no example input")
    stored = np.frombuffer(data, dtype=dtype).reshape([tensor.sizes[d] for d in tensor.dim_order])
    inverse = sorted(range(len(tensor.dim_order)), key=lambda d: tensor.dim_order[d])
    return torch.from_numpy(stored.copy()).permute(inverse).contiguous()


def firmware_run_lines(folder: Path, pte_path: Path) -> tuple[list[str], bool]:
    """Run the built firmware's example on QEMU and the host twin on the same frames in order
    (the twin carrying a program's state from frame to frame, as the firmware does); report
    lines and whether every frame's outputs, and the first frame's again after model_reset(),
    have the twin's bytes."""
    board = load_record(folder)
    folder, record = _run_folder(Path(folder), board)
    run = run_on_qemu(folder, pte_path=pte_path)
    count = int(record.get("example_frames") or 1)
    if run.exit_code != 0 or len(run.frames) != count \
            or any(len(f) != len(record["outputs"]) for f in run.frames):
        detail = "; ".join(run.errors) or run.log.strip().splitlines()[-1:] or ["no output"]
        raise NotRun(f"the firmware's run on QEMU ended with exit code {run.exit_code} after "
                     f"{len(run.frames)} of {count} frame(s) ({detail}); nothing was compared")
    tensors = [IoTensor(t["name"], t["dtype"], tuple(t["sizes"]), tuple(t["dim_order"]))
               for t in record["inputs"]]
    data = example_input_bytes(folder)
    twin = load_twin(pte_path)
    expected = []
    for frame in range(count):
        inputs = tuple(logical_input(d[frame * t.nbytes:(frame + 1) * t.nbytes], t)
                       for d, t in zip(data, tensors))
        expected.append(twin.run(inputs).output_bytes)
    where = (f"QEMU {record['qemu_machine']}: the project's check copy, the same sources, "
             f"kernels, {record['cpu']} flags and program built for that machine's memory map, "
             f"not {board['platform']}'s layout" if record.get("qemu_machine") else
             f"{record['platform']} machine of its runner/firmware.yaml")
    state = int(record.get("state_bytes") or 0)
    lines = [f"ran {folder / BUILD_DIR / ELF_NAME} on QEMU ({where}): model_init and "
             f"model_run returned 0 on {count} frame(s)"
             + (f", the program's {state:,} B of state carried from frame to frame" if state
                else "") + ", "
             f"{run.inference_ticks:,} SysTick ticks for the first inference (QEMU's virtual "
             "time under -icount, which advances with instructions: not cycles), "
             f"stack high-water {run.stack_used_bytes:,} B (stack "
             f"painting), method pool used {run.method_pool_used_bytes:,} of "
             f"{record['memory']['method_pool_bytes']:,} B"]
    passed = True
    for frame, (device, wanted) in enumerate(zip(run.frames, expected)):
        same = _compared(device, wanted)
        passed = passed and all(s for s, _ in same)
        prefix = f"frame {frame}: {run.frame_ticks[frame]:,} ticks, " if count > 1 else ""
        lines += [prefix + text for _, text in same] if count == 1 else \
            [prefix + "; ".join(text for _, text in same)]
    if run.after_reset is not None:
        same = _compared(run.after_reset, expected[0])
        passed = passed and all(s for s, _ in same)
        lines.append("after model_reset(), frame 0 again: " + "; ".join(t for _, t in same))
    elif state and count > 1:
        passed = False
        lines.append("after model_reset(), frame 0 again: not printed by the firmware")
    return lines, passed


def _compared(device: tuple[bytes, ...], expected: tuple[bytes, ...]) -> list[tuple[bool, str]]:
    """Per output: whether the device's bytes are the twin's, and a line saying it (the first
    bytes in hex, so per-frame outputs can be read)."""
    found = []
    for index, (got, wanted) in enumerate(zip(device, expected)):
        same = got == wanted
        differing = sum(a != b for a, b in zip(got, wanted)) + abs(len(got) - len(wanted))
        shown = got[:_SHOWN_BYTES].hex() + ("..." if len(got) > _SHOWN_BYTES else "")
        found.append((same, f"output {index}: {len(got):,} B, "
                      + ("byte-identical to the host twin's" if same
                         else f"{differing:,} bytes differ from the host twin's")
                      + f" [{shown}]"))
    return found
