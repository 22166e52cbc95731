"""A 6-configuration sweep on Ray with 2 workers vs 1, and on the local process pool, as speed-ups.

One process run. A serial sweep first fills a fresh cache (orchestrator/artifacts/cache.py) and gives the
reference rows; every timed sweep after it runs on that warm cache, so each does the same work
(the per-configuration compile, Vela and plan; no capture or quantization) and must return the
reference rows. A Ray sweep's time includes starting a Ray instance on this machine
(`--executor ray`, `workers` CPUs) and its worker processes, as a user's sweep would; a local
sweep's includes starting its worker processes (1 worker runs in this process).

    python benchmarks/sweep_ray.py [MODEL]
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

import orchestrator  # noqa: E402,F401 - pins host numerics first
from orchestrator.request import Request
from orchestrator.sweeps.local import sweep_jobs  # noqa: E402

NPUS = ("ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256", "ethos-u65-256",
        "ethos-u65-512")


def _timed(label: str, jobs, reference, workers: int, executor: str) -> float:
    start = time.perf_counter()
    rows = sweep_jobs(jobs, workers, executor=executor)
    seconds = time.perf_counter() - start
    if rows != reference:
        raise SystemExit(f"{label}: rows differ from the serial sweep's")
    print(f"{label:<40} {seconds:8.1f} s", flush=True)
    return seconds


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "ds-cnn"
    jobs = [Request(model, npu=npu)
            for npu in NPUS]
    print(f"model {model}, {len(jobs)} configurations, {os.cpu_count()} cores; wall-clock "
          "seconds, warm cache")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ORCHESTRATE_CACHE"] = str(Path(tmp) / "cache")
        start = time.perf_counter()
        reference = sweep_jobs(jobs, 1)
        print(f"{'(cache warm-up: serial sweep, cold)':<40} {time.perf_counter() - start:8.1f} s",
              flush=True)
        ray_1 = _timed("ray, 1 worker", jobs, reference, 1, "ray")
        ray_2 = _timed("ray, 2 workers", jobs, reference, 2, "ray")
        local_1 = _timed("local, 1 worker (in this process)", jobs, reference, 1, "local")
        local_2 = _timed("local process pool, 2 workers", jobs, reference, 2, "local")
    print(f"speed-up, ray 2 workers vs 1:           {ray_1 / ray_2:5.2f}x")
    print(f"speed-up, local pool 2 workers vs 1:    {local_1 / local_2:5.2f}x")
    print(f"ray 2 workers vs local pool 2 workers:  {local_2 / ray_2:5.2f}x "
          "(above 1: Ray faster)")


if __name__ == "__main__":
    main()
