"""`orchestrate compare`: our program and the incumbent's (vela + TensorFlow Lite Micro) on the
same target and QEMU machine. One model and one target here (MLPerf Tiny's keyword spotter on the
Ethos-U55-128, both sides executed: Vela puts the file's SOFTMAX on the NPU as about twenty
operations, a LUT exponent, shifts, CLZ and 32-bit multiplies, which the functional model
executes); the full matrix is benchmarks/compare_incumbent.py."""

from __future__ import annotations

import contextlib
import io
import json
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
