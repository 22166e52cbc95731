"""Shared values (orchestrator/compilation/share_values.py): equal read-only arguments name one
value, written values keep their own, and the program computes the same bytes."""

from __future__ import annotations

from executorch.exir import schema

from orchestrator.compilation.share_values import share_plan_values
from orchestrator.verification.twin import run_twin


def _plan(values, instructions, inputs=(), outputs=()):
    return schema.ExecutionPlan(
        name="forward", container_meta_type=schema.ContainerMetadata("", ""),
        values=[schema.EValue(v) for v in values], inputs=list(inputs), outputs=list(outputs),
        chains=[schema.Chain(list(inputs), list(outputs),
                             [schema.Instruction(schema.KernelCall(0, list(args)))
                              for args in instructions], [])],
        operators=[schema.Operator("executorch_prim::add", "Scalar")], delegates=[],
        non_const_buffer_sizes=[0])


def _vals(plan, call):
    return [plan.values[i].val for i in plan.chains[0].instructions[call].instr_args.args]


def test_equal_read_only_scalars_share_one_value_and_a_written_one_keeps_its_own():
    plan = _plan([schema.Int(1), schema.Int(1), schema.Int(1), schema.Int(1), schema.Int(1)],
                 [(0, 1, 2), (3, 4, 2)])
    before = [_vals(plan, i) for i in range(2)]
    record = share_plan_values(plan)
    assert (record.values_before, record.values_after) == (5, 2)
    args = [plan.chains[0].instructions[i].instr_args.args for i in range(2)]
    # both read-only pairs name the shared value; the written output (2) is still distinct
    assert args[0][0] == args[0][1] == args[1][0] == args[1][1] != args[0][2] == args[1][2]
    assert [_vals(plan, i) for i in range(2)] == before


def test_values_equal_to_python_but_not_to_the_runtime_stay_apart():
    plan = _plan([schema.Bool(True), schema.Int(1), schema.Double(0.0), schema.Double(-0.0),
                  schema.Null(), schema.Null(), schema.Int(7)],
                 [(0, 1, 2, 3, 4, 5, 6)])
    record = share_plan_values(plan)
    assert record.values_after == 6  # only the two Nulls became one
    vals = _vals(plan, 0)
    assert isinstance(vals[0], schema.Bool) and isinstance(vals[1], schema.Int)
    assert repr(vals[2].double_val) == "0.0" and repr(vals[3].double_val) == "-0.0"


def test_int_lists_share_after_their_items_and_unreferenced_values_go():
    plan = _plan([schema.Int(3), schema.Int(3), schema.IntList([0]), schema.IntList([1]),
                  schema.Int(99), schema.Int(0)],
                 [(2, 3, 5)])
    share_plan_values(plan)
    vals = _vals(plan, 0)
    args = plan.chains[0].instructions[0].instr_args.args
    assert args[0] == args[1]  # [Int 3] and [Int 3 (copy)] are one list now
    assert [plan.values[i].val.int_val for i in vals[0].items] == [3]
    assert all(getattr(v.val, "int_val", None) != 99 for v in plan.values)  # nothing used it


def test_shared_program_is_smaller_and_computes_the_same_bytes(compiles, tmp_path):
    from orchestrator.artifacts.outputs import write_outputs
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    shared, pte = compiles.get("ds-cnn", npu="none", cpu="cortex-m55", write=True)
    loaded = load_model("ds-cnn")
    calibration = load_calibration(None, loaded.example_inputs)
    unshared = compile_model(loaded, calibration,
                             resolve_target("corstone300", npu="none", cpu="cortex-m55"),
                             share_values=False)
    before = tmp_path / "before.pte"
    write_outputs(unshared, before)
    assert len(shared.pte_bytes) < len(unshared.pte_bytes) - 4000  # 41,264 -> 36,784 B
    assert len(shared.program_view.values) < len(unshared.program_view.values) // 2
    for sample in calibration.samples[:2]:
        assert run_twin(pte, tuple(sample)).output_bytes == \
            run_twin(before, tuple(sample)).output_bytes
