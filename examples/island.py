"""A model whose greedy Ethos-U55 placement leaves an NPU island not worth its invocation.

    conv 3x3 (3->8) + ReLU     NPU
    conv 4x4 s4 p1 (8->16)     CPU (the U55 rejects stride 4 with padding)
    x + x                      NPU island: 1,024 additions between two CPU ops
    sort(dim=-1)               CPU (no TOSA sort)
    flatten, linear (->10)     NPU

Greedy puts the addition and the final linear on the NPU, each in an island of its own with an
invocation (driver, cache maintenance over the scratch) around it. `--placement cost` moves the
linear to CMSIS-NN (per-channel weights: a 1x1 convolution, partitioners/legalize.py) and keeps
the addition: its 1,024 int8 additions retire about 14,100 instructions on CMSIS-NN (the
Corstone-300's calibration, fitted to QEMU profiles), more than its NPU island costs
(tests/test_policy.py).
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
