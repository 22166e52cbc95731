"""`sweep`: models planned for several NPU (and CPU) configurations, side by side.

For a SoC vendor choosing an NPU size or an engineer choosing a part: one plan per model and
configuration, summarized as NPU coverage, partitions, estimated latency (with its source),
memory and fit. Each configuration is a full compile, so figures are the same as `plan`'s.

Configurations run in parallel worker processes (`jobs`) on this machine, or as tasks on a Ray
cluster (`executor="ray[:ADDRESS]"`, orchestrator/sweeps/ray_executor.py); each worker loads the model
from its spec and compiles. Work that does not depend on the configuration (capture and
quantization for one quantizer) comes from the content-addressed cache (orchestrator/artifacts/cache.py),
shared by the workers and by later runs.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from tabulate import tabulate

from orchestrator.errors import UserError
from orchestrator.logs import quiet_upstream, upstream_is_quiet
from orchestrator.planning.run import plan_request
from orchestrator.request import Request
from orchestrator.sweeps.ray_executor import sweep_on_ray


@dataclass(frozen=True)
class SweepRow:
    model: str
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


def _row(model_name: str, plan) -> SweepRow:
    target = plan.compiled.target
    s = plan.summary
    return SweepRow(
            model=model_name, npu=target.npu or "none", cpu=target.cpu,
            npu_partitions=s.npu_partitions,
            npu_mac_coverage_pct=s.npu_mac_coverage_pct,
            npu_cycles=sum(e.cycles for e in plan.estimates.values()),
            latency_seconds=s.latency_seconds, latency_source=s.latency_source,
            arena_bytes=s.arena_bytes, npu_scratch_bytes=s.npu_scratch_bytes,
            pte_bytes=s.pte_bytes, fits=s.fits, runnable=not s.device_faults)


def run_job(job: Request) -> SweepRow:
    """Compile and plan one model x configuration (in a worker process or in this one)."""
    plan = plan_request(job)
    return _row(model_label(job.model, plan.compiled.model.name), plan)


def model_label(spec: str, name: str) -> str:
    """How a sweep row names its model: the loaded model's name, with the factory for a
    `file.py:factory` spec (two factories of one file are two rows, not one name twice)."""
    file_part, sep, factory = str(spec).rpartition(":")
    return f"{name}:{factory}" if sep and file_part.endswith(".py") and factory.isidentifier() \
        else name


EXECUTORS = "local, ray or ray:ADDRESS (e.g. ray:auto, ray:10.0.0.1:6379)"


@dataclass(frozen=True)
class Executor:
    """Where a sweep's jobs run: `local` worker processes, or `ray` tasks on a Ray instance
    started here (`address` None) or on the running cluster at `address`."""

    kind: str  # "local" or "ray"
    address: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Executor":
        """`local`, `ray` or `ray:ADDRESS`; anything else is a UserError naming those."""
        if text in ("local", "ray"):
            return cls(text)
        if text.startswith("ray:") and text[len("ray:"):].strip():
            return cls("ray", text[len("ray:"):].strip())
        raise UserError(f"--executor '{text}' is not one of {EXECUTORS}")


def sweep_jobs(jobs: list[Request], workers: int | None = None, progress=None,
               executor: str = "local") -> tuple[SweepRow, ...]:
    """Run every job, `workers` at a time (default: the machine's cores), rows in job order.

    `executor` is `local` (worker processes here), `ray` (Ray tasks on a Ray instance started
    here with `workers` CPUs) or `ray:ADDRESS` (Ray tasks on the cluster at ADDRESS; see
    orchestrator/sweeps/ray_executor.py for what its nodes need). The rows are the same on each.
    `progress(label, event, seconds)` hears each configuration finish."""
    chosen = Executor.parse(executor)
    if chosen.kind == "ray":
        return sweep_on_ray(jobs, chosen.address, workers, run_job, _label, progress)
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        rows = []
        for job in jobs:
            rows.append(run_job(job))
            if progress:
                progress(_label(job), "done", 0.0)
        return tuple(rows)
    results: dict[int, SweepRow] = {}
    # Spawned, not forked: a fork of a process whose torch has started its thread pools can
    # inherit a held lock and hang (seen here: both workers asleep after a plan in the parent);
    # a spawned worker also imports orchestrator first, so its host numerics are pinned.
    context = multiprocessing.get_context("spawn")
    # A quiet parent has quiet workers: the initializer runs before the first job's unpickling
    # imports torch, whose import-time notes would otherwise reach the user's stderr.
    initializer = quiet_upstream if upstream_is_quiet() else None
    with ProcessPoolExecutor(max_workers=workers, mp_context=context,
                             initializer=initializer) as pool:
        futures = {pool.submit(run_job, job): index for index, job in enumerate(jobs)}
        for future in as_completed(futures):
            index = futures[future]
            results[index] = future.result()
            if progress:
                progress(_label(jobs[index]), "done", 0.0)
    return tuple(results[i] for i in range(len(jobs)))


def _label(job: Request) -> str:
    return f"{job.model} on {job.npu or 'default NPU'}"


def render_text(rows: tuple[SweepRow, ...]) -> str:
    table = [[r.model, r.npu, r.cpu, r.npu_partitions, f"{r.npu_mac_coverage_pct:.1f}%",
              f"{r.npu_cycles:,}",
              "-" if r.latency_seconds is None else f"{r.latency_seconds * 1e3:.3f}",
              f"{r.arena_bytes:,}", f"{r.npu_scratch_bytes:,}", f"{r.pte_bytes:,}",
              "yes" if r.fits else "NO", "yes" if r.runnable else "NO"] for r in rows]
    text = tabulate(table, ["model", "npu", "cpu", "parts", "NPU MACs", "NPU cycles (vela)",
                            "latency ms (est.)", "arena B", "NPU scratch B", ".pte B", "fits",
                            "runs"], disable_numparse=True)
    sources = sorted({r.latency_source for r in rows if r.latency_source})
    return text + "\nlatency source: " + "; ".join(sources) + " (estimates, nothing measured)"


def to_json(rows: tuple[SweepRow, ...]) -> list[dict]:
    return [dict(r.__dict__) for r in rows]
