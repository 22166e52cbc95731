"""The runner firmware on QEMU's Corstone-300 (mps3-an547): a CPU-only BundleIO program checks
itself against the host twin with the real ExecuTorch runtime and CMSIS-NN kernels.

Skipped with "not run: ..." where the arm-none-eabi toolchain, qemu-system-arm or the third-party
sources are missing. The firmware is built once per operator set and cached (see
platforms/firmware_recipe.py, kernels/native/runner.py), so only the first session on a machine pays for the build.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.device_tools import in_ci, missing

from platforms import load_platform
from platforms.qemu import _plan_regions, run_bpte_on_qemu
from kernels.native.errors import KernelsMissing, QemuNotFound, QemuUnavailable
from kernels.native.operators import read_operators, select_operators
from kernels.native.sources import find_third_party
from kernels.native.toolchains import find_qemu, find_toolchain
from platforms.firmware_recipe import NoEthosUInQemu, build_firmware, load_firmware_config


def _why_not_runnable() -> str | None:
    try:
        find_toolchain()
        find_qemu()
        find_third_party()
    except QemuUnavailable as error:
        return str(error)
    return None


_NOT_RUNNABLE = _why_not_runnable()
# Under CI=true a missing toolchain, QEMU or source tree fails these tests (tests/device_tools.py).
needs_qemu = pytest.mark.skipif(_NOT_RUNNABLE is not None and not in_ci(),
                                reason=_NOT_RUNNABLE or "")


def _needs_sources() -> None:
    try:
        find_third_party()
    except QemuUnavailable as error:
        missing(str(error))


@pytest.fixture(scope="session")
def ds_cnn_bundle(tmp_path_factory) -> Path:
    """A CPU-only DS-CNN compiled for cortex-m55 with its BundleIO .bpte beside it."""
    import orchestrator

    pte = tmp_path_factory.mktemp("qemu") / "ds_cnn.pte"
    orchestrator.compile("ds-cnn", pte, npu="none", bundle=True)
    return pte.with_suffix(".bpte")


@pytest.fixture(scope="session")
def ds_cnn_on_qemu(ds_cnn_bundle):
    return run_bpte_on_qemu(ds_cnn_bundle, _operators_txt(ds_cnn_bundle), "corstone300")


def _operators_txt(bpte: Path) -> Path:
    return bpte.with_suffix(".artifacts") / "operators.txt"


def _with_altered_expected_output(bpte: Path, out: Path) -> Path:
    """A copy of `bpte` whose first test case expects a different first output element."""
    from executorch.devtools.bundled_program.serialize import (
        deserialize_from_flatbuffer_to_bundled_program,
    )

    data = bytearray(bpte.read_bytes())
    bundle = deserialize_from_flatbuffer_to_bundled_program(bytes(data))
    expected = bytes(bundle.method_test_suites[0].test_cases[0].expected_outputs[0].val.data)
    at = data.find(expected)
    assert at >= 0 and data.find(expected, at + 1) < 0, "expected output bytes are not unique"
    data[at + 3] ^= 0x80  # the first float's sign bit (little-endian)
    out.write_bytes(bytes(data))
    return out


@needs_qemu
def test_cpu_only_ds_cnn_bundle_passes_on_qemu(ds_cnn_on_qemu):
    result = ds_cnn_on_qemu
    assert result.passed is True, result.summary() + "\n" + result.log
    assert len(result.cases) == 4 and all(case.passed for case in result.cases)
    assert result.exit_code == 0
    assert result.method == "Corstone-300 CPU in QEMU: real kernels, no timing"


@needs_qemu
def test_an_altered_expected_output_fails_on_qemu(ds_cnn_bundle, ds_cnn_on_qemu, tmp_path):
    altered = _with_altered_expected_output(ds_cnn_bundle, tmp_path / "altered.bpte")
    # The same operators: the firmware of the passing run is reused, only the bundle differs.
    result = run_bpte_on_qemu(altered, _operators_txt(ds_cnn_bundle), "corstone300")
    assert result.passed is False
    assert result.firmware.cached
    assert [case.passed for case in result.cases] == [False, True, True, True]
    assert result.exit_code == 10
    assert any("Output 0 element 0" in line for line in result.errors), result.errors


@needs_qemu
def test_instructions_per_inference_are_counted(ds_cnn_on_qemu):
    result = ds_cnn_on_qemu
    # icount: 1 ns of virtual time per instruction, SysTick at 32 MHz of it.
    assert result.instructions_per_tick == pytest.approx(31.25, rel=1e-3)
    counts = [case.instructions for case in result.cases]
    assert min(counts) > 100_000
    # The same network on inputs of the same shape runs the same code, to within a tick.
    assert max(counts) - min(counts) <= 2 * result.instructions_per_tick


@needs_qemu
def test_the_firmware_is_cached_by_operator_set(ds_cnn_bundle, ds_cnn_on_qemu):
    again = build_firmware(read_operators(_operators_txt(ds_cnn_bundle)), "corstone300")
    assert again.cached and again.elf == ds_cnn_on_qemu.firmware.elf
    assert again.compiled_objects == 0


@needs_qemu
def test_the_bundle_and_arena_go_where_the_plan_put_them(ds_cnn_on_qemu):
    placement = ds_cnn_on_qemu.placement
    assert placement["image"] == "qspi_flash" and placement["image_address"] == "0x38000000"
    assert placement["planned"] == "dtcm"
    # One planned buffer, and the runner put it in DTCM (read back from the address it logged).
    assert [(mem_id, region) for mem_id, _, region, _ in ds_cnn_on_qemu.planned_buffers] == \
        [(1, "dtcm")]


@needs_qemu
def test_split_activations_run_byte_exact_from_the_regions_the_plan_chose(
        tmp_path, ds_cnn_on_qemu):
    """An application keeping most of DTCM for itself: the activations no longer fit there, so
    ExecuTorch plans two buffers, DTCM and BRAM; the runner places each where plan.json says and
    the outputs are still byte-equal to the twin's."""
    import orchestrator

    policy = tmp_path / "memory.yaml"
    policy.write_text("keep_free: {dtcm: 440000}\n")
    pte = tmp_path / "ds_cnn_split.pte"
    orchestrator.compile("ds-cnn", pte, npu="none", bundle=True, memory_policy=str(policy))
    bpte = pte.with_suffix(".bpte")
    plan = json.loads((pte.with_suffix(".artifacts") / "plan.json").read_text())
    arenas = plan["summary"]["memory_placement"]["arenas"]
    assert [a["region"] for a in arenas] == ["dtcm", "bram"]
    assert arenas[0]["bytes"] <= arenas[0]["budget"] == 524_288 - 73_728 - 440_000
    result = run_bpte_on_qemu(bpte, _operators_txt(bpte), "corstone300")
    assert result.passed is True, result.summary() + "\n" + result.log
    assert len(result.cases) == 4
    assert result.firmware.elf == ds_cnn_on_qemu.firmware.elf  # same operators, same firmware
    assert [(m, size, region) for m, size, region, _ in result.planned_buffers] == \
        [(a["mem_id"], a["bytes"], a["region"]) for a in arenas]
    assert result.placement["planned"] == "dtcm,bram"


@needs_qemu
def test_an_int8_io_program_passes_on_qemu(tmp_path, ds_cnn_on_qemu):
    """platform.yaml's `firmware_io` says the runner takes int8 I/O (so --io auto may choose it):
    the int8-I/O DS-CNN runs byte-exact on the same firmware."""
    import orchestrator

    pte = tmp_path / "ds_cnn_int8.pte"
    orchestrator.compile("ds-cnn", pte, npu="none", io="int8", bundle=True)
    bpte = pte.with_suffix(".bpte")
    result = run_bpte_on_qemu(bpte, _operators_txt(bpte), "corstone300")
    assert result.passed is True and len(result.cases) == 4, result.summary() + result.log


@needs_qemu
def test_the_platform_reserves_what_the_runner_firmware_takes(ds_cnn_on_qemu):
    """platform.yaml's `reserved:` is what the plan keeps out of DTCM and SRAM; the built
    runner's own sections (stack, .data, .bss, mailbox; the heap) must fit inside it."""
    import subprocess

    from platforms.platform import load_platform

    platform = load_platform("corstone300")
    out = subprocess.run(["arm-none-eabi-size", "-A", str(ds_cnn_on_qemu.firmware.elf)],
                         capture_output=True, text=True, check=True).stdout
    used: dict[str, int] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() and int(parts[1]):
            region = next((r.name for r in platform.memories
                           if r.base_address <= int(parts[2]) < r.base_address + r.size_bytes),
                          None)
            if region in platform.reserved:
                used[region] = used.get(region, 0) + int(parts[1])
    assert used["dtcm"] > 65_536  # the stack alone is 64 KiB
    for region, size in used.items():
        assert size <= platform.reserved[region][0], (region, size, out)


_CPU_WEIGHTS_ITEM = "cpu weights (constant segment, copied at boot)"
_DTCM = range(0x30000000, 0x30080000)  # Corstone-300's DTCM, at the addresses the firmware uses


def _with_cpu_weights_in(bpte: Path, region: str, weight_bytes: int, out_dir: Path) -> Path:
    """A copy of `bpte` and its artifacts whose plan.json puts the CPU weights in `region`."""
    copy = out_dir / bpte.name
    shutil.copy(bpte, copy)
    shutil.copytree(bpte.with_suffix(".artifacts"), copy.with_suffix(".artifacts"))
    plan_path = copy.with_suffix(".artifacts") / "plan.json"
    plan = json.loads(plan_path.read_text())
    items = [item for item in plan["summary"]["memory"]["items"]
             if not str(item.get("item", "")).startswith("cpu weights")]
    items.append({"item": _CPU_WEIGHTS_ITEM, "bytes": weight_bytes, "source": "executorch",
                  "region": region, "region_bytes": 524288, "fits": True})
    plan["summary"]["memory"]["items"] = items
    plan_path.write_text(json.dumps(plan, indent=1))
    return copy


_FLASH = range(0x38000000, 0x38800000)  # qspi_flash, where the image lies


def _check_weights(result, region: str) -> None:
    assert result.passed is True, result.summary() + "\n" + result.log
    assert result.placement["weights"] == region
    assert result.weights_region == region, result.log
    assert result.weights_bytes and result.weights_bytes > 10_000, result.log
    if region == "dtcm":
        assert result.weights_address in _DTCM and result.weights_address % 16 == 0
        assert f"bytes copied to dtcm at {result.weights_address:#010x}" in result.log
    elif region == "qspi_flash":
        assert result.weights_address in _FLASH
        assert f"bytes read in place at {result.weights_address:#010x}" in result.log


@needs_qemu
def test_the_cpu_weights_go_where_the_plan_put_them(ds_cnn_bundle, ds_cnn_on_qemu, tmp_path):
    """The compiled plan's placement (its `cpu weights` item, or none: in place in the image) and
    one more run with the other of DTCM and the image's flash: the runner copies the constant
    segment to DTCM at boot, or reads it where the image lies, and the outputs stay byte-exact."""
    planned = _plan_regions(_operators_txt(ds_cnn_bundle)).get("weights", "qspi_flash")
    _check_weights(ds_cnn_on_qemu, planned)
    other = "qspi_flash" if planned == "dtcm" else "dtcm"
    variant = _with_cpu_weights_in(ds_cnn_bundle, other, ds_cnn_on_qemu.weights_bytes, tmp_path)
    result = run_bpte_on_qemu(variant, _operators_txt(variant), "corstone300")
    assert result.firmware.cached and result.firmware.elf == ds_cnn_on_qemu.firmware.elf
    _check_weights(result, other)
    assert result.weights_bytes == ds_cnn_on_qemu.weights_bytes
    assert len(result.cases) == 4


def test_the_plan_names_the_weights_and_arena_regions(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"summary": {"memory": {"items": [
        {"item": ".pte (weights, code data)", "region": "qspi_flash"},
        {"item": "executorch arena 1 of 2", "region": "dtcm"},
        {"item": _CPU_WEIGHTS_ITEM, "bytes": 1234, "region": "sram"},
    ]}, "memory_placement": {"arenas": [{"mem_id": 2, "region": "bram"},
                                        {"mem_id": 1, "region": "dtcm"}]}}}))
    assert _plan_regions(tmp_path / "operators.txt") == {
        "image": "qspi_flash", "planned": ("dtcm", "bram"), "weights": "sram"}


def test_a_program_with_ethos_u_delegates_is_not_run(tmp_path):
    hybrid = tmp_path / "hybrid.bpte"
    hybrid.write_bytes(b"\0" * 64 + b"EthosUBackend" + b"\0" * 64)
    operators = tmp_path / "operators.txt"
    operators.write_text("cortex_m::quantize_per_tensor.out\n")
    with pytest.raises(NoEthosUInQemu, match="^not run: .*no Ethos-U; nothing was run"):
        run_bpte_on_qemu(hybrid, operators, "corstone300")


def test_an_operator_without_a_kernel_in_the_sources_is_not_run():
    _needs_sources()
    # The pinned wheel's NHWC variant, absent from the third_party snapshot.
    with pytest.raises(KernelsMissing, match="^not run: .*cortex_m::quantized_conv2d_nhwc.out"):
        select_operators(["cortex_m::quantized_conv2d_nhwc.out"], find_third_party())


def test_a_missing_qemu_is_reported_as_not_run(monkeypatch, tmp_path):
    monkeypatch.setenv("ORCHESTRATE_QEMU", str(tmp_path / "no-qemu"))
    with pytest.raises(QemuNotFound, match="^not run: "):
        find_qemu()


def test_every_region_the_firmware_uses_is_memory_qemu_models():
    platform = load_platform("corstone300")
    config = load_firmware_config(platform)
    used = {*config.code_regions, config.data_region, config.heap_region, config.runtime_region,
            config.default_program_region, config.default_planned_region}
    for name in used:
        region = platform.memory(name)
        backing = config.qemu_backing(region.base_address, region.size_bytes)
        assert backing is not None, name
        assert backing.writable or name == config.default_program_region, name


@needs_qemu
@pytest.mark.parametrize("model", ["mobilenet-v1-025", "resnet8", "deep-autoencoder", "mixed"])
def test_every_mlperf_tiny_model_and_mixed_pass_on_qemu(model, tmp_path, capsys):
    """The four MLPerf Tiny models and `mixed`, CPU-only on Cortex-M55: the device's bytes equal
    the twin's expected outputs in every BundleIO case (ds-cnn is checked above)."""
    _needs_sources()
    from orchestrator.cli import main

    pte = tmp_path / f"{model}.pte"
    assert main(["compile", model, "--npu", "none", "--cpu", "cortex-m55", "-o", str(pte),
                 "--bundle", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["verify", str(pte), "--qemu"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "Corstone-300 CPU in QEMU: real kernels, no timing" in out
    assert out.count(": PASS, ") == 4 and "a lower bound on cycles" in out
