"""A platform is one YAML file read into frozen values: CPU, NPU options, memories, clocks, Vela
system config and memory mode, and the FVP that simulates it.

Adding a SoC adds a YAML file, never code: everything below is generic over what the file says,
and every check of the file raises `PlatformError` with one line naming the file and the key.
"""

from __future__ import annotations

import configparser
import dataclasses
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from kernels.native.cores import cores
from kernels.safe_files import DataFileError, load_yaml


_PACKAGE_DIR = Path(__file__).resolve().parent
_PLATFORM_FILE = "platform.yaml"

MEMORY_KINDS = ("tcm", "sram", "flash", "ddr")
MEMORY_USES = ("code", "weights", "arena", "npu_scratch", "io")

# Placeholders an FVP argument template may use; `fvp_command` fills them.
FVP_PLACEHOLDERS = ("macs", "elf", "bpte", "load_address", "timeout_s")
_FVP_REQUIRED_PLACEHOLDERS = ("elf", "bpte", "timeout_s")

# The cmsis_nn backend each core runs best, mirroring the most capable entry of
# executorch.backends.cortex_m.target_config._SUPPORTED_BACKENDS (tests check the two agree).
# scalar: Armv6-M / Armv7-M / Armv8-M Baseline; dsp: the DSP extension of Armv7E-M or
# Armv8-M Mainline; mve: Helium (Armv8.1-M Mainline). Read from the core table
# (kernels/native/cores.yaml), whose flags give each core's firmware that same tier.
CPU_TIERS: Mapping[str, str] = MappingProxyType({name: core.tier for name, core in cores().items()})

_NPU_NAME = re.compile(r"^ethos-(u\d+)-(\d+)$")


class PlatformError(ValueError):
    """A bad platform name, platform file, NPU or CPU name: one line naming the value and the allowed ones.

    The CLI reports it as a user error (exit 2; orchestrator/errors.py maps it)."""


class VelaConfig(NamedTuple):
    """The Vela `--system-config` and `--memory-mode` for one NPU family (sections of vela.ini)."""

    system_config: str
    memory_mode: str


@dataclass(frozen=True)
class MemoryRegion:
    """One memory of the SoC, as the runtime's linker script and the NPU see it."""

    name: str
    base_address: int
    size_bytes: int
    kind: str  # one of MEMORY_KINDS
    npu_accessible: bool
    holds: frozenset[str]  # subset of MEMORY_USES that may be placed here
    source: str  # where the size and address come from
    # CPU cycles per byte a kernel streams from here on first touch (0 for a zero-wait TCM);
    # None: no timing declared, so the cost model keeps its calibrated flash streaming rate.
    cpu_read_cycles_per_byte: float | None = None
    cpu_read_source: str = ""

    def may_hold(self, use: str) -> bool:
        if use not in MEMORY_USES:
            raise PlatformError(f"unknown memory use {use!r}; allowed: {', '.join(MEMORY_USES)}")
        return use in self.holds


@dataclass(frozen=True)
class FvpSpec:
    """The FVP binary for one NPU family and its argument templates, one token per item."""

    binary: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Platform:
    name: str
    description: str
    source_file: Path
    cpu_default: str
    cpu_hz: int
    cpu_hz_source: str
    npu_options: tuple[str, ...]  # empty: a CPU-only part (no `npu:` in its YAML)
    npu_default: str | None  # None on a CPU-only part
    npu_hz: int  # 0 on a CPU-only part
    npu_hz_source: str
    vela_config_ini: str
    # Mappings are read-only views; they stay out of the hash (which they would break) but not
    # out of equality, so a Platform can still key a cache.
    vela: Mapping[str, VelaConfig] = field(hash=False)  # NPU family ("u55") -> Vela sections
    memories: tuple[MemoryRegion, ...]
    fvp: Mapping[str, FvpSpec] = field(hash=False)  # NPU family -> FVP
    # Where `--data` puts the .bpte (the runner is built with this ET_MODEL_PTE_ADDR) and the
    # memory that address lies in, which bounds the .bpte size; None when no FVP models the part
    # (no `fvp:` in its YAML).
    fvp_load_address: int | None
    fvp_load_region: str | None
    # Bytes of a region the firmware itself takes (stack, .data/.bss, heap), with the source of
    # each figure: a plan places nothing there. region name -> (bytes, source)
    reserved: Mapping[str, tuple[int, str]] = field(default_factory=lambda: MappingProxyType({}),
                                                    hash=False)
    # The program I/O types its firmware accepts (`--io auto` chooses among them) and the source.
    firmware_io: tuple[str, ...] = ("float",)
    firmware_io_source: str = "not declared in the platform YAML: float only"
    # `cpu: calibration_costs:` the CPU calibration its plans use (cost_models/
    # profile_calibration.py): the absolute path of a file inside the platform file's folder,
    # or a shipped calibration's name; None: the cost model's own figures.
    cpu_calibration: str | None = None

    def validate_npu(self, npu_name: str) -> str:
        """Return the NPU name in upstream spelling if this platform offers it, else raise."""
        if not self.npu_options:
            raise PlatformError(f"NPU {npu_name!r} is not available on {self.name}: it has no "
                                "NPU (CPU only: --npu none)")
        normalized = npu_name.strip().lower()
        if normalized not in self.npu_options:
            elsewhere = [name for name in list_platforms() if name != self.name
                         and normalized in load_platform(name).npu_options]
            raise PlatformError(
                f"NPU {npu_name!r} is not available on {self.name}; "
                f"allowed: {', '.join(self.npu_options)}"
                + ("; offered by " + ", ".join(f"--platform {name}" for name in elsewhere)
                   if elsewhere else ""))
        return normalized

    def npu_family(self, npu_name: str) -> str:
        return parse_npu_name(self.validate_npu(npu_name))[0]

    def npu_macs(self, npu_name: str) -> int:
        return parse_npu_name(self.validate_npu(npu_name))[1]

    def vela_config(self, npu_name: str) -> VelaConfig:
        return self.vela[self.npu_family(npu_name)]

    def fvp_spec(self, npu_name: str) -> FvpSpec:
        if not self.fvp:
            raise PlatformError(f"no FVP models {self.name} (its platform YAML has no fvp section)")
        return self.fvp[self.npu_family(npu_name)]

    def memory(self, region_name: str) -> MemoryRegion:
        for region in self.memories:
            if region.name == region_name:
                return region
        raise PlatformError(
            f"{self.name} has no memory {region_name!r}; "
            f"it has: {', '.join(r.name for r in self.memories)}"
        )

    def regions_holding(self, use: str) -> tuple[MemoryRegion, ...]:
        return tuple(r for r in self.memories if r.may_hold(use))

    def with_clocks(self, cpu_hz: int | None = None, npu_hz: int | None = None) -> Platform:
        """The same platform at other clocks, e.g. a product's silicon instead of the FPGA image."""
        changes: dict[str, Any] = {}
        for field_name, value in (("cpu_hz", cpu_hz), ("npu_hz", npu_hz)):
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise PlatformError(f"{field_name} must be a positive integer in Hz, got {value!r}")
            changes[field_name] = value
            changes[f"{field_name}_source"] = "overridden by the user"
        return dataclasses.replace(self, **changes)


def parse_npu_name(npu_name: str) -> tuple[str, int]:
    """`ethos-u55-128` -> ("u55", 128): the family and the MAC count after the last dash."""
    match = _NPU_NAME.match(npu_name.strip().lower())
    if match is None:
        raise PlatformError(f"NPU name {npu_name!r} is not of the form ethos-u<NN>-<macs>, e.g. ethos-u55-128")
    return match.group(1), int(match.group(2))


def normalize_cpu(cpu_name: str) -> str:
    """The upstream target string (`cortex-m0plus`, `cortex-m55`, ...) for a Cortex-M core name."""
    normalized = cpu_name.strip().lower().replace("+", "plus")
    if normalized not in CPU_TIERS:
        raise PlatformError(f"unknown CPU {cpu_name!r}; allowed: {', '.join(CPU_TIERS)}")
    return normalized


def cpu_tier(cpu_name: str) -> str:
    """"scalar", "dsp" or "mve": which CMSIS-NN kernel flavour the core runs."""
    return CPU_TIERS[normalize_cpu(cpu_name)]


def list_platforms() -> tuple[str, ...]:
    """Names of the platforms shipped in this package (each a folder holding platform.yaml)."""
    return tuple(
        sorted(d.name for d in _PACKAGE_DIR.iterdir() if (d / _PLATFORM_FILE).is_file())
    )


def load_platform(name_or_path: str | Path) -> Platform:
    """A shipped platform by name (`corstone300`, `corstone-320`) or a user's SoC file by path."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")):
        path = Path(text).expanduser()
        if not path.is_file():
            raise PlatformError(f"{path}: platform file not found; give corstone300, corstone320 or the path of a platform YAML")
        return _read_platform_file(path.resolve())
    name = text.strip().lower().replace("-", "").replace("_", "")
    if name not in list_platforms():
        raise PlatformError(
            f"unknown platform {text!r}; known: {', '.join(list_platforms())}, "
            f"or a path to your own .yaml file"
        )
    return _read_platform_file(_PACKAGE_DIR / name / _PLATFORM_FILE)


def vela_ini_path(config_ini: str, relative_to: Path) -> Path:
    """Resolve a vela.ini reference the way Vela does for bundled files (`Arm/vela.ini`), else as a
    path relative to the platform file."""
    from ethosu.vela.architecture_features import CONFIG_FILES_PATH  # lazy: heavy (vela)

    bundled = Path(CONFIG_FILES_PATH) / config_ini
    if bundled.is_file():
        return bundled
    return (relative_to.parent / config_ini).resolve()


class _Reader:
    """Typed access to the parsed YAML that names the file and dotted key in every error."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, key: str, problem: str) -> PlatformError:
        return PlatformError(f"{self.path}: {key}: {problem}")

    def get(self, mapping: Any, key: str, kind: type | tuple[type, ...], where: str = "") -> Any:
        dotted = f"{where}.{key}" if where else key
        if not isinstance(mapping, dict):
            raise self.fail(where or "<top>", f"expected a mapping, got {type(mapping).__name__}")
        if key not in mapping:
            raise self.fail(dotted, "missing")
        value = mapping[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # YAML booleans are ints to Python; a size of `true` is a mistake, not 1.
        if isinstance(value, bool) and bool not in kinds:
            raise self.fail(dotted, f"expected {_kind_names(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise self.fail(dotted, f"expected {_kind_names(kinds)}, got {type(value).__name__} {value!r}")
        return value

    def positive_int(self, mapping: Any, key: str, where: str) -> int:
        value = self.get(mapping, key, int, where)
        if value <= 0:
            raise self.fail(f"{where}.{key}", f"must be positive, got {value}")
        return value

    def string_list(self, mapping: Any, key: str, where: str) -> tuple[str, ...]:
        values = self.get(mapping, key, list, where)
        for index, value in enumerate(values):
            if not isinstance(value, str):
                raise self.fail(f"{where}.{key}[{index}]", f"expected a string, got {value!r}")
        return tuple(values)


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {int: "an integer", str: "a string", bool: "true/false", list: "a list", dict: "a mapping"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _read_platform_file(path: Path) -> Platform:
    reader = _Reader(path)
    try:
        document = load_yaml(path)
    except DataFileError as error:
        raise PlatformError(f"platform file {error}") from None
    if not isinstance(document, dict):
        raise reader.fail("<top>", "expected a mapping of platform keys")

    cpu = reader.get(document, "cpu", dict)
    cpu_default = reader.get(cpu, "default", str, "cpu")
    try:
        cpu_default = normalize_cpu(cpu_default)
    except PlatformError as error:
        raise reader.fail("cpu.default", str(error)) from None

    # A part without an NPU leaves `npu:` out: it plans CPU-only.
    npu = reader.get(document, "npu", dict) if "npu" in document else None
    npu_options = () if npu is None else tuple(
        o.strip().lower() for o in reader.string_list(npu, "options", "npu"))
    if npu is not None and not npu_options:
        raise reader.fail("npu.options", "must list at least one NPU (a part without one leaves "
                          "the npu section out)")
    known_accelerators = _vela_accelerators()
    for index, option in enumerate(npu_options):
        if option not in known_accelerators:
            raise reader.fail(
                f"npu.options[{index}]",
                f"{option!r} is not an Ethos-U configuration Vela knows; allowed: {', '.join(known_accelerators)}",
            )
    npu_default = None
    if npu is not None:
        npu_default = reader.get(npu, "default", str, "npu").strip().lower()
        if npu_default not in npu_options:
            raise reader.fail("npu.default", f"{npu_default!r} is not in npu.options ({', '.join(npu_options)})")
    families = sorted({parse_npu_name(o)[0] for o in npu_options})

    config_ini = reader.get(document, "vela_config_ini", str) if "vela_config_ini" in document else "Arm/vela.ini"
    vela = _read_vela(reader, document, families, config_ini)
    memories = _read_memories(reader, document)
    fvp_specs, load_address, load_region = _read_fvp(reader, document, families, memories)
    reserved = _read_reserved(reader, document, memories)
    firmware_io, firmware_io_source = ("float",), "not declared in the platform YAML: float only"
    if "firmware_io" in document:
        section = reader.get(document, "firmware_io", dict)
        firmware_io = reader.string_list(section, "types", "firmware_io")
        for index, io in enumerate(firmware_io):
            if io not in ("float", "int8"):
                raise reader.fail(f"firmware_io.types[{index}]", f"{io!r} is not float or int8")
        firmware_io_source = reader.get(section, "source", str, "firmware_io")

    return Platform(
        name=reader.get(document, "name", str),
        description=reader.get(document, "description", str),
        source_file=path,
        cpu_default=cpu_default,
        cpu_hz=reader.positive_int(cpu, "cpu_hz", "cpu"),
        cpu_hz_source=reader.get(cpu, "source", str, "cpu"),
        npu_options=npu_options,
        npu_default=npu_default,
        npu_hz=0 if npu is None else reader.positive_int(npu, "npu_hz", "npu"),
        npu_hz_source="no NPU" if npu is None else reader.get(npu, "source", str, "npu"),
        vela_config_ini=config_ini,
        vela=MappingProxyType(vela),
        memories=memories,
        fvp=MappingProxyType(fvp_specs),
        fvp_load_address=load_address,
        fvp_load_region=load_region,
        reserved=MappingProxyType(reserved),
        firmware_io=firmware_io,
        firmware_io_source=firmware_io_source,
        cpu_calibration=_read_cpu_calibration(reader, cpu),
    )


def _read_cpu_calibration(reader: _Reader, cpu: dict) -> str | None:
    """`cpu: calibration_costs:` a file in the platform file's folder (its absolute path: a
    path the YAML names stays inside that folder), else the name of a shipped calibration
    (cost_models/data), which the plan loads and checks."""
    if "calibration_costs" not in cpu:
        return None
    given = reader.get(cpu, "calibration_costs", str, "cpu")
    folder = reader.path.parent.resolve()
    path = (folder / given).resolve()
    if folder not in path.parents:
        raise reader.fail("cpu.calibration_costs", f"{given!r} leaves the platform file's "
                          "folder; put the calibration beside the platform YAML")
    if path.is_file():
        return str(path)
    if "/" in given:
        raise reader.fail("cpu.calibration_costs", f"{given!r} not found (looked at {path}); "
                          "write it with `orchestrate calibrate`")
    return given


def _read_reserved(reader: _Reader, document: dict, memories) -> dict[str, tuple[int, str]]:
    """`reserved:` (optional): what the firmware takes of a region before any program buffer,
    e.g. `- {region: dtcm, bytes: 81920, source: ...}`."""
    if "reserved" not in document:
        return {}
    names = {m.name: m for m in memories}
    reserved: dict[str, tuple[int, str]] = {}
    for index, entry in enumerate(reader.get(document, "reserved", list)):
        where = f"reserved[{index}]"
        region = reader.get(entry, "region", str, where)
        if region not in names:
            raise reader.fail(f"{where}.region", f"{region!r} is not a memory of this platform "
                              f"(known: {', '.join(names)})")
        size = reader.positive_int(entry, "bytes", where)
        if size > names[region].size_bytes:
            raise reader.fail(f"{where}.bytes", f"{size} is more than {region}'s "
                              f"{names[region].size_bytes} bytes")
        if region in reserved:
            raise reader.fail(f"{where}.region", f"{region} is listed twice")
        reserved[region] = (size, reader.get(entry, "source", str, where))
    return reserved


def _vela_accelerators() -> tuple[str, ...]:
    # Vela's own list, so a platform cannot offer a MAC configuration Vela would refuse.
    from ethosu.vela.architecture_features import Accelerator  # lazy: heavy (vela)

    return tuple(Accelerator.member_list())


def _read_vela(reader: _Reader, document: dict, families: list[str], config_ini: str) -> dict[str, VelaConfig]:
    if not families and "vela" not in document:
        return {}  # no NPU, nothing for Vela to compile
    vela_section = reader.get(document, "vela", dict)
    ini_path = vela_ini_path(config_ini, reader.path)
    if not ini_path.is_file():
        raise reader.fail("vela_config_ini", f"{config_ini!r} not found (looked at {ini_path})")
    ini = configparser.ConfigParser()
    ini.read(ini_path)
    configs = {}
    for family in families:
        where = f"vela.{family}"
        entry = reader.get(vela_section, family, dict, "vela")
        config = VelaConfig(
            system_config=reader.get(entry, "system_config", str, where),
            memory_mode=reader.get(entry, "memory_mode", str, where),
        )
        for key, prefix, value in (
            ("system_config", "System_Config", config.system_config),
            ("memory_mode", "Memory_Mode", config.memory_mode),
        ):
            if not ini.has_section(f"{prefix}.{value}"):
                raise reader.fail(f"{where}.{key}", f"no section [{prefix}.{value}] in {ini_path}")
        configs[family] = config
    return configs


def _read_memories(reader: _Reader, document: dict) -> tuple[MemoryRegion, ...]:
    entries = reader.get(document, "memories", list)
    regions = []
    seen = set()
    for index, entry in enumerate(entries):
        where = f"memories[{index}]"
        name = reader.get(entry, "name", str, where)
        if name in seen:
            raise reader.fail(f"{where}.name", f"duplicate memory name {name!r}")
        seen.add(name)
        kind = reader.get(entry, "kind", str, where)
        if kind not in MEMORY_KINDS:
            raise reader.fail(f"{where}.kind", f"{kind!r} is not one of {', '.join(MEMORY_KINDS)}")
        holds = reader.string_list(entry, "holds", where)
        for use_index, use in enumerate(holds):
            if use not in MEMORY_USES:
                raise reader.fail(f"{where}.holds[{use_index}]", f"{use!r} is not one of {', '.join(MEMORY_USES)}")
        base_address = reader.get(entry, "base_address", int, where)
        if base_address < 0:
            raise reader.fail(f"{where}.base_address", f"must not be negative, got {base_address}")
        read_cost, read_source = None, ""
        if "cpu_read" in entry:
            timing = reader.get(entry, "cpu_read", dict, where)
            read_cost = reader.get(timing, "cycles_per_byte", (int, float), f"{where}.cpu_read")
            if isinstance(read_cost, bool) or not (0 <= read_cost < 1e6):
                raise reader.fail(f"{where}.cpu_read.cycles_per_byte",
                                  f"must be a number of cycles from 0 up, got {read_cost!r}")
            read_source = reader.get(timing, "source", str, f"{where}.cpu_read")
            extra = sorted(set(timing) - {"cycles_per_byte", "source"})
            if extra:
                raise reader.fail(f"{where}.cpu_read.{extra[0]}",
                                  "unknown key (allowed: cycles_per_byte, source)")
            read_cost = float(read_cost)
        regions.append(
            MemoryRegion(
                name=name,
                base_address=base_address,
                size_bytes=reader.positive_int(entry, "size_bytes", where),
                kind=kind,
                npu_accessible=reader.get(entry, "npu_accessible", bool, where),
                holds=frozenset(holds),
                source=reader.get(entry, "source", str, where),
                cpu_read_cycles_per_byte=read_cost,
                cpu_read_source=read_source,
            )
        )
    if not regions:
        raise reader.fail("memories", "must list at least one memory")
    return tuple(regions)


def _read_fvp(
    reader: _Reader, document: dict, families: list[str], memories: tuple[MemoryRegion, ...]
) -> tuple[dict[str, FvpSpec], int | None, str | None]:
    if "fvp" not in document:
        return {}, None, None  # no FVP models this part: verify --fvp says so
    fvp = reader.get(document, "fvp", dict)
    load_address = reader.get(fvp, "load_address", int, "fvp")
    load_region = reader.get(fvp, "load_region", str, "fvp")
    region = next((r for r in memories if r.name == load_region), None)
    if region is None:
        raise reader.fail("fvp.load_region", f"{load_region!r} is not one of the memories ({', '.join(r.name for r in memories)})")
    if not region.base_address <= load_address < region.base_address + region.size_bytes:
        raise reader.fail("fvp.load_address", f"{load_address:#x} is outside {load_region} ({region.base_address:#x}, {region.size_bytes} bytes)")

    models = reader.get(fvp, "models", dict, "fvp")
    dummy = {placeholder: "0" for placeholder in FVP_PLACEHOLDERS}
    specs = {}
    for family in families:
        where = f"fvp.models.{family}"
        entry = reader.get(models, family, dict, "fvp.models")
        templates = reader.string_list(entry, "args", where)
        tokens: list[str] = []
        for index, template in enumerate(templates):
            # Split before formatting so that a path with spaces stays one argv item.
            for token in shlex.split(template):
                try:
                    token.format(**dummy)
                except (KeyError, IndexError, ValueError) as error:
                    raise reader.fail(f"{where}.args[{index}]", f"bad placeholder in {template!r} ({error}); allowed: {', '.join(FVP_PLACEHOLDERS)}") from None
                tokens.append(token)
        joined = " ".join(tokens)
        for placeholder in _FVP_REQUIRED_PLACEHOLDERS:
            if "{" + placeholder + "}" not in joined:
                raise reader.fail(f"{where}.args", f"must use {{{placeholder}}}")
        specs[family] = FvpSpec(binary=reader.get(entry, "binary", str, where), args=tuple(tokens))
    return specs, load_address, load_region
