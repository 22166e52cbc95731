"""What a platform says about building firmware for it, read into the native build's plain data.

A platform with a runner of its own has `runner/firmware.yaml` beside its YAML: the core the
firmware is built for (its compiler flags come from the core table, kernels/native/cores.yaml),
which regions hold code and data, which core and machine QEMU runs it on (the Corstone-320's
Cortex-M85 build runs on the AN547's M55: the same Armv8.1-M + MVE architecture, see its
firmware.yaml), which NPU families its semihosting bridge serves, and what QEMU models. A
platform without one gets the generic Armv8-M board recipe read off its YAML, for `orchestrate
firmware`'s projects. `build_firmware` turns the runner recipe and the platform's memory regions
into a `RunnerSpec` and hands it to the build (kernels/native/runner.py).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kernels.native.cores import core, cores
from kernels.native.errors import QemuUnavailable
from kernels.native.linker import Region
from kernels.native.runner import Firmware, RunnerSpec, build_runner
from platforms.platform import MemoryRegion, Platform, load_platform
from platforms.runner_protocol import MAILBOX

FIRMWARE_CONFIG = "firmware.yaml"
# The board support a platform without a runner of its own builds with: Armv8-M generic.
GENERIC_BOARD = Path(__file__).resolve().parent / "corstone300" / "runner"
_GENERIC_STACK_BYTES = 16384


class NoRunnerForPlatform(QemuUnavailable):
    """The platform has no runner firmware recipe or QEMU machine."""


class NoEthosUInQemu(QemuUnavailable):
    """The program has Ethos-U delegates and QEMU models no Ethos-U: nothing is run."""



@dataclass(frozen=True)
class QemuMemory:
    name: str
    base_address: int
    size_bytes: int
    writable: bool


@dataclass(frozen=True)
class FirmwareConfig:
    """platforms/<platform>/runner/firmware.yaml."""

    runner_dir: Path  # the folder of firmware.yaml
    sources_dir: Path  # the runner's sources (`sources:`, default the same folder)
    cpu: str  # the core the firmware is built for (the platform's)
    qemu_cpu: str  # the core QEMU's machine models, which runs it
    cpu_note: str  # why running that build on that core is sound ("" when they are the same)
    npu_products: Mapping[str, str]  # NPU family served by the bridge -> the driver's define
    npu_base_address: int  # the NPU's register block on the platform (the bridge touches none)
    cpu_flags: tuple[str, ...]  # the core's, from the core table
    optimization: str
    cmsis_nn_optimization: str
    code_regions: tuple[str, ...]
    boot_region: str  # where the reset vector table must lie (the core boots from it)
    data_region: str
    stack_bytes: int
    heap_region: str
    heap_bytes: int
    runtime_region: str
    default_program_region: str
    default_planned_region: str
    qemu_machine: str
    qemu_secure_alias_offset: int
    qemu_memory: tuple[QemuMemory, ...]
    qemu_args: tuple[str, ...]
    text: str  # the file, hashed into the build key
    npu_irq: int | None = None  # the NPU's external interrupt (npu.irq), for firmware on silicon
    # The memory map is a QEMU machine's (platforms/qemu_machines/), not the compile platform's:
    # the plan's memory placement names regions this machine does not have.
    machine_map: bool = False

    @property
    def core_text(self) -> str:
        """What ran the code, e.g. "Cortex-M55 + MVE on QEMU mps3-an547", "Cortex-M4 + DSP on
        QEMU mps2-an386" or, for a build of another core, "Cortex-M85 build (Armv8.1-M, MVE) on
        QEMU's Cortex-M55 (mps3-an547)"."""
        built = core(self.cpu)
        if self.cpu == self.qemu_cpu:
            return f"{core_name(self.cpu)}{_TIER_TEXT[built.tier]} on QEMU {self.qemu_machine}"
        return (f"{core_name(self.cpu)} build ({_architecture_text(built.architecture)}"
                f"{_BUILD_TIER_TEXT[built.tier]}) on QEMU's {core_name(self.qemu_cpu)} "
                f"({self.qemu_machine})")

    def method(self, platform_name: str) -> str:
        where = self.qemu_machine if self.machine_map else platform_title(platform_name)
        return f"{where} CPU in QEMU: real kernels, no timing" \
            if self.cpu == self.qemu_cpu else \
            (f"{where} {core_name(self.cpu)} build in QEMU's "
             f"{core_name(self.qemu_cpu)}: real kernels, no timing")

    def npu_product(self, npu: str | None) -> str | None:
        """The NPU family of accelerator `npu` ("ethos-u55-128" -> "ethos-u55") when the
        bridge serves it, else None."""
        return next((p for p in self.npu_products if (npu or "").startswith(p + "-")), None)

    def qemu_backing(self, address: int, size_bytes: int) -> QemuMemory | None:
        """The QEMU memory that holds [address, address + size), directly or via its secure alias."""
        for memory in self.qemu_memory:
            for base in (memory.base_address, memory.base_address + self.qemu_secure_alias_offset):
                if base <= address and address + size_bytes <= base + memory.size_bytes:
                    return memory
        return None


_TIER_TEXT = {"scalar": " (scalar)", "dsp": " + DSP", "mve": " + MVE"}
_BUILD_TIER_TEXT = {"scalar": ", scalar", "dsp": " + DSP", "mve": " + MVE"}


def _architecture_text(architecture: str) -> str:
    """ "armv8.1-m.main" -> "Armv8.1-M", "armv8-m.base" -> "Armv8-M Baseline"."""
    name, _, profile = architecture.partition("-m")
    name = f"{name.replace('armv', 'Armv').replace('7e', '7E')}-M"
    return f"{name} Baseline" if profile == ".base" else name


def core_name(cpu: str) -> str:
    """ "cortex-m55" -> "Cortex-M55"."""
    if not cpu.startswith("cortex-m"):
        return cpu
    return cpu.replace("cortex-m", "Cortex-M").replace("plus", "+").replace("35p", "35P")


def platform_title(name: str) -> str:
    """ "corstone300" -> "Corstone-300"."""
    match = re.fullmatch(r"corstone(\d+)", name)
    return f"Corstone-{match[1]}" if match else name


def load_firmware_config(platform: Platform) -> FirmwareConfig:
    """The runner recipe beside the platform YAML (`runner/firmware.yaml`)."""
    runner_dir = Path(platform.source_file).resolve().parent / "runner"
    path = runner_dir / FIRMWARE_CONFIG
    if not path.is_file():
        raise NoRunnerForPlatform(
            f"platform {platform.name} has no runner firmware ({path} does not exist)")
    text = path.read_text()
    data = yaml.safe_load(text)
    qemu = data["qemu"]
    npu = data.get("npu") or {}
    sources_dir = (runner_dir / str(data.get("sources", "."))).resolve()
    if not sources_dir.is_relative_to(Path(__file__).resolve().parent):
        raise NoRunnerForPlatform(f"{path}: sources {data.get('sources')!r} lies outside the "
                                  "installed platforms")
    cpu = str(data.get("cpu", platform.cpu_default))
    config = FirmwareConfig(
        runner_dir=runner_dir,
        sources_dir=sources_dir,
        cpu=cpu,
        qemu_cpu=str(qemu.get("cpu", data.get("cpu", platform.cpu_default))),
        cpu_note=" ".join(str(qemu.get("why_this_core", "")).split()),
        npu_products={str(k): str(v) for k, v in (npu.get("products") or {}).items()},
        npu_base_address=int(npu.get("base_address", 0)),
        cpu_flags=_core_flags(path, cpu),
        optimization=data["optimization"],
        cmsis_nn_optimization=data["cmsis_nn_optimization"],
        code_regions=tuple(data["code_regions"]),
        boot_region=str(data.get("boot_region", data["code_regions"][0])),
        data_region=data["data_region"],
        stack_bytes=int(data["stack_bytes"]),
        heap_region=data["heap_region"],
        heap_bytes=int(data["heap_bytes"]),
        runtime_region=data["runtime_region"],
        default_program_region=data["default_program_region"],
        default_planned_region=data["default_planned_region"],
        qemu_machine=qemu["machine"],
        qemu_secure_alias_offset=int(qemu["secure_alias_offset"]),
        qemu_memory=tuple(
            QemuMemory(m["name"], int(m["base_address"]), int(m["size_bytes"]), bool(m["writable"]))
            for m in qemu["memory"]
        ),
        qemu_args=tuple(str(a) for a in qemu["args"]),
        text=text,
        npu_irq=int(npu["irq"]) if npu.get("irq") is not None else None,
    )
    for name in (*config.code_regions, config.boot_region, config.data_region, config.heap_region, config.runtime_region,
                 config.default_program_region, config.default_planned_region):
        platform.memory(name)  # raises PlatformError naming the region
    return config


def ram_regions(platform: Platform, config: FirmwareConfig) -> tuple[MemoryRegion, ...]:
    """The platform's regions QEMU backs with writable memory: what the firmware may link into
    and allocate from."""
    regions = []
    for region in platform.memories:
        backing = config.qemu_backing(region.base_address, region.size_bytes)
        if region.kind != "flash" and backing is not None and backing.writable:
            regions.append(region)
    return tuple(regions)


def _core_flags(path: Path, cpu: str) -> tuple[str, ...]:
    try:
        return core(cpu).flags
    except KeyError as error:
        raise NoRunnerForPlatform(f"{path}: {error.args[0]}") from None


def runner_spec(platform: Platform, config: FirmwareConfig,
                npu_product: str | None = None) -> RunnerSpec:
    """The runner build's input: the recipe, the RAM regions QEMU backs writable, the mailbox,
    and with `npu_product` the Ethos-U core driver's define for it."""
    if npu_product is not None and npu_product not in config.npu_products:
        raise NoEthosUInQemu(f"the {platform.name} runner's NPU bridge serves "
                             f"{', '.join(config.npu_products) or 'no NPU'}, not {npu_product}")
    return RunnerSpec(
        platform=platform.name,
        described_by=(f"{platform.source_file.name}" if config.machine_map else
                      f"{platform.source_file.name} and {config.runner_dir.name}/{FIRMWARE_CONFIG}"),
        core=core(config.cpu),
        optimization=config.optimization,
        cmsis_nn_optimization=config.cmsis_nn_optimization,
        cpu_hz=platform.cpu_hz,
        sources_dir=config.sources_dir,
        regions=tuple(Region(r.name, r.base_address, r.size_bytes)
                      for r in ram_regions(platform, config)),
        code_regions=config.code_regions,
        boot_region=config.boot_region,
        data_region=config.data_region,
        heap_region=config.heap_region,
        stack_bytes=config.stack_bytes,
        heap_bytes=config.heap_bytes,
        mailbox_bytes=MAILBOX.size,
        recipe_text=config.text,
        npu_define=config.npu_products[npu_product] if npu_product else None,
        npu_base_address=config.npu_base_address,
    )


def build_firmware(
    operators: Iterable[str],
    platform: Platform | str = "corstone300",
    *,
    third_party: str | Path | None = None,
    cache_dir: str | Path | None = None,
    jobs: int | None = None,
    trace: bool = False,
    npu_product: str | None = None,
) -> Firmware:
    """Build (or take from the cache) the platform's runner firmware that registers `operators`;
    with `trace`, a variant that reports every instruction's ticks and output CRCs; with
    `npu_product` ("ethos-u55" or "ethos-u65"), one that links ExecuTorch's EthosUBackend and
    the Ethos-U core driver and hands each command stream to the host (runner/npu/).

    Raises QemuUnavailable subclasses when the build cannot happen here (no toolchain, no
    sources, an operator without a kernel) and FirmwareBuildError when it fails."""
    platform = load_platform(platform) if isinstance(platform, str) else platform
    config = load_firmware_config(platform)
    return build_runner(operators, runner_spec(platform, config, npu_product),
                        third_party=third_party, cache_dir=cache_dir, jobs=jobs, trace=trace)


@dataclass(frozen=True)
class BoardRecipe:
    """How a project is built for a platform: the platform's runner recipe
    (runner/firmware.yaml) where it has one, else a generic one read off the platform YAML."""

    cpu: str
    cpu_flags: tuple[str, ...]
    optimization: str  # the check profile's, and the runtime's in release when not -Os
    code_regions: tuple[str, ...]  # code goes to the first
    boot_region: str  # where the vector table lies
    data_region: str  # .data, .bss, the stack
    runtime_region: str  # the method and temp pools
    stack_bytes: int
    sources_dir: Path  # the board support files
    source: str  # where this recipe comes from, for firmware.json and the docs
    qemu_runs_it: bool  # the platform's QEMU machine runs this build (run_on_qemu)
    npu_products: dict[str, str] = field(default_factory=dict)  # family -> driver define
    npu_base_address: int = 0
    npu_irq: int | None = None  # the NPU's external interrupt number


def board_recipe(platform: Platform, cpu: str | None = None) -> BoardRecipe:
    """The platform's runner recipe, or a generic Armv8-M one from its YAML: code in the regions
    that hold code (the first is the boot region), data and the pools in the first RAM region
    that holds arenas (a TCM before an SRAM), the Corstone-300 runner's board support (reset
    handler, semihosting console, SysTick counters: generic, replaced for a product).

    `cpu`, the core the program was compiled for, when it is not the recipe's: the same recipe
    built with that core's flags (the board support builds for every core of the core table),
    so the kernels are the program's tier's; the platform's QEMU machine, which models another
    core, does not run it."""
    recipe = _platform_recipe(platform)
    if cpu is None or cpu == recipe.cpu:
        return recipe
    return dataclasses.replace(
        recipe, cpu=cpu, cpu_flags=_core_flags(Path(platform.source_file), cpu),
        qemu_runs_it=False,
        source=f"{recipe.source}, built for the program's {cpu} instead of its {recipe.cpu}")


def _platform_recipe(platform: Platform) -> BoardRecipe:
    try:
        config = load_firmware_config(platform)
    except NoRunnerForPlatform:
        config = None
    if config is not None:
        return BoardRecipe(config.cpu, tuple(config.cpu_flags), config.optimization,
                           tuple(config.code_regions), config.boot_region, config.data_region,
                           config.runtime_region, config.stack_bytes, config.sources_dir,
                           f"{config.runner_dir.name}/firmware.yaml of {platform.name}", True,
                           dict(config.npu_products), config.npu_base_address,
                           config.npu_irq)
    # The generic board support's reset handler sets MSPLIM: only cores that have it.
    generic = [name for name, entry in cores().items() if entry.msplim]
    cpu = platform.cpu_default
    if cpu not in generic:
        raise NoRunnerForPlatform(
            f"platform {platform.name} has no runner recipe and its CPU {cpu} is not one the "
            f"generic board support builds for ({', '.join(generic)}: Armv8-M mainline); add "
            f"{Path(platform.source_file).parent}/runner/firmware.yaml")
    code = [r.name for r in platform.memories if r.may_hold("code")]
    ram = sorted((r for r in platform.memories if r.kind != "flash" and r.may_hold("arena")),
                 key=lambda r: r.kind != "tcm")
    if not code or not ram:
        raise NoRunnerForPlatform(
            f"platform {platform.name} names no region that holds code"
            if not code else f"platform {platform.name} names no RAM region that holds arenas")
    return BoardRecipe(cpu, core(cpu).flags, "-O2", tuple(code), code[0], ram[0].name,
                       ram[0].name, _GENERIC_STACK_BYTES, GENERIC_BOARD,
                       f"generic Armv8-M recipe from {Path(platform.source_file).name} "
                       "(no runner/firmware.yaml)", False)
