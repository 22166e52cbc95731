"""Shared values: a smaller `.pte` with the same program.

ExecuTorch's emitter writes one EValue per argument: DS-CNN CPU-only on the Cortex-M55 carries
244 values, 178 of them scalars and int lists of which 55 are distinct (52 copies of the Int 1,
23 of -128, 21 of 0 ...), each its own flatbuffer table. The runtime resolves every argument by
its value index, so arguments with equal values may name one value: this rewrite keeps the first
of each set of equal read-only values, points every reference at it, and drops the shareable
values nothing references.

What is shared: Null, Int, Double, Bool, IntList, DoubleList and BoolList values that no
instruction writes. A kernel call writes its last argument, a move writes its destination, and
the plan's inputs and outputs are set from outside; those values, every tensor and tensor list
(the runtime builds a list's own storage), strings and anything else keep their own values. An
IntList's items are value indices (symbolic sizes), so lists are compared after their items are
remapped.

What is dropped besides: each plan's ContainerMetadata strings, the pytree specs of its inputs
and outputs (DS-CNN: 311 characters, 320 B of its 5,792 B of tables and padding). They are for
Python-side unflattening (exir's reference interpreter); the runtime reads neither (its only
reader, program.cpp's Program::get_output_flattening_encoding, is deprecated and called
nowhere). The table stays, with empty strings, so that reader still finds one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from executorch.exir import schema

_SHAREABLE = (schema.Null, schema.Int, schema.Double, schema.Bool, schema.IntList,
              schema.DoubleList, schema.BoolList)


@dataclass(frozen=True)
class SharedValues:
    """What the rewrite did to one execution plan."""

    plan: str
    values_before: int
    values_after: int
    container_metadata_bytes: int  # the pytree spec strings emptied (characters)


def _direct_references(plan) -> tuple[set[int], set[int]]:
    """The values the plan's instructions, chains, inputs and outputs name, and of those the
    ones something writes: a kernel call's last argument, a delegate call's arguments (its
    outputs are among them), a move's destination, a freed value, the inputs and outputs."""
    named = set(plan.inputs) | set(plan.outputs)
    written = set(named)
    for chain in plan.chains:
        ends = set(chain.inputs) | set(chain.outputs)
        named |= ends
        written |= ends
        for instruction in chain.instructions:
            call = instruction.instr_args
            if isinstance(call, schema.KernelCall):
                named |= set(call.args)
                written |= set(call.args[-1:])
            elif isinstance(call, schema.DelegateCall):
                named |= set(call.args)
                written |= set(call.args)
            elif isinstance(call, schema.MoveCall):
                named |= {call.move_from, call.move_to}
                written.add(call.move_to)
            elif isinstance(call, schema.JumpFalseCall):
                named.add(call.cond_value_index)
            elif isinstance(call, schema.FreeCall):
                named.add(call.value_index)
                written.add(call.value_index)
    return named, written


def _key(value, remap: dict[int, int]):
    val = value.val
    if isinstance(val, schema.IntList):
        return ("IntList", tuple(remap.get(i, i) for i in val.items))
    if isinstance(val, (schema.DoubleList, schema.BoolList)):
        return (type(val).__name__, tuple(repr(item) for item in val.items))
    if isinstance(val, schema.Null):
        return ("Null",)
    # Int, Double, Bool: the type matters (Bool True is not Int 1), and repr keeps -0.0 apart
    # from 0.0
    return (type(val).__name__,) + tuple(repr(v) for v in val.__dict__.values())


def _referenced(plan) -> set[int]:
    used, _ = _direct_references(plan)
    # list items are references too, transitively (a list kept keeps its items)
    pending = list(used)
    while pending:
        val = plan.values[pending.pop()].val
        if isinstance(val, (schema.IntList, schema.TensorList, schema.OptionalTensorList)):
            for item in val.items:
                if item >= 0 and item not in used:
                    used.add(item)
                    pending.append(item)
    return used


def _renumber(plan, mapping: dict[int, int]) -> None:
    """Point every reference of `plan` through `mapping` (old index -> new index)."""
    def new(index: int) -> int:
        return mapping[index]

    plan.inputs = [new(i) for i in plan.inputs]
    plan.outputs = [new(i) for i in plan.outputs]
    for chain in plan.chains:
        chain.inputs = [new(i) for i in chain.inputs]
        chain.outputs = [new(i) for i in chain.outputs]
        for instruction in chain.instructions:
            call = instruction.instr_args
            if isinstance(call, (schema.KernelCall, schema.DelegateCall)):
                call.args = [new(i) for i in call.args]
            elif isinstance(call, schema.MoveCall):
                call.move_from, call.move_to = new(call.move_from), new(call.move_to)
            elif isinstance(call, schema.JumpFalseCall):
                call.cond_value_index = new(call.cond_value_index)
            elif isinstance(call, schema.FreeCall):
                call.value_index = new(call.value_index)
    for value in plan.values:
        val = value.val
        if isinstance(val, (schema.IntList, schema.TensorList)):
            val.items = [new(i) for i in val.items]
        elif isinstance(val, schema.OptionalTensorList):
            val.items = [new(i) if i >= 0 else i for i in val.items]


def share_plan_values(plan) -> SharedValues:
    """Rewrite one execution plan in place; what it did."""
    before = len(plan.values)
    _, written = _direct_references(plan)
    first: dict = {}
    remap: dict[int, int] = {}  # a duplicate -> the value it now names
    for index, value in enumerate(plan.values):
        if index in written or not isinstance(value.val, _SHAREABLE):
            continue
        key = _key(value, remap)
        if key in first:
            remap[index] = first[key]
        else:
            first[key] = index
    _renumber(plan, {i: remap.get(i, i) for i in range(before)})
    # Only shareable values go when nothing references them: a tensor no instruction reads is a
    # dead constant, which orchestrator/compilation/prune.py removes with its bytes (or, with
    # pruning off, `orchestrate size` reports as such).
    referenced = _referenced(plan)
    kept = [index for index, value in enumerate(plan.values)
            if index in referenced or not isinstance(value.val, _SHAREABLE)]
    compact = {old: new for new, old in enumerate(kept)}
    plan.values = [plan.values[old] for old in kept]
    _renumber(plan, compact)
    meta = plan.container_meta_type
    dropped = len(meta.encoded_inp_str) + len(meta.encoded_out_str)
    plan.container_meta_type = schema.ContainerMetadata("", "")
    return SharedValues(plan.name, before, len(plan.values), dropped)


def share_values(program) -> tuple[object, tuple[SharedValues, ...]]:
    """A copy of the schema Program with every execution plan's values shared (and its unread
    container metadata emptied)."""
    shared = copy.deepcopy(program)
    return shared, tuple(share_plan_values(plan) for plan in shared.execution_plan)
