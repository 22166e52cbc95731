"""The CLI is a shell over the Python API: every command is an API function, and the CLI reaches
the rooms that compile, verify, run device code or build firmware only through it."""

from __future__ import annotations

import ast
import os
import pydoc
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLI_MODULES = ("orchestrator/cli.py", "orchestrator/cli_parser.py")
# The rooms below the API: the CLI names none of them, even inside a function.
BELOW_THE_API = ("orchestrator.device_runs", "orchestrator.firmware", "orchestrator.verification",
                 "orchestrator.compilation")
# Each command and the API function it calls.
API_OF_COMMAND = {"plan": "plan", "compile": "compile", "sweep": "sweep",
                  "calibrate": "calibrate", "verify": "verify_all", "size": "size",
                  "firmware": "firmware_project", "reasons": "reasons", "cache": "cache", "list": "known",
                  "sources": "source_trees", "doctor": "doctor", "compare": "compare"}


def _imported(path: Path) -> set[str]:
    """Every module an import statement anywhere in the file names (top, functions, TYPE_CHECKING)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_cli_imports_no_room_below_the_api():
    wrong = [f"{module} imports {name}" for module in CLI_MODULES
             for name in sorted(_imported(ROOT / module))
             if name.startswith(BELOW_THE_API)]
    assert wrong == []


def test_an_import_inside_a_function_is_seen(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from orchestrator.firmware import make_firmware\n")
    assert "orchestrator.firmware" in _imported(module)


def test_every_command_is_an_api_function_listed_by_help():
    import orchestrator
    from orchestrator import api
    from orchestrator.cli_parser import VERBS

    assert {verb.name for verb in VERBS} == set(API_OF_COMMAND)
    text = pydoc.render_doc(orchestrator, renderer=pydoc.plaintext)
    for command, function in API_OF_COMMAND.items():
        assert function in orchestrator.__all__, command
        assert getattr(orchestrator, function) is getattr(api, function)
        assert f"    {function}(" in text, f"help(orchestrator) does not list {function}"


def test_every_file_of_the_shell_and_the_api_stays_readable():
    lengths = {name: len((ROOT / name).read_text().splitlines())
               for name in (*CLI_MODULES, "orchestrator/api.py", "orchestrator/results.py")}
    assert {name: n for name, n in lengths.items() if n > 800} == {}


def _result(name: str, outcome: str):
    from orchestrator.verification.methods import MethodResult

    return MethodResult(name, outcome, f"{name} {outcome}", name != "twin")


@pytest.mark.parametrize("outcomes, error", [
    (("passed", "passed"), None),
    (("failed", "passed"), "VerificationFailure: twin failed"),
    (("failed", "partial"), "VerificationFailure: twin failed"),
    (("passed", "partial"), "NotRun: not checked in full: host runtime partial"),
    (("inconclusive",), "NotRun: not run meaningfully: twin inconclusive"),
    (("passed", "not-run"), "NotRun: not run: host runtime not-run"),
])
def test_named_methods_give_the_exit_the_cli_always_gave(outcomes, error):
    from orchestrator.results import Verification

    results = tuple(_result(name, outcome) for name, outcome in zip(("twin", "host runtime"),
                                                                     outcomes))
    found = Verification(Path("x.pte"), "both", results).error()
    assert (None if found is None else f"{type(found).__name__}: {found}") == error


def test_a_method_asked_for_by_name_that_cannot_run_says_nothing_ran():
    from orchestrator.errors import NotRun
    from orchestrator.results import Verification

    found = Verification(Path("x.pte"), "qemu", (_result("QEMU Cortex-M55", "not-run"),)).error()
    assert isinstance(found, NotRun) and "nothing was run" in str(found)


def test_a_package_of_another_distribution_shadowing_ours_is_named_in_one_line(tmp_path):
    """The wheel installs top-level packages with common names (`platforms`, `kernels`, ...):
    one of another distribution earlier on the path is named, before anything imports it (it
    was `No module named 'kernels.cache_root'`, or worse, the wrong code)."""
    (tmp_path / "platforms").mkdir()
    (tmp_path / "platforms" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    script = Path(sys.executable).parent / "orchestrate"
    if not script.is_file():
        pytest.skip("not run: no `orchestrate` script beside this interpreter")
    done = subprocess.run([str(script), "--help"], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "package 'platforms'" in lines[0] and str(tmp_path / "platforms") in lines[0]
    imported = subprocess.run([sys.executable, "-c", "import orchestrator"], env=env,
                              capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert imported.returncode != 0 and "ImportError: orchestrate's package 'platforms'" \
        in imported.stderr
