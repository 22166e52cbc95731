"""`plan`, `size` and the artifacts name one weights figure (issue 61 item 10: numbers that
disagree between plan, size and verify).

The plan counted each constant value's bytes, so a buffer several values share (upstream keeps
equal constants once; a recurrence's steps share their weights) was counted once per value: the
GRU keyword spotter's plan said 9,232 B of weights where the .pte holds 8,080. Both now count each
buffer once, and `size` prints the plan's figure with the NPU's weights and scales in it."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("model,npu", [("examples/user_models.py:gru_kws", "none"),
                                       ("mixed", "ethos-u55-128")])
def test_plan_and_size_name_the_same_weights(tmp_path, model, npu):
    import orchestrator
    from orchestrator.artifacts.size import analyze, render_text

    result = orchestrator.compile(model, tmp_path / "m.pte", npu=npu)
    planned = result.plan.summary.weight_bytes
    report = analyze(tmp_path / "m.pte")
    assert report.weight_bytes == planned
    assert f"weights {planned:,} B (the plan's figure)" in render_text(report)
    if npu == "none":
        view_values = result.compiled.program_view.values
        shared = len([v for v in view_values if v.is_tensor and v.is_constant]) > len(
            {v.buffer for v in view_values if v.is_tensor and v.is_constant})
        assert shared  # the case that was counted twice
