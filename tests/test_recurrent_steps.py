"""An unrolled recurrence on the NPU: one quantization for all steps, one partition per step,
each distinct partition compiled once (partitioners/repeated_steps.py,
orchestrator/compilation/recurrent_steps.py), and the program the same as compiling every step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

STEPS = 6
_MODEL = f"""
import torch
from torch import nn


class StepGru(nn.Module):
    def __init__(self):
        super().__init__()
        self.front = nn.Linear(10, 16)
        self.gru = nn.GRU(16, 8, batch_first=True)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        out, _ = self.gru(torch.relu(self.front(x)))
        return self.head(out[:, -1])


def factory():
    torch.manual_seed(0)
    return StepGru().eval(), (torch.randn(1, {STEPS}, 10),)
"""


@pytest.fixture(scope="module")
def model_spec(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("recurrence") / "step_gru.py"
    path.write_text(_MODEL)
    return f"{path}:factory"


@pytest.fixture(scope="module")
def shared(compiles, model_spec):
    return compiles.get(model_spec, "corstone300", "ethos-u55-128", write=True)


def _compile(model_spec, policy=None):
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    loaded = load_model(model_spec)
    return compile_model(loaded, load_calibration(None, loaded.example_inputs),
                         resolve_target("corstone300", "ethos-u55-128"), policy=policy)


def test_a_recurrence_on_the_npu_is_one_partition_per_step_each_distinct_one_compiled_once(
        shared):
    from orchestrator.compilation.upstream_exir import read_pte
    from partitioners.npu import npu_delegates

    compiled, _ = shared
    partitions = npu_delegates(compiled.final_program, compiled.lowered.vela_runs)
    # The front and the frames before the steps, one partition per step, the head after them.
    assert len(partitions) == 1 + STEPS + 1
    # Compiled: the front, the first step (its state is the zero state made before it), one
    # step for the other five, the head.
    assert len(compiled.lowered.vela_runs) == 4
    assert len({p.payload_sha256 for p in partitions}) == 4
    steps = [p.payload_sha256 for p in partitions[2:-1]]
    assert len(set(steps)) == 1 and len(steps) == STEPS - 1
    # ExecuTorch's emitter stores each distinct payload once.
    assert len(read_pte(compiled.pte_bytes).program.backend_delegate_data) == 4
    said = [w.message for w in compiled.workarounds if w.node == "(recurrence)"]
    assert len(said) == 2, said
    assert f"{STEPS} repeated steps" in said[0] and "share one quantization" in said[0]
    assert f"cut into {STEPS + 2} partitions" in said[1]
    assert "4 partition(s) of the program equal to one compiled before" in said[1]


def test_compiling_each_distinct_step_once_gives_the_program_compiling_every_step_gives(
        shared, model_spec, monkeypatch):
    """The reuse changes no byte: with no partition digest (every partition lowered and
    compiled by Vela on its own) the .pte is the same."""
    import partitioners.npu as npu

    compiled, _ = shared
    monkeypatch.setattr(npu, "partition_digest", lambda program, compile_specs: None)
    every_step = _compile(model_spec)
    assert len(every_step.lowered.vela_runs) == 1 + STEPS + 1
    assert every_step.pte_bytes == compiled.pte_bytes


def _quantized_after(program, op: str) -> list[tuple[float, int]]:
    found = []
    for node in program.graph.nodes:
        if node.op == "call_function" and str(node.target).startswith(f"aten.{op}"):
            (quantize,) = [u for u in node.users if "quantize_per_tensor" in str(u.target)]
            found.append((float(quantize.args[1]), int(quantize.args[2])))
    return found


def test_the_steps_share_one_quantization_where_upstreams_flow_gives_each_its_own(
        shared, model_spec):
    from orchestrator.compilation.pipeline import capture, quantize
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    compiled, _ = shared
    ours = _quantized_after(compiled.quantized.program, "tanh")
    assert len(ours) == STEPS and len(set(ours)) == 1, ours
    loaded = load_model(model_spec)
    upstream = quantize(capture(loaded), load_calibration(None, loaded.example_inputs),
                        resolve_target("corstone300", "ethos-u55-128"), legalize=False)
    theirs = _quantized_after(upstream.program, "tanh")
    assert len(theirs) == STEPS and len(set(theirs)) > 1, theirs


def test_a_policy_keeps_the_recurrence_whole_in_one_partition_each_step_quantized_alone(
        shared, model_spec):
    """`recurrences: whole` (partitioners/policy.py): upstream's form, one NPU invocation."""
    from partitioners.npu import npu_delegates
    from partitioners.policy import PolicyError, parse_policy

    whole = _compile(model_spec, parse_policy({"recurrences": "whole"}))
    partitions = npu_delegates(whole.final_program, whole.lowered.vela_runs)
    assert len(partitions) == 1 and len(whole.lowered.vela_runs) == 1
    assert not [w for w in whole.workarounds if w.node == "(recurrence)"]
    assert len(set(_quantized_after(whole.quantized.program, "tanh"))) > 1
    with pytest.raises(PolicyError, match="recurrences must be one of per-step, whole"):
        parse_policy({"recurrences": "unrolled"})


def test_the_recurrence_cut_into_steps_passes_twin_host_runtime_and_qemu(shared):
    from tests.device_tools import passes_twin_host_runtime_and_qemu

    passes_twin_host_runtime_and_qemu(shared[1])


def test_the_plan_says_the_steps_share_one_stored_stream(shared):
    from orchestrator.planning.planner import make_plan

    compiled, _ = shared
    plan = make_plan(compiled)
    (gru,) = plan.summary.recurrences
    assert gru.steps == STEPS
    # the collapsed line names the partitions it spans by number, not as text sorted ("p7" > "p10")
    (line,) = [ln for ln in plan.to_text().splitlines() if "gru (GRU)" in ln and "steps" in ln]
    assert f"NPU p0-p{STEPS + 1}" in line, line
    assert f"NPU partitions p2-p{STEPS} ({STEPS - 1} equal partitions: one command stream and " \
           "weights stored once in the .pte)" in gru.stored, gru.stored
    # each partition holds one step's weights: none carries a copy per step
    assert "every unrolled step carries its own copy" not in gru.stored, gru.stored


# ---------------------------------------------------------------------------------------------
# What is a recurrence and what is not (no compile)


def _tied(module: nn.Module, example) -> object:
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from orchestrator.compilation.pipeline import _quantizer
    from orchestrator.compilation.recurrent_steps import tie_step_observers
    from orchestrator.target import resolve_target

    program = torch.export.export(module.eval(), example)
    prepared = prepare_pt2e(program.module(check_guards=False),
                            _quantizer(resolve_target("corstone300", "ethos-u55-128"), "minmax"))
    return tie_step_observers(prepared)


class _Layers(nn.Module):
    def __init__(self, shared: bool):
        super().__init__()
        torch.manual_seed(0)
        first = nn.Linear(8, 8)
        self.layers = nn.ModuleList(first if shared else nn.Linear(8, 8) for _ in range(6))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x)) * torch.sigmoid(x)
        return x


def test_a_layer_applied_again_with_its_weights_is_a_recurrence_a_stack_of_layers_is_not():
    tied = _tied(_Layers(shared=True), (torch.randn(1, 8),))
    assert tied is not None and tied.steps == 6 and tied.observers_after < tied.observers_before
    assert _tied(_Layers(shared=False), (torch.randn(1, 8),)) is None


def test_a_chain_of_elementwise_ops_with_no_weight_is_not_a_recurrence():
    class Chain(nn.Module):
        def forward(self, x):
            for _ in range(8):
                x = torch.sigmoid(x) * x + x
            return x

    assert _tied(Chain(), (torch.randn(1, 8),)) is None


def test_a_partition_digest_ignores_names_and_node_order_but_not_the_order_of_inputs():
    from partitioners.repeated_steps import partition_digest

    class XFirst(nn.Module):
        def forward(self, x, h):
            a = torch.relu(x)
            b = torch.sigmoid(h)
            return a + b

    class HFirst(nn.Module):
        def forward(self, x, h):
            b = torch.sigmoid(h)
            a = torch.relu(x)
            return a + b

    class Swapped(nn.Module):
        def forward(self, h, x):
            return torch.relu(x) + torch.sigmoid(h)

    inputs = (torch.randn(1, 4), torch.randn(1, 4))
    digests = [partition_digest(torch.export.export(m(), inputs), [])
               for m in (XFirst, HFirst, Swapped)]
    assert digests[0] == digests[1] != digests[2]
