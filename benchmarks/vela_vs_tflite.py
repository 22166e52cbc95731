"""Our programs' Vela estimate against the incumbent's: the same `.tflite`, the same Vela, the
same accelerator, system config and memory mode.

For each (model, target): the file compiled by orchestrate (`orchestrator.compile`; its
partitions' Vela summaries), and the file compiled by `vela` itself, as teams ship it today
(orchestrator/comparison/npu.py: the flags our partitions get, Vela's TFLite output). Every
figure is Vela's own estimate from its summary CSV, on both sides; nothing here is measured on a
device. Operators are counted in the file's operators (Vela's own count splits a softmax into
its NPU steps). A ratio is ours / incumbent: at most 1.00 is as fast or faster.

    python benchmarks/vela_vs_tflite.py [--models kws_ref_model,...] [--targets u55-128,...]
        [--work DIR] [--folder ../shared/models/mlperf-tiny]

A model is looked for in --folder, then in tests/data/tflite (files made by TensorFlow's
converter: an encoder-decoder with nearest-neighbour upsampling, a mean over a 272x272 map).

The last column is the plan's end-to-end latency estimate of our program (Vela's cycles at the
platform's NPU clock plus the CPU cost model, `orchestrate plan`'s figure).

Exit 1 when a ratio of cycles_npu or cycles_total is above 1.00, or when we leave more
partitions than the incumbent.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("kws_ref_model", "vww_96_int8", "pretrainedResnet_quant", "ad01_int8",
          # made by TensorFlow's converter (tests/data/tflite/make.py)
          "unet_upsample_int8", "large_mean_int8")
OUR_FILES = ROOT / "tests" / "data" / "tflite"
TARGETS = {
    "u55-128": ("corstone300", "ethos-u55-128"),
    "u65-256": ("corstone300", "ethos-u65-256"),
    "u85-256": ("corstone320", "ethos-u85-256"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--work", default="/tmp/orchestrate-vela-vs-tflite")
    parser.add_argument("--folder", default=str(ROOT.parent / "shared" / "models" /
                                                 "mlperf-tiny"))
    args = parser.parse_args(argv)

    import orchestrator
    from orchestrator.comparison.npu import incumbent_npu, ours_npu, vela_version
    from orchestrator.target import resolve_target

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"source: Vela {vela_version()} estimates (summary CSV), ours = the program's "
          "partitions, incumbent = `vela FILE.tflite`; ratio = ours / incumbent")
    print(f"{'model':24} {'target':8} {'cycles_npu ours / incumbent':>30} {'ratio':>6} "
          f"{'cycles_total ours / incumbent':>31} {'ratio':>6}  NPU ops  CPU ops  partitions"
          "  SRAM KiB ours / incumbent  plan latency")
    worse = 0
    for model in args.models.split(","):
        path = Path(args.folder) / f"{model}.tflite"
        if not path.is_file():
            path = OUR_FILES / f"{model}.tflite"
        for name in args.targets.split(","):
            platform, npu = TARGETS[name]
            pte = work / f"{model}_{name}.pte"
            began = time.perf_counter()
            result = orchestrator.compile(str(path), pte, platform=platform, npu=npu)
            seconds = time.perf_counter() - began
            ours = ours_npu(result.plan)
            theirs = incumbent_npu(path, resolve_target(platform, npu),
                                   work / f"{model}_{name}.incumbent")
            npu_ratio = ours.ratio(theirs, "cycles_npu")
            total_ratio = ours.ratio(theirs, "cycles_total")
            worse += (npu_ratio or 0) > 1 or (total_ratio or 0) > 1 or \
                ours.partitions > theirs.partitions
            print(f"{model:24} {name:8} {ours.cycles_npu:>14,} / {theirs.cycles_npu:>13,} "
                  f"{_ratio(npu_ratio)} {ours.cycles_total:>15,} / {theirs.cycles_total:>13,} "
                  f"{_ratio(total_ratio)}  {ours.npu_operators:>3} / {theirs.npu_operators:<3}"
                  f"{ours.cpu_operators:>3} / {theirs.cpu_operators:<3}"
                  f"{ours.partitions:>5} / {theirs.partitions:<5}"
                  f"{ours.sram_bytes / 1024:>7.2f} / {theirs.sram_bytes / 1024:<7.2f}"
                  f"{result.plan.summary.latency_seconds * 1e3:>9.3f} ms"
                  f"   (compiled in {seconds:.0f} s)", flush=True)
    return 1 if worse else 0


def _ratio(value: float | None) -> str:
    return f"{value:>6.3f}" if value is not None else f"{'-':>6}"


if __name__ == "__main__":
    sys.exit(main())
