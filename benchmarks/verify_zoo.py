"""`verify` verdicts for every zoo model on U55-128, U65-256, U85-256 and CPU-only M55.

Prints, per model and target: the verdict (method: the host twin), the worst int8-step
difference from the quantized reference over N samples, device faults found, and the twin's
wall time per sample (measured here, after the twin is loaded).

    python benchmarks/verify_zoo.py [--samples 16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.zoo import zoo_names  # noqa: E402
from orchestrator.artifacts import write_outputs  # noqa: E402
from orchestrator.pipeline import compile_model  # noqa: E402
from orchestrator.sources import load_calibration, load_model  # noqa: E402
from orchestrator.target import resolve_target  # noqa: E402
from orchestrator.verification import verify  # noqa: E402

TARGETS = (("corstone300", "ethos-u55-128", None), ("corstone300", "ethos-u65-256", None),
           ("corstone320", "ethos-u85-256", None), ("corstone300", "none", "cortex-m55"))


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=16)
    samples = parser.parse_args().samples
    out_dir = Path(tempfile.mkdtemp(prefix="verify-zoo-"))
    rows = []
    for name in zoo_names():
        model = load_model(name)
        calibration = load_calibration(None, model.example_inputs)
        for platform, npu, cpu in TARGETS:
            target = resolve_target(platform, npu=npu, cpu=cpu)
            pte = out_dir / f"{name}-{npu if npu != 'none' else cpu}.pte"
            write_outputs(compile_model(model, calibration, target), pte)
            report = verify(pte, samples=samples)
            worst = max(o.max_steps for o in report.outputs)
            faults = sorted({f"{f.op}: {f.check}" for f in report.faults})
            rows.append([name, npu if npu != "none" else cpu,
                         "PASS" if report.passed else ("numbers ok, device faults"
                                                       if report.numerics_passed else "FAIL"),
                         f"{worst:g}", "; ".join(faults) or "-",
                         f"{report.twin_seconds_per_sample * 1e3:.1f}"])
    print(f"method: host twin (cortex_m reference kernels + TOSA reference model on the "
          f"Vela-compiled TOSA); {samples} samples; pass = <= 1 int8 step vs the quantized "
          "reference and no device fault")
    print(tabulate(rows, ["model", "target", "verdict", "max steps", "device faults",
                          "twin ms/sample (measured)"], disable_numparse=True))


if __name__ == "__main__":
    main()
