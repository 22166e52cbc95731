"""What we compile for: a platform, its NPU (or none), its CPU and ISA tier, and the I/O type."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass

from orchestrator.errors import UserError
from platforms import PlatformError, cpu_tier, load_platform, normalize_cpu

if TYPE_CHECKING:  # types only; the modules import heavy upstream packages
    from platforms.platform import Platform

IO_TYPES = ("float", "int8")
# What --io accepts: a type, or `auto` (compile both, keep the smaller arena among the types the
# platform's firmware takes: orchestrator/compilation/pipeline.py, stage choose_io).
IO_CHOICES = (*IO_TYPES, "auto")


def io_request(io: str) -> tuple[str, bool]:
    """(the I/O type to compile first, whether `--io auto` chooses): `auto` starts from float."""
    return ("float", True) if io == "auto" else (io, False)


@dataclass(frozen=True)
class Target:
    platform: Platform
    npu: str | None  # upstream name, e.g. "ethos-u55-128"; None for CPU-only
    cpu: str  # upstream target string, e.g. "cortex-m55"
    tier: str  # scalar | dsp | mve
    io: str  # float | int8
    cpu_hz: int
    npu_hz: int | None
    system_config: str | None
    memory_mode: str | None

    @property
    def npu_macs(self) -> int | None:
        return int(self.npu.rsplit("-", 1)[1]) if self.npu else None

    def describe(self) -> str:
        npu = self.npu or "no NPU"
        return f"{self.platform.name}: {self.cpu} ({self.tier}) + {npu}, io {self.io}"

    def to_json(self) -> dict:
        return {
            "platform": self.platform.name,
            "platform_file": str(getattr(self.platform, "source_file", "") or ""),
            "npu": self.npu,
            "cpu": self.cpu,
            "isa_tier": self.tier,
            "io": self.io,
            "cpu_hz": self.cpu_hz,
            "npu_hz": self.npu_hz,
            "vela_system_config": self.system_config,
            "vela_memory_mode": self.memory_mode,
        }


def resolve_target(platform: str, npu: str | None = None, cpu: str | None = None,
                   io: str = "float", cpu_hz: int | None = None,
                   npu_hz: int | None = None) -> Target:
    """Resolve command-line choices against the platform YAML; one clear UserError on bad input."""
    try:
        plat = load_platform(platform)
        cpu_name = normalize_cpu(cpu) if cpu else plat.cpu_default
        if (npu is not None and npu.lower() == "none") or (not npu and not plat.npu_options):
            npu_name = None  # asked for CPU only, or a part without an NPU
        else:
            npu_name = npu.lower() if npu else plat.npu_default
            plat.validate_npu(npu_name)
        tier = cpu_tier(cpu_name)
    except PlatformError as error:
        raise UserError(str(error)) from None
    io = io_request(io)[0]
    if io not in IO_TYPES:
        raise UserError(f"--io {io!r} is not supported; use one of: {', '.join(IO_CHOICES)}")
    system_config = memory_mode = None
    if npu_name:
        system_config, memory_mode = plat.vela_config(npu_name)
    return Target(
        platform=plat, npu=npu_name, cpu=cpu_name, tier=tier, io=io,
        cpu_hz=int(cpu_hz or plat.cpu_hz),
        npu_hz=int(npu_hz or plat.npu_hz) if npu_name else None,
        system_config=system_config, memory_mode=memory_mode,
    )


def compile_spec(target: Target, vela_flags: tuple[str, ...] = ()):
    """ExecuTorch's EthosUCompileSpec for an NPU target (Vela system config and memory mode, and
    any extra Vela flags)."""
    from executorch.backends.arm.ethosu import EthosUCompileSpec  # lazy: heavy (executorch, vela)

    return EthosUCompileSpec(target.npu, system_config=target.system_config,
                             memory_mode=target.memory_mode,
                             extra_flags=list(vela_flags) or None)
