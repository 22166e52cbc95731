"""`.pte` bytes before/after dead-constant elimination, per zoo model, CPU-only M55 and U55-128.

"before" is what ExecuTorch 1.5.1 serializes (prune_constants=False), "after" what `compile`
writes; both counted in the files (orchestrator/artifacts/size.py). Also checks that both programs give
the same output bytes in the twin on one input.

    python benchmarks/dead_constants.py
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

import orchestrator  # noqa: E402,F401 - pins host numerics first
import torch  # noqa: E402

from examples.zoo import zoo_names  # noqa: E402
from orchestrator.artifacts.outputs import write_outputs  # noqa: E402
from orchestrator.compilation.pipeline import compile_model  # noqa: E402
from orchestrator.artifacts.size import analyze  # noqa: E402
from orchestrator.sources.loader import load_calibration, load_model  # noqa: E402
from orchestrator.target import resolve_target  # noqa: E402
from orchestrator.verification.twin import load_twin  # noqa: E402

TARGETS = (("m55", "none"), ("u55-128", "ethos-u55-128"))


def main() -> None:
    print(f"{'model':<18} {'target':<8} {'before B':>10} {'after B':>10} {'saved B':>9} "
          f"{'dead before':>12} {'dead after':>11}  same outputs")
    with tempfile.TemporaryDirectory() as tmp:
        for name in zoo_names():
            for label, npu in TARGETS:
                model = load_model(name)
                calibration = load_calibration(None, model.example_inputs)
                target = resolve_target("corstone300", npu=npu)
                paths = {}
                for prune in (False, True):
                    compiled = compile_model(model, calibration, target, prune_constants=prune)
                    paths[prune] = Path(tmp) / f"{name}_{label}_{prune}.pte"
                    write_outputs(compiled, paths[prune])
                before, after = analyze(paths[False]), analyze(paths[True])
                sample = tuple(torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
                               for x in model.example_inputs)
                same = (load_twin(paths[False]).run(sample).output_bytes
                        == load_twin(paths[True]).run(sample).output_bytes)
                print(f"{name:<18} {label:<8} {before.total_bytes:>10,} {after.total_bytes:>10,} "
                      f"{before.total_bytes - after.total_bytes:>9,} "
                      f"{before.constant_bytes_dead:>12,} {after.constant_bytes_dead:>11,}  "
                      f"{'yes' if same else 'NO'}", flush=True)


if __name__ == "__main__":
    main()
