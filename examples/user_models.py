"""Models of the kinds users bring, none of them in the zoo: the opt-in "user models" matrix.

Each `NAME` in `USER_MODELS` maps to a `factory()` returning a fresh eval-mode module and its
example inputs (the `path/to/file.py:factory` convention), so every one of them also works from
the command line, e.g. `orchestrate plan examples/user_models.py:conv1d_audio`.

The families are those of issue 16: a 1-D convolutional audio model, an attention block
(matmul, softmax, layer norm), integer heads (argmax, topk indices), an MLP over a [1, 3, 50]
sensor window, rank-3 and rank-5 tensors through NPU partitions, split / chunk / cat, a residual
conv block with a layout change on its skip path, recurrent layers (GRU, LSTM), and small blocks
of the torchvision classification families (MobileNetV2 inverted residuals, MobileNetV3-small
squeeze-excite blocks, SqueezeNet 1.1 fire modules with ceil-mode pooling, ShuffleNetV2 channel
split and shuffle), and the families of issue 23: a segmentation head returning logits and
their argmax, a softmax classifier, a layer-norm MLP, a U-Net-style encoder-decoder (upsampling,
skip concat), a depthwise-separable 1-D TCN, a detection head (sigmoid, concat), a two-input
two-output model, a ResNet of basic blocks (identity adds), a transposed-conv decoder, and
index/selection ops (argmin, index_select, gather, where, zeros_like, cat, amax, a bool mask),
and a CRNN (a conv front end whose channels-last output is permuted into a GRU's time axis).
torchvision is not a dependency and no weights are downloaded: the blocks
are written here, at small inputs, with seeded random weights and non-trivial BatchNorm
statistics (folding a default BatchNorm is an identity and would hide a folding bug).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from examples.zoo import randomize_batchnorm  # the zoo's non-trivial BatchNorm statistics

Factory = Callable[[], tuple[nn.Module, tuple[Tensor, ...]]]

_SEED = 0


def _seeded(build: Callable[[], nn.Module], *shapes: tuple[int, ...]) -> Factory:
    """A deterministic factory (seed 0, caller's RNG untouched), inputs uniform in [-1, 1)."""

    def factory() -> tuple[nn.Module, tuple[Tensor, ...]]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_SEED)
            module = build()
            randomize_batchnorm(module)
            inputs = tuple(torch.rand(shape) * 2 - 1 for shape in shapes)
        return module.eval(), inputs

    return factory


def _conv_bn(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1,
             act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class Conv1dAudio(nn.Module):
    """Keyword spotting over 40 frames of 10 MFCCs: 1-D convs (plain, strided, depthwise, 1x1)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(10, 16, 5, padding=2), nn.BatchNorm1d(16), nn.ReLU(),
            nn.Conv1d(16, 16, 3, stride=2, padding=1, groups=16), nn.ReLU(),
            nn.Conv1d(16, 24, 1), nn.ReLU(),
            nn.Conv1d(24, 24, 3, padding=1, groups=4), nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(24, 12)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


class AttentionBlock(nn.Module):
    """One pre-norm transformer block over 16 tokens of width 32: layer norm, single-head
    attention (matmul, softmax, matmul), residual adds and a GELU MLP."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.scale = width ** -0.5

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        attention = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        x = x + self.proj(torch.matmul(attention, v))
        return x + self.mlp(self.norm2(x))


class ArgmaxSegmentation(nn.Module):
    """A per-pixel classifier whose output is the class index map (int64), not logits."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_bn(3, 8), _conv_bn(8, 8), nn.Conv2d(8, 4, 1))

    def forward(self, x: Tensor) -> Tensor:
        return torch.argmax(self.body(x), dim=1)


class TopkHead(nn.Module):
    """A classifier returning its 3 best scores and their class indices (int64)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        values, indices = torch.topk(self.body(x), 3, dim=-1)
        return values, indices


class SensorMlp(nn.Module):
    """An MLP over a [1, 3, 50] window of a 3-axis accelerometer."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(150, 64), nn.ReLU(),
                                  nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 6))

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)


class Rank3Rank5(nn.Module):
    """Rank-3 ([1, 8, 16]) and rank-5 ([1, 2, 4, 4, 4]) tensors through NPU-capable ops."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        y = torch.relu(self.linear(x))  # rank 3
        y5 = y.reshape(1, 2, 4, 4, 4)  # rank 5
        y5 = y5 * 0.5 + y5.flip(1)
        y = self.conv(y5.reshape(1, 8, 4, 4))
        return y.reshape(1, 8, 16) + x


class SplitChunkCat(nn.Module):
    """Two branches from a split, one from a chunk, joined by cat along channels."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 12, 3, padding=1)
        self.left = nn.Conv2d(4, 4, 3, padding=1)
        self.right = nn.Conv2d(8, 8, 1)
        self.head = nn.Conv2d(16, 8, 1)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.stem(x))
        a, b = torch.split(x, [4, 8], dim=1)
        c, d = torch.chunk(b, 2, dim=1)
        y = torch.cat([self.left(a), self.right(b), c + d], dim=1)
        return self.head(y)


class ResidualBlock(nn.Module):
    """A residual conv block of the kind ExecuTorch's Arm tests use, whose skip path changes
    layout: the block input goes through a flatten/reshape (NCHW-only ops) before the add, so
    the add joins a channels-last conv output with a contiguous tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 8)
        self.conv1 = _conv_bn(8, 8)
        self.conv2 = _conv_bn(8, 8, act=None)
        self.head = nn.Linear(8 * 16 * 16, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        skip = x.flatten(2).reshape(x.shape)
        y = torch.relu(self.conv2(self.conv1(x)) + skip)
        return self.head(torch.flatten(y, 1))


class GruKws(nn.Module):
    """A GRU keyword spotter over 8 frames of 10 features (kept short: the recurrence unrolls)."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(10, 16, batch_first=True)
        self.head = nn.Linear(16, 12)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


class LstmClassifier(nn.Module):
    """An LSTM over 6 steps of 8 features, classified from the last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project, residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.block = nn.Sequential(_conv_bn(cin, hidden, 1, act=nn.ReLU6),
                                   _conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                                   _conv_bn(hidden, cout, 1, act=None))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2Small(nn.Module):
    """MobileNetV2 at width 0.25 on 32x32: stem, four inverted residuals, pooled classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn(3, 8, 3, 2, act=nn.ReLU6),
            InvertedResidual(8, 8, 1, 1),
            InvertedResidual(8, 8, 2, 6),
            InvertedResidual(8, 8, 1, 6),
            InvertedResidual(8, 16, 2, 6),
            _conv_bn(16, 64, 1, act=nn.ReLU6),
        )
        self.classifier = nn.Linear(64, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeeze, 1)
        self.expand = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        scale = F.adaptive_avg_pool2d(x, 1)
        scale = F.hardsigmoid(self.expand(F.relu(self.reduce(scale))))
        return x * scale


class MobileNetV3SmallBlock(nn.Module):
    """MobileNetV3-small's pieces on 32x32: hardswish stem, a depthwise block with
    squeeze-excite, an expanded hardswish block, pooled hardswish classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 8, 3, 2, act=nn.Hardswish)
        self.dw = _conv_bn(8, 8, 3, 2, groups=8)
        self.se = SqueezeExcite(8, 8)
        self.project = _conv_bn(8, 8, 1, act=None)
        self.expand = _conv_bn(8, 24, 1, act=nn.Hardswish)
        self.dw2 = _conv_bn(24, 24, 3, 1, groups=24, act=nn.Hardswish)
        self.project2 = _conv_bn(24, 16, 1, act=None)
        self.classifier = nn.Sequential(nn.Linear(16, 32), nn.Hardswish(), nn.Linear(32, 10))

    def forward(self, x: Tensor) -> Tensor:
        x = self.project(self.se(self.dw(self.stem(x))))
        x = self.project2(self.dw2(self.expand(x)))
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Fire(nn.Module):
    """SqueezeNet's fire module: 1x1 squeeze, then 1x1 and 3x3 expands concatenated."""

    def __init__(self, cin: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1x1 = nn.Conv2d(squeeze, expand, 1)
        self.expand3x3 = nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.expand1x1(x)), F.relu(self.expand3x3(x))], 1)


class SqueezeNetSmall(nn.Module):
    """SqueezeNet 1.1's layout on 32x32: ceil-mode 3x3/2 max-pools between fire modules, a
    1x1 conv classifier and a global average pool."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(16, 4, 8), Fire(16, 4, 8),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(16, 8, 16),
        )
        self.classifier = nn.Sequential(nn.Conv2d(32, 10, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))

    def forward(self, x: Tensor) -> Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


def _channel_shuffle(x: Tensor, groups: int) -> Tensor:
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2's stride-1 unit: channel split (chunk), a branch, cat, channel shuffle."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        half = channels // 2
        self.branch = nn.Sequential(_conv_bn(half, half, 1),
                                    _conv_bn(half, half, 3, groups=half, act=None),
                                    _conv_bn(half, half, 1))

    def forward(self, x: Tensor) -> Tensor:
        a, b = x.chunk(2, dim=1)
        return _channel_shuffle(torch.cat([a, self.branch(b)], 1), 2)


class ShuffleNetSmall(nn.Module):
    """ShuffleNetV2 0.5's structure on 32x32: stem, two shuffle units, pooled classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 16, 3, 2)
        self.units = nn.Sequential(ShuffleUnit(16), ShuffleUnit(16))
        self.classifier = nn.Linear(16, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.units(self.stem(x))
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SegmentationLogitsArgmax(nn.Module):
    """A segmentation head returning both its 4-D logits and the per-pixel class map (int64
    argmax over channels): two outputs of different dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_bn(3, 8), _conv_bn(8, 8), nn.Conv2d(8, 5, 1))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.body(x)
        return logits, torch.argmax(logits, dim=1)


class SoftmaxClassifier(nn.Module):
    """A small CNN whose output is class probabilities (softmax) rather than logits."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_bn(1, 8, 3, 2), _conv_bn(8, 16, 3, 2))
        self.head = nn.Linear(16, 6)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.flatten(F.adaptive_avg_pool2d(self.body(x), 1), 1)
        return torch.softmax(self.head(x), dim=-1)


class LayerNormMlp(nn.Module):
    """An MLP over 24 sensor features with layer norm and GELU between its linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(24, 48), nn.LayerNorm(48), nn.GELU(),
                                  nn.Linear(48, 48), nn.LayerNorm(48), nn.GELU(),
                                  nn.Linear(48, 5))

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)


class UNetSmall(nn.Module):
    """An encoder-decoder on 32x32: two strided encoder stages, a nearest-neighbour upsampling
    decoder whose stages concatenate the encoder's skip features, a 1x1 mask head."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1 = _conv_bn(3, 8)
        self.enc2 = _conv_bn(8, 16, 3, 2)
        self.bottleneck = _conv_bn(16, 16, 3, 2)
        self.dec2 = _conv_bn(32, 16)
        self.dec1 = _conv_bn(24, 8)
        self.mask = nn.Conv2d(8, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(e1)
        b = self.bottleneck(e2)
        d2 = self.dec2(torch.cat([F.interpolate(b, scale_factor=2.0, mode="nearest"), e2], 1))
        d1 = self.dec1(torch.cat([F.interpolate(d2, scale_factor=2.0, mode="nearest"), e1], 1))
        return self.mask(d1)


class DsTcn(nn.Module):
    """A depthwise-separable temporal conv net (DS-TCN keyword spotter) over 49 frames of 10
    MFCCs: depthwise 1-D convs (one dilated) each followed by a pointwise 1-D conv."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv1d(10, 24, 3, padding=1), nn.BatchNorm1d(24), nn.ReLU()]
        for dilation in (1, 2):
            layers += [nn.Conv1d(24, 24, 5, padding=2 * dilation, dilation=dilation, groups=24),
                       nn.BatchNorm1d(24), nn.ReLU(),
                       nn.Conv1d(24, 24, 1), nn.BatchNorm1d(24), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AvgPool1d(49)
        self.head = nn.Linear(24, 12)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


class DetectionHead(nn.Module):
    """A single-scale anchor head: a small backbone, then box (4) and objectness/class (1 + 3)
    branches with sigmoid, flattened and concatenated into [1, anchors, 8]."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(_conv_bn(3, 8, 3, 2), _conv_bn(8, 16, 3, 2))
        self.boxes = nn.Conv2d(16, 2 * 4, 1)
        self.scores = nn.Conv2d(16, 2 * 4, 1)

    def forward(self, x: Tensor) -> Tensor:
        f = self.backbone(x)
        boxes = self.boxes(f).permute(0, 2, 3, 1).reshape(1, -1, 4)
        scores = torch.sigmoid(self.scores(f)).permute(0, 2, 3, 1).reshape(1, -1, 4)
        return torch.cat([boxes, scores], dim=-1)


class TwoTower(nn.Module):
    """Two inputs (an image and a feature vector) and two outputs (a class score vector and an
    embedding), as multi-sensor products use."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Sequential(_conv_bn(1, 8, 3, 2), _conv_bn(8, 16, 3, 2))
        self.features = nn.Sequential(nn.Linear(12, 16), nn.ReLU())
        self.classes = nn.Linear(32, 4)
        self.embedding = nn.Linear(32, 8)

    def forward(self, image: Tensor, features: Tensor) -> tuple[Tensor, Tensor]:
        a = torch.flatten(F.adaptive_avg_pool2d(self.image(image), 1), 1)
        joint = torch.cat([a, self.features(features)], dim=1)
        return self.classes(joint), self.embedding(joint)


class BasicBlock(nn.Module):
    """ResNet's basic block as torchvision writes it: conv-BN-ReLU, conv-BN, plus the identity
    (or a strided 1x1 conv-BN shortcut when the shape changes), an in-place add, ReLU."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv_bn(cin, cout, 3, stride)
        self.conv2 = _conv_bn(cout, cout, act=None)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (None if stride == 1 and cin == cout else
                           _conv_bn(cin, cout, 1, stride, act=None))

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.conv2(self.conv1(x))
        out += identity
        return self.relu(out)


class ResNetBasic(nn.Module):
    """A CPU-sized ResNet of basic blocks on 16x16: identity adds, then a strided block with a
    1x1 shortcut, a max-pooled stem and a pooled linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(_conv_bn(3, 8), nn.MaxPool2d(3, 2, 1))
        self.blocks = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 8), BasicBlock(8, 16, 2),
                                    BasicBlock(16, 16))
        self.head = nn.Linear(16, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class TransposedDecoder(nn.Module):
    """An autoencoder-style decoder: strided conv encoder with hardswish, transposed-conv
    decoder back to the input size."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(_conv_bn(1, 8, 3, 2, act=nn.Hardswish),
                                     _conv_bn(8, 16, 3, 2, act=nn.Hardswish))
        self.decoder = nn.Sequential(nn.ConvTranspose2d(16, 8, 2, stride=2), nn.ReLU(),
                                     nn.ConvTranspose2d(8, 1, 2, stride=2))

    def forward(self, x: Tensor) -> Tensor:
        return self.decoder(self.encoder(x))


class IndexOps(nn.Module):
    """Index and selection ops over channels-last feature maps: argmin over channels,
    index_select and gather along channels, a comparison with where and zeros_like, a channel
    cat, a spatial amax, and a bool mask output (three outputs of three dtypes). The ReLU's
    output feeds two ops, so its quantization range is shared."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 4, 1)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        y = torch.relu(self.conv(x))
        z = self.conv2(y)
        classes = torch.argmin(z, dim=1)
        picked = torch.index_select(y, 1, torch.tensor([3, 0, 1]))
        first = torch.gather(z, 1, torch.zeros(1, 1, 8, 8, dtype=torch.long))
        kept = torch.where(z > 0.1, z, torch.zeros_like(z))
        joined = torch.cat([picked, kept, first], dim=1)
        return torch.amax(joined, dim=(2, 3)), classes, z > 0.0


class Crnn(nn.Module):
    """A CRNN keyword spotter: conv-BN-ReLU and max-pool over a [1, 1, 8, 16] spectrogram, the
    channels and frequency of each frame flattened into a GRU step, a linear head on the last
    step. The permute reads the convolution's channels-last output."""

    def __init__(self) -> None:
        super().__init__()
        self.front = nn.Sequential(_conv_bn(1, 8), nn.MaxPool2d(2))
        self.gru = nn.GRU(8 * 4, 16, batch_first=True)
        self.head = nn.Linear(16, 6)

    def forward(self, x: Tensor) -> Tensor:
        y = self.front(x)  # [1, 8, 4, 8]: channels, frequency, time
        frames = y.permute(0, 3, 1, 2).reshape(1, 8, 32)
        out, _ = self.gru(frames)
        return self.head(out[:, -1])


class GatedFlipTwoOutputs(nn.Module):
    """A conv whose output a squeeze-excite style gate multiplies (a [1, 8, 1, 1] broadcast),
    flipped along its width, then two outputs: the mean over channels, and the flipped map
    itself through an eval-mode dropout. One NPU partition on each side of the flip, the second
    with two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 1)
        self.drop = nn.Dropout(0.3)
        self.gate = nn.Parameter(torch.rand(1, 8, 1, 1) * 2 - 1)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = torch.relu(self.c1(x))
        g = torch.sigmoid(self.c2(h).mean(dim=(2, 3), keepdim=True))
        y = torch.flip(h * g, dims=[3])
        return y.mean(dim=1, keepdim=True), self.drop(y)


conv1d_audio = _seeded(Conv1dAudio, (1, 10, 40))
attention_block = _seeded(AttentionBlock, (1, 16, 32))
argmax_head = _seeded(ArgmaxSegmentation, (1, 3, 16, 16))
topk_head = _seeded(TopkHead, (1, 32))
sensor_mlp = _seeded(SensorMlp, (1, 3, 50))
rank3_rank5 = _seeded(Rank3Rank5, (1, 8, 16))
split_chunk_cat = _seeded(SplitChunkCat, (1, 3, 16, 16))
residual_block = _seeded(ResidualBlock, (1, 3, 16, 16))
gru_kws = _seeded(GruKws, (1, 8, 10))
lstm_classifier = _seeded(LstmClassifier, (1, 6, 8))
mobilenet_v2_small = _seeded(MobileNetV2Small, (1, 3, 32, 32))
mobilenet_v3_small_block = _seeded(MobileNetV3SmallBlock, (1, 3, 32, 32))
squeezenet_small = _seeded(SqueezeNetSmall, (1, 3, 32, 32))
shufflenet_small = _seeded(ShuffleNetSmall, (1, 3, 32, 32))
segmentation_logits_argmax = _seeded(SegmentationLogitsArgmax, (1, 3, 16, 16))
softmax_classifier = _seeded(SoftmaxClassifier, (1, 1, 16, 16))
layernorm_mlp = _seeded(LayerNormMlp, (1, 24))
unet_small = _seeded(UNetSmall, (1, 3, 32, 32))
ds_tcn = _seeded(DsTcn, (1, 10, 49))
detection_head = _seeded(DetectionHead, (1, 3, 32, 32))
two_tower = _seeded(TwoTower, (1, 1, 16, 16), (1, 12))
resnet_basic = _seeded(ResNetBasic, (1, 3, 16, 16))
transposed_decoder = _seeded(TransposedDecoder, (1, 1, 16, 16))
index_ops = _seeded(IndexOps, (1, 3, 8, 8))
crnn = _seeded(Crnn, (1, 1, 8, 16))
gated_flip_two_outputs = _seeded(GatedFlipTwoOutputs, (1, 4, 12, 12))

USER_MODELS: dict[str, Factory] = {
    "conv1d_audio": conv1d_audio,
    "attention_block": attention_block,
    "argmax_head": argmax_head,
    "topk_head": topk_head,
    "sensor_mlp": sensor_mlp,
    "rank3_rank5": rank3_rank5,
    "split_chunk_cat": split_chunk_cat,
    "residual_block": residual_block,
    "gru_kws": gru_kws,
    "lstm_classifier": lstm_classifier,
    "mobilenet_v2_small": mobilenet_v2_small,
    "mobilenet_v3_small_block": mobilenet_v3_small_block,
    "squeezenet_small": squeezenet_small,
    "shufflenet_small": shufflenet_small,
    "segmentation_logits_argmax": segmentation_logits_argmax,
    "softmax_classifier": softmax_classifier,
    "layernorm_mlp": layernorm_mlp,
    "unet_small": unet_small,
    "ds_tcn": ds_tcn,
    "detection_head": detection_head,
    "two_tower": two_tower,
    "resnet_basic": resnet_basic,
    "transposed_decoder": transposed_decoder,
    "index_ops": index_ops,
    "crnn": crnn,
    "gated_flip_two_outputs": gated_flip_two_outputs,
}


def model_spec(name: str) -> str:
    """The `path/to/file.py:factory` MODEL argument for one of these models."""
    if name not in USER_MODELS:
        raise KeyError(f"no user model {name!r}; known: {', '.join(USER_MODELS)}")
    return f"{__file__}:{name}"
