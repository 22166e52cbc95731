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

from orchestrator.planning.instructions import InstructionMapError, instruction_positions

COLOURS = {"npu": "#2e7d32", "cmsis-nn": "#1565c0", "portable": "#ef6c00"}

# The plan's rows and the program's instructions do not line up (no overlay rather than a
# wrong one).
OverlayError = InstructionMapError


def instruction_rows(plan) -> tuple[str, dict[int, list]]:
    """(execution plan name, instruction index -> the plan rows it runs)."""
    view = plan.compiled.program_view
    positions = instruction_positions(view, [(r.placement, r.partition) for r in plan.rows])
    mapping = {index: [plan.rows[p] for p in rows] for index, rows in positions.items()}
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
