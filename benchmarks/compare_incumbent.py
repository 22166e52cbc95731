"""`orchestrate compare` across MLPerf Tiny's int8 models and four targets: our program against the
incumbent's (vela + TensorFlow Lite Micro), both run on the same QEMU machine.

One row per (model, target): Vela's cycles_npu on both sides (estimates), QEMU's instructions per
inference on both sides (measured, -icount), the tensor arenas (measured on the device), the model
files, and whether the two programs' outputs are equal on the same inputs. With --firmware, a
second table: both release images' flash and RAM (without the stack) from their linker maps, and
each stack's high-water mark measured on QEMU where the images run (CPU-only targets; `compare
--firmware`). A figure that could not be produced is '-' and the reason follows the table.

    python benchmarks/compare_incumbent.py [--models kws_ref_model,...] [--targets u55-128,...]
        [--samples 4] [--work DIR] [--json FILE] [--folder ../shared/models/mlperf-tiny]
        [--firmware]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("kws_ref_model", "vww_96_int8", "pretrainedResnet_quant", "ad01_int8")
TARGETS = {
    "u55-128": {"platform": "corstone300", "npu": "ethos-u55-128"},
    "u65-256": {"platform": "corstone300", "npu": "ethos-u65-256"},
    "u85-256": {"platform": "corstone320", "npu": "ethos-u85-256"},
    "m55": {"platform": "corstone300", "npu": "none", "cpu": "cortex-m55"},
    "m4": {"platform": "corstone300", "npu": "none", "cpu": "cortex-m4"},
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--targets", default="u55-128,u85-256,m55,m4",
                        help=f"any of {', '.join(TARGETS)} (default: the four the docs' table "
                             "shows)")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--work", default="/tmp/orchestrate-compare-incumbent")
    parser.add_argument("--json", help="write every comparison's JSON here")
    parser.add_argument("--firmware", action="store_true",
                        help="also both release images' flash and RAM (compare --firmware)")
    parser.add_argument("--folder", default=str(ROOT.parent / "shared" / "models" /
                                                 "mlperf-tiny"))
    args = parser.parse_args(argv)

    from orchestrator import compare

    def cell(figure, side):
        value = figure.get(side) if figure else None
        return "-" if value is None else f"{value:,}"

    def ratio(figure):
        value = figure.get("ratio") if figure else None
        return "-" if value is None else f"{value:.3f}"

    print("ratio = ours / incumbent. cycles: Vela estimates (summary CSV); instructions: QEMU "
          "-icount, measured; arena: measured on the device")
    print(f"{'model':24} {'target':8} {'cycles_npu ours/inc':>22} {'ratio':>6} "
          f"{'instructions ours/inc':>24} {'ratio':>6} {'arena B ours/inc':>18} "
          f"{'file B ours/inc':>20}  outputs")
    everything, reasons = [], []
    for model in args.models.split(","):
        path = Path(args.folder) / f"{model}.tflite"
        for name in args.targets.split(","):
            began = time.perf_counter()
            try:
                result = compare(path, samples=args.samples, firmware=args.firmware,
                                 work_dir=Path(args.work) / f"{model}_{name}", **TARGETS[name])
            except Exception as error:  # noqa: BLE001 - one cell's failure is a row, not the end
                print(f"{model:24} {name:8} FAILED: {type(error).__name__}: "
                      f"{str(error).splitlines()[0][:200]}", flush=True)
                continue
            data = result.to_json()
            data["seconds"] = round(time.perf_counter() - began, 1)
            data["cell"] = (model, name)
            everything.append(data)
            figures = {f["figure"]: f for f in data["figures"]}
            npu = figures.get("cycles_npu")
            cpu = figures["CPU instructions per inference"]
            arena = figures["tensor arena bytes"]
            size = figures["model file bytes"]
            numerics = data["numerics"]
            outputs = ("equal" if numerics["values"] and not numerics["differing"] else
                       f"{numerics['differing']} differ" if numerics["values"] else "-")
            print(f"{model:24} {name:8} {cell(npu, 'ours') + ' / ' + cell(npu, 'incumbent'):>22} "
                  f"{ratio(npu):>6} {cell(cpu, 'ours') + ' / ' + cell(cpu, 'incumbent'):>24} "
                  f"{ratio(cpu):>6} {cell(arena, 'ours') + ' / ' + cell(arena, 'incumbent'):>18} "
                  f"{cell(size, 'ours') + ' / ' + cell(size, 'incumbent'):>20}  {outputs}",
                  flush=True)
            reasons += [f"{model} {name}: {note}" for note in data["notes"]]
    if args.firmware:
        print("\nrelease images (compare --firmware): flash and RAM without the stack from the "
              "linker maps; stack high-water measured on QEMU (CPU-only targets)")
        print(f"{'model':24} {'target':8} {'flash B ours/inc':>22} {'ratio':>6} "
              f"{'code B ours/inc':>20} {'ratio':>6} {'RAM B ours/inc':>20} {'ratio':>6} "
              f"{'stack B ours/inc':>18}")
        for data in everything:
            figures = {f["figure"]: f for f in data["figures"]}
            flash = figures.get("release flash bytes")
            code = figures.get("release code bytes (flash less the model)")
            ram = figures.get("release RAM bytes (without the stack)")
            stack = figures.get("release stack high-water bytes")
            model, name = data["cell"]
            print(f"{model:24} {name:8} "
                  f"{cell(flash, 'ours') + ' / ' + cell(flash, 'incumbent'):>22} "
                  f"{ratio(flash):>6} {cell(code, 'ours') + ' / ' + cell(code, 'incumbent'):>20} "
                  f"{ratio(code):>6} {cell(ram, 'ours') + ' / ' + cell(ram, 'incumbent'):>20} "
                  f"{ratio(ram):>6} {cell(stack, 'ours') + ' / ' + cell(stack, 'incumbent'):>18}")
    for reason in reasons:
        print(f"  {reason}")
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
