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

Why a factor on the model's cycles (and not a separate instruction model). The cycle model
already scales each kernel with the work its inner loop repeats (MACs over lanes, outputs,
im2col taps, elements of a kind). What the instruction count adds is how many instructions the
kernel retires per cycle of that work: a property of its inner loop (MVE beats, loads, the
scalar bookkeeping around them), nearly constant for one kernel across shapes. A separate
per-class instruction model would restate the cycle model's terms (per MAC, per output, per
tap, per element) with its own coefficients: four or five per class, more than the profiles pin
down for the small classes (softmax is a handful of calls). So the instruction term is

    instructions = the row's modelled cycles x instructions_per_cycle[key]

where key is, in this order, the kernel that runs (the CMSIS-NN function, e.g.
arm_convolve_1x1_s8_fast, or the portable kernel), when the fit saw it; else the op class
(OP_CLASSES); else all classes. Kernels of one class differ (a 3x3 convolution retires 0.93
instructions per modelled cycle, a 1x1 one 0.71, in DS-CNN, MobileNet and ResNet-8 under QEMU),
and an elementwise add and a quantize differ by 30x, so a class-wide factor would be right only
for the mix of kernels it was fitted on. The model's own figures are per kind (element_cycles
per op kind in cpu_cost.yaml), so a factor per kernel is the same grain.

The fit is a ratio of sums per key: f = sum(measured) / sum(modelled cycles) over the fit rows
of the key. It is the weighted least-squares solution of measured ~ f x modelled with each
call's variance proportional to its size, it makes the fitted programs' totals per key exact
(the figure the acceptance judges is a total per class), and it cannot go negative; an
unweighted least squares would be decided by the largest call of each key.

A `cycles` calibration scales the plan's CPU cycles (the plan's cost source says which
calibration: "model:mve (calibrated: NAME)"); an `instructions` calibration adds an instruction
estimate beside the cycles and leaves them alone. Modelled cycles are the plan's (plan.json
rows: the CPU model at the plan's memory placement), before any calibration.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from types import MappingProxyType

import yaml

OP_CLASSES = ("conv", "depthwise", "linear", "pooling", "elementwise", "softmax", "portable")
UNITS = ("instructions", "cycles")
FORMAT = "orchestrate-cpu-calibration/1"
ALL_CLASSES = "all"

# The CMSIS-NN function a plan row names (kernels/catalogue.py) -> its op class, by prefix:
# the wrappers' specialisations (arm_convolve_1x1_s8_fast, arm_depthwise_conv_3x3_s8, ...)
# share their family's prefix. Any other CMSIS-NN row moves or rescales elements (add, mul,
# minimum/maximum, activations, quantize/dequantize, transpose, pad, copy): elementwise.
_KERNEL_CLASSES = (
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
class MeasuredRow:
    """One CPU row of a profiled program: the model's cycles beside one kernel call's figure."""

    program: str
    op_class: str
    kernel: str
    modelled_cycles: int
    measured: int
    unit: str  # instructions | cycles
    estimated: int | None = None  # the plan's instruction estimate, when it was calibrated
    calls: int = 1  # kernel calls summed in this row (1, or a saved aggregate's count)


@dataclass(frozen=True)
class Figure:
    value: float
    source: str


@dataclass(frozen=True)
class Factors:
    """One unit's factors: measured per modelled cycle, by kernel, by class and for all rows."""

    unit: str
    kernels: Mapping[tuple[str, str], Figure]  # (op class, kernel) -> figure
    classes: Mapping[str, Figure]
    overall: Figure | None

    def lookup(self, op_class_: str, kernel: str) -> tuple[float, str] | None:
        """(factor, what it is the factor of): the kernel's, else its class's, else all rows'."""
        figure = self.kernels.get((op_class_, kernel))
        if figure is not None:
            return figure.value, kernel
        figure = self.classes.get(op_class_)
        if figure is not None:
            return figure.value, f"class {op_class_}"
        if self.overall is not None:
            return self.overall.value, "all classes"
        return None


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


def _sum_rows(rows: Iterable[MeasuredRow]) -> tuple[int, int, int, list[str]]:
    calls = modelled = measured = 0
    programs: list[str] = []
    for row in rows:
        calls += row.calls
        modelled += row.modelled_cycles
        measured += row.measured
        if row.program not in programs:
            programs.append(row.program)
    return calls, modelled, measured, programs


def _ratio_figure(rows: Sequence[MeasuredRow], unit: str, what: str, clock: str) -> Figure | None:
    calls, modelled, measured, programs = _sum_rows(rows)
    if not modelled or not measured:
        return None
    return Figure(round(measured / modelled, 4),
                  f"calibrated: ratio of sums over {calls} call(s) of {what} in "
                  f"{len(programs)} profile(s) ({clock}): {', '.join(programs)}; "
                  f"{measured:,} {unit} / {modelled:,} model cycles")


def fit_factors(rows: Sequence[MeasuredRow], unit: str, clock: str = "") -> Factors:
    """The factors of one unit from the rows measured in it (ratio of sums per key)."""
    if unit not in UNITS:
        raise CalibrationError(f"unit {unit!r} is not one of {', '.join(UNITS)}")
    rows = [r for r in rows if r.unit == unit]
    clock = clock or unit
    by_kernel: dict[tuple[str, str], list[MeasuredRow]] = {}
    by_class: dict[str, list[MeasuredRow]] = {}
    for row in rows:
        by_kernel.setdefault((row.op_class, row.kernel), []).append(row)
        by_class.setdefault(row.op_class, []).append(row)
    kernels = {key: figure for key, group in sorted(by_kernel.items())
               if (figure := _ratio_figure(group, unit, key[1], clock)) is not None}
    classes = {name: figure for name in OP_CLASSES if name in by_class
               and (figure := _ratio_figure(by_class[name], unit, f"class {name}", clock))
               is not None}
    return Factors(unit, MappingProxyType(kernels), MappingProxyType(classes),
                   _ratio_figure(rows, unit, "every class", clock))


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
    estimated: float  # in the measured unit: modelled cycles x the calibration's factors
    measured: int

    @property
    def ratio(self) -> float | None:
        return self.estimated / self.measured if self.measured else None


def class_totals(rows: Iterable[MeasuredRow], factors: Factors | None) -> tuple[ClassTotal, ...]:
    """Per op class (OP_CLASSES order): the rows' estimate (their modelled cycles times the
    factors; without factors, the modelled cycles themselves) and measured totals."""
    sums: dict[str, list] = {}
    for row in rows:
        factor = 1.0
        if factors is not None:
            found = factors.lookup(row.op_class, row.kernel)
            if found is None:
                raise CalibrationError(f"no {factors.unit} factor for {row.kernel} "
                                       f"({row.op_class})")
            factor = found[0]
        entry = sums.setdefault(row.op_class, [0, 0, 0.0, 0])
        entry[0] += row.calls
        entry[1] += row.modelled_cycles
        entry[2] += row.modelled_cycles * factor
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
        return {"value": f.value, "source": f.source}

    def record(r: ProfileRecord) -> dict:
        return {"program": r.program, "profile": r.profile, "sha256": r.sha256, "unit": r.unit,
                "clock": r.clock, "calls": r.calls}

    document: dict = {"format": FORMAT, "core": calibration.core,
                      "method": "ratio of sums per key (kernel, else op class, else all classes): "
                                "measured / modelled cycles over the fit profiles' kernel calls "
                                "(cost_models/profile_calibration.py)"}
    for unit, factors in calibration.factors.items():
        document[unit] = {
            "per": f"{unit} per modelled cycle",
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
              "profile_calibration.py).\n# instructions: instructions retired per modelled "
              "cycle (QEMU -icount profiles): the plan's instruction estimate.\n# cycles: "
              "measured cycles per modelled cycle (board/FVP profiles): scales the plan's CPU "
              "cycles.\n# Name it in a platform YAML (cpu: calibration_costs: FILE) or with "
              "--calibration-costs FILE.\n")
    return header + yaml.safe_dump(document, sort_keys=False, width=100, allow_unicode=True)


def _figure(node, where: str) -> Figure:
    if not isinstance(node, dict) or "value" not in node or not str(node.get("source", "")).strip():
        raise CalibrationError(f"{where} must be {{value: ..., source: ...}} with a source")
    value = node["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= 0:
        raise CalibrationError(f"{where}: value must be a positive number, got {value!r}")
    return Figure(float(value), str(node["source"]))


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
    from cost_models.cpu import load_cpu_cost_data

    check_name(name)
    where = name
    if not isinstance(document, dict):
        raise CalibrationError(f"{where}: expected a mapping of calibration keys")
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
            kernels[(entry["class"], entry["kernel"])] = _figure(entry, at)
        overall = section.get("all")
        factors[unit] = Factors(
            unit, MappingProxyType(kernels),
            MappingProxyType({c: _figure(f, f"{where}: {unit}.classes.{c}")
                              for c, f in classes.items()}),
            _figure(overall, f"{where}: {unit}.all") if overall is not None else None)
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


SHIPPED = ("cortex-m55-qemu.yaml",)


def shipped_path(name: str) -> Path | None:
    """The shipped calibration called `name` (with or without .yaml), or None."""
    stem = name if name.endswith(".yaml") else f"{name}.yaml"
    if stem not in SHIPPED:
        return None
    return Path(str(resources.files("cost_models.data").joinpath(stem)))


def load_calibration(path_or_name: str | Path, shipped_only: bool = False) -> CpuCalibration:
    """A calibration file (read as data: safe YAML, bounded), or a shipped one by name
    (`shipped_only`: only a shipped one, for a name a platform YAML gives)."""
    from kernels.safe_files import DataFileError, load_yaml

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


def calibrated_source(source: str, calibration: CpuCalibration) -> str:
    """A cost source with the calibration named on its model part (the first)."""
    first, _, rest = source.partition("+")
    return f"{first} {calibration.tag()}" + (f"+{rest}" if rest else "")


def calibrate_cost(cost, placement: str, kind: str, kernel: str | None,
                   calibration: CpuCalibration, cpu_hz: int):
    """A CPU row's Cost under `calibration`: its cycles scaled by the `cycles` factor of its
    kernel (else class, else all classes), its instruction estimate from the `instructions`
    factor; NPU rows and rows without a cost as they are."""
    from cost_models.cost import Cost

    row_class = op_class(placement, kind, kernel)
    if cost is None or row_class is None:
        return cost
    if "(calibrated:" in cost.source or cost.instructions is not None:
        raise CalibrationError(f"a cost is already calibrated ({cost.source}): calibrate the "
                               "model's figures once")
    kernel = kernel or ""
    model_cycles = cost.cycles
    scaled = cost
    cycles = calibration.factors.get("cycles")
    found = cycles.lookup(row_class, kernel) if cycles is not None else None
    if found is not None:
        scaled = Cost.from_cycles(model_cycles * found[0], cpu_hz,
                                  calibrated_source(cost.source, calibration))
        scaled = replace(scaled, model_cycles=model_cycles)
    instructions = calibration.factors.get("instructions")
    found = instructions.lookup(row_class, kernel) if instructions is not None else None
    if found is not None:
        scaled = replace(scaled, instructions=int(round(model_cycles * found[0])),
                         instructions_source=f"calibrated: {calibration.name} ({found[1]})")
    return scaled


def check_core(calibration: CpuCalibration, cpu: str) -> None:
    if calibration.core != cpu:
        raise CalibrationError(f"calibration {calibration.name} is for {calibration.core}; this "
                               f"plan's CPU is {cpu}: calibrate that core (`orchestrate "
                               f"calibrate ... --cpu {cpu}`) or drop the calibration")


def calibrate_plan_json(plan: Mapping, calibration: CpuCalibration) -> dict:
    """plan.json (of a plan made without a calibration) with its CPU rows' costs calibrated,
    as the plan would have made them with `calibration`."""
    import copy

    from cost_models.cost import Cost

    platform = plan["platform"]
    check_core(calibration, platform["cpu"])
    calibrated = copy.deepcopy(dict(plan))
    for op in calibrated["ops"]:
        if op.get("cost") is None:
            continue
        cost = calibrate_cost(Cost.from_json(op["cost"]), op["placement"], op["kind"],
                              op.get("kernel"), calibration, int(platform["cpu_hz"]))
        op["cost"] = cost.to_json()
    return calibrated
