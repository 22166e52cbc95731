"""`verify --dataset`: how accurate the program is on a labelled set, by every method this
machine has, beside the float model and the quantized reference.

The same samples go through:

- the float model and the quantized reference of the artifacts folder (PyTorch, the figures
  every method is compared with);
- the twin (the program's instructions on the host, with the kernels of the core's ISA tier)
  and the host runtime (the real ExecuTorch runtime with the device kernels, built for the
  host: CMSIS-NN's C path), on every sample; the host runtime's outputs are compared byte for
  byte with the twin's computation of that same C path;
- QEMU's Cortex-M55 on a stated subset (the first `qemu_samples`), BundleIO byte-exact against
  the twin on it, so the device's accuracy on the subset is the twin's.

The accuracy the gates read is the device's: the host runtime's where the core runs the C
path (the scalar tier), else the twin's for the core's own tier (MVE, DSP), which the host
runtime checks on the C path and QEMU on the M55's own kernels.

A classifier (labels given) is judged by top-1 (and top-5 where it has more than five classes)
accuracy against the labels, agreement with the float model, per-class accuracy and the samples
whose prediction the program changed; every method also gets the error of output 0 against the
float model (SNR, mean and max absolute error), which is all a regression or an autoencoder
(no labels) has. Prediction is the arg max of output 0's last dimension.

Gates: `min_accuracy` (top-1 of the device method that judged, in percent) and
`max_accuracy_drop` (the float model's top-1 minus that, in points) fail the run (exit 4);
a gate that cannot be judged (no labels, no method ran) is "not run" (exit 5).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from kernels.native.errors import QemuUnavailable
from kernels.reference import HOST_TIER
from kernels.runtime import HostRuntime, RuntimeUnavailable, ensure_library, find_sources
from orchestrator import numerics
from orchestrator.device_runs.qemu import (installed_platform, qemu_on_checked_pte,
                                           qemu_unavailable_reason)
from orchestrator.device_runs.runtime_verify import npu_handler
from orchestrator.errors import NotRun, UserError, VerificationFailure
from orchestrator.sources.loader import Dataset, load_dataset
from orchestrator.verification import tflm
from orchestrator.verification.methods import QEMU, RUNTIME, TWIN, qemu_label
from orchestrator.verification.twin import TwinProgram
from orchestrator.verification.twin_verify import (as_tuple, device_inputs, model_example_inputs,
                                                   output_quantization)

FLOAT, QUANTIZED = "float model", "quantized reference"
TFLITE_FLOAT = "TFLite file (LiteRT)"  # a program from a float .tflite: the file itself
MAX_LISTED = 10  # changed predictions listed by index


@dataclass(frozen=True)
class MethodAccuracy:
    """One way of computing the outputs, measured on the samples it ran."""

    method: str
    samples: int
    seconds_per_sample: float | None
    top1: float | None = None  # percent, against the labels
    topk: float | None = None  # percent (k = 5), classifiers of more than five classes
    agreement: float | None = None  # percent of predictions equal to the float model's
    changed: tuple[int, ...] = ()  # sample indices whose prediction differs from float's
    per_class: dict[int, tuple[int, int]] = field(default_factory=dict)  # label: (right, all)
    snr_db: float | None = None  # output 0 against the float model
    mean_abs_error: float | None = None
    max_abs_error: float | None = None
    note: str = ""  # what it proves, or why it did not run
    label: str = ""  # how the report names it, when not by `method` (QEMU: the core it ran)

    @property
    def shown(self) -> str:
        return self.label or self.method

    def to_json(self) -> dict:
        return {"method": self.method, "label": self.shown, "samples": self.samples,
                "seconds_per_sample": self.seconds_per_sample, "top1_pct": self.top1,
                "top5_pct": self.topk, "agreement_with_float_pct": self.agreement,
                "changed_predictions": list(self.changed),
                "per_class": {str(k): {"right": v[0], "samples": v[1]}
                              for k, v in sorted(self.per_class.items())},
                "snr_db_vs_float": self.snr_db, "mean_abs_error_vs_float": self.mean_abs_error,
                "max_abs_error_vs_float": self.max_abs_error, "note": self.note}


@dataclass(frozen=True)
class AccuracyReport:
    pte: str
    dataset: str
    samples: int
    labelled: bool
    methods: tuple[MethodAccuracy, ...]
    judge: str | None  # the device method the gates read (host runtime, else the twin)
    outcome: str  # passed | failed | not-run
    verdict: str

    @property
    def exit_code(self) -> int:
        return {"passed": 0, "failed": 4}.get(self.outcome, 5)

    def error(self):
        """The exception the CLI raises for this outcome, or None."""
        if self.outcome == "failed":
            return VerificationFailure(self.verdict)
        if self.outcome == "not-run":
            return NotRun(self.verdict)
        return None

    def to_json(self) -> dict:
        return {"pte": self.pte, "dataset": self.dataset, "samples": self.samples,
                "labelled": self.labelled, "judge": self.judge, "outcome": self.outcome,
                "verdict": self.verdict, "methods": [m.to_json() for m in self.methods]}

    def render_text(self) -> str:
        lines = [f"verify {self.pte} --dataset {self.dataset}: {self.samples} sample(s)"
                 + ("" if self.labelled else " (no labels: errors against the float model)")]
        head = (f"  {'method':<22} {'samples':>7} {'top-1':>7} {'top-5':>7} {'=float':>7} "
                f"{'SNR dB':>7} {'max err':>8} {'ms/sample':>9}")
        lines.append(head)
        for m in self.methods:
            lines.append(f"  {m.shown:<22} {m.samples:>7} {_pct(m.top1):>7} {_pct(m.topk):>7} "
                         f"{_pct(m.agreement):>7} {_num(m.snr_db):>7} "
                         f"{_num(m.max_abs_error, 4):>8} "
                         f"{_ms(m.seconds_per_sample):>9}")
        for m in self.methods:
            if m.changed:
                listed = ", ".join(str(i) for i in m.changed[:MAX_LISTED])
                more = f" (+{len(m.changed) - MAX_LISTED})" if len(m.changed) > MAX_LISTED else ""
                lines.append(f"  {m.shown}: prediction differs from the float model's on "
                             f"sample(s) {listed}{more}")
            if m.note:
                lines.append(f"  {m.shown}: {m.note}")
        judged = next((m for m in self.methods if m.method == self.judge), None)
        missed = sorted(((label, right, total) for label, (right, total) in
                         (judged.per_class.items() if judged is not None else ())
                         if right < total), key=lambda c: c[1] / c[2])
        if missed:
            lines.append(f"  {judged.shown}, weakest classes (right/samples): " + ", ".join(
                f"{label} {right}/{total}" for label, right, total in missed[:3]))
        lines.append("  top-1/top-5 against the labels; =float: predictions equal to the float "
                     "model's; SNR and max err: output 0 against the float model (its units)")
        lines.append(f"  verdict: {self.verdict}")
        return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if value == float("inf"):
        return "exact"
    return f"{value:.{digits}f}"


def _as_float(program: TwinProgram, position: int, value: torch.Tensor) -> torch.Tensor:
    if value.dtype.is_floating_point:
        return value.float()
    scale, zero_point = output_quantization(program, position)
    if scale is None:
        return value.to(torch.float32)
    return (value.to(torch.int32) - zero_point).float() * scale


def _measure(method: str, outputs: list[torch.Tensor], reference: list[torch.Tensor],
             labels: torch.Tensor | None, seconds: float | None, note: str = "") -> MethodAccuracy:
    """Figures of output 0 of each sample (`outputs`) against the float model's (`reference`)
    and the labels."""
    n = len(outputs)
    if n == 0:
        return MethodAccuracy(method, 0, None, note=note)
    got = torch.stack([o.reshape(-1).float() for o in outputs])
    want = torch.stack([r.reshape(-1).float() for r in reference[:n]])
    noise = float(((got - want) ** 2).sum())
    signal = float((want ** 2).sum())
    snr = float("inf") if noise == 0 else (10 * torch.log10(torch.tensor(signal / noise)).item()
                                           if signal > 0 else None)
    error = (got - want).abs()
    figures = dict(snr_db=snr, mean_abs_error=float(error.mean()),
                   max_abs_error=float(error.max()))
    if labels is None:
        return MethodAccuracy(method, n, seconds, note=note, **figures)
    classes = got.shape[1]
    predicted, expected = got.argmax(1), want.argmax(1)
    truth = labels[:n]
    right = predicted == truth
    per_class: dict[int, tuple[int, int]] = {}
    for label, ok in zip(truth.tolist(), right.tolist()):
        r, t = per_class.get(label, (0, 0))
        per_class[label] = (r + int(ok), t + 1)
    topk = None
    if classes > 5:
        top5 = got.topk(5, dim=1).indices
        topk = 100.0 * float((top5 == truth[:, None]).any(1).float().mean())
    changed = tuple(int(i) for i in torch.nonzero(predicted != expected).flatten())
    return MethodAccuracy(method, n, seconds, 100.0 * float(right.float().mean()), topk,
                          100.0 * float((predicted == expected).float().mean()), changed,
                          per_class, note=note, **figures)


def evaluate(program: TwinProgram, dataset: str, labels: str | None = "labels",
             samples: int | None = None, methods=(TWIN, RUNTIME, QEMU), qemu_samples: int = 4,
             min_accuracy: float | None = None, max_accuracy_drop: float | None = None,
             executorch_src=None, cmsis_nn_src=None, platform=None, timeout_s: int = 600,
             npu_model: str = "auto") -> AccuracyReport:
    """The program's accuracy on `dataset` (orchestrator.sources.loader.load_dataset) by each of
    `methods` this machine has, beside the float model and the quantized reference; the gates
    as the module docstring says."""
    if samples is not None and samples < 1 or qemu_samples < 0:
        raise UserError(f"--samples must be at least 1 and --qemu-samples at least 0 (got "
                        f"{samples} and {qemu_samples})")
    float_program, float_module = program.reference("float.pt2")
    _, quantized_module = program.reference("quantized.pt2")
    data: Dataset = load_dataset(dataset, model_example_inputs(float_program), labels)
    chosen = data.samples[:samples] if samples is not None else data.samples
    truth = data.labels[:len(chosen)] if data.labels is not None else None
    if (min_accuracy is not None or max_accuracy_drop is not None) and truth is None:
        raise UserError("--min-accuracy and --max-accuracy-drop need labels: give --labels "
                        "(the array's name in the dataset, or a file)")
    with torch.no_grad(), numerics.single_threaded():
        started = time.perf_counter()
        float_outs = [as_tuple(float_module(*s))[0] for s in chosen]
        float_seconds = (time.perf_counter() - started) / len(chosen)
        started = time.perf_counter()
        quantized_outs = [as_tuple(quantized_module(*s))[0] for s in chosen]
        quantized_seconds = (time.perf_counter() - started) / len(chosen)
    results = [_measure(FLOAT, float_outs, float_outs, truth, float_seconds),
               _measure(QUANTIZED, quantized_outs, float_outs, truth, quantized_seconds)]
    results += _float_file(program, chosen, float_outs, truth)
    npu = program.npu_executor(npu_model)
    program_inputs = [device_inputs(program, s) for s in chosen]
    started = time.perf_counter()
    twin_runs = [program.run(i, npu=npu) for i in program_inputs]
    twin_seconds = (time.perf_counter() - started) / len(chosen)
    twin_raw = [run.outputs[0] for run in twin_runs]
    if TWIN in methods:
        results.append(_measure(TWIN, [_as_float(program, 0, o) for o in twin_raw], float_outs,
                                truth, twin_seconds))
    if RUNTIME in methods:
        # The host runs CMSIS-NN's C path: compared with the twin's computation of that path.
        c_path = (replace(program, isa_tier=HOST_TIER) if program.isa_tier in ("mve", "dsp")
                  else program)
        c_runs = twin_runs if c_path is program else [c_path.run(i, npu=npu)
                                                       for i in program_inputs]
        results.append(_runtime(program, program_inputs, c_runs, float_outs, truth, npu,
                                executorch_src, cmsis_nn_src, c_path is not program))
    if QEMU in methods and qemu_samples:
        results.append(_qemu(program, chosen[:qemu_samples], twin_raw, float_outs, truth,
                             platform, timeout_s, npu_model))
    return _judged(program, data, len(chosen), truth is not None, tuple(results), min_accuracy,
                   max_accuracy_drop)


def _float_file(program, chosen, float_outs, truth) -> list[MethodAccuracy]:
    """A program from a float `.tflite`: the file itself in the TFLite interpreter, so
    the figures are held against what the incumbent computes (the =float column then says
    whether the rebuilt float model, which every other row is compared with, agrees)."""
    try:
        started = time.perf_counter()
        found = tflm.float_file_outputs(program.require_manifest(), chosen)
    except tflm.TflmCannotRun as error:
        return [MethodAccuracy(TFLITE_FLOAT, 0, None, note=f"not run: {error}")]
    if found is None:
        return []
    path, outputs, hybrid = found
    seconds = (time.perf_counter() - started) / len(chosen)
    theirs = [torch.from_numpy(o) for o in outputs]
    worst = max(float((t.reshape(-1) - f.reshape(-1).float()).abs().max())
                for t, f in zip(theirs, float_outs))
    return [_measure(TFLITE_FLOAT, theirs, float_outs, truth, seconds, note=(
        f"{path.name} in the TFLite interpreter's reference kernels (ai-edge-litert "
        f"{tflm.litert_version()}, on the host); the float model rebuilt from it differs from "
        f"it by at most {worst:.3g} on output 0" + (
            " (a hybrid file: int8 weights, and the interpreter quantizes each activation at "
            "run time, which the float network does not)" if hybrid else "")))]


def _runtime(program, program_inputs, twin_runs, float_outs, truth, npu, executorch_src,
             cmsis_nn_src, c_path: bool) -> MethodAccuracy:
    try:
        runtime = HostRuntime(ensure_library(find_sources(executorch_src, cmsis_nn_src)))
    except RuntimeUnavailable as error:
        return MethodAccuracy(RUNTIME, 0, None, note=f"not run: {error}")
    handler = npu_handler(program, npu) if program.partitions else None
    outputs, differ, seconds = [], [], 0.0
    try:
        for index, (inputs, twin_run) in enumerate(zip(program_inputs, twin_runs)):
            run = runtime.run(program.pte_bytes, inputs, npu=handler)
            seconds += sum(run.seconds)
            outputs.append(_as_float(program, 0, run.outputs[0]))
            if any(not torch.equal(a.contiguous(), b.contiguous())
                   for a, b in zip(run.outputs, twin_run.outputs)):
                differ.append(index)
    except RuntimeUnavailable as error:
        return MethodAccuracy(RUNTIME, 0, None, note=f"not run: {error}")
    finally:
        runtime.close()
    path = " computing CMSIS-NN's C path (the host's; the core runs its own tier)" \
        if c_path else ""
    note = (f"every output byte-equal to the twin's{path}" if not differ else
            f"outputs differ from the twin's{path} on sample(s) "
            f"{', '.join(map(str, differ[:10]))}")
    # Named by the path it computed: on an MVE or DSP core's program the host's C path is not
    # the program's form (its figures can be far from the device's: QEMU and the twin judge).
    return replace(_measure(RUNTIME, outputs, float_outs, truth,
                            seconds / max(len(outputs), 1), note),
                   label=f"{RUNTIME} (C path)" if c_path else "")


def _qemu(program, chosen, twin_raw, float_outs, truth, platform_override, timeout_s,
          npu_model) -> MethodAccuracy:
    target = program.require_manifest().target
    label = qemu_label(str(target.get("cpu") or ""))
    try:
        platform = installed_platform(target, platform_override)
    except UserError as error:
        return MethodAccuracy(QEMU, 0, None, note=f"not run: {error}", label=label)
    reason = qemu_unavailable_reason(target, bool(program.partitions), platform)
    if reason is not None:
        return MethodAccuracy(QEMU, 0, None, note=f"not run: {reason}", label=label)
    try:
        result = qemu_on_checked_pte(program, platform, timeout_s, samples=len(chosen),
                                     npu_model=npu_model, inputs=tuple(chosen))
    except (NotRun, QemuUnavailable) as error:
        return MethodAccuracy(QEMU, 0, None, note=f"not run: {error}", label=label)
    label = qemu_label(result.core) if result.core else label
    if not result.passed:
        return MethodAccuracy(QEMU, len(chosen), None, note=(
            "FAILED: not byte-exact against the twin on its subset: " + "; ".join(
                result.errors or ["a BundleIO case did not match"])), label=label)
    outputs = [_as_float(program, 0, o) for o in twin_raw[:len(chosen)]]
    per = f", {result.instructions:,} instructions per inference" if result.instructions else ""
    measured = _measure(QEMU, outputs, float_outs, truth, None,
                        f"samples 0..{len(chosen) - 1} on {result.core}, BundleIO byte-exact "
                        f"against the twin{per}: its figures are the twin's on them")
    return replace(measured, label=label)


def _judged(program, data, samples, labelled, results, min_accuracy,
            max_accuracy_drop) -> AccuracyReport:
    by_name = {m.method: m for m in results}
    failed = [m for m in results if m.note.startswith("FAILED")
              or m.note.startswith("outputs differ")]
    # The device's figures: the host runtime's where the core runs the C path, else the twin's
    # for the core's own tier (the host runtime checked it on the C path, QEMU on the M55).
    order = (TWIN, RUNTIME) if program.isa_tier in ("mve", "dsp") else (RUNTIME, TWIN)
    judge = next((name for name in order if by_name.get(name) is not None
                  and by_name[name].samples), None)
    pte = str(program.pte_path)
    if failed:
        return AccuracyReport(pte, data.source, samples, labelled, results, judge, "failed",
                              "FAILED: " + "; ".join(f"{m.shown}: {m.note}" for m in failed))
    if judge is None:
        return AccuracyReport(pte, data.source, samples, labelled, results, None, "not-run",
                              "not run: no method computed the program's outputs")
    judged, float_top1 = by_name[judge], by_name[FLOAT].top1
    summary = (f"top-1 {judged.top1:.1f}% by {judge} (float model {float_top1:.1f}%, quantized "
               f"reference {by_name[QUANTIZED].top1:.1f}%)" if labelled else
               f"output 0 against the float model by {judge}: SNR {_num(judged.snr_db)} dB, "
               f"max abs error {_num(judged.max_abs_error, 4)}")
    missed = []
    if min_accuracy is not None and judged.top1 < min_accuracy:
        missed.append(f"--min-accuracy {min_accuracy:g}%: {judged.top1:.1f}%")
    if max_accuracy_drop is not None and float_top1 - judged.top1 > max_accuracy_drop:
        missed.append(f"--max-accuracy-drop {max_accuracy_drop:g} points: "
                      f"{float_top1 - judged.top1:.1f} points below the float model")
    if missed:
        return AccuracyReport(pte, data.source, samples, labelled, results, judge, "failed",
                              f"FAILED: {'; '.join(missed)}; {summary}")
    return AccuracyReport(pte, data.source, samples, labelled, results, judge, "passed",
                          f"PASSED: {summary}")
