"""Compile time of `orchestrate compile` against the plain upstream flow, run side by side.

For each case (a model and a target) and cache setting, the two flows run in turn in child
processes of this one (upstream, orchestrate, upstream, orchestrate, ...; `--before TREE` adds a
third: `orchestrate compile` from another checkout, e.g. a git worktree of the commit before a
change), and each ratio is taken pair by pair, so a machine that slows down during the run
moves both sides of a pair alike. Printed per case: wall and CPU seconds (user + system of the
child and its children) as paired median [min, max] of orchestrate / upstream, and where the
time goes, stage by stage:

    setup      interpreter start, imports, model load, writing the outputs (wall minus stages)
    export     torch.export of the float model            (ours: capture)
    quantize   prepare, calibrate, convert, export again  (ours: quantize)
    lower      to_edge_transform_and_lower: TOSA + Vela   (ours: lower)
    route_cpu  CortexMPassManager                         (ours: quantize_io .. prune_constants)
    device     the run in the host build of the runtime, with its serialization (ours only)
    serialize  to_executorch and the .pte                 (ours: serialize, choose_io)
    planning   PLAN_STAGES: Vela figures, device faults, memory, costs (ours only)

The upstream flow is benchmarks/upstream_flow.py (written from ExecuTorch's test harness).
"cache off" sets ORCHESTRATE_CACHE=off; "default" leaves the capture/quantization cache on,
warmed by one run before the timed ones. Nothing is asserted: these are measurements, read
against a baseline measured in the same session.

    python benchmarks/compile_speed.py                          # the issue's five rows, 3 pairs
    python benchmarks/compile_speed.py --cases zoo --repeat 3   # every zoo model, U55 and M55
    python benchmarks/compile_speed.py --cases ds-cnn:u55 --cache off --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS_FILE = ROOT / "benchmarks" / "compile_speed_models.py"
TARGETS = {"u55": ["--npu", "ethos-u55-128"], "m55": ["--npu", "none", "--cpu", "cortex-m55"]}
ZOO = ("ds-cnn", "resnet8", "mobilenet-v1-025", "deep-autoencoder", "person-detector", "mixed")
EXTRA = {"gru-kws25": f"{MODELS_FILE}:gru_kws25", "stack200": f"{MODELS_FILE}:stack200"}
DEFAULT_CASES = ("ds-cnn:u55", "resnet8:u55", "ds-cnn:m55")
CATEGORIES = ("setup", "export", "quantize", "lower", "route_cpu", "device", "serialize",
              "planning")
OURS = {"capture": "export", "quantize": "quantize", "lower": "lower",
        "quantize_io": "route_cpu", "route_cpu": "route_cpu", "check_boundaries": "route_cpu",
        "place": "route_cpu", "prune_constants": "route_cpu", "run_on_device": "device",
        "serialize": "serialize", "choose_io": "serialize"}  # every other stage: planning
STAGE_LINE = re.compile(r"^\[\s*[\d.]+s\] (\w+) done \(([\d.]+)s\)$", re.M)


def _run(argv: list[str], env: dict, cwd: Path) -> tuple[float, float, str, str]:
    """Wall and CPU seconds of one child (and the children it waited for), its output."""
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = os.times()
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system
                                                          - before.children_system)
    return wall, cpu, done.stdout, done.stderr


def _ours(tree: Path, model: str, target: str, env: dict, out: Path):
    argv = [sys.executable, "-m", "orchestrator.cli", "compile", model, *TARGETS[target],
            "-o", str(out)]
    env = {**env, "PYTHONPATH": str(tree)}
    wall, cpu, _, stderr = _run(argv, env, tree)
    stages = {c: 0.0 for c in CATEGORIES}
    for stage, seconds in STAGE_LINE.findall(stderr):
        stages[OURS.get(stage, "planning")] += float(seconds)
    stages["setup"] = wall - sum(stages.values())
    return wall, cpu, stages


def _upstream(model: str, target: str, env: dict, out: Path):
    npu = TARGETS[target][1]
    argv = [sys.executable, str(ROOT / "benchmarks" / "upstream_flow.py"), model, "--npu", npu,
            "-o", str(out)]
    wall, cpu, stdout, _ = _run(argv, env, ROOT)
    phases = json.loads(stdout.strip().splitlines()[-1])["phases"]
    stages = {c: phases.get(c, 0.0) for c in CATEGORIES}
    stages["setup"] = wall - sum(v for k, v in stages.items() if k != "setup")
    return wall, cpu, stages


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):5.2f} [{min(values):.2f}, {max(values):.2f}]"


def _case(name: str, target: str, cache: str, repeat: int, before: Path | None) -> dict:
    model = EXTRA.get(name, name)
    env = dict(os.environ)
    if cache == "off":
        env["ORCHESTRATE_CACHE"] = "off"
    arms = {"upstream": lambda out: _upstream(model, target, env, out),
            "orchestrate": lambda out: _ours(ROOT, model, target, env, out)}
    if before is not None:
        arms["before"] = lambda out: _ours(before, model, target, env, out)
    runs: dict[str, list] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="compile-speed-") as scratch:
        if cache == "default":  # warm the cache for each orchestrate arm
            for arm in arms:
                if arm != "upstream":
                    arms[arm](Path(scratch) / f"warm-{arm}.pte")
        for i in range(repeat):
            order = list(arms) if i % 2 == 0 else list(reversed(arms))
            for arm in order:
                runs[arm].append(arms[arm](Path(scratch) / f"{arm}.pte"))
    return runs


def _report(title: str, runs: dict) -> None:
    up = runs["upstream"]
    print(f"\n{title}  ({len(up)} pairs; seconds: median [min, max])")
    for arm in [a for a in runs if a != "upstream"]:
        ours = runs[arm]
        wall = [a[0] / b[0] for a, b in zip(ours, up)]
        cpu = [a[1] / b[1] for a, b in zip(ours, up)]
        print(f"  {arm:11s} / upstream  wall {_spread(wall)}x   cpu {_spread(cpu)}x   "
              f"(wall {statistics.median(a[0] for a in ours):.1f}s vs "
              f"{statistics.median(b[0] for b in up):.1f}s)")
    header = "  stage      " + "".join(f"{arm:>24s}" for arm in runs) + "   paired ratio(s)"
    print(header)
    for category in CATEGORIES:
        cells, ratios = [], []
        for arm in runs:
            cells.append(f"{_spread([r[2][category] for r in runs[arm]]):>24s}")
        for arm in [a for a in runs if a != "upstream"]:
            pairs = [(a[2][category], b[2][category]) for a, b in zip(runs[arm], up)]
            if all(b > 0.05 for _, b in pairs):
                ratios.append(f"{arm} {statistics.median(a / b for a, b in pairs):.2f}x")
            else:
                ratios.append(f"{arm} +{statistics.median(a - b for a, b in pairs):.2f}s")
        print(f"  {category:10s} " + "".join(cells) + "   " + ", ".join(ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES),
                        help="MODEL:TARGET,... (TARGET u55 or m55; MODEL a zoo name, gru-kws25 "
                             "or stack200), or 'zoo' (every zoo model on both) or 'all'")
    parser.add_argument("--cache", default="off,default", help="off, default or both")
    parser.add_argument("--repeat", type=int, default=3, help="pairs per case")
    parser.add_argument("--before", type=Path, help="another checkout to time as a third arm")
    args = parser.parse_args()
    if args.cases in ("zoo", "all"):
        names = ZOO + (tuple(EXTRA) if args.cases == "all" else ())
        cases = [(m, t) for m in names for t in TARGETS]
    else:
        cases = [tuple(c.split(":")) for c in args.cases.split(",")]
    for model, target in cases:
        for cache in args.cache.split(","):
            runs = _case(model, target, cache, args.repeat, args.before)
            _report(f"{model} {target}, cache {cache}", runs)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
