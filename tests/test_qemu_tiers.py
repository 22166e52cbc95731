"""Every ISA tier on device code: a CPU-only program for a Cortex-M3 (scalar), M4 or M33 (DSP)
runs the runner built for its own core on QEMU's machine for that core (platforms/qemu_machines/),
byte-exact against the twin, and the verdict names the core that executed it. The Cortex-M55
(MVE) is tests/test_qemu.py's. The rest of the table (every MLPerf Tiny model on M3, M4, M7, M33
and M55; the M0, M23 and M85 builds on their stand-in cores) is opt-in: `pytest -m tiers`.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from kernels.native.cores import cores
from platforms.platform import load_platform
from platforms.qemu_machines import NoQemuMachineForCore, machine_for_core, machines, qemu_runner
from tests.device_tools import qemu_or_missing

# (platform, core or None for the platform's, QEMU machine, what the verdict names)
DEFAULT_TIERS = (
    ("corstone300", "cortex-m3", "mps2-an385", "Cortex-M3 (scalar) on QEMU mps2-an385"),
    ("corstone300", "cortex-m4", "mps2-an386", "Cortex-M4 + DSP on QEMU mps2-an386"),
    ("pico2", None, "mps2-an505", "Cortex-M33 + DSP on QEMU mps2-an505"),
)
OPT_IN_TIERS = (
    ("corstone300", "cortex-m7", "mps2-an500", "Cortex-M7 + DSP on QEMU mps2-an500"),
    ("corstone300", "cortex-m0", "mps2-an385",
     "Cortex-M0 build (Armv6-M, scalar) on QEMU's Cortex-M3 (mps2-an385)"),
    ("corstone300", "cortex-m23", "mps2-an505",
     "Cortex-M23 build (Armv8-M Baseline, scalar) on QEMU's Cortex-M33 (mps2-an505)"),
    ("ekra8d1", None, "mps3-an547",
     "Cortex-M85 build (Armv8.1-M + MVE) on QEMU's Cortex-M55 (mps3-an547)"),
)
MLPERF_TINY = ("ds-cnn", "resnet8", "mobilenet-v1-025", "deep-autoencoder")


def test_every_core_runs_on_a_qemu_machine_that_says_what_it_proves():
    """Each core of the core table has a machine: its own core, or a stand-in whose YAML says
    what running the build there proves; a core no machine names is refused in one line."""
    for name in cores():
        machine = machine_for_core(name)
        assert machine.cpu == name or len(machine.runs[name]) > 80, name
    with pytest.raises(NoQemuMachineForCore, match="covers cortex-m0"):
        machine_for_core("cortex-m99")


def test_a_platforms_own_runner_wins_and_another_core_gets_its_machine():
    """The Corstone-300's M55 keeps its runner (the plan's placement); an M4 program compiled for
    it goes to QEMU's own Cortex-M4 with that machine's memory map; pico2 (M33) to the AN505."""
    c300 = load_platform("corstone300")
    platform, config = qemu_runner(c300, "cortex-m55")
    assert platform is c300 and not config.machine_map
    platform, config = qemu_runner(c300, "cortex-m4")
    assert (platform.name, config.qemu_machine, config.machine_map) == (
        "mps2-an386", "mps2-an386", True)
    assert qemu_runner(load_platform("pico2"))[1].qemu_machine == "mps2-an505"


def _flat_view(machine: str) -> list[tuple[int, int]]:
    """[start, end) of the memory QEMU backs in the CPU's address space (`info mtree -f`):
    RAM, ROM and the TrustZone MPCs' windows onto them; adjacent ranges merged."""
    from kernels.native.toolchains import find_qemu

    text = subprocess.run([str(find_qemu()), "-M", machine, "-S", "-nographic", "-monitor",
                           "stdio", "-serial", "none"], input="info mtree -f\nquit\n",
                          capture_output=True, text=True, timeout=30).stdout
    views = text.split("FlatView #")
    view = next((v for v in views if 'AS "cpu-secure-memory-0"' in v), None) or next(
        v for v in views if 'AS "cpu-memory-0"' in v)
    ranges = sorted(
        (int(m[1], 16), int(m[2], 16) + 1) for m in re.finditer(
            r"^\s+([0-9a-f]{16})-([0-9a-f]{16}) \(prio -?\d+, (?:ram|rom|i/o)\): "
            r"(?!nvic)(\S*(?:ram|rom|sram|itcm|dtcm|tz-mpc-upstream|DDR)\S*)", view, re.M))
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


@pytest.mark.parametrize("name", sorted(machines()))
def test_each_machines_memory_is_memory_qemu_backs(name):
    """Every region a machine YAML lists is memory in the CPU's view of that QEMU machine."""
    qemu_or_missing()
    backed = _flat_view(name)
    for region in machines()[name].memory:
        end = region.base_address + region.size_bytes
        assert any(start <= region.base_address and end <= stop for start, stop in backed), (
            f"{name}: {region.name} {region.base_address:#x}+{region.size_bytes:#x} is not "
            f"backed: {[(hex(a), hex(b)) for a, b in backed]}")


def _verify_on_its_machine(compiles, platform, cpu, machine, core_text, model="ds-cnn"):
    from orchestrator.device_runs.combined import verify_all

    qemu_or_missing()
    pte = compiles.get(model, platform, "none", cpu, write=True)[1]
    verdict = verify_all(pte, samples=2, methods=("twin", "QEMU Cortex-M55"))
    qemu = next(r for r in verdict.results if r.name == "QEMU Cortex-M55")
    assert qemu.outcome == "passed", qemu.detail
    assert f"({core_text})" in qemu.detail and "byte-exact against the twin" in qemu.detail
    assert qemu.report["instructions"] > 0
    assert f"memory: QEMU {machine}'s own memory map" in qemu.text
    # The report names the core that executed it, not the Corstone-300's M55
    ran = core_text.split("QEMU's ")[-1].split(" ")[0] if "build" in core_text \
        else core_text.split(" ")[0]
    assert qemu.shown.startswith(f"QEMU {ran}"), qemu.shown
    assert f"  {qemu.shown}: passed: " in verdict.render_text()
    assert f"PASSED by {qemu.shown} (device code)" in verdict.verdict
    return qemu


@pytest.mark.parametrize("platform,cpu,machine,core_text", DEFAULT_TIERS,
                         ids=[f"{p}-{c or 'default'}" for p, c, _, _ in DEFAULT_TIERS])
def test_a_cpu_only_program_passes_on_its_own_cores_qemu_machine(compiles, platform, cpu,
                                                                   machine, core_text):
    _verify_on_its_machine(compiles, platform, cpu, machine, core_text)


@pytest.mark.tiers
@pytest.mark.parametrize("platform,cpu,machine,core_text", OPT_IN_TIERS,
                         ids=[f"{p}-{c or 'default'}" for p, c, _, _ in OPT_IN_TIERS])
def test_a_stand_in_cores_build_passes_and_says_what_ran_it(compiles, platform, cpu, machine,
                                                            core_text):
    qemu = _verify_on_its_machine(compiles, platform, cpu, machine, core_text)
    if "build" in core_text:
        assert "core: QEMU has no Cortex-M" in qemu.text


@pytest.mark.tiers
@pytest.mark.parametrize("cpu", ("cortex-m3", "cortex-m4", "cortex-m7", "cortex-m33"))
@pytest.mark.parametrize("model", MLPERF_TINY)
def test_every_mlperf_tiny_model_passes_on_every_tiers_machine(compiles, model, cpu):
    machine = machine_for_core(cpu)
    tier = cores()[cpu].tier
    text = f"{cpu.replace('cortex-m', 'Cortex-M')}{' + DSP' if tier == 'dsp' else ' (scalar)'}"
    _verify_on_its_machine(compiles, "corstone300", cpu, machine.name,
                           f"{text} on QEMU {machine.name}", model)


def test_the_dsp_paths_one_extra_check_is_cmsis_nns_avgpool_buffer():
    """arm_avgpool_s8 refuses a missing buffer where arm_avgpool_s8_get_buffer_size is non-zero:
    the catalogue's size is CMSIS-NN's own for the DSP backend, and zero on the C and MVE paths
    (executorch's cmsis_nn bindings, the sizes upstream's Cortex-M pass gives the scratch)."""
    from executorch.backends.cortex_m.library import cmsis_nn

    from kernels.catalogue import dsp_avgpool_scratch_refusal

    backend, a8w8 = cmsis_nn.Backend, cmsis_nn.DataType.A8W8
    for channels in (1, 12, 64):
        def size(which):
            return cmsis_nn.avgpool_buffer_size(which, a8w8, dim_dst_width=5, ch_src=channels)
        assert dsp_avgpool_scratch_refusal(channels, 0)["needed"] == size(backend.DSP)
        assert size(backend.SCALAR) == size(backend.MVE) == 0
        assert dsp_avgpool_scratch_refusal(channels, size(backend.DSP)) is None


def _avg_pool_node(scratch_bytes: int):
    import torch
    from executorch.exir.dialects._ops import ops as exir_ops

    graph = torch.fx.Graph()
    source, scratch = graph.placeholder("x"), graph.placeholder("scratch")
    source.meta["val"] = torch.empty(1, 64, 25, 5, dtype=torch.int8)
    scratch.meta["val"] = torch.empty(scratch_bytes, dtype=torch.uint8)
    return graph.call_function(exir_ops.edge.cortex_m.quantized_avg_pool2d.default,
                               (source, [25, 5], [25, 5], [0, 0], False, 0, 1 << 30, 0, scratch))


def test_a_dsp_plan_names_an_average_pool_its_dsp_path_would_refuse():
    """An average pool whose scratch is empty (sized for another tier) is a device fault on the
    DSP tier, where the host's C path (compile's device check) accepts it; not on the others."""
    from orchestrator.planning.placement import tier_faults

    (fault,) = tier_faults(_avg_pool_node(0), "dsp")
    assert fault.key == "dsp-avgpool-scratch"
    assert "256 bytes (64 channels x 4)" in fault.message
    assert "ARM_CMSIS_NN_ARG_ERROR" in fault.message
    assert tier_faults(_avg_pool_node(0), "scalar") == tier_faults(_avg_pool_node(0), "mve") == ()
    assert tier_faults(_avg_pool_node(256), "dsp") == ()


def test_a_release_firmware_is_built_for_the_programs_core_not_the_platforms(compiles, tmp_path):
    """A Corstone-300 program compiled for the Cortex-M4: `orchestrate firmware` builds the
    board recipe with the M4's flags (CMSIS-NN's DSP path, the tier the plan and the scratch
    sizes were made for), not the platform runner's M55; QEMU's M55 machine does not run it."""
    from orchestrator.firmware import make_firmware

    qemu_or_missing()
    pte = compiles.get("ds-cnn", "corstone300", "none", "cortex-m4", write=True)[1]
    made = make_firmware(pte, tmp_path / "fw", build=False)
    cmake = (made.folder / "CMakeLists.txt").read_text()
    assert "set(CPU_FLAGS -mcpu=cortex-m4 -mfloat-abi=hard -mfpu=fpv4-sp-d16 -mthumb)" in cmake
    assert made.record["cpu"] == "cortex-m4" and made.record["qemu_runs_it"] is False


@pytest.mark.tiers
def test_pico2_release_firmware_runs_as_its_check_copy_on_the_an505(compiles, tmp_path):
    """`firmware --run` for the pico2 (whose 512 KiB SRAM QEMU's AN505 does not back): the
    project is written for the pico2's memory, and a copy of it built for the AN505's memory
    map runs on QEMU's Cortex-M33, its output bytes equal to the twin's, and the report says
    which copy ran."""
    from orchestrator.firmware import firmware_run_lines, make_firmware

    qemu_or_missing()
    pte = compiles.get("ds-cnn", "pico2", "none", None, write=True)[1]
    made = make_firmware(pte, tmp_path / "fw", run=True)
    assert "ORIGIN = 0x20000000" in (made.folder / "memory.ld").read_text()
    assert made.record["qemu_check"] == "qemu-mps2-an505"
    lines, passed = firmware_run_lines(made.folder, pte)
    assert passed, lines
    assert "QEMU mps2-an505: the project's check copy" in lines[0]
    assert "not pico2's layout" in lines[0]
