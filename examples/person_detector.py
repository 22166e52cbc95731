"""A small single-class (person) detector in the spirit of µYOLO, sized for an Ethos-U55.

Backbone: a stride-2 3x3 stem, then six depthwise-separable blocks (3x3 depthwise + 1x1
pointwise, each followed by BatchNorm and ReLU6), downsampling 128x128 to a 4x4 grid.
Head: a 1x1 conv reduces each grid cell to a few features, then one nn.Linear over the
flattened grid predicts, per cell, one objectness logit and four box values. Like µYOLO the
predictor is linear over the whole grid, so a cell can use its neighbours' features.

Every op (conv, depthwise conv, ReLU6 as a clamp, the NHWC->NCHW transpose before the flatten,
the fully connected layer) is one Ethos-U55 supports, so a quantized build should place the
whole graph on the NPU. The output is raw logits/offsets; decoding (sigmoid, NMS) is left to
the application so that the model itself stays a pure NPU graph.

Output layout: shape (1, GRID_CELLS * OUTPUTS_PER_CELL) = (1, 80); value
`out[0, cell * 5 + k]` belongs to cell `row * 4 + col`, where k=0 is the objectness logit and
k=1..4 are the (cx, cy, w, h) box regressions.
"""

import torch
from torch import Tensor, nn

INPUT_SHAPE = (1, 3, 128, 128)
GRID_SIZE = 4
OUTPUTS_PER_CELL = 5  # objectness + (cx, cy, w, h)
GRID_CELLS = GRID_SIZE * GRID_SIZE

# (in_channels, out_channels, stride) of each depthwise-separable block after the stem;
# the product of strides (stem 2 x 2 x 2 x 2 x 2) takes 128x128 down to the 4x4 grid.
_BLOCKS = (
    (16, 32, 2),
    (32, 32, 1),
    (32, 64, 2),
    (64, 64, 1),
    (64, 128, 2),
    (128, 128, 2),
)
_HEAD_CHANNELS = 16


class DepthwiseSeparable(nn.Module):
    """3x3 depthwise conv then 1x1 pointwise conv, each with BatchNorm and ReLU6."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(
            in_channels, in_channels, 3, stride=stride, padding=1, groups=in_channels, bias=False
        )
        self.depthwise_bn = nn.BatchNorm2d(in_channels)
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        self.pointwise_bn = nn.BatchNorm2d(out_channels)
        self.act = nn.ReLU6()

    def forward(self, x: Tensor) -> Tensor:
        x = self.act(self.depthwise_bn(self.depthwise(x)))
        return self.act(self.pointwise_bn(self.pointwise(x)))


class PersonDetector(nn.Module):
    """128x128 RGB in, a 4x4 grid of (objectness, cx, cy, w, h) out, flattened to (1, 80)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU6(),
        )
        self.backbone = nn.Sequential(*(DepthwiseSeparable(i, o, s) for i, o, s in _BLOCKS))
        self.reduce = nn.Sequential(
            nn.Conv2d(_BLOCKS[-1][1], _HEAD_CHANNELS, 1, bias=False),
            nn.BatchNorm2d(_HEAD_CHANNELS),
            nn.ReLU6(),
        )
        self.predictor = nn.Linear(_HEAD_CHANNELS * GRID_CELLS, GRID_CELLS * OUTPUTS_PER_CELL)

    def forward(self, x: Tensor) -> Tensor:
        x = self.reduce(self.backbone(self.stem(x)))
        return self.predictor(torch.flatten(x, 1))
