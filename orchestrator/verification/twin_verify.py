"""`verify`: does the compiled `.pte` reproduce the quantized reference, byte-faithfully?

The program runs in the host twin (`orchestrator.verification.twin`); the references are the two programs
`compile` saved beside it: `quantized.pt2` (the convert_pt2e model, the numbers the `.pte` must
reproduce) and `float.pt2` (the captured float model, for SNR, cosine and top-1 figures).

An output passes when the twin stays within `max_steps` quantization steps of the quantized
reference on every sample; the program passes when every output does and the twin met no check
a device kernel or the Ethos-U runtime would fail. On a numeric failure the report names the
first diverging op, found by comparing every int8 tensor the twin wrote with the quantized
reference's quantize nodes (matched by shape, quantization parameters where the program states
them, and order), and any CPU/NPU boundary whose bytes were reinterpreted in another layout.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field

import torch

from kernels.program_view import KernelCall
from orchestrator import numerics
from orchestrator.errors import UserError
from orchestrator.sources.loader import load_calibration
from orchestrator.verification.local_check import ForcedReference, LocalCheck, check_locally
from orchestrator.verification.npu import NpuExecutor, npu_lines, with_plan_macs
from orchestrator.verification.program import TwinError
from orchestrator.verification.twin import DeviceFault, TwinProgram, TwinRun, as_program
from partitioners.module_forms import buffers_kept

CPU_METHOD = "twin (cortex_m and portable reference kernels"
CPU_ONLY_METHOD = f"{CPU_METHOD}; the program has no NPU partition)"


def method_for(twin, npu: NpuExecutor | None = None) -> str:
    """The twin's method as it ran this program, naming how its NPU partitions were computed."""
    if not twin.partitions:
        return CPU_ONLY_METHOD
    return f"{CPU_METHOD}; {(npu or twin.npu_executor()).method})"
SEED = 0


@dataclass(frozen=True)
class OutputComparison:
    """One program output over all samples: end-to-end figures, not the verdict (which is local)."""

    index: int
    shape: tuple[int, ...]
    step: float | None  # the output's quantization scale: one int8 step in output units
    max_steps: float  # vs the quantized reference, worst element of the worst sample
    worst_sample: int
    differing_elements: int  # elements at least half a step off, summed over samples
    elements: int  # elements compared, summed over samples
    snr_db_min: float  # twin vs float reference
    cosine_min: float
    top1_vs_float: float | None  # fraction of samples whose argmax agrees (classifier outputs)
    top1_vs_quantized: float | None


@dataclass(frozen=True)
class Divergence:
    """The first op whose output leaves the reference fed its own inputs by more than its bound."""

    instruction: int
    op: str
    value: int
    reference_node: str | None
    max_steps: float | None
    mismatched: int | None
    boundary: str | None  # the CPU/NPU boundary tensor involved, if any
    layout: str | None  # a layout reinterpretation at this op, if any
    allowed_steps: float | None
    sample: int


@dataclass(frozen=True)
class LayoutEvent:
    instruction: int
    op: str
    argument: str
    dim_order: tuple[int, ...]
    used_as: str
    direction: str


@dataclass(frozen=True)
class VerifyReport:
    pte: str
    method: str
    samples: int
    inputs: str  # where the samples came from
    steps_per_stage: float  # allowed int8 steps per rounding stage in the local check
    outputs: tuple[OutputComparison, ...]
    faults: tuple[DeviceFault, ...]
    layout_events: tuple[LayoutEvent, ...]
    first_divergence: Divergence | None
    per_op: tuple[LocalCheck, ...]  # the local check of the worst sample (with --per-op)
    checked_values: int  # program values checked locally, over all samples
    unmatched_values: tuple[str, ...]  # "instruction op -> EValue" with no reference node
    twin_seconds_per_sample: float
    numerics_passed: bool
    passed: bool
    verdict: str
    inconclusive: str | None = None  # why the samples cannot tell a right program from a wrong one
    # partition -> what the NPU model executed (NpuTally.to_json(): figures by name)
    npu_execution: dict[str, dict] = field(default_factory=dict)
    # every value it compared passed, but some it wrote had no reference node: not a pass
    partial: bool = False
    # "instruction op: N element(s)" the reference leaves undefined, over all samples
    undefined_elements: tuple[str, ...] = ()
    # what a step is: int8, or with int16 values (--precision) each value's own dtype
    step_unit: str = "int8"
    # a program with state: the samples as frames, and output 0 against the float model per
    # tenth of them (`stream_drift`); None without state
    stream: dict | None = None


def _degenerate(runs, float_outs) -> str | None:
    """Why these samples prove nothing, or None. A program that matches its reference on them
    would also match a wrong program: every output identical across samples (a constant
    output), or a float reference that is all but zero (e.g. a network at random init whose
    activations vanish), so the int8 output is a constant too."""
    if len(runs) > 1 and all(len(set(out)) == 1 for out in zip(*(r.output_bytes for r in runs))):
        return (f"every output is the same on all {len(runs)} samples (a constant program "
                "output): give real inputs with --calibration, or trained weights")
    peak = max((float(t.abs().max()) for outs in float_outs for t in outs
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()),
               default=None)
    if peak is not None and peak < 1e-6:
        return (f"the float model's outputs are all below 1e-6 in magnitude (max {peak:.2g}): "
                "give trained weights or representative inputs")
    return None


def model_example_inputs(float_program) -> tuple[torch.Tensor, ...]:
    """Zeros shaped and typed like the model's inputs (what sample files are checked against)."""
    return tuple(torch.zeros(v.shape, dtype=v.dtype) for v in _model_inputs(float_program))


def _model_inputs(float_program) -> tuple[torch.Tensor, ...]:
    user = set(float_program.graph_signature.user_inputs)
    return tuple(n.meta["val"] for n in float_program.graph.nodes
                 if n.op == "placeholder" and n.name in user)


def sample_inputs(float_program, count: int, calibration: str | None):
    examples = tuple(torch.zeros(v.shape, dtype=v.dtype) for v in _model_inputs(float_program))
    if calibration is not None:
        loaded = load_calibration(calibration, examples)
        return tuple(loaded.samples[:count]), f"{loaded.source}, first {min(count, len(loaded.samples))}"
    generator = torch.Generator().manual_seed(SEED)
    tables = _index_ranges(float_program)
    samples = tuple(tuple(torch.randn(e.shape, generator=generator) if e.dtype.is_floating_point
                          else torch.randint(0, tables[i], e.shape, generator=generator,
                                             dtype=e.dtype) if i in tables
                          else torch.zeros(e.shape, dtype=e.dtype)
                          for i, e in enumerate(examples))
                    for _ in range(count))
    return samples, f"generated: randn, seed {SEED}" + (
        "; indices uniform over the table they index" if tables else "")


def _index_ranges(float_program) -> dict[int, int]:
    """Input position -> rows of the table it indexes, for an integer input an embedding or an
    index_select reads: generated indices stay inside it (zeros would give every sample the same
    output, which proves nothing)."""
    user = set(float_program.graph_signature.user_inputs)
    inputs = [n for n in float_program.graph.nodes if n.op == "placeholder" and n.name in user]
    ranges = {}
    for position, node in enumerate(inputs):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point:
            continue
        for reader in node.users:
            target = str(reader.target)
            table = None
            if "aten.embedding" in target and reader.args[1] is node:
                table = reader.args[0].meta.get("val")
                rows = table.shape[0] if isinstance(table, torch.Tensor) else None
            elif "aten.index_select" in target and reader.args[2] is node:
                table = reader.args[0].meta.get("val")
                dim = int(reader.args[1])
                rows = table.shape[dim] if isinstance(table, torch.Tensor) else None
            else:
                rows = None
            if rows:
                ranges[position] = min(ranges.get(position, rows), int(rows))
    return ranges


def device_inputs(twin: TwinProgram, sample: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The sample as the program takes it: int8 programs get it quantized by their config."""
    converted = []
    for position, (spec, value) in enumerate(zip(twin.input_specs, sample)):
        if spec.dtype == value.dtype:
            converted.append(value)
            continue
        prefix = f"input{position}_"
        if prefix + "scale" not in twin.config:
            raise TwinError(f"program input {position} is {spec.dtype} and states no "
                            f"{prefix}scale; cannot convert a {value.dtype} sample")
        converted.append(torch.ops.quantized_decomposed.quantize_per_tensor(
            value, twin.config[prefix + "scale"], twin.config[prefix + "zp"],
            twin.config[prefix + "quant_min"], twin.config[prefix + "quant_max"], spec.dtype))
    return tuple(converted)


def _scalar(twin: TwinProgram, index: int):
    value = twin.view.values[index]
    return float(value.scalar) if value.kind == "Double" else int(value.scalar)


def output_quantization(twin: TwinProgram, position: int) -> tuple[float | None, int]:
    """(scale, zero point) of an output: int8 outputs from the config, float from their
    dequantize; (None, 0) for an output no quantization produced (an argmax's int64 indices,
    a bool mask, a float computed on the CPU), which is compared in its own units."""
    prefix = f"output{position}_"
    if twin.output_specs[position].dtype != torch.float32 and prefix + "scale" in twin.config:
        return float(twin.config[prefix + "scale"]), int(twin.config[prefix + "zp"])
    found = twin.producer(twin.view.outputs[position])
    if found and found[2].startswith("cortex_m::dequantize_per_tensor"):
        call = found[1]
        return _scalar(twin, call.args[1]), _scalar(twin, call.args[2])
    return None, 0


def float_output(twin_run: TwinRun, position: int, scale, zero_point) -> torch.Tensor:
    """The output in the reference's units: dequantized when it is quantized, else as it is
    (integer indices and bool masks as exact small floats)."""
    value = twin_run.outputs[position]
    if value.dtype.is_floating_point:
        return value.float()
    if scale is None:
        return value.to(torch.float32)
    return (value.to(torch.int32) - zero_point).float() * scale


def _snr_db(reference: torch.Tensor, value: torch.Tensor) -> float:
    noise = float(((reference - value) ** 2).sum())
    signal = float((reference ** 2).sum())
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(),
                                                       dim=0))


def as_tuple(value) -> tuple:
    """A model's outputs as the program's flat output list: nested tuples and lists (an LSTM's
    `output, (h, c)`) flattened in pytree order, as export flattens them."""
    return tuple(torch.utils._pytree.tree_leaves(value))


def quantized_steps(raw: torch.Tensor, value: torch.Tensor, quantized: torch.Tensor, scale, zero_point):
    """|twin - quantized reference| in quantization steps of the output; an output with no
    quantization (integer indices, bool, float) in its own units, so integers compare exactly."""
    if scale is None:
        if not raw.dtype.is_floating_point:
            expected = quantized.to(torch.float64).reshape(raw.shape)
            return (raw.to(torch.float64) - expected).abs().float()
        return (value - quantized).abs()
    if not raw.dtype.is_floating_point:
        # An int8 output against the reference's dequantized value: compare the integers.
        expected = torch.round(quantized / scale) + zero_point
        return (raw.to(torch.float64).reshape(expected.shape) - expected.double()).abs().float()
    # Both sides are dequantized multiples of the scale; float32 leaves ~1e-5 step of noise.
    return torch.round((value - quantized).abs() / scale * 1000) / 1000


def _compare_outputs(twin, runs, quantized_outs, float_outs) -> tuple[OutputComparison, ...]:
    comparisons = []
    for position in range(len(twin.view.outputs)):
        scale, zero_point = output_quantization(twin, position)
        worst, worst_sample, differing, elements = 0.0, 0, 0, 0
        snrs, cosines, top_float, top_quant = [], [], 0, 0
        classifier = None
        for sample, run in enumerate(runs):
            value = float_output(run, position, scale, zero_point)
            quantized = quantized_outs[sample][position].float().reshape(value.shape)
            floating = float_outs[sample][position].float().reshape(value.shape)
            steps = quantized_steps(run.outputs[position], value, quantized, scale, zero_point)
            sample_max = float(steps.max())
            if sample == 0 or sample_max > worst:
                worst, worst_sample = sample_max, sample
            differing += int((steps >= 0.5).sum())
            elements += steps.numel()
            snrs.append(_snr_db(floating, value))
            cosines.append(_cosine(floating, value))
            classifier = value.dim() == 2 and value.shape[1] > 1
            if classifier:
                top_float += int(torch.equal(value.argmax(1), floating.argmax(1)))
                top_quant += int(torch.equal(value.argmax(1), quantized.argmax(1)))
        count = len(runs)
        comparisons.append(OutputComparison(
            position, tuple(twin.output_specs[position].sizes), scale, worst, worst_sample,
            differing, elements, min(snrs), min(cosines),
            top_float / count if classifier else None, top_quant / count if classifier else None))
    return tuple(comparisons)


def program_qparams(twin: TwinProgram) -> dict[int, tuple[float, int]]:
    """EValue -> (scale, zero point) for every tensor a quantize writes or a dequantize reads."""
    known = {}
    for call in twin.view.kernel_calls():
        name = call.operator.name
        if name == "cortex_m::quantize_per_tensor":
            known[call.args[6]] = (_scalar(twin, call.args[1]), _scalar(twin, call.args[2]))
        elif name == "cortex_m::dequantize_per_tensor":
            known[call.args[0]] = (_scalar(twin, call.args[1]), _scalar(twin, call.args[2]))
    return known


# cortex_m::quantized_div.out(input1, zp1, input2, zp2, out_zp, out_scale, out) writes its
# output zero point where the denominator's code is its zero point (op_quantized_div.cpp:
# `denominator != 0 ? numerator / denominator : 0`); the quantized reference divides by a
# dequantized 0 there, ±inf or NaN, which no int8 value approximates.
QUANTIZED_DIV = "cortex_m::quantized_div"
DIV_BY_ZERO = (f"{QUANTIZED_DIV} writes its output zero point where the denominator quantized "
               "to its zero point (op_quantized_div.cpp); the quantized reference is +-inf or NaN "
               "there")


def _undefined_quotients(twin: TwinProgram | None, run: TwinRun, instruction: int):
    """The elements a quantized_div at `instruction` divided by a zero denominator, or None."""
    call = twin.view.instructions[instruction] if twin is not None else None
    if not isinstance(call, KernelCall) or call.operator.name != QUANTIZED_DIV:
        return None
    denominator = run.intermediates.get(call.args[2])
    if denominator is None:
        return None
    mask = denominator.to(torch.int32) == int(_scalar(twin, call.args[3]))
    return mask if bool(mask.any()) else None


def written_values(run: TwinRun, view=None, twin: TwinProgram | None = None):
    """(instruction, op, EValue, tensor, input EValues, input tensors, undefined elements) for
    every int8 or bool tensor the program wrote; the input tensors are those of its inputs that
    are not its own outputs, a view the memory plan aliases to another value (written by no
    instruction: a reshape before a Cortex-M transpose) read from the last value written at its
    place; the undefined elements (None: none) those where the reference has no number
    (`_undefined_quotients`)."""
    latest: dict[tuple[int, int], torch.Tensor] = {}  # (mem_id, offset) -> last written there

    def place(value: int):
        described = view.values[value] if view is not None else None
        if described is None or described.kind != "Tensor" or not described.mem_id:
            return None
        return described.mem_id, described.mem_offset

    def aliased(value: int):
        where = place(value)
        found = latest.get(where) if where else None
        described = view.values[value] if where else None
        if found is None or described.dim_order != tuple(range(len(described.sizes))) or \
                found.dtype != described.dtype or found.numel() != math.prod(described.sizes):
            return None
        return found.contiguous().reshape(described.sizes)

    for entry in run.op_trace:
        inputs = {}
        for v in entry.inputs:
            if v not in entry.outputs:
                tensor = run.intermediates.get(v)
                tensor = tensor if tensor is not None else aliased(v)
                if tensor is not None:
                    inputs[v] = tensor
        undefined = _undefined_quotients(twin, run, entry.instruction) if entry.kind == \
            "kernel" else None
        for value in entry.outputs:
            tensor = run.intermediates.get(value)
            # int16: a module given a16w8 (--precision), checked in int16 steps
            if tensor is not None and tensor.dtype in (torch.int8, torch.int16, torch.bool):
                yield (entry.instruction, entry.op, value, tensor, tuple(entry.inputs), inputs,
                       undefined if undefined is not None and undefined.numel() ==
                       tensor.numel() else None)
        for value in entry.outputs:
            tensor = run.intermediates.get(value)
            where = place(value)
            if tensor is not None and where:
                latest[where] = tensor


def reference_states(twin: TwinProgram) -> list[tuple[torch.Tensor, tuple | None]]:
    """The quantized reference's state buffers, paired in order with the program's state
    values (both in the signature's order), each with the (scale, zero point) that reads it
    where the program keeps it int8 (orchestrator/compilation/program_state.int8_states);
    empty for a program without state, or where the two do not pair up."""
    if not twin.has_state:
        return []
    from orchestrator.compilation.program_state import mutated_buffers  # lazy: heavy (torchao)

    program, module = twin.reference("quantized.pt2")
    names = mutated_buffers(program)
    values = twin.view.state_values
    buffers = [module.get_buffer(name) for name in names]
    if len(buffers) != len(values) or any(b.numel() != v.nbytes // v.element_bytes
                                          for b, v in zip(buffers, values)):
        return []
    placeholder = {spec.target: spec.arg.name for spec in program.graph_signature.input_specs
                   if spec.target in names}
    nodes = {node.name: node for node in program.graph.nodes}
    paired = []
    for name, buffer, value in zip(names, buffers, values):
        qparams = None
        if value.dtype != buffer.dtype:
            reads = [user for user in nodes[placeholder[name]].users
                     if "quantize_per_tensor" in str(user.target)
                     and "dequantize" not in str(user.target)]
            if not reads:
                return []
            qparams = (float(reads[0].args[1]), int(reads[0].args[2]))
        paired.append((buffer, qparams))
    return paired


def stream_drift(twin: TwinProgram, runs, float_outs) -> dict | None:
    """A program with state run frame by frame: output 0's SNR against the float model stepped
    on its own state, over each tenth of the frames in order (fewer windows for fewer than 10
    frames). A stream that drifts loses SNR from one tenth to the next; the first tenth also
    holds the start, where the state fills. None without state."""
    if not twin.has_state or not runs:
        return None
    scale, zero_point = output_quantization(twin, 0)
    got = [float_output(run, 0, scale, zero_point).reshape(-1) for run in runs]
    want = [as_tuple(out)[0].float().reshape(-1) for out in float_outs]
    size = max(1, len(runs) // 10)
    windows = [(start, min(start + size, len(runs))) for start in range(0, len(runs), size)]
    if len(windows) > 1 and windows[-1][1] - windows[-1][0] < size:
        windows[-2:] = [(windows[-2][0], windows[-1][1])]  # a short tail joins the last window
    return {"frames": len(runs), "window_frames": size,
            "snr_db_by_window": [_snr_db(torch.cat(want[a:b]), torch.cat(got[a:b]))
                                 for a, b in windows],
            "source": "twin outputs against the float model stepped frame by frame on its own "
                      "state"}


def _local_checks(twin, run, quantized_module, sample, qparams, steps_per_stage):
    forced = ForcedReference(quantized_module, sample)
    return check_locally(forced, written_values(run, twin.view, twin), qparams, steps_per_stage)


def _boundary_names(twin: TwinProgram) -> dict[tuple[str, str, int], str]:
    """(delegate, direction, slot) -> edge tensor name, from the manifest where unambiguous."""
    if twin.manifest is None:
        return {}
    names: dict[tuple[str, str], list[str]] = {}
    for entry in twin.manifest.boundaries:
        listed = names.setdefault((entry.delegate, entry.direction), [])
        if entry.tensor not in listed:
            listed.append(entry.tensor)
    result = {}
    for partition in twin.partitions:
        for direction, count in (("cpu->npu", len(partition.payload.inputs)),
                                 ("npu->cpu", len(partition.payload.outputs))):
            listed = names.get((partition.delegate_name, direction), [])
            if len(listed) == count:
                for slot, name in enumerate(listed):
                    result[(partition.delegate_name, direction, slot)] = name
    return result


def _boundary(twin: TwinProgram, run: TwinRun, entry) -> str | None:
    """Describe the CPU/NPU boundary tensor feeding (or fed by) the diverging instruction."""
    names = _boundary_names(twin)
    by_instruction = {e.instruction: e for e in run.op_trace}
    if entry.kind == "delegate":
        delegate = entry.op.split()[-1]
        for slot, value in enumerate(entry.inputs):
            found = twin.producer(value)
            if found and not found[2].startswith("EthosUBackend"):
                name = names.get((delegate, "cpu->npu", slot))
                return (f"cpu->npu: input {slot} of {delegate} (EValue {value}"
                        f"{', edge tensor ' + repr(name) if name else ''}) written by "
                        f"{found[2]} at instruction {found[0]}")
        return None
    for value in entry.inputs:
        found = twin.producer(value)
        if found and found[2].startswith("EthosUBackend"):
            delegate = found[2].split()[-1]
            slot = by_instruction[found[0]].outputs.index(value)
            name = names.get((delegate, "npu->cpu", slot))
            return (f"npu->cpu: output {slot} of {delegate} (EValue {value}"
                    f"{', edge tensor ' + repr(name) if name else ''}) read by {entry.op}")
    return None


def _first_divergence(twin, run, checks, sample) -> Divergence | None:
    by_instruction = {e.instruction: e for e in run.op_trace}
    for check in checks:
        if check.passed is not False:
            continue
        entry = by_instruction[check.instruction]
        layout = "; ".join(f"{r.argument} (dim_order {r.dim_order}) {r.direction} as {r.used_as}"
                           for r in entry.layout_reads) or None
        return Divergence(check.instruction, check.op, check.value, check.reference_node,
                          check.max_steps, check.mismatched, _boundary(twin, run, entry), layout,
                          check.allowed_steps, sample)
    return None


def _layout_events(run: TwinRun) -> tuple[LayoutEvent, ...]:
    return tuple(LayoutEvent(e.instruction, e.op, r.argument, r.dim_order, r.used_as, r.direction)
                 for e in run.op_trace for r in e.layout_reads)


def step_unit(local) -> str:
    """What a step is in the local check: "int8", or, with int16 values (--precision), each
    value's own width."""
    widths = sorted({c.dtype for checks in local for c in checks if c.dtype != "bool"},
                    key=lambda d: int(d[3:]))
    return "int8" if widths in ([], ["int8"]) else \
        f"{'/'.join(widths)} (each value in steps of its own dtype)"


def _verdict(passed, numerics_passed, checked, unmatched, faults, divergence,
             steps_per_stage, method: str, unit: str = "int8") -> str:
    local = (f"every one of {checked} program values within {steps_per_stage:g} {unit} step(s) "
             "per rounding stage of the quantized reference fed the program's own inputs")
    if passed:
        return f"PASSED by {method}: {local}"
    reasons = []
    if not numerics_passed:
        if divergence is not None:
            text = (f"instruction {divergence.instruction} {divergence.op} is "
                    f"{_divergence_size(divergence)} off the reference fed its own inputs "
                    f"(allowed {_fmt(divergence.allowed_steps)}, sample {divergence.sample})")
            if divergence.boundary:
                text += f" at boundary {divergence.boundary}"
        elif checked == 0:
            text = "no program value could be matched to the quantized reference"
        else:
            text = f"{len(unmatched)} program value(s) have no reference node: {unmatched[0]}"
        reasons.append(text)
    if faults:
        reasons.append(f"{len(faults)} check(s) the device would fail, first: instruction "
                       f"{faults[0].instruction} {faults[0].op}: {faults[0].check}")
    return f"FAILED by {method}: " + "; ".join(reasons)


def verify(program, samples: int = 16, calibration: str | None = None, per_op: bool = False,
           max_steps: float = 1, npu_model: str = "auto", progress=None) -> VerifyReport:
    """Run the program (a loaded TwinProgram, or a `.pte` path) in the twin on `samples` inputs;
    check every value it writes locally (`orchestrator.verification.local_check`, `max_steps`
    int8 steps per rounding stage) and report the end-to-end error against both references as
    figures. `progress(stage, event, seconds)` hears each sample start and finish."""
    if samples < 1 or not (max_steps >= 0):
        # Zero samples would make every comparison vacuously true: never a pass.
        raise UserError(f"--samples must be at least 1 and --max-steps at least 0 (got "
                        f"{samples} and {max_steps})")
    twin = as_program(program)
    twin.reset()  # a program with state: the samples are frames, from its initial state
    # The TOSA graphs and references beside the .pte describe it only if its bytes are the ones
    # `compile` recorded: a .pte edited or swapped after compiling must not borrow their pass.
    manifest = twin.require_manifest()
    pte_path = twin.pte_path
    npu = twin.npu_executor(npu_model)
    float_program, float_module = twin.reference("float.pt2")
    _, quantized_module = twin.reference("quantized.pt2")
    inputs, source = sample_inputs(float_program, samples, calibration)
    qparams = program_qparams(twin)
    states = reference_states(twin)
    runs, quantized_outs, float_outs, local = [], [], [], []
    say = progress or (lambda _stage, _event, _seconds: None)
    for index, sample in enumerate(inputs):
        stage = f"twin: sample {index + 1} of {len(inputs)}, every value checked"
        began = time.perf_counter()
        say(stage, "start", 0.0)
        state_before = twin.state() if states else ()
        run = twin.run(device_inputs(twin, sample), keep_intermediates=True, npu=npu)
        with torch.no_grad(), numerics.single_threaded():
            # A state: the quantized reference reads the program's own (the frame's other
            # inputs are the program's too), as the local checks feed it; its outputs then
            # take the frame once. The float model carries its own: the drift is in its figures.
            for (buffer, read), value in zip(states, state_before):
                if read is not None:  # an int8 state: its float value, as the read sees it
                    value = (value.to(torch.float32) - read[1]) * read[0]
                buffer.copy_(value.to(buffer.dtype).reshape(buffer.shape))
            with buffers_kept(quantized_module) if states else contextlib.nullcontext():
                local.append(_local_checks(twin, run, quantized_module, sample, qparams,
                                           max_steps))
            quantized_outs.append(as_tuple(quantized_module(*sample)))
            float_outs.append(as_tuple(float_module(*sample)))
        runs.append(run)
        say(stage, "done", time.perf_counter() - began)
    outputs = _compare_outputs(twin, runs, quantized_outs, float_outs)
    faults = tuple({(f.instruction, f.check): f for r in runs for f in r.faults}.values())
    checked = sum(1 for checks in local for c in checks if c.passed is not None)
    unmatched = tuple(dict.fromkeys(f"instruction {c.instruction} {c.op} -> EValue {c.value}"
                                    for checks in local for c in checks if c.passed is None))
    numerics_passed = checked > 0 and all(c.passed is not False for checks in local for c in checks)
    worst = max(range(len(local)), key=lambda i: _badness(local[i])) if local else 0
    divergence = None
    if not numerics_passed and local:
        divergence = _first_divergence(twin, runs[worst], local[worst], worst)
    inconclusive = _degenerate(runs, float_outs) if numerics_passed and not faults else None
    complete = numerics_passed and not faults and inconclusive is None
    partial = complete and bool(unmatched)
    passed = complete and not partial
    seconds = sum(r.seconds for r in runs) / max(len(runs), 1)
    method = method_for(twin, npu)
    verdict = (f"INCONCLUSIVE by {method}: {inconclusive}" if inconclusive else
               f"PARTIAL by {method}: {checked} program values checked and within "
               f"{max_steps:g} {step_unit(local)} step(s) per rounding stage; {len(unmatched)} "
               f"not compared "
               f"(no reference node of that shape and dtype), first: {unmatched[0]}"
               if partial else
               _verdict(passed, numerics_passed, checked, unmatched, faults, divergence,
                        max_steps, method, step_unit(local)))
    undefined = _undefined(local)
    if undefined:
        verdict += (f"; not compared: {sum(undefined.values())} element(s) where "
                    f"{QUANTIZED_DIV} divided by a denominator quantized to zero (the reference "
                    "is +-inf or NaN there)")
    return VerifyReport(
        str(pte_path), method, len(inputs), source, max_steps, outputs, faults,
        _layout_events(runs[0]) if runs else (), divergence,
        local[worst] if per_op and local else (), checked, unmatched, seconds,
        numerics_passed, passed, verdict, inconclusive,
        with_plan_macs(npu.tally.to_json(), manifest), partial,
        tuple(f"{key}: {n} element(s)" for key, n in undefined.items()), step_unit(local),
        stream_drift(twin, runs, float_outs))


def _undefined(local) -> dict[str, int]:
    """"instruction op" -> elements not compared (the reference has no number there), over
    every sample."""
    counts: dict[str, int] = {}
    for checks in local:
        for check in checks:
            if check.undefined:
                key = f"instruction {check.instruction} {check.op}"
                counts[key] = counts.get(key, 0) + check.undefined
    return counts


def _badness(checks) -> tuple:
    """Order samples by local failures, then by the largest excess over the bound."""
    failing = sum(1 for c in checks if c.passed is False)
    excess = max(((c.max_steps or 0) - (c.allowed_steps or 0) for c in checks
                  if c.dtype != "bool" and c.passed is not None), default=0.0)
    return failing, excess


def _divergence_size(divergence: Divergence) -> str:
    if divergence.max_steps is None:
        return f"{divergence.mismatched} elements differ"
    return f"{divergence.max_steps:g} steps, {divergence.mismatched} elements differ"


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "exact" if value > 0 else "-inf"
    return f"{value:.4g}{unit}"


def render_text(report: VerifyReport) -> str:
    status = ("PASSED" if report.passed else "INCONCLUSIVE" if report.inconclusive else
              "PARTIAL" if report.partial else "FAILED")
    lines = [f"verify {report.pte}: {status}",
             f"  method: {report.method}",
             f"  {report.samples} samples ({report.inputs}); local check: each value the program "
             f"writes within {report.steps_per_stage:g} {report.step_unit} step(s) per rounding "
             "stage of the "
             f"quantized reference fed the program's own inputs ({report.checked_values} checked)",
             "  end to end (figures, not the verdict):"]
    for o in report.outputs:
        top1 = ""
        if o.top1_vs_float is not None:
            top1 = (f"; top-1 agrees with float {o.top1_vs_float:.0%}, with quantized "
                    f"{o.top1_vs_quantized:.0%}")
        lines.append(f"    output {o.index} {list(o.shape)}: max {o.max_steps:g} steps vs quantized (step "
                     f"{_fmt(o.step)}, sample {o.worst_sample}), {o.differing_elements}/"
                     f"{o.elements} elements differ; vs float: SNR min {_fmt(o.snr_db_min, ' dB')}, "
                     f"cosine min {o.cosine_min:.5f}{top1}")
    if report.stream is not None:
        d = report.stream
        by = ", ".join(_fmt(v, " dB") for v in d["snr_db_by_window"])
        lines.append(f"  stream: {d['frames']} frames in order from the initial state; output 0 "
                     f"vs float SNR by {d['window_frames']}-frame window: {by} "
                     f"({d['source']})")
    if report.faults:
        lines.append("  device checks that fail (the program would not run on the device as built):")
        lines += [f"    instruction {f.instruction} {f.op}: {f.message}" for f in report.faults]
    if report.first_divergence:
        d = report.first_divergence
        lines.append(f"  first diverging op: instruction {d.instruction} {d.op} -> EValue {d.value} "
                     f"({_divergence_size(d)} vs reference node {d.reference_node})")
        if d.boundary:
            lines.append(f"    boundary tensor: {d.boundary}")
        if d.layout:
            lines.append(f"    layout: {d.layout}")
    if report.layout_events:
        lines.append("  bytes reinterpreted in another layout:")
        lines += [f"    instruction {e.instruction} {e.op}: {e.argument} with dim_order "
                  f"{e.dim_order} {e.direction} as {e.used_as}" for e in report.layout_events]
    if report.per_op:
        lines.append("  per op, local check (worst sample; value vs its reference node fed the "
                     "program's inputs):")
        lines += [f"    {c.instruction:>3} {c.op:<40} EValue {c.value:<4} {c.dtype:<4} "
                  f"{c.reference_node or '-':<24} {_fmt(c.max_steps)} steps (allowed "
                  f"{_fmt(c.allowed_steps)}, {c.rounding_stages or 0} stage(s)), "
                  f"{'-' if c.mismatched is None else c.mismatched} differ"
                  f"{_local_mark(c)}" for c in report.per_op]
    if report.undefined_elements:
        lines.append(f"  not compared: {'; '.join(report.undefined_elements)}: {DIV_BY_ZERO}")
    if report.unmatched_values:
        lines.append(f"  not checked locally (no reference node of that shape and dtype): "
                     f"{'; '.join(report.unmatched_values[:5])}")
    if report.npu_execution:
        lines.append("  NPU, executed by the functional model (per invocation):")
        lines += [f"    {line}" for line in npu_lines(report.npu_execution)]
    lines.append(f"  twin: {report.twin_seconds_per_sample * 1000:.1f} ms per sample")
    lines.append(f"  verdict: {report.verdict}")
    return "\n".join(lines)


def _local_mark(check: LocalCheck) -> str:
    return {True: "", False: "  <-- FAILS", None: "  (unmatched)"}[check.passed]


def _jsonable(value):
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def report_json(report: VerifyReport) -> dict:
    return _jsonable(asdict(report))
