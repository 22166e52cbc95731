"""`verify` on every zoo model and every shipped target, 16 samples each.

The default run covers every model and every target at least once, on compiles other tests
share; the full grid (every model x U55-128, U65-256, U85-256, CPU-only M55) is opt-in:
`python -m pytest -m matrix`.

Pass = every value the program writes within one int8 step per rounding stage of the quantized
reference fed the program's own inputs (orchestrator/verification/local_check.py), AND no device fault (`mixed`
passes thanks to the compile's device legalization: its sort runs as topk, its constant
comparisons as `.Scalar` ops).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.zoo import zoo_names

TARGETS = [("corstone300", "ethos-u55-128", None), ("corstone300", "ethos-u65-256", None),
           ("corstone320", "ethos-u85-256", None), ("corstone300", "none", "cortex-m55")]


MY_SOC = str(Path(__file__).resolve().parents[1] / "examples" / "my_soc.yaml")
DEFAULT_CASES = [
    ("ds-cnn", "corstone300", "ethos-u55-128", None), ("ds-cnn", "corstone300", "ethos-u65-256", None),
    ("ds-cnn", "corstone320", "ethos-u85-256", None), ("ds-cnn", "corstone300", "none", "cortex-m55"),
    ("mixed", "corstone300", "ethos-u55-128", None), ("mixed", "corstone320", "ethos-u85-256", None),
    ("mixed", "corstone300", "none", "cortex-m55"),
    ("mobilenet-v1-025", "corstone300", "none", "cortex-m55"),
    ("deep-autoencoder", "corstone300", "none", "cortex-m85"),
    ("resnet8", "corstone300", "ethos-u65-256", None),
    ("person-detector", MY_SOC, None, None),
]


def _check(compiles, model, platform, npu, cpu):
    from orchestrator.verification.twin_verify import verify

    _, pte = compiles.get(model, platform, npu, cpu, write=True)
    report = verify(pte, samples=16)
    assert report.passed, report.verdict
    assert report.checked_values > 0 and report.unmatched_values == ()
    assert not report.faults


@pytest.mark.parametrize("model,platform,npu,cpu", DEFAULT_CASES,
                         ids=[f"{c[0]}-{c[2] or 'soc'}-{c[3] or ''}".rstrip("-") for c in DEFAULT_CASES])
def test_verify_against_the_quantized_reference(compiles, model, platform, npu, cpu):
    _check(compiles, model, platform, npu, cpu)


@pytest.mark.matrix
@pytest.mark.parametrize("platform,npu,cpu", TARGETS,
                         ids=["u55-128", "u65-256", "u85-256", "m55"])
@pytest.mark.parametrize("model", zoo_names())
def test_verify_every_zoo_model_on_every_target(compiles, model, platform, npu, cpu):
    _check(compiles, model, platform, npu, cpu)
