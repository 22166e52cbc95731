"""The two models `benchmarks/compile_speed.py` adds to the zoo, as `file.py:factory` specs.

- `gru_kws25`: a small keyword spotter, a convolution over a [1, 1, 50, 10] spectrogram (16
  channels, stride 2 in time) whose 25 frames of 16 x 10 = 160 features feed a GRU(160 -> 32),
  and a linear head on the last step: the recurrence unrolls into 25 copies of its step.
- `stack200`: 100 pointwise convolution + ReLU pairs over [1, 16, 8, 8] (200 ops), a graph as
  long as a large model's with small tensors, so per-op work shows against per-model work.

Deterministic (seed 0, the caller's RNG untouched) so both flows compile the same weights.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _seeded(build, shape):
    def factory() -> tuple[nn.Module, tuple[Tensor, ...]]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            module = build()
            inputs = (torch.rand(shape) * 2 - 1,)
        return module.eval(), inputs

    return factory


class GruKws25(nn.Module):
    """conv -> GRU(160 -> 32) over 25 steps -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, stride=(2, 1), padding=1)
        self.gru = nn.GRU(160, 32, batch_first=True)
        self.head = nn.Linear(32, 12)

    def forward(self, x: Tensor) -> Tensor:
        y = torch.relu(self.conv(x))  # [1, 16, 25, 10]: channels, time, frequency
        frames = y.permute(0, 2, 1, 3).reshape(1, 25, 160)
        out, _ = self.gru(frames)
        return self.head(out[:, -1])


class Stack200(nn.Module):
    """100 x (1x1 conv, ReLU): 200 ops."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(*[layer for _ in range(100)
                                    for layer in (nn.Conv2d(16, 16, 1), nn.ReLU())])

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)


gru_kws25 = _seeded(GruKws25, (1, 1, 50, 10))
stack200 = _seeded(Stack200, (1, 16, 8, 8))
