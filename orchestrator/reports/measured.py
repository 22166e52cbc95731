"""`plan --measured`: the plan's modelled figures and a profile's measured ones side by side.

Two sources, each named on every figure: the model (the plan's cost models: CPU cycles at the
plan's CPU clock, Vela's estimate for NPU rows) and the measurement (the profile's clock:
"instructions retired, QEMU -icount" for a QEMU profile, never called cycles; cycles where the
device says so). Where the units differ they are compared only as a ratio per kernel.
"""

from __future__ import annotations

import copy
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tabulate import tabulate

from cost_models.profile_calibration import OP_CLASSES, MeasuredRow, op_class
from orchestrator.artifacts.profile import DELEGATE_CALL, OPERATOR_CALL, Profile
from orchestrator.reports.coverage import HIDDEN_LABELS, short_source

@dataclass(frozen=True)
class MeasuredCall:
    """One instruction of the program as the profile measured it (median over its runs)."""

    instruction: int
    kind: str  # OPERATOR_CALL or DELEGATE_CALL
    operator: str  # the program's operator ("cortex_m::quantized_conv2d.out") or the backend
    rows: tuple[int, ...]  # positions of the plan rows it runs (plan.json "ops")
    partition: int | None  # the NPU partition of a delegate call
    value: int  # the whole instruction, in the profile's clock
    kernel_value: int | None  # the kernel's scope alone, when the profile has it


@dataclass(frozen=True)
class KernelClass:
    """The CPU rows that run one kernel: the model's cycles over the measured figure."""

    kernel: str
    calls: int
    modelled_cycles: int
    measured: int

    @property
    def ratio(self) -> float | None:
        return self.modelled_cycles / self.measured if self.measured else None


@dataclass(frozen=True)
class MeasuredPlan:
    """A plan (its plan.json) with the profile's figures for every instruction."""

    plan: Mapping = field(repr=False)  # plan.json of the program: Plan.to_json() or its artifacts'
    profile: Profile
    program_sha256: str
    calls: tuple[MeasuredCall, ...]  # program order
    total: int | None  # Method::execute, median over runs; None when the profile lacks it

    @property
    def ops(self) -> Sequence[Mapping]:
        return self.plan["ops"]

    def call_of_row(self) -> dict[int, MeasuredCall]:
        return {row: call for call in self.calls for row in call.rows}

    def kernel_calls_total(self) -> int:
        return sum(call.value for call in self.calls if call.kind == OPERATOR_CALL)

    def cpu_modelled_cycles(self) -> int:
        """The model's CPU cycles over the rows the kernel calls run."""
        return sum(_cycles_or_0(self.ops[row]) for call in self.calls if call.kind == OPERATOR_CALL
                   for row in call.rows)

    def by_kernel(self) -> tuple[KernelClass, ...]:
        """CPU rows grouped by the kernel they run (CMSIS-NN function or portable kernel), the
        costliest measured first."""
        groups: dict[str, tuple[int, int, int]] = {}
        for call in self.calls:
            if call.kind != OPERATOR_CALL:
                continue
            for row in call.rows:  # one CPU row per kernel call
                op = self.ops[row]
                name = str(op.get("kernel") or op.get("op"))
                calls, cycles, measured = groups.get(name, (0, 0, 0))
                groups[name] = (calls + 1, cycles + _cycles_or_0(op), measured + call.value)
        classes = [KernelClass(name, *figures) for name, figures in groups.items()]
        return tuple(sorted(classes, key=lambda c: -c.measured))

    def cpu_rows(self, program: str) -> tuple[MeasuredRow, ...]:
        """Each kernel call of a CPU row: the model's cycles (before any cycles calibration: a
        fit to scaled figures would calibrate twice) beside the call's measured figure, with
        the row's op class and kernel; the instruction estimate when the plan has one."""
        rows = []
        for call in self.calls:
            if call.kind != OPERATOR_CALL or not call.rows:
                continue
            ops = [self.ops[row] for row in call.rows]
            first = ops[0]
            row_class = op_class(first["placement"], first["kind"], first.get("kernel"))
            costs = [op.get("cost") for op in ops]
            if row_class is None or any(cost is None for cost in costs):
                continue
            estimates = [cost.get("instructions") for cost in costs]
            rows.append(MeasuredRow(
                program, row_class, str(first.get("kernel") or first.get("op")),
                sum(int(cost.get("model_cycles", cost["cycles"])) for cost in costs),
                int(call.value), self.profile.clock.unit,
                None if None in estimates else sum(estimates)))
        return tuple(rows)

    def to_json(self) -> dict:
        """plan.json with a `measured` block per op and in the summary (plan.schema.json)."""
        return measured_json(self)

    def to_text(self, width: int = 100) -> str:
        return render_text(self, width)


def _cycles_or_0(op: Mapping) -> int:
    cost = op.get("cost") or {}
    return int(cost.get("cycles") or 0)


SOURCE_LEGEND = ("model sources: M/D/S = orchestrate's CMSIS-NN cost model for the MVE/DSP/"
                 "scalar tier; P = portable-kernel model; T = transition model "
                 "(cost_models/data/cpu_cost.yaml); R = reads at the placed region's speed; "
                 "V = Vela's estimate (NPU cycles)")


def _estimate(op: dict) -> int | None:
    """The plan's instruction estimate of a row (a plan made with a calibration), or None."""
    cost = op.get("cost") or {}
    return cost.get("instructions")


def _estimates_instructions(measured: MeasuredPlan) -> bool:
    """The plan estimates instructions and the profile counts them: compared as one unit."""
    return measured.profile.clock.unit == "instructions" and any(
        _estimate(op) is not None for op in measured.ops)


def _op(op: dict) -> str:
    if op.get("kind") in HIDDEN_LABELS:
        return HIDDEN_LABELS[op["kind"]]
    parts = str(op.get("op", "")).split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _where(op: dict) -> str:
    if op["placement"] == "npu":
        return f"NPU p{op.get('partition')}"
    if op["placement"] == "cmsis-nn":
        return f"CMSIS/{op.get('isa_tier') or '-'}"
    return "portable"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


def _cycles(op: dict) -> int | None:
    cost = op.get("cost")
    return int(cost["cycles"]) if cost else None


def model_text(measured: MeasuredPlan) -> str:
    platform = measured.plan["platform"]
    npu = (f"; NPU rows: Vela's NPU cycles at {platform['npu_hz'] / 1e6:g} MHz"
           if platform.get("npu") and platform.get("npu_hz") else "")
    return (f"the plan's cost models: CPU rows in CPU cycles at {platform['cpu_hz'] / 1e6:g} MHz"
            f"{npu} (estimates)")


def measured_text(measured: MeasuredPlan) -> str:
    profile = measured.profile
    runs = len(profile.runs)
    who = f"written by {profile.writer}" if profile.writer else "ETDump from a device"
    program = (f"for this program (SHA-256 {measured.program_sha256[:12]}...)"
               if profile.program_sha256 else "matched to this program by its instructions")
    return (f"{profile.clock.text}; profile {profile.path}: {runs} inference(s), each "
            f"instruction's median; {who}, {program}")


def _ratio(modelled: int | None, measured: int | None) -> str:
    return f"{modelled / measured:.2f}" if modelled and measured else "-"


def _delegate_note(measured: MeasuredPlan) -> str:
    if measured.profile.clock.unit == "instructions":
        return ("the CPU's side of the call only: QEMU has no NPU, the NPU's commands ran on the "
                "host over semihosting, so no NPU time is in it")
    return "the call as the CPU waited for it: the NPU's time and the CPU's work around it"


def render_text(measured: MeasuredPlan, width: int = 100) -> str:
    plan, ops, unit = measured.plan, measured.ops, measured.profile.clock.unit
    platform = plan["platform"]
    call_of = measured.call_of_row()
    estimates = _estimates_instructions(measured)
    rows = []
    for position, op in enumerate(ops):
        call = call_of.get(position)
        cycles = _cycles(op)
        source = short_source(op["cost"]["source"]) if op.get("cost") else ""
        value = call.value if call is not None and call.kind == OPERATOR_CALL else None
        estimate = _estimate(op)
        rows.append([position, call.instruction if call is not None else "-", _cut(_op(op), 17),
                     _where(op), _cut(str(op.get("kernel") or "-"), 20),
                     f"{cycles:,} {source}" if cycles is not None else "-",
                     *([f"{estimate:,}" if estimate is not None else "-"] if estimates else []),
                     f"{value:,}" if value is not None else
                     (f"p{call.partition} below" if call is not None else "-"),
                     _ratio(estimate if estimates else cycles, value)])
    table = tabulate(rows, ["#", "instr", "op", "where", "kernel", "model cycles",
                            *(["model instr"] if estimates else []), "measured", "ratio"],
                     tablefmt="simple", disable_numparse=True,
                     colalign=("right", "right", "left", "left", "left", "right",
                               *(["right"] if estimates else []), "right", "right"))

    def wrap(line: str) -> str:
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        return textwrap.fill(line, width, subsequent_indent=indent, break_on_hyphens=False)

    header = (f"orchestrate plan --measured: {plan['model']['name']} ({plan['model']['source']}) "
              f"on {platform['platform']}: {platform['cpu']} ({platform['isa_tier']}) + "
              f"{platform.get('npu') or 'no NPU'}, io {platform['io']}")
    clock = measured.profile.clock.text
    columns = (f"columns: instr = the program's instruction; model cycles with their source "
               f"(legend below); measured = {clock}; ratio = model cycles / measured")
    if estimates:
        columns = (f"columns: instr = the program's instruction; model cycles with their source "
                   f"(legend below); model instr = the model's instruction estimate (its cycles "
                   f"x the calibration's instructions per cycle); measured = {clock}; ratio = "
                   "model instr / measured (1.00 = exact)")
    out = [wrap(header), wrap(f"model: {model_text(measured)}"),
           wrap(f"measured: {measured_text(measured)}"), wrap(columns), table, ""]
    kernel_calls = [c for c in measured.calls if c.kind == OPERATOR_CALL]
    in_calls = measured.kernel_calls_total()
    modelled = measured.cpu_modelled_cycles()
    seconds = modelled / platform["cpu_hz"]
    unplanned = [c for c in kernel_calls if not c.rows]
    out.append(wrap(f"total, {len(kernel_calls) - len(unplanned)} CPU rows (one kernel call "
                    f"each): model {modelled:,} cycles ({seconds * 1e3:.3f} ms at "
                    f"{platform['cpu_hz'] / 1e6:g} MHz); measured {in_calls:,} {clock}; "
                    f"model/measured {_ratio(modelled, in_calls)}"))
    if unplanned:
        names = ", ".join(sorted({c.operator for c in unplanned}))
        out.append(wrap(f"of which {len(unplanned)} kernel call(s) the plan has no row for "
                        f"(view copies it takes as free: {names}): "
                        f"{sum(c.value for c in unplanned):,} {clock}"))
    if estimates:
        estimate = sum(row.estimated or 0 for row in measured.cpu_rows(""))
        out.append(wrap(f"the model's instruction estimate over those rows: {estimate:,} "
                        f"instructions; estimate/measured {_ratio(estimate, in_calls)}"))
    if measured.total is not None:
        share = f"; the kernel calls are {in_calls / measured.total:.1%} of it" \
            if measured.total else ""
        out.append(wrap(f"whole inference (Method::execute): measured {measured.total:,} "
                        f"{clock}{share}"))
    for call in measured.calls:
        if call.kind != DELEGATE_CALL:
            continue
        seconds = sum(float((ops[row].get("cost") or {}).get("seconds") or 0) for row in call.rows)
        cpu_side = [(ops[row].get("cost") or {}).get("instructions") for row in call.rows
                    if ops[row].get("kind") == "npu-invocation"]
        estimate = (f"; the model's estimate of the CPU's side {cpu_side[0]:,} instructions, "
                    f"estimate/measured {_ratio(cpu_side[0], call.value)}"
                    if cpu_side and cpu_side[0] is not None and unit == "instructions" else "")
        out.append(wrap(
            f"NPU partition {call.partition} (instruction {call.instruction}, {call.operator}, "
            f"{len(call.rows)} rows): model {seconds * 1e3:.3f} ms (Vela's estimate and the "
            f"invocation model); measured {call.value:,} {clock}: {_delegate_note(measured)}"
            f"{estimate}"))
    classes = measured.by_kernel()
    if classes:
        same = unit == "cycles"
        out.append(wrap(
            "by kernel, model cycles / measured " + (
                "cycles (1.00 = the model is exact):" if same else
                f"{unit} ({clock}: another unit than the model's cycles, so compare kernels "
                "with each other, not with 1.00):")))
        for group in classes:
            out.append(wrap(f"  {group.kernel}: {group.calls} call(s), {group.modelled_cycles:,} "
                            f"cycles / {group.measured:,} {unit} = "
                            f"{_ratio(group.modelled_cycles, group.measured)}"))
    if estimates:
        out.extend(wrap(line) for line in class_lines(measured))
    out.append(wrap(SOURCE_LEGEND))
    sources = [str((op.get("cost") or {}).get(key) or "") for op in ops
               for key in ("source", "instructions_source")]
    names = sorted({m.group(1) for s in sources
                    for m in re.finditer(r"(?:calibrated|raised to instructions): ([^) ]+)", s)})
    if names:
        out.append(wrap(f"calibrated by {', '.join(names)} (`orchestrate calibrate`): * = cycles "
                        "it scaled; ^ = cycles raised to its instruction estimate (the model had "
                        "fewer); model instr = its instruction estimate"))
    return "\n".join(out)


def class_lines(measured: MeasuredPlan) -> list[str]:
    """Per op class, the plan's instruction estimate over the measured instructions."""
    sums: dict[str, list[int]] = {}
    for row in measured.cpu_rows(""):
        if row.estimated is None:
            continue
        entry = sums.setdefault(row.op_class, [0, 0, 0])
        entry[0] += 1
        entry[1] += row.estimated
        entry[2] += row.measured
    lines = ["by op class, model instructions (calibrated estimate) / measured instructions "
             "(1.00 = exact):"]
    for name in OP_CLASSES:
        if name in sums:
            calls, estimate, value = sums[name]
            lines.append(f"  {name}: {calls} call(s), {estimate:,} / {value:,} = "
                         f"{_ratio(estimate, value)}")
    return lines


def measured_json(measured: MeasuredPlan) -> dict:
    """plan.json with a `measured` block on every op an instruction runs and in the summary."""
    plan = copy.deepcopy(dict(measured.plan))
    profile = measured.profile
    clock = {"clock": profile.clock.text, "unit": profile.clock.unit}
    for call in measured.calls:
        for row in call.rows:
            block = {"instruction": call.instruction, "call": call.kind, **clock}
            if call.kind == OPERATOR_CALL:
                cycles = _cycles(plan["ops"][row])
                block.update(value=call.value, kernel_value=call.kernel_value,
                             model_cycles_per_measured=(round(cycles / call.value, 4)
                                                        if cycles and call.value else None))
            else:
                block.update(partition=call.partition, value=None,
                             note="measured per partition: summary.measured.partitions")
            plan["ops"][row]["measured"] = block
    platform = plan["platform"]
    in_calls = measured.kernel_calls_total()
    modelled = measured.cpu_modelled_cycles()
    plan["summary"]["measured"] = {
        "profile": profile.path, **clock, "writer": profile.writer,
        "program_sha256": measured.program_sha256,
        "profile_names_program": profile.program_sha256 is not None,
        "runs": len(profile.runs), "statistic": "median over runs, per instruction",
        "model": model_text(measured),
        "method_execute": measured.total,
        "kernel_calls": {"count": sum(1 for c in measured.calls if c.kind == OPERATOR_CALL),
                         "measured": in_calls, "model_cycles": modelled,
                         "model_seconds": modelled / platform["cpu_hz"]},
        "partitions": [{"partition": c.partition, "instruction": c.instruction,
                        "backend": c.operator, "measured": c.value,
                        "model_seconds": sum(float((plan["ops"][r].get("cost") or {})
                                                   .get("seconds") or 0) for r in c.rows),
                        "note": _delegate_note(measured)}
                       for c in measured.calls if c.kind == DELEGATE_CALL],
        "by_kernel": [{"kernel": g.kernel, "calls": g.calls, "model_cycles": g.modelled_cycles,
                       "measured": g.measured,
                       "model_cycles_per_measured": round(g.ratio, 4) if g.ratio else None}
                      for g in measured.by_kernel()],
    }
    return plan
