"""int16 conv and linear on the CPU: our CMSIS-NN s16 operators against the float fallback, on
QEMU's Cortex-M55 (instructions per inference, QEMU -icount: not cycles) beside each program's
.pte and arena bytes.

    python benchmarks/s16_operators.py [--out DIR]

Each model is compiled twice for the U55-128 with its `conv` and `proj` modules raised to a16w8
and forced to the CPU: once as `compile` does (the s16 operators), once with
ORCHESTRATE_NO_S16_OPERATORS=1 (the float portable fallback, its weights folded to float: the
ExecuTorch sources have no kernel for the runtime `dequantize_per_channel` it would need). Both
must pass `verify --qemu` (byte-exact against the twin).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

MODELS = ("tests/precision_models.py:conv_gram_linear", "tests/s16_models.py:wide_conv_linear")
POLICY = "force_cpu:\n  modules: [conv, proj]\n"


def _run(argv: list[str], env: dict | None = None, check: bool = True) -> str:
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], capture_output=True,
                          text=True, env=env)
    if check and done.returncode != 0:
        raise SystemExit(f"orchestrate {' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for the programs (default: a temporary one)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="s16-"))
    out.mkdir(parents=True, exist_ok=True)
    policy = out / "cpu.yaml"
    policy.write_text(POLICY)
    rows = []
    for model in MODELS:
        name = model.split(":")[1]
        for variant, env in (("s16 operators", None),
                             ("float fallback", {**os.environ, "ORCHESTRATE_NO_S16_OPERATORS": "1"})):
            pte = out / f"{name}_{variant.split()[0]}.pte"
            compiled = _run(["compile", model, "--npu", "ethos-u55-128", "--precision",
                             "conv=a16w8,proj=a16w8", "--policy", str(policy), "-o", str(pte)],
                            env)
            arena = re.search(r"arena ([\d,]+) B", compiled).group(1)
            # The float fallback need not be byte-exact: the M55's float conv sums in another
            # order than the host's (one int16 step on wide_conv_linear, measured).
            verified = _run(["verify", str(pte), "--samples", "4", "--qemu"], check=False)
            counted = re.search(r"([\d,]+) instructions(?: per inference|\b)", verified)
            mismatch = re.search(r"(\d+ of \d+ elements differ, max abs error [\d.e-]+)",
                                 verified)
            rows.append((name, variant, counted.group(1) if counted else "-",
                         f"{pte.stat().st_size:,}", arena,
                         "PASS" if re.search(r"^verify --qemu .*: PASS$", verified, re.M) else
                         f"FAIL ({mismatch.group(1) if mismatch else 'see verify'})"))
    print(tabulate(rows, headers=("model", "int16 conv/linear", "QEMU instructions/inference",
                                  ".pte B", "arena B", "verify --qemu")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
