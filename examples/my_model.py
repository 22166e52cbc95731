"""An example of the `file.py:factory` model source: `orchestrate plan examples/my_model.py:factory`.

The factory returns a fresh module and the example inputs it is exported with; the example
inputs fix the shapes the compiled program accepts (an MCU build has static shapes).
"""

import torch
from torch import Tensor, nn


class TinyKeywordNet(nn.Module):
    """A two-conv keyword spotter on a 1x1x49x10 MFCC patch, 12 class logits out."""

    def __init__(self, num_classes: int = 12) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def factory() -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Return `(module, example_inputs)`; the module is put in eval mode by the loader anyway."""
    # In a real project, load trained weights here, e.g. module.load_state_dict(torch.load(...)).
    module = TinyKeywordNet().eval()
    return module, (torch.randn(1, 1, 49, 10),)
