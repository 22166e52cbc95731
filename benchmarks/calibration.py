"""The CPU cost model against QEMU per op class: modelled vs measured instructions, as ratios, on
the fit and the validation programs, before and after the instruction calibration.

"Before" is the model's cycles taken as instructions (no instruction term: what `plan
--measured` compares today); "after" is the calibrated instruction estimate (the model's cycles
x the calibration's instructions per cycle of the row's kernel, else its op class). Measured is
instructions retired under QEMU -icount, per kernel call (the runner's trace build), never
cycles.

The split (fixed before any profile was looked at): the zoo in `orchestrate list` order and the
user models in examples/user_models.py USER_MODELS order, alternating, the first of each to the
fit set. The shipped calibration (cost_models/data/cortex-m55-qemu.yaml) is fitted to the FIT
programs only; the VALIDATE programs are never fitted to.

    python benchmarks/calibration.py                     # the saved rows (tests/data)
    python benchmarks/calibration.py --profiles DIR      # profiles in DIR: NAME.pte + NAME.etdp
    python benchmarks/calibration.py --profiles DIR --make   # first compile/profile what is missing
    python benchmarks/calibration.py --profiles DIR --save-rows tests/data/calibration_m55_rows.json

Making the profiles (what --make runs per program, CPU-only Cortex-M55 on Corstone-300; 10-60 s
of QEMU each, twice: the verdict run and the trace build):

    orchestrate compile NAME --npu none -o DIR/NAME.pte          # zoo
    orchestrate compile examples/user_models.py:NAME --npu none -o DIR/NAME.pte
    orchestrate verify DIR/NAME.pte --qemu --profile             # writes DIR/NAME.etdp

and the shipped calibration from them:

    orchestrate calibrate DIR/{FIT}.etdp --validate DIR/{VALIDATE}.etdp --cpu cortex-m55 \\
        -o cost_models/data/cortex-m55-qemu.yaml
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orchestrator  # noqa: E402,F401 - pins host numerics before torch

ZOO = ("ds-cnn", "mobilenet-v1-025", "resnet8", "deep-autoencoder", "person-detector", "mixed")
ROWS = ROOT / "tests" / "data" / "calibration_m55_rows.json"
CALIBRATION = "cortex-m55-qemu.yaml"


def split() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(fit, validate): zoo and user models alternating, each list's first to the fit set."""
    from examples.user_models import USER_MODELS

    fit, validate = [], []
    for names in (ZOO, tuple(USER_MODELS)):
        for index, name in enumerate(names):
            (fit if index % 2 == 0 else validate).append(name)
    return tuple(fit), tuple(validate)


def make(folder: Path, names) -> list[str]:
    """Compile and profile the programs of `names` missing from `folder`; the names that fail."""
    from examples.user_models import USER_MODELS

    failed = []
    for name in names:
        pte, etdp = folder / f"{name}.pte", folder / f"{name}.etdp"
        spec = f"examples/user_models.py:{name}" if name in USER_MODELS else name
        steps = [] if pte.is_file() else [["compile", spec, "--npu", "none", "-o", str(pte)]]
        if not etdp.is_file():
            steps.append(["verify", str(pte), "--qemu", "--profile"])
        made = True
        for step in steps:
            done = subprocess.run([sys.executable, "-m", "orchestrator.cli", *step], cwd=ROOT,
                                  capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or [""])[-1]
                failed.append(f"{name}: {step[0]} exit {done.returncode}: {last}")
                made = False
                break
        print(f"{name}: {'ok' if made else 'FAILED'}", file=sys.stderr, flush=True)
    return failed


def rows_from_profiles(folder: Path, names) -> dict[str, list[dict]]:
    """program -> its CPU rows aggregated per (op class, kernel): calls, model cycles, measured
    instructions (the sums the ratio-of-sums fit reads)."""
    from orchestrator import api

    found = {}
    for name in names:
        pte, etdp = folder / f"{name}.pte", folder / f"{name}.etdp"
        if not (pte.is_file() and etdp.is_file()):
            continue
        groups: dict[tuple[str, str], list[int]] = {}
        for row in api.measure(pte, etdp).cpu_rows(name):
            entry = groups.setdefault((row.op_class, row.kernel), [0, 0, 0])
            entry[0] += 1
            entry[1] += row.modelled_cycles
            entry[2] += row.measured
        found[name] = [{"class": c, "kernel": k, "calls": n, "model_cycles": m, "measured": v}
                       for (c, k), (n, m, v) in sorted(groups.items())]
    return found


def measured_rows(saved: dict[str, list[dict]], names):
    """MeasuredRows of the saved aggregates (one row per kernel group: sums fit the same)."""
    from cost_models.profile_calibration import MeasuredRow

    return [MeasuredRow(name, g["class"], g["kernel"], g["model_cycles"], g["measured"],
                        "instructions", calls=g["calls"])
            for name in names if name in saved for g in saved[name]]


def table(rows, factors, bound: float) -> list[str]:
    from cost_models.profile_calibration import class_totals

    before = {t.op_class: t for t in class_totals(rows, None)}
    lines = [f"  {'class':<12}{'calls':>6}{'model cycles':>14}{'estimate':>13}{'measured':>13}"
             f"{'before':>8}{'after':>8}  within +-{bound:.0%}"]
    for total in class_totals(rows, factors):
        ratio = total.ratio or 0.0
        lines.append(f"  {total.op_class:<12}{total.calls:>6}{total.modelled_cycles:>14,}"
                     f"{round(total.estimated):>13,}{total.measured:>13,}"
                     f"{before[total.op_class].ratio or 0:>8.3f}{ratio:>8.3f}  "
                     f"{'yes' if abs(ratio - 1) <= bound else 'NO'}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, help="folder of NAME.pte + NAME.etdp (default: "
                        f"the saved rows, {ROWS.relative_to(ROOT)})")
    parser.add_argument("--make", action="store_true", help="compile and profile the programs "
                        "missing from --profiles first")
    parser.add_argument("--save-rows", type=Path, help="write the rows read from --profiles")
    parser.add_argument("--calibration", default=CALIBRATION, help="the calibration to check "
                        f"(default: the shipped {CALIBRATION})")
    parser.add_argument("--bound", type=float, default=0.15)
    args = parser.parse_args()
    from cost_models.profile_calibration import load_calibration

    fit, validate = split()
    if args.profiles:
        if args.make:
            for line in make(args.profiles, (*fit, *validate)):
                print(f"not made: {line}")
        saved = rows_from_profiles(args.profiles, (*fit, *validate))
        if args.save_rows:
            args.save_rows.write_text(json.dumps(
                {"note": "CPU-only Cortex-M55 (Corstone-300) programs profiled with `orchestrate "
                         "verify --qemu --profile`: per program, its kernel calls summed per (op "
                         "class, kernel); measured = instructions retired, QEMU -icount "
                         "(benchmarks/calibration.py --save-rows)",
                 "fit": list(fit), "validate": list(validate), "programs": saved},
                indent=1) + "\n")
            print(f"wrote {args.save_rows}")
    else:
        saved = json.loads(ROWS.read_text())["programs"]
    calibration = load_calibration(args.calibration)
    factors = calibration.factors["instructions"]
    print(f"calibration {calibration.name} ({calibration.core}), instructions per modelled "
          "cycle fitted by ratio of sums per kernel, else op class")
    print("before = model cycles / measured instructions (no instruction term); after = the "
          "calibrated instruction estimate / measured instructions; measured = instructions "
          "retired, QEMU -icount")
    for label, names in (("fit", fit), ("validate (never fitted to)", validate)):
        present = [n for n in names if n in saved]
        missing = [n for n in names if n not in saved]
        print(f"\n{label}: {len(present)} programs: {', '.join(present)}"
              + (f"; no profile: {', '.join(missing)}" if missing else ""))
        print("\n".join(table(measured_rows(saved, present), factors, args.bound)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
