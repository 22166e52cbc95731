"""End-to-end check of the CPU cost model through real plans.

For the four MLPerf Tiny models, compile CPU-only for each core with orchestrate (quantize,
Cortex-M passes, serialize) and sum the plan's per-op cost estimates. Prints, per model and
core: the plan's estimate, the calibration model's estimate on the float module
(cost_models.calibration), the public figure, and the ratios. Differences between the two
estimates come from the graph the compiler really produced (fused ops, boundary
quantize/dequantize, the portable ops that remain). ~1 minute per core on 2 cores.

    python benchmarks/mlperf_plan_latency.py [--cores cortex-m55,cortex-m85,cortex-m7,cortex-m33]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models.calibration import predict_mlperf  # noqa: E402
from cost_models.cpu import load_cpu_cost_data  # noqa: E402
from orchestrator.compilation.pipeline import compile_model  # noqa: E402
from orchestrator.planning.planner import make_plan  # noqa: E402
from orchestrator.sources.loader import load_calibration, load_model  # noqa: E402
from orchestrator.target import resolve_target  # noqa: E402

CLOCKS_HZ = {"cortex-m55": 400_000_000, "cortex-m85": 480_000_000, "cortex-m7": 280_000_000,
             "cortex-m33": 160_000_000}
MODELS = {"ds-cnn": "ds_cnn", "mobilenet-v1-025": "mobilenet_v1_025", "resnet8": "resnet8",
          "deep-autoencoder": "deep_autoencoder"}


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("--cores", default=",".join(CLOCKS_HZ))
    cores = parser.parse_args().cores.split(",")
    public = {(p.core, p.model): p for p in load_cpu_cost_data().calibration}
    table = []
    for zoo_name, mlperf_name in MODELS.items():
        model = load_model(zoo_name)
        calibration = load_calibration(None, model.example_inputs)
        for core in cores:
            hz = CLOCKS_HZ[core]
            target = resolve_target("corstone300", npu="none", cpu=core, cpu_hz=hz)
            plan = make_plan(compile_model(model, calibration, target))
            plan_s = plan.summary.latency_seconds
            module_s = predict_mlperf(core, hz)[mlperf_name]
            point = public.get((core, mlperf_name))
            table.append([zoo_name, core, f"{hz / 1e6:.0f}", f"{plan_s * 1e3:.3f}",
                          f"{module_s * 1e3:.3f}", f"{plan_s / module_s:.2f}",
                          f"{point.latency_s * 1e3:.3f}" if point else "-",
                          f"{plan_s / point.latency_s:.2f}" if point else "-",
                          point.role if point else "derived"])
    print(tabulate(table, ["model", "core", "MHz", "plan ms (model)", "calibration ms (model)",
                           "plan/calib", "public ms (measured)", "plan/public", "point role"],
                   disable_numparse=True))


if __name__ == "__main__":
    main()
