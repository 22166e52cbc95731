"""The Corstone-320 (Cortex-M85 + Ethos-U85) runner on QEMU.

QEMU has no Cortex-M85: platforms/corstone320/runner/firmware.yaml builds the runner for the
M85's architecture (Armv8.1-M Mainline + MVE + FP; GCC 12.2 has no -mcpu=cortex-m85) and runs it
on QEMU's mps3-an547 Cortex-M55, which implements the same architecture; the reports say so on
every run. The Ethos-U85 half of a hybrid program goes over the same semihosting bridge as on the
Corstone-300, through the real EthosUBackend and the Ethos-U core driver built for the U85; the
host computes each invocation from the partition's TOSA graph (the U85 command stream is not
modelled) and the verdict names that method.
"""

from __future__ import annotations

import pytest

from tests.device_tools import npu_line, qemu_or_missing, verify_qemu_passes

CORE = "Cortex-M85 build (Armv8.1-M + MVE) on QEMU's Cortex-M55 (mps3-an547)"


@pytest.fixture(scope="module")
def cpu_only(compiles):
    return compiles.get("ds-cnn", platform="corstone320", npu="none", write=True)[1]


@pytest.fixture(scope="module")
def hybrid(compiles):
    return compiles.get("ds-cnn", platform="corstone320", npu="ethos-u85-256", write=True)[1]


def test_a_cortex_m85_program_runs_on_qemu_as_the_m85_build_and_says_so(cpu_only, capsys):
    qemu_or_missing()
    out = verify_qemu_passes(cpu_only, capsys)
    assert f"({CORE}:" in out and "Corstone-320 Cortex-M85 build in QEMU's Cortex-M55" in out
    assert "core: QEMU has no Cortex-M85" in out and "not M85 cycles" in out


def test_an_ethos_u85_program_runs_through_the_real_backend_with_the_u85_model_on_the_host(
        hybrid, capsys):
    """By default (--npu-model auto) the bridge executes each Ethos-U85 invocation's command
    stream in the U85 model and compares it with the TOSA graph."""
    qemu_or_missing()
    out = verify_qemu_passes(hybrid, capsys)
    assert "Ethos-U85 command streams in the Ethos-U85 model over semihosting" in out
    assert "the command stream is not executed" not in out
    npu = npu_line(out)
    assert npu.startswith("npu: 4 invocation(s)"), npu  # 4 cases x 1 partition
    assert "1,036 NPU commands" in npu, npu  # 259 per invocation


def test_a_wrong_u85_answer_fails_on_the_device(hybrid, monkeypatch):
    """What the host writes back is what the firmware's EthosUBackend copies out: an output
    byte changed on the host's side of the bridge fails the BundleIO case on the M85 build, so
    a pass is not by construction."""
    from orchestrator.artifacts.manifest import Manifest
    from orchestrator.device_runs import qemu_npu
    from orchestrator.device_runs.qemu import installed_platform, qemu_on_checked_pte
    from platforms.qemu_npu_bridge import SCRATCH

    qemu_or_missing()
    real = qemu_npu.QemuNpuHandler.__call__

    def wrong_answer(self, payload, regions):
        commands = real(self, payload, regions)
        output = self.partitions[bytes(payload)].payload.outputs[0]
        regions[SCRATCH][output.offset] ^= 0x01
        return commands

    monkeypatch.setattr(qemu_npu.QemuNpuHandler, "__call__", wrong_answer)
    platform = installed_platform(Manifest.load(hybrid).target)
    result = qemu_on_checked_pte(hybrid, platform, 300, samples=1)
    assert result.passed is False, result.summary()
    assert [case.passed for case in result.cases] == [False], result.summary()
