"""What we hand Vela against what upstream hands it: the same values, fewer NPU cycles.

Two rewrites of the TOSA graph before Vela (partitioners/conv_padding.py and
partitioners/upstream_ethos_u.py: live_activations_kept), each shown against upstream's form on
a small model, and MLPerf Tiny's visual wake words file held against the incumbent (the same
.tflite compiled by `vela`), whose Vela estimate it must not exceed.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cost_models.npu import read_vela_dir
from npu_driver.tosa_twin import graph_io, main_block, run_tosa
from partitioners.npu import vela_runs_recorded
from partitioners.upstream_ethos_u import conv_pads_folded, live_activations_kept
from tests.device_tools import mlperf_tiny
from tests.ethos_u_edges import ethos_u55_spec, ethos_u_quantized

SHAPE = (1, 3, 16, 16)


class SamePadded(nn.Module):
    """TFLite's SAME padding at stride 2 on an even input: 0 rows before, 1 after, written as an
    explicit pad (PyTorch pads both sides alike); a third pad with a value other than zero."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2)
        self.depthwise = nn.Conv2d(8, 8, 3, stride=2, groups=8)
        self.last = nn.Conv2d(8, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(F.pad(x, (0, 1, 0, 1))))
        x = torch.relu(self.depthwise(F.pad(x, (0, 1, 0, 1))))
        return self.last(F.pad(x, (1, 1, 1, 1), value=0.5))


class ConvRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def _quantized(build):
    """`build()` quantized for the U55-128, exported channels-last as the compile does."""
    torch.manual_seed(0)
    return ethos_u_quantized(build().eval().to(memory_format=torch.channels_last),
                             lambda generator: (torch.randn(SHAPE, generator=generator)
                                                .to(memory_format=torch.channels_last),))


def _lower(program, folder, ours: bool):
    """The one partition's Vela run, lowered with our forms or upstream's; what they did."""
    from executorch.backends.arm.ethosu import EthosUPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    kept, clamps, folded = [], [], []
    with vela_runs_recorded(folder) as runs, \
            live_activations_kept(kept, clamps if ours else None), \
            (conv_pads_folded(folded) if ours else contextlib.nullcontext()):
        to_edge_transform_and_lower(program, partitioner=[EthosUPartitioner(ethos_u55_spec())],
                                    compile_config=EdgeCompileConfig(_check_ir_validity=False))
    (run,) = runs
    return run, clamps, folded


def _tosa_operators(tosa_bytes: bytes) -> list[str]:
    from tosa.Op import Op

    names = {v: k for k, v in vars(Op).items() if not k.startswith("_")}
    block = main_block(tosa_bytes)
    return [names[block.Operators(i).Op()] for i in range(block.OperatorsLength())]


def _estimate(run):
    (summary,) = run.out_dir.rglob("out_summary_*.csv")
    return read_vela_dir(summary.parent)


def _outputs(run, inputs):
    io = graph_io(run.tosa_bytes)
    return [run_tosa(run.tosa_bytes, io, [x])[0] for x in inputs]


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    _, program = _quantized(SamePadded)
    folder = tmp_path_factory.mktemp("pads")
    return (_lower(program, folder / "upstream", ours=False),
            _lower(program, folder / "ours", ours=True))


def test_upstream_hands_vela_a_pad_vela_copies_and_ours_pads_in_the_convolution(padded):
    (upstream, _, _), (ours, _, folded) = padded
    assert _tosa_operators(upstream.tosa_bytes).count("PAD") == 3
    assert _tosa_operators(ours.tosa_bytes).count("PAD") == 1  # the pad of value 0.5 stays
    assert [padding for _, padding in folded] == [(0, 1, 0, 1), (0, 1, 0, 1)]
    before, after = _estimate(upstream), _estimate(ours)
    copies = [layer for layer in before.layers if layer.npu_op == "MemoryCopy"]
    assert len(copies) >= 4  # each zero pad: the feature map copied and its edges filled
    assert len([layer for layer in after.layers if layer.npu_op == "MemoryCopy"]) \
        < len(copies)
    assert after.npu_cycles < before.npu_cycles


def test_the_folded_pad_computes_the_same_values(padded):
    (upstream, _, _), (ours, _, _) = padded
    io = graph_io(upstream.tosa_bytes)
    assert graph_io(ours.tosa_bytes).inputs == io.inputs
    generator = np.random.default_rng(3)
    inputs = [generator.integers(-128, 128, io.inputs[0].shape, dtype=np.int8)
              for _ in range(4)]
    for theirs, mine in zip(_outputs(upstream, inputs), _outputs(ours, inputs)):
        assert np.array_equal(theirs, mine)


def test_a_kept_relu_changes_no_byte_of_the_program_and_lowers_velas_estimate(tmp_path):
    """Vela 5.1 estimates a U55 layer with no fused activation at the LUT's output cost: the
    ReLU upstream folds away costs the layer twice the cycles of the same command stream with
    the ReLU kept as its clamp."""
    _, program = _quantized(ConvRelu)
    upstream, none, _ = _lower(program, tmp_path / "upstream", ours=False)
    ours, clamps, _ = _lower(program, tmp_path / "ours", ours=True)
    assert none == [] and clamps == ["aten_relu_default"]
    assert "CLAMP" in _tosa_operators(ours.tosa_bytes)
    assert "CLAMP" not in _tosa_operators(upstream.tosa_bytes)
    assert ours.payload_bytes == upstream.payload_bytes  # command stream and weights
    before, after = _estimate(upstream), _estimate(ours)
    (conv_before,), (conv_after,) = ([layer for layer in e.layers if layer.npu_op == "Conv2D"]
                                     for e in (before, after))
    assert conv_after.cycles < 0.7 * conv_before.cycles, (conv_after, conv_before)


def test_visual_wake_words_costs_vela_no_more_than_the_incumbents_file(tmp_path):
    """MLPerf Tiny's MobileNetV1-0.25 (its own int8 file) on the U55-128: our program's Vela
    estimate against `vela` on the same file (before the two rewrites: 390,659 NPU cycles
    against 205,017), with every operator but the softmax on the NPU in one partition, and the
    outputs equal to TFLM."""
    import orchestrator
    from orchestrator.comparison.npu import incumbent_npu, ours_npu
    from orchestrator.device_runs.combined import load_program
    from orchestrator.target import resolve_target
    from orchestrator.verification import tflm

    path = mlperf_tiny("vww_96_int8.tflite")
    result = orchestrator.compile(str(path), tmp_path / "vww.pte", npu="ethos-u55-128")
    ours = ours_npu(result.plan)
    theirs = incumbent_npu(path, resolve_target("corstone300", "ethos-u55-128"))
    assert ours.cycles_npu <= theirs.cycles_npu and ours.cycles_total <= theirs.cycles_total, \
        (ours, theirs)
    assert ours.sram_bytes <= theirs.sram_bytes
    assert (ours.partitions, theirs.partitions) == (1, 1)
    assert (ours.cpu_operators, theirs.cpu_operators) == (1, 0)  # the SOFTMAX, on CMSIS-NN
    assert tflm.compare(load_program(result.pte), 4).differing == 0


def test_a_converted_upsampling_network_is_one_npu_partition_as_vela_makes_it(tmp_path):
    """An encoder-decoder made by TensorFlow's converter (tests/data/tflite/make.py): Keras'
    nearest `Resizing` is RESIZE_NEAREST_NEIGHBOR with half-pixel centers, which at an integer
    scale reads the same pixels as plain nearest; rebuilt so, it runs on the U55's NPU (it was
    an index gather left in float on the CPU, three partitions), costs what Vela's own compile
    of the file costs, and equals TFLM."""
    from pathlib import Path

    import orchestrator
    from orchestrator.comparison.npu import incumbent_npu, ours_npu
    from orchestrator.device_runs.combined import load_program
    from orchestrator.target import resolve_target
    from orchestrator.verification import tflm

    path = Path(__file__).parent / "data" / "tflite" / "unet_upsample_int8.tflite"
    result = orchestrator.compile(str(path), tmp_path / "unet.pte", npu="ethos-u55-128")
    ours = ours_npu(result.plan)
    theirs = incumbent_npu(path, resolve_target("corstone300", "ethos-u55-128"))
    assert (ours.partitions, ours.cpu_operators) == (1, 0)
    assert ours.cycles_npu <= theirs.cycles_npu and ours.cycles_total <= theirs.cycles_total
    assert tflm.compare(load_program(result.pte), 2).differing == 0


def test_an_attentions_heads_are_selected_before_the_permute_and_stay_on_the_npu(tmp_path):
    """What Vela 5.1 is handed for timm's attention on the U55: q, k and v selected before the
    permute (partitioners/quantizable.py heads_selected_before_permute; in upstream's form
    Vela's native compiler dies with SIGSEGV on MobileViT-XXS, and on the U85 it broadcasts
    head 0's q: tests/test_u85_machine.py). The whole attention is one NPU partition, the plan
    names the rewrite, and the program passes every verify method."""
    import json

    from orchestrator import api
    from orchestrator.cli import main
    from orchestrator.verification.twin import load_twin

    pte = tmp_path / "attention.pte"
    api.compile("tests/attention_models.py:batched_heads_attention", pte, npu="ethos-u55-128")
    plan = json.loads((tmp_path / "attention.artifacts" / "plan.json").read_text())
    assert "the 3 slices of a permute([2, 0, 3, 1, 4]) taken along axis 2" in json.dumps(plan)
    assert plan["summary"]["npu_partitions"] == 1 and len(load_twin(pte).partitions) == 1
    assert main(["verify", str(pte), "--samples", "2"]) == 0
