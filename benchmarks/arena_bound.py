"""Activation arenas against their lower bound: per zoo model and target, the arena upstream's
`greedy` planner alone would plan, the arena compiled (platforms/arena_planning.py:
plan_buffers, the smaller of greedy and the lifetime planner), the live-bytes bound (the peak
over instructions of the aligned bytes live there, summed over the planned buffers) and
compiled/bound. All figures are measured on the compile's own memory plan.

    python benchmarks/arena_bound.py [--models ds-cnn,...] [--targets cpu-m55-int8,...]
    python benchmarks/arena_bound.py --user-families [--targets ...]   # examples/user_models.py

A compile that refuses (a family a target cannot run) is listed with its one-line reason.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orchestrator  # noqa: E402,F401 - pins host numerics before torch is imported
from examples.zoo import zoo_names  # noqa: E402

# name -> (platform, npu, cpu, io)
TARGETS = {"cpu-m55": ("corstone300", "none", "cortex-m55", "float"),
           "cpu-m55-int8": ("corstone300", "none", "cortex-m55", "int8"),
           "u55-128": ("corstone300", "ethos-u55-128", None, "float"),
           "u85-256": ("corstone320", "ethos-u85-256", None, "float")}


def arena_figures(compiled) -> tuple[int, int, int]:
    """(upstream greedy bytes, compiled bytes, live-bytes bound), summed over the arenas."""
    arenas = compiled.arenas
    return (sum(a.greedy_bytes for a in arenas), sum(a.bytes for a in arenas),
            sum(a.bound_bytes for a in arenas))


def main() -> None:
    from tabulate import tabulate

    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.errors import OrchestrateError
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(zoo_names()))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--user-families", action="store_true",
                        help="the families of examples/user_models.py instead of the zoo")
    args = parser.parse_args()
    names = args.models.split(",")
    if args.user_families:
        from examples.user_models import USER_MODELS, model_spec

        names = [model_spec(family) for family in USER_MODELS]
    rows = []
    for name in names:
        model = load_model(name)
        calibration = load_calibration(None, model.example_inputs)
        for target_name in args.targets.split(","):
            platform, npu, cpu, io = TARGETS[target_name]
            started = time.perf_counter()
            label = name.rsplit(":", 1)[-1]
            try:
                compiled = compile_model(model, calibration,
                                         resolve_target(platform, npu=npu, cpu=cpu, io=io))
            except OrchestrateError as error:
                rows.append([label, target_name, "-", "-", "-", "-", "-",
                             f"refused: {str(error)[:120]}", "-"])
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
                continue
            greedy, ours, bound = arena_figures(compiled)
            rows.append([label, target_name, f"{greedy:,}", f"{ours:,}", f"{bound:,}",
                         f"{ours / bound:.3f}" if bound else "-",
                         f"{greedy / bound:.3f}" if bound else "-",
                         "; ".join(a.planner for a in compiled.arenas),
                         f"{time.perf_counter() - started:.1f}"])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(tabulate(rows, ["model", "target", "greedy B", "arena B", "bound B", "arena/bound",
                          "greedy/bound", "planner", "compile s"], tablefmt="github",
                   disable_numparse=True))


if __name__ == "__main__":
    main()
