"""`orchestrate doctor`: what this machine can verify and build, what each method lacks and the
one command that fixes it.

Every check looks without importing or building anything (package specs, programs on PATH,
marker files of the source trees), so the answer comes in well under a second. A method is
available when everything it needs is; the Corstone FVPs are Arm's own downloads, not
redistributable, so they are listed but optional: their absence does not fail `doctor`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from kernels.native.errors import QemuUnavailable
from kernels.native.sources import PINNED, THIRD_PARTY_ENV, source_tree, third_party_root
from kernels.native.toolchains import find_qemu, find_toolchain
from platforms import PlatformError, list_platforms, load_platform
from platforms.fvp import FVP_DIR_ENV, find_fvp
from platforms.firmware_recipe import load_firmware_config, platform_title
from platforms.qemu_machines import machines

ARM_TOOLCHAIN_FIX = ("apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi "
                     "libstdc++-arm-none-eabi-newlib (or set $ORCHESTRATE_ARM_TOOLCHAIN)")
# A marker file per tree: a folder alone may be an empty or partial checkout.
_TREE_MARKERS = {
    "executorch": "runtime/executor/method.cpp",
    "cmsis-nn": "Include/arm_nnfunctions.h",
    "flatbuffers": "include/flatbuffers/flatbuffers.h",
    "ethos-u-core-driver": "src/ethosu_driver.c",
}
_PACKAGES = (("torch", "torch", "pip install torch==2.13.0"),
             ("executorch", "executorch", "pip install 'executorch[ethos-u]==1.5.1'"),
             ("Vela", "ethosu.vela", "pip install 'executorch[ethos-u]==1.5.1'"),
             ("TOSA reference model", "tosa_reference_model",
              "pip install 'executorch[ethos-u]==1.5.1'"))


@dataclass(frozen=True)
class Requirement:
    """One thing a method needs: whether it is here, where it was looked for, the fix."""

    name: str
    found: bool
    where: str
    fix: str


@dataclass(frozen=True)
class Capability:
    """A verification method or build, and what it needs."""

    name: str
    does: str
    requirements: tuple[Requirement, ...]
    optional: bool = False

    @property
    def available(self) -> bool:
        return all(r.found for r in self.requirements)

    @property
    def missing(self) -> tuple[Requirement, ...]:
        return tuple(r for r in self.requirements if not r.found)


@dataclass(frozen=True)
class MachineReport:
    capabilities: tuple[Capability, ...]

    @property
    def exit_code(self) -> int:
        """0 when every required method is available, else 5 (a check could not run)."""
        return 0 if all(c.available for c in self.capabilities if not c.optional) else 5

    def to_text(self) -> str:
        lines = ["orchestrate doctor: what this machine can verify and build"]
        for capability in self.capabilities:
            state = "available" if capability.available else (
                "not installed (optional)" if capability.optional else "MISSING")
            lines.append(f"  {capability.name:<34} {state}: {capability.does}")
            for requirement in capability.missing:
                lines.append(f"      lacks {requirement.name} (looked in {requirement.where}); "
                             f"fix: {requirement.fix}")
        required = [c for c in self.capabilities if not c.optional]
        ready = sum(c.available for c in required)
        lines.append(f"{ready} of {len(required)} required methods available"
                     + ("" if ready == len(required) else "; run each fix above, then "
                        "`orchestrate doctor` again"))
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"exit_code": self.exit_code, "capabilities": [
            {"name": c.name, "does": c.does, "available": c.available, "optional": c.optional,
             "requirements": [{"name": r.name, "found": r.found, "where": r.where,
                               "fix": r.fix} for r in c.requirements]}
            for c in self.capabilities]}


def _package(label: str, module: str, fix: str) -> Requirement:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    where = str(Path(spec.origin).parent) if spec is not None and spec.origin else \
        "this Python's site-packages"
    return Requirement(f"Python package {label}", spec is not None, where, fix)


def _trees(names: tuple[str, ...]) -> Requirement:
    """The third-party source trees `names`, as one requirement naming those missing."""
    root, origin = third_party_root()
    missing = []
    for name in names:
        folder, _origin = source_tree(name)
        if not (folder / _TREE_MARKERS[name]).is_file():
            missing.append(name)
    return Requirement(f"the {', '.join(missing or names)} sources", not missing,
                       f"{root} ({origin})",
                       f"export {THIRD_PARTY_ENV}=/path/to/third_party (a folder holding "
                       f"{', '.join(n + '/' for n in _TREE_MARKERS)}), or `orchestrate "
                       "sources fetch`")


def _program(name: str, finder, fix: str) -> Requirement:
    try:
        found = finder()
    except QemuUnavailable:
        found = None
    where = str(found) if found else "PATH"
    return Requirement(name, found is not None, where, fix)


def _host_compiler() -> Requirement:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    return Requirement("a host C/C++ compiler", cxx is not None, cxx or "$CXX, PATH",
                       "apt-get install g++")


def check_machine() -> MachineReport:
    """Every verification method and build `orchestrate` has, with what each needs."""
    packages = tuple(_package(*p) for p in _PACKAGES)
    every_tree = tuple(source.name for source in PINNED)
    toolchain = _program("arm-none-eabi GCC", lambda: find_toolchain().gcc, ARM_TOOLCHAIN_FIX)
    qemu = _program("qemu-system-arm", find_qemu,
                    "apt-get install qemu-system-arm (or set $ORCHESTRATE_QEMU)")
    cmake = Requirement("cmake", shutil.which("cmake") is not None,
                        shutil.which("cmake") or "PATH", "apt-get install cmake")
    capabilities = [
        Capability("twin", "the program's instructions on the host, NPU partitions by the "
                   "Ethos-U functional model and the TOSA reference model", packages),
        Capability("host runtime", "the real ExecuTorch runtime with the Cortex-M kernels and "
                   "CMSIS-NN built for the host", (*packages, _host_compiler(),
                                                   _trees(("executorch", "cmsis-nn")))),
    ]
    fvps = []
    for name in list_platforms():
        try:
            platform = load_platform(name)
        except PlatformError:
            continue
        title = platform_title(name)
        try:
            config = load_firmware_config(platform)
        except (QemuUnavailable, PlatformError, KeyError, TypeError, ValueError):
            config = None
        if config is not None:
            capabilities.append(Capability(
                f"QEMU {title}", f"the runner firmware on QEMU {config.qemu_machine} "
                f"({config.core_text}), NPU partitions over the semihosting bridge",
                (*packages, toolchain, qemu, _trees(every_tree))))
        if platform.npu_options and platform.fvp:
            npu = platform.npu_default or platform.npu_options[0]
            try:
                spec_binary = platform.fvp_spec(npu).binary
                binary = find_fvp(platform, npu)
            except (KeyError, PlatformError):
                continue
            fvps.append(Capability(
                f"FVP {title}", f"Arm's {spec_binary} runs the runner with the NPU modelled",
                (Requirement(spec_binary, binary is not None, str(binary) if binary else
                             f"PATH and ${FVP_DIR_ENV}",
                             f"install Arm's Corstone FVP and export {FVP_DIR_ENV}=/path/to/"
                             "its models folder"),), optional=True))
    try:
        tiers = "; ".join(
            f"{m.name} ({', '.join(c.removeprefix('cortex-') for c in dict.fromkeys((m.cpu, *m.runs)))})"
            for m in machines().values())
    except QemuUnavailable:
        tiers = ""
    if tiers:
        capabilities.append(Capability(
            "QEMU every ISA tier", "CPU-only programs of every core: the runner built with the "
            f"core's flags on QEMU's machine for it: {tiers}",
            (*packages, toolchain, qemu, _trees(every_tree))))
    capabilities.append(Capability(
        "release firmware", "`orchestrate firmware`: a CMake project built with the GNU Arm "
        "toolchain (--run: on QEMU)", (toolchain, cmake, _trees(every_tree))))
    return MachineReport(tuple(capabilities + fvps))
