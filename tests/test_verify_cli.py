"""`orchestrate compile --bundle` and `orchestrate verify [--fvp]` from the command line.

No Corstone FVP can be installed here: the FVP path is exercised through a stand-in executable
that records the argv our harness builds and replays a runner log in ExecuTorch's format. That
checks our plumbing (discovery, command, log parsing, exit codes), never a device result.
"""

from __future__ import annotations

import json
import stat

import pytest

from orchestrator.cli import main


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "kws.pte"
    assert main(["compile", "ds-cnn", "--npu", "ethos-u55-128", "-o", str(out), "--bundle"]) == 0
    return out


def test_compile_bundle_writes_a_bpte_beside_the_pte(bundled):
    from executorch.devtools.bundled_program.serialize import (
        deserialize_from_flatbuffer_to_bundled_program,
    )

    bundle = deserialize_from_flatbuffer_to_bundled_program(bundled.with_suffix(".bpte").read_bytes())
    (suite,) = bundle.method_test_suites
    assert suite.method_name == "forward" and len(suite.test_cases) >= 1


def test_verify_passes_and_names_its_method(bundled, capsys):
    assert main(["verify", str(bundled), "--samples", "4", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    methods = {m["name"]: m for m in report["methods"]}
    twin = methods["twin"]["report"]
    assert twin["passed"] is True
    assert "twin" in twin["method"]
    assert "Vela command stream executed by the Ethos-U55/U65 functional model" in twin["method"]
    runtime = methods["host runtime"]["report"]
    assert "EthosUBackend, NPU: Vela command stream executed" in runtime["method"]
    # The device code judged it: the host runtime ran the hybrid program, and so did QEMU where
    # it is installed, the NPU invocations handed over semihosting to the functional model.
    assert methods["host runtime"]["outcome"] == "passed", methods["host runtime"]["detail"]
    qemu = methods["QEMU Cortex-M55"]
    if qemu["outcome"] != "not-run":
        assert qemu["outcome"] == "passed", qemu["detail"]
        assert "functional model over semihosting" in qemu["detail"]
    assert report["outcome"] == "passed" and "host runtime" in report["verdict"]
    # It claims device code for the CPU side only: the NPU ran as the command stream in our
    # model of the hardware.
    assert "NPU partitions ran as Vela's command stream from the .pte in the Ethos-U functional " \
        "model (a model of the hardware, not the silicon)" in report["verdict"]


def test_verify_fvp_without_an_fvp_is_not_run_exit_5(bundled, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("ORCHESTRATE_FVP_DIR", raising=False)
    assert main(["verify", str(bundled), "--fvp"]) == 5
    err = capsys.readouterr().err
    assert "not run: no FVP found" in err and "PASS" not in err


def test_verify_fvp_runs_the_platforms_fvp_command_and_reads_the_runner_log(bundled, capsys,
                                                                           monkeypatch, tmp_path):
    from tests.test_fvp import PASS_LOG_U55

    argv_file = tmp_path / "argv.txt"
    fvp = tmp_path / "FVP_Corstone_SSE-300_Ethos-U55"
    fvp.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\" > " + str(argv_file) + "\ncat <<'LOG'\n"
                   + PASS_LOG_U55 + "\nLOG\n")
    fvp.chmod(fvp.stat().st_mode | stat.S_IEXEC)
    elf = tmp_path / "arm_executor_runner.elf"
    elf.write_bytes(b"\x7fELF")
    monkeypatch.setenv("ORCHESTRATE_FVP_DIR", str(tmp_path))
    assert main(["verify", str(bundled), "--fvp", "--runner-elf", str(elf), "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert "method: Corstone FVP (corstone300, ethos-u55-128)" in out and "PASS" in out
    argv = argv_file.read_text().split("\n")
    assert "ethosu.num_macs=128" in argv
    # A fresh bundle of the hash-checked .pte, not the .bpte lying beside it.
    assert any(a.endswith("program.bpte@0x38000000") for a in argv), argv
    assert str(elf) in argv


def test_verify_says_on_stderr_which_sample_the_twin_checks(bundled, capsys):
    """A recurrence's twin check takes seconds a sample: verify shows where it is (one line a
    sample when stderr is not a terminal), and --quiet keeps stderr clean."""
    assert main(["verify", str(bundled), "--runtime", "twin", "--samples", "2"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "twin: sample" in line]
    assert [line.split("] ", 1)[1].split(" done")[0] for line in lines] == [
        "twin: sample 1 of 2, every value checked", "twin: sample 2 of 2, every value checked"]
    assert main(["verify", str(bundled), "--runtime", "twin", "--samples", "1", "--quiet"]) == 0
    assert "twin: sample" not in capsys.readouterr().err


def test_verify_with_zero_samples_is_refused_not_passed(bundled, capsys):
    with pytest.raises(SystemExit) as refused:  # argparse refuses it before anything runs
        main(["verify", str(bundled), "--samples", "0"])
    assert refused.value.code == 2
    assert "--samples: '0' is not positive; give 1 or more" in capsys.readouterr().err


def test_a_twin_that_could_not_compare_a_value_is_partial_never_passed(bundled, capsys,
                                                                        monkeypatch):
    """A value the program writes with no reference node to compare it with: `--runtime twin`
    says PARTIAL naming it and exits 5 (it said PASSED and listed the value as not checked)."""
    from dataclasses import replace

    from orchestrator.verification import twin_verify

    real = twin_verify.check_locally

    def one_unmatched(*args, **kwargs):
        checks = list(real(*args, **kwargs))
        checks[-1] = replace(checks[-1], reference_node=None, max_steps=None, mismatched=None,
                             rounding_stages=None, allowed_steps=None, passed=None)
        return tuple(checks)

    monkeypatch.setattr(twin_verify, "check_locally", one_unmatched)
    assert main(["verify", str(bundled), "--runtime", "twin", "--samples", "2"]) == 5
    captured = capsys.readouterr()
    assert "verify " in captured.out and ": PARTIAL" in captured.out
    assert "1 not compared (no reference node of that shape and dtype), first: instruction" \
        in captured.out
    assert "PASSED" not in captured.out


def test_the_device_methods_decide_over_a_partial_twin():
    from pathlib import Path

    from orchestrator.device_runs.combined import combine
    from orchestrator.verification.methods import QEMU, RUNTIME, TWIN, MethodResult

    twin = MethodResult(TWIN, "partial", "PARTIAL by twin: 9 checked; 1 not compared", False)
    host = MethodResult(RUNTIME, "passed", "PASSED by the runtime", True)
    qemu = MethodResult(QEMU, "not-run", "QEMU not installed", True)
    with_device = combine(Path("m.pte"), (twin, host, qemu))
    assert with_device.outcome == "passed" and with_device.exit_code == 0
    assert "the twin compared part: PARTIAL by twin" in with_device.verdict
    alone = combine(Path("m.pte"), (twin, _not_run(host), qemu))
    assert alone.outcome == "partial" and alone.exit_code == 5
    assert "device code not run" in alone.verdict


def _not_run(result):
    from dataclasses import replace

    return replace(result, outcome="not-run", detail="no sources")
