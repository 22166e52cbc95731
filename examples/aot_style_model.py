"""An example of ExecuTorch's aot_arm_compiler.py model file convention.

Use it as `orchestrate plan examples/aot_style_model.py`.

A file in this style defines two module-level names: `ModelUnderTest`, an nn.Module instance,
and `ModelInputs`, the tuple of example tensors it is exported with; these are the names that
ExecuTorch's `aot_arm_compiler --model_name=<file>.py` reads, so one file serves both tools.
"""

import torch
from torch import Tensor, nn


class SumMlp(nn.Module):
    """Two 1x8 vectors in: a small MLP over their sum, 4 logits out."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.out(torch.relu(self.hidden(x + y)))


ModelUnderTest = SumMlp().eval()
ModelInputs = (torch.randn(1, 8), torch.randn(1, 8))
