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


def test_the_api_verbs_survive_importing_their_modules():
    import orchestrator
    import orchestrator.api  # noqa: F401
    import orchestrator.planner  # noqa: F401
    import orchestrator.verification  # noqa: F401

    assert callable(orchestrator.plan) and callable(orchestrator.compile)
    assert callable(orchestrator.verify)
