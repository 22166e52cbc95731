"""Streaming against re-running the window: the cost of one new frame.

    python benchmarks/streaming.py [--targets m55,m4,u55-128,u85-256] [--work DIR] [--json F]

A keyword spotter that runs on every new feature frame can be deployed two ways with the same
weights (examples/streaming.py):

- streaming (`kws`): one 1x40x1 frame per call, the past in the program's state (causal
  convolutions' ring buffers, a running mean), every past frame's work done once;
- stateless (`kws_window`): the whole 15-frame receptive field per call, every frame recomputed
  on every call.

Each cell compiles both with `orchestrate compile` and runs `orchestrate verify --qemu` (the
CPU's instructions per inference, counted by QEMU -icount, a lower bound on cycles, not cycles;
on an NPU target the NPU side runs on the Ethos-U functional model), and reads the NPU cycles
from Vela's summary of each partition (Vela estimate). It prints per-frame figures and the
ratio streaming / stateless, both measured in this session.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"m55": ["--npu", "none"],
           "m4": ["--npu", "none", "--cpu", "cortex-m4"],
           "u55-128": ["--npu", "ethos-u55-128"],
           "u85-256": ["--platform", "corstone320", "--npu", "ethos-u85-256"]}
FORMS = {"streaming": "examples/streaming.py:kws", "stateless": "examples/streaming.py:kws_window"}


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=ROOT,
                          capture_output=True, text=True)


def _npu_cycles(artifacts: Path) -> int | None:
    """Vela's cycles_npu summed over the program's partitions (Vela estimate)."""
    summaries = sorted(artifacts.glob("partitions/*/vela/*_summary_*.csv"))
    if not summaries:
        return None
    return sum(int(float(row["cycles_npu"])) for path in summaries
               for row in csv.DictReader(path.open()))


def _cell(form: str, target: str, work: Path) -> dict:
    pte = work / f"{form}-{target}.pte"
    compiled = _run(["compile", FORMS[form], "-o", str(pte), *TARGETS[target], "--quiet"])
    if compiled.returncode:
        return {"form": form, "target": target, "error": compiled.stderr.strip()[-300:]}
    verified = _run(["verify", str(pte), "--qemu"])
    text = verified.stdout + verified.stderr
    found = re.search(r"([\d,]+) instructions per inference", text)
    plan = json.loads((work / f"{form}-{target}.artifacts" / "plan.json").read_text())
    state = plan["summary"]["memory"].get("state")
    return {"form": form, "target": target, "verify_exit": verified.returncode,
            "instructions": int(found.group(1).replace(",", "")) if found else None,
            "instructions_source": "measured: QEMU -icount, CPU instructions per inference",
            "npu_cycles": _npu_cycles(work / f"{form}-{target}.artifacts"),
            "npu_cycles_source": "Vela estimate (cycles_npu, summed over partitions)",
            "pte_bytes": pte.stat().st_size,
            "arena_bytes": plan["summary"]["memory"]["arena_bytes"],
            "state_bytes": state["bytes"] if state else 0}


def _ratio(a, b) -> str:
    return f"{a / b:.3f}" if a and b else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--work", type=Path, default=Path("streaming-bench"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    cells = []
    print(f"{'target':<9} {'form':<10} {'instructions':>13} {'NPU cycles':>11} {'.pte B':>8} "
          f"{'arena B':>8} {'state B':>8}  verify")
    for target in args.targets.split(","):
        pair = {}
        for form in FORMS:
            cell = pair[form] = _cell(form, target, args.work)
            cells.append(cell)
            if "error" in cell:
                print(f"{target:<9} {form:<10} compile failed: {cell['error']}")
                continue
            print(f"{target:<9} {form:<10} {cell['instructions'] or 0:>13,} "
                  f"{cell['npu_cycles'] or 0:>11,} {cell['pte_bytes']:>8,} "
                  f"{cell['arena_bytes']:>8,} {cell['state_bytes']:>8,}  "
                  f"{'PASS' if cell['verify_exit'] == 0 else 'exit %d' % cell['verify_exit']}")
        s, w = pair["streaming"], pair["stateless"]
        if "error" not in s and "error" not in w:
            print(f"{target:<9} {'ratio':<10} {_ratio(s['instructions'], w['instructions']):>13} "
                  f"{_ratio(s['npu_cycles'], w['npu_cycles']):>11}  (streaming / stateless)")
    if args.json:
        args.json.write_text(json.dumps(cells, indent=1) + "\n")
    return 0 if all("error" not in c and c["verify_exit"] == 0 for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
