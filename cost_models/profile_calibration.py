"""The CPU cost model against measured profiles: per op class and kernel, the instructions it
retires (QEMU) and the cycles it takes (a board or an FVP), fitted to `.etdp` profiles.

What a profile measures and what the model estimates are different quantities:
  - under QEMU (`verify --qemu --profile`) a kernel call's figure is instructions retired
    (-icount); never cycles: a Cortex-M55 retires an MVE instruction in one or two cycles, a
    load in one or more, so cycles are not instructions times a constant;
  - on a board or FVP with DWT (or a profile that says `cycles`) it is cycles, the unit of the
    model (cost_models/cpu.py).
A calibration holds one set of factors per unit: `instructions` (instructions retired per
modelled cycle) and `cycles` (measured cycles per modelled cycle). Each figure is
{value, source}, as in data/cpu_cost.yaml.

Why terms and not one factor on the model's cycles. A ratio (instructions = f x modelled
cycles) was the first calibration (format /1); on programs it was never fitted to it missed
linear (0.67), pooling (0.70), softmax (0.05) and portable (1.33): a small kernel call is
mostly a fixed cost per call that a ratio cannot express, a fully connected layer's
instructions follow its MACs and outputs while the model's cycles follow them with other
weights (DS-CNN's 768-MAC head: 1,849 model cycles, 1,156 instructions; the deep autoencoder's
81,920-MAC layer: 20,576 and 40,655), softmax retires ~560 instructions per element where the
model counts ~20 cycles, and a portable layout copy costs per element, not per byte (the model
counts bytes: a float copy came out 4x an int8 one). So each key has a small linear model

    instructions = sum over its class's TERMS of coefficient x the row's figure

with TERMS per class (CLASS_TERMS): a per-call term for every class, plus the work the kernel
repeats: the model's cycles for convolutions (the cycle model already scales them with the
right work: MACs over lanes, im2col taps), MACs and output elements for linear, elements for
pooling, softmax, elementwise and portable kernels. Each row's figures are the plan row's
(its macs, input and output shapes; `row_work`), so the plan computes the same estimate.

Keys, in lookup order: the kernel that runs (the CMSIS-NN function, e.g.
arm_convolve_1x1_s8_fast, or the portable kernel) when the fit saw it; else its op class; else
all classes (modelled cycles only, a ratio of sums). Kernels of one class differ (an int8
dim-order copy retires ~53 instructions per element, a cat ~0.5), so a class-wide model is
right only for the mix it was fitted on; it is the fallback for a kernel the fit never saw.

The fit (fit_factors), per unit, on the fit rows only:
  1. per class: non-negative least squares of measured on the class's terms, each row
     weighted by 1/its modelled cycles (variance proportional to size; with the one term
     model_cycles this is exactly the ratio of sums: large calls do not decide alone); when
     the class's rows have one work size, without the per-call term;
  2. per kernel: its own least squares when its fit rows span at least two work sizes (a
     factor of two apart), which is what pins a per-call and a per-work coefficient apart;
     else the class's per-call coefficient and the kernel's work coefficients scaled so its
     fit rows' total is exact (one size cannot tell fixed from proportional cost; the class
     says what a call costs, the kernel what its work costs);
  3. all classes: the ratio of sums of measured over modelled cycles.

A `cycles` calibration scales the plan's CPU cycles (the plan's cost source says which
calibration: "model:mve (calibrated: NAME)"); an `instructions` calibration adds an instruction
estimate beside the cycles and leaves them alone, except where the model's cycles are fewer
than the instructions the estimate counts for the work the kernel repeats (every term but the
per-call intercept, a least-squares term that a call far smaller than the fit's extrapolates):
an in-order Cortex-M core retires about one instruction per cycle at best in a kernel's loops
(the fit over every class gives 0.93 instructions per modelled cycle), so such a row has its
cycles raised to them ("model:mve (raised to instructions: NAME)"; the model's own stay in
model_cycles). DS-CNN's (24, 5) average pool: 3,428 modelled cycles; 8,656 instructions of
repeated work by the shipped file (10,029 with its per-call term), 9,875 on QEMU. Modelled
cycles are the plan's (plan.json rows: the CPU model at the plan's memory placement), before
any calibration.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from types import MappingProxyType

import numpy as np
import yaml

from cost_models.cost import Cost
from cost_models.cpu import npu_invocation_instructions
from cost_models.op_shapes import index_walk, walked_op
from kernels.safe_files import DataFileError, load_yaml

OP_CLASSES = ("conv", "depthwise", "linear", "pooling", "elementwise", "softmax", "portable",
              "conv_s16", "linear_s16")
UNITS = ("instructions", "cycles")
FORMAT = "orchestrate-cpu-calibration/2"
OLD_FORMATS = {"orchestrate-cpu-calibration/1": "one ratio per key"}
ALL_CLASSES = "all"

# What each term counts, per kernel call (the row's figures; summed over a saved aggregate).
TERMS = {
    "calls": "kernel calls",
    "model_cycles": "the CPU model's cycles of the row (before any cycles calibration)",
    "macs": "multiply-accumulates of the row",
    "outputs": "elements of the row's output",
    "elements": "elements the row moves: the larger of its first input's and its output's",
}
# The terms of each op class's model: a per-call cost and the work its kernels repeat.
CLASS_TERMS = {
    "conv": ("calls", "model_cycles"),
    "depthwise": ("calls", "model_cycles"),
    "linear": ("calls", "macs", "outputs"),
    "pooling": ("calls", "elements"),
    "softmax": ("calls", "elements"),
    "elementwise": ("calls", "elements"),
    "portable": ("calls", "elements"),
    # int16 activations (kernels/s16): their own classes, so the int8 classes' fit is not
    # moved by kernels that compute otherwise (im2col and products of int16, int64 sums); the
    # CPU model's cycles are the int8 kernels', so the work term is the MACs.
    "conv_s16": ("calls", "macs"),
    "linear_s16": ("calls", "macs", "outputs"),
}
ALL_TERMS = ("model_cycles",)

# The CMSIS-NN function a plan row names (kernels/catalogue.py) -> its op class, by prefix:
# the wrappers' specialisations (arm_convolve_1x1_s8_fast, arm_depthwise_conv_3x3_s8, ...)
# share their family's prefix. Any other CMSIS-NN row moves or rescales elements (add, mul,
# minimum/maximum, activations, quantize/dequantize, transpose, pad, copy): elementwise.
_KERNEL_CLASSES = (
    ("arm_convolve_wrapper_s16", "conv_s16"),
    ("arm_fully_connected_s16", "linear_s16"),
    ("arm_depthwise_conv", "depthwise"),
    ("arm_convolve", "conv"),
    ("arm_transpose_conv", "conv"),
    ("arm_fully_connected", "linear"),
    ("arm_batch_matmul", "linear"),
    ("arm_avgpool", "pooling"),
    ("arm_max_pool", "pooling"),
    ("arm_softmax", "softmax"),
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


class CalibrationError(ValueError):
    """A calibration file or fit that cannot be used; one line naming the file and the key."""


def op_class(placement: str, kind: str, kernel: str | None) -> str | None:
    """The op class of a plan row (its placement, row kind and kernel, as plan.json has them);
    None for NPU work, which no CPU calibration touches."""
    if placement == "npu" or kind == "npu-invocation":
        return None
    if placement == "portable":
        return "portable"
    for prefix, name in _KERNEL_CLASSES:
        if (kernel or "").startswith(prefix):
            return name
    return "elementwise"


@dataclass(frozen=True)
class Work:
    """A plan row's figures the terms count, per call (row_work)."""

    macs: int = 0
    outputs: int = 0
    elements: int = 0
    # The row's portable kernel walks its tensors by index (op_shapes.index_walk): a cost the
    # model adds by operand, which no kernel's or class's fit has seen (module docstring).
    walked: bool = False
    io_bytes: int = 0  # an NPU invocation's inputs and outputs (OpPlacement.io_bytes)


def row_work(macs, input_shapes, output_shape, op: str = "", io_bytes: int = 0) -> Work:
    """The figures of a plan row (an OpPlacement's or a plan.json op's macs, input_shapes,
    output_shape and op) that the calibration's terms count."""
    outputs = math.prod(output_shape) if output_shape else 0
    first = math.prod(input_shapes[0]) if input_shapes else 0
    walked = index_walk(op, input_shapes, output_shape)[0] > 0 if op else False
    return Work(int(macs or 0), int(outputs), int(max(first, outputs)), walked, int(io_bytes or 0))


@dataclass(frozen=True)
class MeasuredRow:
    """One CPU row of a profiled program: the model's cycles and the row's work beside one
    kernel call's figure (or a saved aggregate's sums: every term is a sum)."""

    program: str
    op_class: str
    kernel: str
    modelled_cycles: int
    measured: int
    unit: str  # instructions | cycles
    estimated: int | None = None  # the plan's instruction estimate, when it was calibrated
    calls: int = 1  # kernel calls summed in this row (1, or a saved aggregate's count)
    work: Work = Work()

    def figure(self, term: str) -> float:
        if term == "calls":
            return self.calls
        if term == "model_cycles":
            return self.modelled_cycles
        return getattr(self.work, term)


@dataclass(frozen=True)
class Figure:
    """One key's model: a coefficient per term (measured units per unit of the term)."""

    terms: Mapping[str, float]
    source: str

    def estimate(self, figure: Callable[[str], float]) -> float:
        return sum(coefficient * figure(term) for term, coefficient in self.terms.items())

    @property
    def value(self) -> float:
        """The coefficient of the modelled cycles (0 when the model has none)."""
        return self.terms.get("model_cycles", 0.0)


@dataclass(frozen=True)
class Factors:
    """One unit's models: by kernel, by class and for all rows."""

    unit: str
    kernels: Mapping[tuple[str, str], Figure]  # (op class, kernel) -> its model
    classes: Mapping[str, Figure]
    overall: Figure | None

    def lookup(self, op_class_: str, kernel: str) -> tuple[Figure, str] | None:
        """(model, what it is the model of): the kernel's, else its class's, else all rows'."""
        figure = self.kernels.get((op_class_, kernel))
        if figure is not None:
            return figure, kernel
        figure = self.classes.get(op_class_)
        if figure is not None:
            return figure, f"class {op_class_}"
        if self.overall is not None:
            return self.overall, "all classes"
        return None

    def estimate(self, row: MeasuredRow) -> float:
        found = self.lookup(row.op_class, row.kernel)
        if found is None:
            raise CalibrationError(f"no {self.unit} model for {row.kernel} ({row.op_class})")
        return found[0].estimate(row.figure)


@dataclass(frozen=True)
class ProfileRecord:
    """A profile a calibration was fitted to (or validated on): names, not paths."""

    program: str
    profile: str
    sha256: str
    unit: str
    clock: str
    calls: int


@dataclass(frozen=True)
class CpuCalibration:
    name: str  # the file name the plan's sources cite
    core: str
    factors: Mapping[str, Factors]  # unit -> factors
    fitted: tuple[ProfileRecord, ...]
    validated: tuple[ProfileRecord, ...] = ()
    validation: Mapping[str, Mapping[str, Mapping]] = field(
        default_factory=lambda: MappingProxyType({}))  # unit -> class -> figures

    def tag(self) -> str:
        return f"(calibrated: {self.name})"

    def floor_tag(self) -> str:
        return f"(raised to instructions: {self.name})"


def _programs(rows: Iterable[MeasuredRow]) -> list[str]:
    return list(dict.fromkeys(row.program for row in rows))


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares by trying every set of free variables (at most 3: 8 sets)."""
    best, best_residual = np.zeros(a.shape[1]), float(np.sum(b ** 2))
    for free in itertools.product((True, False), repeat=a.shape[1]):
        cols = [i for i in range(a.shape[1]) if free[i]]
        if not cols:
            continue
        x = np.zeros(a.shape[1])
        x[cols] = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        if (x < 0).any():
            continue
        residual = float(np.sum((a @ x - b) ** 2))
        if residual < best_residual - 1e-9 * max(best_residual, 1.0):
            best, best_residual = x, residual
    return best


def _least_squares(rows: Sequence[MeasuredRow], terms: Sequence[str]) -> dict[str, float]:
    """measured ~ sum of coefficient x figure, coefficients >= 0, each row weighted by
    1/its modelled cycles (with the one term model_cycles: the ratio of sums)."""
    scale = [1.0 / math.sqrt(max(row.modelled_cycles, 1)) for row in rows]
    a = np.array([[row.figure(t) * w for t in terms] for row, w in zip(rows, scale)])
    b = np.array([row.measured * w for row, w in zip(rows, scale)])
    return {t: float(c) for t, c in zip(terms, _nnls(a, b))}


def _spans_sizes(rows: Sequence[MeasuredRow], term: str) -> bool:
    """Whether the rows' work per call takes two sizes at least a factor of two apart."""
    sizes = [row.figure(term) / row.calls for row in rows if row.calls]
    return bool(sizes) and min(sizes) > 0 and max(sizes) >= 2 * min(sizes)


def _kernel_terms(rows: Sequence[MeasuredRow], terms: Sequence[str],
                  of_class: Mapping[str, float]) -> tuple[dict[str, float], str]:
    """A kernel's coefficients and how they were fitted (fit step 2)."""
    if _spans_sizes(rows, terms[-1]):
        return _least_squares(rows, terms), "least squares"
    per_call = of_class.get("calls", 0.0)
    work = sum(of_class[t] * sum(row.figure(t) for row in rows) for t in terms[1:])
    rest = sum(row.measured for row in rows) - per_call * sum(row.calls for row in rows)
    if work > 0 and rest > 0:
        return ({"calls": per_call, **{t: of_class[t] * rest / work for t in terms[1:]}},
                "the class's per-call term, its work terms scaled to the kernel's total")
    calls = sum(row.calls for row in rows)
    return ({"calls": sum(row.measured for row in rows) / calls, **{t: 0.0 for t in terms[1:]}},
            "mean per call (one work size, below the class's per-call cost)")


def _fitted(rows: Sequence[MeasuredRow], terms: Mapping[str, float], what: str, how: str,
            unit: str, clock: str) -> Figure:
    measured = sum(row.measured for row in rows)
    estimated = sum(sum(c * row.figure(t) for t, c in terms.items()) for row in rows)
    programs = _programs(rows)
    return Figure(MappingProxyType({t: round(c, 6) for t, c in terms.items()}),
                  f"calibrated: {how} over {sum(r.calls for r in rows)} call(s) of {what} in "
                  f"{len(programs)} profile(s) ({clock}): {', '.join(programs)}; "
                  f"{round(estimated):,} estimated / {measured:,} {unit} measured")


def fit_factors(rows: Sequence[MeasuredRow], unit: str, clock: str = "") -> Factors:
    """The models of one unit from the rows measured in it (the fit in the module docstring)."""
    if unit not in UNITS:
        raise CalibrationError(f"unit {unit!r} is not one of {', '.join(UNITS)}")
    rows = [r for r in rows if r.unit == unit and r.measured > 0]
    clock = clock or unit
    classes: dict[str, Figure] = {}
    kernels: dict[tuple[str, str], Figure] = {}
    for name in OP_CLASSES:
        of_class = [r for r in rows if r.op_class == name]
        if not of_class:
            continue
        terms = CLASS_TERMS[name]
        if _spans_sizes(of_class, terms[-1]):
            class_terms, how = _least_squares(of_class, terms), "non-negative least squares"
        else:  # one size: no per-call term can be told apart; proportional, as format /1 was
            class_terms = {"calls": 0.0, **_least_squares(of_class, terms[1:])}
            how = "non-negative least squares without a per-call term (one work size)"
            if not any(class_terms.values()):  # rows without the work: a cost per call
                class_terms = {"calls": sum(r.measured for r in of_class)
                               / sum(r.calls for r in of_class), **{t: 0.0 for t in terms[1:]}}
                how = "mean per call (rows without work figures)"
        classes[name] = _fitted(of_class, class_terms, f"class {name}", how, unit, clock)
        for kernel in sorted({r.kernel for r in of_class}):
            of_kernel = [r for r in of_class if r.kernel == kernel]
            coefficients, how = _kernel_terms(of_kernel, terms, class_terms)
            kernels[(name, kernel)] = _fitted(of_kernel, coefficients, kernel, how, unit, clock)
    overall = None
    modelled = sum(r.modelled_cycles for r in rows)
    if rows and modelled:
        overall = _fitted(rows, {"model_cycles": sum(r.measured for r in rows) / modelled},
                          "every class", "ratio of sums", unit, clock)
    return Factors(unit, MappingProxyType(kernels), MappingProxyType(classes), overall)


def fit(rows: Sequence[MeasuredRow], core: str, name: str,
        fitted: Sequence[ProfileRecord] = (), clocks: Mapping[str, str] | None = None
        ) -> CpuCalibration:
    """A calibration of `core` from measured rows: one set of factors per unit measured."""
    check_name(name)
    factors = {unit: fit_factors(rows, unit, (clocks or {}).get(unit, unit))
               for unit in UNITS if any(r.unit == unit for r in rows)}
    if not factors:
        raise CalibrationError("no measured CPU rows to fit: the profiles hold no kernel call "
                               "of a CPU row")
    return CpuCalibration(name, core, MappingProxyType(factors), tuple(fitted))


def check_name(name: str) -> None:
    """A calibration's name goes into every cost source it touches: a plain file name."""
    if not _NAME.match(name):
        raise CalibrationError(f"calibration name {name!r} must be a plain file name (letters, "
                               "digits, '.', '_', '-'; at most 80)")


@dataclass(frozen=True)
class ClassTotal:
    """One op class over a set of rows: the model's estimate beside the measured total."""

    op_class: str
    calls: int
    modelled_cycles: int
    estimated: float  # in the measured unit: the calibration's model of each row
    measured: int

    @property
    def ratio(self) -> float | None:
        return self.estimated / self.measured if self.measured else None


def class_totals(rows: Iterable[MeasuredRow], factors: Factors | None) -> tuple[ClassTotal, ...]:
    """Per op class (OP_CLASSES order): the rows' estimate (the factors' model of each row;
    without factors, the modelled cycles themselves) and measured totals."""
    sums: dict[str, list] = {}
    for row in rows:
        estimate = row.modelled_cycles if factors is None else factors.estimate(row)
        entry = sums.setdefault(row.op_class, [0, 0, 0.0, 0])
        entry[0] += row.calls
        entry[1] += row.modelled_cycles
        entry[2] += estimate
        entry[3] += row.measured
    return tuple(ClassTotal(name, *sums[name]) for name in OP_CLASSES if name in sums)


def validation_figures(rows: Sequence[MeasuredRow], calibration: CpuCalibration,
                       bound: float) -> dict[str, dict[str, dict]]:
    """unit -> class -> the validation rows' totals before (model cycles) and after the
    calibration, and whether the calibrated estimate is within `bound` (0.15: +-15%)."""
    found: dict[str, dict[str, dict]] = {}
    for unit, factors in calibration.factors.items():
        measured_rows = [r for r in rows if r.unit == unit]
        before = {t.op_class: t for t in class_totals(measured_rows, None)}
        for total in class_totals(measured_rows, factors):
            ratio = total.ratio or 0.0
            found.setdefault(unit, {})[total.op_class] = {
                "calls": total.calls, "model_cycles": total.modelled_cycles,
                "measured": total.measured, "estimated": round(total.estimated),
                "ratio_before": round(before[total.op_class].ratio or 0.0, 4),
                "ratio": round(ratio, 4), "within": abs(ratio - 1.0) <= bound}
    return found


def with_validation(calibration: CpuCalibration, rows: Sequence[MeasuredRow],
                    validated: Sequence[ProfileRecord], bound: float) -> CpuCalibration:
    return replace(calibration, validated=tuple(validated),
                   validation=MappingProxyType(validation_figures(rows, calibration, bound)))


def to_yaml(calibration: CpuCalibration, bound: float | None = None) -> str:
    """The calibration file: what `calibrate` writes and a platform YAML or
    `--calibration-costs` names."""
    def figure(f: Figure) -> dict:
        return {"terms": dict(f.terms), "source": f.source}

    def record(r: ProfileRecord) -> dict:
        return {"program": r.program, "profile": r.profile, "sha256": r.sha256, "unit": r.unit,
                "clock": r.clock, "calls": r.calls}

    document: dict = {"format": FORMAT, "core": calibration.core,
                      "method": "per key (kernel, else op class, else all classes): measured = "
                                "sum of coefficient x the row's figure per term, non-negative "
                                "least squares over the fit profiles' kernel calls "
                                "(cost_models/profile_calibration.py)",
                      "terms": dict(TERMS)}
    for unit, factors in calibration.factors.items():
        document[unit] = {
            "per": f"{unit} per unit of each term",
            "all": figure(factors.overall) if factors.overall else None,
            "classes": {name: figure(f) for name, f in factors.classes.items()},
            "kernels": [{"class": key[0], "kernel": key[1], **figure(f)}
                        for key, f in factors.kernels.items()]}
    document["fitted"] = [record(r) for r in calibration.fitted]
    if calibration.validated:
        document["validated"] = {
            "note": "these profiles were never used for fitting"
                    + (f"; within = |estimate / measured - 1| <= {bound:g}" if bound else ""),
            "profiles": [record(r) for r in calibration.validated],
            "classes": {unit: dict(figures) for unit, figures in calibration.validation.items()}}
    header = ("# orchestrate CPU calibration (`orchestrate calibrate`; cost_models/"
              "profile_calibration.py).\n# instructions: instructions retired per unit of each "
              "term (QEMU -icount profiles): the plan's instruction estimate.\n# cycles: "
              "measured cycles per unit of each term (board/FVP profiles): replaces the plan's "
              "CPU cycles.\n# Name it in a platform YAML (cpu: calibration_costs: FILE) or with "
              "--calibration-costs FILE.\n")
    return header + yaml.safe_dump(document, sort_keys=False, width=100, allow_unicode=True)


def _figure(node, where: str, allowed: Sequence[str]) -> Figure:
    if not isinstance(node, dict) or not isinstance(node.get("terms"), dict) or \
            not str(node.get("source", "")).strip():
        raise CalibrationError(f"{where} must be {{terms: {{TERM: coefficient}}, source: ...}} "
                               "with a source")
    terms = {}
    for term, value in node["terms"].items():
        if term not in allowed:
            raise CalibrationError(f"{where}.terms.{term} is not one of {', '.join(allowed)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value < 0:
            raise CalibrationError(f"{where}.terms.{term}: must be a number >= 0, got {value!r}")
        terms[term] = float(value)
    if not any(terms.values()):
        raise CalibrationError(f"{where}: every coefficient is 0")
    return Figure(MappingProxyType(terms), str(node["source"]))


def _record(node, where: str) -> ProfileRecord:
    if not isinstance(node, dict):
        raise CalibrationError(f"{where} must be a mapping")
    try:
        return ProfileRecord(str(node["program"]), str(node["profile"]), str(node["sha256"]),
                             str(node["unit"]), str(node["clock"]), int(node["calls"]))
    except (KeyError, TypeError, ValueError) as error:
        raise CalibrationError(f"{where}: {error}") from None


def parse(document, name: str) -> CpuCalibration:
    """A calibration from its parsed YAML; CalibrationError names the key that is wrong."""
    from cost_models.cpu import load_cpu_cost_data  # lazy: heavy (torch)

    check_name(name)
    where = name
    if not isinstance(document, dict):
        raise CalibrationError(f"{where}: expected a mapping of calibration keys")
    if document.get("format") in OLD_FORMATS:
        raise CalibrationError(f"{where}: format {document['format']!r} "
                               f"({OLD_FORMATS[document['format']]}) is no longer read; re-run "
                               f"`orchestrate calibrate` on its profiles to write {FORMAT!r}")
    if document.get("format") != FORMAT:
        raise CalibrationError(f"{where}: format must be {FORMAT!r}, got "
                               f"{document.get('format')!r} (write it with `orchestrate "
                               "calibrate`)")
    core = document.get("core")
    cores = load_cpu_cost_data().cores
    if core not in cores:
        raise CalibrationError(f"{where}: core {core!r} is not one of {', '.join(cores)}")
    factors = {}
    for unit in UNITS:
        if document.get(unit) is None:
            continue
        section = document[unit]
        if not isinstance(section, dict):
            raise CalibrationError(f"{where}: {unit} must be a mapping")
        classes = section.get("classes") or {}
        if not isinstance(classes, dict):
            raise CalibrationError(f"{where}: {unit}.classes must be a mapping")
        unknown = [c for c in classes if c not in OP_CLASSES]
        if unknown:
            raise CalibrationError(f"{where}: {unit}.classes.{unknown[0]} is not an op class "
                                   f"({', '.join(OP_CLASSES)})")
        kernels = {}
        for index, entry in enumerate(section.get("kernels") or []):
            at = f"{where}: {unit}.kernels[{index}]"
            if not isinstance(entry, dict) or entry.get("class") not in OP_CLASSES or \
                    not isinstance(entry.get("kernel"), str):
                raise CalibrationError(f"{at} needs class (one of {', '.join(OP_CLASSES)}) and "
                                       "kernel")
            kernels[(entry["class"], entry["kernel"])] = _figure(
                entry, at, CLASS_TERMS[entry["class"]])
        overall = section.get("all")
        factors[unit] = Factors(
            unit, MappingProxyType(kernels),
            MappingProxyType({c: _figure(f, f"{where}: {unit}.classes.{c}", CLASS_TERMS[c])
                              for c, f in classes.items()}),
            _figure(overall, f"{where}: {unit}.all", ALL_TERMS) if overall is not None else None)
    if not factors:
        raise CalibrationError(f"{where}: no instructions or cycles section")
    fitted = tuple(_record(r, f"{where}: fitted[{i}]")
                   for i, r in enumerate(document.get("fitted") or []))
    validated_section = document.get("validated") or {}
    validated = tuple(_record(r, f"{where}: validated.profiles[{i}]")
                      for i, r in enumerate(validated_section.get("profiles") or []))
    validation = validated_section.get("classes") or {}
    return CpuCalibration(name, str(core), MappingProxyType(factors), fitted, validated,
                          MappingProxyType(validation))


SHIPPED = ("cortex-m55-qemu.yaml", "cortex-m4-qemu.yaml")


def shipped_for_core(cpu: str) -> str | None:
    """The shipped QEMU calibration of core `cpu` ("cortex-m4-qemu.yaml"), or None."""
    name = f"{cpu}-qemu.yaml"
    return name if name in SHIPPED else None


def shipped_path(name: str) -> Path | None:
    """The shipped calibration called `name` (with or without .yaml), or None."""
    stem = name if name.endswith(".yaml") else f"{name}.yaml"
    if stem not in SHIPPED:
        return None
    return Path(str(resources.files("cost_models.data").joinpath(stem)))


def load_calibration(path_or_name: str | Path, shipped_only: bool = False) -> CpuCalibration:
    """A calibration file (read as data: safe YAML, bounded), or a shipped one by name
    (`shipped_only`: only a shipped one, for a name a platform YAML gives)."""
    text = str(path_or_name)
    path = Path(text).expanduser()
    if shipped_only or not path.is_file():
        path = shipped_path(text) or path
    if not path.is_file() or (shipped_only and shipped_path(text) is None):
        raise CalibrationError(f"calibration '{text}' not found; give a file written by "
                               f"`orchestrate calibrate` or a shipped one ({', '.join(SHIPPED)})")
    try:
        document = load_yaml(path)
    except DataFileError as error:
        raise CalibrationError(f"calibration file {error}") from None
    return parse(document, path.name)


def calibrated_source(source: str, calibration: CpuCalibration, floor: bool = False) -> str:
    """A cost source with the calibration named on its model part (the first): it scaled the
    cycles, or (floor) raised them to its instruction estimate."""
    first, _, rest = source.partition("+")
    tag = calibration.floor_tag() if floor else calibration.tag()
    return f"{first} {tag}" + (f"+{rest}" if rest else "")


_CALIBRATION_TAG = re.compile(r" \((calibrated|raised to instructions): [^)]*\)")


def model_cost(cost):
    """The cost model's own figures of a cost a calibration may have changed: its cycles
    (model_cycles where a calibration replaced them), its source without the calibration's
    name, no instruction estimate."""
    if cost.instructions is None and cost.model_cycles is None \
            and not _CALIBRATION_TAG.search(cost.source):
        return cost
    cycles = cost.model_cycles if cost.model_cycles is not None else cost.cycles
    seconds = cost.seconds * cycles / cost.cycles if cost.cycles else 0.0
    return type(cost)(cycles, seconds, _CALIBRATION_TAG.sub("", cost.source))


def calibrate_cost(cost, placement: str, kind: str, kernel: str | None,
                   calibration: CpuCalibration, cpu_hz: int, work: Work = Work()):
    """A CPU row's Cost under `calibration`: its cycles the `cycles` model of its kernel (else
    class, else all classes), its instruction estimate the `instructions` model's, and without
    a cycles model its cycles at least that estimate (module docstring); NPU rows and rows
    without a cost as they are. A cost another calibration changed is calibrated from the
    model's own figures (model_cost). `work`: the row's figures (row_work) the terms count."""
    if cost is not None and kind == "npu-invocation" and "instructions" in calibration.factors:
        # The CPU's side of the call: the driver and the IO copies, as measured on QEMU.
        return replace(cost, instructions=npu_invocation_instructions(work.io_bytes,
                                                                      calibration.core),
                       instructions_source="model:transition (cpu_cost.yaml "
                                           "npu_invocation_instructions, measured on QEMU)")
    row_class = op_class(placement, kind, kernel)
    if cost is None or row_class is None:
        return cost
    cost = model_cost(cost)
    row = MeasuredRow("", row_class, kernel or "", cost.cycles, 0, "", work=work)
    scaled = cost
    cycles = calibration.factors.get("cycles")
    found = _lookup(cycles, row, work.walked)
    if found is not None:
        scaled = Cost.from_cycles(found[0].estimate(row.figure), cpu_hz,
                                  calibrated_source(cost.source, calibration))
        scaled = replace(scaled, model_cycles=cost.cycles)
    instructions = calibration.factors.get("instructions")
    found = _lookup(instructions, row, work.walked)
    if found is not None:
        estimate = int(round(found[0].estimate(row.figure)))
        # The floor counts the work the kernel repeats, not the fit's per-call intercept: that
        # is a least-squares term, which a call far smaller than the fit's extrapolates
        # (depthwise: 21,419 instructions per call, for a 4-MAC call too).
        repeated = estimate - found[0].terms.get("calls", 0.0) * row.calls
        if scaled is cost and repeated > cost.cycles:
            scaled = replace(Cost.from_cycles(repeated, cpu_hz,
                                              calibrated_source(cost.source, calibration, True)),
                             model_cycles=cost.cycles)
        scaled = replace(scaled, instructions=estimate,
                         instructions_source=f"calibrated: {calibration.name} ({found[1]})")
    return scaled


def _lookup(factors: Factors | None, row: MeasuredRow, walked: bool):
    """The model a row is calibrated by (Factors.lookup). A row whose kernel walks its tensors
    by index takes the all-classes model, the one fitted to the model's cycles alone: a
    kernel's or class's fit may rest on other terms (the portable class's on calls and
    elements), which would not see the walk's cost per operand."""
    if factors is None:
        return None
    if walked and factors.overall is not None and "model_cycles" in factors.overall.terms:
        return factors.overall, "all classes, for an index-walking kernel"
    return factors.lookup(row.op_class, row.kernel)


def check_core(calibration: CpuCalibration, cpu: str) -> None:
    if calibration.core != cpu:
        raise CalibrationError(f"calibration {calibration.name} is for {calibration.core}; this "
                               f"plan's CPU is {cpu}: calibrate that core (`orchestrate "
                               f"calibrate ... --cpu {cpu}`) or drop the calibration")


def calibrate_plan_json(plan: Mapping, calibration: CpuCalibration) -> dict:
    """plan.json (of a plan made without a calibration) with its CPU rows' costs calibrated,
    as the plan would have made them with `calibration`."""


    platform = plan["platform"]
    check_core(calibration, platform["cpu"])
    calibrated = copy.deepcopy(dict(plan))
    for op in calibrated["ops"]:
        if op.get("cost") is None:
            continue
        cost = calibrate_cost(Cost.from_json(op["cost"]), op["placement"], op["kind"],
                              op.get("kernel"), calibration, int(platform["cpu_hz"]),
                              row_work(op.get("macs"), op.get("input_shapes"),
                                       op.get("output_shape"),
                                       walked_op(op.get("op", ""), op.get("kernel")),
                                       op.get("io_bytes", 0)))
        op["cost"] = cost.to_json()
    return calibrated
