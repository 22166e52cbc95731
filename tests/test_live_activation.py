"""A ReLU whose output shares a quantization range that goes below zero keeps its clamp on the NPU.

Upstream (ExecuTorch 1.5.1, Arm backend) folds a ReLU after a convolution by raising the next
quantize's qmin to its zero point, and the convolution's RESCALE never applies that qmin: when the
ReLU's output is concatenated with a tensor that goes negative (so the two share one range and the
zero point is above qmin), the NPU passes the negative values through. Found on the index_ops
family with its int64 constant forced off the NPU, where the twin's local check failed the first
partition by 95 steps. partitioners/upstream_ethos_u.py (live_activations_kept) keeps such a ReLU
as a clamp; these tests run the partition's TOSA graph in the TOSA reference model against the
quantized reference, with and without it.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest
import torch
from torch import nn

from npu_driver.tosa_twin import graph_io, run_tosa
from partitioners.npu import lower_to_npu, vela_runs_recorded
from partitioners.upstream_ethos_u import live_activations_kept
from tests.ethos_u_edges import ethos_u55_spec, ethos_u_quantized

SHAPE = (1, 3, 6, 7)  # H != W != C: the TOSA graph's layout is read from its shapes


class SharedRangeRelu(nn.Module):
    """relu(conv(x)) concatenated with a convolution of it: one quantization range for both."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)
        self.conv2 = nn.Conv2d(5, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        return torch.cat([y, self.conv2(y)], dim=1)


class OwnRangeRelu(nn.Module):
    """relu(conv(x)) quantized on its own: the range starts at 0, the zero point is qmin."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def _quantize(build):
    """`build()` (seeded here, so its weights do not depend on the tests run before) quantized
    for the U55-128: (reference module, exported program)."""
    torch.manual_seed(0)
    return ethos_u_quantized(build().eval(),
                             lambda generator: (torch.randn(SHAPE, generator=generator),))


@pytest.fixture(scope="module")
def quantized():
    return _quantize(SharedRangeRelu)


def _qparams(program):
    """(scale, zero point) of the input quantize and of the output's quantize."""
    quantizes = [n for n in program.graph.nodes if n.target is
                 torch.ops.quantized_decomposed.quantize_per_tensor.default]
    return [(float(n.args[1]), int(n.args[2])) for n in (quantizes[0], quantizes[-1])]


def _npu_vs_reference(quantized, tmp_path, workaround: bool):
    """Max |steps| between the NPU partition's TOSA graph and the quantized reference, and the
    ReLUs the workaround kept."""
    from executorch.backends.arm.ethosu import EthosUPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    reference, program = quantized
    kept: list = []
    with vela_runs_recorded(tmp_path) as runs, \
            (live_activations_kept(kept) if workaround else contextlib.nullcontext()):
        to_edge_transform_and_lower(program, partitioner=[EthosUPartitioner(ethos_u55_spec())],
                                    compile_config=EdgeCompileConfig(_check_ir_validity=False))
    (run,) = runs
    io = graph_io(run.tosa_bytes)
    (in_scale, in_zp), (out_scale, out_zp) = _qparams(program)
    worst = 0
    generator = torch.Generator().manual_seed(7)
    for _ in range(3):
        x = torch.randn(SHAPE, generator=generator)
        q = torch.clamp(torch.round(x / in_scale) + in_zp, -128, 127).to(torch.int8)
        nhwc_in = io.inputs[0].shape != SHAPE
        (out,) = run_tosa(run.tosa_bytes, io, [(q.permute(0, 2, 3, 1) if nhwc_in else q)
                                               .contiguous().numpy()])
        expected = torch.round(reference(x) / out_scale) + out_zp  # the reference's int8 codes
        if io.outputs[0].shape != tuple(expected.shape):
            expected = expected.permute(0, 2, 3, 1)
        worst = max(worst, int(np.abs(out.astype(np.int32) - expected.numpy().astype(np.int32))
                               .max()))
    return worst, kept, out_zp


def test_upstream_drops_the_relu_of_a_shared_range_and_the_npu_passes_negatives(quantized,
                                                                               tmp_path):
    worst, _, zero_point = _npu_vs_reference(quantized, tmp_path, workaround=False)
    assert zero_point > -128  # the shared range goes below zero: the ReLU's clamp is live
    assert worst > 10, f"upstream's graph now agrees ({worst} steps): drop the workaround"


def test_the_kept_clamp_makes_the_npu_match_the_quantized_reference(quantized, tmp_path):
    worst, kept, zero_point = _npu_vs_reference(quantized, tmp_path, workaround=True)
    assert [name for name, *_ in kept] == ["aten_relu_default"]
    assert kept[0][1:] == (zero_point, -128)
    assert worst <= 1


def test_the_plan_names_the_kept_relu_and_a_relu_of_its_own_range_is_only_velas_clamp(
        quantized, tmp_path):
    _, program = quantized
    _, _, _, fixes = lower_to_npu(program, ethos_u55_spec(), tmp_path / "shared")
    assert [(f.node, f.upstream) for f in fixes] == [
        ("aten_relu_default", "executorch arm FuseQuantizedActivationPass")]
    assert "zero point (" in fixes[0].message and "qmin (-128)" in fixes[0].message
    # a ReLU whose range starts at 0 is no defect: it is kept only for Vela's estimate
    # (tests/test_vela_forms.py), and the plan says so once for the program
    _, own = _quantize(OwnRangeRelu)
    _, _, _, fixes = lower_to_npu(own, ethos_u55_spec(), tmp_path / "own")
    assert [(f.node, f.upstream) for f in fixes] == [
        ("(every NPU partition)", "Vela 5.1's Ethos-U55/U65 estimate")]
    assert fixes[0].message.startswith("1 ReLU(s) after a convolution handed to Vela")


def test_index_ops_on_the_u55_moves_its_int64_constant_and_verifies_on_every_method(
        tmp_path_factory):
    """The family where it was found, through the public API with no policy: EthosUBackend
    refuses the partition's int64 `full` output (gather's index), so the device check moves that
    op to the CPU and compiles again; the ReLU keeps its clamp; the twin's local check, the host
    runtime and QEMU all pass, and the program agrees with the quantized reference end to end."""
    import orchestrator
    from examples.user_models import model_spec
    from tests.device_tools import passes_twin_host_runtime_and_qemu

    folder = tmp_path_factory.mktemp("index_ops_u55")
    result = orchestrator.compile(model_spec("index_ops"), folder / "index_ops.pte", bundle=True,
                                  npu="ethos-u55-128")
    plan = result.plan
    assert [w.node for w in plan.compiled.workarounds
            if "FuseQuantizedActivationPass" in w.upstream] == ["aten_relu_default"]
    (full,) = [r for r in plan.rows if r.name == "aten_full_default"]
    assert full.placement == "portable"
    # (the partition's outputs come in an order the capture does not fix: output 0 or 3)
    assert re.match(
        r"moved off the NPU: the device refused its work there \(EthosUBackend refused the "
        r"partition output it computes: Ethos-U output \d+ expansion factor 2 with element size "
        r"4 not supported; aten_full_default is aten\.full\.default, int64\); no --policy "
        r"needed$", full.reasons[0].message), full.reasons[0].message
    assert plan.compiled.device_run.refusal is None
    assert plan.summary.macs["npu"] == 11_904
    passes_twin_host_runtime_and_qemu(result.pte)
    twin = orchestrator.verify(result.pte, samples=2)
    assert twin.passed and [o.differing_elements for o in twin.outputs] == [0, 0, 0], twin.outputs
