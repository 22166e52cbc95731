"""What a new user meets around the commands: answers in a second, `doctor`, messages that name
the fix, no half-made folders, reports in the format asked for, and logs a CI job can read."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parent.parent
# Seconds each. (Reading a platform with an NPU asks Vela for its accelerator list and system
# configurations, a tenth of a second with NumPy: that is the platform's own check.)
HEAVY = ("torch", "executorch", "tosa_reference_model")

# Runs main() in a fresh interpreter and reports its exit code and which heavy packages the
# command imported (argparse's own exit for --help/--version included).
_PROBE = """
import json, sys
from orchestrator.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as done:
    code = done.code
heavy = sorted(name for name in {heavy!r} if name in sys.modules)
print(json.dumps({{"code": code, "heavy": heavy}}))
"""


def _probe(argv: list[str], cwd: Path, env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY), *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    last = done.stdout.strip().splitlines()[-1]
    return {**json.loads(last), "stderr": done.stderr}


@pytest.mark.parametrize("argv, code", [
    (["--help"], 0),
    (["--version"], 0),
    (["list"], 0),
    (["reasons"], 0),
    (["plan", "ds-cnn", "--platform", "corstone30"], 2),
    (["plan", "ds-cnx"], 2),
    (["plan", "ds-cnn", "--cpu", "cortex-m99"], 2),
    (["compile", "ds-cnn", "-o", "model.txt"], 2),
    (["sweep", "ds-cnn", "--npus", "ethos-u55-128,ethos-u55-999"], 2),
    # An output folder nobody can write in (root included) is refused before any import.
    (["plan", "ds-cnn", "-o", "/proc/plan.html"], 2),
])
def test_light_commands_and_argument_errors_import_no_torch(argv, code, tmp_path):
    """--help, --version, list, reasons and every argument error answer without importing
    torch, ExecuTorch or the TOSA reference model (which cost seconds)."""
    result = _probe(argv, tmp_path)
    assert result["code"] == code, result["stderr"]
    assert result["heavy"] == [], f"{argv} imported {result['heavy']}"
    if code == 2:
        lines = result["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("orchestrate: error: "), result["stderr"]


def test_list_names_every_zoo_model_from_the_index_that_zoo_builds():
    from examples.zoo import ZOO
    from examples.zoo_index import ZOO_MODELS

    assert [(m.name, m.description, m.kind) for m in ZOO_MODELS] == \
        [(e.name, e.description, e.kind) for e in ZOO.values()]


def test_doctor_lists_missing_sources_with_their_fix_and_exits_5(tmp_path, capsys,
                                                                 monkeypatch):
    empty = tmp_path / "third_party"
    empty.mkdir()
    monkeypatch.setenv("ORCHESTRATE_THIRD_PARTY", str(empty))
    assert main(["doctor"]) == 5
    out = capsys.readouterr().out
    for method in ("host runtime", "QEMU Corstone-300", "QEMU Corstone-320", "release firmware"):
        line = next(line for line in out.splitlines() if line.strip().startswith(method))
        assert "MISSING" in line, out
    assert f"looked in {empty}" in out and "orchestrate sources fetch" in out, out
    assert "ORCHESTRATE_THIRD_PARTY=" in out, out
    twin = next(line for line in out.splitlines() if line.strip().startswith("twin"))
    assert "available" in twin, out

    assert main(["doctor", "--format", "json"]) == 5
    report = json.loads(capsys.readouterr().out)
    by_name = {c["name"]: c for c in report["capabilities"]}
    assert by_name["twin"]["available"] and not by_name["host runtime"]["available"]
    missing = [r for r in by_name["QEMU Corstone-300"]["requirements"] if not r["found"]]
    assert missing and all("sources fetch" in r["fix"] for r in missing), missing


def test_doctor_on_this_machine_has_every_required_method(capsys):
    """CI installs the toolchain, QEMU and the sources: every required method is there."""
    from tests.device_tools import host_runtime_or_missing, qemu_or_missing

    qemu_or_missing()
    host_runtime_or_missing().close()
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "MISSING" not in out and "required methods available" in out, out


def test_an_installed_package_names_the_fetch_not_a_path_beside_site_packages(
        tmp_path, monkeypatch, capsys):
    """Outside a checkout there is no ../shared/third_party: the default is the fetched trees,
    and every message says how to get the sources."""
    from kernels.native import sources as native_sources
    from kernels.native.errors import QemuUnavailable
    from kernels.native.sources import find_third_party

    monkeypatch.setattr(native_sources, "IN_CHECKOUT", False)
    monkeypatch.delenv("ORCHESTRATE_THIRD_PARTY", raising=False)
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    root, origin = native_sources.third_party_root()
    assert root == (tmp_path / "cache" / "sources").resolve() and origin == "nothing fetched yet"
    with pytest.raises(QemuUnavailable) as refused:
        find_third_party()
    message = str(refused.value)
    assert "shared/third_party" not in message
    assert "orchestrate sources fetch" in message and "orchestrate doctor" in message, message

    assert main(["sources", "show"]) == 0
    out = capsys.readouterr().out
    assert "missing" in out and "ORCHESTRATE_THIRD_PARTY" in out and "sources fetch" in out, out


def test_a_failed_fetch_leaves_no_empty_folder_in_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    code = main(["sources", "fetch", "--only", "flatbuffers", "--from",
                 f"flatbuffers={tmp_path / 'no-such-mirror'}"])
    assert code == 2
    assert "sources fetch" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()


def test_verify_prints_one_verdict_header(compiles, tmp_path, capsys, monkeypatch):
    """Without the sources only the twin runs: its section and the run's verdict do not both
    read `verify X.pte: ...` (they said PASSED, then TWIN-ONLY)."""
    _, pte = compiles.get("deep-autoencoder", npu="none", write=True)
    empty = tmp_path / "third_party"
    empty.mkdir()
    monkeypatch.setenv("ORCHESTRATE_THIRD_PARTY", str(empty))
    assert main(["verify", str(pte), "--samples", "2"]) == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("verify ")]
    assert headers == [f"verify {pte}: TWIN-ONLY"], out
    assert "orchestrate doctor" in out, out


def test_a_compile_reports_its_stages_in_a_log(tmp_path, capsys):
    """stderr is not a terminal here (as in CI): one line per finished stage with its time."""
    assert main(["compile", "deep-autoencoder", "--npu", "none", "-o",
                 str(tmp_path / "ae.pte")]) == 0
    err = capsys.readouterr().err
    stages = re.findall(r"^\[\s*\d+\.\ds\] (\w+) done \(\d+\.\ds\)$", err, re.MULTILINE)
    assert {"capture", "quantize", "serialize"} <= set(stages), err
    assert "\x1b[" not in err and "\r" not in err


def test_a_bad_calibration_file_is_one_short_line_without_torch_advice(tmp_path, capsys):
    bad = tmp_path / "calib.pt"
    bad.write_text("not a tensor file\n")
    assert main(["plan", "deep-autoencoder", "--npu", "none", "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and len(err[0]) < 300, err
    assert "weights_only` set to `False" not in err[0] and "file an issue" not in err[0], err


def test_sweep_writes_html_for_an_html_output_with_quiet_workers(tmp_path):
    """`-o sweep.html` is HTML, and the worker processes print no upstream notes (torchao's
    optional kernels, pytree registrations, deprecations) on the user's stderr."""
    out = tmp_path / "sweep.html"
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", "deep-autoencoder",
                           "--npus", "none,ethos-u55-128", "--jobs", "2", "-o", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("<!DOCTYPE html>")
    allowed = (r"warning: calibration: .*", r"\[\s*\d+\.\ds\] \d/2 deep-autoencoder on .*",
               r"wrote .*sweep\.html \(html\)")
    stray = [line for line in done.stderr.splitlines()
             if line.strip() and not any(re.fullmatch(p, line) for p in allowed)]
    assert not stray, stray
    # A format the sweep does not write is refused, not written as text.
    assert main(["sweep", "deep-autoencoder", "-o", str(tmp_path / "sweep.md")]) == 2


def test_firmware_run_that_qemu_cannot_drive_is_refused_before_the_build(compiles, tmp_path,
                                                                         capsys):
    _, pte = compiles.get("ds-cnn", write=True)
    out = tmp_path / "fw"
    assert main(["firmware", str(pte), "-o", str(out), "--npu-device", "hardware",
                 "--run"]) == 2
    assert "--npu-device qemu-bridge" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".fw.tmp-*"))


def test_firmware_no_build_writes_the_project_without_the_arm_toolchain(ds_cnn_cpu, tmp_path,
                                                                        monkeypatch, capsys):
    from tests.device_tools import qemu_or_missing

    qemu_or_missing()  # the sources are needed to write the project
    monkeypatch.setenv("ORCHESTRATE_ARM_TOOLCHAIN", str(tmp_path / "no-toolchain"))
    out = tmp_path / "fw"
    assert main(["firmware", str(ds_cnn_cpu), "-o", str(out), "--no-build"]) == 0, \
        capsys.readouterr().err
    assert "cmake -S" in capsys.readouterr().out
    toolchain = (out / "cmake" / "arm-none-eabi-gcc.cmake").read_text()
    assert "find_program(ARM_GCC arm-none-eabi-gcc REQUIRED)" in toolchain
    # The build itself still needs it, and says so.
    assert main(["firmware", str(ds_cnn_cpu), "-o", str(tmp_path / "fw2")]) == 5
    assert "--no-build" in capsys.readouterr().err
