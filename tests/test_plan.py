"""`orchestrate plan`: every op gets a row, and each reason comes from the check that decided."""

from __future__ import annotations

import json

import pytest

from orchestrator.errors import GateFailure
from orchestrator.planning.planner import Gates, check_gates, make_plan
from orchestrator.reports.coverage import SCHEMA_PATH, render_json, render_markdown, render_text


def _rows(plan, name_part=None, op_part=None):
    return [r for r in plan.rows if (name_part is None or name_part in r.name)
            and (op_part is None or op_part in r.op)]


@pytest.fixture(scope="module")
def ds_cnn_u55(compiles):
    return make_plan(compiles.get("ds-cnn", "corstone300", "ethos-u55-128")[0])


@pytest.fixture(scope="module")
def mixed_u55(compiles):
    return make_plan(compiles.get("mixed", "corstone300", "ethos-u55-128")[0])


@pytest.fixture(scope="module")
def mixed_u85(compiles):
    return make_plan(compiles.get("mixed", "corstone320", "ethos-u85-256")[0])


def test_ds_cnn_avg_pool_is_on_cmsis_nn_with_the_kernel_size_reason(ds_cnn_u55):
    (pool,) = _rows(ds_cnn_u55, op_part="avg_pool2d")
    assert pool.placement == "cmsis-nn" and pool.tier == "mve"
    assert pool.kernel == "arm_avgpool_s8"
    not_npu = pool.reasons[0]
    assert "WhyNoPartitionReporter" in not_npu.check
    assert "kernel dims < 8, got [24, 5]" in not_npu.message
    assert "kernel (24, 5)" in not_npu.value
    # The model has no padding: the context says where the check's "padding" comes from.
    assert "input 25x5: no window reads the last row" in not_npu.value


def test_an_npu_pool_row_carries_velas_cycles_for_its_layer(compiles):
    """Vela counts a pooling layer's input elements as MACs where our rows count none, so the
    MAC-count match left the pool's cycles on the invocation row and the pool read "fused"."""
    import csv

    compiled, pte = compiles.get("ds-cnn", "corstone320", "ethos-u85-256", write=True)
    with open(next(pte.with_suffix(".artifacts").glob("partitions/p0/vela/out_per-layer.csv")),
              newline="") as handle:
        layers = list(csv.DictReader(handle))
    (pool_layer,) = [layer for layer in layers if layer["Original Operator"] == "AvgPool"]
    assert int(pool_layer["MAC Count"]) > 0
    (pool,) = _rows(make_plan(compiled), op_part="avg_pool2d")
    assert (pool.placement, pool.cost.source) == ("npu", "vela")
    assert pool.cost.cycles == int(float(pool_layer["Op Cycles"])) > 0


def test_mixed_on_u55_gives_distinct_reasons_for_conv_where_and_sort(mixed_u55):
    conv = next(r for r in mixed_u55.rows if r.name == "aten_convolution_default_1")
    where = next(r for r in mixed_u55.rows if "where" in r.op)
    sort = next(r for r in mixed_u55.rows if "sort" in r.op)
    assert conv.placement == "cmsis-nn" and conv.kernel == "arm_convolve_s8"
    assert "stride" in conv.reasons[0].message and "stride (4, 4)" in conv.reasons[0].value
    assert where.placement == "portable" and "bool" in where.reasons[0].message
    assert sort.placement == "portable" and "BaseTOSASupportList" in sort.reasons[0].message
    assert len({conv.reasons[0].message, where.reasons[0].message, sort.reasons[0].message}) == 3
    for row in (where, sort):
        assert row.reasons[1].message.startswith(f"no CMSIS-NN kernel for {row.op}")


def test_an_npu_refusal_names_the_int8_the_program_stores_not_the_graphs_float(mixed_u55):
    """The quantized graph computes an op in float between its dequantize and quantize; the
    reason's context named those floats ([float32/float32 -> bool] for an int8 comparison)."""
    gt = next(r for r in mixed_u55.rows if r.op.startswith("aten.gt"))
    where = next(r for r in mixed_u55.rows if "where" in r.op)
    assert gt.reasons[0].value == "int8/int8 -> bool", gt.reasons[0].value
    assert where.reasons[0].value == "bool/int8/int8 -> int8", where.reasons[0].value


def test_mixed_on_u85_moves_the_stride4_conv_and_where_to_the_npu(mixed_u85):
    conv = next(r for r in mixed_u85.rows if r.name == "aten_convolution_default_1")
    where = next(r for r in mixed_u85.rows if "where" in r.op)
    sort = next(r for r in mixed_u85.rows if "sort" in r.op)
    assert conv.placement == "npu" and where.placement == "npu"
    assert sort.placement == "portable"


def test_every_cpu_reason_agrees_with_the_data_of_the_check_that_decided(mixed_u55):
    """Cross-checked against upstream's own records, not against our rendering of them."""
    from partitioners.cpu import has_cmsis_substitution

    compiled = mixed_u55.compiled
    rejections = compiled.lowered.npu_rejections
    for row in mixed_u55.rows:
        if row.placement == "npu":
            assert not row.reasons, row
            continue
        not_npu = row.reasons[0]
        if row.name in rejections:  # the Ethos-U operator-support check's own words and values
            assert (not_npu.key, not_npu.message, not_npu.value) == (
                "npu-operator-support", rejections[row.name].message, rejections[row.name].context)
        else:
            assert not_npu.key != "npu-operator-support", row
        if row.placement != "portable":
            continue
        not_cmsis = row.reasons[1]
        decision = compiled.cpu_decisions.get(row.name)
        if decision is not None and decision.category != "lowered":
            assert (not_cmsis.key, not_cmsis.message, not_cmsis.debug) == (
                "cmsis-condition", decision.message, decision.check)
        else:
            assert not_cmsis.key == "no-cmsis-kernel", row
            assert row.op in not_cmsis.message
    # upstream registers no substitution for where/sort/gt: the table agrees with the plan
    import torch

    assert not has_cmsis_substitution(torch.ops.aten.where.self)


def test_hidden_cpu_work_is_reported(mixed_u55):
    kinds = {r.kind for r in mixed_u55.rows}
    assert {"boundary-quantize", "boundary-dequantize", "npu-invocation"} <= kinds
    assert sum(r.kind == "npu-invocation" for r in mixed_u55.rows) == mixed_u55.summary.npu_partitions == 3


def test_summary_counts_coverage_and_transitions(mixed_u55):
    s = mixed_u55.summary
    npu_macs = sum(r.macs for r in mixed_u55.rows if r.placement == "npu" and r.kind == "op")
    cpu_macs = sum(r.macs for r in mixed_u55.rows if r.placement != "npu" and r.kind == "op")
    assert s.macs["npu"] == npu_macs and npu_macs > 0 and cpu_macs > 0
    assert s.npu_mac_coverage_pct == pytest.approx(100 * npu_macs / (npu_macs + cpu_macs))
    assert s.transitions == 6
    assert "aten::topk.values" in s.operators


def test_npu_costs_of_a_partition_add_up_to_velas_own_total(mixed_u55, ds_cnn_u55):
    for plan in (mixed_u55, ds_cnn_u55):
        for index, estimate in plan.estimates.items():
            rows = [r for r in plan.rows if r.placement == "npu" and r.partition == index]
            npu_cycles = sum(r.cost.cycles for r in rows if r.kind != "npu-invocation")
            invocation = next(r for r in rows if r.kind == "npu-invocation")
            remainder = invocation.cost.cycles - _driver_cycles(plan, invocation)
            assert npu_cycles + remainder == estimate.cycles
            assert all(r.cost.source == "vela" for r in rows if r.kind != "npu-invocation")


def _driver_cycles(plan, invocation):
    """The CPU's side of the invocation: the driver and the copies of its IO bytes."""
    from cost_models.cpu import npu_io_copy_cost, transition_cost

    estimate = plan.estimates[invocation.partition]
    target = plan.compiled.target
    driver = transition_cost("npu_invocation", target.cpu, target.cpu_hz, estimate.scratch_bytes)
    copies = npu_io_copy_cost(invocation.io_bytes, target.cpu, target.cpu_hz)
    assert invocation.io_bytes > 0
    return driver.cycles + copies.cycles


def test_vela_partition_totals_match_velas_summary_csv(ds_cnn_u55):
    import csv

    from orchestrator.artifacts.outputs import delegate_partitions

    for part in delegate_partitions(ds_cnn_u55.compiled):
        summary_csv = next((part.vela_dir / "output").glob("out_summary_*.csv"))
        with open(summary_csv) as handle:
            row = next(csv.DictReader(handle))
        estimate = ds_cnn_u55.estimates[part.index]
        assert estimate.cycles == int(float(row["cycles_total"]))
        assert estimate.macs == int(float(row["nn_macs"]))
        assert estimate.traffic_bytes["sram"] == int(float(row["sram_total_bytes"]))
        assert ds_cnn_u55.summary.npu_traffic[part.index]["sram"] == estimate.traffic_bytes["sram"]


def test_json_report_validates_against_the_documented_schema(mixed_u55):
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    document = json.loads(render_json(mixed_u55.compiled, mixed_u55.rows, mixed_u55.summary))
    jsonschema.validate(document, schema)
    assert document["schema_version"] == "1.0"
    bad = dict(document, ops=[dict(document["ops"][0], placement="gpu")])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_terminal_table_fits_100_columns(mixed_u55):
    text = render_text(mixed_u55.compiled, mixed_u55.rows, mixed_u55.summary)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "aten_sort_default" in text and "BaseTOSASupportList" in text


def test_markdown_report_has_a_row_per_op(mixed_u55):
    text = render_markdown(mixed_u55.compiled, mixed_u55.rows, mixed_u55.summary)
    assert sum(1 for line in text.splitlines() if line.startswith("| ") and "|" in line[2:]) \
        == len(mixed_u55.rows) + 1


def test_gates_name_the_violated_gate(mixed_u55):
    check_gates(mixed_u55, Gates(min_npu_coverage_pct=50, max_partitions=3, require_fit=True))
    with pytest.raises(GateFailure, match="--fail-under-npu-coverage"):
        check_gates(mixed_u55, Gates(min_npu_coverage_pct=90))
    with pytest.raises(GateFailure, match="--max-partitions: 3 NPU partitions > 1"):
        check_gates(mixed_u55, Gates(max_partitions=1))


def test_require_fit_fails_on_a_platform_too_small(compiles, tmp_path):
    import dataclasses

    plan_rows = make_plan(compiles.get("mixed", "corstone300", "ethos-u55-128")[0])
    tiny = [dataclasses.replace(m, size_bytes=1024) for m in plan_rows.compiled.target.platform.memories]
    platform = dataclasses.replace(plan_rows.compiled.target.platform, memories=tuple(tiny))
    target = dataclasses.replace(plan_rows.compiled.target, platform=platform)
    compiled = dataclasses.replace(plan_rows.compiled, target=target)
    small = make_plan(compiled)
    assert not small.summary.fits
    with pytest.raises(GateFailure, match="--require-fit"):
        check_gates(small, Gates(require_fit=True))


def test_runner_ops_check_catches_a_missing_kernel(compiles):
    compiled = compiles.get("mixed", "corstone300", "ethos-u55-128")[0]
    have = {"cortex_m::quantize_per_tensor.out", "cortex_m::dequantize_per_tensor.out",
            "cortex_m::quantized_conv2d.out", "aten::gt.Scalar_out", "aten::where.self_out",
            "dim_order_ops::_to_dim_order_copy.out"}
    plan = make_plan(compiled, runner_ops=have)
    assert plan.summary.missing_operators == ("aten::topk.values",)
    with pytest.raises(GateFailure, match="aten::topk.values"):
        check_gates(plan, Gates(require_runner_ops=True))


def test_plan_cli_exits_3_on_a_failed_gate(capsys):
    from orchestrator.cli import main

    code = main(["plan", "mixed", "--fail-under-npu-coverage", "99", "--format", "json"])
    captured = capsys.readouterr()
    assert code == 3
    assert "--fail-under-npu-coverage" in captured.err
    json.loads(captured.out)


def test_plan_works_on_a_users_own_model_file(capsys, tmp_path):
    from pathlib import Path

    from orchestrator.cli import main

    factory = Path(__file__).parents[1] / "examples" / "my_model.py"
    report = tmp_path / "plan.md"
    code = main(["plan", f"{factory}:factory", "--platform", "corstone300", "--npu",
                 "ethos-u55-64", "--format", "markdown", "-o", str(report)])
    assert code == 0
    text = report.read_text()
    assert "ethos-u55-64" in text
    assert "convolution" in text and "NPU p0" in text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".orchestrate-")]


def test_partition_memory_figures_come_from_velas_npz(ds_cnn_u55):
    import numpy as np

    from orchestrator.artifacts.outputs import delegate_partitions

    for part in delegate_partitions(ds_cnn_u55.compiled):
        with np.load(part.vela_dir / "output" / "out_vela.npz") as data:
            estimate = ds_cnn_u55.estimates[part.index]
            assert estimate.scratch_bytes == int(data["scratch_shape"][0])
            assert estimate.weight_bytes == len(data["weight_data"].tobytes()) > 0
            assert estimate.command_bytes == len(data["cmd_data"].tobytes()) > 0


@pytest.fixture(scope="module")
def mixed_u55_upstream(compiles):
    """`mixed` on U55 without device legalization: the ops as upstream leaves them."""
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    model = load_model("mixed")
    return make_plan(compile_model(model, load_calibration(None, model.example_inputs),
                                   resolve_target("corstone300", npu="ethos-u55-128"),
                                   legalize=False))


def test_plan_flags_ops_the_device_runtime_cannot_run(mixed_u55_upstream, ds_cnn_u55):
    sort = next(r for r in mixed_u55_upstream.rows if "sort" in r.op)
    gt = next(r for r in mixed_u55_upstream.rows if r.op.startswith("aten.gt"))
    assert any("no kernel for aten::sort.values" in f.message for f in sort.device_faults)
    assert any("tensors_have_same_dim_order" in f.check for f in gt.device_faults)
    assert len(mixed_u55_upstream.summary.device_faults) == 2
    assert ds_cnn_u55.summary.device_faults == ()
    with pytest.raises(GateFailure, match="--require-runnable"):
        check_gates(mixed_u55_upstream, Gates(require_runnable=True))
    check_gates(ds_cnn_u55, Gates(require_runnable=True))


def test_device_legalization_makes_mixed_runnable_and_says_what_it_changed(mixed_u55):
    assert mixed_u55.summary.device_faults == ()
    sort = next(r for r in mixed_u55.rows if r.name == "aten_sort_default")
    assert sort.op == "aten.sort.default" and sort.kernel == "aten.topk.default"
    assert "BaseTOSASupportList" in sort.reasons[0].message
    messages = [w.message for w in mixed_u55.compiled.workarounds]
    assert any("rewritten to topk" in m for m in messages)
    assert any("rewritten to gt.Scalar" in m for m in messages)
    text = render_text(mixed_u55.compiled, mixed_u55.rows, mixed_u55.summary)
    assert "workaround applied to aten_sort_default" in text


def test_a_vendor_soc_yaml_decides_fit_and_int8_io_makes_it_fit(compiles):
    """examples/my_soc.yaml: 384 KiB SRAM. The person detector's fp32 input (192 KiB) leaves no
    room for Vela's scratch; with --io int8 everything fits."""
    from pathlib import Path

    soc = str(Path(__file__).parents[1] / "examples" / "my_soc.yaml")
    floating = make_plan(compiles.get("person-detector", soc, None)[0])
    int8 = make_plan(compiles.get("person-detector", soc, None, io="int8")[0])
    assert floating.compiled.target.platform.name == "example-m55-u55"
    assert floating.compiled.target.npu == "ethos-u55-64"
    assert not floating.summary.fits
    assert [m.item.split(" (")[0] for m in floating.summary.memory if not m.fits] == ["npu scratch"]
    with pytest.raises(GateFailure, match="--require-fit"):
        check_gates(floating, Gates(require_fit=True))
    assert int8.summary.fits
    used = {}
    for m in int8.summary.memory:
        used[m.region] = used.get(m.region, 0) + m.bytes
    for region in int8.compiled.target.platform.memories:
        assert used.get(region.name, 0) <= region.size_bytes


def test_npu_scratch_is_the_largest_partitions_not_the_sum(mixed_u55):
    # The method's temp allocator holds one delegate's scratch at a time (EthosUBackend.cpp).
    scratch = [e.scratch_bytes for e in mixed_u55.estimates.values()]
    assert len(scratch) == 3 and sum(scratch) > max(scratch)
    assert mixed_u55.summary.npu_scratch_bytes == max(scratch)
    (row,) = [m for m in mixed_u55.summary.memory if "npu scratch" in m.item]
    assert row.bytes == max(scratch)


def test_a_transpose_convolution_is_an_op_with_macs_not_a_layout_copy(tmp_path):
    model = tmp_path / "up.py"
    model.write_text(
        "import torch\n"
        "from torch import nn\n"
        "class Up(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.conv = nn.Conv2d(3, 8, 3, padding=1)\n"
        "        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)\n"
        "    def forward(self, x):\n"
        "        return self.up(torch.relu(self.conv(x)))\n"
        "def factory():\n"
        "    return Up().eval(), (torch.randn(1, 3, 8, 8),)\n")
    import orchestrator

    plan = orchestrator.plan(f"{model}:factory", npu="none", cpu="cortex-m55")
    (up,) = [r for r in plan.rows if tuple(r.output_shape) == (1, 4, 16, 16) and r.macs]
    assert up.kind == "op" and up.placement == "cmsis-nn"
    assert up.macs == 64 * 8 * 4 * 2 * 2  # input pixels x in x out channels x a 2x2 kernel
    # the CMSIS-NN cost model (raised to the platform calibration's instruction estimate), not
    # the layout-copy model
    assert up.cost.source.split(" (")[0] == "model:mve"


def test_a_hardswish_after_a_conv_counts_the_convs_macs_once(tmp_path):
    """Upstream's `cortex_m::minimum` (half of a hardswish's clamp) carries the convolution's
    meta; the plan listed the conv twice, MACs and cycles included (MobileNetV3's block showed
    197,568 MACs CPU-only against 115,648 on the NPU). It is the clamp's row now."""
    model = tmp_path / "hs.py"
    model.write_text(
        "import torch\n"
        "from torch import nn\n"
        "def factory():\n"
        "    torch.manual_seed(0)\n"
        "    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Hardswish(),\n"
        "                      nn.Conv2d(8, 4, 1), nn.Hardswish())\n"
        "    return m.eval(), (torch.randn(1, 3, 8, 8),)\n")
    import orchestrator

    plan = orchestrator.plan(f"{model}:factory", npu="none", cpu="cortex-m55")
    names = [r.name for r in plan.rows]
    assert len(names) == len(set(names)), names
    assert plan.summary.macs["cmsis-nn"] == 64 * 3 * 8 * 9 + 64 * 8 * 4
    minimums = [r for r in plan.rows if r.kernel == "arm_minimum_s8"]
    assert len(minimums) == 2
    assert all(r.op == "aten.clamp.default" and r.macs == 0 for r in minimums)


def test_the_runnable_check_reads_the_device_libraries_not_the_host_runtime(tmp_path):
    """The host runtime registers `aten::_fft_r2c.out`; no device kernel library has it."""
    from kernels.device_ops import device_operator_names
    from orchestrator.errors import GateFailure

    assert "aten::_fft_r2c.out" not in device_operator_names()
    assert {"aten::topk.values", "cortex_m::quantized_conv2d.out",
            "dim_order_ops::_to_dim_order_copy.out"} <= device_operator_names()
    model = tmp_path / "fft.py"
    model.write_text(
        "import torch\n"
        "from torch import nn\n"
        "class F(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(9, 4)\n"
        "    def forward(self, x):\n"
        "        return self.fc(torch.fft.rfft(x).abs())\n"
        "def factory():\n"
        "    return F().eval(), (torch.randn(1, 16),)\n")
    import orchestrator

    plan = orchestrator.plan(f"{model}:factory", npu="none")
    (fft,) = [r for r in plan.rows if "_fft_r2c" in r.op]
    assert [f.key for f in fft.device_faults] == ["missing-kernel"]
    with pytest.raises(GateFailure, match="no kernel for aten::_fft_r2c.out"):
        check_gates(plan, Gates(require_runnable=True))


def test_cmsis_nn_kernel_names_follow_the_wrappers_dispatch_on_the_ohwi_weight(compiles):
    """DS-CNN CPU-only: the first conv (one input channel, groups 1: CMSIS-NN's convolution, not
    the depthwise kernel upstream takes it for; tests/test_single_channel_conv.py) runs
    arm_convolve_s8, each 3x3 depthwise
    the MVE opt path and each pointwise conv the 1x1 fast path, as the CMSIS-NN wrappers
    dispatch. The Cortex-M pass stores conv weights as contiguous
    OHWI; reading H and W from dims 2 and 3 named every pointwise conv arm_convolve_s8."""
    plan = make_plan(compiles.get("ds-cnn", "corstone300", "none", "cortex-m55")[0])
    convs = [r for r in plan.rows if r.op.startswith("aten.convolution")]
    kernels = [r.kernel for r in convs]
    assert kernels[0] == "arm_convolve_s8", kernels
    assert kernels[1::2] == ["arm_depthwise_conv_s8_opt"] * 4, kernels
    assert kernels[2::2] == ["arm_convolve_1x1_s8_fast"] * 4, kernels
