"""`calibrate`: the CPU cost model's per-op-class instruction models fitted to measured profiles.

Each profile (`.etdp`) is paired with the program it profiled: PROGRAM.pte beside it with the
same stem, or given as PROGRAM.pte=PROFILE.etdp. orchestrator.api.measure reads both (the
program's artifacts folder checked by its manifest, the profile refused when it names another
program's SHA-256, or when its instructions and kernels are not this program's), and every
kernel call of a CPU row becomes one cost_models.profile_calibration.MeasuredRow: the plan's
modelled cycles and work beside the call's measured figure. The fit (a per-call term and the
work each kernel repeats, per kernel, op class and overall; cost_models/profile_calibration.py
says why) uses only the fit profiles; the
validation profiles (`--validate`) are never fitted to, and the calibration file records their
per-class figures before and after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from cost_models.profile_calibration import (
    OP_CLASSES,
    UNITS,
    CalibrationError,
    CpuCalibration,
    MeasuredRow,
    ProfileRecord,
    Work,
    class_totals,
    fit,
    op_class,
    row_work,
    with_validation,
)
from orchestrator.artifacts.profile import OPERATOR_CALL
from orchestrator.errors import UserError

if TYPE_CHECKING:  # the value it reads (orchestrator.api.measure makes it)
    from orchestrator.reports.measured import MeasuredPlan

DEFAULT_BOUND = 0.15  # the issue's +-15% per op class


@dataclass(frozen=True)
class ProfiledProgram:
    """One program and its profile, read and checked, as calibration rows."""

    record: ProfileRecord
    rows: tuple[MeasuredRow, ...]


def pair(argument: str) -> tuple[Path, Path]:
    """(program, profile) of `X.etdp` (X.pte beside it) or `PROGRAM.pte=PROFILE.etdp`."""
    if "=" in argument:
        program, _, profile = argument.partition("=")
        if not program.endswith(".pte") or not profile:
            raise UserError(f"'{argument}': give PROGRAM.pte=PROFILE.etdp, or PROFILE.etdp with "
                            "its PROFILE.pte beside it")
        return Path(program), Path(profile)
    profile = Path(argument)
    return profile.with_suffix(".pte"), profile


def checked_pair(argument: str) -> tuple[Path, Path]:
    """pair(argument), refused in one line when the profile or its program is missing."""
    program, profile = pair(argument)
    if not profile.is_file():
        raise UserError(f"profile '{profile}' not found; give an .etdp written by `orchestrate "
                        "verify PROGRAM.pte --qemu --profile` or by ETDumpGen on a device")
    if not program.is_file():
        raise UserError(f"program '{program}' of profile '{profile}' not found; give "
                        "PROGRAM.pte=PROFILE.etdp when the program is not beside its profile "
                        "with the same stem")
    return program, profile


def measured_rows(measured: MeasuredPlan, program: str) -> tuple[MeasuredRow, ...]:
    """measured.cpu_rows(program), each with the work of its plan rows (row_work: the figures
    the calibration's terms count), summed when one call runs several rows."""
    rows = measured.cpu_rows(program)
    calls = [call for call in measured.calls if _is_cpu_call(measured, call)]
    if len(calls) != len(rows):  # the same selection as cpu_rows: a change there shows here
        raise CalibrationError(f"{program}: {len(rows)} measured CPU rows but {len(calls)} "
                               "kernel calls with work")
    found = []
    for row, call in zip(rows, calls):
        works = [row_work(op.get("macs"), op.get("input_shapes"), op.get("output_shape"))
                 for op in (measured.ops[index] for index in call.rows)]
        found.append(replace(row, work=Work(sum(w.macs for w in works),
                                            sum(w.outputs for w in works),
                                            sum(w.elements for w in works))))
    return tuple(found)


def _is_cpu_call(measured: MeasuredPlan, call) -> bool:
    """The calls MeasuredPlan.cpu_rows makes a row of: a kernel call of CPU rows with costs."""
    if call.kind != OPERATOR_CALL or not call.rows:
        return False
    first = measured.ops[call.rows[0]]
    return op_class(first["placement"], first["kind"], first.get("kernel")) is not None and \
        all(measured.ops[row].get("cost") is not None for row in call.rows)


def profiled(measured: MeasuredPlan, program: Path, profile: Path, cpu: str) -> ProfiledProgram:
    """The CPU rows of one program beside its profile (orchestrator.api.measure checked that
    the profile is of it); UserError (one line) when the program is of another core or the
    profile counts ticks of no named clock."""
    unit = measured.profile.clock.unit
    if unit not in UNITS:
        raise UserError(f"profile '{profile}' does not say what it counts "
                        f"({measured.profile.clock.text}); calibrate needs instructions (verify "
                        "--qemu --profile) or cycles (a device profile that names its clock)")
    target_cpu = measured.plan["platform"]["cpu"]
    if target_cpu != cpu:
        raise UserError(f"program '{program}' was compiled for {target_cpu}, not --cpu {cpu}; "
                        "calibrate one core at a time")
    rows = measured_rows(measured, program.stem)
    record = ProfileRecord(program.name, profile.name, measured.program_sha256, unit,
                           measured.profile.clock.text, len(rows))
    return ProfiledProgram(record, rows)


@dataclass(frozen=True)
class Calibrated:
    """What `calibrate` made: the calibration and the rows it was fitted and validated on."""

    calibration: CpuCalibration
    fitted: tuple[ProfiledProgram, ...]
    validated: tuple[ProfiledProgram, ...]
    bound: float

    @property
    def fit_rows(self) -> tuple[MeasuredRow, ...]:
        return tuple(row for p in self.fitted for row in p.rows)

    @property
    def validation_rows(self) -> tuple[MeasuredRow, ...]:
        return tuple(row for p in self.validated for row in p.rows)

    def to_text(self) -> str:
        return render_text(self)


def calibrate(fitted: Sequence[ProfiledProgram], validated: Sequence[ProfiledProgram],
              cpu: str, name: str, bound: float = DEFAULT_BOUND) -> Calibrated:
    """Fit `cpu`'s factors to the `fitted` programs' rows; `validated`: programs only checked
    against the fit. UserError (one line) on bad input."""
    if not fitted:
        raise UserError("calibrate needs at least one profile to fit (PROFILE.etdp or "
                        "PROGRAM.pte=PROFILE.etdp)")
    fitted, validated = tuple(fitted), tuple(validated)
    _refuse_duplicates(fitted, validated)
    clocks = {p.record.unit: p.record.clock for p in (*fitted, *validated)}
    try:
        calibration = fit([row for p in fitted for row in p.rows], cpu, name,
                          [p.record for p in fitted], clocks)
        if validated:
            calibration = with_validation(calibration, [r for p in validated for r in p.rows],
                                          [p.record for p in validated], bound)
    except CalibrationError as error:
        raise UserError(str(error)) from None
    return Calibrated(calibration, fitted, validated, bound)


def _refuse_duplicates(fitted, validated) -> None:
    seen: dict[str, str] = {}
    for where, programs in (("fit", fitted), ("validation", validated)):
        for program in programs:
            key = program.record.sha256
            if key in seen:
                raise UserError(f"program {program.record.program} is given twice (in the "
                                f"{seen[key]} set and the {where} set); a validation profile "
                                "must never be fitted to")
            seen[key] = where


def _table(rows: Sequence[MeasuredRow], calibration: CpuCalibration, unit: str,
           bound: float | None) -> list[str]:
    """Per op class: calls, model cycles, measured, model cycles / measured (before) and the
    calibrated estimate / measured (after)."""
    factors = calibration.factors[unit]
    before = {t.op_class: t for t in class_totals(rows, None)}
    lines = [f"    {'class':<12}{'calls':>6}{'model cycles':>15}{'estimate':>15}"
             f"{'measured':>15}{'before':>8}{'after':>8}" + ("  within" if bound else "")]
    for total in class_totals(rows, factors):
        ratio = total.ratio or 0.0
        within = ("  yes" if abs(ratio - 1) <= bound else "  NO") if bound else ""
        lines.append(f"    {total.op_class:<12}{total.calls:>6}{total.modelled_cycles:>15,}"
                     f"{round(total.estimated):>15,}{total.measured:>15,}"
                     f"{before[total.op_class].ratio or 0:>8.3f}{ratio:>8.3f}{within}")
    return lines


def _terms(figure) -> str:
    return " + ".join(f"{c:.4g} x {t}" for t, c in figure.terms.items() if c) or "0"


def render_text(result: Calibrated) -> str:
    calibration = result.calibration
    out = [f"calibrate {calibration.core}: fitted to {len(result.fitted)} profile(s): "
           + ", ".join(p.record.program for p in result.fitted)]
    if result.validated:
        out.append(f"validated on {len(result.validated)} profile(s), never used for fitting: "
                   + ", ".join(p.record.program for p in result.validated))
    for unit, factors in calibration.factors.items():
        clock = next(p.record.clock for p in (*result.fitted, *result.validated)
                     if p.record.unit == unit)
        out.append(f"{unit} ({clock}) per unit of each term, per kernel, else op class, else "
                   "all classes (non-negative least squares on the fit rows):")
        for name in OP_CLASSES:
            figure = factors.classes.get(name)
            if figure is None:
                continue
            out.append(f"  {name}: {_terms(figure)}")
            out += [f"    {kernel}: {_terms(f)}" for (cls, kernel), f in factors.kernels.items()
                    if cls == name]
        if factors.overall is not None:
            out.append(f"  all classes: {_terms(factors.overall)} (a class the fit never saw)")
        out.append(f"  fit set, per op class: before = model cycles / measured {unit}; after = "
                   f"the estimate ({unit}) / measured")
        out += _table([r for r in result.fit_rows if r.unit == unit], calibration, unit, None)
        validation = [r for r in result.validation_rows if r.unit == unit]
        if validation:
            out.append(f"  validation set (never fitted to), per op class; within = "
                       f"|after - 1| <= {result.bound:g}")
            out += _table(validation, calibration, unit, result.bound)
    return "\n".join(out)
