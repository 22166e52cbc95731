"""`--precision auto`: on a regression trained here whose int8 program loses against float
(examples/skewed.py: log-normal targets), the search raises the fewest modules to a16w8, worst
per-layer error first, until the SNR budget holds on the validation set, and keeps that program;
a budget no raise meets is one line, exit 4."""

from __future__ import annotations

import json

import pytest

from orchestrator import api
from orchestrator.cli import io_quantization_lines, main
from orchestrator.errors import UserError
from tests.device_tools import passes_twin_host_runtime_and_qemu

MODEL = "examples/skewed.py:mlp"
FLOOR_DB = 35.0  # int8 reaches 24.0 dB here, the head raised 36.7 dB (U55-128)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    from examples.skewed import write_sets

    return write_sets(tmp_path_factory.mktemp("skewed"))


@pytest.fixture(scope="module")
def chosen(sets, tmp_path_factory):
    """`--precision auto --min-snr 35` on the U55-128: (the search, the written program)."""
    pte = tmp_path_factory.mktemp("auto") / "skewed.pte"
    found = api.precision_auto(MODEL, str(sets[1]), None, min_snr_db=FLOOR_DB,
                               npu="ethos-u55-128", calibration=str(sets[0]))
    written = api.write_program(found.plan, pte)
    return found, written


def test_int8_misses_the_budget_and_the_chosen_program_meets_it(chosen):
    found, _ = chosen
    first, last = found.steps[0], found.steps[found.chosen]
    assert first.raised == () and not first.within and first.snr_db < 26.0
    assert found.chosen >= 1 and len(last.raised) >= 1
    assert last.within and last.snr_db >= FLOOR_DB


def test_the_worst_layer_of_the_ranking_is_raised_first(chosen):
    found, _ = chosen
    why = found.steps[1].why
    assert found.steps[1].raised == ("head",)
    assert why.rank == 1 and why.share > 0.5


def test_the_pareto_table_has_one_row_per_step_with_its_figures(chosen):
    found, written = chosen
    table = found.render_text()
    rows = [line for line in table.splitlines() if line[:6].strip().isdigit()]
    assert len(rows) == len(found.steps)
    for step, row in zip(found.steps, rows):
        assert f"{step.snr_db:.1f}" in row and f"{step.pte_bytes:,}" in row
        assert f"{step.npu_mac_pct:.1f}%" in row and f"{step.latency_seconds * 1e3:.3f}ms" in row
        assert step.latency_seconds > 0 and step.pte_bytes > 0 and step.arena_bytes > 0
    assert "<- chosen" in rows[found.chosen]
    assert "cost model's estimate" in table and "head -> a16w8" in table
    # the int16 head costs flash (its int16 output and int32 bias), never NPU coverage
    assert found.steps[-1].pte_bytes > found.steps[0].pte_bytes
    assert found.steps[-1].npu_mac_pct == found.steps[0].npu_mac_pct == 100.0
    assert written.plan is found.plan and len(written.pte.read_bytes()) == \
        found.steps[found.chosen].pte_bytes


def test_the_chosen_program_returns_the_heads_int16_result(chosen):
    """The head computes the model output: the program's last requantize is not to int8."""
    found, _ = chosen
    head = [r for r in found.plan.rows if r.module == "head" and r.kind == "op"]
    assert head and all(r.precision == "a16w8" for r in head)
    assert all("int8" not in r.dtypes.partition("->")[2] for r in head)


def test_the_chosen_program_passes_the_twin_the_host_runtime_and_qemu(chosen):
    _, written = chosen
    passes_twin_host_runtime_and_qemu(written.pte, samples=2)


def test_the_device_methods_measure_the_searchs_snr_on_the_validation_set(chosen, sets):
    """The search measured the quantized reference; the twin and the host runtime (every
    output byte-equal to the twin's) compute the same figure on all 512 samples."""
    found, written = chosen
    report = api.evaluate(written.pte, str(sets[1]), labels=None, method="both",
                          qemu_samples=0)
    by = {m.method: m for m in report.methods}
    claimed = found.steps[found.chosen].snr_db
    assert by["quantized reference"].snr_db == pytest.approx(claimed, abs=1e-3)
    for method in ("twin", "host runtime"):
        assert by[method].samples == 512
        assert by[method].snr_db == pytest.approx(claimed, abs=0.1) and \
            by[method].snr_db >= FLOOR_DB


def test_a_budget_no_raise_meets_is_one_line_exit_4(sets, tmp_path, capsys):
    code = main(["plan", MODEL, "--npu", "ethos-u55-128", "--calibration", str(sets[0]),
                 "--precision", "auto", "--dataset", str(sets[1]), "--labels", "none",
                 "--min-snr", "90", "--quiet"])
    err = capsys.readouterr().err
    assert code == 4
    assert "no program meets SNR >= 90 dB: with every ranked module a16w8" in err


def test_a_budget_without_precision_auto_is_refused():
    assert main(["plan", MODEL, "--min-snr", "30", "--quiet"]) == 2


def test_precision_auto_without_a_budget_says_so(sets):
    with pytest.raises(UserError, match="needs a budget"):
        api.precision_auto(MODEL, str(sets[1]), None, npu="ethos-u55-128")


def test_the_plan_names_the_model_outputs_width(chosen):
    found, _ = chosen
    text = " ".join(found.plan.to_text(width=100).split())
    assert "precision (head=a16w8): ops a16w8 1, a8w8 4; int8<->int16 requantizes: " in text
    assert "model output 0: int16" in text


def test_an_int16_program_output_is_named_int16_with_its_range():
    lines = io_quantization_lines({"input0_scale": 0.03, "input0_zp": 6,
                                   "output0_scale": 0.0087, "output0_zp": 0,
                                   "output0_quant_min": -32767, "output0_quant_max": 32767})
    assert lines[0].startswith("input 0: int8, scale 0.03, zero point 6")
    assert lines[1].startswith("output 0: int16, scale 0.0087, zero point 0")


def test_a_labelled_budget_int8_already_meets_keeps_int8(tmp_path):
    """The digits CNN loses no top-1 at int8 (89.7% against the float model's 89.4%): a
    1-point budget is met by step 0, and nothing is raised."""
    from examples.digits import write_sets

    calibration, validation = write_sets(tmp_path)
    found = api.precision_auto("examples/digits.py:cnn", str(validation), "labels",
                               max_accuracy_drop=1.0, npu="ethos-u55-128",
                               calibration=str(calibration))
    (only,) = found.steps
    assert found.chosen == 0 and only.raised == () and found.precision == ""
    assert found.float_top1 == pytest.approx(89.44, abs=0.01)
    assert only.top1 == pytest.approx(89.72, abs=0.01)
    assert "top-1 drop <= 1 points" in found.render_text()


def test_plan_json_carries_the_search_and_the_chosen_programs_plan(sets, capsys):
    code = main(["plan", MODEL, "--npu", "ethos-u55-128", "--calibration", str(sets[0]),
                 "--precision", "auto", "--dataset", str(sets[1]), "--labels", "none",
                 "--min-snr", str(FLOOR_DB), "--format", "json", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    document = json.loads(out[out.index("{"):])
    search = document["precision_search"]
    assert search["measured_by"] == "quantized reference" and search["chosen"] == 1
    assert [s["a16w8"] for s in search["steps"]] == [[], ["head"]]
    assert [s["within_budget"] for s in search["steps"]] == [False, True]
    assert search["steps"][1]["why"]["rank"] == 1
    assert document["calibration"]["precision"] in ({"head": "a16w8"}, [["head", "a16w8"]])


def test_precision_auto_on_a_sweep_is_refused_in_one_line(capsys):
    assert main(["sweep", MODEL, "--npus", "ethos-u55-128", "--precision", "auto",
                 "--quiet"]) == 2
    assert "--precision auto searches one program under a budget" in capsys.readouterr().err
