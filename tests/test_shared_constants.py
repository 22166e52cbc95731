"""One constant per value after quantization (orchestrator/compilation/shared_constants.py):
PT2E quantizes a shared weight once per use, and the merge keeps one copy of each value without
changing what the quantized module computes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from orchestrator.compilation.shared_constants import merge_equal_constants


class TwoSteps(nn.Module):
    """One linear applied at three steps, as an unrolled recurrence applies its weights."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.tanh(self.cell(x))
        h = torch.tanh(self.cell(h) + x)
        return self.cell(h)


def _constants(module: torch.fx.GraphModule) -> list[torch.Tensor]:
    return [getattr(module, node.target) for node in module.graph.nodes if node.op == "get_attr"]


@pytest.fixture(scope="module")
def converted():
    from executorch.backends.arm.ethosu import EthosUCompileSpec
    from executorch.backends.arm.quantizer import (EthosUQuantizer,
                                                   get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    module, x = TwoSteps().eval(), torch.randn(1, 8)
    quantizer = EthosUQuantizer(EthosUCompileSpec("ethos-u55-128"))
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(module, (x,)).module(check_guards=False),
                            quantizer)
    for _ in range(4):
        prepared(torch.randn(1, 8))
    return convert_pt2e(prepared), x


def test_a_weight_used_at_three_steps_is_kept_once_and_computes_the_same(converted):
    module, x = converted
    inputs = [x] + [torch.randn(1, 8) for _ in range(3)]
    before = [module(i) for i in inputs]
    int8_weights = [c for c in _constants(module) if c.dtype == torch.int8 and c.dim() == 2]
    # upstream's behaviour: one int8 copy of the shared weight per use
    assert len(int8_weights) == 3 and all(torch.equal(w, int8_weights[0]) for w in int8_weights)
    count = len(_constants(module))
    targets = [n.target for n in module.graph.nodes if n.op == "get_attr"]

    removed = merge_equal_constants(module)

    constants = _constants(module)
    assert removed >= 2 and len(constants) == count - removed
    assert len([c for c in constants if c.dtype == torch.int8 and c.dim() == 2]) == 1
    # no two remaining constants hold the same value, and the removed attributes are gone
    for i, a in enumerate(constants):
        assert not any(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
                       for b in constants[i + 1:])
    kept = {n.target for n in module.graph.nodes if n.op == "get_attr"}
    assert all(not hasattr(module, t) for t in targets if t not in kept)
    after = [module(i) for i in inputs]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_a_constant_something_writes_keeps_its_own_node():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    module = torch.nn.Module()
    module.a, module.b, module.c = torch.ones(4), torch.ones(4), torch.ones(4)
    a, b, c = (graph.get_attr(name) for name in "abc")
    written = graph.call_function(torch.ops.aten.add_.Tensor, (b, x))
    total = graph.call_function(torch.ops.aten.add.Tensor, (a, c))
    graph.output((graph.call_function(torch.ops.aten.add.Tensor, (total, written)),))
    gm = torch.fx.GraphModule(module, graph)

    assert merge_equal_constants(gm) == 1  # c into a; b is written in place, so it stays
    targets = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    assert targets == ["a", "b"] and not hasattr(gm, "c")
    assert torch.equal(gm(torch.full((4,), 2.0))[0], torch.full((4,), 5.0))
