"""The same command writes the same `.pte` in every Python process (docs/compile.md: reproducible).

A model whose NPU partitions are two, the second with two outputs, compiled in two processes
with different string-hash seeds: upstream hands its partitions on in hash order
(partitioners/upstream_ethos_u.py), which gave 7,232 B and 7,184 B programs for seeds 1 and 3.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from examples.user_models import model_spec

ROOT = Path(__file__).resolve().parents[1]


def _compile(seed: int, out: Path) -> bytes:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "compile", model_spec("gated_flip_two_outputs"),
         "--npu", "ethos-u55-128", "--quiet", "-o", str(out)],
        env={**os.environ, "PYTHONHASHSEED": str(seed)}, cwd=ROOT, capture_output=True,
        text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return out.read_bytes()


def test_two_processes_with_different_hash_seeds_write_the_same_program(tmp_path):
    first, second = _compile(1, tmp_path / "seed1.pte"), _compile(3, tmp_path / "seed3.pte")
    assert hashlib.sha256(first).hexdigest() == hashlib.sha256(second).hexdigest()
