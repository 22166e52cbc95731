"""Memory placement: which region holds each buffer of a program, and what it costs the CPU to read.

What a device can place, ExecuTorch decides in units this module respects:

- the `.pte` (or `.bpte`) image: loaded once where the firmware links it (flash, usually). The
  NPU reads its delegates' weights in place from it, so with NPU partitions it must sit where
  the NPU can reach;
- the activations arena (ExecuTorch's memory plan): one block, placed in the fastest RAM that
  holds it;
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
`weights: REGION|auto|in-place` and `arena: REGION|auto`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from platforms.memory_fit import MemoryUse, free_space, place
from platforms.platform import PlatformError

WEIGHTS_ITEM = "cpu weights (constant segment, copied at boot)"
POLICY_KEYS = ("weights", "arena")


@dataclass(frozen=True)
class MemoryPolicy:
    weights: str = "auto"  # auto | in-place | a region name
    arena: str = "auto"  # auto | a region name
    source: str = "auto"  # "auto", "in-place" or the policy file's path

    def to_json(self) -> dict:
        return {"weights": self.weights, "arena": self.arena, "source": self.source}


def load_memory_policy(text: str | None) -> MemoryPolicy:
    """`auto`, `in-place` or a YAML file path; PlatformError names the problem."""
    if text in (None, "", "auto"):
        return MemoryPolicy()
    if text == "in-place":
        return MemoryPolicy(weights="in-place", source="in-place")
    import yaml

    path = Path(text)
    if not path.is_file():
        raise PlatformError(f"--memory-policy {text!r}: not auto, in-place or an existing YAML "
                            "file (keys: weights, arena)")
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise PlatformError(f"--memory-policy {text}: not readable YAML "
                            f"({type(error).__name__})") from None
    if not isinstance(data, dict):
        raise PlatformError(f"--memory-policy {text}: expected a mapping with keys "
                            f"{', '.join(POLICY_KEYS)}")
    unknown = sorted(str(k) for k in data if k not in POLICY_KEYS)
    if unknown:
        raise PlatformError(f"--memory-policy {text}: unknown key '{unknown[0]}' (allowed: "
                            f"{', '.join(POLICY_KEYS)})")
    values = {k: data.get(k, "auto") for k in POLICY_KEYS}
    for key, value in values.items():
        if not isinstance(value, str) or not value:
            raise PlatformError(f"--memory-policy {text}: {key} must be a region name or auto")
    return MemoryPolicy(values["weights"], values["arena"], str(path))


@dataclass(frozen=True)
class MemoryPlacement:
    items: tuple[MemoryUse, ...]
    weights_region: str | None  # where CPU kernels read their weights
    weights_cycles_per_byte: float | None  # None: the calibrated flash rate applies
    weights_source: str
    arena_region: str | None
    arena_cycles_per_byte: float | None
    arena_source: str
    image_region: str | None
    policy: MemoryPolicy
    gain_cycles: int = 0  # CPU cycles per inference the weights copy saves (cost model)
    hottest: tuple = ()  # (row name, cycles saved), the ops that gain most

    @property
    def weights_copied(self) -> bool:
        return self.weights_region is not None and self.weights_region != self.image_region


def _region(platform, name: str | None):
    return next((r for r in platform.memories if r.name == name), None)


def _check_region(platform, use: str, name: str, policy: MemoryPolicy) -> None:
    region = _region(platform, name)
    if region is None:
        raise PlatformError(f"memory policy ({policy.source}): {use} region '{name}' is not a "
                            f"memory of {platform.name} (known: "
                            f"{', '.join(r.name for r in platform.memories)})")
    if not region.may_hold("weights" if use == "weights" else use):
        raise PlatformError(f"memory policy ({policy.source}): {platform.name}'s {name} may not "
                            f"hold {use} (its YAML lists: {', '.join(sorted(region.holds))})")


def check_policy(platform, policy: MemoryPolicy) -> None:
    """PlatformError naming the first region of `policy` that `platform` lacks or that may not
    hold its use: checked before anything compiles."""
    for use, name in (("weights", policy.weights), ("arena", policy.arena)):
        if name not in ("auto", "in-place"):
            _check_region(platform, use, name, policy)
    if policy.arena == "in-place":
        raise PlatformError(f"memory policy ({policy.source}): arena must be a region or auto")


def _read_cost(region, unknown: float) -> float:
    """A region's CPU read cost; `unknown` (the cost model's calibrated flash streaming rate)
    for one without a figure."""
    cost = region.cpu_read_cycles_per_byte
    return unknown if cost is None else cost


def place_program(platform, pte_bytes: int, arena_bytes: int, constant_segment_bytes: int,
                  npu_scratch: tuple[int, int] | None, policy: MemoryPolicy,
                  unknown_cycles_per_byte: float = float("inf")) -> MemoryPlacement:
    """Place image, arena, NPU scratch and (when it pays) the CPU weights; see the docstring.
    `unknown_cycles_per_byte`: what reading a region without a `cpu_read` figure costs (the
    cost model's calibrated rate for the target's core)."""
    check_policy(platform, policy)
    free = free_space(platform)
    items = [place(platform, "weights", pte_bytes, ".pte (weights, code data)", "executorch",
                   free, npu_reads=npu_scratch is not None)]
    image_region = items[0].region
    if policy.arena == "auto":
        items.append(place(platform, "arena", arena_bytes, "executorch arena", "executorch", free))
    else:
        items.append(_place_in(platform, policy.arena, arena_bytes, "executorch arena", free))
    arena_region = items[-1].region
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
            return _read_cost(region, unknown_cycles_per_byte)

        faster = sorted((r for r in platform.memories if r.may_hold("weights")
                         and free[r.name] >= constant_segment_bytes
                         and cost(r) < (cost(here) if here else float("inf"))), key=cost)
        if faster:
            items.append(_place_in(platform, faster[0].name, constant_segment_bytes,
                                   WEIGHTS_ITEM, free))
            weights_region = faster[0].name
    weights, arena = _region(platform, weights_region), _region(platform, arena_region)
    return MemoryPlacement(
        tuple(items), weights_region,
        weights.cpu_read_cycles_per_byte if weights else None,
        (weights.cpu_read_source if weights and weights.cpu_read_cycles_per_byte is not None
         else "calibrated flash streaming rate (cost model data)"),
        arena_region, arena.cpu_read_cycles_per_byte if arena else None,
        arena.cpu_read_source if arena else "", image_region, policy)


def _place_in(platform, name: str, size: int, item: str, free: dict) -> MemoryUse:
    region = _region(platform, name)
    fits = size <= free[name]
    if fits:
        free[name] -= size
    return MemoryUse(item, size, "executorch", name, region.size_bytes if fits else free[name],
                     fits)
