"""`--placement cost` against greedy on the zoo and the user models, by the cost model.

One line per model: greedy's whole-program estimate, the chosen one, the ratio chosen/greedy,
the Vela memory mode when cost placement chose another than the platform's, average pools it
computed over their one window so the NPU takes them, and what moved (each decision with its
delta; figures are estimates: Vela's cycles for NPU rows, our CPU model for CPU rows, the
transition model for hand-overs). Cost placement keeps a move
only when the recompiled program's estimate drops, so no ratio is above 1.00; a ratio of 0.95 or
less is the issue's "at least 5% better". Nothing is timed; the figures are the plan's.

    python benchmarks/cost_placement.py [--npu ethos-u55-128] [--models ds-cnn,sensor_mlp,...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.user_models import USER_MODELS, model_spec  # noqa: E402

ZOO = ("ds-cnn", "mobilenet-v1-025", "resnet8", "deep-autoencoder", "person-detector", "mixed")


def main() -> None:
    import orchestrator
    from orchestrator.errors import OrchestrateError

    parser = argparse.ArgumentParser()
    parser.add_argument("--npu", default="ethos-u55-128")
    parser.add_argument("--models", default=",".join((*ZOO, *USER_MODELS)))
    args = parser.parse_args()
    print(f"--placement cost vs greedy on {args.npu}, whole-program estimates (Vela + CPU and "
          "transition models)", flush=True)
    print(f"{'model':<27} {'greedy ms':>10} {'chosen ms':>10} {'ratio':>6}  moved", flush=True)
    for name in args.models.split(","):
        spec = name if name in ZOO else model_spec(name)
        try:
            plan = orchestrator.plan(spec, npu=args.npu, placement="cost")
        except OrchestrateError as error:
            print(f"{name:<27} refused: {str(error).splitlines()[0][:110]}", flush=True)
            continue
        placement = plan.cost_placement
        if placement is None:
            print(f"{name:<27} no NPU partition", flush=True)
            continue
        moved = [d for d in placement.decisions if d.moved]
        what = "; ".join(f"p{d.partition} {d.part} ({len(d.nodes)} ops) "
                         f"{d.delta_seconds * 1e3:+.3f} ms" for d in moved)
        if placement.windows is not None and placement.windows.chosen:
            pools = ", ".join(placement.windows.pools)
            what = "; ".join(x for x in (f"{pools} over its window on the NPU", what) if x)
        if placement.memory is not None and placement.memory.chosen:
            what = "; ".join(x for x in (f"Vela {placement.memory.to_mode}", what) if x)
        what = what or "-"
        ratio = placement.chosen_seconds / placement.greedy_seconds \
            if placement.greedy_seconds else 1.0
        print(f"{name:<27} {placement.greedy_seconds * 1e3:10.3f} "
              f"{placement.chosen_seconds * 1e3:10.3f} {ratio:6.3f}  {what}", flush=True)


if __name__ == "__main__":
    main()
