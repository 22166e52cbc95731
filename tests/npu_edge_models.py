"""Small PyTorch models that push the Ethos-U functional model's edge cases through Vela.

Each `NAME` is a `path/to/file.py:NAME` factory (the CLI's convention) returning an eval-mode
module and example inputs, seeded, so every compile of it is the same program:

- `conv_edges`: explicit asymmetric padding (a TOSA PAD Vela folds into the convolution's
  top/left/bottom/right padding), stride 2 over odd sizes, dilation 2, a 5x5 kernel, a strided
  depthwise convolution, and per-channel weight scales four decades apart (large per-channel
  shifts in the scale records).
- `elementwise_edges`: two inputs, broadcast add over H and multiply over W, a scalar add and
  multiply, average pooling with and without padding (rounding of the division), max pooling
  with padding, sigmoid and tanh (int8 lookup tables DMA'd into SHRAM), leaky ReLU, min/max,
  subtraction and a channel concat.
- `resample_edges`: nearest-neighbour upsampling and a transposed convolution (the IFM
  upscaling modes), and a global average pool.
- `matmul_edges`: an activation-by-activation matmul (an int32 MUL then REDUCE_SUM), a channel
  sum, a mean, abs and hardswish.
- `strided_edges`: a 4x4 convolution of stride 4 with padding 1 over a map whose size needs no
  trimming (30x34): the U85 has no stride 4, so Vela computes it as 16 1x1 convolutions, each
  reading the IFM stepped by 4, summed in accumulators kept between them, the padding in
  stepped units.
- `bilinear_edges`: bilinear upsampling, 2x with half-pixel centres and to 9x11 with aligned
  corners, and a nearest-neighbour downsampling (the U85's native resize, its scales and
  offsets).
- `all_edges`: the four in one program, for a single compile.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_SEED = 7


def _seeded(build, *shapes):
    def factory():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_SEED)
            module = build()
            inputs = tuple(torch.rand(shape) * 2 - 1 for shape in shapes)
        return module.eval(), inputs

    return factory


class ConvEdges(nn.Module):
    def __init__(self):
        super().__init__()
        self.pad = nn.ZeroPad2d((1, 2, 0, 3))  # left, right, top, bottom
        self.c0 = nn.Conv2d(3, 8, 3)
        self.c1 = nn.Conv2d(8, 12, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(12, 12, 3, padding=2, dilation=2)
        self.dw = nn.Conv2d(12, 12, 3, stride=2, padding=1, groups=12)
        self.c3 = nn.Conv2d(12, 16, 5, padding=2)
        with torch.no_grad():
            # per-output-channel weight magnitudes spanning four decades
            self.c3.weight.mul_(torch.logspace(-3, 1, 16).view(16, 1, 1, 1))
            self.c3.bias.mul_(torch.logspace(-2, 1, 16))

    def forward(self, x):
        x = F.relu(self.c0(self.pad(x)))
        x = F.relu(self.c1(x))
        x = self.c2(x)
        x = F.relu(self.dw(x))
        return self.c3(x)


class ElementwiseEdges(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(8, 8, 1)
        self.avg = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)
        self.avg2 = nn.AvgPool2d(2)
        self.max = nn.MaxPool2d(3, stride=2, padding=1)
        self.act = nn.LeakyReLU(0.1)

    def forward(self, x, y):
        a = self.c0(x)
        s = a + y  # y is [1, 8, 1, 7]: broadcast over H
        m = a * y[:, :, :, :1]  # [1, 8, 1, 1]: broadcast over H and W
        t = torch.sigmoid(s) - torch.tanh(m)
        u = torch.maximum(self.act(s * 0.75 + 0.25), torch.minimum(m, t))
        p = torch.cat([self.avg(u), self.max(t)], dim=1)
        return p, self.avg2(s)


class ResampleEdges(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.t0 = nn.ConvTranspose2d(8, 6, 2, stride=2)
        self.c1 = nn.Conv2d(14, 4, 3, padding=1)

    def forward(self, x):
        d = F.relu(self.c0(x))
        u = torch.cat([self.up(d), self.t0(d)], dim=1)
        y = self.c1(u)
        return y, F.adaptive_avg_pool2d(y, 1)


class MatmulEdges(nn.Module):
    """Activation x activation matmul (Vela: an int32 MUL into a scratch buffer, then a
    REDUCE_SUM over its depth), a channel sum and a mean, abs and hardswish."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, a, b):
        m = torch.matmul(self.proj(a), b)  # [1, 8, 16] x [1, 16, 12]
        return m, torch.abs(m) + F.hardswish(m), m.sum(dim=-1, keepdim=True), m.mean(dim=1)


class StridedEdges(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(4, 8, 4, stride=4, padding=1)

    def forward(self, x):
        return F.relu(self.c0(x))


class BilinearEdges(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.c0(x))
        up = F.interpolate(x, scale_factor=2.0, mode="bilinear")
        aligned = F.interpolate(x, size=(9, 11), mode="bilinear", align_corners=True)
        down = F.interpolate(up, size=(3, 4), mode="nearest")
        return up, aligned, down


class AllEdges(nn.Module):
    """The four above in one program (one compile for the test suite): five inputs, nine
    outputs."""

    def __init__(self):
        super().__init__()
        self.conv = ConvEdges()
        self.elementwise = ElementwiseEdges()
        self.resample = ResampleEdges()
        self.matmul = MatmulEdges()
        self.bridge = nn.Conv2d(16, 4, 1)

    def forward(self, x, y, z, a, b):
        c = self.conv(x)
        e = self.elementwise(y, z)
        r = self.resample(self.bridge(F.interpolate(c, size=(10, 12), mode="nearest")))
        return c, *e, *r, *self.matmul(a, b)


conv_edges = _seeded(ConvEdges, (1, 3, 15, 13))
elementwise_edges = _seeded(ElementwiseEdges, (1, 8, 9, 7), (1, 8, 1, 7))
resample_edges = _seeded(ResampleEdges, (1, 4, 10, 12))
matmul_edges = _seeded(MatmulEdges, (1, 8, 16), (1, 16, 12))
strided_edges = _seeded(StridedEdges, (1, 4, 30, 34))
bilinear_edges = _seeded(BilinearEdges, (1, 4, 5, 6))
all_edges = _seeded(AllEdges, (1, 3, 15, 13), (1, 8, 9, 7), (1, 8, 1, 7), (1, 8, 16),
                    (1, 16, 12))

EDGE_MODELS = {"conv_edges": conv_edges, "elementwise_edges": elementwise_edges,
               "resample_edges": resample_edges, "matmul_edges": matmul_edges,
               "strided_edges": strided_edges, "bilinear_edges": bilinear_edges,
               "all_edges": all_edges}


def model_spec(name: str) -> str:
    if name not in EDGE_MODELS:
        raise KeyError(f"no edge model {name!r}; known: {', '.join(EDGE_MODELS)}")
    return f"{__file__}:{name}"


class Int16Edges(nn.Module):
    """For 16-bit activations (ExecuTorch's a16w8 quantization, `lower_a16w8`): convolution,
    strided depthwise, a padded max pool, an add and a multiply of two activations, sigmoid
    and tanh (interpolating int16 lookup tables). (Vela 5.1 refuses an int16 convolution
    whose output feeds both an add and a table, so each branch has its own convolution.)"""

    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(4, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.c1 = nn.Conv2d(8, 8, 1)
        self.c2 = nn.Conv2d(4, 8, 3, padding=1)
        self.c3 = nn.Conv2d(4, 8, 1)

    def forward(self, x, y):
        a = self.c0(x)
        return (self.c1(F.relu(self.dw(a))), F.max_pool2d(a, 3, 2, 1),
                torch.sigmoid(self.c2(x) + y), torch.tanh(self.c3(x)) * y)


int16_edges = _seeded(Int16Edges, (1, 4, 8, 8), (1, 8, 8, 8))


def lower_a16w8(factory, npu: str, calibration_samples: int = 4):
    """Quantize with 16-bit activations and 8-bit weights and lower to the Ethos-U through
    ExecuTorch's Arm backend (the orchestrator's own flow quantizes to int8 only). Returns one
    (TOSA flatbuffer, delegate payload) pair per NPU partition, as Vela compiled them."""
    from executorch.backends.arm.quantizer.arm_quantizer import (
        get_symmetric_a16w8_quantization_config)

    return _lower_upstream(factory, npu, get_symmetric_a16w8_quantization_config(
        is_per_channel=True), calibration_samples)


def lower_int8(factory, npu: str, calibration_samples: int = 4):
    """`factory`'s model through upstream's own int8 flow alone (EthosUQuantizer's symmetric
    per-channel config, EthosUPartitioner, Vela), none of the orchestrator's rewrites: the
    (TOSA flatbuffer, delegate payload) pairs upstream makes, to show upstream's behaviour."""
    from executorch.backends.arm.quantizer import get_symmetric_quantization_config

    return _lower_upstream(factory, npu, get_symmetric_quantization_config(is_per_channel=True),
                           calibration_samples)


def _lower_upstream(factory, npu: str, config, calibration_samples: int):
    from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
    from executorch.backends.arm.quantizer import EthosUQuantizer
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    import tempfile
    from pathlib import Path

    from partitioners.npu import vela_runs_recorded

    module, inputs = factory()
    system, memory = {"ethos-u65": ("Ethos_U65_High_End", "Shared_Sram"),
                      "ethos-u85": ("Ethos_U85_SYS_DRAM_Mid", "Sram_Only")}.get(
        npu[:9], ("Ethos_U55_High_End_Embedded", "Shared_Sram"))
    spec = EthosUCompileSpec(npu, system_config=system, memory_mode=memory)
    quantizer = EthosUQuantizer(spec)
    quantizer.set_global(config)
    prepared = prepare_pt2e(torch.export.export(module, inputs, strict=True).module(), quantizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED + 1)
        for _ in range(calibration_samples):
            prepared(*(torch.rand(x.shape) * 2 - 1 for x in inputs))
    program = torch.export.export(convert_pt2e(prepared), inputs, strict=True)
    with tempfile.TemporaryDirectory() as work, vela_runs_recorded(Path(work)) as runs:
        to_edge_transform_and_lower(program, partitioner=[EthosUPartitioner(spec)],
                                    compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return [(run.tosa_bytes, run.payload_bytes) for run in runs]
