"""An op the Ethos-U quantizer fused with its activation, routed to the CPU.

The Ethos-U quantizer annotates `linear -> relu` as one pattern (no quantize between);
partitioners/fused_activation_split.py gives the linear the activation's output quantize, the
Cortex-M quantizer's form, so it lowers to CMSIS-NN with the ReLU folded in. This is what lets a
placement policy or `--placement cost` move an MLP island off the NPU."""

from __future__ import annotations

import pytest
import torch

from tests.device_tools import passes_twin_host_runtime_and_qemu
from tests.ethos_u_edges import ethos_u_quantized_edge


def _fused_edge():
    """Linear(8, 6) -> ReLU -> Linear(6, 4) quantized by the Ethos-U quantizer (per channel,
    as our flow quantizes), as an edge program for the CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4)).eval()
    return ethos_u_quantized_edge(model, 8)


def _names(edge) -> set[str]:
    """Every op of the edge program, as a policy forcing them all off the NPU names them."""
    return {n.name for n in edge.exported_program().graph_module.graph.nodes
            if n.op == "call_function"}


def _ops(program) -> list[str]:
    return [str(getattr(n.target, "__name__", n.target)) for n in program.graph_module.graph.nodes
            if n.op == "call_function"]


def test_without_the_split_the_fused_linear_runs_in_float(monkeypatch):
    """The fused form as it was handled before: the per-channel linear cannot become a 1x1
    convolution without its own quantize, so it was kept in float on the portable addmm."""
    import partitioners.cpu as cpu

    monkeypatch.setattr(cpu, "split_fused_activations", lambda program, moved=(): [])
    edge = _fused_edge()
    program, _, workarounds = cpu.route_to_cpu(edge, "cortex-m55", forced=_names(edge))
    assert "aten.addmm.default" in _ops(program)
    assert any("kept in float on the portable kernel" in w.message for w in workarounds)


def test_the_relu_is_folded_into_the_cmsis_nn_kernel():
    from partitioners.cpu import route_to_cpu

    edge = _fused_edge()
    program, _, workarounds = route_to_cpu(edge, "cortex-m55", forced=_names(edge))
    ops = " ".join(_ops(program))
    assert ops.count("cortex_m.quantized_conv2d") == 2, ops  # both linears, as 1x1 convs
    assert "relu" not in ops and "clamp" not in ops and "addmm" not in ops, ops
    (fix,) = [w for w in workarounds if "fused with its relu" in w.upstream]
    assert "linear given its own output quantize (the relu's" in fix.message


@pytest.fixture(scope="module")
def sensor_mlp_cost(tmp_path_factory):
    import orchestrator
    from examples.user_models import model_spec

    folder = tmp_path_factory.mktemp("fused_cost")
    # The platform's memory mode (weights in flash), fixed by the policy: under Sram_Only, which
    # cost placement would try first, the NPU reads the MLP's weights fast enough to keep it.
    (folder / "shared.yaml").write_text("vela: {memory_mode: Shared_Sram}\n")
    return orchestrator.compile(model_spec("sensor_mlp"), folder / "sensor_mlp.pte", bundle=True,
                                placement="cost", npu="ethos-u55-128",
                                policy=str(folder / "shared.yaml"))


def test_cost_placement_moves_an_mlp_off_the_u55_when_the_model_says_it_is_faster(
        sensor_mlp_cost):
    """sensor_mlp on ethos-u55-128 (Shared_Sram): the NPU invocation and the weights streamed
    from flash cost more than the MLP on CMSIS-NN. Before the fix the move failed upstream and
    the program stayed greedy's."""
    placement = sensor_mlp_cost.plan.cost_placement
    (moved,) = [d for d in placement.decisions if d.moved]
    assert moved.macs == 11_840 and not moved.kept_reason
    assert placement.chosen_seconds <= 0.95 * placement.greedy_seconds  # >= 5% by the model
    assert sensor_mlp_cost.plan.summary.macs == {"npu": 0, "cmsis-nn": 11_840, "portable": 0}
    assert not [r for r in sensor_mlp_cost.plan.rows if r.placement == "portable"]


def test_the_moved_mlp_runs_on_the_device_code(sensor_mlp_cost):
    """The moved program against the quantized reference on the twin, and byte for byte against
    the twin on the host runtime and on QEMU's Cortex-M55."""
    passes_twin_host_runtime_and_qemu(sensor_mlp_cost.pte)


GROUPED = "tests/peer_symptom_models.py:grouped_conv_relu"


def _grouped_plan(**options):
    from orchestrator import api

    return api.plan(GROUPED, npu="ethos-u55-128", **options)


def test_upstream_refuses_a_grouped_convolution_fused_with_its_relu(monkeypatch):
    """Without the split (upstream's form) the Arm backend cannot lower the partition, and
    every op of the model runs on the CPU."""
    import partitioners.npu as npu

    monkeypatch.setattr(npu, "grouped_convolutions_split", lambda program: None)
    made = _grouped_plan()
    assert made.summary.npu_partitions == 0 and made.summary.npu_mac_coverage_pct == 0.0
    reasons = " ".join(r.message for row in made.rows for r in row.reasons)
    assert "No output quantization parameter found" in reasons


def test_a_grouped_convolution_fused_with_its_relu_stays_on_the_npu_and_verifies(tmp_path):
    from orchestrator import api

    written = api.compile(GROUPED, tmp_path / "grouped.pte", npu="ethos-u55-128")
    summary = written.plan.summary
    assert summary.npu_partitions == 1 and summary.npu_mac_coverage_pct == 100.0
    fixes = [w for w in written.compiled.workarounds if "DecomposeGroupedConvPass" in w.upstream]
    assert len(fixes) == 1 and "1 grouped convolution(s) (2 groups)" in fixes[0].message
    passes_twin_host_runtime_and_qemu(written.pte, samples=2)


def test_a_program_lowered_again_is_split_once_and_reports_the_same_split():
    """The planner lowers the same quantized program again after it moves ops to the CPU: the
    second call inserts nothing and still names the convolution (the plan keeps the row)."""
    from orchestrator.compilation.pipeline import capture, quantize
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target
    from partitioners.fused_activation_split import grouped_convolutions_split

    model = load_model(GROUPED)
    quantized = quantize(capture(model), load_calibration(None, model.example_inputs),
                         resolve_target("corstone300", npu="ethos-u55-128"))
    graph = quantized.program.graph_module.graph
    before = len(graph.nodes)
    first = grouped_convolutions_split(quantized.program)
    after_first = len(graph.nodes)
    assert grouped_convolutions_split(quantized.program) == first
    assert after_first == before + 2 and len(graph.nodes) == after_first
    assert first.groups == (2,)
