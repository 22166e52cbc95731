"""`plan`: the placements of a compile, costed and summarized, and the CI gates on them."""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.npu import VelaPartitionEstimate, read_vela_dir
from cost_models.plan_costs import attach_costs
from orchestrator.artifacts import delegate_partitions
from orchestrator.errors import GateFailure
from orchestrator.placement import missing_kernel_faults
from orchestrator.report import Summary, program_operators, summarize


@dataclass(frozen=True)
class Plan:
    compiled: object  # orchestrator.pipeline.Compiled
    rows: tuple  # OpPlacement with costs
    estimates: dict[int, VelaPartitionEstimate]
    summary: Summary


def vela_estimates(compiled) -> dict[int, VelaPartitionEstimate]:
    if not compiled.target.npu:
        return {}
    return {p.index: read_vela_dir(p.vela_dir / "output") for p in delegate_partitions(compiled)}


def make_plan(compiled, runner_ops: set[str] | None = None) -> Plan:
    estimates = vela_estimates(compiled)
    rows = missing_kernel_faults(compiled.placements,
                                 program_operators(compiled.executorch_program))
    rows = attach_costs(rows, compiled.target, estimates)
    return Plan(compiled, rows, estimates, summarize(compiled, rows, estimates, runner_ops))


@dataclass(frozen=True)
class Gates:
    min_npu_coverage_pct: float | None = None
    max_partitions: int | None = None
    require_fit: bool = False
    require_runner_ops: bool = False
    require_runnable: bool = False


def check_gates(plan: Plan, gates: Gates) -> None:
    """Raise GateFailure (exit 3) naming every violated gate."""
    s = plan.summary
    failed = []
    if gates.min_npu_coverage_pct is not None and s.npu_mac_coverage_pct < gates.min_npu_coverage_pct:
        failed.append(f"--fail-under-npu-coverage: NPU MAC coverage {s.npu_mac_coverage_pct:.1f}% "
                      f"< {gates.min_npu_coverage_pct:g}%")
    if gates.max_partitions is not None and s.npu_partitions > gates.max_partitions:
        failed.append(f"--max-partitions: {s.npu_partitions} NPU partitions > {gates.max_partitions}")
    if gates.require_fit and not s.fits:
        too_big = [m.item for m in s.memory if not m.fits]
        failed.append(f"--require-fit: does not fit the platform memories ({', '.join(too_big)})")
    if gates.require_runner_ops and s.missing_operators:
        failed.append(f"--runner-ops: runner lacks {', '.join(s.missing_operators)}")
    if gates.require_runnable and s.device_faults:
        failed.append(f"--require-runnable: {len(s.device_faults)} device fault(s), first: "
                      f"{s.device_faults[0]}")
    if failed:
        raise GateFailure("gate failed: " + "; ".join(failed))
