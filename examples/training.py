"""The one training loop of the models trained here (examples/digits.py, examples/skewed.py):
seeded, on one thread, so every machine and run trains the same weights."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def fit(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, samples: int,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], lr: float, epochs: int,
        seed: int = 0) -> nn.Module:
    """`model` freshly initialised from `seed` and trained with Adam on the first `samples`
    rows of `inputs`/`targets`, in batches of 64 in a seeded order; returned in eval mode."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same weights on every machine and run
    try:
        torch.manual_seed(seed)
        for parameter in model.parameters():  # a fresh, seeded initialisation
            if parameter.dim() > 1:
                nn.init.kaiming_uniform_(parameter, a=5 ** 0.5)
            else:
                nn.init.zeros_(parameter)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        order = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            for batch in torch.randperm(samples, generator=order).split(64):
                optimizer.zero_grad()
                loss(model(inputs[batch]), targets[batch]).backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()
