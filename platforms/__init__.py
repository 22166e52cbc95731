"""Hardware as data: each platform is one YAML file (shipped ones live in a folder of this package,
a user's own SoC is any .yaml path); `load_platform` turns it into a frozen `Platform`. The FVP
harness for `orchestrate verify --fvp` is in `platforms.fvp`."""

from platforms.platform import (
    CPU_TIERS,
    MEMORY_KINDS,
    MEMORY_USES,
    FvpSpec,
    MemoryRegion,
    Platform,
    PlatformError,
    VelaConfig,
    cpu_tier,
    list_platforms,
    load_platform,
    normalize_cpu,
    parse_npu_name,
)

__all__ = [
    "CPU_TIERS",
    "MEMORY_KINDS",
    "MEMORY_USES",
    "FvpSpec",
    "MemoryRegion",
    "Platform",
    "PlatformError",
    "VelaConfig",
    "cpu_tier",
    "list_platforms",
    "load_platform",
    "normalize_cpu",
    "parse_npu_name",
]
