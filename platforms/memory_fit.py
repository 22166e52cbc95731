"""Memory fit: where each buffer of a program goes among a platform's memory regions.

First fit, in the preferred region order of each use, against what earlier items left free.
The order is the platform-independent default: the .pte stays in flash/DDR, the arena in the
fastest RAM, the NPU scratch in SRAM; a region holds only the uses its YAML lists.
"""

from __future__ import annotations

from dataclasses import dataclass

# Where each item goes first: the .pte stays in flash/DDR, the arena in the fastest RAM.
KIND_PREFERENCE = {"weights": ("flash", "ddr", "sram", "tcm"), "arena": ("tcm", "sram", "ddr"),
                   "npu_scratch": ("sram", "ddr", "tcm")}


@dataclass(frozen=True)
class MemoryUse:
    item: str  # e.g. "executorch arena", "npu scratch (largest, p1; ...)"
    bytes: int
    source: str  # where the figure comes from: executorch | vela
    region: str | None  # where it is placed (first region of the platform that may hold it)
    region_bytes: int | None
    fits: bool


def free_space(platform) -> dict[str, int]:
    """Bytes free per region before anything of the program is placed: the region's size less
    what the platform reserves for the firmware itself (`reserved:` in its YAML)."""
    reserved = getattr(platform, "reserved", {}) or {}
    return {r.name: r.size_bytes - reserved.get(r.name, (0, ""))[0] for r in platform.memories}


def place(platform, use: str, size: int, item: str, source: str, free: dict[str, int],
          npu_reads: bool = False, kinds: tuple[str, ...] | None = None) -> MemoryUse:
    """Place `size` bytes for `use`; `free` is updated with what remains. `kinds`: only regions
    of these kinds (e.g. the image of a Vela Sram_Only program, whose weights the NPU reads
    from SRAM)."""
    order = KIND_PREFERENCE.get(use, ())
    regions = sorted((r for r in platform.memories if use in r.holds
                      and (kinds is None or r.kind in kinds)),
                     key=lambda r: order.index(r.kind) if r.kind in order else len(order))
    if use == "npu_scratch" or (use == "weights" and npu_reads):
        # The NPU reads its scratch, and its weights in place from the .pte (Vela's command
        # stream addresses them), so both must sit where the NPU can reach.
        regions = [r for r in regions if r.npu_accessible]
    for region in regions:
        if size <= free[region.name]:
            free[region.name] -= size
            return MemoryUse(item, size, source, region.name, region.size_bytes, True)
    largest = max(regions, key=lambda r: free[r.name]) if regions else None
    return MemoryUse(item, size, source, largest.name if largest else None,
                     free[largest.name] if largest else None, False)
