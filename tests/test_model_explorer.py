"""The Model Explorer overlay lines up with the nodes Arm's PTE adapter draws for the .pte."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.device_tools import missing

_ADAPTER_NODES = """
import json, sys
from pte_adapter_model_explorer.main import PTEAdapter
graphs = PTEAdapter().convert(sys.argv[1], {})["graphCollections"]
print(json.dumps({g.id: [n.id for n in g.nodes] for c in graphs[:1] for g in c.graphs}))
"""


def _explorer_python() -> str | None:
    """A Python with pte-adapter-model-explorer (ORCHESTRATE_MODEL_EXPLORER_PYTHON; CI makes one:
    the adapter needs a newer flatbuffers than ExecuTorch's, so it lives in its own venv)."""
    candidate = os.environ.get("ORCHESTRATE_MODEL_EXPLORER_PYTHON")
    return candidate if candidate and shutil.which(candidate) else None


@pytest.fixture(scope="module")
def mixed_u55(compiles):
    from orchestrator.planning.planner import make_plan

    compiled, pte = compiles.get("mixed", "corstone300", "ethos-u55-128", write=True)
    return make_plan(compiled), pte


def test_every_instruction_gets_its_rows_time_and_placement_colour(mixed_u55):
    from orchestrator.reports.explorer import COLOURS, node_data

    plan, _ = mixed_u55
    (graph, data), = node_data(plan).items()
    results = data["results"]
    assert graph == "forward" and len(results) == 13  # mixed on U55: 13 instructions
    total_us = sum(r.cost.seconds for r in plan.rows if r.cost) * 1e6
    assert abs(sum(v["value"] for v in results.values()) - total_us) < 0.01
    delegates = [k for k, v in results.items() if v["bgColor"] == COLOURS["npu"]]
    assert delegates == ["forward_0_1", "forward_0_3", "forward_0_11"]
    assert results["forward_0_2"]["bgColor"] == COLOURS["cmsis-nn"]  # the stride-4 conv
    assert results["forward_0_5"]["bgColor"] == COLOURS["portable"]  # where


def test_compile_writes_the_overlay_beside_the_pte(mixed_u55):
    _, pte = mixed_u55
    overlay = json.loads((pte.with_name(pte.stem + ".artifacts") / "model_explorer.json").read_text())
    assert set(overlay) == {"forward"}


def test_overlay_keys_are_the_node_ids_of_the_pte_adapter(mixed_u55):
    python = _explorer_python()
    if python is None:
        missing("no pte-adapter-model-explorer (set ORCHESTRATE_MODEL_EXPLORER_PYTHON)")
    from orchestrator.reports.explorer import node_data

    plan, pte = mixed_u55
    shown = json.loads(subprocess.run([python, "-c", _ADAPTER_NODES, str(pte)], check=True,
                                      capture_output=True, text=True, timeout=300).stdout)
    overlay = node_data(plan)
    assert set(overlay) == set(shown)
    instruction_nodes = {n for n in shown["forward"] if n not in ("GraphInputs", "GraphOutputs")}
    assert set(overlay["forward"]["results"]) == instruction_nodes
