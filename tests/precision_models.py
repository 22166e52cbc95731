"""Small models for tests/test_precision.py: modules given int16 activations (--precision)."""

from __future__ import annotations

import torch
from torch import nn


class Gram(nn.Module):
    """A product of two activations (x @ x^T): the Ethos-U55 multiplies int8 activations only,
    so given int16 activations it leaves the NPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, x.transpose(1, 2))


class ConvGramLinear(nn.Module):
    """conv -> linear -> Gram matrix -> linear: `gram` is the module raised to A16W8."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.proj = nn.Linear(8 * 8 * 8, 32)
        self.gram = Gram()
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.conv(x)).flatten(1)
        tokens = self.proj(features).reshape(1, 4, 8)
        return self.head(self.gram(tokens).reshape(1, 16))


def conv_gram_linear():
    torch.manual_seed(0)
    return ConvGramLinear().eval(), (torch.randn(1, 1, 8, 8),)
