"""Small modules of the shapes ExecuTorch's own Cortex-M and Arm backend tests use
(backends/cortex_m/test/{ops,models}, backends/arm/test/models), each one a symptom the peer
suite found (benchmarks/peer_suite.py runs the whole set). `file.py:factory` model sources."""

import torch
from torch import Tensor, nn


def _seeded(module: nn.Module) -> nn.Module:
    with torch.no_grad():
        for bn in module.modules():
            if isinstance(bn, nn.modules.batchnorm._BatchNorm):
                bn.running_mean.normal_(0.0, 0.5)
                bn.running_var.uniform_(0.5, 1.5)
    return module.eval()


class LstmTuple(nn.Module):
    """backends/cortex_m/test/ops/test_lstm.py: the forward returns the LSTM's own tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)

    def forward(self, x: Tensor):
        return self.lstm(x)


def lstm_tuple():
    torch.manual_seed(0)
    return _seeded(LstmTuple()), (torch.randn(1, 5, 8),)


class IndexSelectColumns(nn.Module):
    """Silero VAD's `x[:, :, idx]`: aten.index.Tensor with None for the leading dimensions."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("idx", torch.tensor([0, 2, 3]))
        self.linear = nn.Linear(3, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x[:, :, self.idx])


def index_none():
    torch.manual_seed(0)
    return _seeded(IndexSelectColumns()), (torch.randn(1, 4, 6),)


class LinearBn(nn.Module):
    """backends/cortex_m/test/models/test_nn_functional.py's linear_bn: F.linear then
    BatchNorm1d(8) on a (2, 16) input."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 16))
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(nn.functional.linear(x, self.weight))


def linear_bn():
    torch.manual_seed(0)
    return _seeded(LinearBn()), (torch.linspace(-1, 1, 32).reshape(2, 16),)


class Mul(nn.Module):
    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return x * y


def mul_broadcast_3():
    """backends/cortex_m/test/ops/test_mul.py's broadcast_3: (2, 1, 2, 1) * (1, 2, 1, 2); the
    product's strides give it dim order (0, 3, 2, 1) (an internal error in the device check)."""
    return Mul().eval(), (torch.linspace(-2, 2, 4).reshape(2, 1, 2, 1),
                          torch.linspace(-5, 5, 4).reshape(1, 2, 1, 2))


class TransposeConvRelu(nn.Module):
    """backends/cortex_m/test/ops/test_conv_transpose.py's stride-2, padding-1 layer with bias,
    then ReLU: a geometry arm_transpose_conv_s8 computes wrong (kernels/catalogue.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.up(x))


def transpose_conv_relu():
    torch.manual_seed(0)
    return TransposeConvRelu().eval(), (torch.randn(1, 4, 4, 4),)


class Conv3d(nn.Module):
    """backends/arm/test/ops' conv3d shape: a 5-D weight (channels-last export converted every
    parameter with `module.to`, which raises on rank 5: an internal error)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(2, 4, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


def conv3d():
    torch.manual_seed(0)
    return Conv3d().eval(), (torch.randn(1, 2, 4, 6, 6),)


class Conv1dStride2(nn.Module):
    """Two stride-2 Conv1d (kernel 3, padding 1) with BatchNorm1d and ReLU, as upstream's
    Conv1d tests and Silero VAD stack them: 1xN convolutions the MVE kernel refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv1d(4, 8, 3, stride=2, padding=1), nn.BatchNorm1d(8)
        self.c2, self.b2 = nn.Conv1d(8, 8, 3, stride=2, padding=1), nn.BatchNorm1d(8)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


def conv1d_stride2():
    torch.manual_seed(0)
    return _seeded(Conv1dStride2()), (torch.randn(1, 4, 32),)


def conv2d_1xn_stride2():
    """The 1xN Conv2d a stride-2 Conv1d of kernel 3 and padding 1 becomes (1x32 input)."""
    torch.manual_seed(0)
    return _seeded(nn.Conv2d(4, 8, (1, 3), stride=(1, 2), padding=(0, 1))), (
        torch.randn(1, 4, 1, 32),)


class Maximum(nn.Module):
    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.maximum(x, y)


def maximum_broadcast_rank4():
    """backends/cortex_m/test/ops/test_maximum.py's broadcast_rank4: (1, 2, 3, 1) and
    (4, 1, 1, 3), which op_maximum.cpp broadcasts over the raw bytes by the sizes."""
    return Maximum().eval(), (torch.linspace(-4, 4, 6).reshape(1, 2, 3, 1),
                              torch.linspace(-6, 6, 12).reshape(4, 1, 1, 3))


class GroupedTransposeConv(nn.Module):
    """backends/cortex_m/test/ops/test_conv_transpose.py's groups=2 layer."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 8, 3, stride=2, padding=1, groups=2)

    def forward(self, x: Tensor) -> Tensor:
        return self.up(x)


def grouped_transpose_conv():
    torch.manual_seed(0)
    return GroupedTransposeConv().eval(), (torch.randn(1, 4, 4, 4),)


class Div(nn.Module):
    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return x / y


def div_rank_4():
    """backends/cortex_m/test/ops/test_div.py's rank-4 tensor division: verify's generated
    (randn) denominators cross zero, and some quantize to their zero point."""
    return Div().eval(), (torch.linspace(-8, 8, 96).reshape(2, 3, 4, 4),
                          torch.linspace(1, 5, 96).reshape(2, 3, 4, 4))


def dilated_transpose_conv():
    """backends/cortex_m/test/ops/test_conv_transpose.py's dilation-2 case."""
    torch.manual_seed(0)
    return _seeded(nn.ConvTranspose2d(2, 4, 3, dilation=2, bias=False)), (
        torch.linspace(0, 30, 128).reshape(1, 2, 8, 8).to(memory_format=torch.channels_last),)


def embedding():
    """backends/arm/test's Embedding(10, 10) of 2x4 int64 indices."""
    torch.manual_seed(0)
    return nn.Embedding(10, 10).eval(), (torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]]),)


class Conv1dBnInForward(nn.Module):
    """A newcomer's 1-D block: Conv1d then BatchNorm1d called in `forward` (not one
    Sequential), twice, then a mean and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm1d(16)
        self.conv2 = nn.Conv1d(16, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm1d(16)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(-1))


def conv1d_bn_in_forward():
    torch.manual_seed(0)
    return _seeded(Conv1dBnInForward()), (torch.linspace(-1, 1, 256).reshape(1, 8, 32),)


class _Block1d(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(channels, channels, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm1d(channels)
        self.c2 = nn.Conv1d(channels, channels, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm1d(channels)

    def forward(self, x: Tensor) -> Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + x)


class ResNet1d(nn.Module):
    """A newcomer's 1-D ResNet over a 256-sample signal: a stride-2 kernel-7 stem, two residual
    blocks (BatchNorm1d called in `forward`), an average pool and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv1d(1, 16, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm1d(16)
        self.blocks = nn.Sequential(_Block1d(16), _Block1d(16))
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.bn(self.stem(x)))
        return self.fc(torch.flatten(self.pool(self.blocks(x)), 1))


def resnet1d():
    torch.manual_seed(0)
    return _seeded(ResNet1d()), (torch.linspace(-1, 1, 256).reshape(1, 1, 256),)


class GroupedConvRelu(nn.Module):
    """torchvision's RegNet block (`f.b`: a 3x3 convolution of group width 16, BatchNorm,
    ReLU), in a residual: ExecuTorch 1.5.1's Arm backend splits the grouped convolution per
    group and then finds no output quantization for the pieces, since the quantizer fused the
    convolution with its ReLU; upstream's flow refuses the whole partition."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(8, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1, groups=2, bias=False),
                               nn.BatchNorm2d(32), nn.ReLU())
        self.c = nn.Conv2d(32, 8, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(self.b(self.a(x))) + x


def grouped_conv_relu():
    torch.manual_seed(0)
    return _seeded(GroupedConvRelu()), (torch.randn(1, 8, 16, 16),)
