"""Streaming models: one new frame per call, the state in the program.

An always-on keyword spotter runs on every new feature frame (a 40-band log-mel frame every
10 ms), not on a whole window at a time. Its layers keep what they need of the past in
registered buffers they update in place, and the compiled program keeps those buffers from one
`execute` to the next (ExecuTorch's mutable buffers; orchestrator/compilation/program_state.py):

    orchestrate compile examples/streaming.py:kws -o kws_stream.pte --npu none
    orchestrate verify kws_stream.pte --frames 1000 --qemu

Streaming forms of common layers, each a drop-in for the windowed layer it replaces:

- `CausalConv1d`: a Conv1d over time that sees one new frame per call. The last
  (kernel - 1) * dilation input frames are its state (a ring buffer shifted by one frame per
  call); its output frame equals the last output frame of the same Conv1d run over the whole
  window (no padding), so the streaming network computes what the windowed one computes at its
  newest frame, with every past frame's work done once instead of once per window.
- `RunningMean`: an exponential moving average of a feature over frames (the streaming form of
  a global average pool over time), its value the state.
- `GruStep`: a GRU cell stepping one frame, its hidden state in the program.

`kws()` is a 1-D DS-CNN over 40-band features with random weights (seed 0): a causal
convolution, two depthwise-separable blocks (dilations 2 and 4), a running mean of the features
and a 12-class head; `kws_window()` is the same network run over its whole receptive field (the
stateless form, re-run on every frame), with the same weights. `gru()` is a GRU keyword spotter
stepping one frame per call.
"""

from __future__ import annotations

import torch
from torch import nn

FEATURES = 40  # log-mel bands per frame
CLASSES = 12
WIDTH = 64


class CausalConv1d(nn.Module):
    """Conv1d over time, one new frame (1 x C x 1) per call; its state: the last
    (kernel - 1) * dilation input frames."""

    def __init__(self, channels_in: int, channels_out: int, kernel: int, dilation: int = 1,
                 groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels_in, channels_out, kernel, dilation=dilation,
                              groups=groups)
        self.register_buffer("state", torch.zeros(1, channels_in, (kernel - 1) * dilation))

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        window = torch.cat([self.state, frame], dim=2)
        self.state.copy_(window[:, :, 1:])
        return self.conv(window)


class RunningMean(nn.Module):
    """An exponential moving average over frames: `mean = decay * mean + (1 - decay) * x`."""

    def __init__(self, channels: int, decay: float = 0.9) -> None:
        super().__init__()
        self.decay = decay
        self.register_buffer("mean", torch.zeros(1, channels, 1))

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        updated = self.mean * self.decay + frame * (1.0 - self.decay)
        self.mean.copy_(updated)
        return updated


class GruStep(nn.Module):
    """A GRU cell stepping one frame (1 x features); its state: the hidden vector."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.cell = nn.GRUCell(features, hidden)
        self.register_buffer("hidden", torch.zeros(1, hidden))

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        hidden = self.cell(frame, self.hidden)
        self.hidden.copy_(hidden)
        return hidden


def _block_layers(streaming: bool):
    conv = CausalConv1d if streaming else (
        lambda i, o, k, dilation=1, groups=1: nn.Conv1d(i, o, k, dilation=dilation,
                                                        groups=groups))
    return nn.ModuleList([
        conv(FEATURES, WIDTH, 3),
        conv(WIDTH, WIDTH, 3, dilation=2, groups=WIDTH), nn.Conv1d(WIDTH, WIDTH, 1),
        conv(WIDTH, WIDTH, 3, dilation=4, groups=WIDTH), nn.Conv1d(WIDTH, WIDTH, 1)])


# Frames one output frame of the windowed network reads: 1 + (3-1)*1 + (3-1)*2 + (3-1)*4
RECEPTIVE_FIELD = 15


class StreamingKws(nn.Module):
    """The 1-D DS-CNN keyword spotter, one 1 x 40 x 1 frame per call -> 1 x 12 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = _block_layers(streaming=True)
        self.pool = RunningMean(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        x = frame
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(self.pool(x).flatten(1))


class WindowKws(nn.Module):
    """The same layers over the whole receptive field (1 x 40 x 15 frames) every call: the
    stateless form (the running mean cannot be re-run from a window; this form returns the
    head on the newest frame's features)."""

    def __init__(self, streaming: StreamingKws) -> None:
        super().__init__()
        self.layers = _block_layers(streaming=False)
        for mine, theirs in zip(self.layers, streaming.layers):
            mine.load_state_dict({k.removeprefix("conv."): v
                                  for k, v in theirs.state_dict().items() if k != "state"})
        self.head = streaming.head

    def forward(self, window: torch.Tensor) -> torch.Tensor:
        x = window
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x[:, :, -1])


def _streaming_kws() -> StreamingKws:
    torch.manual_seed(0)
    return StreamingKws().eval()


def kws():
    """The streaming keyword spotter (random weights, seed 0): (module, one frame)."""
    generator = torch.Generator().manual_seed(0)
    return _streaming_kws(), (torch.randn(1, FEATURES, 1, generator=generator),)


def kws_window():
    """The stateless form with the same weights: (module, a 15-frame window)."""
    generator = torch.Generator().manual_seed(0)
    return WindowKws(_streaming_kws()).eval(), (
        torch.randn(1, FEATURES, RECEPTIVE_FIELD, generator=generator),)


class GruKws(nn.Module):
    """A GRU keyword spotter stepping one 1 x 40 frame per call -> 1 x 12 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.step = GruStep(FEATURES, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        return self.head(self.step(frame))


def gru():
    """The GRU keyword spotter (random weights, seed 0): (module, one frame)."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    return GruKws().eval(), (torch.randn(1, FEATURES, generator=generator),)
