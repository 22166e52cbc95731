"""Which plan rows each instruction of the program runs: the one mapping from a plan to a `.pte`.

The program's kernel calls are the plan's CPU rows in execution order, one each; an Ethos-U
delegate call runs every row of its NPU partition (the partition's ops and its invocation).
The plan takes reshapes as free and lists no row for them, but the emitted program may copy a
squeeze, unsqueeze or view through a portable kernel (`aten::squeeze_copy.dims_out` around each
1-D convolution, after each step of an unrolled GRU): when the counts differ by exactly those
calls, they map to no row.
The Model Explorer overlay (orchestrator/reports/explorer.py) and the measured profile
(orchestrator/planning/measured.py) both read it. Rows are anything with a `placement` and a
`partition`, given as (placement, partition) pairs so a Plan's rows and plan.json's ops map the
same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernels.program_view import ProgramView


# Portable kernels that copy a tensor to a new shape, its bytes unchanged (ExecuTorch's
# kernels/portable/cpu/op_{view,squeeze,unsqueeze}_copy.cpp): the plan has no row for them.
VIEW_COPIES = frozenset({"aten::view_copy", "aten::squeeze_copy", "aten::unsqueeze_copy",
                         "aten::_unsafe_view_copy", "aten::reshape_copy"})


def is_view_copy(operator_name: str) -> bool:
    return operator_name.split(".")[0] in VIEW_COPIES


class InstructionMapError(RuntimeError):
    """The plan's rows and the program's instructions do not line up."""


def instruction_positions(view: ProgramView,
                          rows: Sequence[tuple[str, int | None]]) -> dict[int, list[int]]:
    """Instruction index (in the first chain) -> the positions in `rows` of the plan rows it
    runs; `rows` are (placement, partition) in plan order."""
    calls = list(view.kernel_calls())
    kernels = [call.index for call in calls]
    delegates = {call.delegate_index: call.index for call in view.delegate_calls()}
    cpu = [position for position, (placement, _) in enumerate(rows) if placement != "npu"]
    if len(cpu) != len(kernels):
        planned = [call.index for call in calls if not is_view_copy(call.operator.name)]
        if len(cpu) != len(planned):
            raise InstructionMapError(f"{len(cpu)} CPU rows but {len(kernels)} kernel calls in "
                                      f"the program ({len(planned)} without view copies)")
        kernels = planned
    mapping: dict[int, list[int]] = {}
    for index, position in zip(kernels, cpu):
        mapping.setdefault(index, []).append(position)
    for position, (placement, partition) in enumerate(rows):
        if placement == "npu":
            if partition not in delegates:
                raise InstructionMapError(f"NPU partition {partition} has no delegate call")
            mapping.setdefault(delegates[partition], []).append(position)
    return mapping
