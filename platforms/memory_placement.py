"""Memory placement: which region holds each buffer of a program, and what it costs the CPU to read.

What a device can place, ExecuTorch decides in units this module respects:

- the `.pte` (or `.bpte`) image: loaded once where the firmware links it (flash, usually). The
  NPU reads its delegates' weights in place from it, so with NPU partitions it must sit where
  the NPU can reach;
- the activations: ExecuTorch's planned buffers (one per `mem_id`), each in the region the
  compile chose for it (platforms/arena_planning.py: the fastest RAM keeps the tensors with the
  most CPU traffic that fit, the rest go to the next region);
- the NPU scratch (Vela): one block, reused by all partitions;
- the CPU weights: the program's constant segment. The runtime asks its data loader for that
  segment as one block (runtime/executor/program.cpp, `SegmentInfo::Type::Constant`), so a
  firmware can copy it into a faster region at boot and serve it from there (the Corstone-300
  runner does: platforms/corstone300/runner). Individual tensors cannot be split off without
  changing the runtime, so the choice is per segment: the plan ranks the ops by the cycles their
  weights cost in each region, and moves the segment when a faster region has room for all of it.

Read costs come from the platform YAML (`cpu_read.cycles_per_byte`, each with its source); a
region without a figure keeps the cost model's calibrated flash streaming rate.

A policy (`--memory-policy`) is `auto` (the default: the rules above), `in-place` (CPU weights
read from the image where it lies, as the calibration boards did), or a YAML file:
`weights: REGION|auto|in-place`, `arena: auto|REGION|[REGION, REGION, ...]` (one region: one
arena there; a list: split over those regions in that order, the last taking what the others
cannot) and `keep_free: {REGION: BYTES, ...}` (what the application keeps of a region for
itself, on top of the firmware's own use the platform YAML reserves).

Activations come before the CPU weights: a byte of activation is written once and read at least
once per inference, a byte of weights read once, so the weights copy takes what the arenas leave.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernels.safe_files import DataFileError, load_yaml
from platforms.memory_fit import MemoryUse, free_space, place
from platforms.platform import PlatformError

WEIGHTS_ITEM = "cpu weights (constant segment, copied at boot)"
POLICY_KEYS = ("weights", "arena", "keep_free")


@dataclass(frozen=True)
class ArenaSlot:
    """One planned buffer: the region it goes to and the bytes it may take there (None: no
    limit; the last region takes what the others cannot)."""

    region: str
    budget: int | None


@dataclass(frozen=True)
class Arena:
    """One ExecuTorch planned buffer as compiled: its mem_id, region, size and tensor count, the
    lower bound on its size from its tensors' lifetimes (the peak of the bytes live at one
    instruction), what upstream's greedy planner alone would have taken, and the planner whose
    offsets were kept (platforms/arena_planning.py: plan_buffers)."""

    mem_id: int
    region: str
    bytes: int
    tensors: int
    budget: int | None = None
    bound_bytes: int | None = None
    greedy_bytes: int | None = None
    planner: str | None = None

    def to_json(self) -> dict:
        return {"mem_id": self.mem_id, "region": self.region, "bytes": self.bytes,
                "bytes_source": "planned", "tensors": self.tensors, "budget": self.budget,
                "live_bytes_bound": self.bound_bytes,
                "live_bytes_bound_source": BOUND_SOURCE if self.bound_bytes is not None else None,
                "upstream_greedy_bytes": self.greedy_bytes, "planner": self.planner}


BOUND_SOURCE = "lower bound from lifetimes (peak of the aligned bytes live at one instruction)"


@dataclass(frozen=True)
class MemoryPolicy:
    weights: str = "auto"  # auto | in-place | a region name
    arena: str | tuple[str, ...] = "auto"  # auto | a region name | regions to split over
    source: str = "auto"  # "auto", "in-place" or the policy file's path
    keep_free: tuple[tuple[str, int], ...] = ()  # (region, bytes) the application keeps

    def to_json(self) -> dict:
        return {"weights": self.weights,
                "arena": list(self.arena) if isinstance(self.arena, tuple) else self.arena,
                "keep_free": dict(self.keep_free), "source": self.source}

    def free_space(self, platform) -> dict[str, int]:
        """Bytes per region a program may use: the region less the firmware's reserve (platform
        YAML) and what this policy keeps free."""
        free = free_space(platform)
        for region, size in self.keep_free:
            free[region] = max(0, free[region] - size)
        return free


def arena_bound_bytes(arenas) -> int | None:
    """The live-bytes lower bound of a program's arenas together (platforms/arena_planning.py),
    None when one has no planned buffer record."""
    bounds = [a.bound_bytes for a in arenas]
    return sum(bounds) if bounds and None not in bounds else None


def load_memory_policy(text: str | None) -> MemoryPolicy:
    """`auto`, `in-place` or a YAML file path; PlatformError names the problem."""
    if text in (None, "", "auto"):
        return MemoryPolicy()
    if text == "in-place":
        return MemoryPolicy(weights="in-place", source="in-place")

    path = Path(text)
    if not path.is_file():
        raise PlatformError(f"--memory-policy {text!r}: not auto, in-place or an existing YAML "
                            "file (keys: weights, arena)")

    try:
        data = load_yaml(path)
    except DataFileError as error:
        raise PlatformError(f"--memory-policy {error}") from None
    if not isinstance(data, dict):
        raise PlatformError(f"--memory-policy {text}: expected a mapping with keys "
                            f"{', '.join(POLICY_KEYS)}")
    unknown = sorted(str(k) for k in data if k not in POLICY_KEYS)
    if unknown:
        raise PlatformError(f"--memory-policy {text}: unknown key '{unknown[0]}' (allowed: "
                            f"{', '.join(POLICY_KEYS)})")
    keep_free = data.get("keep_free", {})
    if not isinstance(keep_free, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in keep_free.items()):
        raise PlatformError(f"--memory-policy {text}: keep_free must map region names to "
                            "byte counts (e.g. keep_free: {dtcm: 65536})")
    values = {k: data.get(k, "auto") for k in POLICY_KEYS if k != "keep_free"}
    arena = values["arena"]
    if isinstance(arena, list):
        if not arena or not all(isinstance(r, str) and r for r in arena) \
                or len(set(arena)) != len(arena):
            raise PlatformError(f"--memory-policy {text}: arena must list distinct region names")
        values["arena"] = tuple(arena)
    for key, value in values.items():
        if not (isinstance(value, str) and value) and not (key == "arena"
                                                           and isinstance(value, tuple)):
            raise PlatformError(f"--memory-policy {text}: {key} must be a region name or auto"
                                + (" (or a list of regions)" if key == "arena" else ""))
    return MemoryPolicy(values["weights"], values["arena"], str(path),
                        tuple(sorted(keep_free.items())))


@dataclass(frozen=True)
class MemoryPlacement:
    items: tuple[MemoryUse, ...]
    weights_region: str | None  # where CPU kernels read their weights
    weights_cycles_per_byte: float | None  # None: the calibrated flash rate applies
    weights_source: str
    image_region: str | None
    policy: MemoryPolicy
    # Each planned buffer (Arena) with its region's read cost
    # (cycles per byte, None: no figure) and that figure's source; the first is the fastest.
    arenas: tuple[tuple[Arena, float | None, str], ...] = ()
    gain_cycles: int = 0  # CPU cycles per inference the weights copy saves (cost model)
    hottest: tuple[tuple[str, int], ...] = ()  # (row name, cycles saved), the ops that gain most

    @property
    def weights_copied(self) -> bool:
        return self.weights_region is not None and self.weights_region != self.image_region

    @property
    def arena_region(self) -> str | None:
        """The region of the first (fastest) arena."""
        return self.arenas[0][0].region if self.arenas else None

    @property
    def arena_cycles_per_byte(self) -> float | None:
        """The read cost of the first arena's region (None: no figure)."""
        return self.arenas[0][1] if self.arenas else None


def _region(platform, name: str | None):
    return next((r for r in platform.memories if r.name == name), None)


def _check_region(platform, use: str, name: str, policy: MemoryPolicy,
                  holds: bool = True) -> None:
    """PlatformError unless `platform` has region `name` and (with `holds`) it may hold `use`."""
    region = _region(platform, name)
    if region is None:
        raise PlatformError(f"memory policy ({policy.source}): {use} region '{name}' is not a "
                            f"memory of {platform.name} (known: "
                            f"{', '.join(r.name for r in platform.memories)})")
    if holds and not region.may_hold(use):
        raise PlatformError(f"memory policy ({policy.source}): {platform.name}'s {name} may not "
                            f"hold {use} (its YAML lists: {', '.join(sorted(region.holds))})")


def check_policy(platform, policy: MemoryPolicy) -> None:
    """PlatformError naming the first region of `policy` that `platform` lacks or that may not
    hold its use: checked before anything compiles."""
    arenas = policy.arena if isinstance(policy.arena, tuple) else (policy.arena,)
    for use, name in (("weights", policy.weights), *(("arena", a) for a in arenas)):
        if name not in ("auto", "in-place"):
            _check_region(platform, use, name, policy)
    for name, _ in policy.keep_free:
        _check_region(platform, "keep_free", name, policy, holds=False)
    if policy.arena == "in-place":
        raise PlatformError(f"memory policy ({policy.source}): arena must be a region or auto")


def read_cost(region, unknown: float = float("inf")) -> float:
    """A region's CPU read cost in cycles per byte; `unknown` for one without a figure (the
    cost model's calibrated flash streaming rate, or infinity: slower than any known one)."""
    cost = region.cpu_read_cycles_per_byte
    return unknown if cost is None else cost


def place_program(platform, pte_bytes: int, arenas, constant_segment_bytes: int,
                  npu_scratch: tuple[int, int] | None, policy: MemoryPolicy,
                  unknown_cycles_per_byte: float = float("inf"),
                  npu_weights_in_sram: bool = False) -> MemoryPlacement:
    """Place image, arenas, NPU scratch and (when it pays) the CPU weights; see the docstring.
    `arenas`: the compile's planned buffers (platforms.arena_planning.Arena), each already
    assigned a region. `unknown_cycles_per_byte`: what reading a region without a `cpu_read`
    figure costs (the cost model's calibrated rate for the target's core).
    `npu_weights_in_sram`: Vela compiled the NPU partitions for its Sram_Only memory mode, whose
    cycle estimates read the weights at SRAM speed: the image goes in an SRAM region, or does
    not fit (in flash Vela's figures would not hold)."""
    check_policy(platform, policy)
    free = policy.free_space(platform)
    items = [place(platform, "weights", pte_bytes,
                   ".pte (weights, code data; in SRAM: Vela's Sram_Only mode)"
                   if npu_weights_in_sram else ".pte (weights, code data)", "executorch",
                   free, npu_reads=npu_scratch is not None,
                   kinds=("sram",) if npu_weights_in_sram else None)]
    image_region = items[0].region
    for arena in arenas:
        name = ("executorch arena" if len(arenas) == 1 else
                f"executorch arena {arena.mem_id} of {len(arenas)} ({arena.tensors} tensors)")
        items.append(_place_in(platform, arena.region, arena.bytes, name, free))
    if npu_scratch is not None:
        index, size = npu_scratch
        items.append(place(platform, "npu_scratch", size,
                           f"npu scratch (largest, p{index}; reused by all partitions)", "vela",
                           free))
    weights_region = image_region
    if constant_segment_bytes and policy.weights not in ("auto", "in-place"):
        items.append(_place_in(platform, policy.weights, constant_segment_bytes, WEIGHTS_ITEM,
                               free))
        weights_region = policy.weights
    elif constant_segment_bytes and policy.weights == "auto":
        here = _region(platform, image_region)

        def cost(region) -> float:
            return read_cost(region, unknown_cycles_per_byte)

        faster = sorted((r for r in platform.memories if r.may_hold("weights")
                         and free[r.name] >= constant_segment_bytes
                         and cost(r) < (cost(here) if here else float("inf"))), key=cost)
        if faster:
            items.append(_place_in(platform, faster[0].name, constant_segment_bytes,
                                   WEIGHTS_ITEM, free))
            weights_region = faster[0].name
    weights = _region(platform, weights_region)
    placed = tuple((a, _region(platform, a.region).cpu_read_cycles_per_byte,
                    _region(platform, a.region).cpu_read_source) for a in arenas)
    return MemoryPlacement(
        tuple(items), weights_region,
        weights.cpu_read_cycles_per_byte if weights else None,
        (weights.cpu_read_source if weights and weights.cpu_read_cycles_per_byte is not None
         else "calibrated flash streaming rate (cost model data)"),
        image_region, policy, placed)


def _place_in(platform, name: str, size: int, item: str, free: dict) -> MemoryUse:
    region = _region(platform, name)
    fits = size <= free[name]
    if fits:
        free[name] -= size
    return MemoryUse(item, size, "executorch", name, region.size_bytes if fits else free[name],
                     fits)
