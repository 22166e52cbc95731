"""A copy `to_executorch` inserts has its plan row.

ExecuTorch 1.5.1's LegalizePortableDimOrderPass, run when the program is serialized, copies the
first input of a portable avg_pool2d, adaptive average pool, expand, mean or sum to the
contiguous dim order when it is not. The plan is made from the program before that pass, so it
had no row for the copy: `plan --measured` of gated_flip_two_outputs refused ("14 CPU rows but
15 kernel calls"), and the copy's cost (64,717 instructions on the M55) was in no estimate."""

from __future__ import annotations


def _kernel_names(pte_bytes: bytes) -> list[str]:
    from kernels.program_view import ProgramView

    view = ProgramView.read(pte_bytes)
    return [call.operator.qualified_name for call in view.kernel_calls()]


def test_every_kernel_call_of_the_program_has_its_row():
    import orchestrator
    from orchestrator.compilation.upstream_exir import emitter_contiguous_ops

    assert "aten.mean.dim" in emitter_contiguous_ops()
    plan = orchestrator.plan("examples/user_models.py:gated_flip_two_outputs", npu="none")
    calls = _kernel_names(plan.compiled.pte_bytes)
    rows = [r for r in plan.rows if r.placement != "npu"]
    assert len(rows) == len(calls), (calls, [r.op for r in rows])
    copies = [r for r in rows if r.name.endswith(":to_contiguous")]
    assert len(copies) == 1
    (copy,) = copies
    index = rows.index(copy)
    assert calls[index] == "dim_order_ops::_to_dim_order_copy.out"
    assert calls[index + 1] == "aten::mean.out"
    assert copy.kind == "layout" and copy.cost is not None and copy.cost.cycles > 0
    assert copy.reasons[0].key == "emitter-dim-order-copy"


def test_a_legalized_program_keeps_one_row_per_kernel_call():
    """conv1d_audio CPU-only: the device check legalizes its graph (layout copies around the
    squeezes), and the placements are made again from the legalized edge program: every kernel
    call but the view copies has its row, and no row names an executorch-level op."""
    import orchestrator

    plan = orchestrator.plan("examples/user_models.py:conv1d_audio", npu="none")
    calls = [c for c in _kernel_names(plan.compiled.pte_bytes)
             if not c.startswith(("aten::squeeze_copy", "aten::unsqueeze_copy"))]
    rows = [r for r in plan.rows if r.placement != "npu"]
    assert len(rows) == len(calls), (calls, [r.op for r in rows])
    assert not [r.op for r in rows if r.op.endswith(".out") or "et_view" in r.op]

