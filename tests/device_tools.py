"""What the device-code tests need, and what happens when it is missing.

Locally a missing toolchain, QEMU or third-party source tree skips the test with "not run: ...".
Under CI (`CI=true`, as GitHub Actions and `.ci/run` set it) it fails instead: a CI machine
without them would otherwise be green while no device code ran.
"""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(reason: str) -> None:
    """Skip (locally) or fail (under CI) a test whose device tools are missing."""
    if in_ci():
        pytest.fail(f"CI=true, but the device check cannot run here: {reason}", pytrace=False)
    pytest.skip(f"not run: {reason}")


def host_runtime_or_missing():
    """A HostRuntime (the real ExecuTorch runtime with the device kernels built for the host)."""
    from kernels.runtime import HostRuntime, RuntimeUnavailable, ensure_library, find_sources

    try:
        return HostRuntime(ensure_library(find_sources()))
    except RuntimeUnavailable as error:
        missing(str(error))


def qemu_or_missing() -> None:
    """Return when the Corstone-300 runner can be built and run on QEMU here."""
    from kernels.native.errors import QemuUnavailable
    from kernels.native.sources import find_third_party
    from kernels.native.toolchains import find_qemu, find_toolchain

    try:
        find_toolchain()
        find_qemu()
        find_third_party()
    except QemuUnavailable as error:
        missing(str(error))


def passes_twin_host_runtime_and_qemu(pte, samples: int = 4) -> None:
    """The twin (against the quantized reference), the host runtime and QEMU's Cortex-M55 (byte
    for byte against the twin) each pass `pte`."""
    from orchestrator.device_runs.combined import verify_all

    host_runtime_or_missing().close()
    qemu_or_missing()
    verdict = verify_all(pte, samples=samples, methods=("twin", "host runtime",
                                                        "QEMU Cortex-M55"))
    outcomes = {r.name: r.outcome for r in verdict.results}
    assert outcomes == {"twin": "passed", "host runtime": "passed",
                        "QEMU Cortex-M55": "passed"}, verdict.verdict


def verify_qemu_passes(pte, capsys, cases: int = 4) -> str:
    """`orchestrate verify --qemu PTE` exits 0 with every one of `cases` BundleIO cases PASS;
    returns what it printed (the `npu:` line is there for a hybrid program)."""
    from orchestrator.cli import main

    code = main(["verify", "--qemu", str(pte)])
    out = capsys.readouterr().out
    assert code == 0, out
    listed = [line for line in out.splitlines() if line.strip().startswith("case ")]
    assert len(listed) == cases and all(": PASS," in line for line in listed), out
    return out


def npu_line(out: str) -> str:
    """The `npu: N invocation(s), ...` line of a hybrid verify --qemu report."""
    return next(line for line in out.splitlines() if line.startswith("npu: "))


def mlperf_tiny(name: str):
    """A file of MLPerf Tiny's trained models (`../shared/models/mlperf-tiny` beside the checkout,
    or $ORCHESTRATE_MLPERF_TINY), which the project reads but does not ship."""
    from pathlib import Path

    folder = Path(os.environ.get("ORCHESTRATE_MLPERF_TINY") or
                  Path(__file__).resolve().parents[2] / "shared" / "models" / "mlperf-tiny")
    path = folder / name
    if not path.is_file():
        missing(f"{path} is not there (set ORCHESTRATE_MLPERF_TINY to the folder of MLPerf "
                "Tiny's .tflite files)")
    return path


def compile_refused_in_one_line(model, capsys, expected: str) -> None:
    """`orchestrate compile MODEL --npu none` (in-process) exits 2 with one stderr line
    containing `expected`, and writes neither the program nor its artifacts folder."""
    from orchestrator.cli import main

    out = model.with_name("out.pte")
    code = main(["compile", str(model), "--npu", "none", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], err
    assert not out.exists() and not out.with_name("out.artifacts").exists()
