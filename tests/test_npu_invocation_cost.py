"""The CPU's side of an NPU invocation: EthosUBackend::execute's driver work and its copies of
the delegate's inputs and outputs into the NPU scratch and back (cpu_cost.yaml transitions).

The plan left that work out of its instruction estimate (a program of 51 invocations: 2,394
estimated against 104,656 measured) and charged no cycles for the copies. Measured on QEMU it
is 1,851 + 0.561 instructions per byte copied; these tests hold the invocation rows' bytes, the
estimate in the plan and, on QEMU, the estimate beside what the CPU retired."""

from __future__ import annotations

import json

import pytest

from cost_models.cpu import npu_invocation_instructions, npu_io_copy_cost
from tests.device_tools import qemu_or_missing


def test_the_invocation_estimate_grows_with_the_bytes_copied():
    assert npu_invocation_instructions(0, "cortex-m55") == 1851
    assert npu_invocation_instructions(11264, "cortex-m55") == pytest.approx(8170, abs=2)
    assert npu_io_copy_cost(2000, "cortex-m55", 32_000_000).cycles == 2 * npu_io_copy_cost(
        1000, "cortex-m55", 32_000_000).cycles


def test_invocation_rows_carry_their_io_bytes_and_cpu_instructions(compiles):
    """ds-cnn on U55-128 with the M55's calibration (Corstone-300's): each invocation row's
    io_bytes are its delegate's inputs and outputs, and its cost has the CPU's side in
    instructions, which the plan's instruction total includes."""
    from cost_models.profile_calibration import load_calibration
    from orchestrator.planning.planner import make_plan

    compiled, _ = compiles.get("ds-cnn", "corstone300", "ethos-u55-128")
    plan = make_plan(compiled, calibration=load_calibration("cortex-m55-qemu.yaml"))
    invocations = [r for r in plan.rows if r.kind == "npu-invocation"]
    assert invocations
    for row in invocations:
        assert row.io_bytes > 0
        assert row.cost.instructions == npu_invocation_instructions(row.io_bytes, "cortex-m55")
    assert plan.summary.instructions == sum(r.cost.instructions for r in plan.rows
                                            if r.cost is not None
                                            and r.cost.instructions is not None)
    document = plan.to_json()
    assert [op["io_bytes"] for op in document["ops"] if op["kind"] == "npu-invocation"] == [
        r.io_bytes for r in invocations]


def test_the_estimate_is_within_a_tenth_of_what_qemu_counted(compiles, capsys):
    from orchestrator.cli import main

    qemu_or_missing()
    _, pte = compiles.get("ds-cnn", "corstone300", "ethos-u55-128", write=True)
    assert main(["verify", str(pte), "--qemu", "--profile"]) == 0
    capsys.readouterr()
    assert main(["plan", str(pte), "--measured", str(pte.with_suffix(".etdp")),
                 "--calibration-costs", "cortex-m55-qemu.yaml", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    estimates = {op["partition"]: op["cost"]["instructions"] for op in document["ops"]
                 if op["kind"] == "npu-invocation"}
    partitions = document["summary"]["measured"]["partitions"]
    assert partitions and len(partitions) == len(estimates)
    for measured in partitions:
        ratio = estimates[measured["partition"]] / measured["measured"]
        assert 0.9 <= ratio <= 1.1, (measured, estimates)
