"""Behaviour stays put unless changed on purpose: the programs the session compiles anyway
match the golden list (benchmarks/golden.py writes it; --update only with a reason)."""

from __future__ import annotations

import json

import pytest

from benchmarks.golden import GOLDEN, TARGETS, fingerprint, key

CHECKED = [("ds-cnn", "u55-128"), ("ds-cnn", "cpu-m55"), ("ds-cnn", "u85-256"),
           ("mixed", "u55-128"), ("mixed", "cpu-m55"), ("mixed", "u85-256")]


@pytest.mark.parametrize("model,target", CHECKED, ids=[f"{m}-{t}" for m, t in CHECKED])
def test_a_zoo_program_is_byte_identical_to_the_golden_list(compiles, model, target):
    listed = json.loads(GOLDEN.read_text())
    platform, npu, cpu = TARGETS[target]
    compiled, _ = compiles.get(model, platform, npu, cpu)
    assert fingerprint(compiled) == listed[key(model, target)], (
        f"{model} on {target} changed; if on purpose, run `python benchmarks/golden.py "
        "--update` and say why in the commit")
