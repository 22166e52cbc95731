"""Every zoo model compiles for every shipped target; checked on the serialized .pte.

Targets: Corstone-300 with Ethos-U55-128 and U65-256, Corstone-320 with U85-256, and CPU-only
Cortex-M55 (MVE), M33 (DSP) and M0+ (Scalar).
"""

from __future__ import annotations

import pytest

from examples.zoo import zoo_names

TARGETS = [
    ("corstone300", "ethos-u55-128", None),
    ("corstone300", "ethos-u65-256", None),
    ("corstone320", "ethos-u85-256", None),
    ("corstone300", "none", "cortex-m55"),
    ("corstone300", "none", "cortex-m33"),
    ("corstone300", "none", "cortex-m0plus"),
]


def _plan(pte_bytes):
    from executorch.exir._serialize._program import deserialize_pte_binary

    return deserialize_pte_binary(pte_bytes).program.execution_plan[0]


@pytest.mark.matrix
@pytest.mark.parametrize("platform,npu,cpu", TARGETS, ids=[t[1] if t[1] != "none" else t[2] for t in TARGETS])
@pytest.mark.parametrize("model", zoo_names())
def test_zoo_model_compiles_to_one_pte_with_the_intended_placement(compiles, model, platform, npu, cpu):
    from orchestrator.planning.planner import make_plan
    from tests.plan_checks import assert_summary_is_the_rows_added_up

    compiled, _ = compiles.get(model, platform, npu, cpu)
    assert_summary_is_the_rows_added_up(make_plan(compiled))
    plan = _plan(compiled.pte_bytes)
    operators = {f"{op.name}.{op.overload}" for op in plan.operators}
    delegates = [(d.id, {s.key: bytes(s.value) for s in d.compile_specs}) for d in plan.delegates]
    if npu == "none":
        assert not delegates
    else:
        assert delegates and all(backend == "EthosUBackend" and specs["target"] == npu.encode()
                                 for backend, specs in delegates)
    # A portable row's not-CMSIS-NN reason matches what AtenToCortexMPass recorded for it: a
    # failed substitution condition, or no substitution attempted at all.
    for row in compiled.placements:
        if row.placement != "portable":
            continue
        decision = compiled.cpu_decisions.get(row.name)
        if row.reasons[1].key == "cmsis-condition":
            assert decision is not None and decision.category != "lowered", row
            assert row.reasons[1].message == decision.message
        else:
            assert row.reasons[1].key == "no-cmsis-kernel", row
            assert decision is None or decision.category != "lowered", row
    assert all(b.consistent for b in compiled.boundaries)
    assert compiled.arena_bytes > 0 and len(compiled.pte_bytes) > 0
    assert all(op.startswith(("cortex_m::", "aten::", "dim_order_ops::")) for op in operators)
