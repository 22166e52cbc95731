"""`.pte` bytes before and after sharing equal values (orchestrator/compilation/share_values.py),
per zoo model and target, and the proof that both are the same program: the host twin and the
real ExecuTorch runtime (host build of the device kernels; `orchestrate verify --runtime
executorch`, which loads the program with the runtime's verifier and compares every output with
the twin's) passes both: the twin's outputs are byte-identical before and after on the same
inputs, and the runtime agrees with the twin on each.

    python benchmarks/shared_values.py [--models ds-cnn,resnet8] [--targets cpu-m55,u55-128]
                                       [--samples 2]

Bytes: counted in the files. Nothing is timed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orchestrator  # noqa: E402,F401 - pins host numerics before torch
from orchestrator.artifacts.outputs import write_outputs  # noqa: E402
from orchestrator.compilation.pipeline import compile_model  # noqa: E402
from orchestrator.sources.loader import load_calibration, load_model  # noqa: E402
from orchestrator.target import resolve_target  # noqa: E402
from orchestrator.verification.twin import run_twin  # noqa: E402

TARGETS = {"u55-128": ("corstone300", "ethos-u55-128", None),
           "u85-256": ("corstone320", "ethos-u85-256", None),
           "cpu-m55": ("corstone300", "none", "cortex-m55")}
MODELS = ("ds-cnn", "mixed", "resnet8", "deep-autoencoder", "mobilenet-v1-025", "person-detector")


def _runtime_verdict(pte: Path, samples: int) -> str:
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "verify", str(pte),
                           "--runtime", "executorch", "--samples", str(samples)],
                          cwd=ROOT, capture_output=True, text=True)
    return {0: "pass", 4: "FAIL", 5: "not run"}.get(done.returncode, f"exit {done.returncode}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--samples", type=int, default=2)
    args = parser.parse_args()
    print(f"{'model':<18} {'target':<8} {'before':>9} {'after':>9} {'ratio':>6} {'values':>11} "
          f"{'twin':>6} {'runtime before/after':>20}")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="orchestrate-shared-") as temp:
        for model in args.models.split(","):
            loaded = load_model(model)
            calibration = load_calibration(None, loaded.example_inputs)
            for target_key in args.targets.split(","):
                platform, npu, cpu = TARGETS[target_key]
                target = resolve_target(platform, npu=npu, cpu=cpu)
                ptes, views = {}, {}
                for share in (False, True):
                    compiled = compile_model(loaded, calibration, target, share_values=share)
                    pte = Path(temp) / f"{model}-{target_key}-{'after' if share else 'before'}.pte"
                    write_outputs(compiled, pte)
                    ptes[share] = pte
                    views[share] = compiled.program_view
                inputs = [tuple(sample) for sample in calibration.samples[:args.samples]]
                twin_same = all(run_twin(ptes[False], x).output_bytes
                                == run_twin(ptes[True], x).output_bytes for x in inputs)
                verdicts = [_runtime_verdict(ptes[share], args.samples) for share in (False, True)]
                runtime_cell = "/".join(verdicts)
                failures += (not twin_same) + (verdicts[1] == "FAIL" and verdicts[0] != "FAIL")
                before, after = ptes[False].stat().st_size, ptes[True].stat().st_size
                print(f"{model:<18} {target_key:<8} {before:>9,} {after:>9,} {after / before:>6.3f} "
                      f"{len(views[False].values):>5}->{len(views[True].values):<5} "
                      f"{'equal' if twin_same else 'DIFF':>6} {runtime_cell:>20}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
