"""Each exit code the README promises, through the CLI: the five plan gates (3), an internal
error (1, one line, no traceback) and a compile whose disk fills part-way (2: one line naming
the file, nothing half-written).

The plans come from the session's compiles: `orchestrator.api.plan` is the one request path of
the CLI, so handing it a computed plan tests everything the CLI does with it."""

from __future__ import annotations

import dataclasses
import os

import pytest

from orchestrator import api
from orchestrator.cli import main
from orchestrator.planning.planner import make_plan


@pytest.fixture(scope="module")
def mixed(compiles):
    """mixed on U55-128: 3 NPU partitions, NPU MAC coverage between 50 and 90 %."""
    return make_plan(compiles.get("mixed", "corstone300", "ethos-u55-128")[0])


def _serve(monkeypatch, plan, requests=None):
    def planned(request, progress=None, **options):
        if requests is not None:
            requests.append(request)
        return plan
    monkeypatch.setattr(api, "plan", planned)


def _too_small(plan):
    """The same compile planned against a platform whose memories are 1 KiB each."""
    target = plan.compiled.target
    tiny = tuple(dataclasses.replace(m, size_bytes=1024) for m in target.platform.memories)
    platform = dataclasses.replace(target.platform, memories=tiny)
    compiled = dataclasses.replace(plan.compiled,
                                   target=dataclasses.replace(target, platform=platform))
    return make_plan(compiled)


def _upstream_view(plan):
    """The plan with an op the runner does not register (aten::topk) reported missing."""
    have = {"cortex_m::quantize_per_tensor.out", "cortex_m::dequantize_per_tensor.out"}
    return make_plan(plan.compiled, runner_ops=have)


GATES = [
    (["--fail-under-npu-coverage", "95"], "--fail-under-npu-coverage", None),
    (["--max-partitions", "1"], "--max-partitions: 3 NPU partitions > 1", None),
    (["--require-fit"], "--require-fit", _too_small),
]


@pytest.mark.parametrize("options,needle,variant", GATES, ids=[g[1].split(":")[0] for g in GATES])
def test_each_plan_gate_fails_the_cli_with_exit_3_naming_it(mixed, monkeypatch, capsys, options,
                                                            needle, variant):
    _serve(monkeypatch, variant(mixed) if variant else mixed)
    assert main(["plan", "mixed", "--npu", "ethos-u55-128", "--quiet", *options]) == 3
    err = capsys.readouterr().err
    assert err.startswith("orchestrate: gate failed") and needle in err


def test_the_runner_ops_gate_reads_the_file_and_fails_with_exit_3(mixed, monkeypatch, capsys,
                                                                  tmp_path):
    ops = tmp_path / "ops.txt"
    ops.write_text("cortex_m::quantize_per_tensor.out\ncortex_m::dequantize_per_tensor.out\n")
    requests = []
    _serve(monkeypatch, _upstream_view(mixed), requests)
    assert main(["plan", "mixed", "--npu", "ethos-u55-128", "--quiet", "--runner-ops",
                 str(ops)]) == 3
    assert requests[0].runner_ops == frozenset(ops.read_text().split())
    assert "aten::topk.values" in capsys.readouterr().err


def test_the_runnable_gate_fails_with_exit_3_on_a_device_fault(compiles, monkeypatch, capsys):
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    model = load_model("mixed")
    upstream = make_plan(compile_model(model, load_calibration(None, model.example_inputs),
                                       resolve_target("corstone300", npu="ethos-u55-128"),
                                       legalize=False))
    assert upstream.summary.device_faults
    _serve(monkeypatch, upstream)
    assert main(["plan", "mixed", "--npu", "ethos-u55-128", "--quiet",
                 "--require-runnable"]) == 3
    assert "--require-runnable" in capsys.readouterr().err


def test_passing_gates_exit_0_and_print_the_plan(mixed, monkeypatch, capsys):
    _serve(monkeypatch, mixed)
    assert main(["plan", "mixed", "--npu", "ethos-u55-128", "--quiet",
                 "--fail-under-npu-coverage", "10", "--max-partitions", "3"]) == 0
    assert "NPU MAC coverage" in capsys.readouterr().out


def test_an_internal_error_is_exit_1_in_one_line_without_a_traceback(monkeypatch, capsys):
    def broken(request, progress=None, **options):
        raise RuntimeError("stage exploded")
    monkeypatch.setattr(api, "plan", broken)
    monkeypatch.delenv("ORCHESTRATE_DEBUG", raising=False)
    assert main(["plan", "mixed", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "stage exploded" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_compile_failing_while_writing_leaves_nothing_half_written(mixed, monkeypatch, capsys,
                                                                     tmp_path):
    """The failure is injected after the artifacts folder is complete and the .pte is staged:
    neither the .pte, nor its artifacts folder, nor a temporary file is left, and an earlier
    pair at that path is kept as it was."""
    from orchestrator.artifacts import outputs

    _serve(monkeypatch, mixed)
    pte = tmp_path / "out.pte"
    assert main(["compile", "mixed", "--npu", "ethos-u55-128", "--quiet", "-o", str(pte)]) == 0
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    def fail_on_rename(tmp, final):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(outputs, "_atomic_replace_dir", fail_on_rename)
    assert main(["compile", "mixed", "--npu", "ethos-u55-128", "--quiet", "-o", str(pte)]) == 2
    after = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"orchestrate: error: cannot write {pte}: No space left on device; nothing was "
                   "written (earlier outputs are as they were); free space or choose another path")


def test_the_command_ends_without_interpreter_teardown_yet_keeps_its_exit_code_and_output(
        tmp_path):
    """`orchestrate` (orchestrator.cli:entry) ends with os._exit after the exit handlers: its
    piped stdout still arrives whole, a user error still exits 2 with its one line, and a
    compile's temporary folders are gone (the handlers that remove them ran)."""
    import json
    import subprocess
    import sys

    listed = subprocess.run([sys.executable, "-m", "orchestrator.cli", "list", "--format", "json"],
                            capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0
    assert {m["name"] for m in json.loads(listed.stdout)["models"]} >= {"ds-cnn", "resnet8"}
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    compiled = subprocess.run([sys.executable, "-m", "orchestrator.cli", "compile", "mixed",
                               "--npu", "none", "-o", str(tmp_path / "m.pte"), "--quiet"],
                              capture_output=True, text=True, timeout=600, env=env)
    assert compiled.returncode == 0, compiled.stderr[-500:]
    assert (tmp_path / "m.pte").stat().st_size > 0
    assert list(scratch.iterdir()) == []
    refused = subprocess.run([sys.executable, "-m", "orchestrator.cli", "compile",
                              str(tmp_path / "nosuch.py") + ":x", "-o", str(tmp_path / "x.pte")],
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"orchestrate: error: model file not found: {tmp_path / 'nosuch.py'}; check the path"]


def test_compile_warns_when_the_program_does_not_fit_and_require_fit_refuses(
        mixed, monkeypatch, capsys, tmp_path):
    """A program the plan says does not fit is written with a warning naming what does not fit
    (it used to exit 0 saying nothing) and verify fails it; `compile --require-fit` exits 3 and
    writes nothing."""
    _serve(monkeypatch, _too_small(mixed))
    out = tmp_path / "m.pte"
    assert main(["compile", "mixed", "--npu", "ethos-u55-128", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: the program does not fit corstone300's memories" in err and " B -> " in err
    # verify fails it (it passed, with QEMU "not run"), naming what does not fit
    from orchestrator.device_runs.combined import MEMORY, verify_all

    verdict = verify_all(out, samples=1, methods=("twin",))
    assert verdict.exit_code == 4 and verdict.verdict.startswith(f"FAILED by {MEMORY}")
    assert "does not fit the platform's memories" in verdict.verdict
    refused = tmp_path / "refused.pte"
    assert main(["compile", "mixed", "--npu", "ethos-u55-128", "-o", str(refused),
                 "--require-fit"]) == 3
    assert "--require-fit" in capsys.readouterr().err
    assert not refused.exists() and not refused.with_name("refused.artifacts").exists()
