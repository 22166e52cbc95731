"""Every case of the hostile corpus (tests/hostile_corpus.py) through the real command line: an
allowed exit code (2 bad input, 4 a failed check), one line on stderr naming the problem, no
traceback, no signal, no marker file (no input ran code), no temporary file left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile_corpus import MARKER, generate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(compiles, tmp_path_factory):
    pte = compiles.get("ds-cnn", npu="ethos-u55-128", write=True)[1]
    out = tmp_path_factory.mktemp("hostile")
    return out, generate(pte, out)


def test_the_corpus_covers_every_kind_of_damage(corpus):
    _, cases = corpus
    names = {c.name for c in cases}
    assert {"yaml-aliases-platform", "yaml-aliases-policy", "yaml-not-utf8",
            "calibration-pickle-runs-code", "pte-byte-flipped-qemu", "pte-byte-flipped-runtime",
            "manifest-names-a-platform-file", "manifest-path-escapes", "npu-weight-byte",
            "tosa-fuzz-0"} <= names


def test_every_hostile_case_ends_in_one_line_and_leaves_nothing(corpus, tmp_path):
    out, cases = corpus
    problems = []
    for case in cases:
        private_tmp = tmp_path / case.name
        private_tmp.mkdir()
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli", *case.argv, "--quiet"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "TMPDIR": str(private_tmp)})
        lines = [line for line in done.stderr.splitlines() if line.strip()
                 and not line.startswith("warning: calibration")]
        where = f"{case.name}: exit {done.returncode}: {done.stderr[-600:]}"
        if done.returncode < 0:
            problems.append(f"{where} (killed by signal {-done.returncode})")
        elif done.returncode not in case.codes:
            problems.append(f"{where} (expected {case.codes})")
        elif len(lines) != 1 or "Traceback" in done.stderr:
            problems.append(f"{where} (not one line)")
        elif case.needle and case.needle not in lines[0]:
            problems.append(f"{where} (does not say {case.needle!r})")
        if list(out.rglob(MARKER)):
            problems.append(f"{case.name}: an input ran code (the marker file exists)")
        if list(private_tmp.iterdir()):
            problems.append(f"{case.name}: left {[p.name for p in private_tmp.iterdir()]}")
    assert problems == [], "\n".join(problems)
