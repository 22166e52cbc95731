"""A model whose greedy Ethos-U55 placement leaves an NPU island not worth its invocation.

    conv 3x3 (3->8) + ReLU     NPU
    conv 4x4 s4 p1 (8->16)     CPU (the U55 rejects stride 4 with padding)
    x + x                      NPU island: 1,024 additions between two CPU ops
    sort(dim=-1)               CPU (no TOSA sort)
    flatten, linear (->10)     NPU

Greedy puts the addition on the NPU: an invocation (driver, cache maintenance) around 1,024
additions. `--placement cost` moves it to CMSIS-NN (tests/test_policy.py), and the final linear
too (per-channel weights: on CMSIS-NN as a 1x1 convolution, partitioners/legalize.py).
"""

import torch
from torch import Tensor, nn


class IslandModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.downsample = nn.Conv2d(8, 16, 4, stride=4, padding=1)
        self.head = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.conv(x))
        x = self.downsample(x)
        x = x + x
        x = torch.sort(x, dim=-1).values
        return self.head(torch.flatten(x, 1))


def factory():
    return IslandModel().eval(), (torch.randn(1, 3, 32, 32),)
