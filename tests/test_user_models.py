"""Models users bring (examples/user_models.py): the defects they exposed, and the opt-in matrix.

The unmarked tests pin one fix each and run by default (a few seconds of CPU-only compiles).
The `user_models` matrix compiles and verifies every user model on U55-128, U65-256, U85-256
and CPU-only M55 (opt-in, ~20 min: `python -m pytest -m user_models`). An acceptable outcome is
a compile and a PASSED verify, or one classified one-line error (`OrchestrateError`) naming the
construct; a FAILED verify of a program the compile accepted is a defect.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from examples.user_models import USER_MODELS, model_spec

CPU_ONLY = ("corstone300", "none", "cortex-m55")


def _edge_nodes(module: nn.Module, shape: tuple[int, ...], needle: str):
    program = torch.export.export(module.eval(), (torch.randn(shape),)).run_decompositions()
    return [n for n in program.graph.nodes if n.op == "call_function" and needle in str(n.target)]


@pytest.mark.parametrize("module,shape,macs,kind,kernel_hw", [
    (nn.Conv1d(10, 16, 5, padding=2), (1, 10, 40), 640 * 10 * 5, "conv", (1, 5)),
    (nn.Conv1d(16, 16, 3, stride=2, padding=1, groups=16), (1, 16, 40), 320 * 3,
     "depthwise_conv", (1, 3)),
    (nn.Conv1d(24, 24, 3, padding=1, groups=4), (1, 24, 20), 480 * 6 * 3, "conv", (1, 3)),
    (nn.Conv2d(3, 8, 3, padding=1), (1, 3, 8, 8), 512 * 3 * 9, "conv", (3, 3)),
    (nn.Conv2d(8, 8, 3, groups=8), (1, 8, 8, 8), 288 * 9, "depthwise_conv", (3, 3)),
    (nn.Conv2d(8, 16, 3, groups=2), (1, 8, 8, 8), 576 * 4 * 9, "conv", (3, 3)),
    (nn.ConvTranspose2d(4, 8, 2, stride=2), (1, 4, 4, 4), 64 * 8 * 4, "conv", (2, 2)),
], ids=["conv1d", "depthwise1d", "grouped1d", "conv2d", "depthwise2d", "grouped2d", "transposed2d"])
def test_conv_macs_are_counted_for_every_conv_rank_and_grouping(module, shape, macs, kind, kernel_hw):
    from cost_models.graph_shapes import describe

    (node,) = _edge_nodes(module, shape, "convolution")
    info = describe(node)
    assert (info.macs, info.op_shape.kind, info.op_shape.kernel_hw) == (macs, kind, kernel_hw)


class _MeanOverLastDim(nn.Module):
    def forward(self, x):
        return x.mean(-1, keepdim=True)  # a layer norm's mean over 32 features


def test_a_pool_window_is_the_extent_it_reduces_one_row_for_1d():
    from cost_models.graph_shapes import describe

    (pool,) = _edge_nodes(nn.AvgPool1d(4), (1, 8, 32), "avg_pool")
    (mean,) = _edge_nodes(_MeanOverLastDim(), (1, 16, 32), "mean")
    assert describe(pool).op_shape.kernel_hw == (1, 4)
    assert describe(mean).op_shape.kernel_hw == (1, 32)


def test_conv1d_model_compiles_with_its_macs(compiles):
    compiled, _ = compiles.get(model_spec("conv1d_audio"), *CPU_ONLY)
    convs = [row for row in compiled.placements if row.op.startswith("aten.convolution")]
    assert [row.macs for row in convs] == [32_000, 960, 7_680, 8_640]


def test_argmax_and_topk_indices_are_compared_exactly(compiles):
    from orchestrator.verification.twin_verify import verify

    for name in ("argmax_head", "topk_head"):
        _, pte = compiles.get(model_spec(name), *CPU_ONLY, write=True)
        report = verify(pte, samples=2)
        indices = report.outputs[-1]
        assert indices.step is None, name  # not quantized: compared in its own units
        assert (indices.max_steps, indices.differing_elements) == (0, 0), name
        assert report.passed, report.verdict


def _portable_program(module, inputs, path: Path) -> Path:
    from executorch.exir import to_edge

    path.write_bytes(to_edge(torch.export.export(module, inputs)).to_executorch().buffer)
    return path


def _host_run(pte: Path, inputs) -> list[bytes]:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    program = pte.read_bytes()  # the loaded method points into this buffer: keep it alive
    outputs = _load_for_executorch_from_buffer(program).forward(inputs)
    return [o.as_strided((o.numel(),), (1,)).numpy().tobytes() for o in outputs]


class _SplitWithSizes(nn.Module):
    def forward(self, x):
        a, b, c = torch.split(x, [1, 2, 3], dim=1)
        return a * 2, b + 1, c


class _ChannelsLastCat(nn.Module):
    def forward(self, a, b):
        return torch.cat([a, b], dim=1)


def test_twin_runs_tensor_list_outputs_as_the_host_runtime_does(tmp_path):
    from orchestrator.verification.twin import run_twin

    x = torch.randn(2, 6, 5)
    pte = _portable_program(_SplitWithSizes(), (x,), tmp_path / "split.pte")
    run = run_twin(pte, (x,), keep_intermediates=True)
    assert list(run.output_bytes) == _host_run(pte, (x,))
    split = next(e for e in run.op_trace if e.op == "aten::split_with_sizes_copy.out")
    assert len(split.outputs) == 3 and all(o in run.intermediates for o in split.outputs)


def test_twin_runs_a_channels_last_cat_as_the_host_runtime_does(tmp_path):
    """op_cat.cpp walks the bytes by the sizes: a channels-last cat along C concatenates whole
    NHWC buffers, which is not the channels-last layout of the concatenation."""
    from orchestrator.verification.twin import run_twin

    a = torch.randn(1, 2, 3, 3).to(memory_format=torch.channels_last)
    b = torch.randn(1, 2, 3, 3).to(memory_format=torch.channels_last)
    pte = _portable_program(_ChannelsLastCat(), (a, b), tmp_path / "cat.pte")
    run = run_twin(pte, (a, b))
    assert list(run.output_bytes) == _host_run(pte, (a, b))
    assert not torch.equal(run.outputs[0], torch.cat([a, b], 1))


def test_a_size1_boundary_tensor_in_either_dim_order_is_one_layout(compiles):
    """ds_tcn on the Ethos-U55: its AdaptiveAvgPool1d (a 2-D pool on NPU targets) runs on
    CMSIS-NN and hands a [1, 24, 1, 1] value to the next NPU partition. The CPU writes it
    channels-last, the partition reads it contiguous: the same 24 bytes, as only size-1
    dimensions move. The boundary check refused the compile ("layout mismatch at a CPU/NPU
    boundary") until it compared byte layouts; a real mismatch is still refused (the NCHW test
    in test_compile.py)."""
    from partitioners.boundary import BoundaryTensor

    def crossing(shape):
        return BoundaryTensor("t", "cpu->npu", "d", "c", shape, (0, 2, 3, 1), (0, 1, 2, 3))

    assert crossing((1, 24, 1, 1)).consistent and not crossing((1, 24, 2, 1)).consistent
    compiled, _ = compiles.get(model_spec("ds_tcn"), "corstone300", "ethos-u55-128")
    moved = [t for t in compiled.boundaries if t.cpu_dim_order != t.npu_dim_order]
    assert moved and all(t.consistent and t.shape == (1, 24, 1, 1) for t in moved), moved


def test_reference_runs_an_int8_channels_last_max_pool():
    from kernels import reference
    from kernels.reference import RawTensor

    def raw(sizes, dtype, dim_order):
        nbytes = int(np.prod(sizes)) * torch.empty((), dtype=dtype).element_size()
        return RawTensor(dtype, sizes, dim_order, memoryview(bytearray(nbytes)))

    x = torch.randint(-128, 128, (1, 16, 15, 15), dtype=torch.int8)
    source = raw((1, 16, 15, 15), torch.int8, (0, 2, 3, 1))
    reference.write_by_dim_order(source, x)
    out = raw((1, 16, 7, 7), torch.int8, (0, 2, 3, 1))
    indices = raw((1, 16, 7, 7), torch.int64, (0, 2, 3, 1))
    result = reference.execute("aten::max_pool2d_with_indices", "out",
                               [source, [3, 3], [2, 2], [0, 0], [1, 1], True, out, indices])
    expected = torch.nn.functional.max_pool2d(x.float(), 3, 2, ceil_mode=True).to(torch.int8)
    assert torch.equal(reference.read_by_dim_order(out), expected)
    assert not result.faults


def test_ceil_mode_max_pool_reason_names_ceil_mode(compiles):
    compiled, _ = compiles.get(model_spec("squeezenet_small"), *CPU_ONLY)
    pools = [row for row in compiled.placements if "max_pool" in row.op]
    assert len(pools) == 2
    for row in pools:
        assert row.placement == "portable"
        (reason,) = [r for r in row.reasons if r.check.startswith("AtenToCortexMPass")]
        assert "ceil_mode" in reason.message and "ceil_mode=True" in reason.message
        assert "not quantized" not in reason.message


def test_an_op_the_twin_cannot_execute_is_not_run_exit_5(compiles, monkeypatch):
    from kernels import reference
    from kernels.reference import KernelError
    from orchestrator.verification.twin_verify import verify

    _, pte = compiles.get(model_spec("argmax_head"), *CPU_ONLY, write=True)

    def no_host_execution(name, overload, args):
        raise KernelError(f"the twin has no host execution for {name}.{overload}")

    monkeypatch.setattr(reference, "execute", no_host_execution)
    with pytest.raises(Exception) as raised:
        verify(pte, samples=1)
    assert raised.value.exit_code == 5 and str(raised.value).startswith("not run")


TARGETS = [("corstone300", "ethos-u55-128", None), ("corstone300", "ethos-u65-256", None),
           ("corstone320", "ethos-u85-256", None), CPU_ONLY]


@pytest.mark.user_models
@pytest.mark.parametrize("platform,npu,cpu", TARGETS, ids=[t[1] if t[1] != "none" else t[2]
                                                           for t in TARGETS])
@pytest.mark.parametrize("model", list(USER_MODELS))
def test_user_model_compiles_and_verifies_or_fails_in_one_classified_line(
        model, platform, npu, cpu, tmp_path):
    from orchestrator.artifacts.outputs import write_outputs
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.planning.planner import make_plan
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target
    from orchestrator.verification.twin_verify import verify
    from tests.plan_checks import assert_summary_is_the_rows_added_up

    loaded = load_model(model_spec(model))
    pte = tmp_path / f"{model}.pte"
    try:
        compiled = compile_model(loaded, load_calibration(None, loaded.example_inputs),
                                 resolve_target(platform, npu=npu, cpu=cpu))
        plan = make_plan(compiled)
        assert_summary_is_the_rows_added_up(plan)
        plan.refuse_miscompiles()  # what `compile` refuses to write (the device refuses it)
        write_outputs(compiled, pte)
    except Exception as error:  # noqa: BLE001 - classified or a defect
        _assert_classified_one_line(error)
        return
    try:
        report = verify(pte, samples=4)
    except Exception as error:  # noqa: BLE001
        _assert_classified_one_line(error)
        return
    assert report.passed, report.verdict


def _assert_classified_one_line(error: BaseException) -> None:
    from orchestrator.errors import as_orchestrate_error

    classified = as_orchestrate_error(error)
    if classified is None:
        raise error
    assert "\n" not in str(classified).strip(), classified


_SHORT_GRU = """
import torch
from torch import nn


class ShortGru(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def factory():
    torch.manual_seed(0)
    return ShortGru().eval(), (torch.randn(1, 2, 4),)
"""


def test_an_unrolled_gru_is_one_flagged_line_with_its_steps_and_encoded_weights(compiles,
                                                                                 tmp_path):
    """torch.export unrolls a GRU over its frames (2 here: every step of gru_kws's 8 costs the
    same Vela work); on U55 Vela encodes every step's copy of the weights. The plan says so in
    one line instead of 60 rows, and --all-rows lists them."""
    from orchestrator.planning.planner import make_plan

    model = tmp_path / "short_gru.py"
    model.write_text(_SHORT_GRU)
    compiled, _ = compiles.get(f"{model}:factory", "corstone300", "ethos-u55-128")
    plan = make_plan(compiled)
    (gru,) = plan.summary.recurrences
    assert (gru.path, gru.type, gru.steps, gru.layers) == ("gru", "GRU", 2, 1)
    assert gru.parameters == 3 * 8 * (4 + 8) + 2 * 3 * 8  # W_ih, W_hh, b_ih, b_hh
    rows = [r for r in plan.rows if r.module == "gru"]
    assert len(rows) == gru.rows > 2 * 10 and all(r.module_type == "GRU" for r in rows)
    encoded = plan.estimates[0].weight_bytes
    assert f"{encoded:,} B of encoded weights (vela)" in gru.stored
    assert encoded > 4 * gru.parameters and "every unrolled step carries its own copy" in gru.stored
    text = plan.to_text()
    assert f"{gru.first_row}-{gru.last_row}" in text and "2 steps, " in text
    assert "aten_sigmoid_default_3" not in text  # collapsed
    assert "aten_sigmoid_default_3" in plan.to_text(all_rows=True)
    groups = {g.path: g for g in plan.summary.modules}
    assert groups["gru"].rows == gru.rows and groups["head"].macs == 8 * 3
    data = plan.to_json()
    assert data["summary"]["recurrences"][0]["steps"] == 2
    assert {r["module"] for r in data["ops"]} >= {"gru", "head", ""}


def test_upstream_quantizer_leaves_a_recurrent_layer_float():
    """The upstream behaviour the recurrence rewrites correct: CortexMQuantizer (ExecuTorch
    1.5.1) does not annotate `aten.gru.input`, so the whole GRU stays float (it is unrolled
    into float ops on the portable kernels later); ours decomposes it first."""
    from orchestrator.compilation.pipeline import capture, quantize
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    loaded = load_model(model_spec("gru_kws"))
    samples = load_calibration(None, loaded.example_inputs, n_generated=2)
    captured = capture(loaded)
    prepared = prepare_pt2e(captured.program.module(check_guards=False), CortexMQuantizer())
    (gru,) = [n for n in prepared.graph.nodes if "aten.gru" in str(n.target)]
    assert "quantization_annotation" not in gru.meta
    ours = quantize(captured, samples, resolve_target(*CPU_ONLY))
    assert not [n for n in ours.program.graph.nodes if "aten.gru" in str(n.target)]
    texts = " ".join(w.message for w in ours.workarounds)
    assert "aten.gru.input decomposed" in texts and "folded into constants" in texts
    assert "viewed as [1, 1, 16]" in texts


def test_upstream_quantizer_leaves_a_rank_broadcast_add_float_and_a_view_fixes_it():
    """CortexMQuantizer's add check (CortexMAddMulCheck) refuses operands of different shapes,
    so a (1, 16) + (1, 1, 16) is not annotated and stays float; the same elements viewed as
    (1, 1, 16) make it an annotated int8 add (partitioners/quantizable.py)."""
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from partitioners.quantizable import explicit_rank_broadcast

    class Gate(nn.Module):
        def forward(self, x, h):
            return torch.sigmoid(x + h)

    inputs = (torch.randn(1, 16), torch.randn(1, 1, 16))

    def annotated_adds(rewrite: bool) -> list:
        module = torch.export.export(Gate().eval(), inputs, strict=True).module(check_guards=False)
        fixes = explicit_rank_broadcast(module) if rewrite else []
        prepared = prepare_pt2e(module, CortexMQuantizer())
        return fixes, ["quantization_annotation" in n.meta for n in prepared.graph.nodes
                       if n.target == torch.ops.aten.add.Tensor]

    assert annotated_adds(False) == ([], [False])
    fixes, annotated = annotated_adds(True)
    assert annotated == [True] and len(fixes) == 1
    assert "[1, 16] viewed as [1, 1, 16]" in fixes[0].message


def test_a_float_linear_becomes_the_portable_addmm_with_the_same_values():
    """`aten.linear` has no portable kernel; a linear left in float (none of the families here
    since recurrences are quantized) is rewritten to addmm on the transposed weight."""
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.exir import to_edge_transform_and_lower

    from partitioners.legalize import float_linear_via_matmul

    torch.manual_seed(0)
    layer = nn.Linear(8, 5).eval()
    x = torch.randn(2, 3, 8)
    edge = to_edge_transform_and_lower(torch.export.export(layer, (x,)),
                                       compile_config=cortex_m_edge_compile_config())
    program = edge.exported_program()
    assert any("aten.linear" in str(n.target) for n in program.graph.nodes)
    fixes = float_linear_via_matmul(program)
    program.graph_module.recompile()
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert not any("aten.linear" in t for t in targets) and any("addmm" in t for t in targets)
    assert len(fixes) == 1 and "rewritten to addmm" in fixes[0].message
    torch.testing.assert_close(program.module()(x), layer(x))


# The GRU's run is opt-in (user_models marker) for the suite's time: the LSTM's makes the same
# point, and tests/test_recurrent_steps.py runs a GRU on every device method.
@pytest.mark.parametrize("family,linears", [
    pytest.param("gru_kws", 1 + 7 + 1, marks=pytest.mark.user_models),
    ("lstm_classifier", 1 + 5 + 1)])
def test_a_cpu_only_recurrence_runs_int8_on_cmsis_nn(compiles, family, linears):
    """Every MAC of a CPU-only GRU and LSTM is on CMSIS-NN (before: 9,984 of gru_kws's 10,176
    MACs ran float on the portable kernels): the input projection, every recurrent step after
    the first (the first one's zero state is folded into constants) and the head are
    `cortex_m::quantized_linear`; every gate is an int8 CMSIS-NN op; the twin checks every
    value the program writes and passes."""
    from orchestrator.planning.planner import make_plan
    from orchestrator.verification.twin_verify import verify

    compiled, pte = compiles.get(model_spec(family), *CPU_ONLY, write=True)
    plan = make_plan(compiled)
    assert plan.summary.device_faults == ()
    macs = plan.to_json()["summary"]["macs"]
    assert macs["portable"] == 0 and macs["cmsis-nn"] > 0, macs
    graph = compiled.final_program.graph
    assert sum("quantized_linear" in str(n.target) for n in graph.nodes) == linears
    floats = [r for r in plan.rows if r.placement == "portable" and r.kind == "op"
              and not r.op.startswith(("aten.slice_copy", "aten.split", "aten.select_copy",
                                       "aten.cat", "aten.permute_copy", "aten.view_copy",
                                       "aten.squeeze_copy", "aten.unsqueeze_copy"))]
    assert floats == [], [(r.op, r.reasons) for r in floats]
    texts = " ".join(w.message for w in compiled.workarounds)
    assert "decomposed into its per-step" in texts and "folded into constants" in texts
    report = verify(pte, samples=2)
    assert report.passed and not report.unmatched_values, report.verdict
    (layer,) = plan.summary.recurrences
    assert layer.stored.startswith("its CPU weights are stored once")


def test_a_cpu_only_shufflenet_gets_layout_copies_and_a_portable_5d_permute(compiles):
    """Upstream leaves ShuffleNet's split/cat walking channels-last bytes and routes its rank-5
    channel-shuffle permute to cortex_m::transpose, whose kernel refuses rank 5 (QEMU showed
    "transpose_out: expected tensor rank in [1, 4], got 5"). The compile copies the split/cat
    operands to the layout their kernels walk and runs the permute on the portable kernel; the
    plan names why, and the program verifies."""
    from orchestrator.planning.planner import make_plan
    from orchestrator.verification.twin_verify import verify

    compiled, pte = compiles.get(model_spec("shufflenet_small"), *CPU_ONLY, write=True)
    plan = make_plan(compiled)
    assert plan.summary.device_faults == ()
    permutes = [r for r in plan.rows if r.op.startswith("aten.permute_copy")
                and len(r.output_shape) == 5]
    assert permutes and all(r.placement == "portable" for r in permutes)
    for row in permutes:
        (limit,) = [x for x in row.reasons if x.key == "cmsis-kernel-limit"]
        assert "cortex_m::transpose" in limit.message and "rank 5" in limit.message
    copies = [w for w in compiled.workarounds if "a copy into the kernel's layout" in w.message]
    assert any("split_with_sizes_copy" in w.message for w in copies)
    assert any("aten::cat" in w.message for w in copies)
    report = verify(pte, samples=2)
    assert report.passed, report.verdict
