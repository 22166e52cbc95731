"""`verify --runtime executorch`: the `.pte` through the real ExecuTorch runtime, compared with the
twin byte for byte and with the quantized reference.

The runtime (`kernels.runtime`) is the wheel's libexecutorch.so (program loading, memory plan,
portable and prim ops) with ExecuTorch's `cortex_m::` kernels over CMSIS-NN's C code and its
EthosUBackend built for the host. The NPU itself is the one thing emulated: the host Ethos-U
driver hands each invocation's command stream and scratch region to `npu_handler`, which finds
the partition by the SHA-256 of its command stream and weights, reads the inputs from the
scratch at Vela's offsets, runs the partition's TOSA graph (the same hash-checked artifact the
twin runs) in the TOSA reference model and writes the outputs back at Vela's offsets. The input
copies into the scratch, their checks, and the output copies with their layout adjustment are
ExecuTorch's own backend code.

What it exercises: the runtime's program loading and memory planning, the real kernels and the
real delegate IO. What it does not: the Vela command stream (the TOSA graph stands in for it),
timing on the device, and CMSIS-NN's DSP/MVE code paths: x86-64 compiles the C path, so the
runtime is compared with the twin computing what the C path computes from the program's
arguments (kernels/reference.py HOST_TIER; a program built for the MVE tier hands
`quantized_linear` a kernel sum the C path ignores). Every instruction is still compared; the
MVE forms of those ops are judged on an MVE core (QEMU's Cortex-M55), and the report names them.

Every difference between runtime and twin is a finding; with a traced run, the report names the
first instruction whose output the two disagree on.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import asdict, dataclass, replace
from types import SimpleNamespace

import torch

from kernels.runtime import (METHOD as RUNTIME_METHOD, HostRuntime, NpuInvocation,
                             RuntimeFailure, RuntimeUnavailable, find_sources, logical)
from orchestrator import numerics
from orchestrator.errors import NotRun, UserError
from kernels.program_view import KernelCall
from kernels.host_scratch import scratch_shortfalls
from kernels.reference import HOST_TIER, MVE_ONLY_SEMANTICS
from orchestrator.verification.floats import FLOAT_ULPS_PER_TERM, float_bound, reduction_length
from orchestrator.verification.npu import NpuExecutor
from orchestrator.verification.program import ETHOS_U_BACKEND
from orchestrator.verification.twin import (RUNTIME_TRACE, DeviceFloats, TwinProgram, TwinRun,
                                             as_program, input_key)
from orchestrator.verification.twin_verify import (as_tuple, float_output, output_quantization, quantized_steps,
                                 device_inputs, sample_inputs)

CPU_ONLY_METHOD = RUNTIME_METHOD


def method_for(twin: TwinProgram, npu: NpuExecutor) -> str:
    """The runtime's method as it ran this program, naming how the NPU invocations were done."""
    if not twin.partitions:
        return CPU_ONLY_METHOD
    return f"{RUNTIME_METHOD}; Ethos-U delegates through ExecuTorch's EthosUBackend, {npu.method}"
SEED = 0


class NpuMismatch(RuntimeError):
    """An Ethos-U invocation whose command stream matches no partition of the program."""


@dataclass(frozen=True)
class OutputAgreement:
    """One program output over all samples."""

    index: int
    shape: tuple[int, ...]
    dtype: str
    bytes_equal: bool  # runtime and twin wrote the same bytes on every sample
    max_steps_vs_twin: float  # in output quantization steps (own units when unquantized)
    differing_vs_twin: int  # elements, summed over samples
    max_steps_vs_quantized: float  # runtime vs the quantized reference
    differing_vs_quantized: int  # elements at least half a step off
    elements: int
    # float bytes differ but every element is within the summation-order bound (float_bound)
    within_float_bound: bool = False


@dataclass(frozen=True)
class OpAgreement:
    """One instruction's written tensors: runtime (ETDump debug buffer) vs twin."""

    instruction: int
    op: str
    equal: bool
    max_difference: float  # int steps for integer tensors, absolute for float ones
    differing: int
    elements: int


@dataclass(frozen=True)
class FloatBoundary:
    """A sample whose outputs agree with the twin's once the twin takes the runtime's float
    values where they differ within the summation-order bound (verification/floats.py): a float
    on a rounding boundary that the two kernels' summation orders put on either side."""

    sample: int
    taken: int  # instructions whose float output the twin took from the runtime
    instruction: int | None  # the first integer value the taken floats moved
    op: str
    elements: int  # its elements moved
    max_steps: int  # by at most this many steps


@dataclass(frozen=True)
class HostLimit:
    """Where the host build cannot run the device's code path, so a difference is expected."""

    instruction: int
    op: str
    reason: str


@dataclass(frozen=True)
class RuntimeReport:
    pte: str
    method: str
    samples: int
    inputs: str
    outputs: tuple[OutputAgreement, ...]
    per_op: tuple[OpAgreement, ...]  # the traced sample (the first that differed, else 0)
    traced_sample: int | None
    first_divergence: OpAgreement | None
    host_limits: tuple[HostLimit, ...]
    # Instructions compared in the host's C-path form, not the program's tier (MVE): "12
    # cortex_m::quantized_linear.out", named so the verdict says what only QEMU judges.
    c_path_only: tuple[str, ...]
    # What the outputs' max_steps_vs_quantized measure: C_PATH_FORM when c_path_only is not
    # empty (the host computed those instructions as the C path does, which the program on its
    # core does not), else PROGRAM_FORM.
    reference_comparison_form: str
    runtime_error: str | None
    runtime_seconds_per_sample: float  # median wall time of forward() in the runtime process
    runtime_npu_seconds_per_sample: float  # of which in the emulated NPU (TOSA model + IPC)
    twin_seconds_per_sample: float
    library_key: str
    bytes_equal: bool
    # passed: every output byte equals the twin's. partial: they part first at an instruction
    # the host cannot run as the device does (a HostLimit) and agree on every instruction
    # before it, so nothing after it was compared. failed: they part anywhere else. error: the
    # runtime refused the program or failed the run.
    outcome: str
    passed: bool
    verdict: str
    float_boundaries: tuple[FloatBoundary, ...] = ()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def npu_handler(twin: TwinProgram, npu: NpuExecutor):
    """The NPU for the host EthosUBackend: each invocation is matched to a partition by the
    SHA-256 of its command stream and weights, and computed by `npu` (the functional model on
    the backend's own memory regions, or the TOSA graph) in place."""
    by_stream = {(_sha256(p.payload.cmd_bytes), _sha256(p.payload.weight_bytes)): p
                 for p in twin.partitions}

    def handle(invocation: NpuInvocation) -> None:
        partition = by_stream.get((invocation.command_stream_sha256, invocation.weights_sha256))
        if partition is None:
            raise NpuMismatch(f"Ethos-U command stream {invocation.command_stream_sha256[:16]} "
                              "matches no partition of the program's artifacts")
        npu.run_invocation(partition, invocation.command_stream, list(invocation.regions),
                           f"{ETHOS_U_BACKEND} {partition.delegate_name}")

    return handle


def host_limits(twin: TwinProgram) -> tuple[HostLimit, ...]:
    """Instructions whose arguments were prepared for a CMSIS-NN path the host cannot run.

    The scratch buffers of convolutions and pools are
    sized for the target's tier (`scratch_buffer_sizes.py`); where the C path needs more, the
    host kernel writes past the planned scratch (upstream checks the size only under
    CORTEX_M_ENABLE_RUNTIME_CHECKS, off by default as on the device).
    """
    return tuple(HostLimit(short.instruction, short.operator, short.reason())
                 for short in scratch_shortfalls(twin.view))


PROGRAM_FORM, C_PATH_FORM = "program", "c-path"
# What ran, per reference_comparison_form, in each output's line against the quantized reference.
COMPARED_FORM = {PROGRAM_FORM: "runtime",
                 C_PATH_FORM: "runtime (CMSIS-NN C path, not the program's MVE form)"}


def c_path_only(twin: TwinProgram) -> tuple[str, ...]:
    """Instructions whose MVE form differs from the C path the host runs (empty unless the
    program was compiled for the MVE tier)."""
    if twin.isa_tier != "mve":
        return ()
    return tuple(f"{call.index} {call.operator.name}.{call.operator.overload}"
                 for call in twin.view.kernel_calls()
                 if call.operator.name.startswith("cortex_m::")
                 and call.operator.name.split("::")[-1] in MVE_ONLY_SEMANTICS)


def _dim_order_bytes(tensor: torch.Tensor, dim_order) -> bytes:
    return tensor.contiguous().permute(tuple(dim_order)).contiguous().numpy().tobytes()


def _difference(a: torch.Tensor, b: torch.Tensor, bound: float = 0.0) -> tuple[float, int]:
    """(largest difference, elements beyond `bound`)."""
    if a.shape != b.shape:
        return math.inf, max(a.numel(), b.numel())
    if a.dtype == torch.bool or b.dtype == torch.bool:
        a, b = a.to(torch.int64), b.to(torch.int64)
    difference = (a.double() - b.double()).abs()
    if difference.numel() == 0:
        return 0.0, 0
    nan = torch.isnan(difference)
    mismatched = int((difference > bound).sum()) + int(nan.sum())
    return (math.inf if bool(nan.any()) else float(difference.max())), mismatched


def _output_reductions(twin: TwinProgram) -> list[int]:
    """The reduction length of the instruction that writes each program output."""
    values = twin.view.values
    lengths = []
    for index in twin.view.outputs:
        found = twin.producer(index)
        if found is None or not isinstance(found[1], KernelCall):
            lengths.append(1)
            continue
        _, call, _ = found
        written = math.prod(values[index].sizes) or 1
        read = sum(math.prod(values[i].sizes) for a in call.args
                   for i in twin.tensor_indices(a) if i != index)
        lengths.append(max(1, read // written))
    return lengths


def _per_op(twin: TwinProgram, twin_run, runtime_run) -> tuple[OpAgreement, ...]:
    by_instruction = {e.instruction: e for e in twin_run.op_trace}
    rows = []
    for logged in runtime_run.instructions:
        entry = by_instruction.get(logged.instruction)
        if entry is None or not entry.outputs:
            continue
        # Kernels log their out argument; method.cpp logs every argument of a delegate call
        # (inputs first), so the outputs are the last ones.
        values = logged.values[-len(entry.outputs):] if logged.values else ()
        worst, differing, elements, equal = 0.0, 0, 0, True
        for evalue, raw in zip(entry.outputs, values):
            expected = twin_run.intermediates.get(evalue)
            if expected is None:
                continue
            got = logical(raw)
            size, count = _difference(got, expected,
                                      float_bound(expected, reduction_length(twin_run, entry)))
            equal = equal and got.dtype == expected.dtype and count == 0
            worst, differing, elements = max(worst, size), differing + count, elements + got.numel()
        if len(values) != len(entry.outputs):
            equal = False
        rows.append(OpAgreement(logged.instruction, entry.op, equal, worst, differing, elements))
    return tuple(rows)


def verify_runtime(program, samples: int = 4, calibration: str | None = None,
                   per_op: bool = False, runtime: HostRuntime | None = None,
                   repeat: int = 1, executorch_src: str | None = None,
                   cmsis_nn_src: str | None = None, npu_model: str = "auto") -> RuntimeReport:
    """Run the program (a loaded TwinProgram, or a `.pte` path) through the host runtime and
    the twin on `samples` inputs and compare.

    `runtime` reuses a running HostRuntime; otherwise one is built from the sources
    (`kernels.runtime.find_sources`: arguments, environment, ../shared/third_party) and closed
    after. Raises NotRun when the runtime cannot be built here (no sources, no compiler). A
    program the runtime refuses or a run it fails is reported (runtime_error), not raised."""
    if samples < 1 or repeat < 1:
        raise UserError(f"--samples and the repeat count must be at least 1 (got {samples} and "
                        f"{repeat})")
    twin = as_program(program)
    twin.require_manifest()  # the program run is the one compile recorded
    twin.reset()  # a program with state: the samples are frames, from its initial state
    pte_path = twin.pte_path
    float_program, _ = twin.reference("float.pt2")
    _, quantized_module = twin.reference("quantized.pt2")
    inputs, source = sample_inputs(float_program, samples, calibration)
    owned = runtime is None
    try:
        runtime = runtime or HostRuntime(sources=find_sources(executorch_src, cmsis_nn_src))
    except RuntimeUnavailable as error:
        raise NotRun(f"not run: the ExecuTorch host runtime is unavailable: {error}") from None
    runtime_npu = twin.npu_executor(npu_model)
    handler = npu_handler(twin, runtime_npu) if twin.partitions else None
    limits = host_limits(twin)
    c_path = c_path_only(twin)
    # The host runs CMSIS-NN's C path: the twin computes that path from the same arguments.
    host_twin = replace(twin, isa_tier=HOST_TIER) if twin.isa_tier in ("mve", "dsp") else twin
    try:
        if twin.has_state:  # each frame once, from the initial state, as the twin runs them
            runtime.reset(twin.pte_bytes)
            repeat = 1
        return _compare(host_twin, pte_path, inputs, source, quantized_module, runtime, handler,
                        limits, per_op, repeat, c_path, runtime_npu)
    except RuntimeUnavailable as error:
        raise NotRun(f"not run: the ExecuTorch host runtime is unavailable: {error}") from None
    finally:
        if owned:
            runtime.close()


def _compare(twin, pte_path, inputs, source, quantized_module, runtime, handler, limits, per_op,
             repeat, c_path=(), npu: NpuExecutor | None = None) -> RuntimeReport:
    npu = npu or twin.npu_executor()
    n_out = len(twin.view.outputs)
    worst_twin = [0.0] * n_out
    diff_twin = [0] * n_out
    worst_ref = [0.0] * n_out
    diff_ref = [0] * n_out
    equal = [True] * n_out
    elements = [0] * n_out
    runtime_seconds, npu_seconds, twin_seconds = [], [], []
    first_differing: int | None = None
    error = None
    reductions = _output_reductions(twin)
    within_bound = [False] * n_out
    boundaries: list[FloatBoundary] = []
    floats_may_split = not twin.has_state and computes_floats(twin)
    for index, sample in enumerate(inputs):
        device = device_inputs(twin, sample)
        try:
            run = runtime.run(twin.pte_bytes, device, npu=handler, repeat=repeat)
        except RuntimeFailure as failure:
            error = str(failure)
            break
        runtime_seconds.append(statistics.median(run.seconds))
        npu_seconds.append(statistics.median(run.npu_seconds))
        twin_run = twin.run(device, npu=twin.npu_executor(npu.choice))
        twin_seconds.append(twin_run.seconds)
        if floats_may_split and not _outputs_agree(twin, run.outputs, twin_run, reductions):
            try:
                taken = _take_runtime_floats(twin, runtime, handler, device, npu.choice,
                                             reductions, index)
            except RuntimeFailure as failure:
                error = f"traced run: {failure}"
                break
            if taken is not None:
                twin_run, boundary = taken
                boundaries.append(boundary)
            else:  # a difference the floats do not explain: it is traced below, once
                floats_may_split = False
        with torch.no_grad(), numerics.single_threaded():
            quantized = as_tuple(quantized_module(*sample))
        shim = SimpleNamespace(outputs=run.outputs)
        for position in range(n_out):
            spec = twin.output_specs[position]
            got = run.outputs[position]
            same = _dim_order_bytes(got, spec.dim_order) == twin_run.output_bytes[position]
            scale, zero_point = output_quantization(twin, position)
            bound = float_bound(twin_run.outputs[position], reductions[position])
            size, count = _difference(got, twin_run.outputs[position], bound)
            if not same and got.dtype.is_floating_point and count == 0:
                # Float kernels that sum in another order: equal within the stated bound.
                same = True
                within_bound[position] = True
            if scale is not None and got.dtype.is_floating_point:
                size = round(size / scale * 1000) / 1000
            equal[position] &= same
            if not same and first_differing is None:
                first_differing = index
            worst_twin[position] = max(worst_twin[position], size)
            diff_twin[position] += count
            value = float_output(shim, position, scale, zero_point)
            reference = quantized[position].float().reshape(value.shape)
            steps = quantized_steps(got, value, reference, scale, zero_point)
            worst_ref[position] = max(worst_ref[position], float(steps.max()) if steps.numel() else 0.0)
            diff_ref[position] += int((steps >= 0.5).sum())
            elements[position] += got.numel()
    rows, traced, divergence = (), None, None
    # A traced run is a fresh instance: a program with state replays its initial state, so
    # only frame 0 is traced there (a later frame's divergence is reported by its outputs).
    if error is None and (per_op or first_differing is not None) and \
            not (twin.has_state and first_differing):
        traced = first_differing if first_differing is not None else 0
        twin.reset()
        device = device_inputs(twin, inputs[traced])
        try:
            traced_run = runtime.run(twin.pte_bytes, device, npu=handler, trace=True)
            rows = _per_op(twin, twin.run(device, keep_intermediates=True,
                                          npu=twin.npu_executor(npu.choice)), traced_run)
            divergence = next((r for r in rows if not r.equal), None)
        except RuntimeFailure as failure:
            error = f"traced run: {failure}"
    if error is not None:
        equal = [False] * n_out
    outputs = tuple(OutputAgreement(
        p, tuple(twin.output_specs[p].sizes), str(twin.output_specs[p].dtype).replace("torch.", ""),
        equal[p], worst_twin[p], diff_twin[p], worst_ref[p], diff_ref[p], elements[p],
        within_bound[p]) for p in range(n_out))
    bytes_equal = error is None and all(o.bytes_equal for o in outputs)
    outcome = _outcome(error, bytes_equal, rows, divergence, limits)
    passed = outcome == "passed"
    median = (lambda values: statistics.median(values) if values else math.nan)
    report = RuntimeReport(
        str(pte_path), method_for(twin, npu), len(inputs), source, outputs, rows, traced, divergence, limits,
        tuple(c_path), C_PATH_FORM if c_path else PROGRAM_FORM, error, median(runtime_seconds),
        median(npu_seconds), median(twin_seconds), runtime.library.key[:16], bytes_equal, outcome,
        passed, "", tuple(boundaries))
    return RuntimeReport(**{**report.__dict__, "verdict": _verdict(report)})


def runtime_float_values(program, inputs, npu_model: str = "auto",
                         runtime: HostRuntime | None = None) -> int:
    """For each sample in `inputs` (model inputs) whose outputs the host runtime and the twin
    write differently, the runtime's float values that make them agree within the
    summation-order bound (`_take_runtime_floats`), kept in `TwinProgram.device_floats` for a
    bundle's expectation (QEMU's, when it runs without the host runtime's method); the number of
    samples they reconcile. Raises NotRun when the runtime cannot be built or run here."""
    twin = as_program(program)
    if twin.has_state or not computes_floats(twin):
        return 0
    owned = runtime is None
    try:
        runtime = runtime or HostRuntime(sources=find_sources())
    except RuntimeUnavailable as error:
        raise NotRun(f"not run: the ExecuTorch host runtime is unavailable: {error}") from None
    npu = twin.npu_executor(npu_model)
    handler = npu_handler(twin, npu) if twin.partitions else None
    host_twin = replace(twin, isa_tier=HOST_TIER) if twin.isa_tier in ("mve", "dsp") else twin
    reductions = _output_reductions(host_twin)
    found = 0
    try:
        for sample in inputs:
            device = device_inputs(host_twin, sample)
            run = runtime.run(host_twin.pte_bytes, device, npu=handler)
            twin_run = host_twin.run(device, npu=host_twin.npu_executor(npu.choice))
            if not _outputs_agree(host_twin, run.outputs, twin_run, reductions) and \
                    _take_runtime_floats(host_twin, runtime, handler, device, npu.choice,
                                         reductions, 0) is not None:
                found += 1
    except (RuntimeUnavailable, RuntimeFailure) as error:
        raise NotRun(f"not run: the ExecuTorch host runtime: {error}") from None
    finally:
        if owned:
            runtime.close()
    return found


# Kernels whose float output is one correctly rounded operation of their inputs, the same on
# every implementation: they cannot put a float on either side of a rounding boundary.
_EXACT_FLOAT_KERNELS = ("dequantize_per_tensor", "dequantize_per_channel")


def computes_floats(twin: TwinProgram) -> bool:
    """The program has a kernel computing float values two implementations may round apart."""
    values = twin.view.values
    return any(
        call.operator.name.split("::")[-1] not in _EXACT_FLOAT_KERNELS and any(
            values[i].is_tensor and values[i].dtype.is_floating_point
            for i in twin.tensor_indices(call.args[-1]))
        for call in twin.view.kernel_calls() if call.args)


def _outputs_agree(twin: TwinProgram, outputs, twin_run: TwinRun, reductions) -> bool:
    """Every output the runtime returned has the twin's bytes (float ones: within the bound)."""
    for position, got in enumerate(outputs):
        if _dim_order_bytes(got, twin.output_specs[position].dim_order) == \
                twin_run.output_bytes[position]:
            continue
        expected = twin_run.outputs[position]
        if not got.dtype.is_floating_point or \
                _difference(got, expected, float_bound(expected, reductions[position]))[1]:
            return False
    return True


def _take_runtime_floats(twin: TwinProgram, runtime, handler, device, npu_choice: str,
                         reductions, sample: int) -> tuple[TwinRun, FloatBoundary] | None:
    """The twin's run of `device` carried on from the runtime's float values (a traced run's)
    where they differ within the bound, and what that moved, when its outputs then agree with
    the runtime's; None when they still differ (a difference the floats do not explain). The
    values taken are kept in `twin.device_floats` for the sample, so a bundle's expectation
    (QEMU's) takes them again."""
    traced = runtime.run(twin.pte_bytes, device, npu=handler, trace=True)
    logged = {i.instruction: tuple(logical(v) for v in i.values) for i in traced.instructions}
    taking = twin.run(device, keep_intermediates=True, npu=twin.npu_executor(npu_choice),
                      device_floats=logged)
    if not taking.took or not _outputs_agree(twin, traced.outputs, taking, reductions):
        return None
    plain = twin.run(device, keep_intermediates=True, npu=twin.npu_executor(npu_choice))
    moved: tuple = (None, "", 0, 0)
    for entry in taking.op_trace:
        for index in entry.outputs:
            before, after = plain.intermediates.get(index), taking.intermediates.get(index)
            if before is None or after is None or before.dtype.is_floating_point or \
                    torch.equal(before, after):
                continue
            steps = (before.long() - after.long()).abs()
            moved = (entry.instruction, entry.op, int((steps > 0).sum()), int(steps.max()))
            break
        if moved[0] is not None:
            break
    twin.device_floats[input_key(device)] = DeviceFloats(
        RUNTIME_TRACE, {t.instruction: logged[t.instruction] for t in taking.took})
    return taking, FloatBoundary(sample, len({t.instruction for t in taking.took}), *moved)


def _outcome(error, bytes_equal, rows, divergence, limits) -> str:
    if error is not None:
        # a host kernel overran its planned scratch (kernels/host_scratch.py): what the runtime
        # did after that (a refused check, a crash) is the host's, not the program's
        return "partial" if limits else "error"
    if bytes_equal:
        return "passed"
    if divergence is not None and any(h.instruction == divergence.instruction for h in limits) \
            and all(r.equal for r in rows if r.instruction < divergence.instruction):
        return "partial"
    return "failed"


SHORT_METHOD = "the ExecuTorch runtime with host-built cortex_m kernels, CMSIS-NN and EthosUBackend"


def _grouped(instructions: tuple[str, ...], listed: int = 4) -> str:
    """`12 op.out, 30 op.out, ...` as one entry per operator: `op.out x N (instructions 12, 30,
    ...)`, at most `listed` instruction numbers each, so a long program's verdict stays one line."""
    by_op: dict[str, list[str]] = {}
    for entry in instructions:
        index, op = entry.split(" ", 1)
        by_op.setdefault(op, []).append(index)
    parts = []
    for op, indices in by_op.items():
        shown = ", ".join(indices[:listed]) + (", ..." if len(indices) > listed else "")
        parts.append(f"{op} x{len(indices)} (instruction{'s' if len(indices) > 1 else ''} "
                     f"{shown})")
    return "; ".join(parts)


def _verdict(report: RuntimeReport) -> str:
    if report.outcome == "error":
        return (f"FAILED by {SHORT_METHOD}: the runtime did not run the program: "
                f"{report.runtime_error.splitlines()[0]}")
    if report.outcome == "passed":
        c_path = ""
        if report.c_path_only:
            c_path = (f"; {len(report.c_path_only)} instruction(s) compared in CMSIS-NN's C-path "
                      "form, their MVE form is judged on an MVE core (verify --qemu): "
                      + _grouped(report.c_path_only))
        floats = ("" if not any(o.within_float_bound for o in report.outputs) else
                  f" (float outputs within {FLOAT_ULPS_PER_TERM} ulps per summed term)")
        return (f"PASSED by {SHORT_METHOD}: every output agrees with the twin's{floats} on "
                f"{report.samples} sample(s){c_path}{_boundaries(report.float_boundaries)}")
    d = report.first_divergence
    if report.outcome == "partial" and report.runtime_error:
        limit = report.host_limits[0]
        return (f"PARTIAL by {SHORT_METHOD}: the host cannot run this program as the device "
                f"does: at instruction {limit.instruction} {limit.op} {limit.reason}, and the "
                f"run ended: {report.runtime_error.splitlines()[0]}; nothing was compared")
    if report.outcome == "partial":
        limit = next(h for h in report.host_limits if h.instruction == d.instruction)
        return (f"PARTIAL by {SHORT_METHOD}: runtime and twin agree on every instruction before "
                f"{d.instruction} {d.op}, which the host cannot run as the device does "
                f"({limit.reason}); nothing after it was compared")
    text = "runtime and twin outputs differ"
    if d is not None:
        text += (f"; they part at instruction {d.instruction} {d.op} ({_fmt(d.max_difference)} "
                 f"max, {d.differing}/{d.elements} elements)")
    return f"FAILED by {SHORT_METHOD}: {text}"


def _boundaries(found: tuple[FloatBoundary, ...]) -> str:
    """The verdict's words for the samples that agree once the twin takes the runtime's floats."""
    if not found:
        return ""
    moved = [b for b in found if b.instruction is not None]
    first = (f"; first: sample {moved[0].sample}, instruction {moved[0].instruction} "
             f"{moved[0].op}, {moved[0].elements} element(s) by {moved[0].max_steps} step(s)"
             if moved else "")
    return (f"; {len(found)} sample(s) agree once the twin takes the runtime's float values "
            f"where they differ within the summation-order bound (a float on a rounding "
            f"boundary that the two summation orders quantize to neighbouring steps{first})")


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return f"{value:.4g}"


def _agreement(o: OutputAgreement) -> str:
    if o.within_float_bound:
        return (f"float within bound ({FLOAT_ULPS_PER_TERM} ulps of the largest magnitude per "
                "summed term)")
    return "bytes equal" if o.bytes_equal else "bytes DIFFER"


def render_text(report: RuntimeReport) -> str:
    lines = [f"verify --runtime executorch {report.pte}: {report.outcome.upper()}",
             f"  method: {report.method}",
             f"  host runtime library {report.library_key}; {report.samples} samples "
             f"({report.inputs})"]
    if report.runtime_error:
        lines.append("  runtime error:")
        lines += [f"    {line}" for line in report.runtime_error.splitlines()[:20]]
    for o in report.outputs if not report.runtime_error else ():
        lines.append(f"    output {o.index} {list(o.shape)} {o.dtype}: runtime vs twin "
                     f"{_agreement(o)} (max "
                     f"{_fmt(o.max_steps_vs_twin)} steps, {o.differing_vs_twin}/{o.elements} "
                     f"elements); {COMPARED_FORM[report.reference_comparison_form]} vs "
                     f"quantized reference max {_fmt(o.max_steps_vs_quantized)} steps, "
                     f"{o.differing_vs_quantized}/{o.elements} elements differ")
    if report.reference_comparison_form == C_PATH_FORM and not report.runtime_error:
        # x86 has no MVE: a C-path figure far from the reference says nothing of the device's.
        lines.append(f"  quantized reference: the figures above are of the host's C path, which "
                     f"computes {len(report.c_path_only)} instruction(s) otherwise than the "
                     "program's MVE form; the MVE form's steps are the twin's (verify --runtime "
                     "twin), and QEMU's Cortex-M55 runs it byte-exact against the twin (verify "
                     "--qemu)")
    for b in report.float_boundaries:
        where = (f"moved instruction {b.instruction} {b.op}: {b.elements} element(s) by "
                 f"{b.max_steps} step(s)" if b.instruction is not None else "moved no integer value")
        lines.append(f"  float rounding boundary, sample {b.sample}: the twin took the runtime's "
                     f"float values at {b.taken} instruction(s), within the summation-order "
                     f"bound; that {where}; the outputs then agree byte for byte")
    if report.host_limits:
        lines.append("  host limits (the host cannot run the device's code path here):")
        lines += [f"    instruction {h.instruction} {h.op}: {h.reason}" for h in report.host_limits]
    if report.first_divergence:
        d = report.first_divergence
        lines.append(f"  runtime and twin part at instruction {d.instruction} {d.op}: "
                     f"{_fmt(d.max_difference)} max, {d.differing}/{d.elements} elements differ "
                     f"(sample {report.traced_sample})")
    if report.per_op and (report.first_divergence is None or len(report.per_op) <= 64):
        lines.append(f"  per op (sample {report.traced_sample}, runtime debug buffer vs twin):")
        lines += [f"    {r.instruction:>3} {r.op:<44} {'equal' if r.equal else 'DIFFER'} "
                  f"max {_fmt(r.max_difference)} {r.differing}/{r.elements}"
                  for r in report.per_op]
    if report.runtime_error:
        lines.append(f"  outputs: not compared (the runtime did not finish a run on any of the "
                     f"{report.samples} samples)")
    else:
        lines.append(f"  runtime: {report.runtime_seconds_per_sample * 1000:.2f} ms per sample "
                     f"(NPU emulation {report.runtime_npu_seconds_per_sample * 1000:.2f} ms); "
                     f"twin: {report.twin_seconds_per_sample * 1000:.1f} ms per sample")
    lines.append(f"  verdict: {report.verdict}")
    return "\n".join(lines)


def report_json(report: RuntimeReport) -> dict:
    def clean(value):
        if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
            return None if math.isnan(value) else "inf"
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    return clean(asdict(report))
