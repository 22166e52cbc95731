"""Which plan rows each instruction of the program runs: the one mapping from a plan to a `.pte`.

The program's kernel calls are the plan's CPU rows in execution order, one each; an Ethos-U
delegate call runs every row of its NPU partition (the partition's ops and its invocation).
The Model Explorer overlay (orchestrator/reports/explorer.py) and the measured profile
(orchestrator/planning/measured.py) both read it. Rows are anything with a `placement` and a
`partition`, given as (placement, partition) pairs so a Plan's rows and plan.json's ops map the
same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernels.program_view import ProgramView


class InstructionMapError(RuntimeError):
    """The plan's rows and the program's instructions do not line up."""


def instruction_positions(view: ProgramView,
                          rows: Sequence[tuple[str, int | None]]) -> dict[int, list[int]]:
    """Instruction index (in the first chain) -> the positions in `rows` of the plan rows it
    runs; `rows` are (placement, partition) in plan order."""
    kernels = [call.index for call in view.kernel_calls()]
    delegates = {call.delegate_index: call.index for call in view.delegate_calls()}
    cpu = [position for position, (placement, _) in enumerate(rows) if placement != "npu"]
    if len(cpu) != len(kernels):
        raise InstructionMapError(f"{len(cpu)} CPU rows but {len(kernels)} kernel calls in the "
                                  "program")
    mapping: dict[int, list[int]] = {}
    for index, position in zip(kernels, cpu):
        mapping.setdefault(index, []).append(position)
    for position, (placement, partition) in enumerate(rows):
        if placement == "npu":
            if partition not in delegates:
                raise InstructionMapError(f"NPU partition {partition} has no delegate call")
            mapping.setdefault(delegates[partition], []).append(position)
    return mapping
