"""Cold plan vs cache-warm re-plan vs 6-configuration sweeps, as ratios to the cold plan.

All in one process run, each phase on a fresh or warm cache (orchestrator/artifacts/cache.py) as named:

    python benchmarks/plan_sweep_speed.py [MODEL]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

import orchestrator  # noqa: E402 - pins host numerics first
from orchestrator.request import Request
from orchestrator.sweeps.local import sweep_jobs  # noqa: E402

NPUS = ("ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256", "ethos-u65-256",
        "ethos-u65-512")


def _timed(label: str, fn, baseline: float | None = None) -> float:
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    ratio = f"{seconds / baseline:5.2f}x cold plan" if baseline else "baseline"
    print(f"{label:<48} {seconds:8.1f} s   {ratio}", flush=True)
    return seconds


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "ds-cnn"
    print(f"model {model}, {os.cpu_count()} cores; wall-clock seconds")
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "policy.yaml"
        policy.write_text("force_cpu: {ops: [aten.avg_pool2d.default]}\n")
        os.environ["ORCHESTRATE_CACHE"] = str(Path(tmp) / "cache-plan")
        cold = _timed("plan, cold cache", lambda: orchestrator.plan(model, npu="ethos-u55-128"))
        _timed("re-plan with a changed policy, warm cache",
               lambda: orchestrator.plan(model, npu="ethos-u55-128", policy=str(policy)), cold)
        jobs = [Request(model, npu=npu)
                for npu in NPUS]
        for label, cache, workers in (("6-config sweep, cold cache, 1 worker", "s1", 1),
                                      ("6-config sweep, warm cache, 1 worker", "s1", 1),
                                      ("6-config sweep, cold cache, 2 workers", "s2", 2),
                                      ("6-config sweep, warm cache, 2 workers", "s2", 2)):
            os.environ["ORCHESTRATE_CACHE"] = str(Path(tmp) / cache)
            _timed(label, lambda: sweep_jobs(jobs, workers), cold)


if __name__ == "__main__":
    main()
