"""The Ethos-U55/U65 functional model (npu_driver.ethos_u) against the TOSA reference model on
every NPU partition of the zoo models and the user-model families, on each NPU configuration.

Each (model, NPU) is compiled with `orchestrate compile` (kept in --work and reused when
present), then each NPU partition runs on the same seeded random inputs (the whole int8 range)
through the functional model (the Vela command stream) and through the TOSA reference model (the
partition's TOSA graph). One line per partition: the commands executed, the MACs counted from
the commands, whether every output byte is equal (else the first differing byte, or the error
naming the command the model refused), and the model's time over the TOSA model's (first
sample, so the model's one-time weight-stream decoding is included; the "steady" column is the
median of the later samples). A stream the model refuses for an access beyond its region is run
once more with the region grown, to say whether its output would also differ.

    python benchmarks/npu_model.py [--models ds-cnn,resnet8,...] [--npus ethos-u55-128,...]
        [--work DIR] [--samples 3] [--zoo-only | --users-only]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NPUS = ("ethos-u55-64", "ethos-u55-128", "ethos-u55-256", "ethos-u65-256")


def _zoo_models() -> list[str]:
    from examples.zoo import zoo_names

    return list(zoo_names())


def compile_once(spec: str, npu: str, pte: Path, platform: str = "corstone300") -> str | None:
    """Compile `spec` for `npu` to `pte` unless it is there; the error line, or None."""
    if pte.exists():
        return None
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "compile", spec,
                           "--platform", platform, "--npu", npu, "-o", str(pte)],
                          cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        lines = [line for line in (done.stdout + done.stderr).splitlines()
                 if line.startswith("orchestrate:")]
        return f"exit {done.returncode}: {(lines[-1] if lines else '').strip()[:110]}"
    return None


def _inputs(partition, rng):
    arrays = []
    for spec in partition.io.inputs:
        info = np.iinfo(spec.numpy_type)
        arrays.append(rng.integers(info.min, info.max, size=spec.shape, endpoint=True)
                      .astype(spec.numpy_type))
    return arrays


def _first_difference(expected: list[bytes], got: list[bytes]) -> str:
    for index, (e, g) in enumerate(zip(expected, got)):
        if e != g:
            a, b = np.frombuffer(e, np.uint8), np.frombuffer(g, np.uint8)
            where = int(np.flatnonzero(a != b)[0])
            count = int(np.count_nonzero(a != b))
            return (f"no: output {index} byte {where} TOSA {a[where]:#04x} model {b[where]:#04x}"
                    f" ({count}/{a.size} bytes differ)")
    return "yes"


def run_partition_row(partition, npu: str, samples: int) -> dict:
    from npu_driver.ethos_u import MemoryFault, NpuModelError, run_partition
    from npu_driver.tosa_twin import run_tosa

    rng = np.random.default_rng(2024)
    row = {"partition": partition.delegate_name}
    model_s, tosa_s, verdict = [], [], "yes"
    counters = None
    for _ in range(samples):
        arrays = _inputs(partition, rng)
        start = time.perf_counter()
        expected = [a.tobytes() for a in run_tosa(partition.tosa_bytes, partition.io, arrays)]
        tosa_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        try:
            got, counters = run_partition(partition.payload, arrays, npu)
        except MemoryFault as error:
            try:
                grown, _ = run_partition(partition.payload, arrays, npu, grow_scratch=True)
                after = ("; with the region grown the output "
                         + ("still equals TOSA" if grown == expected else "also differs"))
            except NpuModelError as again:
                after = f"; grown: {type(again).__name__}"
            row.update(commands="-", macs="-", exact=f"error: {type(error).__name__}: {error}"
                       f"{after}", model_ms="-", tosa_ms=f"{tosa_s[0] * 1e3:.1f}", ratio="-",
                       steady="-")
            return row
        except NpuModelError as error:
            row.update(commands="-", macs="-", exact=f"error: {type(error).__name__}: {error}",
                       model_ms="-", tosa_ms=f"{tosa_s[0] * 1e3:.1f}", ratio="-", steady="-")
            return row
        model_s.append(time.perf_counter() - start)
        if got != expected and verdict == "yes":
            verdict = _first_difference(expected, got)
    fast = counters.region_extent.get(2, 0)
    if fast and verdict == "yes":
        verdict = f"yes (uses {fast:,} B of fast scratch)"
    steady_model = statistics.median(model_s[1:]) if len(model_s) > 1 else model_s[0]
    steady_tosa = statistics.median(tosa_s[1:]) if len(tosa_s) > 1 else tosa_s[0]
    row.update(commands=counters.commands, macs=counters.macs, exact=verdict,
               model_ms=f"{model_s[0] * 1e3:.1f}", tosa_ms=f"{tosa_s[0] * 1e3:.1f}",
               ratio=f"{model_s[0] / max(tosa_s[0], 1e-9):.2f}",
               steady=f"{steady_model / max(steady_tosa, 1e-9):.2f}")
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated zoo and user model names")
    parser.add_argument("--npus", default=",".join(NPUS))
    parser.add_argument("--work", default="/tmp/npu-model-bench",
                        help="where the .pte programs are compiled to (and reused from)")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--zoo-only", action="store_true")
    parser.add_argument("--users-only", action="store_true")
    args = parser.parse_args(argv)

    from examples.user_models import USER_MODELS, model_spec
    from orchestrator.verification.twin import load_twin

    zoo = [] if args.users_only else _zoo_models()
    users = [] if args.zoo_only else list(USER_MODELS)
    if args.models:
        wanted = args.models.split(",")
        zoo = [m for m in wanted if m not in USER_MODELS]
        users = [m for m in wanted if m in USER_MODELS]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    header = (f"{'model':<27} {'npu':<14} {'partition':<17} {'cmds':>5} {'MACs':>11}  "
              f"{'model ms':>8} {'TOSA ms':>8} {'ratio':>6} {'steady':>6}  byte-exact")
    print(header)
    print("-" * len(header))
    totals = {"partitions": 0, "exact": 0, "differ": 0, "error": 0}
    for npu in args.npus.split(","):
        for name in zoo + users:
            spec = name if name in zoo else model_spec(name)
            pte = work / (f"{name}__{npu}.pte" if name in zoo else f"user_{name}__{npu}.pte")
            failure = compile_once(spec, npu, pte)
            if failure:
                print(f"{name:<27} {npu:<14} compile {failure}")
                continue
            twin = load_twin(pte)
            if not twin.partitions:
                print(f"{name:<27} {npu:<14} no NPU partition")
                continue
            for partition in twin.partitions:
                row = run_partition_row(partition, npu, args.samples)
                totals["partitions"] += 1
                kind = ("exact" if row["exact"].startswith("yes") else
                        "error" if row["exact"].startswith("error") else "differ")
                totals[kind] += 1
                macs = f"{row['macs']:,}" if isinstance(row["macs"], int) else row["macs"]
                print(f"{name:<27} {npu:<14} {row['partition']:<17} {row['commands']:>5} "
                      f"{macs:>11}  {row['model_ms']:>8} {row['tosa_ms']:>8} "
                      f"{row['ratio']:>6} {row['steady']:>6}  {row['exact']}", flush=True)
    print(f"\n{totals['partitions']} NPU partitions: {totals['exact']} byte-exact, "
          f"{totals['differ']} differ, {totals['error']} refused by the model")
    return 0 if totals["differ"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
