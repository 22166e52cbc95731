"""timm's attention form for tests: q, k and v of one qkv projection, reshaped to (B, N, 3, H, D),
permuted and unbound, into `scaled_dot_product_attention` (4 heads of 16, width 64).
`file.py:factory` model sources."""

import torch
from torch import nn


class HeadsAttention(nn.Module):
    def __init__(self, batch: int, tokens: int) -> None:
        super().__init__()
        self.batch, self.tokens = batch, tokens
        self.qkv = nn.Linear(64, 192)
        self.proj = nn.Linear(64, 64)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(self.batch, self.tokens, 3, 4, 16).permute(
            2, 0, 3, 1, 4).unbind(0)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(o.transpose(1, 2).reshape(self.batch, self.tokens, 64))


def heads_attention():
    """One sequence of 65 tokens, CPU-only on the M55: the Cortex-M passes leave SDPA float
    (portable kernels), and on QEMU's M55 one float of case 1 rounds to the other side of a
    quantize's boundary than on the twin and the host runtime (tests/test_false_fails.py)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return HeadsAttention(1, 65).eval(), (torch.randn(1, 65, 64),)


def batched_heads_attention():
    """Four sequences of 16 tokens: the multi-batch form the Ethos-U rewrite takes the heads of
    before the permute (tests/test_vela_forms.py)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = HeadsAttention(4, 16).eval()
    generator = torch.Generator().manual_seed(0)
    return model, (torch.randn(4, 16, 64, generator=generator),)
