"""The platform's runner firmware for QEMU: the tools, the sources, firmware.yaml, the build.

The tools are arm-none-eabi GCC ($ORCHESTRATE_ARM_TOOLCHAIN, else PATH), the flatc of the
flatbuffers sources' version, and qemu-system-arm ($ORCHESTRATE_QEMU, else PATH), which the
harness runs the firmware on.

The firmware is the board support in `platforms/<platform>/runner/` (startup, semihosting console,
counters, a main that runs BundleIO's self-check) linked with ExecuTorch's runtime, the portable
and Cortex-M kernels the program's `operators.txt` names, and CMSIS-NN, all compiled for the core
`runner/firmware.yaml` names from the unmodified sources in ../shared/third_party (or
$ORCHESTRATE_THIRD_PARTY). The linker script is generated from the platform YAML's memory
regions; `runner/firmware.yaml` says which regions hold code and data, which core QEMU runs it on
(the Corstone-320's Cortex-M85 build runs on the AN547's M55: the same Armv8.1-M + MVE
architecture, see its firmware.yaml), which NPU families its semihosting bridge serves, and what
QEMU models.

One firmware serves every program with the same operators: the harness (platforms/qemu.py)
writes each program's mailbox and image into memory (platforms/runner_protocol.py). Builds are
cached under $ORCHESTRATE_CACHE_DIR (default ~/.cache/orchestrate): objects by compiler, flags and
source content, firmware by its objects and linker script, so only a new operator costs a compile.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import yaml

from kernels.cache_root import cache_root
from kernels.native_build import (atomic_write, build_jobs, digest, sources_hint,
                                  third_party_root, tree_digest)
from platforms.platform import MemoryRegion, Platform, load_platform
from platforms.runner_protocol import MAILBOX

QEMU_ENV = "ORCHESTRATE_QEMU"  # the qemu-system-arm binary
TOOLCHAIN_ENV = "ORCHESTRATE_ARM_TOOLCHAIN"  # a folder holding arm-none-eabi-gcc and friends

_TOOL_PREFIX = "arm-none-eabi-"
_FIRMWARE_CONFIG = "firmware.yaml"
# Bump when the build recipe below changes in a way the hashed inputs do not show.
_RECIPE_VERSION = "1"
# The NPU build's own sources beside the runner (the driver's device layer over semihosting).
_NPU_DIR = "npu"
_ETHOS_U_BACKEND_SOURCES = ("EthosUBackend.cpp", "EthosUBackend_Cortex_M.cpp",
                            "EthosUBackend_IoMemcpy.cpp", "VelaBinStream.cpp")


class QemuUnavailable(RuntimeError):
    """The QEMU check cannot run here; callers report "not run" (exit 5), never a pass."""

    def __init__(self, detail: str):
        super().__init__(f"not run: {detail}")


class ToolchainNotFound(QemuUnavailable):
    """No arm-none-eabi GCC (or no flatc matching the flatbuffers sources)."""


class QemuNotFound(QemuUnavailable):
    """No qemu-system-arm."""


class ThirdPartySourcesNotFound(QemuUnavailable):
    """No ExecuTorch / CMSIS-NN / flatbuffers sources to build the firmware from."""


class NoRunnerForPlatform(QemuUnavailable):
    """The platform has no runner firmware recipe or QEMU machine."""


class NoEthosUInQemu(QemuUnavailable):
    """The program has Ethos-U delegates and QEMU models no Ethos-U: nothing is run."""


class KernelsMissing(QemuUnavailable):
    """The program needs operators that have no kernel in the third-party sources."""


class FirmwareBuildError(RuntimeError):
    """Compiling or linking the firmware failed: a defect to fix, not a verdict on the model."""


# ---------------------------------------------------------------------------------------------
# Tools and sources


@dataclass(frozen=True)
class Toolchain:
    gcc: Path
    gxx: Path
    nm: Path
    size: Path
    version: str  # `arm-none-eabi-gcc --version`, first line


@dataclass(frozen=True)
class ThirdParty:
    root: Path
    executorch: Path
    cmsis_nn: Path
    flatbuffers: Path
    ethos_u_driver: Path  # the Ethos-U core driver (only the NPU build needs it)


def find_toolchain() -> Toolchain:
    """arm-none-eabi GCC from $ORCHESTRATE_ARM_TOOLCHAIN, else PATH."""
    folder = os.environ.get(TOOLCHAIN_ENV)
    search = str(Path(folder).expanduser()) if folder else None
    tools = {}
    for tool in ("gcc", "g++", "nm", "size"):
        found = shutil.which(_TOOL_PREFIX + tool, path=search)
        if found is None:
            where = f"${TOOLCHAIN_ENV}={folder}" if folder else "PATH"
            raise ToolchainNotFound(
                f"no {_TOOL_PREFIX}{tool} on {where} (apt-get install gcc-arm-none-eabi "
                "libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib)"
            )
        tools[tool] = Path(found)
    version = _run_text([str(tools["gcc"]), "--version"]).splitlines()[0].strip()
    return Toolchain(tools["gcc"], tools["g++"], tools["nm"], tools["size"], version)


def find_qemu() -> Path:
    """qemu-system-arm from $ORCHESTRATE_QEMU, else PATH."""
    named = os.environ.get(QEMU_ENV)
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise QemuNotFound(f"${QEMU_ENV}={named} does not exist")
        return path.resolve()
    found = shutil.which("qemu-system-arm")
    if found is None:
        raise QemuNotFound("no qemu-system-arm on PATH (apt-get install qemu-system-arm)")
    return Path(found).resolve()


def find_third_party(root: str | Path | None = None) -> ThirdParty:
    """The source snapshot: `root`, else $ORCHESTRATE_THIRD_PARTY, else ../shared/third_party."""
    base, origin = third_party_root(root)
    needed = {
        "executorch": base / "executorch" / "runtime" / "executor" / "method.cpp",
        "cmsis-nn": base / "cmsis-nn" / "Include" / "arm_nnfunctions.h",
        "flatbuffers": base / "flatbuffers" / "include" / "flatbuffers" / "flatbuffers.h",
    }
    missing = [name for name, marker in needed.items() if not marker.is_file()]
    if missing:
        raise ThirdPartySourcesNotFound(
            f"no {', '.join(missing)} sources in {base} ({origin}); {sources_hint()}"
        )
    return ThirdParty(base, base / "executorch", base / "cmsis-nn", base / "flatbuffers",
                      base / "ethos-u-core-driver")


def _find_flatc(third_party: ThirdParty) -> Path:
    """flatc of the flatbuffers version the sources hold: the generated headers static_assert it.
    The executorch wheel ships one; PATH is the fallback."""
    candidates = []
    spec = importlib.util.find_spec("executorch")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates.append(Path(location) / "data" / "bin" / "flatc")
    if found := shutil.which("flatc"):
        candidates.append(Path(found))
    base_h = (third_party.flatbuffers / "include" / "flatbuffers" / "base.h").read_text()
    wanted = ".".join(
        re.search(rf"#define FLATBUFFERS_VERSION_{part} (\d+)", base_h)[1]
        for part in ("MAJOR", "MINOR", "REVISION")
    )
    seen = []
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            version = _run_text([str(candidate), "--version"]).strip().split()[-1]
            if version == wanted:
                return candidate
            seen.append(f"{candidate} is {version}")
    raise ToolchainNotFound(
        f"no flatc {wanted} (the flatbuffers sources' version)"
        + (f"; {'; '.join(seen)}" if seen else "")
    )


def _run_text(argv: Sequence[str]) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True).stdout


# ---------------------------------------------------------------------------------------------
# The firmware recipe of a platform


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
    cpu_flags: tuple[str, ...]
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

    @property
    def core_text(self) -> str:
        """What ran the code, e.g. "Cortex-M55 + MVE on QEMU mps3-an547" or, for a build of
        another core, "Cortex-M85 build on QEMU's Cortex-M55 (mps3-an547)"."""
        if self.cpu == self.qemu_cpu:
            return f"{core_name(self.cpu)} + MVE on QEMU {self.qemu_machine}"
        return (f"{core_name(self.cpu)} build (Armv8.1-M + MVE) on QEMU's "
                f"{core_name(self.qemu_cpu)} ({self.qemu_machine})")

    def method(self, platform_name: str) -> str:
        return f"{platform_title(platform_name)} CPU in QEMU: real kernels, no timing" \
            if self.cpu == self.qemu_cpu else \
            (f"{platform_title(platform_name)} {core_name(self.cpu)} build in QEMU's "
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


def core_name(cpu: str) -> str:
    """ "cortex-m55" -> "Cortex-M55"."""
    return cpu.replace("cortex-m", "Cortex-M") if cpu.startswith("cortex-m") else cpu


def platform_title(name: str) -> str:
    """ "corstone300" -> "Corstone-300"."""
    match = re.fullmatch(r"corstone(\d+)", name)
    return f"Corstone-{match[1]}" if match else name


def load_firmware_config(platform: Platform) -> FirmwareConfig:
    """The runner recipe beside the platform YAML (`runner/firmware.yaml`)."""
    runner_dir = Path(platform.source_file).resolve().parent / "runner"
    path = runner_dir / _FIRMWARE_CONFIG
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
    config = FirmwareConfig(
        runner_dir=runner_dir,
        sources_dir=sources_dir,
        cpu=str(data.get("cpu", platform.cpu_default)),
        qemu_cpu=str(qemu.get("cpu", data.get("cpu", platform.cpu_default))),
        cpu_note=" ".join(str(qemu.get("why_this_core", "")).split()),
        npu_products={str(k): str(v) for k, v in (npu.get("products") or {}).items()},
        npu_base_address=int(npu.get("base_address", 0)),
        cpu_flags=tuple(data["cpu_flags"]),
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


# ---------------------------------------------------------------------------------------------
# Operators and the kernels that implement them


@dataclass(frozen=True)
class KernelLibrary:
    name: str  # "portable" or "cortex_m"
    yaml_path: Path
    yaml_flag: str  # how codegen takes the yaml: --functions-yaml-path or --custom-ops-yaml-path
    source_dir: Path
    kernels: Mapping[str, tuple[str, ...]]  # operator -> kernel function names


def _kernel_libraries(third_party: ThirdParty) -> tuple[KernelLibrary, ...]:
    et = third_party.executorch
    return (
        _read_kernel_yaml("portable", et / "kernels/portable/functions.yaml", "--functions-yaml-path",
                          et / "kernels/portable/cpu"),
        _read_kernel_yaml("cortex_m", et / "backends/cortex_m/ops/operators.yaml",
                          "--custom-ops-yaml-path", et / "backends/cortex_m/ops"),
    )


def _read_kernel_yaml(name: str, path: Path, flag: str, source_dir: Path) -> KernelLibrary:
    kernels = {}
    for entry in yaml.safe_load(path.read_text()):
        operator = f"aten::{entry['op']}" if "op" in entry else entry["func"].split("(")[0].strip()
        if "::" not in operator:
            operator = f"aten::{operator}"
        kernels[operator] = tuple(k["kernel_name"].split("::")[-1] for k in entry.get("kernels", ()))
    return KernelLibrary(name, path, flag, source_dir, MappingProxyType(kernels))


def _prim_operators(third_party: ThirdParty) -> frozenset[str]:
    """Operators kernels/prim_ops/register_prim_ops.cpp registers (always linked)."""
    text = (third_party.executorch / "kernels/prim_ops/register_prim_ops.cpp").read_text()
    return frozenset(re.findall(r'"([a-z_]+::[A-Za-z_0-9]+\.[A-Za-z_0-9]+)"', text))


def read_operators(operators_txt: str | Path) -> tuple[str, ...]:
    """The operators a program needs, one per line (what `compile` writes as operators.txt)."""
    lines = Path(operators_txt).read_text().splitlines()
    return tuple(sorted({line.strip() for line in lines if line.strip() and not line.startswith("#")}))


def _kernel_source(library: KernelLibrary, operator: str, function: str) -> Path:
    """The op_*.cpp that defines `function`: op_<name>.cpp by ExecuTorch's naming, else the file
    whose definition (a KernelRuntimeContext& first parameter, or a DEFINE_* macro) names it."""
    base = operator.split("::")[-1].split(".")[0]
    definition = re.compile(
        rf"\b{re.escape(function)}\s*\(\s*(?://[^\n]*\n\s*)*(?:[\w:]*::)?KernelRuntimeContext\s*&"
        rf"|\bDEFINE_\w+\(\s*{re.escape(function)}\b"
    )
    named = library.source_dir / f"op_{base}.cpp"
    if named.is_file() and function in named.read_text():
        return named
    for candidate in sorted(library.source_dir.glob("op_*.cpp")):
        if definition.search(candidate.read_text()):
            return candidate
    raise FirmwareBuildError(f"no source in {library.source_dir} defines {function} for {operator}")


@dataclass(frozen=True)
class OperatorSelection:
    """Which library registers each operator, and the kernel sources they need."""

    by_library: Mapping[str, tuple[str, ...]]
    sources: Mapping[str, tuple[Path, ...]]
    prim: tuple[str, ...]


def select_operators(operators: Iterable[str], third_party: ThirdParty) -> OperatorSelection:
    """Map each operator to its kernel library; raise KernelsMissing for any without a kernel
    (e.g. the wheel's `cortex_m::*_nhwc.out` variants, which this source snapshot lacks)."""
    libraries = _kernel_libraries(third_party)
    prim = _prim_operators(third_party)
    by_library: dict[str, list[str]] = {library.name: [] for library in libraries}
    sources: dict[str, set[Path]] = {library.name: set() for library in libraries}
    prim_used, missing = [], []
    for operator in sorted(set(operators)):
        for library in libraries:
            if operator in library.kernels:
                by_library[library.name].append(operator)
                for function in library.kernels[operator]:
                    sources[library.name].add(_kernel_source(library, operator, function))
                break
        else:
            if operator in prim:
                prim_used.append(operator)
            else:
                missing.append(operator)
    if missing:
        raise KernelsMissing(
            f"no kernel in the sources for {', '.join(missing)} (third_party executorch snapshot)"
        )
    return OperatorSelection(
        MappingProxyType({name: tuple(ops) for name, ops in by_library.items()}),
        MappingProxyType({name: tuple(sorted(paths)) for name, paths in sources.items()}),
        tuple(prim_used),
    )


# ---------------------------------------------------------------------------------------------
# What every firmware built from the sources compiles (the runner here, `orchestrate firmware`'s
# projects in platforms/firmware_project.py)


def runtime_sources(third_party: ThirdParty, *, bundled_program: bool) -> list[Path]:
    """The runtime core, prim ops and the portable kernels' shared utilities; with
    `bundled_program`, BundleIO's self-check too."""
    et = third_party.executorch
    found = []
    for path in sorted((et / "runtime").rglob("*.cpp")):
        relative = str(path.relative_to(et))
        # *_aten.cpp are the ATen-mode variants (tensor_parser_exec_aten.cpp is shared);
        # platform/default/ is replaced by the firmware's own platform layer (pal).
        aten_mode = relative.endswith("_aten.cpp") and not relative.endswith("exec_aten.cpp")
        if ("/test/" in relative or "testing_util" in relative or aten_mode
                or "/platform/default/" in relative):
            continue
        found.append(path)
    found.append(et / "schema/extended_header.cpp")
    if bundled_program:
        found.append(et / "devtools/bundled_program/bundled_program.cpp")
    found += sorted((et / "kernels/prim_ops").glob("*.cpp"))
    found += sorted((et / "kernels/portable/cpu/util").glob("*.cpp"))
    found += sorted((et / "kernels/portable/cpu/pattern").glob("*.cpp"))
    return found


def cmsis_nn_sources(third_party: ThirdParty) -> list[Path]:
    """CMSIS-NN's integer kernels: its float ones need ARM_NN_ENABLE_F32/F16, off by default in
    its CMake as here."""
    return sorted(
        p for p in (third_party.cmsis_nn / "Source").rglob("*.c")
        if "Bindings" not in p.parts and not re.search(r"_f(16|32)\.c$", p.name)
    )


def kernel_libraries(third_party: ThirdParty) -> dict[str, KernelLibrary]:
    return {library.name: library for library in _kernel_libraries(third_party)}


def source_tree_digest(third_party: ThirdParty) -> str:
    """The content digest of every source tree a firmware build reads."""
    et = third_party.executorch
    return tree_digest(
        [et / "runtime", et / "kernels", et / "backends/cortex_m", et / "devtools/bundled_program",
         et / "extension", et / "schema", et / "codegen", third_party.cmsis_nn / "Include",
         third_party.cmsis_nn / "Source", third_party.flatbuffers / "include"],
        third_party.root,
    )


def schema_headers(third_party: ThirdParty, cache: Path) -> Path:
    """flatc's headers for the program and bundled-program schemas, cached under `cache` by
    their inputs; the folder to put on the include path."""
    flatc = _find_flatc(third_party)
    et = third_party.executorch
    groups = {
        "executorch/schema": [et / "schema/program.fbs", et / "schema/scalar_type.fbs"],
        "executorch/devtools/bundled_program/schema": [
            et / "devtools/bundled_program/schema/bundled_program_schema.fbs",
            et / "devtools/bundled_program/schema/scalar_type.fbs",
        ],
    }
    key = digest(_RECIPE_VERSION, _run_text([str(flatc), "--version"]),
                 *(p.read_bytes() for files in groups.values() for p in files))
    out = cache / "schema" / key
    if not (out / "done").is_file():
        (cache / "schema").mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache / "schema", prefix=".tmp-"))
        for folder, files in groups.items():
            subprocess.run(
                [str(flatc), "--cpp", "--cpp-std", "c++11", "--gen-mutable", "--scoped-enums",
                 "-o", str(staging / "include" / folder), *map(str, files)],
                check=True, capture_output=True, text=True,
            )
        (staging / "done").write_text(key)
        _publish_folder(staging, out)
    return out / "include"


def kernel_registration(third_party: ThirdParty, cache: Path, tree: str, library: KernelLibrary,
                        operators: Sequence[str]) -> Path:
    """ExecuTorch's codegen (codegen/gen.py of the sources) for the selected operators: the
    unboxing wrappers and the static registration of their kernels (a folder, cached by its
    inputs)."""
    native = _torchgen_yaml_dir()
    selection = {
        "build_features": [],
        "custom_classes": [],
        "et_kernel_metadata": {op: ["default"] for op in operators},
        "include_all_non_op_selectives": False,
        "include_all_operators": False,
        "kernel_metadata": {},
        "operators": {
            op: {"debug_info": ["operators.txt"], "include_all_overloads": False,
                 "is_root_operator": True, "is_used_for_training": True}
            for op in operators
        },
    }
    selection_text = yaml.safe_dump(selection, sort_keys=True)
    key = digest(_RECIPE_VERSION, library.name, selection_text, library.yaml_path.read_bytes(),
                 tree, (native / "native_functions.yaml").read_bytes(),
                 (native / "tags.yaml").read_bytes())
    out = cache / "codegen" / key
    if not (out / "done").is_file():
        (cache / "codegen").mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache / "codegen", prefix=".tmp-"))
        (staging / "selected_operators.yaml").write_text(selection_text)
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        result = subprocess.run(
            [sys.executable, "-m", "codegen.gen",
             f"--source-path={third_party.executorch / 'codegen'}", f"--install-dir={staging}",
             f"--tags-path={native / 'tags.yaml'}",
             f"--aten-yaml-path={native / 'native_functions.yaml'}",
             f"--op-selection-yaml-path={staging / 'selected_operators.yaml'}",
             f"{library.yaml_flag}={library.yaml_path}"],
            cwd=third_party.executorch, env=env, capture_output=True, text=True,
        )
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise FirmwareBuildError(
                f"ExecuTorch codegen failed for {library.name}:\n{result.stderr[-4000:]}")
        (staging / "done").write_text(key)
        _publish_folder(staging, out)
    return out


def _torchgen_yaml_dir() -> Path:
    spec = importlib.util.find_spec("torchgen")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainNotFound("no torchgen (it comes with torch) for ExecuTorch's codegen")
    return Path(list(spec.submodule_search_locations)[0]) / "packaged" / "ATen" / "native"


def _publish_folder(staging: Path, out: Path) -> None:
    """Move a finished folder into place; another process may have won the race."""
    try:
        os.replace(staging, out)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (out / "done").is_file():
            raise


# ---------------------------------------------------------------------------------------------
# The build


@dataclass(frozen=True)
class Firmware:
    """A built runner: its ELF, where things are, and what the build cost."""

    elf: Path
    key: str
    operators: tuple[str, ...]
    mailbox_address: int
    free_start: Mapping[str, int]  # region name -> first address the firmware image leaves free
    code_region: str
    text_bytes: int
    data_bytes: int
    bss_bytes: int
    build_seconds: float  # spent by this call: the full build, or the cache lookup
    cached: bool  # the ELF came from the cache
    compiled_objects: int  # objects compiled by this call (0 when every object was cached)
    total_objects: int


@dataclass(frozen=True)
class _Unit:
    """One compile: a source, its language and flags, and the generated files its key covers."""

    source: Path
    flags: tuple[str, ...]
    extra_inputs: tuple[Path, ...] = ()
    npu: bool = False  # the NPU build's: its key also covers the backend and driver sources

    @property
    def is_cxx(self) -> bool:
        return self.source.suffix == ".cpp"


class _Builder:
    def __init__(self, platform: Platform, config: FirmwareConfig, third_party: ThirdParty,
                 toolchain: Toolchain, cache: Path, jobs: int, trace: bool,
                 npu_product: str | None = None):
        self.platform = platform
        self.npu_product = npu_product  # "ethos-u55" / "ethos-u65": link the NPU stack
        self.trace = trace
        self.config = config
        self.tp = third_party
        self.toolchain = toolchain
        self.cache = cache / "corstone-runner"
        self.jobs = jobs
        self.compiled = 0
        et = third_party.executorch
        self.tree = source_tree_digest(third_party)
        self.runner_digest = tree_digest(
            sorted(p for folder in (config.sources_dir, config.sources_dir / _NPU_DIR)
                   if folder.is_dir() for p in folder.iterdir()
                   if p.suffix in (".c", ".cpp", ".h")),
            config.sources_dir,
        )
        self.npu_tree = tree_digest(
            [et / "backends/arm/runtime", third_party.ethos_u_driver / "include",
             third_party.ethos_u_driver / "src"], third_party.root,
        ) if npu_product else ""

    # -- generated sources ------------------------------------------------------------------

    def schema_headers(self) -> Path:
        return schema_headers(self.tp, self.cache)

    def registration(self, library: KernelLibrary, operators: Sequence[str]) -> Path:
        return kernel_registration(self.tp, self.cache, self.tree, library, operators)

    def regions_source(self, regions: Sequence[MemoryRegion]) -> str:
        lines = ['/* Generated by platforms/runner_build.py from the platform YAML: do not edit. */',
                 '#include "board.h"', ""]
        for region in regions:
            symbol = _symbol(region.name)
            lines.append(f"extern uint8_t __free_{symbol}_start[];")
            lines.append(f"extern uint8_t __free_{symbol}_end[];")
        lines += ["", "const runner_region_t runner_regions[] = {"]
        for region in regions:
            symbol = _symbol(region.name)
            lines.append(f'    {{"{region.name}", __free_{symbol}_start, __free_{symbol}_end}},')
        lines += ["};", f"const unsigned runner_region_count = {len(regions)}u;", ""]
        return "\n".join(lines)

    def linker_script(self, regions: Sequence[MemoryRegion], code_region: str) -> str:
        config = self.config
        code, data, heap = _symbol(code_region), _symbol(config.data_region), _symbol(config.heap_region)
        boot = _symbol(config.boot_region)
        # The core resets from the vector table in the boot region: with the code elsewhere
        # (too large for it), the table gets a section and a segment of its own there.
        vectors_apart = boot != code
        boot_phdr = "  boot PT_LOAD;\n" if vectors_apart else ""
        boot_section = (f"  .vectors : {{ KEEP(*(.vectors)) }} > {boot} :boot\n"
                        if vectors_apart else "")
        vectors_in_text = "" if vectors_apart else "    KEEP(*(.vectors))\n"
        memory = "\n".join(
            f"  {_symbol(r.name)} (rwx) : ORIGIN = {r.base_address:#010x}, LENGTH = {r.size_bytes:#x}"
            for r in regions
        )
        free = "\n".join(
            f"  .free_{n} (NOLOAD) : ALIGN(16) {{ __free_{n}_start = .; }} > {n} :none\n"
            f"  __free_{n}_end = ORIGIN({n}) + LENGTH({n});"
            for n in (_symbol(r.name) for r in regions)
        )
        return f"""/* Generated by platforms/runner_build.py from {self.platform.source_file.name} and
 * {config.runner_dir.name}/{_FIRMWARE_CONFIG}: do not edit. */
MEMORY
{{
{memory}
}}

ENTRY(Reset_Handler)

/* Loaded: code and the initial values of .data. The sections that must not be loaded (the
 * mailbox the harness writes, .bss, stack, heap) sit in no loadable segment: QEMU's ELF loader
 * would otherwise zero-fill them as ROM blobs over the harness's mailbox. */
PHDRS
{{
{boot_phdr}  text PT_LOAD;
  data PT_LOAD;
  none PT_NULL;
}}

SECTIONS
{{
{boot_section}{code_sections(code, vectors_in_text)}
  /* First in its region, so the harness finds it at a fixed address; not loaded, not zeroed:
   * the harness writes it before reset. */
  .mailbox (NOLOAD) : ALIGN(16)
  {{
    __runner_mailbox = .;
    . += {MAILBOX.size};
    . = ALIGN(16);
  }} > {data} :none
{data_sections(code, data, config.stack_bytes)}  .heap (NOLOAD) : ALIGN(8)
  {{
    __heap_start = .;
    . += {config.heap_bytes:#x};
    __heap_end = .;
  }} > {heap} :none

  /* What each region leaves free, for the runner's allocators and the program image. */
{free}
}}
"""

    # -- compiling -------------------------------------------------------------------------

    def units(self, selection: OperatorSelection, schema: Path, codegen: Mapping[str, Path],
              regions_c: Path) -> list[_Unit]:
        et, tp = self.tp.executorch, self.tp
        includes = (f"-I{tp.root}", f"-I{et / 'runtime/core/portable_type/c10'}", f"-I{schema}",
                    f"-I{tp.flatbuffers / 'include'}", f"-I{tp.cmsis_nn / 'Include'}",
                    f"-I{self.config.sources_dir}")
        common = (*self.config.cpu_flags, "-ffunction-sections", "-fdata-sections",
                  # Paths in __FILE__ (ET_LOG) independent of where the sources and cache lie.
                  f"-ffile-prefix-map={tp.root}=third_party",
                  f"-ffile-prefix-map={self.config.sources_dir}=runner",
                  f"-ffile-prefix-map={self.cache}=cache",
                  "-DARM_NN_ENABLE_F32=0", "-DARM_NN_ENABLE_F16=0")
        cxx = (*common, self.config.optimization, "-std=gnu++17", "-fno-exceptions", "-fno-rtti",
               "-fno-unwind-tables", "-fno-asynchronous-unwind-tables", "-fno-threadsafe-statics",
               "-Wno-deprecated-declarations", "-DC10_USING_CUSTOM_GENERATED_MACROS",
               "-DET_LOG_ENABLED=1", "-DET_MIN_LOG_LEVEL=Info", "-DFLATBUFFERS_MAX_ALIGNMENT=1024",
               # The registry's table: selected kernels plus the prim ops, with room to spare.
               "-DMAX_KERNEL_NUM=256",
               # The trace build: per-instruction ticks and output CRCs (runner.cpp).
               *(("-DET_EVENT_TRACER_ENABLED",) if self.trace else ()), *includes)
        c = (*common, self.config.optimization, "-std=gnu11", *includes)
        cmsis = (*common, self.config.cmsis_nn_optimization, "-std=gnu11",
                 f"-I{tp.cmsis_nn / 'Include'}")

        units = [_Unit(p, cxx) for p in runtime_sources(tp, bundled_program=True)]
        for library, sources in selection.sources.items():
            units += [_Unit(p, cxx) for p in sources]
        for library, folder in codegen.items():
            generated = folder / "RegisterCodegenUnboxedKernelsEverything.cpp"
            units.append(_Unit(generated, cxx, tuple(sorted(folder.glob("*.h")))))
        cmsis_sources = cmsis_nn_sources(tp)
        units += [_Unit(p, cmsis) for p in cmsis_sources]
        runner = self.config.sources_dir
        units += [_Unit(p, c) for p in sorted(runner.glob("*.c"))]
        runner_cxx = (*cxx, f"-DRUNNER_CPU_HZ={self.platform.cpu_hz}")
        units += [_Unit(p, runner_cxx) for p in sorted(runner.glob("*.cpp"))]
        units.append(_Unit(regions_c, c))
        if self.npu_product:
            units += self.npu_units(cxx, c)
        return units

    def npu_units(self, cxx: tuple[str, ...], c: tuple[str, ...]) -> list[_Unit]:
        """ExecuTorch's EthosUBackend and the Ethos-U core driver, from the sources, with the
        runner's device layer (runner/npu/ethosu_bridge.c) in place of the driver's register
        level (ethosu_device_u55_u65.c), which QEMU has no NPU behind."""
        driver = self.tp.ethos_u_driver
        if not (driver / "src" / "ethosu_driver.c").is_file():
            raise ThirdPartySourcesNotFound(
                f"no Ethos-U core driver in {driver}; {sources_hint()}")
        backend = self.tp.executorch / "backends/arm/runtime"
        npu_dir = self.config.sources_dir / _NPU_DIR
        product = self.config.npu_products[self.npu_product]
        driver_includes = (f"-I{driver / 'include'}", f"-I{driver / 'src'}", f"-I{npu_dir}",
                           f"-D{product}", "-DETHOSU_LOG_SEVERITY=0",
                           f"-DRUNNER_NPU_BASE_ADDRESS={self.config.npu_base_address:#x}u",
                           f"-ffile-prefix-map={npu_dir}=runner/npu")
        units = [_Unit(backend / name, (*cxx, f"-I{driver / 'include'}"), npu=True)
                 for name in _ETHOS_U_BACKEND_SOURCES]
        units.append(_Unit(driver / "src" / "ethosu_driver.c", (*c, *driver_includes), npu=True))
        units += [_Unit(p, (*c, *driver_includes), npu=True) for p in sorted(npu_dir.glob("*.c"))]
        return units

    def object_key(self, unit: _Unit, schema: Path) -> str:
        """Compiler, flags, the source and what it may include: the third-party tree, the schema
        headers (named by their own key) and, for the runner's files, the runner's headers."""
        flags = [flag.replace(str(self.cache), "<cache>") for flag in unit.flags]
        ours = unit.source.parent in (self.config.sources_dir, self.config.sources_dir / _NPU_DIR,
                                      self.cache / "generated")
        if unit.source.is_relative_to(self.tp.root):
            name = str(unit.source.relative_to(self.tp.root))
        elif unit.source.is_relative_to(self.cache):
            name = str(unit.source.relative_to(self.cache))
        else:
            name = unit.source.name
        return digest(_RECIPE_VERSION, self.toolchain.version, "c++" if unit.is_cxx else "c",
                    json.dumps(flags), name, unit.source.read_bytes(), self.tree,
                    self.runner_digest if ours else "", schema.parent.name,
                    *(p.read_bytes() for p in unit.extra_inputs),
                    *((self.npu_tree,) if unit.npu else ()))

    def compile_all(self, units: Sequence[_Unit], schema: Path) -> list[Path]:
        objects, pending = [], []
        for unit in units:
            key = self.object_key(unit, schema)
            obj = self.cache / "objects" / key[:2] / f"{key}.o"
            objects.append(obj)
            if not obj.is_file():
                pending.append((unit, obj))
        if pending:
            with ThreadPoolExecutor(max_workers=self.jobs) as pool:
                failures = [f for f in pool.map(lambda job: self._compile(*job), pending) if f]
            if failures:
                raise FirmwareBuildError("compiling the runner failed:\n" + "\n".join(failures)[-6000:])
            self.compiled += len(pending)
        return objects

    def _compile(self, unit: _Unit, obj: Path) -> str | None:
        obj.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=obj.parent, suffix=".o.tmp")
        os.close(handle)
        compiler = self.toolchain.gxx if unit.is_cxx else self.toolchain.gcc
        argv = [*_nice(), str(compiler), *unit.flags, "-c", str(unit.source), "-o", temporary]
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            os.unlink(temporary)
            return f"{unit.source}:\n{result.stderr}"
        os.replace(temporary, obj)
        return None

    def link(self, objects: Sequence[Path], regions: Sequence[MemoryRegion], out: Path) -> str:
        """Link into `out`, code in the first of the recipe's code regions it fits; the region."""
        problems = []
        for code_region in self.config.code_regions:
            script = out.parent / "runner.ld"
            script.write_text(self.linker_script(regions, code_region))
            argv = [*_nice(), str(self.toolchain.gxx), *self.config.cpu_flags, "-nostartfiles",
                    f"-T{script}", "-Wl,--gc-sections", f"-Wl,-Map={out.parent / 'runner.map'}",
                    # ExecuTorch logs with %zu, which Debian's newlib lacks (runner/printf_c99.c).
                    "-Wl,--wrap=vsnprintf",
                    "-o", str(out), *map(str, objects),
                    "-Wl,--start-group", "-lstdc++", "-lm", "-lc", "-lgcc", "-Wl,--end-group"]
            result = subprocess.run(argv, capture_output=True, text=True)
            if result.returncode == 0:
                return code_region
            if "overflowed by" not in result.stderr and "will not fit in region" not in result.stderr:
                raise FirmwareBuildError(f"linking the runner failed:\n{result.stderr[-6000:]}")
            problems.append(f"{code_region}: {result.stderr.strip().splitlines()[-1]}")
        raise FirmwareBuildError("the runner fits in none of its code regions: " + "; ".join(problems))

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _ensure(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        return path


def code_sections(code: str, vectors_in_text: str) -> str:
    """The linker script's loaded, read-only sections in region `code`: text with the vector
    table (`vectors_in_text`, empty when it lies apart), read-only data, the unwind tables and
    the constructor arrays. One text for the runner and `orchestrate firmware`'s projects."""
    return f"""  .text :
  {{
{vectors_in_text}    *(.text .text.*)
    KEEP(*(.init))
    KEEP(*(.fini))
    *(.rodata .rodata.*)
    . = ALIGN(8);
  }} > {code} :text
  .ARM.extab : {{ *(.ARM.extab* .gnu.linkonce.armextab.*) }} > {code}
  /* Bounds of the unwind index: the NPU build (EthosUBackend) pulls libgcc's unwinder in from
   * libstdc++, and it names them. */
  .ARM.exidx :
  {{
    __exidx_start = .;
    *(.ARM.exidx* .gnu.linkonce.armexidx.*)
    __exidx_end = .;
  }} > {code}
  .preinit_array : ALIGN(4)
  {{
    PROVIDE_HIDDEN(__preinit_array_start = .);
    KEEP(*(.preinit_array))
    PROVIDE_HIDDEN(__preinit_array_end = .);
  }} > {code}
  .init_array : ALIGN(4)
  {{
    PROVIDE_HIDDEN(__init_array_start = .);
    KEEP(*(SORT(.init_array.*)))
    KEEP(*(.init_array))
    PROVIDE_HIDDEN(__init_array_end = .);
  }} > {code}
  .fini_array : ALIGN(4)
  {{
    PROVIDE_HIDDEN(__fini_array_start = .);
    KEEP(*(SORT(.fini_array.*)))
    KEEP(*(.fini_array))
    PROVIDE_HIDDEN(__fini_array_end = .);
  }} > {code}
"""


def data_sections(code: str, data: str, stack_bytes: int) -> str:
    """The linker script's RAM sections in region `data`: .data (its initial values loaded in
    region `code`), .bss and the stack (MSPLIM at its bottom), neither loaded. One text for the
    runner and `orchestrate firmware`'s projects."""
    return f"""  .data : ALIGN(8)
  {{
    __data_start = .;
    *(.data .data.*)
    . = ALIGN(8);
    __data_end = .;
  }} > {data} AT > {code} :data
  __data_load = LOADADDR(.data);
  .bss (NOLOAD) : ALIGN(8)
  {{
    __bss_start = .;
    *(.bss .bss.*)
    *(COMMON)
    . = ALIGN(8);
    __bss_end = .;
  }} > {data} :none
  .stack (NOLOAD) : ALIGN(8)
  {{
    __stack_limit = .;
    . += {stack_bytes:#x};
    . = ALIGN(8);
    __stack_top = .;
  }} > {data} :none
"""


def _symbol(name: str) -> str:
    return re.sub(r"\W", "_", name)


def _nice() -> list[str]:
    """Compiles run at lower priority: the machine is shared with other builds."""
    nice = shutil.which("nice")
    return [nice, "-n", "10"] if nice else []


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
    """Build (or take from the cache) the runner firmware that registers `operators`; with
    `trace`, a variant that reports every instruction's ticks and output CRCs; with
    `npu_product` ("ethos-u55" or "ethos-u65"), one that links ExecuTorch's EthosUBackend and
    the Ethos-U core driver and hands each command stream to the host (runner/npu/).

    Raises QemuUnavailable subclasses when the build cannot happen here (no toolchain, no
    sources, an operator without a kernel) and FirmwareBuildError when it fails."""
    started = time.monotonic()
    platform = load_platform(platform) if isinstance(platform, str) else platform
    config = load_firmware_config(platform)
    toolchain = find_toolchain()
    sources = find_third_party(third_party)
    operators = tuple(sorted(set(operators)))
    selection = select_operators(operators, sources)
    cache = Path(cache_dir).expanduser() if cache_dir else cache_root()
    if npu_product is not None and npu_product not in config.npu_products:
        raise NoEthosUInQemu(f"the {platform.name} runner's NPU bridge serves "
                             f"{', '.join(config.npu_products) or 'no NPU'}, not {npu_product}")
    builder = _Builder(platform, config, sources, toolchain, cache, jobs or build_jobs(), trace,
                       npu_product)
    regions = ram_regions(platform, config)

    schema = builder.schema_headers()
    libraries = {library.name: library for library in _kernel_libraries(sources)}
    codegen = {
        name: builder.registration(libraries[name], ops)
        for name, ops in selection.by_library.items() if ops
    }
    generated = builder.cache / "generated"
    regions_text = builder.regions_source(regions)
    regions_c = generated / f"regions-{digest(regions_text)[:16]}.c"
    if not regions_c.is_file():
        atomic_write(regions_c, regions_text)
    units = builder.units(selection, schema, codegen, regions_c)
    keys = [builder.object_key(unit, schema) for unit in units]
    firmware_key = digest(_RECIPE_VERSION, toolchain.version, json.dumps(sorted(keys)), config.text,
                        builder.linker_script(regions, "<code>"), json.dumps(operators))
    folder = builder.cache / "firmware" / firmware_key
    record_path = folder / "build.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        return _firmware(folder, record, firmware_key, operators, time.monotonic() - started, True, 0,
                         len(units))

    objects = builder.compile_all(units, schema)
    staging = Path(tempfile.mkdtemp(dir=builder._ensure(builder.cache / "firmware"), prefix=".tmp-"))
    elf = staging / "runner.elf"
    try:
        code_region = builder.link(objects, regions, elf)
    except FirmwareBuildError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    symbols = _symbols(toolchain, elf)
    text_bytes, data_bytes, bss_bytes = _sizes(toolchain, elf)
    record = {
        "operators": list(operators),
        "platform": platform.name,
        "code_region": code_region,
        "mailbox_address": symbols["__runner_mailbox"],
        "free_start": {r.name: symbols[f"__free_{_symbol(r.name)}_start"] for r in regions},
        "text_bytes": text_bytes,
        "data_bytes": data_bytes,
        "bss_bytes": bss_bytes,
        "toolchain": toolchain.version,
        "objects": len(objects),
        "compiled_objects": builder.compiled,
        "build_seconds": round(time.monotonic() - started, 3),
    }
    (staging / "build.json").write_text(json.dumps(record, indent=1))
    if folder.exists():  # another process built the same firmware meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    else:
        _publish_folder(staging, folder)
    record = json.loads((folder / "build.json").read_text())
    return _firmware(folder, record, firmware_key, operators, time.monotonic() - started, False,
                     builder.compiled, len(units))


def _firmware(folder: Path, record: dict, key: str, operators: tuple[str, ...], seconds: float,
              cached: bool, compiled: int, total: int) -> Firmware:
    return Firmware(
        elf=folder / "runner.elf",
        key=key,
        operators=operators,
        mailbox_address=int(record["mailbox_address"]),
        free_start=MappingProxyType({k: int(v) for k, v in record["free_start"].items()}),
        code_region=record["code_region"],
        text_bytes=int(record["text_bytes"]),
        data_bytes=int(record["data_bytes"]),
        bss_bytes=int(record["bss_bytes"]),
        build_seconds=seconds,
        cached=cached,
        compiled_objects=compiled,
        total_objects=total,
    )


def _symbols(toolchain: Toolchain, elf: Path) -> dict[str, int]:
    symbols = {}
    for line in _run_text([str(toolchain.nm), str(elf)]).splitlines():
        parts = line.split()
        if len(parts) == 3:
            symbols[parts[2]] = int(parts[0], 16)
    return symbols


def _sizes(toolchain: Toolchain, elf: Path) -> tuple[int, int, int]:
    lines = _run_text([str(toolchain.size), str(elf)]).splitlines()
    text, data, bss = (int(v) for v in lines[1].split()[:3])
    return text, data, bss
