"""Hybrid CPU + Ethos-U programs on the Corstone-300 in QEMU: the runner firmware with the real
EthosUBackend and Ethos-U core driver, each NPU invocation handed over semihosting to the
functional model (checked byte for byte against the partition's TOSA graph), BundleIO against
expected outputs computed with the TOSA graphs.

    python benchmarks/qemu_hybrid.py [--npu ethos-u55-128] [--models ds-cnn,resnet8] [--out DIR]

Per model: verdict, CPU instructions per inference (QEMU -icount: CPU only, not cycles, no NPU
time), NPU invocations and commands over the run (4 BundleIO cases), and wall times of the
compile and the QEMU run (firmware built or found in the cache).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

MODELS = ("ds-cnn", "mobilenet-v1-025", "resnet8", "deep-autoencoder", "person-detector",
          "mixed")


def _run(argv: list[str]) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], capture_output=True,
                          text=True)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npu", default="ethos-u55-128")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", help="folder for the programs (default: a temporary one)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="qemu-hybrid-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models.split(","):
        pte = out / f"{model.replace('/', '_').replace(':', '_')}.pte"
        code, text, compile_s = _run(["compile", model, "--npu", args.npu, "-o", str(pte),
                                      "--quiet"])
        if code != 0:
            rows.append([model, f"not compiled (exit {code}): {text.strip().splitlines()[-1]}",
                         "-", "-", "-", f"{compile_s:.0f}", "-"])
            continue
        code, text, run_s = _run(["verify", str(pte), "--qemu"])
        instructions = re.search(r"([\d,]+) instructions per inference", text)
        npu = re.search(r"npu: (\d+) invocation\(s\), ([\d,]+) NPU commands", text)
        verdict = {0: "PASS", 4: "FAIL", 5: "not run"}.get(code, f"exit {code}")
        if code != 0:
            verdict += ": " + text.strip().splitlines()[-1][:120]
        rows.append([model, verdict, instructions[1] if instructions else "-",
                     npu[1] if npu else "-", npu[2] if npu else "-", f"{compile_s:.0f}",
                     f"{run_s:.0f}"])
        print(f"{model}: {verdict}", file=sys.stderr, flush=True)
    print(f"hybrid programs on {args.npu}, Corstone-300 runner in QEMU + functional model")
    print(tabulate(rows, ["model", "verify --qemu", "CPU instr./inference (QEMU -icount)",
                          "NPU invocations", "NPU commands (run)", "compile s",
                          "verify --qemu s"], disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
