"""The CPU cost model against QEMU per op class: modelled vs measured instructions, as ratios, on
the fit and the validation programs, before and after the instruction calibration.

"Before" is the model's cycles taken as instructions (no instruction term); "ratio" is the format
/1 calibration (one ratio of sums per kernel, else op class) refitted to the same fit rows;
"after" is the shipped calibration (a per-call term and the work each kernel repeats, per kernel,
else op class: cost_models/profile_calibration.py). Measured is
instructions retired under QEMU -icount, per kernel call (the runner's trace build), never
cycles.

The split (fixed before any profile was looked at): the zoo in `orchestrate list` order, the
user models in examples/user_models.py USER_MODELS order and the calibration variants below
(VARIANTS), each list alternating, its first to the fit set. The shipped calibration (cost_models/data/cortex-m55-qemu.yaml) is fitted to the FIT
programs only; the VALIDATE programs are never fitted to.

    python benchmarks/calibration.py                     # the saved rows (tests/data)
    python benchmarks/calibration.py --profiles DIR      # profiles in DIR: NAME.pte + NAME.etdp
    python benchmarks/calibration.py --profiles DIR --make   # first compile/profile what is missing
    python benchmarks/calibration.py --profiles DIR --save-rows tests/data/calibration_m55_rows.json

Making the profiles (what --make runs per program, CPU-only Cortex-M55 on Corstone-300; 10-60 s
of QEMU each, twice: the verdict run and the trace build):

    orchestrate compile NAME --npu none -o DIR/NAME.pte          # zoo
    orchestrate compile examples/user_models.py:NAME --npu none -o DIR/NAME.pte
    orchestrate compile benchmarks/calibration.py:NAME --npu none -o DIR/NAME.pte   # variants
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
CPU = "cortex-m55"


def rows_file(cpu: str) -> Path:
    """The saved rows of `cpu`'s profiles (tests/data/calibration_m55_rows.json, ...)."""
    return ROOT / "tests" / "data" / f"calibration_{cpu.removeprefix('cortex-')}_rows.json"


def calibration_name(cpu: str) -> str:
    """The shipped QEMU calibration of `cpu` (cost_models/data/cortex-m55-qemu.yaml, ...)."""
    return f"{cpu}-qemu.yaml"


ROWS = rows_file(CPU)
CALIBRATION = calibration_name(CPU)


def _variants() -> dict:
    """Existing user-model families at other sizes: a third list of the split, alternating
    like the others. Softmax is in no zoo model and in two user models, both validation
    programs by the split; a 3x3 max pool is in one (resnet_basic, validation), the fit's only
    max pool being crnn's 2x2. Not in examples/user_models.py: they are calibration programs,
    not user models of their own."""
    from examples.user_models import AttentionBlock, ResNetBasic, SoftmaxClassifier, _seeded

    return {"attention_block_seq8": _seeded(AttentionBlock, (1, 8, 32)),
            "attention_block_seq24": _seeded(AttentionBlock, (1, 24, 32)),
            "softmax_classifier_24": _seeded(SoftmaxClassifier, (1, 1, 24, 24)),
            "softmax_classifier_12": _seeded(SoftmaxClassifier, (1, 1, 12, 12)),
            "resnet_basic_24": _seeded(ResNetBasic, (1, 3, 24, 24))}


VARIANTS = ("attention_block_seq8", "attention_block_seq24", "softmax_classifier_24",
            "softmax_classifier_12", "resnet_basic_24")


def __getattr__(name: str):
    """`benchmarks/calibration.py:NAME` (orchestrate compile) builds the variant NAME."""
    if name in VARIANTS:
        return _variants()[name]
    raise AttributeError(name)


def split() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(fit, validate): the zoo, the user models and the calibration variants, each list
    alternating with its first to the fit set."""
    from examples.user_models import USER_MODELS

    fit, validate = [], []
    for names in (ZOO, tuple(USER_MODELS), VARIANTS):
        for index, name in enumerate(names):
            (fit if index % 2 == 0 else validate).append(name)
    return tuple(fit), tuple(validate)


def make(folder: Path, names, cpu: str = CPU) -> list[str]:
    """Compile (CPU-only for `cpu` on Corstone-300) and profile (on `cpu`'s QEMU machine) the
    programs of `names` missing from `folder`; the names that fail."""
    from examples.user_models import USER_MODELS

    failed = []
    for name in names:
        pte, etdp = folder / f"{name}.pte", folder / f"{name}.etdp"
        spec = (f"examples/user_models.py:{name}" if name in USER_MODELS else
                f"benchmarks/calibration.py:{name}" if name in VARIANTS else name)
        steps = [] if pte.is_file() else [["compile", spec, "--npu", "none", "--cpu", cpu,
                                                   "-o", str(pte)]]
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
    """program -> its CPU rows, the calls of one kernel with the same figures (modelled cycles
    and work per call) summed into one row: a least-squares fit weighted by 1/modelled cycles
    reads such a sum exactly as it reads the calls one by one."""
    from orchestrator import api
    from orchestrator.planning.calibrate import measured_rows as rows_of

    found = {}
    for name in names:
        pte, etdp = folder / f"{name}.pte", folder / f"{name}.etdp"
        if not (pte.is_file() and etdp.is_file()):
            continue
        groups: dict[tuple, list[int]] = {}
        for row in rows_of(api.measure(pte, etdp), name):
            key = (row.op_class, row.kernel, row.modelled_cycles, row.work.macs,
                   row.work.outputs, row.work.elements)
            entry = groups.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += row.measured
        found[name] = [{"class": c, "kernel": k, "calls": n, "model_cycles": m * n,
                        "macs": macs * n, "outputs": outputs * n, "elements": elements * n,
                        "measured": v}
                       for (c, k, m, macs, outputs, elements), (n, v) in sorted(groups.items())]
    return found


def measured_rows(saved: dict[str, list[dict]], names):
    """MeasuredRows of the saved rows (each the sums of its calls)."""
    from cost_models.profile_calibration import MeasuredRow, Work

    return [MeasuredRow(name, g["class"], g["kernel"], g["model_cycles"], g["measured"],
                        "instructions", calls=g["calls"],
                        work=Work(g["macs"], g["outputs"], g["elements"]))
            for name in names if name in saved for g in saved[name]]


def ratio_factors(rows):
    """The format /1 calibration refitted to `rows`: one ratio of sums (measured / modelled
    cycles) per kernel, else class, else all rows: the "ratio" column."""
    from types import MappingProxyType

    from cost_models.profile_calibration import Factors, Figure

    def ratio(group) -> Figure:
        return Figure(MappingProxyType({"model_cycles": sum(r.measured for r in group)
                                        / sum(r.modelled_cycles for r in group)}), "ratio")

    kernels = {key: ratio([r for r in rows if (r.op_class, r.kernel) == key])
               for key in {(r.op_class, r.kernel) for r in rows}}
    classes = {name: ratio([r for r in rows if r.op_class == name])
               for name in {r.op_class for r in rows}}
    return Factors("instructions", kernels, classes, ratio(rows))


def table(rows, factors, ratio, bound: float) -> list[str]:
    from cost_models.profile_calibration import class_totals

    before = {t.op_class: t for t in class_totals(rows, None)}
    by_ratio = {t.op_class: t for t in class_totals(rows, ratio)}
    lines = [f"  {'class':<12}{'calls':>6}{'model cycles':>14}{'estimate':>13}{'measured':>13}"
             f"{'before':>8}{'ratio':>8}{'after':>8}  within +-{bound:.0%}"]
    for total in class_totals(rows, factors):
        after = total.ratio or 0.0
        lines.append(f"  {total.op_class:<12}{total.calls:>6}{total.modelled_cycles:>14,}"
                     f"{round(total.estimated):>13,}{total.measured:>13,}"
                     f"{before[total.op_class].ratio or 0:>8.3f}"
                     f"{by_ratio[total.op_class].ratio or 0:>8.3f}{after:>8.3f}  "
                     f"{'yes' if abs(after - 1) <= bound else 'NO'}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", default=CPU, help=f"the core (default {CPU}): its programs, "
                        "its saved rows (tests/data/calibration_<core>_rows.json) and its "
                        "shipped calibration (<cpu>-qemu.yaml)")
    parser.add_argument("--profiles", type=Path, help="folder of NAME.pte + NAME.etdp (default: "
                        "the saved rows of --cpu)")
    parser.add_argument("--make", action="store_true", help="compile and profile the programs "
                        "missing from --profiles first")
    parser.add_argument("--save-rows", type=Path, help="write the rows read from --profiles")
    parser.add_argument("--calibration", help="the calibration to check (default: the shipped "
                        "<cpu>-qemu.yaml)")
    parser.add_argument("--bound", type=float, default=0.15)
    args = parser.parse_args()
    from cost_models.profile_calibration import load_calibration

    fit, validate = split()
    args.calibration = args.calibration or calibration_name(args.cpu)
    if args.profiles:
        if args.make:
            args.profiles.mkdir(parents=True, exist_ok=True)
            for line in make(args.profiles, (*fit, *validate), args.cpu):
                print(f"not made: {line}")
        saved = rows_from_profiles(args.profiles, (*fit, *validate))
        if args.save_rows:
            args.save_rows.write_text(json.dumps(
                {"note": f"CPU-only {args.cpu} (Corstone-300) programs profiled with `orchestrate "
                         "verify --qemu --profile`: per program, the calls of one kernel with "
                         "the same figures per call summed (calls, model cycles, macs, outputs, "
                         "elements, measured); measured = instructions retired, QEMU -icount "
                         "(benchmarks/calibration.py --save-rows)",
                 "fit": list(fit), "validate": list(validate), "programs": saved},
                indent=1) + "\n")
            print(f"wrote {args.save_rows}")
    else:
        saved = json.loads(rows_file(args.cpu).read_text())["programs"]
    calibration = load_calibration(args.calibration)
    factors = calibration.factors["instructions"]
    ratio = ratio_factors(measured_rows(saved, fit))
    print(f"calibration {calibration.name} ({calibration.core}): instructions = a per-call "
          "term + the work each kernel repeats, per kernel, else op class (cost_models/"
          "profile_calibration.py)")
    print("ratios are estimate / measured instructions (measured: instructions retired, QEMU "
          "-icount). before: the model's cycles taken as instructions; ratio: format /1, one "
          "ratio of sums per kernel refitted to the fit rows; after: this calibration")
    for label, names in (("fit", fit), ("validate (never fitted to)", validate)):
        present = [n for n in names if n in saved]
        missing = [n for n in names if n not in saved]
        print(f"\n{label}: {len(present)} programs: {', '.join(present)}"
              + (f"; no profile: {', '.join(missing)}" if missing else ""))
        print("\n".join(table(measured_rows(saved, present), factors, ratio, args.bound)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
