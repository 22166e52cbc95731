"""The `.pte` through the real ExecuTorch runtime with the real Cortex-M kernels and CMSIS-NN.

The host runtime library is built once per session (and cached across sessions by source hash)
from ../shared/third_party or ORCHESTRATE_EXECUTORCH_SRC / ORCHESTRATE_CMSIS_NN_SRC. Without
sources or a compiler every test here is skipped as "not run", never passed.

CPU-only programs are compiled for the Cortex-M33 (CMSIS-NN DSP tier): the host compiles
CMSIS-NN's C path, which computes what the DSP path computes from the same arguments. A program
for the M55's MVE tier passes `quantized_linear` arguments only the MVE path reads; the test
that shows it pins where runtime and twin part.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.device_tools import missing

DSP_TIER_CPU = "cortex-m33"


@pytest.fixture(scope="session")
def host_runtime():
    from kernels.runtime import HostRuntime, RuntimeUnavailable, ensure_library, find_sources

    try:
        library = ensure_library(find_sources())
    except RuntimeUnavailable as error:
        missing(str(error))
    runtime = HostRuntime(library)
    yield runtime
    runtime.close()


def _report(compiles, host_runtime, model, platform="corstone300", npu="none", cpu=None,
            per_op=True):
    from orchestrator.device_runs.runtime_verify import verify_runtime

    _, pte = compiles.get(model, platform, npu, cpu, write=True)
    return verify_runtime(pte, samples=2, per_op=per_op, runtime=host_runtime)


@pytest.mark.parametrize("model", ["ds-cnn", "mixed"])
def test_cpu_only_program_in_the_real_runtime_writes_the_twins_bytes(compiles, host_runtime,
                                                                    model):
    report = _report(compiles, host_runtime, model, cpu=DSP_TIER_CPU)
    assert report.runtime_error is None
    assert report.bytes_equal and report.outcome == "passed", report.verdict
    assert all(o.max_steps_vs_twin == 0 for o in report.outputs)
    assert report.per_op and all(row.equal for row in report.per_op), report.per_op
    # The real kernels ran: every cortex_m op of the program is in the runtime's trace.
    assert any(row.op.startswith("cortex_m::quantized_conv2d") for row in report.per_op)
    assert report.host_limits == ()
    assert report.c_path_only == () and report.reference_comparison_form == "program"


def test_ethos_u_delegates_run_through_executorchs_backend(compiles, host_runtime):
    report = _report(compiles, host_runtime, "ds-cnn", npu="ethos-u55-128")
    assert report.bytes_equal, report.verdict
    delegates = [row for row in report.per_op if row.op.startswith("EthosUBackend")]
    assert len(delegates) == 2 and all(row.equal for row in delegates)
    assert report.runtime_npu_seconds_per_sample > 0


def test_mve_tier_linear_is_compared_in_its_c_path_form(compiles, host_runtime):
    """AtenToCortexMPass gives quantized_linear a kernel_sum and no bias for the MVE tier; the
    host's CMSIS-NN C path ignores the kernel sum and reads the (absent) bias. The twin computes
    that C path for the comparison, so every instruction is compared, and the verdict names the
    ops whose MVE form only an MVE core (QEMU) judges."""
    report = _report(compiles, host_runtime, "ds-cnn", cpu="cortex-m55")
    assert report.bytes_equal and report.outcome == "passed", report.verdict
    assert report.per_op and all(row.equal for row in report.per_op)
    linear = [name for name in report.c_path_only if "quantized_linear" in name]
    assert len(linear) == 1
    index, op = linear[0].split(" ", 1)
    assert f"{op} x1 (instruction {index})" in report.verdict, report.verdict
    assert report.host_limits == ()
    assert report.reference_comparison_form == "c-path"


def _kwt_like_report(c_path_only):
    """A passed report of a CPU-only M55 program whose host run is 87 steps from the quantized
    reference (the keyword transformer's figure; its MVE form is within 1 step)."""
    from orchestrator.device_runs.runtime_verify import (OutputAgreement, RuntimeReport,
                                                         _verdict)

    output = OutputAgreement(0, (1, 8), "int8", True, 0.0, 0, 87.0, 5, 8)
    report = RuntimeReport("kwt.pte", "the runtime", 4, "generated", (output,), (), None, None, (),
                           c_path_only, "c-path" if c_path_only else "program", None, 0.001, 0.0,
                           0.01, "0" * 16, True, "passed", True, "")
    return replace(report, verdict=_verdict(report))


@pytest.mark.parametrize("c_path_only", [("12 cortex_m::quantized_linear.out",), ()])
def test_quantized_reference_figure_names_the_c_path_it_was_computed_from(c_path_only):
    """On x86 the runtime runs CMSIS-NN's C path: for an MVE program the figure against the
    quantized reference is of that form, so the report says so and where the MVE form is
    checked; the decision and the figure itself stay as they were."""
    from orchestrator.device_runs.runtime_verify import render_text, report_json

    report = _kwt_like_report(c_path_only)
    text, data = render_text(report), report_json(report)
    assert report.outcome == "passed" and report.passed
    assert "vs quantized reference max 87 steps, 5/8 elements differ" in text
    labelled = ("runtime (CMSIS-NN C path, not the program's MVE form) vs quantized reference "
                "max 87 steps")
    if c_path_only:
        assert labelled in text, text
        assert "verify --qemu" in text and "verify --runtime twin" in text
        assert data["reference_comparison_form"] == "c-path"
    else:
        assert labelled not in text and "C path" not in text, text
        assert "); runtime vs quantized reference max 87 steps" in text
        assert data["reference_comparison_form"] == "program"


def test_a_run_its_caller_abandoned_does_not_answer_the_next_request(compiles, host_runtime):
    """One runtime process serves every compile of a tool process (device_check.shared_runtime).
    A caller stopped while a run waits for its NPU answer (Ctrl-C in a notebook; any exception
    the NPU handler does not catch) used to leave that run's failure, and its log, as the answer
    to the next request: a CPU-only program was then refused on a kernel it does not have (a CI
    run's `aten::squeeze_copy` refusal of a program without one). Each answer now carries its
    request's number (kernels/host_runtime/worker.py)."""
    import torch

    from kernels.runtime import HostRuntime
    from npu_driver.ethos_u import invocation_handler

    _, npu_pte = compiles.get("ds-cnn", "corstone300", "ethos-u55-128", write=True)
    _, cpu_pte = compiles.get("ds-cnn", "corstone300", "none", DSP_TIER_CPU, write=True)
    sample = (torch.randn(1, 1, 49, 10, generator=torch.Generator().manual_seed(3)),)
    want_cpu = host_runtime.run(cpu_pte, sample).outputs
    want_npu = host_runtime.run(npu_pte, sample, npu=invocation_handler("ethos-u55-128")).outputs

    def stopped(invocation):
        raise KeyboardInterrupt

    with HostRuntime(host_runtime.library) as runtime:
        for _ in range(2):
            with pytest.raises(KeyboardInterrupt):
                runtime.run(npu_pte, sample, npu=stopped)
        cpu = runtime.run(cpu_pte, sample)
        assert [o.numpy().tobytes() for o in cpu.outputs] == \
            [o.numpy().tobytes() for o in want_cpu]
        assert "EthosU" not in cpu.log and "CALL_DELEGATE" not in cpu.log
        npu = runtime.run(npu_pte, sample, npu=invocation_handler("ethos-u55-128"))
        assert [o.numpy().tobytes() for o in npu.outputs] == \
            [o.numpy().tobytes() for o in want_npu]


def test_library_is_cached_by_source_hash(host_runtime):
    from kernels.runtime import ensure_library, find_sources

    again = ensure_library(find_sources())
    assert again.cached and again.path == host_runtime.library.path


def test_missing_sources_are_not_run(compiles, tmp_path):
    from orchestrator.errors import NotRun
    from orchestrator.device_runs.runtime_verify import verify_runtime

    _, pte = compiles.get("ds-cnn", "corstone300", "none", DSP_TIER_CPU, write=True)
    with pytest.raises(NotRun, match="^not run: ") as raised:
        verify_runtime(pte, samples=1, executorch_src=str(tmp_path / "no-executorch"))
    assert raised.value.exit_code == 5


def test_no_compiler_is_not_run(monkeypatch, tmp_path):
    from kernels.runtime import RuntimeUnavailable, ensure_library, find_sources

    try:
        sources = find_sources()
    except RuntimeUnavailable as error:
        missing(str(error))
    monkeypatch.setenv("CC", str(tmp_path / "no-gcc"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-g++"))
    with pytest.raises(RuntimeUnavailable, match="compiler"):
        ensure_library(sources, cache_dir=tmp_path / "cache")
