"""A second shape for tests/test_s16_operators.py and the s16 kernels' QEMU calibration: a wider
convolution and a linear over more than CMSIS-NN's 512 int32-accumulated columns (its s16
kernels switch to int64 past MAX_COL_COUNT)."""

from __future__ import annotations

import torch
from torch import nn


class WideConvLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 16, 3, padding=1)
        self.proj = nn.Linear(16 * 12 * 12, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.conv(x)).flatten(1))


def wide_conv_linear():
    torch.manual_seed(1)
    return WideConvLinear().eval(), (torch.randn(1, 4, 12, 12),)
