"""The Ethos-U85 functional model (npu_driver/ethos_u/u85_machine.py) against the TOSA reference
model on every NPU partition of the zoo models and the user-model families, on each U85
configuration.

Each (model, U85) is compiled for the Corstone-320 with `orchestrate compile` (kept in --work and
reused when present), then each NPU partition runs on the same seeded random inputs (the whole
int8 range) through the U85 model (the command stream and weight streams in the .pte) and the
TOSA reference model (the partition's TOSA graph), as benchmarks/npu_model.py does for the
U55/U65 (its `run_partition_row`). One line per partition (commands, MACs, byte-exact or the
refusal naming the command and its word offset, model and TOSA milliseconds for the first
sample, the ratio, and the median ratio of the later samples), then per configuration: the
partitions executed byte-exact out of all, their commands and MACs per inference, and the
model's time per inference against the TOSA reference model's on those partitions.

    python benchmarks/u85_model.py [--models ds-cnn,unet_small,...]
        [--npus ethos-u85-128,ethos-u85-256,ethos-u85-512,ethos-u85-2048] [--work DIR]
        [--samples 3] [--zoo-only | --users-only]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from npu_model import compile_once, run_partition_row  # noqa: E402

NPUS = ("ethos-u85-128", "ethos-u85-256", "ethos-u85-512", "ethos-u85-2048")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated zoo and user model names (default: "
                                         "all of both)")
    parser.add_argument("--npus", default=",".join(NPUS))
    parser.add_argument("--work", default="/tmp/u85-model-bench",
                        help="where the .pte programs are compiled to (and reused from)")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--zoo-only", action="store_true")
    parser.add_argument("--users-only", action="store_true")
    args = parser.parse_args(argv)

    from examples.user_models import USER_MODELS, model_spec
    from examples.zoo import zoo_names
    from orchestrator.verification.twin import load_twin

    zoo = [] if args.users_only else list(zoo_names())
    users = [] if args.zoo_only else list(USER_MODELS)
    if args.models:
        wanted = args.models.split(",")
        zoo = [m for m in wanted if m not in USER_MODELS]
        users = [m for m in wanted if m in USER_MODELS]
    models = zoo + users
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    header = (f"{'model':<27} {'npu':<15} {'partition':<17} {'cmds':>5} {'MACs':>11}  "
              f"{'model ms':>8} {'TOSA ms':>8} {'ratio':>6} {'steady':>6}  byte-exact")
    summaries, differ = [], 0
    for npu in args.npus.split(","):
        print(header)
        print("-" * len(header))
        total = {"partitions": 0, "exact": 0, "commands": 0, "macs": 0, "model": 0.0,
                 "tosa": 0.0}
        for model in models:
            user = model in users
            pte = work / (f"user_{model}__{npu}.pte" if user else f"{model}__{npu}.pte")
            failure = compile_once(model_spec(model) if user else model, npu, pte,
                                   platform="corstone320")
            if failure:
                print(f"{model:<27} {npu:<15} compile {failure}")
                continue
            for partition in load_twin(pte).partitions:
                row = run_partition_row(partition, npu, args.samples)
                total["partitions"] += 1
                if row["exact"].startswith("yes"):
                    total["exact"] += 1
                    total["commands"] += row["commands"]
                    total["macs"] += row["macs"]
                    total["model"] += float(row["model_ms"])
                    total["tosa"] += float(row["tosa_ms"])
                    total.setdefault("steady", []).append(float(row["steady"]))
                elif not row["exact"].startswith("error"):
                    differ += 1
                macs = f"{row['macs']:,}" if isinstance(row["macs"], int) else row["macs"]
                print(f"{model:<27} {npu:<15} {row['partition']:<17} {row['commands']:>5} "
                      f"{macs:>11}  {row['model_ms']:>8} {row['tosa_ms']:>8} "
                      f"{row['ratio']:>6} {row['steady']:>6}  {row['exact'][:150]}", flush=True)
        summary = (f"{npu}: {total['exact']}/{total['partitions']} partitions executed "
                   f"byte-exact, {total['commands']:,} commands, {total['macs']:,} MACs per "
                   f"inference; model {total['model']:.0f} ms vs TOSA reference "
                   f"{total['tosa']:.0f} ms (first sample, weight decoding included, on the "
                   f"partitions executed); later samples: model/TOSA time median "
                   f"{statistics.median(total.get('steady', [0])):.2f}")
        summaries.append(summary)
        print(f"\n{summary}\n")
    print("\n".join(summaries))
    return 0 if differ == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
