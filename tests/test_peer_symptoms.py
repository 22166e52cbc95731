"""Modules ExecuTorch tests its own backends with, which ended in an internal error or a
verify that could not run: each now compiles and passes every method, or is refused in one
line naming the op (tests/peer_symptom_models.py; the whole peer suite: benchmarks/peer_suite.py)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.cli import main
from tests.device_tools import host_runtime_or_missing, qemu_or_missing

MODELS = Path(__file__).resolve().parent / "peer_symptom_models.py"


def _verified(factory: str, tmp_path, capsys, *target: str, samples: int = 2) -> str:
    """Compile `factory` for `target` (no "cannot run" warning) and `verify` it: the twin, the
    host runtime and QEMU's Cortex-M55 each pass. What verify printed."""
    host_runtime_or_missing().close()
    qemu_or_missing()
    pte = tmp_path / f"{factory}.pte"
    assert main(["compile", f"{MODELS}:{factory}", *target, "-o", str(pte), "--quiet"]) == 0, \
        capsys.readouterr().err
    assert "cannot run this program" not in capsys.readouterr().err
    code = main(["verify", str(pte), "--samples", str(samples)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert _methods(out) == {"twin": "passed", "host runtime": "passed",
                             "QEMU Cortex-M55": "passed"}, out
    return out


def _methods(out: str) -> dict[str, str]:
    found = {}
    for line in out.splitlines():
        for method in ("twin", "host runtime", "QEMU Cortex-M55"):
            if line.startswith(f"  {method}: "):
                found[method] = line.split(": ")[1]
    return found


def test_an_lstm_returning_its_tuple_verifies_on_every_method(tmp_path, capsys):
    """Its outputs are `output, (h, c)`: verify compares the program's three flat outputs with
    the model's nested ones (it raised AttributeError: 'tuple' object has no attribute 'float')."""
    out = _verified("lstm_tuple", tmp_path, capsys, "--npu", "none")
    assert "output 2 " in out, out  # output, h and c: three program outputs compared


def test_an_index_with_whole_dimensions_runs_in_the_twin(tmp_path, capsys):
    """aten::index.Tensor_out with `Tensor?[]` indices holding None: the twin computed nothing
    (torch refused the list) and so no method ran; now all three pass."""
    _verified("index_none", tmp_path, capsys, "--npu", "none")


def test_a_partition_the_arm_backend_cannot_lower_leaves_the_npu_with_its_words(
        tmp_path, capsys, monkeypatch):
    """Upstream's behaviour, shown (the compile's Linear + BatchNorm1d fold left out): the U55's
    TOSA lowering refuses the float constant the backend's own fold leaves (an internal error
    once): the partition's ops move to the CPU and the plan quotes the backend."""
    from partitioners import quantizable

    monkeypatch.setattr(quantizable, "linear_batchnorm_folded", lambda module: [])
    monkeypatch.setenv("ORCHESTRATE_CACHE", "off")  # the unfolded program stays out of it
    assert main(["plan", f"{MODELS}:linear_bn", "--npu", "ethos-u55-128", "--format",
                 "json", "-o", str(tmp_path / "plan.json"), "--quiet"]) == 0, \
        capsys.readouterr().err
    capsys.readouterr()
    rows = json.loads((tmp_path / "plan.json").read_text())["ops"]
    moved = [r for r in rows if any(reason.get("key") == "backend-refused-npu"
                                    for reason in r.get("reasons", []))]
    assert moved, rows
    assert all("the Arm backend could not lower" in reason["message"]
               for r in moved for reason in r["reasons"] if reason["key"] == "backend-refused-npu")


def test_a_linear_with_a_batchnorm_runs_on_the_npu_folded(tmp_path, capsys):
    """Folded into the linear before quantization, Linear + BatchNorm1d is one linear the U55
    runs whole (it was refused: the lowering met a float constant, the CPU a float addmm on
    int8 activations); every method agrees."""
    _verified("linear_bn", tmp_path, capsys, "--npu", "ethos-u55-128")
    plan = json.loads((tmp_path / "linear_bn.artifacts" / "plan.json").read_text())
    assert plan["summary"]["npu_mac_coverage_pct"] == 100.0
    assert any("BatchNorm1d after a linear folded" in w["message"]
               for w in plan["summary"]["workarounds"])


def test_a_broadcast_whose_strides_give_an_odd_dim_order_compiles_and_runs(tmp_path, capsys):
    """The product of a (2, 1, 2, 1) and a (1, 2, 1, 2) is laid out contiguous (its strides
    said (0, 3, 2, 1), which no kernel or upstream copy takes: an internal error), and the plan
    checks the kernels' dim orders as the program stores them (a size-1 dimension's place made
    it warn that the device cannot run the program, which it ran)."""
    _verified("mul_broadcast_3", tmp_path, capsys, "--npu", "none")


def test_cmsis_nn_transpose_conv_drops_rows_when_padding_is_not_a_multiple_of_stride(tmp_path):
    """Upstream's behaviour, shown: compiled as upstream does (no rewrites), the real kernel's
    output (host runtime: CMSIS-NN's C path) differs from the transposed convolution's values
    (the twin, which matches the quantized reference)."""
    import torch

    from kernels.runtime import HostRuntime, ensure_library, find_sources
    from orchestrator.artifacts.outputs import write_outputs
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target
    from orchestrator.verification.twin import run_twin

    host_runtime_or_missing().close()
    loaded = load_model(f"{MODELS}:transpose_conv_relu")
    compiled = compile_model(loaded, load_calibration(None, loaded.example_inputs),
                             resolve_target("corstone300", npu="none"), legalize=False)
    pte = tmp_path / "upstream.pte"
    write_outputs(compiled, pte)
    sample = (torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(1)),)
    runtime = HostRuntime(ensure_library(find_sources()))
    try:
        device = runtime.run(pte, sample).outputs[0]
    finally:
        runtime.close()
    twin = run_twin(pte, sample).outputs[0]
    differ = int((device != twin).sum())
    assert differ > device.numel() // 2, (differ, device.numel())


def test_that_transpose_conv_runs_on_cmsis_nn_with_the_right_values(tmp_path, capsys):
    """compile crops with a padding the kernel gets right and slices the rest off: CMSIS-NN
    still runs it, and the twin, the host runtime and QEMU agree."""
    _verified("transpose_conv_relu", tmp_path, capsys, "--npu", "none")
    plan = json.loads((tmp_path / "transpose_conv_relu.artifacts" / "plan.json").read_text())
    conv = next(o for o in plan["ops"] if o["op"] == "aten.convolution.default")
    assert conv["placement"] == "cmsis-nn" and conv["kernel"] == "arm_transpose_conv_wrapper_s8"


def test_a_conv3d_is_refused_in_one_line_naming_the_kernel_not_an_internal_error(tmp_path,
                                                                                 capsys):
    """CPU-only, no CMSIS-NN or portable kernel takes a 5-D convolution: exit 2, one line."""
    code = main(["compile", f"{MODELS}:conv3d", "--npu", "none", "-o",
                 str(tmp_path / "c3.pte"), "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines()
           if line.startswith("orchestrate: ")]
    assert code == 2, err
    assert len(err) == 1 and "aten::convolution" in err[0] and "internal" not in err[0], err
    assert not (tmp_path / "c3.pte").exists()


def _faults(plan_json: Path) -> list[str]:
    plan = json.loads(plan_json.read_text())
    return [fault["check"] for op in plan["ops"] for fault in op.get("device_faults", [])]


def test_the_mve_1xn_kernel_refuses_a_padding_its_windows_do_not_read(tmp_path, capsys):
    """Upstream's behaviour, shown: compiled as upstream does (no rewrites), a 1xN convolution
    whose last padding column no stride-2 window reaches is named by the plan on the
    Cortex-M55 (the host's C path, which the device check runs, accepts it; the M33's DSP path
    has no such rule) and QEMU's M55 refuses it with the kernel's own status."""
    from orchestrator.artifacts.outputs import write_outputs
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.planning.planner import make_plan
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    mve = "ARM_CMSIS_NN_FAILURE (-3) on the mve tier"
    loaded = load_model(f"{MODELS}:conv2d_1xn_stride2")
    calibration = load_calibration(None, loaded.example_inputs)
    plans = {cpu: make_plan(compile_model(loaded, calibration, resolve_target(
        "corstone300", npu="none", cpu=cpu), legalize=False)) for cpu in ("cortex-m55",
                                                                            "cortex-m33")}
    faults = {cpu: [f.message for row in plan.rows for f in row.device_faults]
              for cpu, plan in plans.items()}
    assert sum(mve in f for f in faults["cortex-m55"]) == 1, faults
    assert not any(mve in f for f in faults["cortex-m33"]), faults
    assert plans["cortex-m55"].summary.device_faults  # --require-runnable would exit 3

    qemu_or_missing()
    pte = tmp_path / "upstream.pte"
    write_outputs(plans["cortex-m55"].compiled, pte)
    capsys.readouterr()
    assert main(["verify", "--qemu", str(pte)]) == 4
    assert "arm_convolve_wrapper_s8 failed with status -3" in capsys.readouterr().err


def test_the_mve_1xn_convolutions_run_with_their_padding_explicit(tmp_path, capsys):
    """compile makes each such padding an explicit pad and the convolution unpadded: the same
    windows, which the MVE kernel accepts. Two stride-2 Conv1d (Silero VAD's shape) run on
    CMSIS-NN on QEMU's M55, the plan says runs, and every method agrees."""
    plan = tmp_path / "m55.json"
    assert main(["plan", f"{MODELS}:conv1d_stride2", "--npu", "none", "--format", "json",
                 "-o", str(plan), "--quiet", "--require-runnable"]) == 0
    written = json.loads(plan.read_text())
    assert not _faults(plan)
    assert sum("arm_convolve_1_x_n_s8, MVE path" in w["upstream"]
               for w in written["summary"]["workarounds"]) == 2, written["summary"]["workarounds"]
    _verified("conv1d_stride2", tmp_path, capsys, "--npu", "none")
    convs = [o for o in json.loads((tmp_path / "conv1d_stride2.artifacts" / "plan.json")
                                   .read_text())["ops"] if o["op"] == "aten.convolution.default"]
    assert len(convs) == 2 and all(o["placement"] == "cmsis-nn" for o in convs), convs


def test_a_broadcasting_maximum_walks_contiguous_tensors(tmp_path, capsys):
    """cortex_m::maximum hands CMSIS-NN the sizes as n, h, w, c: a broadcast of channels-last
    tensors paired the wrong elements (44 of 72 outputs, the twin agreeing with the kernel and
    both off the reference); every tensor is now copied contiguous around it, and all agree
    with the reference."""
    _verified("maximum_broadcast_rank4", tmp_path, capsys, "--npu", "none")


def test_a_grouped_transpose_conv_runs_on_cmsis_nn_per_group(tmp_path, capsys):
    """CPU-only, CortexMQuantizer left a groups=2 transposed convolution float on the portable
    kernel; split per group, every MAC runs on CMSIS-NN and every method agrees."""
    _verified("grouped_transpose_conv", tmp_path, capsys, "--npu", "none")
    plan = json.loads((tmp_path / "grouped_transpose_conv.artifacts" / "plan.json").read_text())
    assert plan["summary"]["macs"]["portable"] == 0 and plan["summary"]["macs"]["cmsis-nn"] > 0


def test_a_division_by_a_denominator_quantized_to_zero_is_named_not_failed(tmp_path, capsys):
    """Upstream's cortex_m::quantized_div writes its output zero point where the denominator's
    code is its zero point (op_quantized_div.cpp); the quantized reference divides by a
    dequantized 0 there (+-inf or NaN). The twin FAILED on those elements while the host
    runtime and QEMU ran byte-equal to it; now they are excluded and counted, the rest compared,
    and the device's own kernel shows upstream's rule."""
    import torch

    from kernels.runtime import HostRuntime, ensure_library, find_sources

    out = _verified("div_rank_4", tmp_path, capsys, "--npu", "none", samples=16)
    line = next(line for line in out.splitlines() if "not compared: instruction" in line)
    assert "cortex_m::quantized_div" in line and "op_quantized_div.cpp" in line, out
    assert int(line.split(".out: ")[1].split()[0]) > 0, out

    # Upstream's rule on the device: every denominator 0 (its zero point), every quotient 0.
    runtime = HostRuntime(ensure_library(find_sources()))
    try:
        device = runtime.run(tmp_path / "div_rank_4.pte", (torch.full((2, 3, 4, 4), 3.0),
                                                           torch.zeros(2, 3, 4, 4))).outputs[0]
    finally:
        runtime.close()
    assert torch.count_nonzero(device) == 0


def test_a_dilated_transpose_conv_is_refused_where_cmsis_nn_would_run_it(tmp_path, capsys):
    """On the U55 the NPU leaves a dilation-2 transposed convolution to the CPU, where
    upstream's Cortex-M pass hands it to CMSIS-NN's arm_transpose_conv_s8, which has no
    dilation (570 of 576 outputs wrong on the host runtime and QEMU, measured by the peer
    suite): refused in one line naming the op and what to do. CPU-only, the portable kernel
    runs it and every method agrees."""
    code = main(["compile", f"{MODELS}:dilated_transpose_conv", "--npu", "ethos-u55-128",
                 "-o", str(tmp_path / "u55.pte"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "dilation (2, 2)" in err and \
        "arm_transpose_conv_s8" in err and "--npu none" in err, err
    assert not (tmp_path / "u55.pte").exists()
    _verified("dilated_transpose_conv", tmp_path, capsys, "--npu", "none")


def test_a_grouped_transpose_conv_with_bias_runs_on_the_u55(tmp_path, capsys):
    """EthosUQuantizer quantized a grouped transposed convolution's bias with one group's
    channel scales (an internal error at quantize: 'The size of tensor a (8) must match the
    size of tensor b (4)'); as one ungrouped transposed convolution with the groups' weights
    on its block diagonal, the NPU runs all of it and every method agrees."""
    _verified("grouped_transpose_conv", tmp_path, capsys, "--npu", "ethos-u55-128")
    plan = json.loads((tmp_path / "grouped_transpose_conv.artifacts" / "plan.json").read_text())
    assert plan["summary"]["npu_mac_coverage_pct"] == 100.0, plan["summary"]["macs"]
    assert any("block diagonal" in w["message"] for w in plan["summary"]["workarounds"])


def test_an_embedding_is_verified_on_indices_inside_its_table(tmp_path, capsys):
    """verify generated every integer input as zeros, so an embedding gave all samples one
    output and every method was INCONCLUSIVE; indices are now drawn over the table they index,
    and all three pass."""
    out = _verified("embedding", tmp_path, capsys, "--npu", "none")
    assert "every output is the same" not in out


def test_a_batchnorm_after_a_conv1d_called_in_forward_is_folded_not_left_float(tmp_path, capsys):
    """CPU-only, a Conv1d is a 1xK Conv2d squeezed back to 3-D: a BatchNorm1d called after it
    in `forward` sat behind the squeeze, where the quantizer's fold does not look, and stayed a
    float portable op between a dequantize and a quantize. Folded into the convolution, each
    block is one CMSIS-NN convolution, and every method agrees."""
    plan = tmp_path / "plan.json"
    assert main(["plan", f"{MODELS}:conv1d_bn_in_forward", "--npu", "none", "--format", "json",
                 "-o", str(plan), "--quiet"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    data = json.loads(plan.read_text())
    ops = [(r["op"], r["placement"]) for r in data["ops"]]
    assert not [op for op, _ in ops if "batch_norm" in op], ops
    assert [where for op, where in ops if op.startswith("aten.convolution")] == ["cmsis-nn"] * 2
    workarounds = data["summary"]["workarounds"]
    folded = [w for w in workarounds if "BatchNorm1d after a Conv1d folded" in w["message"]]
    assert len(folded) == 2, workarounds
    _verified("conv1d_bn_in_forward", tmp_path, capsys, "--npu", "none")


def test_a_1d_resnet_on_the_m55_compiles_and_runs_on_its_core(tmp_path, capsys):
    """Every convolution's scratch is planned for the M55's MVE path; the host build of the
    device kernels runs CMSIS-NN's C path, which needs more, writes past it and then refused or
    crashed at random: the compile refused the program on the host's word ("keep that op out
    of the model"), and legalized one squeeze per host run until it ran out. Now the host's
    overrun is named and does not judge the program, the squeezes after channels-last
    convolutions are all given contiguous inputs at once, and QEMU's M55 runs it byte-exact."""
    host_runtime_or_missing().close()
    qemu_or_missing()
    pte = tmp_path / "resnet1d.pte"
    assert main(["compile", f"{MODELS}:resnet1d", "--npu", "none", "-o", str(pte),
                 "--quiet"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    code = main(["verify", str(pte), "--samples", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    methods = _methods(out)
    assert methods["twin"] == "passed" and methods["QEMU Cortex-M55"] == "passed", out
    assert methods["host runtime"] in ("passed", "partial"), out
    if methods["host runtime"] == "partial":
        assert "the host's CMSIS-NN C path needs" in out, out
