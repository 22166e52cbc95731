"""`verify` on every zoo model for U55-128, U65-256, U85-256 and CPU-only M55, 16 samples each.

Pass = every value the program writes within one int8 step per rounding stage of the quantized
reference fed the program's own inputs (orchestrator/local_check.py), AND no device fault (`mixed`
passes thanks to the compile's device legalization: its sort runs as topk, its constant
comparisons as `.Scalar` ops).
"""

from __future__ import annotations

import pytest

from examples.zoo import zoo_names

TARGETS = [("corstone300", "ethos-u55-128", None), ("corstone300", "ethos-u65-256", None),
           ("corstone320", "ethos-u85-256", None), ("corstone300", "none", "cortex-m55")]


@pytest.mark.parametrize("platform,npu,cpu", TARGETS,
                         ids=["u55-128", "u65-256", "u85-256", "m55"])
@pytest.mark.parametrize("model", zoo_names())
def test_verify_against_the_quantized_reference(compiles, model, platform, npu, cpu):
    from orchestrator.verify import verify

    _, pte = compiles.get(model, platform, npu, cpu, write=True)
    report = verify(pte, samples=16)
    assert report.passed, report.verdict
    assert report.checked_values > 0 and report.unmatched_values == ()
    assert not report.faults
