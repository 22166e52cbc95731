"""Consecutive Conv1d layers keep one 2-D layout from the first to the last (module_forms.py)."""

from __future__ import annotations

import torch
from torch import nn

from partitioners.module_forms import conv1d_as_conv2d


def _chain() -> nn.Sequential:
    """Three Conv1d of kernel 9, stride 2 (an audio front end's shape)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(8, 16, 9, stride=2, padding=4), nn.ReLU(),
                         nn.Conv1d(16, 32, 9, stride=2, padding=4), nn.BatchNorm1d(32),
                         nn.ReLU(), nn.Conv1d(32, 32, 9, stride=2, padding=4)).eval()


def test_consecutive_conv1d_share_one_unsqueeze_and_compute_the_same():
    model, x = _chain(), torch.rand(1, 8, 400) * 2 - 1
    legal, fixes = conv1d_as_conv2d(model)
    graph = torch.export.export(legal, (x,), strict=True).graph
    ops = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    assert sum("unsqueeze" in op for op in ops) == 1, ops
    assert sum("squeeze" in op and "unsqueeze" not in op for op in ops) == 1, ops
    assert len(fixes) == 3  # each Conv1d group is still reported
    assert torch.allclose(legal(x), model(x), atol=1e-5)


def test_a_conv1d_chain_on_the_m55_has_no_layout_copy_between_its_convolutions():
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import LoadedModel, load_calibration
    from orchestrator.target import resolve_target

    model, x = _chain(), torch.rand(1, 8, 400) * 2 - 1
    loaded = LoadedModel("conv1d-chain", model, (x,), "test:conv1d-chain", "unknown")
    compiled = compile_model(loaded, load_calibration(None, (x,)),
                             resolve_target("corstone300", npu="none", cpu="cortex-m55"))
    rows = [(r.op, r.placement) for r in compiled.placements]
    convs = [i for i, (op, _) in enumerate(rows) if op.startswith("aten.convolution")]
    assert len(convs) == 3 and all(rows[i][1] == "cmsis-nn" for i in convs), rows
    between = rows[convs[0]:convs[-1]]
    assert not [op for op, _ in between if "dim_order" in op], rows
