"""The README's Python API example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_python_api_example_runs(tmp_path, monkeypatch, capsys):
    section = README.read_text().split("## Python API", 1)[1]
    (example,) = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert re.search(r"\d+ NPU partition\(s\), NPU MAC coverage \d+\.\d%", out)
    assert (tmp_path / "ds_cnn.pte").is_file()
    assert {"plan.json", "operators.txt", "manifest.json"} <= {
        p.name for p in (tmp_path / "ds_cnn.artifacts").iterdir()}


def test_the_api_verbs_stay_functions_after_every_room_is_imported():
    """A room named like a verb (`orchestrator/plan/`) would replace `orchestrator.plan` with a
    module as soon as anything imported it: the rooms have other names."""
    import importlib

    import orchestrator
    from orchestrator import api

    rooms = [p.parent.name for p in Path(orchestrator.__file__).parent.glob("*/__init__.py")]
    assert {"compilation", "planning", "reports", "artifacts", "verification",
            "device_runs"} <= set(rooms)
    for room in rooms:
        importlib.import_module(f"orchestrator.{room}")
    verbs = [name for name in orchestrator.__all__ if callable(getattr(api, name))]
    assert len(verbs) >= 20  # every command's function (`firmware` is `firmware_project`)
    assert [getattr(orchestrator, v) for v in verbs] == [getattr(api, v) for v in verbs]


def test_a_request_and_keyword_options_plan_the_same_program():
    import orchestrator
    from orchestrator.request import Request

    by_keywords = orchestrator.plan("mixed", npu="ethos-u55-64")
    by_request = orchestrator.plan(Request("mixed", npu="ethos-u55-64"))
    assert by_request.compiled.pte_bytes == by_keywords.compiled.pte_bytes
    assert [(r.name, r.placement) for r in by_request.rows] == [(r.name, r.placement)
                                                            for r in by_keywords.rows]


def test_a_request_is_checked_before_its_model_is_loaded():
    """One validation for every verb: a bad placement, NPU or memory policy is named before the
    model is looked at (the model here does not exist)."""
    import pytest

    import orchestrator
    from orchestrator.errors import UserError
    from orchestrator.request import Request

    for options, needle in (({"placement": "fast"}, "--placement 'fast'"),
                            ({"npu": "ethos-u99-1"}, "ethos-u99-1"),
                            ({"memory_policy": "no-such.yaml"}, "no-such.yaml")):
        with pytest.raises(UserError, match=needle):
            orchestrator.plan(Request("no-such-model.py", **options))
    with pytest.raises(TypeError, match="not both"):
        orchestrator.plan(Request("ds-cnn"), npu="none")


def test_a_sweep_refuses_a_bad_request_before_compiling_any(monkeypatch):
    """Each request resolved and each model loaded before the first compile: the first job is
    good, and nothing compiles."""
    import pytest

    import orchestrator
    from orchestrator.errors import UserError
    from orchestrator.request import Request
    from orchestrator.sweeps import local

    def no_compile(*_):
        raise AssertionError("compiled before every request was checked")

    monkeypatch.setattr(local, "sweep_jobs", no_compile)
    for requests, needle in (([Request("mixed", npu="none"), "no-such-model"], "no-such-model"),
                             ([Request("mixed", npu="none"), Request("mixed", npu="ethos-u99-1")],
                              "ethos-u99-1"),
                             ([Request("mixed", placement="cost")], "sweep plans greedily")):
        with pytest.raises(UserError, match=needle):
            orchestrator.sweep(requests)


def test_size_accounts_for_every_byte_of_a_compiled_program_and_refuses_other_files(compiles,
                                                                                   tmp_path):
    import pytest

    import orchestrator
    from orchestrator.errors import UserError

    _, pte = compiles.get("ds-cnn", npu="none", write=True)
    report = orchestrator.size(pte)
    assert report.total_bytes == pte.stat().st_size
    assert report.constant_bytes_live + report.constant_bytes_dead > 20_000  # DS-CNN's weights
    (tmp_path / "notes.pte").write_text("not a program")
    with pytest.raises(UserError, match="is not an ExecuTorch program"):
        orchestrator.size(tmp_path / "notes.pte")
