"""Predicted CMSIS-NN latency of the four MLPerf Tiny models per core, against public results.

    PYTHONPATH=. python benchmarks/mlperf_tiny_cpu_latency.py

Clocks are those of the public boards (EK-RA8D1 M85 480 MHz, NUCLEO-H7A3ZI-Q M7 280 MHz,
NUCLEO-U575ZI-Q M33 160 MHz). The Cortex-M55 has no public figure in the calibration set; it is
shown at 400 MHz, the Cortex-M55 of the Alif Ensemble E7's high-performance subsystem (RTSS-HP),
with rates derived from the M85 (not calibrated).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models.calibration import MLPERF_MODELS, predict_mlperf  # noqa: E402
from cost_models.cpu import load_cpu_cost_data  # noqa: E402

# (core, clock in Hz, where the clock comes from)
CORES = (
    ("cortex-m55", 400_000_000, "Alif Ensemble E7 RTSS-HP (derived rates, no public figure)"),
    ("cortex-m85", 480_000_000, "Renesas EK-RA8D1"),
    ("cortex-m7", 280_000_000, "ST NUCLEO-H7A3ZI-Q"),
    ("cortex-m33", 160_000_000, "ST NUCLEO-U575ZI-Q"),
)


def rows() -> list[list[str]]:
    data = load_cpu_cost_data()
    public = {(p.core, p.model): p for p in data.calibration}
    table = []
    for model in MLPERF_MODELS:
        for core, hz, _ in CORES:
            predicted_s = predict_mlperf(core, hz)[model]
            point = public.get((core, model))
            if point is not None and point.cpu_hz != hz:
                raise ValueError(f"{core}: table clock {hz} Hz differs from the public board's {point.cpu_hz} Hz")
            table.append(
                [
                    model,
                    core,
                    f"{hz / 1e6:.0f}",
                    f"{predicted_s * 1e3:.3f}",
                    f"{point.latency_s * 1e3:.3f}" if point else "-",
                    f"{predicted_s / point.latency_s:.2f}" if point else "-",
                    ("calibrate" if point.role == "fit" else "validate") if point else "derived",
                    point.software if point else "-",
                ]
            )
    return table


def main() -> None:
    headers = ["model", "core", "MHz", "predicted ms", "public ms", "pred/public", "role", "public stack"]
    print(tabulate(rows(), headers=headers, colalign=("left", "left", "right", "right", "right", "right", "left", "left"), disable_numparse=True))
    print()
    for core, hz, origin in CORES:
        print(f"{core} @ {hz / 1e6:.0f} MHz: {origin}")
    print()
    print(textwrap.fill("Split: " + load_cpu_cost_data().calibration_split, width=100))


if __name__ == "__main__":
    main()
