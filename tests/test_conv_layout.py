"""A convolution whose input is not channels-last (after a reshape, a channel shuffle, an
`.onnx`'s input Reshape) computes NCHW, and ExecuTorch's Cortex-M quantizer leaves such a
convolution in float on the portable kernel. CPU-only, its input is made channels-last first
(partitioners/module_forms.conv_inputs_channels_last): int8 on CMSIS-NN, the same values."""

from __future__ import annotations

import json

SHUFFLE = '''
import torch
from torch import nn


class Shuffle(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Conv2d(3, 16, 3, padding=1)
        self.branch = nn.Conv2d(16, 16, 1)
        self.flat = nn.Conv2d(1, 4, 3, padding=1)

    def forward(self, x):
        x = torch.relu(self.pre(x))
        b, c, h, w = x.shape  # ShuffleNetV2's channel shuffle
        x = x.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous().view(b, c, h, w)
        y = torch.relu(self.branch(x))
        return y, self.flat(y.mean(1, keepdim=True))


def model():
    torch.manual_seed(0)
    return Shuffle().eval(), (torch.randn(1, 3, 12, 12),)
'''


def test_convolutions_after_a_channel_shuffle_run_int8_on_cmsis_nn(tmp_path):
    import orchestrator
    from orchestrator.device_runs.combined import verify_all
    from partitioners.module_forms import _nchw_convs

    source = tmp_path / "shuffle.py"
    source.write_text(SHUFFLE)
    namespace: dict = {}
    exec(compile(SHUFFLE, str(source), "exec"), namespace)  # the test's own model
    module, inputs = namespace["model"]()
    # upstream's form: both convolutions after the shuffle and the mean compute NCHW
    assert {id(module.branch), id(module.flat)} <= _nchw_convs(module, inputs)

    pte = tmp_path / "shuffle.pte"
    orchestrator.compile(f"{source}:model", pte, npu="none")
    plan = json.loads((tmp_path / "shuffle.artifacts" / "plan.json").read_text())
    convs = [op for op in plan["ops"] if op["op"].startswith("aten.convolution")
             and op["kind"] == "op"]
    assert len(convs) == 3 and {op["placement"] for op in convs} == {"cmsis-nn"}, \
        [(op["name"], op["placement"]) for op in convs]
    verdict = verify_all(pte, samples=2, methods=("twin",))
    assert verdict.exit_code == 0, verdict.render_text()
