"""QEMU's own Cortex-M machines as data: one YAML per machine in this folder (the memory QEMU
backs, where the runner's code, data and the program go, the boot region, SysTick's clock, QEMU's
arguments, and the cores whose builds it runs, each with what running it there proves).

`qemu_runner(platform, cpu)` chooses what runs a program compiled for `platform` and core `cpu`
on QEMU: the platform's own runner (its runner/firmware.yaml, with the plan's memory placement)
when it is built for that core, else the machine that runs the core's build, with the machine's
memory map (the plan's placement names the platform's regions, which that machine does not have;
the report says so). The runner's sources are the one tree the Corstone-300 runner uses
(platforms/corstone300/runner), built with the program's core's flags (kernels/native/cores.yaml),
so a Cortex-M4 program runs CMSIS-NN's DSP path on QEMU's Cortex-M4.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType

from kernels.native.cores import cores
from kernels.safe_files import load_yaml
from platforms.firmware_recipe import (GENERIC_BOARD, BoardRecipe, FirmwareConfig,
                                       NoRunnerForPlatform, QemuMemory, load_firmware_config)
from platforms.platform import MemoryRegion, Platform

MACHINES_DIR = Path(__file__).resolve().parent
_KEYS = ("machine", "cpu", "runs", "cpu_hz", "memory", "code_regions", "boot_region",
         "data_region", "stack_bytes", "heap_region", "heap_bytes", "runtime_region",
         "planned_region", "program_region", "args")


class NoQemuMachineForCore(NoRunnerForPlatform):
    """No QEMU machine runs a build of the core."""


@dataclass(frozen=True)
class QemuMachine:
    """One QEMU machine (platforms/qemu_machines/<machine>.yaml)."""

    name: str  # QEMU's -M name
    cpu: str  # the core QEMU models (fixed per machine)
    runs: Mapping[str, str]  # core -> what running its build here proves ("" for its own)
    cpu_hz: int  # SysTick's processor clock
    memory: tuple[QemuMemory, ...]
    code_regions: tuple[str, ...]
    boot_region: str
    data_region: str
    stack_bytes: int
    heap_region: str
    heap_bytes: int
    runtime_region: str
    planned_region: str
    program_region: str
    args: tuple[str, ...]
    source_file: Path
    text: str


def _read(path: Path) -> QemuMachine:
    data = load_yaml(path)
    missing = [key for key in _KEYS if key not in data]
    if missing:
        raise NoRunnerForPlatform(f"{path}: missing {', '.join(missing)}")
    known = cores()
    unknown = [name for name in (data["cpu"], *data["runs"]) if name not in known]
    if unknown:
        raise NoRunnerForPlatform(f"{path}: unknown core {', '.join(map(str, unknown))} "
                                  f"(kernels/native/cores.yaml has {', '.join(known)})")
    memory = tuple(QemuMemory(str(m["name"]), int(m["base_address"]), int(m["size_bytes"]),
                              bool(m["writable"])) for m in data["memory"])
    machine = QemuMachine(
        name=str(data["machine"]), cpu=str(data["cpu"]),
        runs=MappingProxyType({str(k): " ".join(str(v or "").split())
                               for k, v in data["runs"].items()}),
        cpu_hz=int(data["cpu_hz"]), memory=memory,
        code_regions=tuple(str(r) for r in data["code_regions"]),
        boot_region=str(data["boot_region"]), data_region=str(data["data_region"]),
        stack_bytes=int(data["stack_bytes"]), heap_region=str(data["heap_region"]),
        heap_bytes=int(data["heap_bytes"]), runtime_region=str(data["runtime_region"]),
        planned_region=str(data["planned_region"]), program_region=str(data["program_region"]),
        args=tuple(str(a) for a in data["args"]), source_file=path, text=path.read_text())
    names = {m.name for m in memory}
    for region in (*machine.code_regions, machine.boot_region, machine.data_region,
                   machine.heap_region, machine.runtime_region, machine.planned_region,
                   machine.program_region):
        if region not in names:
            raise NoRunnerForPlatform(f"{path}: no memory {region!r} ({', '.join(names)})")
    return machine


@cache
def machines() -> Mapping[str, QemuMachine]:
    """Every machine of this folder, by QEMU name."""
    found = (_read(path) for path in sorted(MACHINES_DIR.glob("*.yaml")))
    return MappingProxyType({machine.name: machine for machine in found})


def machine_for_core(cpu: str) -> QemuMachine:
    """The machine that runs `cpu`'s build: the one modelling that core, else the one whose
    `runs:` names it. NoQemuMachineForCore names the cores some machine runs."""
    table = machines()
    for machine in table.values():
        if machine.cpu == cpu:
            return machine
    for machine in table.values():
        if cpu in machine.runs:
            return machine
    covered = sorted({core for machine in table.values() for core in (machine.cpu, *machine.runs)})
    raise NoQemuMachineForCore(
        f"QEMU has no machine that runs a {cpu} build (platforms/qemu_machines/ covers "
        f"{', '.join(covered)})")


def machine_platform(machine: QemuMachine) -> Platform:
    """The machine's memory as a Platform (what the harness places the program in): every
    memory QEMU backs, writable ones as SRAM, read-only ones as flash."""
    regions = tuple(
        MemoryRegion(m.name, m.base_address, m.size_bytes, "sram" if m.writable else "flash",
                     False, frozenset(("code", "weights", "arena", "io")) if m.writable
                     else frozenset(("weights",)),
                     f"QEMU {machine.name} ({machine.source_file.name})")
        for m in machine.memory)
    return Platform(
        name=machine.name, description=f"QEMU {machine.name}", source_file=machine.source_file,
        cpu_default=machine.cpu, cpu_hz=machine.cpu_hz,
        cpu_hz_source=f"SysTick's clock on QEMU's {machine.name}", npu_options=(),
        npu_default=None, npu_hz=0, npu_hz_source="", vela_config_ini="",
        vela=MappingProxyType({}), memories=regions, fvp=MappingProxyType({}),
        fvp_load_address=None, fvp_load_region=None)


def machine_config(machine: QemuMachine, cpu: str) -> FirmwareConfig:
    """The runner recipe for `cpu`'s build on `machine`."""
    if cpu != machine.cpu and cpu not in machine.runs:
        raise NoQemuMachineForCore(f"QEMU's {machine.name} ({machine.cpu}) does not run a {cpu} "
                                   "build")
    return FirmwareConfig(
        runner_dir=MACHINES_DIR, sources_dir=GENERIC_BOARD, cpu=cpu, qemu_cpu=machine.cpu,
        cpu_note=machine.runs.get(cpu, ""), npu_products=MappingProxyType({}),
        npu_base_address=0, cpu_flags=cores()[cpu].flags, optimization="-O2",
        # CMSIS-NN's own CMakeLists.txt default (CMSIS_OPTIMIZATION_LEVEL), as every runner.
        cmsis_nn_optimization="-Ofast", code_regions=machine.code_regions,
        boot_region=machine.boot_region, data_region=machine.data_region,
        stack_bytes=machine.stack_bytes, heap_region=machine.heap_region,
        heap_bytes=machine.heap_bytes, runtime_region=machine.runtime_region,
        default_program_region=machine.program_region,
        default_planned_region=machine.planned_region, qemu_machine=machine.name,
        qemu_secure_alias_offset=0, qemu_memory=machine.memory, qemu_args=machine.args,
        text=machine.text, machine_map=True)


def qemu_runner(platform: Platform, cpu: str | None = None) -> tuple[Platform, FirmwareConfig]:
    """What runs a program compiled for `platform` and core `cpu` (the platform's default when
    None) on QEMU: the platform's own runner when it is built for that core, else the QEMU
    machine for the core with its own memory map. Raises NoRunnerForPlatform (a QemuUnavailable)
    when neither exists."""
    cpu = cpu or platform.cpu_default
    try:
        config = load_firmware_config(platform)
    except NoRunnerForPlatform:
        config = None
    if config is not None and config.cpu == cpu:
        return platform, config
    machine = machine_for_core(cpu)
    return machine_platform(machine), machine_config(machine, cpu)


def machine_recipe(machine: QemuMachine, cpu: str) -> BoardRecipe:
    """How `orchestrate firmware` builds a project for `machine` (its QEMU check copy): the
    machine's code, data and pool regions, `cpu`'s flags, the runner's board support."""
    config = machine_config(machine, cpu)
    return BoardRecipe(cpu, config.cpu_flags, config.optimization, config.code_regions,
                       config.boot_region, config.data_region, config.runtime_region,
                       config.stack_bytes, GENERIC_BOARD,
                       f"QEMU {machine.name} ({machine.source_file.name})", True)
