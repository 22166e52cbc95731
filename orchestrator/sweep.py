"""`sweep`: the same model planned for several NPU (and CPU) configurations, side by side.

For a SoC vendor choosing an NPU size or an engineer choosing a part: one plan per
configuration, summarized as NPU coverage, partitions, estimated latency (with its source),
memory and fit. Each configuration is a full compile, so figures are the same as `plan`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from tabulate import tabulate

from orchestrator.planner import make_plan
from orchestrator.pipeline import compile_model


@dataclass(frozen=True)
class SweepRow:
    npu: str
    cpu: str
    npu_partitions: int
    npu_mac_coverage_pct: float
    npu_cycles: int  # Vela's total over all partitions
    latency_seconds: float | None
    latency_source: str | None
    arena_bytes: int
    npu_scratch_bytes: int
    pte_bytes: int
    fits: bool
    runnable: bool


def sweep(model, calibration, targets, policy=None, progress=None) -> tuple[SweepRow, ...]:
    """Plan `model` for each target (a placement policy's forced nodes apply to every one)."""
    rows = []
    for target in targets:
        if progress:
            progress(f"{target.npu or 'cpu-only'} on {target.cpu}", "start", 0.0)
        plan = make_plan(compile_model(model, calibration, target, policy=policy))
        s = plan.summary
        rows.append(SweepRow(
            npu=target.npu or "none", cpu=target.cpu, npu_partitions=s.npu_partitions,
            npu_mac_coverage_pct=s.npu_mac_coverage_pct,
            npu_cycles=sum(e.cycles for e in plan.estimates.values()),
            latency_seconds=s.latency_seconds, latency_source=s.latency_source,
            arena_bytes=s.arena_bytes, npu_scratch_bytes=s.npu_scratch_bytes,
            pte_bytes=s.pte_bytes, fits=s.fits, runnable=not s.device_faults))
    return tuple(rows)


def render_text(rows: tuple[SweepRow, ...]) -> str:
    table = [[r.npu, r.cpu, r.npu_partitions, f"{r.npu_mac_coverage_pct:.1f}%",
              f"{r.npu_cycles:,}",
              "-" if r.latency_seconds is None else f"{r.latency_seconds * 1e3:.3f}",
              f"{r.arena_bytes:,}", f"{r.npu_scratch_bytes:,}", f"{r.pte_bytes:,}",
              "yes" if r.fits else "NO", "yes" if r.runnable else "NO"] for r in rows]
    text = tabulate(table, ["npu", "cpu", "parts", "NPU MACs", "NPU cycles (vela)",
                            "latency ms (est.)", "arena B", "NPU scratch B", ".pte B", "fits",
                            "runs"], disable_numparse=True)
    sources = sorted({r.latency_source for r in rows if r.latency_source})
    return text + "\nlatency source: " + "; ".join(sources) + " (estimates, nothing measured)"


def to_json(rows: tuple[SweepRow, ...]) -> list[dict]:
    return [dict(r.__dict__) for r in rows]
