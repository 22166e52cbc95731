"""A hardswish that does not follow a convolution or linear runs on a CPU-only target.

ExecuTorch 1.5.1's Cortex-M quantizer annotates every hardswish, and its DecomposeHardswishPass
lowers only one fused after a convolution or linear: a hardswish after a mean (a keyword
transformer's head) stayed an int8 `aten::hardswish`, which no device kernel library has, and the
compile was refused (`the program needs aten::hardswish.out`). partitioners/quantizable.py
computes it as `x * hardtanh(x + 3, 0, 6) / 6` before quantizing.
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F


class MeanHardswishHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.hardswish(torch.relu(self.conv(x)).mean(dim=(2, 3))))


def mean_hardswish_head():
    torch.manual_seed(2)
    return MeanHardswishHead().eval(), (torch.randn(1, 3, 8, 8),)


def test_a_hardswish_after_a_mean_compiles_for_the_cpu_and_verifies(tmp_path):
    import orchestrator

    result = orchestrator.compile(f"{__file__}:mean_hardswish_head", tmp_path / "m.pte",
                                  npu="none")
    plan = result.plan
    assert plan.compiled.device_run.refusal is None
    assert not [r for r in plan.rows if r.op == "hardswish"]  # no int8 hardswish left
    (fix,) = [w for w in plan.compiled.workarounds if "hardswish" in w.message]
    assert "x * hardtanh(x + 3, 0, 6) / 6" in fix.message
    report = orchestrator.verify(result.pte, samples=4)
    assert report.passed, report.verdict
    assert max(o.max_steps for o in report.outputs) <= 1
