"""Every zoo model on U55-128, U65-256, U85-256 and CPU-only M55: one line per case.

Each line: compile as `orchestrate compile` does (seconds measured here) and the `verify`
verdict on the host twin, or the classified error (its exit code and first line); never a
traceback.

    python benchmarks/verify_zoo.py [--samples 16]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orchestrator  # noqa: E402,F401 - pins host numerics before torch is imported
from examples.zoo import zoo_names  # noqa: E402

_spec = importlib.util.spec_from_file_location("user_models_bench",
                                               Path(__file__).with_name("user_models.py"))
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=16)
    samples = parser.parse_args().samples
    out_dir = Path(tempfile.mkdtemp(prefix="verify-zoo-"))
    print(f"zoo models x targets; verify: host twin, {samples} generated samples; compile "
          f"seconds measured here; .pte files in {out_dir}", flush=True)
    for name in zoo_names():
        for target_key in ("u55", "u65", "u85", "cpu"):
            print(_bench.run_case(name, target_key, out_dir, samples, spec=str), flush=True)


if __name__ == "__main__":
    main()
