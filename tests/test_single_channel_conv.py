"""A convolution with one input channel (groups 1) on CMSIS-NN's convolution, as TFLM runs it.

ExecuTorch 1.5.1's `_get_convolution_replacement` takes `in_channels == groups` as depthwise, so
the first layer of an audio or greyscale model (one input channel, groups 1) ran as CMSIS-NN's
depthwise kernel with a depth multiplier of its output channels: keyword spotting's first layer
on the M4 cost 1,917,760 instructions against TFLM's 1,111,480 (docs/benchmarks.md).
`partitioners/upstream_cortex_m.single_channel_convolutions_as_conv2d` gives it the convolution
kernel. The first test shows upstream's form and fails once upstream changes it; the program's
values on the device are held by verify (the session's DS-CNN CPU-only program runs on QEMU in
tests/test_profile.py, and `test_a_one_channel_program_verifies_on_qemu` here)."""

from __future__ import annotations

import torch

from tests.device_tools import qemu_or_missing, verify_qemu_passes
from tests.ethos_u_edges import ethos_u_quantized


class OneChannel(torch.nn.Module):
    """A one-channel input into a 10x4 convolution (keyword spotting's first layer, smaller),
    then a depthwise convolution that must stay depthwise."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Conv2d(1, 8, (5, 3), stride=(2, 1), padding=(2, 1))
        self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x):
        return self.depthwise(torch.relu(self.first(x)))


def _edge():
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    _, program = ethos_u_quantized(OneChannel().eval(), lambda generator: (
        torch.rand(1, 1, 12, 6, generator=generator) * 2 - 1,))
    return to_edge_transform_and_lower(program, compile_config=cortex_m_edge_compile_config())


def _kernels(program) -> list[str]:
    names = [getattr(n.target, "__name__", "") for n in program.graph_module.graph.nodes
             if n.op == "call_function"]
    return [name.split(".")[1] for name in names
            if name.startswith("cortex_m.quantized_") and "conv" in name]


def _weights(program) -> list[torch.Tensor]:
    from executorch.backends.transforms.utils import get_param_tensor

    return [get_param_tensor(program, n.args[1]) for n in program.graph_module.graph.nodes
            if n.op == "call_function" and "conv2d" in str(n.target)]


def test_upstream_runs_a_one_channel_convolution_as_depthwise():
    """ExecuTorch 1.5.1 (aten_to_cortex_m_pass.py:528): fails once upstream gives such a
    convolution its convolution kernel, and then the adapter can go."""
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.backends.cortex_m.target_config import CortexMTargetConfig

    program = CortexMPassManager(_edge().exported_program(),
                                 target_config=CortexMTargetConfig.from_target_string("cortex-m4")
                                 ).transform()
    assert _kernels(program) == ["quantized_depthwise_conv2d", "quantized_depthwise_conv2d"]
    first = _weights(program)[0]
    assert tuple(first.shape) == (1, 5, 3, 8)  # IHWO, a depth multiplier of 8


def test_route_to_cpu_gives_it_the_convolution_kernel_with_the_same_weights():
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.backends.cortex_m.target_config import CortexMTargetConfig

    from partitioners.cpu import route_to_cpu

    upstream = CortexMPassManager(_edge().exported_program(),
                                  target_config=CortexMTargetConfig.from_target_string("cortex-m4")
                                  ).transform()
    program, decisions, workarounds = route_to_cpu(_edge(), "cortex-m4")
    assert _kernels(program) == ["quantized_conv2d", "quantized_depthwise_conv2d"]
    ohwi, depthwise = _weights(program)
    ihwo, upstream_depthwise = _weights(upstream)
    assert tuple(ohwi.shape) == (8, 5, 3, 1)
    assert torch.equal(ohwi, ihwo.permute(3, 1, 2, 0))  # the same int8 codes, OHWI
    assert torch.equal(depthwise, upstream_depthwise)  # the real depthwise is untouched
    assert sorted(d.message for d in decisions.values() if "conv" in d.message) == [
        "lowered to cortex_m.quantized_conv2d.default",
        "lowered to cortex_m.quantized_depthwise_conv2d.default"]
    (fix,) = [w for w in workarounds if "one input channel" in w.message]
    assert "`in_channels == groups` taken as depthwise" in fix.upstream
    assert "depth multiplier of 8" in fix.message


def test_a_one_channel_program_verifies_on_qemu(tmp_path, capsys):
    """The rewritten convolution's values on the device: CPU-only on the M4 (DSP tier), the
    twin against QEMU byte for byte."""
    import orchestrator

    qemu_or_missing()
    model = tmp_path / "one_channel.py"
    model.write_text(
        "import torch\n"
        "from tests.test_single_channel_conv import OneChannel\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return OneChannel().eval(), (torch.rand(1, 1, 12, 6) * 2 - 1,)\n")
    result = orchestrator.compile(f"{model}:build", tmp_path / "m.pte", npu="none",
                                  cpu="cortex-m4")
    kernels = [r.kernel for r in result.compiled.placements
               if r.op == "aten.convolution.default"]
    assert kernels[0] == "arm_convolve_s8" and kernels[1].startswith("arm_depthwise_conv"), kernels
    verify_qemu_passes(tmp_path / "m.pte", capsys)


def test_the_session_ds_cnn_runs_its_first_layer_on_the_convolution(compiles):
    compiled, _ = compiles.get("ds-cnn", "corstone300", "none", "cortex-m55")
    first = next(r for r in compiled.placements if r.op == "aten.convolution.default")
    assert first.kernel == "arm_convolve_s8", first
