"""Release firmware for the MLPerf Tiny models, CPU-only on the Corstone-300's Cortex-M55, next to
the check runner `verify --qemu` uses.

For each model: `orchestrate compile --npu none`, `orchestrate firmware --run` (release profile,
built with CMake, run on QEMU and compared byte for byte with the host twin), `orchestrate size
--firmware` (flash and RAM from the linker map, stack measured on QEMU), and the check runner
built for the same operators (its .text from arm-none-eabi-size). With `--no-lto` the release
build is also made without link-time optimization, whose map attributes every byte to the
object it came from (the runtime core's own size).

    python benchmarks/firmware.py [--models ds-cnn,resnet8] [--io float|int8] [--no-lto]

Figures: bytes from the linker map (map) or arm-none-eabi-size (size); stack and instructions
measured on QEMU (-icount: instructions, not cycles). Nothing here is timed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.firmware import load_record, make_firmware, firmware_run_lines  # noqa: E402
from orchestrator.firmware.footprint import footprint  # noqa: E402
from kernels.native.operators import read_operators  # noqa: E402
from platforms.firmware_recipe import build_firmware  # noqa: E402

MODELS = ("ds-cnn", "mobilenet-v1-025", "resnet8", "deep-autoencoder")


def _compile(model: str, out: Path, io: str) -> Path:
    pte = out / f"{model}.pte"
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "compile", model,
                           "--platform", "corstone300", "--npu", "none", "--io", io,
                           "-o", str(pte), "--quiet"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{model}: compile failed: {done.stderr.strip().splitlines()[-1:]}")
    return pte


def _row(model: str, pte: Path, out: Path, lto: bool) -> dict:
    folder = out / f"{model}-{'lto' if lto else 'nolto'}"
    result = make_firmware(pte, folder, profile="release", lto=lto)
    lines, passed = firmware_run_lines(folder, pte)
    stack = next((int(part.split()[0].replace(",", "")) for line in lines
                  for part in line.split("stack high-water ")[1:]), None)
    measured = footprint(folder, stack)
    components = measured.components
    return {
        "model": model, "lto": lto, "matches_twin": passed,
        "pte": measured.pte_bytes, "code": measured.code_bytes(),
        "runtime_core": components.get("runtime core", {}).get("code", 0),
        "kernels": sum(components.get(name, {}).get("code", 0) for name in
                       ("portable kernels", "cortex_m kernels", "CMSIS-NN", "kernel registration",
                        "prim ops")),
        "flash": measured.flash_bytes, "stack_used": stack,
        "arenas": sum(p["bytes"] for p in result.record["memory"]["planned"]),
        "weights_copy": result.record["memory"]["weights_bytes"],
        "method_pool": result.record["memory"]["method_pool_bytes"],
        "run": lines[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--io", default="float", choices=("float", "int8"))
    parser.add_argument("--no-lto", action="store_true",
                        help="also build each release without link-time optimization")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="orchestrate-firmware-bench-") as temp:
        out = Path(temp)
        for model in args.models.split(","):
            pte = _compile(model, out, args.io)
            runner = build_firmware(read_operators(pte.parent / f"{model}.artifacts" /
                                                   "operators.txt"), "corstone300")
            for lto in (True, False) if args.no_lto else (True,):
                row = _row(model, pte, out, lto)
                row["check_runner_text"] = runner.text_bytes
                rows.append(row)
                print(json.dumps(row), flush=True)
    print()
    print(f"release firmware, CPU-only Cortex-M55 (Corstone-300), --io {args.io}; bytes from the "
          "linker map, stack measured on QEMU; check runner .text from arm-none-eabi-size")
    header = (f"{'model':<18} {'LTO':>3} {'.pte':>8} {'code':>8} {'runtime':>8} {'kernels':>8} "
              f"{'flash':>8} {'stack':>6} {'arenas':>7} {'twin':>6} {'runner .text':>12} {'ratio':>6}")
    print(header)
    for row in rows:
        print(f"{row['model']:<18} {'yes' if row['lto'] else 'no':>3} {row['pte']:>8,} "
              f"{row['code']:>8,} {row['runtime_core']:>8,} {row['kernels']:>8,} "
              f"{row['flash']:>8,} {row['stack_used'] or 0:>6,} {row['arenas']:>7,} "
              f"{'equal' if row['matches_twin'] else 'DIFF':>6} {row['check_runner_text']:>12,} "
              f"{row['code'] / row['check_runner_text']:>6.2f}")
    return 0 if all(row["matches_twin"] for row in rows) else 4


if __name__ == "__main__":
    sys.exit(main())
