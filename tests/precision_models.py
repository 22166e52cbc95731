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


class Separable(nn.Module):
    """A depthwise-separable block (DS-CNN's form): CMSIS-NN has no s16 operator of ours for
    the depthwise convolution (groups > 1), one for the pointwise one."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.pointwise = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.pointwise(torch.relu(self.depthwise(x))))


class SeparableNet(nn.Module):
    """conv -> depthwise-separable block -> linear: `block` is the module raised to A16W8."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.block = Separable(8)
        self.head = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(torch.relu(self.stem(x))).flatten(1))


def separable():
    torch.manual_seed(0)
    return SeparableNet().eval(), (torch.randn(1, 1, 6, 6),)


class SqueezeExcite(nn.Module):
    """x * hardsigmoid(conv(mean(x))): a channel broadcast multiply, in float when raised."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * nn.functional.hardsigmoid(self.reduce(scale))


class Conv1dSqueezeExcite(nn.Module):
    """conv + hardswish -> squeeze-excite, beside a Conv1d over the same input's rows, summed ->
    linear: the forms an int16 module meets on a CPU-only target beside the plain conv and
    linear (a Conv1d's NCHW [N, C, 1, W] 2-D form, a hardswish after a conv, a hardsigmoid, a
    broadcast multiply of a channels-last value)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.act = nn.Hardswish()
        self.se = SqueezeExcite(8)
        self.temporal = nn.Conv1d(4, 8, 3, padding=1)
        self.head = nn.Linear(8 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spatial = self.se(self.act(self.conv(x))).flatten(1)
        temporal = torch.relu(self.temporal(x.flatten(2))).flatten(1)
        return self.head(spatial + temporal)


def conv1d_squeeze_excite():
    torch.manual_seed(0)
    return Conv1dSqueezeExcite().eval(), (torch.randn(1, 4, 4, 4),)
