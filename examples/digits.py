"""Two small classifiers trained here on scikit-learn's bundled handwritten digits (8x8 grey
images of 0-9, 1,797 samples; no download): accuracy you can check on the device.

    orchestrate compile examples/digits.py:cnn -o digits.pte --npu ethos-u55-128 \\
        --calibration digits/calibration.npz
    python -m examples.digits digits/        # writes calibration.npz and validation.npz
    orchestrate verify digits.pte --dataset digits/validation.npz --min-accuracy 90

`cnn()` is two convolutions and a linear layer, `mlp()` two linear layers; each is trained in
a couple of seconds on the first 1,437 samples with a fixed seed, on one thread, so every run
trains the same weights. The last 360 samples are the validation set, never trained on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from examples.training import fit

TRAIN = 1437  # samples 0..1436 train; 1437..1796 validate
SEED = 0


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits  # lazy: heavy (scikit-learn)

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0  # N,1,8,8 in [0,1]
    return images, torch.tensor(data.target, dtype=torch.int64)


class DigitsCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.classifier = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class DigitsMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _trained(model: nn.Module, epochs: int) -> nn.Module:
    images, labels = _digits()
    return fit(model, images, labels, TRAIN, nn.functional.cross_entropy, lr=0.01, epochs=epochs, seed=SEED)


def cnn():
    """The convolutional classifier, trained: (module, example inputs)."""
    return _trained(DigitsCnn(), epochs=8), (torch.zeros(1, 1, 8, 8),)


def mlp():
    """The two-layer perceptron, trained: (module, example inputs)."""
    return _trained(DigitsMlp(), epochs=15), (torch.zeros(1, 1, 8, 8),)


def write_sets(folder: str | Path) -> tuple[Path, Path]:
    """calibration.npz (256 training images) and validation.npz (the 360 held-out images and
    their labels) in `folder`, as --calibration and --dataset read them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    images, labels = _digits()
    calibration, validation = folder / "calibration.npz", folder / "validation.npz"
    np.savez(calibration, input0=images[:256].numpy())
    np.savez(validation, input0=images[TRAIN:].numpy(), labels=labels[TRAIN:].numpy())
    return calibration, validation


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m examples.digits FOLDER")
    for written in write_sets(sys.argv[1]):
        print(f"wrote {written}")
