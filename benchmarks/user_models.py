"""Every model of `examples/user_models.py` on U55-128, CPU-only Cortex-M55 and U85-256, through
the commands a user runs: `orchestrate compile --bundle`, `verify` (the twin), `verify --runtime
executorch` (the real runtime with the device kernels built for the host) and, for CPU-only
programs, `verify --qemu` (the Corstone-300 runner firmware on QEMU's Cortex-M55).

One line per (model, target): whether it compiled (or the one line it was refused with, and its
exit code), which methods ran and their verdicts, and the MACs on NPU / CMSIS-NN / portable from
the compile's plan.json (cost model's MAC count per op). A method that could not run says
"not run" (exit 5). Nothing is timed here; compile seconds are wall time, for orientation.

    python benchmarks/user_models.py [--models a,b] [--targets u55,cpu,u85] [--samples 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.user_models import USER_MODELS, model_spec  # noqa: E402

TARGETS = {"u55": ("corstone300", "ethos-u55-128", None),
           "u65": ("corstone300", "ethos-u65-256", None),
           "u85": ("corstone320", "ethos-u85-256", None),
           "cpu": ("corstone300", "none", "cortex-m55")}
VERDICTS = {0: "PASS", 4: "FAIL", 5: "not run/partial", 2: "refused", 1: "error"}
# `verify` alone runs every method together (orchestrator/device_runs/combined.py); here each
# method runs on its own, so the table shows each one's verdict.


def _run(argv: list[str]) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], cwd=ROOT,
                          capture_output=True, text=True)
    lines = [line for line in (done.stdout + done.stderr).splitlines()
             if line.startswith("orchestrate:") or "verdict:" in line or line.startswith("PASS")
             or line.startswith("FAIL")]
    return done.returncode, (lines[-1].strip() if lines else "")


def run_case(name: str, target_key: str, out_dir: Path, samples: int) -> dict:
    platform, npu, cpu = TARGETS[target_key]
    pte = out_dir / f"{name}-{target_key}.pte"
    argv = ["compile", model_spec(name), "--platform", platform, "--npu", npu, "-o", str(pte),
            "--bundle"] + (["--cpu", cpu] if cpu else [])
    start = time.perf_counter()
    code, line = _run(argv)
    row = {"model": name, "target": npu if npu != "none" else cpu,
           "compile": "ok" if code == 0 else f"exit {code}: {line}",
           "compile_s": round(time.perf_counter() - start, 1)}
    if code != 0:
        return row
    plan = json.loads((out_dir / f"{name}-{target_key}.artifacts" / "plan.json").read_text())
    row["macs"] = plan["summary"]["macs"]
    methods = {"twin": ["verify", str(pte), "--runtime", "twin", "--samples", str(samples)],
               "runtime": ["verify", str(pte), "--runtime", "executorch", "--samples",
                           str(samples)]}
    if npu == "none":
        methods["qemu"] = ["verify", str(pte), "--qemu"]
    for method, method_argv in methods.items():
        code, line = _run(method_argv)
        row[method] = VERDICTS.get(code, f"exit {code}")
        if code not in (0,):
            row[method + "_detail"] = line[:160]
    return row


def _line(row: dict) -> str:
    head = f"{row['model']:<27} {row['target']:<14}"
    if row["compile"] != "ok":
        return f"{head} {row['compile'][:150]}"
    macs = row["macs"]
    methods = ", ".join(f"{m} {row[m]}" for m in ("twin", "runtime", "qemu") if m in row)
    return (f"{head} compiled ({row['compile_s']:5.1f} s) | MACs NPU {macs['npu']:>9,} "
            f"CMSIS-NN {macs['cmsis-nn']:>9,} portable {macs['portable']:>7,} | {methods}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--models", default=",".join(USER_MODELS))
    parser.add_argument("--targets", default="u55,cpu,u85")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    out_dir = Path(tempfile.mkdtemp(prefix="user-models-"))
    print(f"user models x targets; MACs: plan.json (cost model's count per op); methods: twin, "
          f"real runtime on the host, QEMU Cortex-M55 (CPU-only); .pte files in {out_dir}",
          flush=True)
    rows = []
    for name in args.models.split(","):
        for target_key in args.targets.split(","):
            row = run_case(name, target_key, out_dir, args.samples)
            rows.append(row)
            print(_line(row), flush=True)
            for key in ("twin_detail", "runtime_detail", "qemu_detail"):
                if key in row:
                    print(f"    {key[:-7]}: {row[key]}", flush=True)
            if args.json:  # after every row, so a long run interrupted keeps what it measured
                Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
