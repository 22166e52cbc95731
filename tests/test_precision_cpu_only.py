"""A16W8 on a CPU-only Cortex-M55 (--npu none): the chosen modules quantized with int16
activations by upstream's a16w8 config in front of the CortexMQuantizer
(orchestrator/compilation/precision.py: configure_cortex_m), int16 convolution and linear on our
CMSIS-NN s16 operators, every other int16 op in float on its portable kernel, and
`--precision auto` recovering the skewed regression's SNR as on the U55-128."""

from __future__ import annotations

import pytest

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
