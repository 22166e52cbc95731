"""Verdicts on programs whose device code is right: a bound that is wrong for an op must not
fail them (issue 61, item 6)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
from torch import nn

from orchestrator.verification.twin_verify import verify

CPU_ONLY = ("corstone300", "none", "cortex-m55")


class WideHardswish(nn.Module):
    """A conv whose outputs reach about 40, then a hardswish: the Cortex-M hardswish adds its 3
    as a zero-point shift rounded to the input's step (about 0.3 here)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)
        with torch.no_grad():
            self.conv.weight.mul_(20.0)
        self.act = nn.Hardswish()
        self.out = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.out(self.act(self.conv(x)))


def wide_hardswish():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return WideHardswish().eval(), (torch.randn(1, 3, 8, 8),)


def test_hardswish_zero_point_shift_is_within_its_bound(compiles):
    """Twin and host runtime write the same bytes; the mul was 4-5 steps off the float
    hardswish with an allowance of 1 (a false FAIL), its bound now counts the shift's rounding."""
    _, pte = compiles.get(f"{Path(__file__)}:wide_hardswish", *CPU_ONLY, write=True)
    report = verify(pte, samples=16, per_op=True)
    assert report.passed, report.verdict
    (mul,) = [c for c in report.per_op if c.op == "cortex_m::quantized_mul.out"]
    assert mul.max_steps >= 2 and mul.allowed_steps > mul.max_steps - 1e-9
    assert mul.allowed_steps < 8  # the shift's rounding, not a blanket allowance



class FloatSum(nn.Module):
    """A sum over 256 tokens that the Cortex-M passes leave float (portable aten::sum), then a
    quantized linear: the float is quantized after 256 terms. The linear is the identity, so a
    step of the quantized sum is a step of the output."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 64)
        self.out = nn.Linear(64, 64)
        with torch.no_grad():
            self.out.weight.copy_(torch.eye(64))
            self.out.bias.zero_()

    def forward(self, x):
        return self.out(self.proj(x).sum(dim=1))


def float_sum():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return FloatSum().eval(), (torch.randn(1, 256, 16),)


class _OtherSummationOrder:
    """Stands in for the host runtime: the twin's own kernels, except that the float sum's
    element `element` comes out `delta` off the twin's (another summation order's result). Its
    kernels are the host's C path, as the real host runtime's are."""

    library = SimpleNamespace(key="twin-as-device")

    def __init__(self, twin, instruction: int, element: int, delta: float):
        from kernels.reference import HOST_TIER

        self.twin = replace(twin, isa_tier=HOST_TIER)
        self.instruction, self.element, self.delta = instruction, element, delta

    def reset(self, pte) -> None:
        pass

    def run(self, pte, inputs, npu=None, repeat=1, trace=False):
        from kernels.host_runtime.session import InstructionOutput, RawValue
        from kernels.runtime import RuntimeRun
        from orchestrator.verification import twin as twin_module

        plain = self.twin.run(tuple(inputs), keep_intermediates=True)
        (written,) = next(e for e in plain.op_trace if e.instruction == self.instruction).outputs
        value = plain.intermediates[written].clone()
        value.view(-1)[self.element] += self.delta
        with mock.patch.object(twin_module, "within_float_bound", lambda *args: True):
            run = self.twin.run(tuple(inputs), keep_intermediates=True,
                                device_floats={self.instruction: (value,)})
        logged = ()
        if trace:
            logged = tuple(InstructionOutput(e.instruction, e.op, tuple(
                RawValue(str(t.dtype).removeprefix("torch."), tuple(t.shape),
                         tuple(t.contiguous().stride()), t.contiguous().numpy().tobytes())
                for t in (run.intermediates[i] for i in e.outputs)))
                for e in run.op_trace if e.kind == "kernel")
        return RuntimeRun(run.outputs, (0.0,), (0.0,), "", logged)


def test_a_float_on_a_rounding_boundary_takes_the_devices_step_and_verifies(compiles, tmp_path):
    """Two correct float kernels sum 256 terms in different orders; where the sum sits on a
    rounding boundary of the quantize after it, the device's step is one off the twin's and the
    outputs differ (torchvision's ViT on the M55 and M4 FAILED so). Within the summation-order
    bound the twin takes the device's float and must then agree byte for byte; beyond it, the
    difference is a FAIL; a bundle's expectation (QEMU's) takes the same float."""
    from orchestrator.device_runs.runtime_verify import verify_runtime
    from orchestrator.verification.bundle import write_bundle
    from orchestrator.verification.floats import float_bound
    from orchestrator.verification.twin import load_twin
    from orchestrator.verification.twin_verify import device_inputs, sample_inputs

    # the M4 (DSP tier): the host's C path computes what its kernels compute, so the float sum
    # the host runtime sees is the one the bundle's twin sees
    _, pte = compiles.get(f"{Path(__file__)}:float_sum", "corstone300", "none", "cortex-m4",
                          write=True)
    twin = load_twin(pte)
    calls = list(twin.view.kernel_calls())
    (total,) = [c for c in calls if c.operator.name == "aten::sum"]
    quantize = next(c for c in calls if c.index > total.index
                    and c.operator.name == "cortex_m::quantize_per_tensor")
    scale = twin.view.values[quantize.args[1]].scalar
    float_program, _ = twin.reference("float.pt2")
    (sample,), _ = sample_inputs(float_program, 1, None)
    plain = twin.run(device_inputs(twin, sample), keep_intermediates=True)
    (written,) = next(e for e in plain.op_trace if e.instruction == total.index).outputs
    sums = plain.intermediates[written].reshape(-1)
    # the element nearest a rounding boundary of the quantize (x / scale a hair from k + 0.5),
    # and the float32 just across it, as the quantize computes (x * (1 / scale) in float32)
    inverse = torch.tensor(1.0) / torch.tensor(scale, dtype=torch.float32)
    fraction = (sums.double() / scale) - (sums.double() / scale).floor()
    element = int((fraction - 0.5).abs().argmin())
    x = sums[element].clone()
    toward = torch.tensor(math.inf if fraction[element] < 0.5 else -math.inf)
    step = torch.round(x * inverse)
    while torch.round(x * inverse) == step:
        x = torch.nextafter(x, toward)
    delta = float(x) - float(sums[element])
    assert abs(delta) <= float_bound(plain.intermediates[written], 256)  # the premise

    report = verify_runtime(twin, samples=1,
                            runtime=_OtherSummationOrder(twin, total.index, element, delta))
    assert report.outcome == "passed", report.verdict
    (found,) = report.float_boundaries
    assert (found.instruction, found.elements, found.max_steps) == (quantize.index, 1, 1)
    assert "rounding boundary" in report.verdict
    took: list = []
    write_bundle(twin, tmp_path / "case.bpte", inputs=[sample], took=took)
    assert [(case, count) for case, count, _ in took] == [(0, 1)]

    twin.device_floats.clear()
    beyond = verify_runtime(twin, samples=1,
                            runtime=_OtherSummationOrder(twin, total.index, element, scale))
    assert beyond.outcome == "failed" and not beyond.float_boundaries, beyond.verdict
    took.clear()
    write_bundle(twin, tmp_path / "beyond.bpte", inputs=[sample], took=took)
    assert took == []


def test_a_float_the_devices_build_rounds_apart_is_found_from_its_output_digests(compiles):
    """The device's own build (QEMU's M55: contracted multiply-adds, newlib's expf) rounds one
    float of case 1 to the other side of a boundary, where the host runtime agrees with the
    twin, so no device run logs the float. The runner logs each output's FNV-1a for a failed
    case; the float whose move across its boundary (within the summation-order bound) gives
    those bytes is found, and QEMU matches that expectation byte for byte. A digest nothing
    explains finds nothing."""
    from orchestrator.device_runs.qemu import installed_platform, qemu_on_checked_pte, run_qemu
    from orchestrator.verification.boundary_search import flips_matching
    from orchestrator.verification.twin import OUTPUT_DIGESTS, load_twin
    from orchestrator.verification.twin_verify import device_inputs, sample_inputs
    from tests.device_tools import qemu_or_missing

    qemu_or_missing()
    _, pte = compiles.get("tests/attention_models.py:heads_attention", *CPU_ONLY, write=True)
    twin = load_twin(pte)
    platform = installed_platform(twin.require_manifest().target)
    plain = qemu_on_checked_pte(twin, platform, samples=4)
    failed = [case for case in plain.cases if case.passed is False]
    assert [case.index for case in failed] == [1] and failed[0].digests, plain.log[-800:]

    float_program, _ = twin.reference("float.pt2")
    inputs, _ = sample_inputs(float_program, 4, None)
    found = flips_matching(twin, device_inputs(twin, inputs[1]), failed[0].digests,
                           lambda: twin.npu_executor("auto"))
    assert found is not None and len(found) == 1
    assert flips_matching(twin, device_inputs(twin, inputs[1]), (12345,),
                          lambda: twin.npu_executor("auto")) is None

    result = run_qemu(load_twin(pte), samples=4)
    assert result.outcome == "passed", result.detail
    assert OUTPUT_DIGESTS in result.detail and "case 1 (1 instruction(s))" in result.detail
