"""A plan a newcomer reads without a guide: the summary is computed from the rows the table
shows, names are never cut, and a reason every row shares is said once.

Before: DS-CNN U55-128 counted two layout rows inside NPU partitions as "hidden CPU work";
CPU-only DS-CNN showed "portable 0" beside two portable rows, "arena 20,464 B (incl. CMSIS-NN
scratch 20,608 B)", "(executorch + vela)" with no NPU, names cut to `aten_convo~n_default_1`,
and "not NPU: no NPU on this target" on all 16 rows.
"""

from __future__ import annotations

import re

import pytest

from tests.plan_checks import assert_summary_is_the_rows_added_up

TARGETS = [("corstone300", "ethos-u55-128", None), ("corstone300", "none", "cortex-m55"),
           ("corstone320", "ethos-u85-256", None)]


@pytest.fixture(scope="module", params=TARGETS, ids=["u55-128", "cpu-m55", "u85-256"])
def plan(request, compiles):
    from orchestrator.planning.planner import make_plan

    platform, npu, cpu = request.param
    compiled, _ = compiles.get("ds-cnn", platform, npu, cpu)
    return make_plan(compiled)


def test_the_summary_is_the_rows_added_up(plan):
    assert_summary_is_the_rows_added_up(plan)


def _node_cells(text: str) -> list[str]:
    """The node column of the op table, each cell's wrapped lines joined."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if re.match(r"\s*#\s+node\s+op\s", line))
    start, end = lines[header].index("node"), lines[header].index(" op ") + 1
    cells = []
    for line in lines[header + 2:]:
        if not line.strip():
            break
        part = line[start:end].strip()
        if line[:start].strip():  # a new row: its index is in the first column
            cells.append(part)
        elif cells:
            cells[-1] += part
    return cells


def test_no_name_is_cut_at_100_columns(plan):
    text = plan.to_text(width=100)
    assert "~" not in text
    assert _node_cells(text) == [row.name for row in plan.rows]
    assert max(len(line) for line in text.splitlines()) <= 100


def test_a_reason_every_cpu_row_shares_is_said_once(plan):
    text = plan.to_text()
    if plan.compiled.target.npu:
        return
    assert text.count("no NPU on this target") == 1
    assert "CPU rows: not NPU: no NPU on this target" in text


def test_the_clocks_and_their_source_are_stated(plan):
    second = plan.to_text().splitlines()[1:4]
    assert any(line.startswith("clocks: CPU ") for line in second)
    assert "platform YAML" in " ".join(second)


_TRAIN_MODE_CNN = '''
import torch
from torch import nn


def factory():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    model.train()  # forgotten .eval()
    return model, (torch.randn(1, 3, 16, 16),)
'''


def test_plan_notes_train_mode_and_folded_batchnorm_and_hints_int8_io(tmp_path, capsys):
    """Silent choices said aloud: a train-mode model switched to eval, BatchNorm folded (no
    row), and what --io int8 would save, with the figure; compile --io int8 prints the I/O
    scales and zero points the application needs."""
    import json

    from orchestrator.cli import main

    model = tmp_path / "cnn.py"
    model.write_text(_TRAIN_MODE_CNN)
    assert main(["plan", f"{model}:factory", "--npu", "none", "--quiet"]) == 0
    text = capsys.readouterr().out
    flat = " ".join(text.split())
    assert "note: the model was in train mode; it was switched to eval mode for export" in flat
    assert "note: 2 BatchNorm layer(s) were folded into the convolution or linear layer" in flat
    hint = flat.split("hint: ", 1)[1]
    assert hint.startswith("--io int8 would remove the 2 quantize/dequantize row(s)")
    assert "up to 2,316 B of fp32 I/O buffers" in hint  # (3*16*16 + 4) elements x 3 B
    pte = tmp_path / "cnn.pte"
    assert main(["compile", f"{model}:factory", "--npu", "none", "--io", "int8", "--quiet",
                 "-o", str(pte)]) == 0
    out = capsys.readouterr().out
    manifest = json.loads((tmp_path / "cnn.artifacts" / "manifest.json").read_text())
    io = manifest["io_quantization"]
    assert (f"input 0: int8, scale {io['input0_scale']:.9g}, zero point {io['input0_zp']}"
            in out)
    assert (f"output 0: int8, scale {io['output0_scale']:.9g}, zero point {io['output0_zp']}"
            in out)
    assert main(["plan", f"{model}:factory", "--npu", "none", "--io", "int8", "--quiet"]) == 0
    assert "hint: --io int8" not in capsys.readouterr().out
