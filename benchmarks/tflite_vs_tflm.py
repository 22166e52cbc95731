"""MLPerf Tiny's int8 `.tflite` files compiled by orchestrate, against the same files in TFLM.

For each (model, target) the file is compiled (`orchestrator.compile`, kept in --work and reused
when present), then:
- TFLM: `--samples` random int8 inputs over the full range (the TFLM method's seed) run through
  the file in TFLM's interpreter and through the program (the twin executing the `.pte`, NPU
  partitions by the functional model executing Vela's command stream), compared value by value;
- device code: `verify` by the twin, the host runtime and QEMU (`--qemu-samples` of the same
  inputs as BundleIO cases), which compare the device's outputs with the twin's byte for byte.

One line per (model, target): values compared, values that differ (and by how many steps at
most), the device verdict and QEMU's instructions per inference. The CPU-only M4 program runs on
QEMU's mps2-an386.

    python benchmarks/tflite_vs_tflm.py [--models kws_ref_model,...] [--targets u55,...]
        [--samples 256] [--qemu-samples 4] [--work DIR] [--folder ../shared/models/mlperf-tiny]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("kws_ref_model", "vww_96_int8", "pretrainedResnet_quant", "ad01_int8")
TARGETS = {
    "m55": {"platform": "corstone300", "npu": "none", "cpu": "cortex-m55"},
    "m4": {"platform": "corstone300", "npu": "none", "cpu": "cortex-m4"},
    "u55-128": {"platform": "corstone300", "npu": "ethos-u55-128"},
    "u85-256": {"platform": "corstone320", "npu": "ethos-u85-256"},
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--qemu-samples", type=int, default=4)
    parser.add_argument("--work", default="/tmp/orchestrate-tflite-vs-tflm")
    parser.add_argument("--folder", default=str(ROOT.parent / "shared" / "models" /
                                                 "mlperf-tiny"))
    args = parser.parse_args(argv)

    import numpy as np

    import orchestrator
    from orchestrator.device_runs.combined import load_program, verify_all
    from orchestrator.sources.tflite_file import read_tflite
    from orchestrator.sources.tflite_module import int8_inputs
    from orchestrator.verification import tflm
    from orchestrator.verification.methods import QEMU, RUNTIME, TWIN

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"TFLM: {tflm.exercised_text()}; {args.samples} random int8 inputs per model (seed "
          f"{tflm.SEED}); device code on the first {args.qemu_samples}")
    print(f"{'model':24} {'target':8} {'values':>9} {'differ':>7} {'steps':>5}  device verdict")
    failures = 0
    for model in args.models.split(","):
        path = Path(args.folder) / f"{model}.tflite"
        graph = read_tflite(path)
        samples = int8_inputs(graph, args.samples, tflm.SEED)
        # the same inputs, dequantized, for the methods that take float samples
        inputs = work / f"{model}.inputs.npz"
        if not inputs.is_file():
            arrays = {}
            for j, index in enumerate(graph.inputs):
                t = graph.tensors[index]
                stacked = np.stack([s[j] for s in samples]).astype(np.float32)
                value = (stacked - t.zero_points[0]) * t.scales[0]
                if value.ndim == 5:  # N,1,H,W,C -> N,1,C,H,W as the module takes it
                    value = value.transpose(0, 1, 4, 2, 3)
                arrays[f"input{j}"] = value.astype(np.float32)
            np.savez(inputs, **arrays)
        for name in args.targets.split(","):
            options = TARGETS[name]
            pte = work / f"{model}_{name}.pte"
            if not pte.is_file():
                began = time.perf_counter()
                orchestrator.compile(str(path), pte, **options)
                print(f"  (compiled {pte.name} in {time.perf_counter() - began:.1f} s)")
            program = load_program(pte)
            comparison = tflm.compare(program, args.samples)
            verdict = verify_all(pte, samples=args.qemu_samples, calibration=str(inputs),
                                 methods=(TWIN, RUNTIME, QEMU))
            qemu = next((r for r in verdict.results if r.name.startswith("QEMU")), None)
            instructions = (qemu.report or {}).get("instructions") if qemu else None
            failures += (not comparison.passed) + (verdict.exit_code != 0)
            print(f"{model:24} {name:8} {comparison.values:>9,} {comparison.differing:>7,} "
                  f"{comparison.max_steps:>5}  {verdict.outcome.upper()}"
                  + (f"; QEMU {instructions:,} instructions/inference" if instructions else "")
                  + ("" if verdict.exit_code == 0 else f": {verdict.verdict[:200]}"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
