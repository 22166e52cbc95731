"""Placement policies and cost placement change the .pte, name their rule, and stay verifiable."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ISLAND = f"{ROOT / 'examples' / 'island.py'}:factory"


@pytest.mark.parametrize("text,message", [
    ("force_cpu: {ops: [aten.where.self]}\nspeed: fast\n", "unknown key 'speed'"),
    ("force_cpu: {layers: [conv]}\n", "unknown key 'force_cpu.layers'"),
    ("vela: {memory: Shared_Sram}\n", "unknown key 'vela.memory'"),
    ("placement: fastest\n", "placement must be one of greedy, cost"),
    ("clocks: {cpu_hz: -1}\n", "clocks.cpu_hz must be a positive number"),
    ("force_cpu: {nodes: 3}\n", "force_cpu.nodes must be a list of names"),
])
def test_a_bad_policy_is_refused_naming_the_key(tmp_path, text, message):
    from partitioners.policy import PolicyError, load_policy

    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=message):
        load_policy(path)


@pytest.mark.parametrize("where,message", [("missing.yaml", "policy file not found"),
                                            (".", "is not a regular file"),
                                            ("/dev/null", "is not a regular file")])
def test_a_policy_path_that_is_no_file_says_what_it_is(tmp_path, where, message):
    from partitioners.policy import PolicyError, load_policy

    with pytest.raises(PolicyError, match=message):
        load_policy(tmp_path / where if not where.startswith("/") else where)


def test_the_cli_refuses_an_unknown_policy_key_before_compiling(tmp_path, capsys):
    from orchestrator.cli import main

    path = tmp_path / "policy.yaml"
    path.write_text("force_gpu: {}\n")
    assert main(["plan", "mixed", "--policy", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown key 'force_gpu'" in err[0]


def _kernel_calls(pte_bytes: bytes, op: str) -> int:
    from kernels.program_view import ProgramView

    return sum(1 for call in ProgramView.read(pte_bytes).kernel_calls()
               if call.operator.name == op)


def test_a_forced_op_leaves_the_npu_partition_in_the_pte(tmp_path, compiles):
    import orchestrator

    policy = tmp_path / "policy.yaml"
    # mixed's 1x1 conv before the head, and a node name that is not in the program
    policy.write_text("force_cpu:\n  modules: [mix]\n  nodes: [aten_convolution_defualt_2]\n")
    greedy, _ = compiles.get("mixed", "corstone300", "ethos-u55-128")
    forced = orchestrator.compile("mixed", tmp_path / "forced.pte", npu="ethos-u55-128",
                                  policy=str(policy))
    conv = "cortex_m::quantized_conv2d"
    assert _kernel_calls(forced.compiled.pte_bytes, conv) == _kernel_calls(greedy.pte_bytes, conv) + 1
    (mix,) = [r for r in forced.plan.rows if r.name == "aten_convolution_default_2"]
    assert mix.placement == "cmsis-nn" and mix.kernel.startswith("arm_")
    assert mix.reasons[0].key == "policy-forced-cpu"
    assert f"force_cpu.modules: mix in {policy}" in mix.reasons[0].message
    # the misspelt entry changed nothing, and the plan says so (text and JSON); the one that
    # matched is not named
    notes = forced.plan.to_json()["summary"]["notes"]
    (unmatched,) = [n for n in notes if "matched no node" in n]
    assert "force_cpu.nodes: aten_convolution_defualt_2 matched no node" in unmatched
    assert "note: policy" in forced.plan.to_text() and "modules: mix matched" not in str(notes)
    report = orchestrator.verify(forced.pte, samples=4)
    assert report.passed, report.verdict


def test_a_forced_per_channel_linear_is_a_cmsis_nn_convolution_saying_why(tmp_path):
    """ExecuTorch 1.5.1's `cortex_m::quantized_linear` takes one requantization multiplier, and
    the Ethos-U quantizer gives the linear one scale per output channel, so the linear is
    computed as a 1x1 convolution (one multiplier per output channel) and the plan says why
    (tests/test_weight_zp.py has the upstream refusal itself, the exact one-scale case and the
    verification)."""
    import orchestrator

    policy = tmp_path / "policy.yaml"
    policy.write_text("force_cpu:\n  modules: [head]\n")
    plan = orchestrator.plan("mixed", npu="ethos-u55-128", policy=str(policy))
    (linear,) = [r for r in plan.rows if "linear" in r.op]
    assert linear.placement == "cmsis-nn" and linear.kernel.startswith("arm_convolve")
    decision = plan.compiled.cpu_decisions[linear.name]
    assert decision.category == "lowered"
    assert decision.message == "lowered to cortex_m.quantized_conv2d.default"
    (fix,) = [w for w in plan.compiled.workarounds if w.node == linear.name]
    assert "per-channel weight scales rewritten to a 1x1 convolution" in fix.message
    assert fix.upstream == ("ExecuTorch 1.5.1 cortex_m::quantized_linear (one requantization "
                            "multiplier)")


@pytest.fixture(scope="module")
def island_cost(tmp_path_factory):
    import orchestrator

    folder = tmp_path_factory.mktemp("island")
    # The platform's memory mode, fixed: the islands are judged against Shared_Sram's NPU
    # figures (cost placement would otherwise also try Sram_Only first).
    (folder / "shared.yaml").write_text("vela: {memory_mode: Shared_Sram}\n")
    return orchestrator.compile(ISLAND, folder / "island.pte", npu="ethos-u55-128",
                                placement="cost", policy=str(folder / "shared.yaml"))


def test_cost_placement_moves_an_island_not_worth_its_invocation(island_cost):
    """The final linear's island (10,240 MACs) costs more as an NPU invocation than on CMSIS-NN
    (a 1x1 convolution): moved. The addition's island stays: its 1,024 int8 additions on
    CMSIS-NN retire about 14,100 instructions (the platform calibration's arm_elementwise_add_s8
    model, fitted to QEMU profiles), more than the NPU invocation around them, though the cost
    model alone priced them at 2,964 cycles and moved them."""
    placement = island_cost.plan.cost_placement
    assert placement.chosen_seconds < placement.greedy_seconds
    (moved,) = [d for d in placement.decisions if d.moved]
    assert moved.nodes == ("aten_linear_default",)
    assert moved.cpu_seconds < moved.npu_seconds
    (add,) = [d for d in placement.decisions if d.nodes == ("aten_add_tensor",)]
    assert not add.moved and add.cpu_seconds > add.npu_seconds
    assert add.cpu_sources == "model:mve (raised to instructions: cortex-m55-qemu.yaml)"
    assert island_cost.plan.summary.npu_partitions == placement.greedy.summary.npu_partitions - 1
    (linear,) = [r for r in island_cost.plan.rows if r.name == "aten_linear_default"]
    assert linear.placement == "cmsis-nn" and "--placement cost" in linear.reasons[0].message
    lines = placement.report_lines()
    assert any(line.startswith("partition 2 (1 ops, 10,240 MACs) moved to the CPU: -")
               for line in lines), lines
    assert any(line.startswith("partition 1 (1 ops, 0 MACs) kept on the NPU: +") and
               "[model:mve (raised to instructions: cortex-m55-qemu.yaml)]" in line
               for line in lines), lines


def test_the_cost_placed_pte_verifies(island_cost):
    import orchestrator

    report = orchestrator.verify(island_cost.pte, samples=4)
    assert report.passed, report.verdict


def test_cost_placement_is_never_worse_than_greedy_and_says_why_an_island_stayed(tmp_path):
    """On a Corstone-300 without its CPU calibration (the cost model's own figures), the 0.1 * x
    island looks cheaper on the CPU alone, but ExecuTorch 1.5.1's Cortex-M mul does not
    broadcast a [1,1,1,1] constant: moved, the mul is kept in float (upstream's refusal in the
    plan; the recompile used to fail here), and the whole program is then slower by the model,
    so the island stays, saying so with both figures. (With the platform's calibration the
    island is no candidate: CMSIS-NN's mul retires more instructions than the model's cycles.)"""
    import orchestrator
    from platforms import load_platform

    source = Path(load_platform("corstone300").source_file).read_text()
    platform = tmp_path / "platform.yaml"
    platform.write_text(source.replace("  calibration_costs: cortex-m55-qemu.yaml\n", ""))
    plan = orchestrator.plan("mixed", platform=str(platform), npu="ethos-u55-128",
                             placement="cost")
    assert plan.calibration is None
    placement = plan.cost_placement
    assert placement.chosen_seconds <= placement.greedy_seconds
    (stayed,) = [d for d in placement.decisions if "aten_mul_tensor" in d.nodes]
    assert not stayed.moved and stayed.cpu_seconds < stayed.npu_seconds
    assert stayed.kept_reason.startswith("moving was not faster for the whole program (")
    assert " ms vs " in stayed.kept_reason


def test_a_softmax_forced_to_the_cpu_runs_in_float_where_upstream_has_no_int8_route(tmp_path):
    """A softmax the Ethos-U quantizer quantized, forced to the CPU op by op. Upstream: its
    `sub` becomes cortex_m::quantized_add, whose fake kernel refuses the (1, 6) - (1, 1)
    broadcast (an internal error before), and FoldAndAnnotateQParamsPass folds the
    quantize/dequantize into exp, sum and reciprocal, which only float portable kernels run
    (the device refused the program: "input.scalar_type() 6 does not match dtype 1"). Now
    the sub is kept in float quoting upstream's refusal, the float-only ops keep their
    quantize/dequantize, and the program verifies."""
    import orchestrator

    policy = tmp_path / "policy.yaml"
    policy.write_text("force_cpu:\n  ops: [aten.amax.default, aten.sub.Tensor, aten.exp.default, "
                      "aten.sum.dim_IntList, aten.reciprocal.default, aten.mul.Tensor]\n")
    model = f"{ROOT / 'examples' / 'user_models.py'}:softmax_classifier"
    result = orchestrator.compile(model, tmp_path / "softmax.pte", npu="ethos-u55-128",
                                  policy=str(policy))
    rows = {r.op.split(".")[1]: r for r in result.plan.rows if r.op.startswith("aten.")
            and r.placement != "npu"}
    assert {"amax", "sub", "exp", "sum", "reciprocal", "mul"} <= set(rows), sorted(rows)
    sub = result.compiled.cpu_decisions[rows["sub"].name]
    assert sub.category == "upstream-failure"
    assert "broadcasting is not yet supported" in sub.message
    for op in ("exp", "reciprocal"):
        assert rows[op].placement == "portable" and "float32" in rows[op].dtypes, rows[op].dtypes
    texts = [w.message for w in result.compiled.workarounds]
    assert sum("computes on real values, not on int8 codes" in t for t in texts) >= 3, texts
    assert result.plan.summary.device_faults == ()
    report = orchestrator.verify(result.pte, samples=4)
    assert report.passed, report.verdict


def test_an_average_pool_over_its_one_window_computes_the_same_values():
    """partitioners/module_forms.py, avg_pools_over_their_window: only a pool with one window that
    leaves the input's last rows or columns unread is rewritten, and the copy computes the same
    values; the model given stays as it was."""
    import torch

    from partitioners.module_forms import avg_pools_over_their_window

    class Pools(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.one_window = torch.nn.AvgPool2d((24, 5))  # DS-CNN's, over 25x5
            self.exact = torch.nn.AvgPool2d((25, 5))  # reads every row: nothing to cut
            self.several = torch.nn.AvgPool2d(2)  # more than one window: not this rewrite
            self.padded = torch.nn.AvgPool2d((24, 5), padding=(1, 0))

        def forward(self, x):
            return (self.one_window(x), self.exact(x), self.several(x[:, :, :4, :4]),
                    self.padded(x))

    model = Pools().eval()
    x = torch.randn(1, 64, 25, 5, generator=torch.Generator().manual_seed(0))
    legal, fixes = avg_pools_over_their_window(model, (x,))
    assert [f.node for f in fixes] == ["one_window"]
    assert fixes[0].message.startswith("AvgPool2d(24x5) over 25x5 computed over its one window")
    assert type(legal.one_window).__name__ == "AvgPool2dWindow"
    assert all(type(getattr(legal, n)) is torch.nn.AvgPool2d for n in ("exact", "several",
                                                                       "padded"))
    assert type(model.one_window) is torch.nn.AvgPool2d  # the given model is untouched
    with torch.no_grad():
        for before, after in zip(model(x), legal(x)):
            assert torch.equal(before, after)


_VELA_REFUSES = '''
import torch
from torch import nn


class StridedOneChannel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, (3, 2), stride=(12, 2))  # 49x10 -> 4x5
        self.head = nn.Linear(20, 4)

    def forward(self, x):
        return self.head(torch.flatten(torch.relu(self.conv(x)), 1))


def factory():
    torch.manual_seed(0)
    return StridedOneChannel().eval(), (torch.randn(1, 1, 49, 10),)
'''


def test_a_partition_vela_cannot_compile_runs_on_the_cpu_with_velas_words(tmp_path):
    """The Ethos-U55 checks of ExecuTorch 1.5.1 accept a 1-channel convolution of stride
    (12, 2); Vela then refuses the partition ("Non-passthrough operation (DepthwiseConv2D)
    could not run on NPU"), which ended the compile with an internal error. The partition's ops
    now run on the CPU, each row quoting Vela, and the program verifies."""
    import orchestrator

    model = tmp_path / "strided.py"
    model.write_text(_VELA_REFUSES)
    compiled = orchestrator.compile(f"{model}:factory", tmp_path / "strided.pte",
                                    npu="ethos-u55-128")
    plan = compiled.plan
    assert plan.summary.npu_partitions == 0
    (conv,) = [r for r in plan.rows if r.name == "aten_convolution_default"]
    assert conv.placement == "cmsis-nn"
    assert conv.reasons[0].key == "vela-refused-npu"
    assert ("Vela could not compile the NPU partition it was in for ethos-u55-128 "
            "(Non-passthrough operation (DepthwiseConv2D) could not run on NPU)"
            in conv.reasons[0].message)
    report = orchestrator.verify(compiled.pte, samples=2)
    assert report.passed, report.verdict
