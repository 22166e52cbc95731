"""What a Plan is: every op's placement with its reasons and costs, the summary the gates read,
and, under `--placement cost`, the decisions that chose it (`CostPlacement`: the plan it was
compared with, each island and partition end tried, the memory mode and the pool windows).

`planner.py` makes a Plan (PLAN_STAGES) and `cost_placement.py` chooses among Plans; both build
on this module, which builds on neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.npu import VelaPartitionEstimate
from cost_models.profile_calibration import CpuCalibration
from kernels.layout_checks import is_layout_finding
from orchestrator.compilation import device_check
from orchestrator.compilation.pipeline import Compiled, UnsupportedModel
from orchestrator.planning.placement import OpPlacement
from orchestrator.reports.coverage import render_json, render_markdown, render_text, to_json
from orchestrator.reports.explorer import OverlayError, render_node_data
from orchestrator.reports.html import plan_html
from orchestrator.reports.summary import Summary

# The kept_reason of a partition's end whose whole partition moved.
WITH_ITS_PARTITION = "its whole partition moved"


@dataclass(frozen=True)
class Plan:
    """Every op's placement with its reasons and costs, and the summary the gates read."""

    compiled: Compiled
    rows: tuple[OpPlacement, ...]  # with costs
    estimates: dict[int, VelaPartitionEstimate]
    summary: Summary
    cost_placement: CostPlacement | None = None  # --placement cost
    calibration: CpuCalibration | None = None  # the CPU calibration its costs used

    def refuse_miscompiles(self) -> None:
        """Raise DeviceRefusal when the real runtime refused the program, and UnsupportedModel
        when a CPU kernel would read a tensor in another layout than it has: such a program
        loads and runs, and computes wrong numbers (kernels/layout_checks.py)."""
        device_check.refuse(self.compiled.device_run, self.compiled.target.npu)
        found = [(row.name, fault) for row in self.rows for fault in row.device_faults
                 if is_layout_finding(fault.key)]
        if found:
            name, fault = found[0]
            raise UnsupportedModel(
                f"not writing a program that computes wrong numbers: {len(found)} layout "
                f"fault(s), first at {name}: {fault.message}; `orchestrate plan` lists them all "
                "(a CPU-only program that mixes channels-last and contiguous tensors between CPU "
                "kernels: keep the model's tensors 4-D channels-last through reshapes/splits, or "
                "place those ops on the NPU)")

    def to_json(self) -> dict:
        """The plan as plan.json holds it (schema: orchestrator/plan.schema.json)."""
        return to_json(self.compiled, self.rows, self.summary)

    def to_markdown(self) -> str:
        return render_markdown(self.compiled, self.rows, self.summary)

    def to_text(self, width: int = 100, all_rows: bool = False) -> str:
        """The terminal report; an unrolled recurrence is one line unless `all_rows`."""
        return render_text(self.compiled, self.rows, self.summary, width, all_rows)

    def to_html(self) -> str:
        """One self-contained page: timeline, memory map, sortable op table."""
        return plan_html(self)

    def artifact_files(self) -> dict[str, bytes]:
        """What the plan adds to an artifacts folder: plan.json, operators.txt, report.html."""
        files = {"plan.json": render_json(self.compiled, self.rows, self.summary).encode(),
                 "operators.txt": "".join(f"{op}\n" for op in self.summary.operators).encode(),
                 "report.html": self.to_html().encode()}
        try:
            files["model_explorer.json"] = render_node_data(self).encode()
        except OverlayError:
            pass  # rows and instructions do not line up: no overlay rather than a wrong one
        return files


@dataclass(frozen=True)
class Decision:
    partition: int
    nodes: tuple[str, ...]
    macs: int
    npu_seconds: float  # vela + model:transition
    cpu_seconds: float  # model:<tier> / model:portable
    cpu_sources: str
    moved: bool
    kept_reason: str = ""  # why a cheaper-on-CPU island stayed (keep_npu rule)
    part: str = "island"  # island (the whole partition) | first ops | last ops

    @property
    def key(self) -> tuple[int, str]:
        return self.partition, self.part

    @property
    def delta_seconds(self) -> float:
        return self.cpu_seconds - self.npu_seconds

    def describe(self, cpu_hz: int) -> str:
        if self.kept_reason == WITH_ITS_PARTITION:
            return (f"partition {self.partition}'s {self.part} ({', '.join(self.nodes)}) moved "
                    "to the CPU with its whole partition")
        verb = "moved to the CPU" if self.moved else "kept on the NPU"
        cycles = int(round(self.delta_seconds * cpu_hz))
        what = (f"partition {self.partition}" if self.part == "island" else
                f"partition {self.partition}'s {self.part} ({', '.join(self.nodes)})")
        npu_source = "vela + model:transition" if self.part == "island" else "vela"
        text = (f"{what} ({len(self.nodes)} ops, {self.macs:,} MACs) {verb}: "
                f"{cycles:+,} CPU-clock cycles (NPU {self.npu_seconds * 1e6:.1f} us [{npu_source}] "
                f"vs CPU {self.cpu_seconds * 1e6:.1f} us [{self.cpu_sources}])")
        return text + (f"; {self.kept_reason}" if self.kept_reason else "")


def _whole_program(before: float, after: float | None) -> str:
    """'3.927 ms -> 3.719 ms whole program (-207.7 us) [vela + models]'; '' without `after`."""
    if after is None:
        return ""
    return (f"{before * 1e3:.3f} ms -> {after * 1e3:.3f} ms whole program "
            f"({(after - before) * 1e6:+.1f} us) [vela + models]")


@dataclass(frozen=True)
class MemoryDecision:
    """The Vela memory mode tried beside the platform's, and whether it was kept."""

    from_mode: str
    to_mode: str
    from_seconds: float  # whole program, greedy placement (estimate)
    to_seconds: float | None  # whole program under `to_mode` (None: it could not be planned)
    chosen: bool
    reason: str

    def describe(self) -> str:
        verb = "chosen" if self.chosen else "not chosen"
        figures = _whole_program(self.from_seconds, self.to_seconds)
        return (f"memory: Vela {self.to_mode} instead of the platform's {self.from_mode} {verb}"
                + (f": {figures}" if figures else "") + f"; {self.reason}")


@dataclass(frozen=True)
class CostPlacement:
    greedy: Plan
    chosen: Plan  # the plan kept (greedy's when moving made nothing faster)
    decisions: tuple[Decision, ...]
    greedy_seconds: float
    chosen_seconds: float
    memory: MemoryDecision | None = None  # the memory mode tried (None: none was)
    windows: WindowDecision | None = None  # average pools over their window (None: none)

    def report_lines(self) -> list[str]:
        """The steps in the order they ran: memory mode, pool windows, then the moves (judged
        on the plan the first two gave)."""
        cpu_hz = self.chosen.compiled.target.cpu_hz
        lines = [step.describe() for step in (self.memory, self.windows) if step is not None]
        lines.extend(d.describe(cpu_hz) for d in self.decisions)
        lines.append(f"whole program (estimate): greedy {self.greedy_seconds * 1e3:.3f} ms, "
                     f"chosen {self.chosen_seconds * 1e3:.3f} ms")
        return lines



@dataclass(frozen=True)
class WindowDecision:
    """Average pools computed over their one window so the NPU takes them, and whether kept."""

    pools: tuple[str, ...]  # the plan rows
    from_seconds: float  # whole program before (estimate)
    to_seconds: float | None  # whole program with the pools over their window (None: failed)
    chosen: bool
    reason: str

    def describe(self) -> str:
        verb = "chosen" if self.chosen else "not chosen"
        figures = _whole_program(self.from_seconds, self.to_seconds)
        figures = f": {figures}" if figures else ""
        return (f"average pool(s) {', '.join(self.pools)} over their one window, so the NPU "
                f"runs them, {verb}{figures}; {self.reason}")
