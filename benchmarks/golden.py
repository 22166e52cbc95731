"""The golden list: SHA-256 of the `.pte` and of the op placements of zoo programs, so a change
meant to keep behaviour (a restructuring, a refactor) can show that it did.

    python benchmarks/golden.py            # compare every listed (model, target) with the list
    python benchmarks/golden.py --update   # rewrite tests/golden/programs.json (on purpose only)

tests/test_golden.py checks the entries the test session compiles anyway (ds-cnn and mixed on
U55-128, U85-256 and the CPU-only M55). A difference is either a bug or a deliberate change,
which then updates the list in the same commit and says why.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orchestrator  # noqa: E402,F401 - pins host numerics before torch

GOLDEN = ROOT / "tests" / "golden" / "programs.json"
TARGETS = {"u55-128": ("corstone300", "ethos-u55-128", None),
           "u85-256": ("corstone320", "ethos-u85-256", None),
           "cpu-m55": ("corstone300", "none", "cortex-m55")}
MODELS = ("ds-cnn", "mixed", "resnet8", "deep-autoencoder", "mobilenet-v1-025", "person-detector")


def fingerprint(compiled) -> dict:
    """What must not change silently: the program's bytes and where every op runs."""
    # Sorted: the order of the rows inside an NPU partition follows the delegate's graph, which
    # a capture read back from the cache lists in another topological order (same .pte).
    placements = sorted(f"{r.name} {r.op} {r.placement} {r.partition} {r.kernel}"
                        for r in compiled.placements)
    return {"pte_sha256": hashlib.sha256(compiled.pte_bytes).hexdigest(),
            "pte_bytes": len(compiled.pte_bytes), "placements": placements}


def key(model: str, target: str) -> str:
    return f"{model} {target}"


def compile_one(model: str, target: str):
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    platform, npu, cpu = TARGETS[target]
    loaded = load_model(model)
    return compile_model(loaded, load_calibration(None, loaded.example_inputs),
                         resolve_target(platform, npu=npu, cpu=cpu))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--update", action="store_true")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    listed = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    found, differ = {}, 0
    for model in args.models.split(","):
        for target in TARGETS:
            found[key(model, target)] = fingerprint(compile_one(model, target))
            same = listed.get(key(model, target)) == found[key(model, target)]
            differ += not same
            print(f"{key(model, target):<30} {'same' if same else 'DIFFERS'} "
                  f"{found[key(model, target)]['pte_sha256'][:16]}", flush=True)
    if args.update:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps({**listed, **found}, indent=2, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN}")
        return 0
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
