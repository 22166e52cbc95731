"""The programs a native build runs, found once each: the host's C/C++ compilers, the GNU Arm
toolchain, flatc, torchgen's operator tables, QEMU; and how many compiles run at once.

    CC, CXX                     the host compilers (default gcc/g++ on PATH)
    ORCHESTRATE_ARM_TOOLCHAIN   a folder holding arm-none-eabi-gcc and friends (default PATH)
    ORCHESTRATE_QEMU            the qemu-system-arm binary (default PATH)
    ORCHESTRATE_BUILD_JOBS      parallel compile jobs (default: min(2, cores))
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kernels.native.errors import HostRuntimeUnavailable, QemuNotFound, ToolchainNotFound
from kernels.native.sources import ThirdParty

QEMU_ENV = "ORCHESTRATE_QEMU"  # the qemu-system-arm binary
TOOLCHAIN_ENV = "ORCHESTRATE_ARM_TOOLCHAIN"  # a folder holding arm-none-eabi-gcc and friends
JOBS_ENV = "ORCHESTRATE_BUILD_JOBS"
MAX_DEFAULT_JOBS = 2
_TOOL_PREFIX = "arm-none-eabi-"


@dataclass(frozen=True)
class HostToolchain:
    cc: str
    cxx: str
    versions: str  # first line of `cc --version` and `c++ --version`, part of the cache key


@dataclass(frozen=True)
class Toolchain:
    """The GNU Arm toolchain (arm-none-eabi)."""

    gcc: Path
    gxx: Path
    nm: Path
    size: Path
    version: str  # `arm-none-eabi-gcc --version`, first line


def run_text(argv: Sequence[str]) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True).stdout


def find_host_toolchain() -> HostToolchain:
    """The host's C and C++ compilers: $CC/$CXX, else gcc/g++ (cc/c++) on PATH."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cc or not cxx:
        raise HostRuntimeUnavailable("no C/C++ compiler found (gcc/g++ or $CC/$CXX) to build the "
                                     "host runtime")
    versions = []
    for compiler in (cc, cxx):
        try:
            out = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                 timeout=60, check=True).stdout
        except (OSError, subprocess.SubprocessError) as error:
            raise HostRuntimeUnavailable(f"compiler {compiler} does not run: {error}") from None
        versions.append(out.splitlines()[0] if out else compiler)
    return HostToolchain(cc, cxx, " | ".join(versions))


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
    version = run_text([str(tools["gcc"]), "--version"]).splitlines()[0].strip()
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


def find_flatc(third_party: ThirdParty) -> Path:
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
            version = run_text([str(candidate), "--version"]).strip().split()[-1]
            if version == wanted:
                return candidate
            seen.append(f"{candidate} is {version}")
    raise ToolchainNotFound(
        f"no flatc {wanted} (the flatbuffers sources' version)"
        + (f"; {'; '.join(seen)}" if seen else "")
    )


def torchgen_yaml_dir() -> Path:
    """torchgen's native_functions.yaml and tags.yaml, which ExecuTorch's codegen reads."""
    spec = importlib.util.find_spec("torchgen")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainNotFound("no torchgen (it comes with torch) for ExecuTorch's codegen")
    return Path(list(spec.submodule_search_locations)[0]) / "packaged" / "ATen" / "native"


def build_jobs() -> int:
    """Parallel compile jobs: $ORCHESTRATE_BUILD_JOBS, else min(2, cores)."""
    named = os.environ.get(JOBS_ENV)
    if named and named.isdigit() and int(named) > 0:
        return int(named)
    return max(1, min(MAX_DEFAULT_JOBS, os.cpu_count() or 1))


def nice() -> list[str]:
    """Compiles run at lower priority: the machine is shared with other builds."""
    found = shutil.which("nice")
    return [found, "-n", "10"] if found else []
