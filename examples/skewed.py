"""A small regression whose int8 program loses against float: skewed (log-normal) targets.

    python -m examples.skewed skewed/     # writes calibration.npz and validation.npz
    orchestrate compile examples/skewed.py:mlp -o skewed.pte --npu ethos-u55-128 \\
        --calibration skewed/calibration.npz
    orchestrate verify skewed.pte --dataset skewed/validation.npz --labels none

The data is made here with a fixed seed (no download): 16 standard-normal features per sample
and four targets, each the exponential of a linear form of them (a log-normal spread: most
targets near zero, a few twenty times their RMS), the shape of a power, a price or an energy.
The MLP (16 -> 64 -> 64 -> 4, ReLU) is trained in a couple of seconds on 2,048 samples, on one
thread, so every run trains the same weights; 512 more samples are the validation set.

Why int8 loses here: a tensor's int8 step is its largest value over 127, and a log-normal value
has a large peak-to-RMS ratio, so the values most samples carry are a few steps wide; int16
steps are 256 times finer (`--precision MODULE=a16w8`, `--precision auto`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from examples.training import fit

FEATURES, TARGETS = 16, 4
TRAIN, VALIDATE = 2048, 512
SEED = 0


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs N x 16, targets N x 4) for N = TRAIN + VALIDATE, from a seeded generator."""
    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(TRAIN + VALIDATE, FEATURES, generator=generator)
    mixing = torch.randn(FEATURES, TARGETS, generator=generator) / FEATURES ** 0.5
    return inputs, torch.exp(1.2 * inputs @ mixing)


class SkewedMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(),
                                    nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, TARGETS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(x))


def _trained(model: nn.Module, epochs: int) -> nn.Module:
    inputs, targets = _data()
    return fit(model, inputs, targets, TRAIN, nn.functional.mse_loss, lr=0.003, epochs=epochs, seed=SEED)


def mlp():
    """The regression MLP, trained: (module, example inputs)."""
    return _trained(SkewedMlp(), epochs=40), (torch.zeros(1, FEATURES),)


def write_sets(folder: str | Path) -> tuple[Path, Path]:
    """calibration.npz (the 2,048 training samples) and validation.npz (the 512 held-out samples; no
    labels: a regression is judged against the float model, `--labels none`) in `folder`, as
    --calibration and --dataset read them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    inputs, _ = _data()
    calibration, validation = folder / "calibration.npz", folder / "validation.npz"
    np.savez(calibration, input0=inputs[:TRAIN].numpy())
    np.savez(validation, input0=inputs[TRAIN:].numpy())
    return calibration, validation


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m examples.skewed FOLDER")
    for written in write_sets(sys.argv[1]):
        print(f"wrote {written}")
