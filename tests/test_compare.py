"""`orchestrate compare`: our program and the incumbent's (vela + TensorFlow Lite Micro) on the
same target and QEMU machine. One model and one target here (MLPerf Tiny's keyword spotter on the
Ethos-U55-128, both sides executed: Vela puts the file's SOFTMAX on the NPU as about twenty
operations, a LUT exponent, shifts, CLZ and 32-bit multiplies, which the functional model
executes); the full matrix is benchmarks/compare_incumbent.py."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.device_tools import qemu_or_missing

MLPERF = Path(__file__).resolve().parents[2] / "shared" / "models" / "mlperf-tiny"


def _file(name: str) -> Path:
    path = MLPERF / name
    if not path.is_file():
        pytest.skip(f"not run: MLPerf Tiny's {name} is not at {MLPERF}")
    return path


@pytest.fixture(scope="module")
def keyword_spotter_on_u55(tmp_path_factory):
    qemu_or_missing()
    folder = tmp_path_factory.mktemp("compare")
    report = folder / "compare.html"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["compare", str(_file("kws_ref_model.tflite")), "--npu", "ethos-u55-128",
                     "--samples", "4", "--format", "json", "-o", str(report), "--quiet"])
    return code, printed.getvalue(), report


def test_both_sides_run_on_qemu_and_compute_the_same_bytes(keyword_spotter_on_u55):
    code, printed, report = keyword_spotter_on_u55
    assert code == 0, printed
    data = json.loads(printed)
    figures = {f["figure"]: f for f in data["figures"]}
    # the incumbent's column reproduces Vela's figures for the file (the models' README)
    assert figures["cycles_npu"]["incumbent"] == 88_889
    assert figures["cycles_total"]["incumbent"] == 89_708
    assert figures["NPU partitions"]["ours"] == figures["NPU partitions"]["incumbent"] == 1
    # ours no slower on the NPU (docs/benchmarks.md#against-the-incumbent-on-the-npu)
    assert figures["cycles_npu"]["ours"] <= figures["cycles_npu"]["incumbent"]
    # both executed on the same QEMU machine: instructions and arenas measured on each side
    for name in ("CPU instructions per inference", "tensor arena bytes"):
        assert figures[name]["ours"] > 0 and figures[name]["incumbent"] > 0, figures[name]
    assert "TensorFlow Lite Micro" in data["incumbent"] and "Ethos-U55" in data["incumbent"]
    # 4 inputs x 12 int8 scores, equal byte for byte: our CMSIS-NN softmax and Vela's NPU one
    assert data["numerics"]["values"] == 48 and data["numerics"]["differing"] == 0, data
    page = report.read_text()
    assert "<table>" in page and "cycles_npu" in page


def test_a_float_file_is_refused_in_one_line(capsys, tmp_path):
    code = main(["compare", str(_file("ad01_fp32.tflite")), "--npu", "ethos-u55-128",
                 "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "float model" in err[0], err


def test_a_report_name_without_json_or_html_is_refused_before_any_work(capsys, tmp_path):
    code = main(["compare", str(_file("ad01_int8.tflite")), "-o", str(tmp_path / "r.txt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and ".json or .html" in err[0], err
    assert not (tmp_path / "r.txt").exists()


@pytest.mark.release_images  # opt-in: builds TFLM's and our release images from source (~5 min)
def test_release_images_weighed_from_their_linker_maps(tmp_path):
    """compare --firmware: both sides' release images (ours `firmware --profile release`, TFLM
    and the file linked the same way), weighed from their maps and run on QEMU (CPU-only)."""
    qemu_or_missing()
    tflite = _file("ad01_int8.tflite")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["compare", str(tflite), "--npu", "none", "--cpu", "cortex-m55",
                     "--samples", "1", "--firmware", "--format", "json", "--quiet",
                     "--work", str(tmp_path)])
    assert code == 0, printed.getvalue()
    data = json.loads(printed.getvalue())
    figures = {f["figure"]: f for f in data["figures"]}
    flash, code_bytes = figures["release flash bytes"], figures["release code bytes (flash less the model)"]
    files = figures["model file bytes"]
    for side in ("ours", "incumbent"):
        # the map holds the whole model: the .pte and the .tflite, byte for byte of the files
        assert flash[side] - code_bytes[side] == files[side], (side, flash, code_bytes, files)
        assert code_bytes[side] > 10_000, code_bytes  # a runtime, kernels, libc: not nothing
    # TFLM's arena is a static buffer, the smallest TFLM allocates the model in: on this file
    # more than the arena_used_bytes() it reports (its planner's scratch), and in the RAM figure
    ram, arena = figures["release RAM bytes (without the stack)"], figures["tensor arena bytes"]
    static = int(re.search(r"the tensor arena ([\d,]+) B", ram["source"])[1].replace(",", ""))
    assert static > arena["incumbent"] and ram["incumbent"] >= static, (ram, arena)
    # both images ran on QEMU: exit code 0 and a painted stack's high-water mark
    stack = figures["release stack high-water bytes"]
    assert 0 < stack["ours"] < 65_536 and 0 < stack["incumbent"] < 65_536, stack
    assert stack["source"].count("exit code 0") == 2, stack
    notes = " ".join(data["notes"])
    assert "model (.tflite)" in notes and "TFLM interpreter" in notes and "runtime core" in notes


def test_a_table_across_targets_marks_where_we_lose():
    """compare --npus: one row per target, each figure ours / incumbent with its ratio, a
    figure where we lose marked; a figure no target has is left out."""
    from orchestrator.comparison.compare import Comparison, Figure, Numerics, comparison_table

    def made(target, ours, incumbent, differing):
        figures = (Figure("CPU instructions per inference", ours, incumbent, "QEMU"),
                   Figure("model file bytes", 900, 1000, "file sizes", " B"))
        return Comparison("kws.tflite", target, "QEMU", "ours", "TFLM", figures,
                          Numerics(2, 24, differing, 0, None))

    table = comparison_table([made("corstone300 + no NPU (cortex-m4)", 110, 100, 0),
                              made("corstone300 + no NPU (cortex-m55)", 90, 100, 3)])
    rows = table.splitlines()
    assert "instructions ours/inc" in rows[1] and "cycles_npu" not in rows[1]
    m4 = next(r for r in rows if "cortex-m4" in r)
    m55 = next(r for r in rows if "cortex-m55" in r)
    assert "110 / 100" in m4 and "1.100!" in m4 and m4.endswith("equal")
    assert "0.900" in m55 and "0.900!" not in m55 and m55.endswith("3 differ")


def test_npu_and_npus_together_are_refused_in_one_line(capsys):
    code = main(["compare", str(_file("kws_ref_model.tflite")), "--npu", "ethos-u55-128",
                 "--npus", "ethos-u55-128,none"])
    assert code == 2
    assert "--npu and --npus" in capsys.readouterr().err
