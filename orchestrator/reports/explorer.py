"""A Model Explorer overlay: the plan as node data for the `.pte` graph Model Explorer shows.

Model Explorer (`ai-edge-model-explorer`) with Arm's PTE adapter (`pte-adapter-model-explorer`)
draws one node per instruction of the program, with the id `<plan name>_<chain>_<instruction>`
(its builder/builder.py). Node data is `{graph id: {"results": {node id: {"value": number,
"bgColor": css}}}}` (its node_data_builder.py). Here each instruction's value is its estimated
time in microseconds (the sum of the plan rows it runs: an Ethos-U delegate call carries every
row of its partition and its invocation) and its colour its placement. Node data holds numbers
only, so the reasons stay in the plan (report.html, plan.json).
"""

from __future__ import annotations

import json

COLOURS = {"npu": "#2e7d32", "cmsis-nn": "#1565c0", "portable": "#ef6c00"}


class OverlayError(RuntimeError):
    """The plan's rows and the program's instructions do not line up."""


def instruction_rows(plan) -> tuple[str, dict[int, list]]:
    """(execution plan name, instruction index -> the plan rows it runs)."""
    view = plan.compiled.program_view
    kernels = [call.index for call in view.kernel_calls()]
    delegates = {call.delegate_index: call.index for call in view.delegate_calls()}
    cpu_rows = [r for r in plan.rows if r.placement != "npu"]
    if len(cpu_rows) != len(kernels):
        raise OverlayError(f"{len(cpu_rows)} CPU rows but {len(kernels)} kernel calls in the "
                           "program")
    mapping: dict[int, list] = {}
    for index, row in zip(kernels, cpu_rows):
        mapping.setdefault(index, []).append(row)
    for row in plan.rows:
        if row.placement == "npu":
            if row.partition not in delegates:
                raise OverlayError(f"NPU partition {row.partition} has no delegate call")
            mapping.setdefault(delegates[row.partition], []).append(row)
    return view.name or "ExecutionPlan_0", mapping


def node_data(plan) -> dict:
    graph, mapping = instruction_rows(plan)
    results = {}
    for index, rows in sorted(mapping.items()):
        seconds = sum(r.cost.seconds for r in rows if r.cost is not None)
        placement = "npu" if any(r.placement == "npu" for r in rows) else rows[0].placement
        results[f"{graph}_0_{index}"] = {"value": round(seconds * 1e6, 3),
                                         "bgColor": COLOURS[placement]}
    return {graph: {"results": results}}


def render_node_data(plan) -> str:
    return json.dumps(node_data(plan), indent=2)
