"""A Model Explorer overlay: the plan as node data for the `.pte` graph Model Explorer shows.

Model Explorer (`ai-edge-model-explorer`) with Arm's PTE adapter (`pte-adapter-model-explorer`)
draws one node per instruction of the program, with the id `<plan name>_<chain>_<instruction>`
(its builder/builder.py). Node data is `{graph id: {"results": {node id: {"value": number,
"bgColor": css}}}}` (its node_data_builder.py). Here each instruction's value is its estimated
time in microseconds (the sum of the plan rows it runs: an Ethos-U delegate call carries every
row of its partition and its invocation) and its colour its placement. Node data holds numbers
only, so the reasons stay in the plan (report.html, plan.json).

`verify --per-layer-error --model-explorer FILE` writes the same nodes with measured figures
instead (`layer_error_node_data`): each instruction's value is the worst "alone" SNR (dB) of
the layers its rows belong to (orchestrator/reports/layer_error_overlay.py), its colour that
SNR's band; an instruction none of whose rows has a layer, or whose layers are all exact, has
no entry.
"""

from __future__ import annotations

import json

from orchestrator.planning.instructions import InstructionMapError, instruction_positions
from orchestrator.reports.layer_error_overlay import row_layers, snr_colour

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


def layer_error_node_data(view, ops: list[dict], report: dict) -> dict:
    """Node data of a per-layer error report (LayerErrorReport.to_json()) over the program's
    instructions (`view`: kernels.program_view.ProgramView; `ops`: plan.json's ops)."""
    positions = instruction_positions(view, [(op["placement"], op["partition"]) for op in ops])
    layers = row_layers(ops, report)
    graph = view.name or "ExecutionPlan_0"
    results = {}
    for index, rows in sorted(positions.items()):
        measured = [layers[r]["alone_snr_db"] for r in rows
                    if r in layers and layers[r]["alone_snr_db"] is not None]
        if measured:
            worst = min(measured)
            results[f"{graph}_0_{index}"] = {"value": round(worst, 2),
                                             "bgColor": snr_colour(worst)}
    return {graph: {"results": results}}
