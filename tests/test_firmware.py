"""`orchestrate firmware` and `orchestrate size --firmware`: the release project of a CPU-only
DS-CNN (int8 program I/O) is written, built with CMake once for this file, run on QEMU, and
its header, outputs and footprint are checked against the program and the ELF."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from kernels.program_view import ProgramView
from orchestrator.cli import main
from orchestrator.errors import NotRun, UserError
from orchestrator.firmware import load_record, make_firmware, run_on_qemu
from orchestrator.firmware.footprint import footprint
from orchestrator.verification.twin import run_twin
from orchestrator.firmware.spec import BUILD_DIR, ELF_NAME
from tests.device_tools import missing, qemu_or_missing


@pytest.fixture(scope="module")
def program(compiles):
    _, pte = compiles.get("ds-cnn", npu="none", cpu="cortex-m55", io="int8", write=True)
    return pte


@pytest.fixture(scope="module")
def project(program, tmp_path_factory):
    qemu_or_missing()
    if shutil.which("cmake") is None:
        missing("no cmake on PATH")
    folder = tmp_path_factory.mktemp("firmware") / "dscnn-release"
    return make_firmware(program, folder, profile="release")


def _macros(header: str) -> dict[str, str]:
    return dict(re.findall(r"^#define (\w+) (.+?)(?: /\*.*)?$", header, re.M))


def test_model_io_header_states_the_programs_io(program, project):
    macros = _macros((project.folder / "model" / "model_io.h").read_text())
    view = ProgramView.read(program.read_bytes())
    (tensor,) = view.input_values
    (output,) = view.output_values
    assert macros["MODEL_INPUT_COUNT"] == "1" and macros["MODEL_OUTPUT_COUNT"] == "1"
    assert macros["MODEL_INPUT0_SIZES"] == "{" + ", ".join(map(str, tensor.sizes)) + "}"
    assert macros["MODEL_INPUT0_DIM_ORDER"] == "{" + ", ".join(map(str, tensor.dim_order)) + "}"
    assert int(macros["MODEL_INPUT0_BYTES"]) == tensor.nbytes
    assert int(macros["MODEL_OUTPUT0_BYTES"]) == output.nbytes
    # int8 program I/O: the scales and zero points the .pte's config methods carry
    assert float(macros["MODEL_INPUT0_SCALE"].rstrip("f")) == pytest.approx(
        view.config["input0_scale"], rel=1e-6)
    assert int(macros["MODEL_INPUT0_ZERO_POINT"]) == view.config["input0_zp"]
    assert int(macros["MODEL_OUTPUT0_ZERO_POINT"]) == view.config["output0_zp"]
    # the arena is the program's planned buffer, placed where the plan put it
    assert int(macros["MODEL_PLANNED0_BYTES"]) == view.non_const_buffer_sizes[1]
    assert project.record["memory"]["planned"][0]["region"] == "dtcm"


def test_release_firmware_on_qemu_gives_the_twins_bytes(program, project):
    from orchestrator.firmware import example_input_bytes, logical_input
    from orchestrator.firmware.spec import IoTensor

    run = run_on_qemu(project.folder)
    assert run.exit_code == 0, run.log
    spec = project.record["inputs"][0]
    data = example_input_bytes(project.folder)
    tensor = logical_input(data[0], IoTensor("input0", spec["dtype"], tuple(spec["sizes"]),
                                              tuple(spec["dim_order"])))
    twin = run_twin(program, (tensor,))
    assert twin.input_bytes == data  # the example's bytes are the input the twin wrote
    assert run.outputs == twin.output_bytes
    assert 0 < run.stack_used_bytes < project.record["memory"]["stack_bytes"]
    assert 0 < run.method_pool_used_bytes <= project.record["memory"]["method_pool_bytes"]


def test_release_links_only_the_programs_kernels_and_no_printf_or_verifier(program, project):
    nm = shutil.which("arm-none-eabi-nm")
    symbols = subprocess.run([nm, "-C", str(project.folder / BUILD_DIR / ELF_NAME)],
                             capture_output=True, text=True, check=True).stdout
    assert "_vfprintf_r" not in symbols and "_svfprintf_r" not in symbols
    assert "VerifyProgramBuffer" not in symbols  # ET_ENABLE_PROGRAM_VERIFICATION=0
    assert "BundledProgram" not in symbols and "bundled_program" not in symbols
    operators = {line.strip() for line in
                 (program.parent / (program.stem + ".artifacts") / "operators.txt")
                 .read_text().splitlines() if line.strip()}
    registered = {op for ops in project.record["kernel_libraries"].values() for op in ops}
    assert registered == operators
    assert "op_add.cpp" not in (project.folder / "CMakeLists.txt").read_text()


def test_size_firmware_components_add_up_to_the_elf_sections(project, capsys):
    measured = footprint(project.folder)
    sections = {}
    out = subprocess.run([shutil.which("arm-none-eabi-size"), "-A",
                          str(project.folder / BUILD_DIR / ELF_NAME)],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith("."):
            sections[parts[0]] = int(parts[1])
    loaded_code = sum(size for name, size in sections.items()
                      if name in (".text", ".ARM.exidx", ".ARM.extab", ".init_array",
                                  ".fini_array", ".preinit_array", ".vectors"))
    code = sum(kinds.get("code", 0) for kinds in measured.components.values())
    # the map's input sections fill the output sections up to alignment padding
    assert loaded_code - 64 <= code <= loaded_code
    assert measured.pte_bytes == project.record["pte_bytes"] == sections[".model_pte"]
    runtime = measured.components["runtime core"]["code"]
    assert 0 < runtime < 20 * 1024  # the runtime core alone, without kernels
    assert measured.components["CMSIS-NN"]["code"] > 0
    assert main(["size", "--firmware", str(project.folder)]) == 0
    text = capsys.readouterr().out
    assert "runtime core" in text and "(map)" in text


def test_hybrid_release_firmware_on_qemu_over_the_npu_bridge_gives_the_twins_bytes(
        compiles, tmp_path, capsys):
    """DS-CNN on ethos-u55-128: EthosUBackend and the real Ethos-U core driver linked, its device
    layer the runner's semihosting bridge; each invocation computed by the host's functional
    model; the outputs equal the host twin's."""
    qemu_or_missing()
    _, pte = compiles.get("ds-cnn", npu="ethos-u55-128", write=True)
    out = tmp_path / "fw"
    assert main(["firmware", str(pte), "-o", str(out), "--npu-device", "qemu-bridge",
                 "--run"]) == 0
    printed = capsys.readouterr().out
    assert "output 0: 48 B, byte-identical to the host twin's" in printed
    record = load_record(out)
    assert record["npu"] == {"partitions": 2, "product": "ethos-u55", "device": "qemu-bridge",
                             "fast_scratch_bytes": 0}
    # the NPU scratch rides in the temp pool, in the region the plan chose for it
    assert record["memory"]["temp_region"] == "sram"
    assert record["memory"]["temp_pool_bytes"] >= 22080


def test_hybrid_hardware_project_wires_the_npu_interrupt(compiles, tmp_path):
    """--npu-device hardware (the default): the driver's own U55/U65 device layer, the NPU's
    register address and interrupt from the Corstone-300 recipe (ETHOS_U55_IRQn 56)."""
    _, pte = compiles.get("ds-cnn", npu="ethos-u55-128", write=True)
    made = make_firmware(pte, tmp_path / "fw", build=False)
    cmake = (made.folder / "CMakeLists.txt").read_text()
    assert "ethos-u-core-driver/src/ethosu_device_u55_u65.c" in cmake
    assert "ethosu_bridge.c" not in cmake
    assert "MODEL_NPU_BASE_ADDRESS=0x58102000u MODEL_NPU_IRQ=56" in cmake
    assert "ETHOSU_ARCH=u55 ETHOSU_MACS=128" in cmake
    assert "KEEP(*(.vectors.irq))" in (made.folder / "memory.ld").read_text()
    assert main(["firmware", str(pte), "-o", str(tmp_path / "fw2"), "--no-build"]) == 0
    with pytest.raises(NotRun, match="QEMU does not model"):
        run_on_qemu(made.folder, pte_path=pte)


def test_firmware_refuses_a_folder_it_did_not_write(program, tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert main(["firmware", str(program), "-o", str(tmp_path / "mine"), "--no-build"]) == 2
    assert "not a folder `orchestrate firmware` wrote" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    assert main(["firmware", str(program), "-o", str(tmp_path / "new"), "--no-build",
                 "--run"]) == 2
    assert "--run needs the build" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_a_platform_without_runner_gets_the_generic_recipe_and_its_plans_regions(tmp_path):
    """examples/my_soc.yaml has no runner/firmware.yaml: the project takes its regions from the
    platform YAML and places each buffer where that platform's plan put it."""
    from orchestrator import compile as compile_program

    result = compile_program("ds-cnn", str(tmp_path / "soc.pte"),
                             platform="examples/my_soc.yaml", npu="none")
    # a platform file the artifacts name is never loaded: the user names it again
    with pytest.raises(UserError, match="not an installed platform"):
        make_firmware(result.pte, tmp_path / "fw", build=False)
    made = make_firmware(result.pte, tmp_path / "fw", build=False,
                         platform="examples/my_soc.yaml")
    placement = result.plan.to_json()["summary"]["memory_placement"]
    script = (made.folder / "memory.ld").read_text()
    assert "flash (rwx) : ORIGIN = 0x10000000" in script
    assert f"KEEP(*(.model_pte)) }} > {placement['image_region']}" in script
    for arena in placement["arenas"]:
        assert f"*(.noinit.{arena['region']}.*) }} > {arena['region']}" in script
    assert made.record["board"].startswith("generic Armv8-M recipe")
    assert made.record["qemu_runs_it"] is False
    cmake = (made.folder / "CMakeLists.txt").read_text()
    assert "set(CPU_FLAGS -mcpu=cortex-m55 -mfloat-abi=hard -mthumb)" in cmake
    assert main(["size", "--firmware", str(made.folder)]) == 2  # not built: one line, exit 2


def test_plan_shows_the_firmware_figures_of_this_program_and_refuses_another(
        program, project, compiles, capsys):
    """`plan PROGRAM.pte --firmware DIR` prints the build's flash and RAM from its map (the same
    figures `size --firmware` ends with); JSON carries them in the summary; a build of another
    program is refused in one line."""
    import json

    measured = footprint(project.folder)
    assert main(["plan", str(program), "--firmware", str(project.folder)]) == 0
    text = capsys.readouterr().out
    assert f"flash: {measured.flash_bytes:,} B = code {measured.code_bytes():,} B" in text
    assert "bytes from the linker map" in text and f".pte {measured.pte_bytes:,} B (map)" in text
    assert main(["plan", str(program), "--firmware", str(project.folder), "--format",
                 "json"]) == 0
    figures = json.loads(capsys.readouterr().out)["firmware"]
    assert (figures["flash_bytes"], figures["code_bytes"], figures["pte_bytes"]) == (
        measured.flash_bytes, measured.code_bytes(), measured.pte_bytes)
    _, other = compiles.get("ds-cnn", npu="none", cpu="cortex-m55", write=True)  # float I/O
    assert main(["plan", str(other), "--firmware", str(project.folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was built from another program" in err[0], err


def test_the_fast_scratch_follows_the_programs_memory_mode_not_the_platforms(tmp_path):
    """Corstone-300's U65 defaults to Dedicated_Sram_384KB (a 384 KiB fast scratch); a program a
    policy compiled for Shared_Sram has no fast scratch, and its firmware sets none aside."""
    from orchestrator import compile as compile_program
    from orchestrator.device_runs.qemu import fast_scratch_bytes
    from platforms.platform import load_platform

    corstone300 = load_platform("corstone300")
    u65 = {"npu": "ethos-u65-256"}
    assert fast_scratch_bytes(corstone300, u65) == 384 * 1024  # a manifest without the mode
    assert fast_scratch_bytes(corstone300, {**u65, "vela_memory_mode": "Shared_Sram"}) == 0
    assert fast_scratch_bytes(corstone300, {**u65, "vela_memory_mode":
                                            "Dedicated_Sram_512KB"}) == 512 * 1024
    (tmp_path / "shared.yaml").write_text("vela: {memory_mode: Shared_Sram}\n")
    result = compile_program("mixed", str(tmp_path / "mixed.pte"), npu="ethos-u65-256",
                             policy=str(tmp_path / "shared.yaml"))
    assert result.plan.compiled.target.memory_mode == "Shared_Sram"
    made = make_firmware(result.pte, tmp_path / "fw", build=False, npu_device="qemu-bridge")
    assert made.record["npu"]["fast_scratch_bytes"] == 0
    assert "MODEL_NPU_FAST_SCRATCH_BYTES 0" in (made.folder / "model" / "model_io.h").read_text()
