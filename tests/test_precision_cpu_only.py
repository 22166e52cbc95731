"""A16W8 on a CPU-only Cortex-M55 (--npu none): the chosen modules quantized with int16
activations by upstream's a16w8 config in front of the CortexMQuantizer
(orchestrator/compilation/precision.py: configure_cortex_m), int16 convolution and linear on our
CMSIS-NN s16 operators, every other int16 op in float on its portable kernel, and
`--precision auto` recovering the skewed regression's SNR as on the U55-128."""

from __future__ import annotations

import pytest
import torch

from orchestrator import api
from orchestrator.request import Request, resolve
from tests.device_tools import passes_twin_host_runtime_and_qemu

MODEL = "tests/precision_models.py:conv_gram_linear"
RAISED = "conv=a16w8,proj=a16w8"
SKEWED = "examples/skewed.py:mlp"
FLOOR_DB = 35.0  # int8 reaches 24.0 dB here, the head raised 36.5 dB (CPU-only M55)


@pytest.fixture(scope="module")
def m55(tmp_path_factory):
    """conv and proj raised on the CPU-only Cortex-M55."""
    out = tmp_path_factory.mktemp("cpu16") / "conv_proj_m55.pte"
    return api.compile(MODEL, out, npu="none", cpu="cortex-m55", precision=RAISED)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    from examples.skewed import write_sets

    return write_sets(tmp_path_factory.mktemp("skewed"))


@pytest.fixture(scope="module")
def chosen(sets, tmp_path_factory):
    """`--precision auto --min-snr 35` on the CPU-only M55: (the search, the written program)."""
    pte = tmp_path_factory.mktemp("auto") / "skewed_m55.pte"
    found = api.precision_auto(SKEWED, str(sets[1]), None, min_snr_db=FLOOR_DB, npu="none",
                               cpu="cortex-m55", calibration=str(sets[0]))
    return found, api.write_program(found.plan, pte)


def _ops(result):
    """The op rows by (module, op): `proj` and `head` are both linears."""
    return {(r.module, r.op.split(".")[1]): r for r in result.plan.rows if r.kind == "op"}


def test_a16w8_on_a_cpu_only_target_is_accepted():
    assert dict(resolve(Request(MODEL, npu="none", precision=RAISED)).precision) == {
        "conv": "a16w8", "proj": "a16w8"}


def test_the_int16_conv_and_linear_run_on_cmsis_nn_s16_kernels(m55):
    ops = _ops(m55)
    conv, linear, head = ops["conv", "convolution"], ops["proj", "linear"], ops["head", "linear"]
    assert (conv.placement, conv.kernel, conv.precision) == (
        "cmsis-nn", "arm_convolve_wrapper_s16", "a16w8")
    assert (linear.placement, linear.kernel, linear.precision) == (
        "cmsis-nn", "arm_fully_connected_s16", "a16w8")
    assert conv.dtypes == "int16,int8,int64,int32,int32,uint8 -> int16"
    assert (head.kernel, head.precision) == ("arm_fully_connected_s8", "a8w8")
    # the ReLU after the conv is the s16 kernel's output clamp, not a float portable op
    assert conv.fused == ("aten_relu_default",) and not any(op == "relu" for _, op in ops)
    operators = (m55.pte.parent / f"{m55.pte.stem}.artifacts" / "operators.txt").read_text()
    assert {"orchestrate::quantized_conv2d_s16.out",
            "orchestrate::quantized_linear_s16.out"} <= set(operators.split())
    assert "aten::convolution.out" not in operators.split()


def test_the_boundaries_are_requantize_rows_and_the_plan_shows_precision(m55):
    requantizes = [r.dtypes for r in m55.plan.rows if r.kind == "requantize"]
    assert requantizes[:2] == ["int8 -> float32", "float32 -> int16"]
    assert {r.placement for r in m55.plan.rows if r.kind == "requantize"} == {"cmsis-nn"}
    assert all(r.reasons[0].key == "requantize" for r in m55.plan.rows
               if r.kind == "requantize")
    text = m55.plan.to_text(width=100)
    assert " prec " in text.splitlines()[next(i for i, line in enumerate(text.splitlines())
                                             if line.lstrip().startswith("#  node"))]
    assert "precision (conv=a16w8, proj=a16w8): ops a16w8 2, a8w8 2" in " ".join(text.split())


def test_int16_ops_without_an_s16_operator_run_in_float_with_their_reason(m55):
    """The flatten's layout copy and the reshape's permute carry int16 values: no s16 kernel,
    so the portable kernel in float, with the reason the CPU route gave."""
    fallbacks = [r for r in m55.plan.rows if r.placement == "portable"]
    assert fallbacks and {r.precision for r in fallbacks} == {"float"}
    for row in fallbacks:
        assert [reason.key for reason in row.reasons][-1] == "no-s16-operator", row


def test_the_program_passes_the_twin_the_host_runtime_and_qemu(m55):
    passes_twin_host_runtime_and_qemu(m55.pte)


def test_a_depthwise_conv_in_int16_runs_on_the_device_in_float(tmp_path):
    """A depthwise-separable block raised: the pointwise conv on the s16 kernel, the depthwise
    one (groups > 1: no s16 operator) on the portable convolution with its weights dequantized
    ahead of time (the runtime has no dequantize_per_channel kernel: DS-CNN's first block
    raised stopped the host runtime with error 0x14, missing operator)."""
    result = api.compile("tests/precision_models.py:separable", tmp_path / "sep.pte",
                         npu="none", cpu="cortex-m55", precision="block=a16w8")
    ops = _ops(result)
    pointwise, depthwise = ops["block.pointwise", "convolution"], ops["block.depthwise",
                                                                      "convolution"]
    assert (pointwise.kernel, pointwise.precision) == ("arm_convolve_wrapper_s16", "a16w8")
    assert (depthwise.placement, depthwise.precision) == ("portable", "float")
    assert depthwise.dtypes.startswith("float32,float32,float32")
    assert depthwise.reasons[-1].key == "no-s16-operator"
    assert not any("dequantize_per_channel" in r.op for r in result.plan.rows)
    passes_twin_host_runtime_and_qemu(result.pte)


def test_a_conv1d_hardswish_and_squeeze_excite_in_int16_run_on_every_method(tmp_path):
    """tests/precision_models.py:conv1d_squeeze_excite, every module but the head raised: the
    Conv1d's NCHW [N, C, 1, W] form copied to NHWC for the s16 kernel and back (it refused it:
    error 0x12), the hardswish after a conv and the hardsigmoid as hardtanh arithmetic (no
    device kernel has either), and the broadcast `x * scale` made contiguous (the portable
    kernel writes a broadcast's output row-major: 2,150 int16 steps off in channels-last)."""
    result = api.compile("tests/precision_models.py:conv1d_squeeze_excite", tmp_path / "c.pte",
                         npu="none", cpu="cortex-m55",
                         precision="conv=a16w8,act=a16w8,se=a16w8,temporal=a16w8")
    convs = [(r.module, r.kernel) for r in result.plan.rows
             if r.kind == "op" and "convolution" in r.op]
    assert convs == [("conv", "arm_convolve_wrapper_s16"),
                     ("se.reduce", "arm_convolve_wrapper_s16"),
                     ("temporal.layers.0", "arm_convolve_wrapper_s16")]
    rows = [r for r in result.plan.rows if r.kind in ("op", "layout")]
    temporal = next(i for i, r in enumerate(rows) if r.module == "temporal.layers.0")
    assert (rows[temporal - 1].kind, rows[temporal - 1].dtypes) == ("layout", "int16 -> int16")
    ops = {r.op.split(".")[1] for r in result.plan.rows if r.kind == "op"}
    assert not ops & {"hardswish", "hardsigmoid"} and "hardtanh" in ops
    assert any("broadcasts into a (0, 2, 3, 1) output" in w.message
               for w in result.plan.compiled.workarounds)
    passes_twin_host_runtime_and_qemu(result.pte)


def test_precision_auto_recovers_the_budget_on_the_cpu_only_m55(chosen):
    found, _ = chosen
    first, last = found.steps[0], found.steps[found.chosen]
    assert first.raised == () and not first.within and first.snr_db < 26.0
    assert found.chosen == 1 and last.raised == ("head",) and last.within
    assert last.snr_db >= FLOOR_DB
    assert found.steps[1].why.rank == 1 and found.steps[1].why.share > 0.5
    assert all(step.npu_mac_pct == 0.0 for step in found.steps)
    head = [r for r in found.plan.rows if r.module == "head" and r.kind == "op"]
    assert [(r.kernel, r.precision) for r in head] == [("arm_fully_connected_s16", "a16w8")]


def test_the_chosen_program_computes_the_searchs_snr_on_qemu_byte_exact(chosen, sets):
    """The twin measures the search's figure on all 512 validation samples; QEMU's Cortex-M55
    runs the first 16 BundleIO byte-exact against the twin."""
    found, written = chosen
    report = api.evaluate(written.pte, str(sets[1]), labels=None, method="auto",
                          qemu_samples=16)
    by = {m.method: m for m in report.methods}
    assert by["twin"].samples == 512 and by["twin"].snr_db >= FLOOR_DB
    assert by["twin"].snr_db == pytest.approx(found.steps[found.chosen].snr_db, abs=0.1)
    assert by["QEMU Cortex-M55"].samples == 16
    assert "byte-exact against the twin" in by["QEMU Cortex-M55"].note
    passes_twin_host_runtime_and_qemu(written.pte, samples=2)


def test_the_upstream_quantizer_machinery_it_composes_is_there():
    from orchestrator.compilation import precision

    assert all(precision.contract().values()), precision.contract()


def _int16_activation_chain(activation, *bounds, scales=(0.01, 0.01, 0.01)):
    """quantize -> dequantize -> activation -> quantize in int16 (edge ops), the first
    quantize returned."""
    from executorch.exir.dialects._ops import ops as exir_ops

    q, dq = (exir_ops.edge.quantized_decomposed.quantize_per_tensor.default,
             exir_ops.edge.quantized_decomposed.dequantize_per_tensor.default)
    graph = torch.fx.Graph()
    first = graph.call_function(q, (graph.placeholder("x"), scales[0], 0, -32767, 32767,
                                    torch.int16))
    back = graph.call_function(dq, (first, scales[1], 0, -32767, 32767, torch.int16))
    clamped = graph.call_function(activation, (back, *bounds))
    graph.output(graph.call_function(q, (clamped, scales[2], 0, -32767, 32767, torch.int16)))
    return first


def test_an_activation_at_the_s16_ops_own_scale_becomes_its_output_bounds():
    """quantize(clamp(dequantize(q), a, b)) at one scale is clamp(q, a / scale, b / scale): a
    relu6 at scale 0.01 is the codes [0, 600]; another scale between them is not folded."""
    from executorch.exir.dialects._ops import ops as exir_ops

    from partitioners.s16_operators import _activation_after

    hardtanh, relu = exir_ops.edge.aten.hardtanh.default, exir_ops.edge.aten.relu.default
    relu6 = _activation_after(_int16_activation_chain(hardtanh, 0.0, 6.0))
    assert (relu6.low, relu6.high) == (0, 600)
    plain = _activation_after(_int16_activation_chain(relu))
    assert (plain.low, plain.high) == (0, 32767)
    assert _activation_after(_int16_activation_chain(relu, scales=(0.01, 0.01, 0.02))) is None
