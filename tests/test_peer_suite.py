"""The peer suite (benchmarks/peer_suite.py: ExecuTorch's own Cortex-M and Arm backend test
modules, benchmarks/peer_cases.py) as an acceptance test. Opt-in: `python -m pytest -m peer`
(the slice on six targets is hours on two cores); the default suite runs the symptoms it found
(tests/test_peer_symptoms.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.peer
def test_the_peer_slice_has_no_internal_error_and_no_disagreement(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "peer_suite.py"),
                           "--slice", "--format", "json", "--results",
                           str(tmp_path / "results.jsonl")],
                          cwd=REPO, capture_output=True, text=True, timeout=6 * 3600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    records = report["records"]
    internal = [(r["case"], r["target"], r["compile"].get("reason"))
                for r in records if r["compile"]["outcome"] != "compiled"
                and r["compile"]["outcome"] != "refused"]
    assert not internal, internal
    refused = [r for r in records if r["compile"]["outcome"] == "refused"]
    assert all(r["compile"]["reason"] and "\n" not in r["compile"]["reason"] for r in refused)
    failed = [(r["case"], r["target"], r["verify"]["outcome"]) for r in records
              if r["verify"] and r["verify"]["outcome"] not in ("passed",)]
    assert not failed, failed
