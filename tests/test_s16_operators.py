"""int16 convolution and linear on the CPU through our CMSIS-NN s16 operators (kernels/s16,
partitioners/s16_operators.py): tests/precision_models.py's conv and projection raised to a16w8
and forced off the U55-128, so an int16 conv and an int16 linear run on the Cortex-M55."""

from __future__ import annotations

import pytest
import torch

from kernels import s16
from orchestrator import api
from partitioners.policy import Policy, Selector
from tests.device_tools import passes_twin_host_runtime_and_qemu

MODEL = "tests/precision_models.py:conv_gram_linear"


@pytest.fixture(scope="module")
def on_cpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("s16") / "conv_proj_s16.pte"
    policy = Policy(source="test", force_cpu=Selector(modules=("conv", "proj")))
    return api.compile(MODEL, out, npu="ethos-u55-128", precision="conv=a16w8,proj=a16w8",
                       policy=policy)


def test_int16_conv_and_linear_on_the_cpu_run_on_cmsis_nn_s16_kernels(on_cpu):
    rows = {r.op.split(".")[1]: r for r in on_cpu.plan.rows
            if r.kind == "op" and r.placement != "npu"}
    assert (rows["convolution"].placement, rows["convolution"].kernel) == (
        "cmsis-nn", "arm_convolve_wrapper_s16")
    assert (rows["linear"].placement, rows["linear"].kernel) == (
        "cmsis-nn", "arm_fully_connected_s16")
    assert rows["convolution"].precision == rows["linear"].precision == "a16w8"
    assert rows["convolution"].dtypes == "int16,int8,int64,int32,int32,uint8 -> int16"
    operators = (on_cpu.pte.parent / f"{on_cpu.pte.stem}.artifacts" / "operators.txt").read_text()
    assert "orchestrate::quantized_conv2d_s16.out" in operators.split()
    assert "orchestrate::quantized_linear_s16.out" in operators.split()
    assert "aten::convolution.out" not in operators.split()



def test_the_s16_rows_cost_from_their_own_qemu_calibration(on_cpu):
    """cost_models/data/cortex-m55-qemu.yaml's conv_s16 and linear_s16 rows, fitted to QEMU
    profiles of this program (conv 39,031 and linear 33,093 instructions measured) and of
    tests/s16_models.py's: the int8 classes' figures are not theirs."""
    costs = {r.kernel: r.cost for r in on_cpu.plan.rows if r.kernel in s16.CMSIS_FUNCTIONS.values()}
    conv, linear = costs["arm_convolve_wrapper_s16"], costs["arm_fully_connected_s16"]
    assert conv.instructions_source == "calibrated: cortex-m55-qemu.yaml (arm_convolve_wrapper_s16)"
    assert linear.instructions_source == "calibrated: cortex-m55-qemu.yaml (arm_fully_connected_s16)"
    assert conv.instructions == round(32667.117647 + 1.381051 * 4608)
    assert linear.instructions == round(3.212137 * 16384)


def test_the_s16_program_passes_the_twin_the_host_runtime_and_qemu(on_cpu):
    passes_twin_host_runtime_and_qemu(on_cpu.pte)


def test_the_release_firmware_carries_our_kernels_and_gives_the_twins_bytes(on_cpu, tmp_path,
                                                                           capsys):
    """`orchestrate firmware` copies kernels/s16's sources into the project (they are not in
    the third-party tree) and registers them; on QEMU the outputs equal the host twin's."""
    from orchestrator.cli import main
    from orchestrator.firmware import load_record
    from tests.device_tools import qemu_or_missing

    qemu_or_missing()
    out = tmp_path / "fw"
    assert main(["firmware", str(on_cpu.pte), "-o", str(out), "--npu-device", "qemu-bridge",
                 "--run"]) == 0
    assert "output 0: 40 B, byte-identical to the host twin's" in capsys.readouterr().out
    assert load_record(out)["kernel_libraries"]["orchestrate"] == [
        "orchestrate::quantized_conv2d_s16.out", "orchestrate::quantized_linear_s16.out"]
    assert sorted(p.name for p in (out / "kernels" / "orchestrate").iterdir()) == [
        "op_quantized_conv2d_s16.cpp", "op_quantized_linear_s16.cpp"]


def test_a_linear_past_512_columns_and_a_wider_conv_pass_every_method(tmp_path):
    """tests/s16_models.py: 4 -> 16 channels, and a linear over 2,304 columns, where CMSIS-NN's
    s16 kernels accumulate in int64 past their first 512 columns."""
    policy = Policy(source="test", force_cpu=Selector(modules=("conv", "proj")))
    result = api.compile("tests/s16_models.py:wide_conv_linear", tmp_path / "wide.pte",
                         npu="ethos-u55-128", precision="conv=a16w8,proj=a16w8", policy=policy)
    kernels = [r.kernel for r in result.plan.rows if r.kind == "op" and r.placement != "npu"]
    assert kernels == ["arm_convolve_wrapper_s16", "arm_fully_connected_s16"]
    passes_twin_host_runtime_and_qemu(result.pte)


def test_requantization_is_cmsis_nns_reduced_multiplier_and_rounding():
    """arm_nn_requantize_s64 with REDUCE_MULTIPLIER(2**30) = 16384 and shift 0: x * 0.5, the
    half rounded up, then the activation bounds."""
    acc = torch.tensor([1000, 1001, -1001, 100_000], dtype=torch.int64)
    multiplier = torch.tensor(1 << 30, dtype=torch.int32)
    shift = torch.tensor(0, dtype=torch.int32)
    out = s16.requantize_s64(acc, multiplier, shift, -32768, 32767)
    assert out.tolist() == [500, 501, -500, 32767]
    assert s16.reduced_multiplier(torch.tensor([0x7FFF0000, 1 << 30])).tolist() == [0x7FFF,
                                                                                    16384]


def test_the_conv_scratch_covers_cmsis_nns_c_and_mve_paths():
    # 8 channels x 3x3: C path 2 * 72 int16 = 288 B; MVE 4 rows of 72 -> 72 lanes = 576 B.
    assert s16.conv_scratch_bytes(8, 3, 3) == 576
    # 1 channel x 3x3: C path 36 B; MVE 4 rows of 9 -> 16 lanes = 128 B.
    assert s16.conv_scratch_bytes(1, 3, 3) == 128
