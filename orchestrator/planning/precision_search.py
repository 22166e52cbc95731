"""`--precision auto`: the fewest modules raised to A16W8 that bring the program within an
accuracy budget on a validation set.

1. Compile the model int8 everywhere and rank its layers by the per-layer error ranking
   (orchestrator/verification/layer_error.py: the share of the program's output error each
   layer makes alone, worst first), on the validation set.
2. Raise the next layer's source modules to a16w8 (orchestrator/compilation/precision.py) and
   compile again; a layer with no module of its own (the model input) is skipped, as the
   ranking says, since no module name reaches it.
3. Stop at the first program within the budget: `min_snr_db` (output 0 against the float model,
   dB) and/or `max_accuracy_drop` (the float model's top-1 minus the program's, points; needs
   labels). Every raise costs flash, RAM or NPU time, so the first program within the budget is
   the cheapest that meets it in this order.

Accuracy is the quantized reference's (the artifacts' quantized.pt2 on PyTorch, every sample of
the validation set), the graph the program computes: `verify` checks that the program computes
it (the twin, the host runtime, QEMU). Latency is the cost model's estimate (the plan's: Vela for
NPU partitions, the CPU cost model for CPU rows), flash the .pte's bytes, RAM the ExecuTorch
arena (the Ethos-U scratch is in the plan's memory lines).

Every raise missed the budget: one line, exit 4 (VerificationFailure).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from orchestrator import numerics
from orchestrator.artifacts.outputs import write_outputs
from orchestrator.device_runs.combined import load_program
from orchestrator.errors import UserError, VerificationFailure
from orchestrator.planning.run import plan_request
from orchestrator.request import Request
from orchestrator.sources.loader import load_dataset
from orchestrator.verification.layer_error import layer_errors
from orchestrator.verification.twin_verify import as_tuple, model_example_inputs

if TYPE_CHECKING:  # annotations only
    from orchestrator.planning.plan import Plan

MEASURED_BY = "quantized reference"


@dataclass(frozen=True)
class Raise:
    """One step's new a16w8 modules and why: the layer the ranking put next."""

    modules: tuple[str, ...]
    layer: str  # the ranking's layer (module path and ops)
    rank: int  # 1 = worst
    share: float  # of the int8 program's output error power, that layer alone (0..1)
    alone_snr_db: float  # the output's SNR with only that layer quantized


@dataclass(frozen=True)
class Step:
    """One program of the search and its figures."""

    raised: tuple[str, ...]  # every a16w8 module so far
    why: Raise | None  # None for the int8 start
    snr_db: float  # output 0 against the float model, by the quantized reference
    top1: float | None  # percent against the labels, by the quantized reference
    npu_mac_pct: float
    latency_seconds: float | None  # the cost model's (the plan's estimate)
    latency_source: str | None
    pte_bytes: int
    arena_bytes: int
    within: bool  # the budget holds


@dataclass(frozen=True)
class PrecisionSearch:
    """The steps in order, the float model's top-1, the budget, and the program chosen."""

    steps: tuple[Step, ...]
    float_top1: float | None
    min_snr_db: float | None
    max_accuracy_drop: float | None
    dataset: str
    samples: int
    chosen: int | None  # index into steps; None: no step met the budget
    plan: "Plan | None" = None  # the chosen step's

    @property
    def precision(self) -> str:
        """The chosen program's --precision text."""
        step = self.steps[self.chosen if self.chosen is not None else -1]
        return ",".join(f"{m}=a16w8" for m in step.raised)

    def budget_text(self) -> str:
        parts = []
        if self.min_snr_db is not None:
            parts.append(f"SNR >= {self.min_snr_db:g} dB")
        if self.max_accuracy_drop is not None:
            parts.append(f"top-1 drop <= {self.max_accuracy_drop:g} points")
        return " and ".join(parts)

    def render_text(self) -> str:
        labelled = self.float_top1 is not None
        lines = [f"precision auto: budget {self.budget_text()} on {self.dataset} "
                 f"({self.samples} samples, measured by the {MEASURED_BY} against the float "
                 f"model{f', float top-1 {self.float_top1:.1f}%' if labelled else ''})",
                 f"  {'step':>4}  {'raised to a16w8':<28} {'SNR dB':>7} "
                 + (f"{'top-1':>6} " if labelled else "")
                 + f"{'NPU MACs':>8} {'latency':>10} {'flash B':>8} {'RAM B':>7}  budget"]
        for index, step in enumerate(self.steps):
            names = "+ " + ", ".join(step.why.modules) if step.why else "(int8 everywhere)"
            latency = "-" if step.latency_seconds is None else \
                f"{step.latency_seconds * 1e3:.3f}ms"
            mark = "met" if step.within else "missed"
            if index == self.chosen:
                mark += " <- chosen"
            lines.append(f"  {index:>4}  {names[:28]:<28} {_db(step.snr_db):>7} "
                         + (f"{step.top1:>5.1f}% " if labelled else "")
                         + f"{step.npu_mac_pct:>7.1f}% {latency:>10} {step.pte_bytes:>8,} "
                         f"{step.arena_bytes:>7,}  {mark}")
        source = next((s.latency_source for s in self.steps if s.latency_source), None)
        lines.append(f"  each step keeps the ones before it; latency: the cost model's estimate "
                     f"({source or 'none'}); flash: the .pte's bytes; RAM: the ExecuTorch "
                     "arena; NPU MACs: share on the NPU")
        for step in self.steps:
            if step.why is not None:
                lines.append(f"  {', '.join(step.why.modules)} -> a16w8: layer "
                             f"{step.why.layer} is #{step.why.rank} of the int8 program's "
                             f"per-layer error ranking ({step.why.share:.1%} of its output error "
                             f"alone; output SNR {_db(step.why.alone_snr_db)} dB with only it "
                             "quantized)")
        if self.chosen is None:
            lines.append(f"  {self.missed()}")
        else:
            lines.append(f"  chosen: step {self.chosen} (--precision "
                         f"{self.precision or 'none: int8 meets the budget'})")
        return "\n".join(lines)

    def missed(self) -> str:
        last = self.steps[-1]
        return (f"precision auto: no program meets {self.budget_text()}: with every ranked "
                f"module a16w8 ({len(last.raised)}) the {MEASURED_BY} reaches SNR "
                f"{_db(last.snr_db)} dB"
                + (f", top-1 {last.top1:.1f}% (float {self.float_top1:.1f}%)"
                   if last.top1 is not None and self.float_top1 is not None else "")
                + "; loosen the budget or retrain with the quantization in mind")

    def to_json(self) -> dict:
        return {"measured_by": MEASURED_BY, "dataset": self.dataset, "samples": self.samples,
                "min_snr_db": self.min_snr_db, "max_accuracy_drop": self.max_accuracy_drop,
                "float_top1_pct": self.float_top1, "chosen": self.chosen,
                "steps": [{"a16w8": list(s.raised), "snr_db": _finite(s.snr_db),
                           "top1_pct": s.top1, "npu_mac_coverage_pct": s.npu_mac_pct,
                           "latency_seconds": s.latency_seconds,
                           "latency_source": s.latency_source, "pte_bytes": s.pte_bytes,
                           "arena_bytes": s.arena_bytes, "within_budget": s.within,
                           "why": None if s.why is None else {
                               "layer": s.why.layer, "rank": s.why.rank,
                               "share_of_error": s.why.share}}
                          for s in self.steps]}


def _db(value: float) -> str:
    return "exact" if math.isinf(value) else f"{value:.1f}"


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value


def search(request: Request, dataset: str, labels: str | None = "labels",
           min_snr_db: float | None = None, max_accuracy_drop: float | None = None,
           progress=None, announce=None) -> PrecisionSearch:
    """The search of the module docstring for `request` (its precision is ignored);
    `announce(step_line)` hears each step as it is measured. Raises VerificationFailure
    (exit 4) when every raise misses the budget."""
    if min_snr_db is None and max_accuracy_drop is None:
        raise UserError("--precision auto needs a budget: --min-snr DB (output 0 against the "
                        "float model) and/or --max-accuracy-drop POINTS (top-1, with labels)")
    if max_accuracy_drop is not None and labels is None:
        raise UserError("--max-accuracy-drop needs labels in the --dataset (--labels KEY); "
                        "a regression takes --min-snr DB")
    base = replace(request, precision=None)
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="orchestrate-precision-") as work:
        made, measured = _step(base, (), Path(work) / "step0.pte", dataset, labels, progress)
        float_top1, samples = measured[2], measured[3]
        within = _within(measured, float_top1, min_snr_db, max_accuracy_drop)
        steps.append(_row(made, (), None, measured, within))
        if announce:
            announce(steps[-1])
        chosen_plan = made if within else None
        if not within:
            for why in _raises(Path(work) / "step0.pte", dataset):
                raised = steps[-1].raised + why.modules
                made, measured = _step(replace(base, precision=",".join(
                    f"{m}=a16w8" for m in raised)), raised,
                    Path(work) / f"step{len(steps)}.pte", dataset, labels, progress)
                within = _within(measured, float_top1, min_snr_db, max_accuracy_drop)
                steps.append(_row(made, raised, why, measured, within))
                if announce:
                    announce(steps[-1])
                if within:
                    chosen_plan = made
                    break
    result = PrecisionSearch(tuple(steps), float_top1, min_snr_db, max_accuracy_drop,
                             dataset, samples, len(steps) - 1 if chosen_plan is not None
                             else None, chosen_plan)
    if chosen_plan is None:
        raise VerificationFailure(result.missed())
    return result


def _step(request: Request, raised, pte: Path, dataset, labels, progress):
    """Compile one candidate to `pte` (with its artifacts: the references the measurement and
    the ranking read) and measure it: (Plan, (snr_db, top1, float_top1, samples))."""
    made = plan_request(request, progress)
    made.refuse_miscompiles()
    write_outputs(made.compiled, pte, made.artifact_files())
    return made, _measure(pte, dataset, labels)


def _measure(pte: Path, dataset, labels):
    """(snr_db, top1, float_top1, samples): the quantized reference's output 0 against the float
    model's on every sample, and both top-1 against the labels (None without)."""
    program = load_program(str(pte))
    float_program, float_module = program.reference("float.pt2")
    _, quantized_module = program.reference("quantized.pt2")
    data = load_dataset(str(dataset), model_example_inputs(float_program), labels)
    with torch.no_grad(), numerics.single_threaded():
        want = torch.stack([as_tuple(float_module(*s))[0].reshape(-1).float()
                            for s in data.samples])
        got = torch.stack([as_tuple(quantized_module(*s))[0].reshape(-1).float()
                           for s in data.samples])
    noise, signal = float(((got - want) ** 2).sum()), float((want ** 2).sum())
    snr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal > 0
                                        else -math.inf)
    if data.labels is None:
        return snr, None, None, len(data.samples)
    truth = torch.as_tensor(data.labels[:len(data.samples)])
    return (snr, 100.0 * float((got.argmax(1) == truth).float().mean()),
            100.0 * float((want.argmax(1) == truth).float().mean()), len(data.samples))


def _within(measured, float_top1, min_snr_db, max_accuracy_drop) -> bool:
    snr, top1 = measured[0], measured[1]
    if min_snr_db is not None and not snr >= min_snr_db:
        return False
    return max_accuracy_drop is None or (top1 is not None and float_top1 - top1 <=
                                         max_accuracy_drop)


def _row(made, raised, why, measured, within) -> Step:
    s = made.summary
    return Step(tuple(raised), why, measured[0], measured[1], s.npu_mac_coverage_pct,
                s.latency_seconds, s.latency_source, len(made.compiled.pte_bytes),
                made.compiled.arena_bytes, within)


def _raises(pte: Path, dataset) -> list[Raise]:
    """The int8 program's layers, worst first, as the modules each step raises: a layer's
    source modules not raised by an earlier step; layers without one (the model input) are
    skipped."""
    program = load_program(str(pte))
    float_program, float_module = program.reference("float.pt2")
    _, quantized_module = program.reference("quantized.pt2")
    data = load_dataset(str(dataset), model_example_inputs(float_program), None)
    report = layer_errors(str(pte), float_module, quantized_module, tuple(data.samples),
                          data.source)
    out, seen = [], set()
    for rank, layer in enumerate(report.layers, 1):
        modules = tuple(m for m in layer.modules if m not in seen)
        if not modules:
            continue
        seen.update(modules)
        out.append(Raise(modules, layer.where, rank, layer.share, layer.alone_snr_db))
    return out
