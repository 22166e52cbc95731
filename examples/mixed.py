"""A small classifier built to split between NPU and CPU, differently on Ethos-U55 and U85.

    conv 3x3 s1 (3->8) + ReLU    U55: NPU   U85: NPU
    conv 4x4 s4 p1 (8->16)       U55: CPU   U85: NPU
    where(x > 0, x, 0.1 * x)     U55: CPU   U85: NPU   (gt + mul + where)
    sort(dim=-1).values          U55: CPU   U85: CPU
    conv 1x1 (16->16) + ReLU,
    flatten, linear (1024->10)   U55: NPU   U85: NPU

Why each op lands where it does (ExecuTorch 1.5 Arm backend checks, Vela 5):
- The stride-4 conv: the U55 convolution check rejects strides above 3 unless the conv is
  unpadded with dilation 1 (`ConvolutionSupported._stride_condition`); padding=1 is what
  makes it fail there. The U85 has no such limit.
- gt and where: `EthosU55NotSupported` lists aten.gt and aten.where.self (TOSA GREATER and
  SELECT are not in the U55 subset); U85 runs both. The `0.1 * x` mul is NPU-capable on both,
  so on U55 it sits between CPU ops and shows what a tiny NPU island costs at its boundaries.
- sort: TOSA has no sort operator, so no Ethos-U takes it; it stays on the CPU (portable
  kernel; CMSIS-NN has none either).

So the U55 build leaves the stride-4 conv, gt, where and sort on the CPU, and the U85 build
only the sort.
"""

import torch
from torch import Tensor, nn

INPUT_SHAPE = (1, 3, 32, 32)
NUM_CLASSES = 10
_LEAKY_SLOPE = 0.1


class MixedModel(nn.Module):
    """32x32 RGB in, 10 class logits out; see the module docstring for the intended split."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=1, padding=1)
        self.act = nn.ReLU()
        # 32x32 padded by 1 -> 34x34; (34 - 4) // 4 + 1 = 8, so an 8x8 map follows.
        self.downsample = nn.Conv2d(8, 16, 4, stride=4, padding=1)
        self.mix = nn.Conv2d(16, 16, 1)
        self.head = nn.Linear(16 * 8 * 8, NUM_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.act(self.conv(x))
        x = self.downsample(x)
        # Written as gt + where on purpose (not nn.LeakyReLU) so the U55 rejects it.
        x = torch.where(x > 0, x, _LEAKY_SLOPE * x)
        x = torch.sort(x, dim=-1).values
        x = self.act(self.mix(x))
        return self.head(torch.flatten(x, 1))
