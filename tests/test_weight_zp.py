"""A linear the Ethos-U quantizer quantized per channel, routed to the CPU.

The quantizer makes the weight symmetric per channel: zero points [0, 0, ...] and one scale per
output channel. ExecuTorch 1.5.1's `_get_linear_replacement` refuses the zero-point list
(`weight_zp != 0`) and computes one requantization multiplier; its kernel reads one. Where
every channel has the same scale the scalar form is the same arithmetic and the linear lowers to
`cortex_m::quantized_linear`; otherwise (several scales, which one multiplier cannot honour) it is
computed as a 1x1 convolution, whose `cortex_m::quantized_conv2d` takes one multiplier per output
channel (partitioners/legalize.py `per_channel_linear_as_conv2d`)."""

from __future__ import annotations

import pytest
import torch

from tests.device_tools import host_runtime_or_missing, qemu_or_missing, verify_qemu_passes
from tests.ethos_u_edges import ethos_u_quantized_edge, root_cause

U55 = dict(npu="ethos-u55-128")


class Head(torch.nn.Module):
    """conv -> pool -> linear: the linear alone is forced to the CPU by a policy."""

    def __init__(self, equal_scales: bool):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.head = torch.nn.Linear(8, 4)
        with torch.no_grad():
            weight = torch.rand(4, 8, generator=torch.Generator().manual_seed(0)) - 0.5
            if equal_scales:
                weight[:, 0] = 0.75  # every row's largest magnitude: one scale for all channels
            self.head.weight.copy_(weight)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


def equal_scale_head():
    torch.manual_seed(0)
    return Head(equal_scales=True).eval(), (torch.rand(1, 3, 8, 8) * 2 - 1,)


def _linear_edge(equal_scales: bool):
    """A lone Linear(8, 4) quantized by the Ethos-U quantizer, as an edge program for the CPU."""
    return ethos_u_quantized_edge(Head(equal_scales).head.eval(), 8)


def test_upstream_refuses_all_zero_per_channel_weight_zero_points():
    """Documents ExecuTorch 1.5.1 (aten_to_cortex_m_pass.py:398): fails once upstream accepts
    the list form, and then per_channel_weights_legalized can go."""
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.backends.cortex_m.target_config import CortexMTargetConfig

    with pytest.raises(Exception) as raised:
        CortexMPassManager(_linear_edge(equal_scales=True).exported_program(),
                           target_config=CortexMTargetConfig.from_target_string("cortex-m55")
                           ).transform()
    root = root_cause(raised.value)
    assert isinstance(root, NotImplementedError)
    assert str(root) == ("cortex_m::quantized_linear assumes symmetric weight quantization "
                         "(weight_zp == 0); got weight_zp=[0, 0, 0, 0]")


def test_one_scale_per_channel_linear_lowers_to_quantized_linear():
    from partitioners.cpu import route_to_cpu

    _, decisions, workarounds = route_to_cpu(_linear_edge(equal_scales=True), "cortex-m55")
    (decision,) = decisions.values()
    assert (decision.category, decision.message) == (
        "lowered", "lowered to cortex_m.quantized_linear.default")
    (fix,) = [w for w in workarounds if "per-channel zero points" in w.upstream]
    assert "4 channels, zero points all 0, one scale" in fix.message
    # The arithmetic is judged end to end: test_the_forced_linear_programs_verify_*.


def test_several_scales_per_channel_linear_becomes_a_1x1_convolution():
    from partitioners.cpu import route_to_cpu

    program, decisions, workarounds = route_to_cpu(_linear_edge(equal_scales=False),
                                                   "cortex-m55")
    (decision,) = decisions.values()
    assert (decision.category, decision.message) == (
        "lowered", "lowered to cortex_m.quantized_conv2d.default")
    targets = [str(n.target) for n in program.graph_module.graph.nodes if n.op == "call_function"]
    assert not any("linear" in t for t in targets)
    assert sum("quantized_conv2d" in t for t in targets) == 1
    (fix,) = [w for w in workarounds if "1x1 convolution" in w.message]
    assert fix.message.startswith(
        "int8 linear (1, 8) x (4, 8)^T with 4 different per-channel weight scales rewritten to a "
        "1x1 convolution over view_copy [1, 8, 1, 1] -> [1, 4, 1, 1] and back")
    # The arithmetic is judged end to end: test_the_forced_linear_programs_verify_*.


def test_the_1x1_convolution_has_the_linears_weights_and_one_multiplier_per_channel():
    """The conv's int8 weight is the linear's, and its multipliers are those of each channel's
    scale (input scale x weight scale / output scale), as upstream computes them for a conv."""
    from executorch.backends.cortex_m.passes.passes_utils import quantize_multiplier_aot
    from executorch.backends.transforms.utils import get_param_tensor

    from partitioners.cpu import route_to_cpu

    edge = _linear_edge(equal_scales=False)
    before = edge.exported_program()
    (dq_weight,) = [n for n in before.graph.nodes if "dequantize_per_channel" in str(n.target)
                    and n.args[6] == torch.int8]
    codes = get_param_tensor(before, dq_weight.args[0])
    scales = get_param_tensor(before, dq_weight.args[1])
    (linear,) = [n for n in before.graph.nodes if "linear" in str(n.target)]
    input_scale = float(linear.args[0].args[1])
    output_scale = float(next(iter(linear.users)).args[1])
    program, _, _ = route_to_cpu(edge, "cortex-m55")
    (conv,) = [n for n in program.graph_module.graph.nodes
               if "quantized_conv2d" in str(n.target)]
    weight = get_param_tensor(program, conv.args[1])
    assert torch.equal(weight.reshape(codes.shape), codes)
    # x, weight, bias, stride, padding, dilation, -input zp, output zp, multipliers, shifts, ...
    multipliers = get_param_tensor(program, conv.args[8]).tolist()
    shifts = get_param_tensor(program, conv.args[9]).tolist()
    expected = [quantize_multiplier_aot(input_scale * float(s) / output_scale) for s in scales]
    assert list(zip(multipliers, shifts)) == [tuple(int(v) for v in e) for e in expected]
    assert len(set(multipliers)) > 1


def test_a_non_zero_weight_zero_point_keeps_upstreams_refusal():
    """Only an all-zero list is legalized: a zero point of 3 reaches upstream's own check."""
    from executorch.backends.arm._passes.quant_args import QuantArgs
    from executorch.backends.cortex_m.passes.aten_to_cortex_m_pass import AtenToCortexMPass
    from executorch.backends.cortex_m.target_config import CortexMTargetConfig
    from executorch.exir.dialects._ops import ops as exir_ops

    from partitioners import upstream_cortex_m

    program = _linear_edge(equal_scales=True).exported_program()
    (node,) = [n for n in program.graph.nodes if "linear" in str(n.target)]
    activation = QuantArgs(0.01, 0, -128, 127, torch.int8)
    node.meta["input_qparams"] = {
        0: activation, 1: QuantArgs([0.005] * 4, [0, 0, 3, 0], -127, 127, torch.int8, 0, True)}
    node.meta["output_qparams"] = {0: activation}
    dialect_pass = AtenToCortexMPass(program, CortexMTargetConfig.from_target_string("cortex-m55"))
    recorded = []
    with upstream_cortex_m.per_channel_weights_legalized(lambda *args: recorded.append(args)):
        substitution = upstream_cortex_m.substitutions()[exir_ops.edge.aten.linear.default]
        with pytest.raises(NotImplementedError, match=r"got weight_zp=\[0, 0, 3, 0\]"):
            substitution(node, dialect_pass)
    assert recorded == []


@pytest.fixture(scope="module")
def forced_heads(tmp_path_factory):
    """DS-CNN with its final linear forced to the CPU, and a conv -> pool -> linear model whose
    linear has one scale for every channel, forced likewise; both on ethos-u55-128."""
    import orchestrator

    folder = tmp_path_factory.mktemp("weight_zp")
    policy = folder / "policy.yaml"
    policy.write_text("force_cpu:\n  modules: [classifier, head]\n")
    return {name: orchestrator.compile(model, folder / f"{name}.pte", policy=str(policy), **U55)
            for name, model in (("ds-cnn", "ds-cnn"),
                                ("equal", f"{__file__}:equal_scale_head"))}


def test_ds_cnn_forced_linear_is_a_cmsis_nn_convolution(forced_heads):
    compiled = forced_heads["ds-cnn"]
    (linear,) = [r for r in compiled.plan.rows if r.name == "aten_linear_default"]
    assert linear.placement == "cmsis-nn"
    assert linear.kernel.startswith("arm_convolve")
    assert linear.op == "aten.linear.default" and linear.macs == 64 * 12
    assert linear.reasons[0].key == "policy-forced-cpu"
    assert not any(r.key == "cmsis-condition" for r in linear.reasons)
    # the view_copy nodes around it are memory-planned views: no rows of their own
    (fix,) = [w for w in compiled.compiled.workarounds if w.node == "aten_linear_default"]
    assert "with 12 different per-channel weight scales rewritten to a 1x1 convolution" \
        in fix.message
    assert not any("dequantize_per_channel" in op
                   for op in compiled.compiled.program_view.operator_names)


def test_ds_cnn_forced_linear_is_reported_in_plan_json(forced_heads):
    import json

    from orchestrator.reports.coverage import render_json

    plan = forced_heads["ds-cnn"].plan
    document = json.loads(render_json(plan.compiled, plan.rows, plan.summary))
    (row,) = [r for r in document["ops"] if r["name"] == "aten_linear_default"]
    assert row["placement"] == "cmsis-nn" and row["kernel"].startswith("arm_convolve")
    assert any("rewritten to a 1x1 convolution" in w["message"]
               for w in document["summary"]["workarounds"] if w["node"] == "aten_linear_default")


def test_equal_scale_forced_linear_is_on_cmsis_nn(forced_heads):
    compiled = forced_heads["equal"]
    (linear,) = [r for r in compiled.plan.rows if r.name == "aten_linear_default"]
    assert linear.placement == "cmsis-nn" and linear.kernel.startswith("arm_fully_connected")
    assert any("given to cortex_m::quantized_linear in the per-tensor form" in w.message
               for w in compiled.compiled.workarounds)


@pytest.mark.parametrize("name", ["ds-cnn", "equal"])
def test_the_forced_linear_programs_verify_on_the_twin(forced_heads, name):
    import orchestrator

    report = orchestrator.verify(forced_heads[name].pte, samples=4)
    assert report.passed, report.verdict


@pytest.mark.parametrize("name", ["ds-cnn", "equal"])
def test_the_forced_linear_programs_verify_on_the_host_runtime(forced_heads, name):
    from orchestrator.device_runs.runtime_verify import verify_runtime

    runtime = host_runtime_or_missing()
    try:
        report = verify_runtime(forced_heads[name].pte, samples=2, runtime=runtime)
    finally:
        runtime.close()
    assert report.runtime_error is None and report.outcome == "passed", report.verdict


@pytest.fixture(scope="module")
def ds_cnn_cost(tmp_path_factory):
    import orchestrator

    out = tmp_path_factory.mktemp("weight_zp_cost") / "ds-cnn.pte"
    return orchestrator.compile("ds-cnn", out, placement="cost", **U55)


def test_cost_placement_runs_ds_cnns_average_pool_on_the_npu_over_its_one_window(ds_cnn_cost):
    """Greedy leaves the (24, 5) pool over 25x5 on CMSIS-NN: the U55 check refuses the rows its
    window leaves unread as padding. On the CPU it costs at least the 8,656 instructions of
    repeated work the platform's calibration estimates for arm_avgpool_s8 (9,875 per call on
    QEMU; the model alone said 3,428 cycles). Cut to its window at stride 1 (the same values), the NPU takes it: one
    partition, no CPU op, and at least 5% faster than greedy by the model (issue 30's figure:
    4.025 -> 3.719 ms). The figures are estimates (docs/tuning.md quotes them)."""
    placement = ds_cnn_cost.plan.cost_placement
    (greedy_pool,) = [r for r in placement.greedy.rows if "avg_pool" in r.op]
    assert greedy_pool.placement == "cmsis-nn" and greedy_pool.kernel == "arm_avgpool_s8"
    assert greedy_pool.cost.source == "model:mve (raised to instructions: cortex-m55-qemu.yaml)"
    assert greedy_pool.cost.model_cycles < greedy_pool.cost.cycles < \
        greedy_pool.cost.instructions
    windows = placement.windows
    assert windows is not None and windows.chosen
    assert windows.pools == ("aten_avg_pool2d_default",)
    assert windows.to_seconds == placement.chosen_seconds < windows.from_seconds
    plan = ds_cnn_cost.plan
    assert plan.summary.npu_partitions == 1
    assert all(r.placement == "npu" for r in plan.rows if r.kind == "op")
    assert placement.chosen_seconds <= 0.95 * placement.greedy_seconds
    changes = [w["message"] for w in plan.to_json()["summary"]["workarounds"]]
    assert any(c.startswith("AvgPool2d(24x5) over 25x5 computed over its one window") for c in
               changes), changes
    assert any(line.startswith("average pool(s) aten_avg_pool2d_default over their one window, "
                               "so the NPU runs them, chosen: ") for line in
               placement.report_lines())


def test_cost_placement_tries_the_npu_weights_in_sram_and_keeps_it_for_ds_cnn(ds_cnn_cost):
    """Memory regions: the platform's Shared_Sram leaves the NPU weights in QSPI flash; cost
    placement plans Sram_Only too (the .pte in an SRAM region, placed by the memory stage) and
    keeps it when it fits and is faster by the model. The moves are then judged against it."""
    placement = ds_cnn_cost.plan.cost_placement
    memory = placement.memory
    assert memory is not None and memory.chosen and (memory.from_mode, memory.to_mode) == (
        "Shared_Sram", "Sram_Only")
    assert memory.to_seconds < memory.from_seconds == placement.greedy_seconds
    assert placement.chosen_seconds < memory.to_seconds  # and the pool went to the NPU
    plan = ds_cnn_cost.plan
    assert plan.compiled.target.memory_mode == "Sram_Only"
    (image,) = [m for m in plan.summary.memory if m.item.startswith(".pte")]
    kinds = {r.name: r.kind for r in plan.compiled.target.platform.memories}
    assert kinds[image.region] == "sram" and image.fits
    assert any(line.startswith("memory: Vela Sram_Only instead of the platform's Shared_Sram "
                               "chosen: ") for line in placement.report_lines())


def test_cost_placement_prices_the_ops_at_each_end_of_ds_cnns_big_partition(ds_cnn_cost):
    """Not only whole islands: the first and last costed op of a partition (with the activation
    and layout rows fused after it) are priced on their own rows, Vela's cycles against our CPU
    model, and reported; on DS-CNN the first convolution and the final linear are ~13x / ~10x
    faster on the NPU."""
    placement = ds_cnn_cost.plan.cost_placement
    ends = {d.part: d for d in placement.decisions if d.part != "island"}
    assert set(ends) == {"first ops", "last ops"}
    first, last = ends["first ops"], ends["last ops"]
    assert first.nodes == ("aten_convolution_default",) and first.macs == 320_000
    assert last.nodes == ("aten_linear_default",) and last.macs == 768
    rows = {r.name: r for r in placement.chosen.rows}  # partition 0 as the decisions saw it
    for end in (first, last):
        assert end.partition == 0 and not end.moved
        assert end.npu_seconds == sum(rows[n].cost.seconds for n in end.nodes)
        assert end.cpu_seconds > 5 * end.npu_seconds
    lines = placement.report_lines()
    assert any(line.startswith("partition 0's first ops (aten_convolution_default) (1 ops, "
                               "320,000 MACs) kept on the NPU: +") and "[vela] vs CPU" in line
               for line in lines), lines


def test_the_cost_placed_ds_cnn_verifies_on_the_twin_and_the_host_runtime(ds_cnn_cost):
    import orchestrator
    from orchestrator.device_runs.runtime_verify import verify_runtime

    report = orchestrator.verify(ds_cnn_cost.pte, samples=4)
    assert report.passed, report.verdict
    runtime = host_runtime_or_missing()
    try:
        on_runtime = verify_runtime(ds_cnn_cost.pte, samples=2, runtime=runtime)
    finally:
        runtime.close()
    assert on_runtime.runtime_error is None and on_runtime.outcome == "passed", on_runtime.verdict


@pytest.mark.parametrize("placed", ["forced", "cost"])
def test_the_forced_and_the_cost_placed_ds_cnn_pass_verify_qemu(forced_heads, ds_cnn_cost, placed,
                                                            capsys):
    """Every BundleIO case byte-exact on the M55 with the NPU functional model: forced, the
    linear's 1x1 convolution in its MVE form (the host runtime runs CMSIS-NN's C path); cost,
    the pool over its window in the one NPU partition."""
    qemu_or_missing()
    pte = forced_heads["ds-cnn"].pte if placed == "forced" else ds_cnn_cost.pte
    verify_qemu_passes(pte, capsys)


def test_the_cost_placed_ds_cnns_release_firmware_keeps_its_pte_in_sram_and_runs(ds_cnn_cost,
                                                                                tmp_path,
                                                                                capsys):
    """Vela's Sram_Only streams the NPU weights from the .pte at SRAM speed: the release
    firmware's linker script puts the image in the SRAM region the plan chose, and the build,
    run on QEMU over the NPU bridge, gives the twin's bytes."""
    from orchestrator.cli import main

    qemu_or_missing()
    (image,) = [m for m in ds_cnn_cost.plan.summary.memory if m.item.startswith(".pte")]
    out = tmp_path / "fw"
    assert main(["firmware", str(ds_cnn_cost.pte), "-o", str(out), "--npu-device",
                 "qemu-bridge", "--run"]) == 0
    assert "output 0: 48 B, byte-identical to the host twin's" in capsys.readouterr().out
    assert f"KEEP(*(.model_pte)) }} > {image.region} " in (out / "memory.ld").read_text()
    kinds = {r.name: r.kind for r in ds_cnn_cost.plan.compiled.target.platform.memories}
    assert kinds[image.region] == "sram"
