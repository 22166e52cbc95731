"""`verify`: does the compiled `.pte` reproduce the quantized reference, byte-faithfully?

The program runs in the host twin (`orchestrator.twin`); the references are the two programs
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

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from orchestrator.artifacts import artifacts_dir_for
from orchestrator.errors import UserError
from orchestrator.twin import DeviceFault, TwinError, TwinProgram, TwinRun, load_twin

METHOD = "twin (cortex_m reference kernels + TOSA reference model on the Vela-compiled TOSA)"
SEED = 0


@dataclass(frozen=True)
class OutputComparison:
    """One program output over all samples."""

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
    passed: bool


@dataclass(frozen=True)
class OpComparison:
    """One int8 or bool tensor the twin wrote, against its best-matching reference node."""

    instruction: int
    op: str
    value: int  # EValue index
    dtype: str  # "int8" | "bool"
    reference_node: str | None
    max_steps: float | None  # int8 tensors: largest difference in steps
    mismatched: int | None  # elements that differ


@dataclass(frozen=True)
class Divergence:
    """The first op whose output leaves the quantized reference by more than the allowance."""

    instruction: int
    op: str
    value: int
    reference_node: str | None
    max_steps: float | None
    mismatched: int | None
    boundary: str | None  # the CPU/NPU boundary tensor involved, if any
    layout: str | None  # a layout reinterpretation at this op, if any


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
    max_steps_allowed: int
    outputs: tuple[OutputComparison, ...]
    faults: tuple[DeviceFault, ...]
    layout_events: tuple[LayoutEvent, ...]
    first_divergence: Divergence | None
    per_op: tuple[OpComparison, ...]
    twin_seconds_per_sample: float
    numerics_passed: bool
    passed: bool
    verdict: str


def load_reference(path: Path):
    import torchao.quantization.pt2e  # noqa: F401 - registers quantized_decomposed for loading

    if not path.is_file():
        raise TwinError(f"refusing to verify: reference program {path} is missing; re-run "
                        "`orchestrate compile` to write the artifacts folder")
    program = torch.export.load(path)
    return program, program.module(check_guards=False)


def _model_inputs(float_program) -> tuple[torch.Tensor, ...]:
    user = set(float_program.graph_signature.user_inputs)
    return tuple(n.meta["val"] for n in float_program.graph.nodes
                 if n.op == "placeholder" and n.name in user)


def sample_inputs(float_program, count: int, calibration: str | None):
    examples = tuple(torch.zeros(v.shape, dtype=v.dtype) for v in _model_inputs(float_program))
    if calibration is not None:
        from orchestrator.sources import load_calibration

        loaded = load_calibration(calibration, examples)
        return tuple(loaded.samples[:count]), f"{loaded.source}, first {min(count, len(loaded.samples))}"
    generator = torch.Generator().manual_seed(SEED)
    samples = tuple(tuple(torch.randn(e.shape, generator=generator) if e.dtype.is_floating_point
                          else torch.zeros(e.shape, dtype=e.dtype) for e in examples)
                    for _ in range(count))
    return samples, f"generated: randn, seed {SEED}"


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
    value = twin.plan.values[index].val
    return float(value.double_val) if type(value).__name__ == "Double" else int(value.int_val)


def _output_quantization(twin: TwinProgram, position: int) -> tuple[float | None, int]:
    """(scale, zero point) of an output: int8 outputs from the config, float from their dequantize."""
    prefix = f"output{position}_"
    if twin.output_specs[position].dtype != torch.float32 and prefix + "scale" in twin.config:
        return float(twin.config[prefix + "scale"]), int(twin.config[prefix + "zp"])
    found = twin.producer(twin.plan.outputs[position])
    if found and found[2].startswith("cortex_m::dequantize_per_tensor"):
        call = found[1]
        return _scalar(twin, call.args[1]), _scalar(twin, call.args[2])
    return None, 0


def _float_output(twin_run: TwinRun, position: int, scale, zero_point) -> torch.Tensor:
    value = twin_run.outputs[position]
    if value.dtype.is_floating_point:
        return value.float()
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


def _as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _steps(raw: torch.Tensor, value: torch.Tensor, quantized: torch.Tensor, scale, zero_point):
    """|twin - quantized reference| in quantization steps of the output."""
    if scale is None:
        return (value - quantized).abs()
    if not raw.dtype.is_floating_point:
        # An int8 output against the reference's dequantized value: compare the integers.
        expected = torch.round(quantized / scale) + zero_point
        return (raw.to(torch.float64).reshape(expected.shape) - expected.double()).abs().float()
    # Both sides are dequantized multiples of the scale; float32 leaves ~1e-5 step of noise.
    return torch.round((value - quantized).abs() / scale * 1000) / 1000


def _compare_outputs(twin, runs, quantized_outs, float_outs, max_steps) -> tuple[OutputComparison, ...]:
    comparisons = []
    for position in range(len(twin.plan.outputs)):
        scale, zero_point = _output_quantization(twin, position)
        worst, worst_sample, differing, elements = 0.0, 0, 0, 0
        snrs, cosines, top_float, top_quant = [], [], 0, 0
        classifier = None
        for sample, run in enumerate(runs):
            value = _float_output(run, position, scale, zero_point)
            quantized = quantized_outs[sample][position].float().reshape(value.shape)
            floating = float_outs[sample][position].float().reshape(value.shape)
            steps = _steps(run.outputs[position], value, quantized, scale, zero_point)
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
            top_float / count if classifier else None, top_quant / count if classifier else None,
            worst <= max_steps))
    return tuple(comparisons)


class _Recorder(torch.fx.Interpreter):
    """Runs the quantized reference and keeps every node's value."""

    def __init__(self, module):
        super().__init__(module)
        self.values: dict[str, object] = {}

    def run_node(self, node):
        result = super().run_node(node)
        self.values[node.name] = result
        return result


def _reference_checkpoints(module, sample) -> list[tuple]:
    """(topological index, node, value, scale, zero point) of every quantize and bool node."""
    recorder = _Recorder(module)
    with torch.no_grad():
        recorder.run(*sample)
    checkpoints = []
    for order, node in enumerate(module.graph.nodes):
        if node.op != "call_function":
            continue
        target = str(node.target)
        value = recorder.values.get(node.name)
        if not isinstance(value, torch.Tensor):
            continue
        if "quantize_per_tensor" in target and "dequantize" not in target and len(node.args) >= 3:
            checkpoints.append((order, node.name, value, float(node.args[1]), int(node.args[2])))
        elif value.dtype == torch.bool:
            checkpoints.append((order, node.name, value, None, None))
    return checkpoints


def _program_qparams(twin: TwinProgram) -> dict[int, tuple[float, int]]:
    """EValue -> (scale, zero point) for every tensor a quantize writes or a dequantize reads."""
    known = {}
    for instruction in twin.plan.chains[0].instructions:
        call = instruction.instr_args
        if type(call).__name__ != "KernelCall":
            continue
        name = twin.plan.operators[call.op_index].name
        if name == "cortex_m::quantize_per_tensor":
            known[call.args[6]] = (_scalar(twin, call.args[1]), _scalar(twin, call.args[2]))
        elif name == "cortex_m::dequantize_per_tensor":
            known[call.args[0]] = (_scalar(twin, call.args[1]), _scalar(twin, call.args[2]))
    return known


def _per_op(twin: TwinProgram, run: TwinRun, checkpoints, max_steps: int) -> tuple[OpComparison, ...]:
    """Match every int8/bool tensor the twin wrote to a reference node and measure the gap.

    Candidates share shape, dtype and (where the program states them) scale and zero point,
    and come after the previous match in topological order. The closest candidate within the
    allowance wins; when none is within it the earliest one is taken, because a wrong value
    matches nothing and the earliest unmatched node is the one the program is computing.
    """
    qparams = _program_qparams(twin)
    comparisons = []
    last_order = -1
    for entry in run.op_trace:
        for value in entry.outputs:
            tensor = run.intermediates.get(value)
            if tensor is None or tensor.dtype not in (torch.int8, torch.bool):
                continue
            kind = "bool" if tensor.dtype == torch.bool else "int8"
            candidates = [c for c in checkpoints if tuple(c[2].shape) == tuple(tensor.shape)
                          and c[2].dtype == tensor.dtype]
            if value in qparams:
                scale, zero_point = qparams[value]
                candidates = [c for c in candidates
                              if c[4] == zero_point and abs(c[3] - scale) <= 1e-6 * abs(scale)]
            later = [c for c in candidates if c[0] > last_order]
            candidates = later or candidates
            if not candidates:
                comparisons.append(OpComparison(entry.instruction, entry.op, value, kind, None,
                                                None, None))
                continue
            scored = []
            for candidate in candidates:
                diff = (tensor.to(torch.int32) - candidate[2].to(torch.int32)).abs()
                scored.append((float(diff.max()), int((diff > 0).sum()), candidate))
            close = [item for item in scored
                     if (item[0] <= max_steps if kind == "int8" else item[1] == 0)]
            steps, mismatched, best = (min(close, key=lambda item: (item[0], item[1], item[2][0]))
                                       if close else min(scored, key=lambda item: item[2][0]))
            last_order = max(last_order, best[0])
            comparisons.append(OpComparison(entry.instruction, entry.op, value, kind, best[1],
                                            steps if kind == "int8" else None, mismatched))
    return tuple(comparisons)


def _boundary_names(twin: TwinProgram) -> dict[tuple[str, str, int], str]:
    """(delegate, direction, slot) -> edge tensor name, from the manifest where unambiguous."""
    path = artifacts_dir_for(twin.pte_path) / "manifest.json"
    if not path.is_file():
        return {}
    names: dict[tuple[str, str], list[str]] = {}
    for entry in json.loads(path.read_text()).get("boundaries", []):
        listed = names.setdefault((entry["delegate"], entry["direction"]), [])
        if entry["tensor"] not in listed:
            listed.append(entry["tensor"])
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


def _first_divergence(twin, run, per_op, max_steps) -> Divergence | None:
    by_instruction = {e.instruction: e for e in run.op_trace}
    for comparison in per_op:
        if comparison.mismatched is None:
            continue
        if comparison.dtype == "int8" and comparison.max_steps <= max_steps:
            continue
        if comparison.dtype == "bool" and comparison.mismatched == 0:
            continue
        entry = by_instruction[comparison.instruction]
        layout = "; ".join(f"{r.argument} (dim_order {r.dim_order}) {r.direction} as {r.used_as}"
                           for r in entry.layout_reads) or None
        return Divergence(comparison.instruction, comparison.op, comparison.value,
                          comparison.reference_node, comparison.max_steps, comparison.mismatched,
                          _boundary(twin, run, entry), layout)
    return None


def _layout_events(run: TwinRun) -> tuple[LayoutEvent, ...]:
    return tuple(LayoutEvent(e.instruction, e.op, r.argument, r.dim_order, r.used_as, r.direction)
                 for e in run.op_trace for r in e.layout_reads)


def _verdict(passed, numerics_passed, outputs, faults, divergence, max_steps) -> str:
    worst = max((o.max_steps for o in outputs), default=0.0)
    if passed:
        return (f"PASSED by {METHOD}: every output within {worst:g} int8 step(s) of the "
                f"quantized reference (allowed {max_steps})")
    reasons = []
    if not numerics_passed:
        bad = next(o for o in outputs if not o.passed)
        text = f"output {bad.index} is {bad.max_steps:g} int8 steps off the quantized reference"
        if divergence is not None:
            text += (f"; first diverging op: instruction {divergence.instruction} "
                     f"{divergence.op} ({_divergence_size(divergence)})")
            if divergence.boundary:
                text += f" at boundary {divergence.boundary}"
        reasons.append(text)
    if faults:
        reasons.append(f"{len(faults)} check(s) the device would fail, first: instruction "
                       f"{faults[0].instruction} {faults[0].op}: {faults[0].check}")
    return f"FAILED by {METHOD}: " + "; ".join(reasons)


def verify(pte_path, samples: int = 16, calibration: str | None = None, per_op: bool = False,
           max_steps: int = 1) -> VerifyReport:
    """Run the `.pte` in the twin on `samples` inputs and compare it with both references."""
    if samples < 1 or max_steps < 0:
        # Zero samples would make every comparison vacuously true: never a pass.
        raise UserError(f"--samples must be at least 1 and --max-steps at least 0 (got "
                        f"{samples} and {max_steps})")
    pte_path = Path(pte_path)
    twin = load_twin(pte_path)
    art_dir = artifacts_dir_for(pte_path)
    float_program, float_module = load_reference(art_dir / "float.pt2")
    _, quantized_module = load_reference(art_dir / "quantized.pt2")
    inputs, source = sample_inputs(float_program, samples, calibration)
    runs, quantized_outs, float_outs = [], [], []
    for sample in inputs:
        runs.append(twin.run(device_inputs(twin, sample)))
        with torch.no_grad():
            quantized_outs.append(_as_tuple(quantized_module(*sample)))
            float_outs.append(_as_tuple(float_module(*sample)))
    outputs = _compare_outputs(twin, runs, quantized_outs, float_outs, max_steps)
    faults = tuple({(f.instruction, f.check): f for r in runs for f in r.faults}.values())
    numerics_passed = all(o.passed for o in outputs)
    divergence, table = None, ()
    if per_op or not numerics_passed:
        worst = max(outputs, key=lambda o: o.max_steps).worst_sample if outputs else 0
        detailed = twin.run(device_inputs(twin, inputs[worst]), keep_intermediates=True)
        table = _per_op(twin, detailed, _reference_checkpoints(quantized_module, inputs[worst]),
                        max_steps)
        if not numerics_passed:
            divergence = _first_divergence(twin, detailed, table, max_steps)
    passed = numerics_passed and not faults
    seconds = sum(r.seconds for r in runs) / max(len(runs), 1)
    return VerifyReport(
        str(pte_path), METHOD, len(inputs), source, max_steps, outputs, faults,
        _layout_events(runs[0]) if runs else (), divergence, table if per_op else (), seconds,
        numerics_passed, passed,
        _verdict(passed, numerics_passed, outputs, faults, divergence, max_steps))


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
    lines = [f"verify {report.pte}: {'PASSED' if report.passed else 'FAILED'}",
             f"  method: {report.method}",
             f"  {report.samples} samples ({report.inputs}); allowed <= {report.max_steps_allowed} "
             "int8 step(s) vs the quantized reference"]
    for o in report.outputs:
        top1 = ""
        if o.top1_vs_float is not None:
            top1 = (f"; top-1 agrees with float {o.top1_vs_float:.0%}, with quantized "
                    f"{o.top1_vs_quantized:.0%}")
        lines.append(f"  output {o.index} {list(o.shape)}: max {o.max_steps:g} steps (step "
                     f"{_fmt(o.step)}, sample {o.worst_sample}), {o.differing_elements}/"
                     f"{o.elements} elements differ; vs float: SNR min {_fmt(o.snr_db_min, ' dB')}, "
                     f"cosine min {o.cosine_min:.5f}{top1}"
                     f"{'' if o.passed else '  <-- FAILS'}")
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
        lines.append("  per op (int8/bool tensors vs best-matching quantized reference node):")
        lines += [f"    {c.instruction:>3} {c.op:<40} EValue {c.value:<4} {c.dtype:<4} "
                  f"{c.reference_node or '-':<24} {_fmt(c.max_steps)} steps, "
                  f"{'-' if c.mismatched is None else c.mismatched} differ" for c in report.per_op]
    lines.append(f"  twin: {report.twin_seconds_per_sample * 1000:.1f} ms per sample")
    lines.append(f"  verdict: {report.verdict}")
    return "\n".join(lines)


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
