"""A keyword transformer on a CPU-only Cortex-M55: two defects a model outside the families found.

- A hardswish after a mean (the head) stayed an int8 `aten::hardswish`: ExecuTorch 1.5.1's
  Cortex-M quantizer annotates every hardswish and its DecomposeHardswishPass lowers only one
  after a convolution or linear, and no device kernel library has an int8 hardswish, so compile
  refused the program (`the program needs aten::hardswish.out`). partitioners/quantizable.py
  now computes it as `x * hardtanh(x + 3, 0, 6) / 6` before quantizing.
- The twin's local check failed the `cortex_m::transpose` that feeds the attention's batch
  matmul (179 steps) while the program was right end to end (1 step, QEMU byte-exact): the
  transpose reads a reshape the memory plan aliases to the previous value, which no instruction
  writes, so the check could not see its input and compared it with another 16x16 node. The
  input is now read from the last value written at its place (twin_verify._written).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.device_tools import qemu_or_missing, verify_qemu_passes


class KeywordTransformer(nn.Module):
    """Conv1d patch embedding, learned positions, one pre-norm encoder block (2-head attention,
    GELU MLP), mean pooling, hardswish, linear head."""

    def __init__(self, d: int = 32, heads: int = 2, frames: int = 16, mfcc: int = 10) -> None:
        super().__init__()
        self.embed = nn.Conv1d(mfcc, d, 3, padding=1)
        self.pos = nn.Parameter(torch.randn(1, frames, d) * 0.1)
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, 8)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(x).transpose(1, 2) + self.pos
        b, n, d = t.shape
        q, k, v = self.qkv(self.norm1(t)).chunk(3, dim=-1)
        h = self.heads
        q, k, v = (z.reshape(b, n, h, d // h).transpose(1, 2) for z in (q, k, v))
        attention = torch.softmax(q @ k.transpose(-1, -2) * (d // h) ** -0.5, dim=-1)
        t = t + self.proj((attention @ v).transpose(1, 2).reshape(b, n, d))
        t = t + self.mlp(self.norm2(t))
        return self.head(F.hardswish(t.mean(dim=1)))


def keyword_transformer():
    torch.manual_seed(5)
    return KeywordTransformer().eval(), (torch.randn(1, 10, 16),)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    import orchestrator

    folder = tmp_path_factory.mktemp("kwt")
    return orchestrator.compile(f"{__file__}:keyword_transformer", folder / "kwt.pte",
                                bundle=True, npu="none", cpu="cortex-m55")


def test_a_hardswish_after_a_mean_compiles_for_the_cpu(compiled):
    plan = compiled.plan
    assert plan.compiled.device_run.refusal is None
    assert not [r for r in plan.rows if r.op == "hardswish"]  # no int8 hardswish left
    (fix,) = [w for w in plan.compiled.workarounds if "hardswish" in w.message]
    assert "x * hardtanh(x + 3, 0, 6) / 6" in fix.message


def test_the_twin_checks_the_transpose_that_reads_an_aliased_reshape(compiled):
    import orchestrator
    from kernels.program_view import ProgramView

    view = ProgramView.read(compiled.pte.read_bytes())
    transposes = [c for c in view.kernel_calls() if c.operator.name == "cortex_m::transpose"]
    written = {out for c in view.kernel_calls() for out in c.args[-1:]}
    assert any(c.args[0] not in written for c in transposes)  # an input no instruction writes
    report = orchestrator.verify(compiled.pte, samples=4)
    assert report.passed and not report.unmatched_values, report.verdict
    assert max(o.max_steps for o in report.outputs) <= 1


def test_the_keyword_transformer_runs_on_the_m55(compiled, capsys):
    qemu_or_missing()
    verify_qemu_passes(compiled.pte, capsys)
