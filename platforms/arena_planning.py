"""Activation arenas across memory regions, through ExecuTorch's own memory planning.

ExecuTorch plans every activation into numbered buffers (`mem_id` 1, 2, ...); a firmware hands
the method one span per buffer (HierarchicalAllocator), so each buffer may sit in a different
region. This module decides which tensors go to which buffer:

- the activations go to the platform's fastest region that may hold an arena (DTCM on the
  Corstone platforms), with what the firmware leaves of it as the budget;
- when they do not all fit, the fast region keeps the tensors with the most CPU traffic (bytes x
  accesses: one write, one read per reader) that fit with ExecuTorch's reuse, and the rest go to
  the next region, one ExecuTorch buffer per region. The plan then charges each op's activation
  traffic at the speed of the region its tensors are in.

The split runs inside ExecuTorch's MemoryPlanningPass as its planning algorithm, with
upstream's lifetimes (`TensorSpec.lifetime`), alignment and aliasing (`storage_base`). Each
buffer's offsets come from `plan_buffers`: the smaller of upstream's `greedy` and our own
lifetime best fit (platforms/offset_planning.py), which reaches the peak of live bytes where
greedy's stacked shared objects leave holes; the buffer of each tensor (`TensorSpec.mem_id`) is
chosen here.

Control flow (cond/while submodules) keeps one arena, in the fast region when it fits there, else
in the last one: submodule buffers are planned with offsets into the parent's buffers, which a
split would break. Both planners honour that: the parent's tensors start above the submodules'
bytes (`input_mem_buffer_sizes`), which the bound counts as live throughout.
"""

from __future__ import annotations

from collections.abc import Hashable

from dataclasses import dataclass
from typing import Callable, Sequence

from platforms.memory_fit import KIND_PREFERENCE
from platforms.offset_planning import ORDERS, Block, best_offsets, check_layout, live_bytes_bound
from platforms.memory_placement import Arena, ArenaSlot, check_policy, read_cost
from platforms.platform import PlatformError


def arena_slots(platform, policy) -> tuple[ArenaSlot, ...]:
    """The regions the activations may use, fastest first, from a memory policy's `arena`:
    `auto` (the fastest region that may hold an arena, then the next for what does not fit),
    one region name (one arena there, no split) or a list of regions (split in that order)."""
    check_policy(platform, policy)
    arena = policy.arena
    free = policy.free_space(platform)
    if isinstance(arena, str) and arena != "auto":
        return (ArenaSlot(arena, None),)
    if isinstance(arena, (tuple, list)):
        names = list(arena)
    else:
        order = KIND_PREFERENCE["arena"]
        candidates = [(index, r) for index, r in enumerate(platform.memories)
                      if r.may_hold("arena")]
        if not candidates:
            raise PlatformError(f"{platform.name}: no memory may hold the arena (holds: arena)")
        candidates.sort(key=lambda ir: (read_cost(ir[1]),
                                        order.index(ir[1].kind) if ir[1].kind in order
                                        else len(order), ir[0]))
        names = [r.name for _, r in candidates[:2]]
    return tuple(ArenaSlot(name, free[name] if i < len(names) - 1 else None)
                 for i, name in enumerate(names))


@dataclass(frozen=True)
class Tensor:
    """What the split needs of one planned tensor: a key, its bytes, how often the CPU touches it."""

    key: Hashable  # any value naming the tensor uniquely
    bytes: int
    accesses: int


def split(tensors: Sequence[Tensor], slots: Sequence[ArenaSlot],
          size_of: Callable[[list], int]) -> list[int]:
    """The slot of each tensor (indices into `slots`). `size_of(keys)` plans one buffer holding
    those tensors (with the planner's reuse) and returns its size. Slots are filled in order:
    each takes the tensors with the most CPU traffic (bytes x accesses) first, one at a time,
    keeping each that still lets the buffer fit its budget (two tensors that are never alive
    together share bytes, so this keeps more traffic than taking the smallest); the rest go on
    to the next slot."""
    slot_of = [0] * len(tensors)
    remaining = list(range(len(tensors)))
    for index, slot in enumerate(slots[:-1]):
        if slot.budget is None or not remaining:
            break

        def fits(chosen: list[int]) -> bool:
            # In the program's order: greedy breaks ties by order, and the plan must be
            # reproducible.
            return size_of([tensors[i].key for i in sorted(chosen)]) <= slot.budget

        if fits(remaining):
            break
        kept: list[int] = []
        for i in sorted(remaining, key=lambda i: (-tensors[i].bytes * tensors[i].accesses, i)):
            if tensors[i].bytes <= slot.budget and fits(kept + [i]):
                kept.append(i)
        evicted = [i for i in remaining if i not in set(kept)]
        for i in evicted:
            slot_of[i] = index + 1
        remaining = evicted
    return slot_of


@dataclass
class ArenaRecord:
    """Filled by the planning algorithm: the arenas and each node's mem_id (for the plan)."""

    arenas: tuple[Arena, ...] = ()
    mem_id_of: dict[str, int] | None = None  # node name -> mem_id


def _accesses(graph_module) -> dict:
    """TensorSpec -> times the CPU touches it in one inference: once per instruction that writes
    or reads it (an out-variant's `out` argument is its write), once more for a program output
    the firmware reads."""
    from executorch.exir.tensor import TensorSpec  # lazy: heavy (executorch)

    counts: dict = {}
    for node in graph_module.graph.nodes:
        if node.op not in ("call_function", "output") or "alloc" in str(node.target):
            continue
        for arg in node.all_input_nodes:
            specs = arg.meta.get("spec")
            for spec in specs if isinstance(specs, (tuple, list)) else (specs,):
                if isinstance(spec, TensorSpec):
                    counts[spec] = counts.get(spec, 0) + 1
    return counts


@dataclass(frozen=True)
class BufferPlan:
    """One planned buffer's bytes as planned, its live-bytes lower bound, what upstream's
    `greedy` alone would have taken, and which planner's offsets were kept."""

    bytes: int
    bound_bytes: int
    greedy_bytes: int
    planner: str


def _root(spec):
    while getattr(spec, "storage_base", None) is not None:
        spec = spec.storage_base
    return spec


def _offset_in_root(spec) -> int:
    offset = 0
    while getattr(spec, "storage_base", None) is not None:
        offset += spec.storage_base_offset
        spec = spec.storage_base
    return offset


def plan_buffers(alignment, specs, graph_module, graph_signature, extra_padding=0,
                 orders: Sequence[str] = tuple(ORDERS)):
    """ExecuTorch's `MemoryAlgoResult` for `specs` (each buffer laid out by the smaller of
    upstream's `greedy` and `best_offsets`; greedy keeps a tie, so a buffer it already packs to
    the bound keeps its offsets) and a BufferPlan per mem_id. A spec backed by another's storage
    (`storage_base`) sits at its base's offset plus its own `storage_base_offset`, as in greedy."""
    from executorch.exir.memory_planning import (  # lazy: heavy (executorch)
        MemoryAlgoResult, SpecAllocResult, greedy)

    upstream = greedy(alignment, specs, graph_module, graph_signature, extra_padding)
    result = MemoryAlgoResult(dict(upstream.spec_dict), list(upstream.bufsizes))
    under = getattr(graph_module, "input_mem_buffer_sizes", None) or []
    groups: dict[int, list] = {}
    for spec in specs:  # already realigned by greedy; aliases go where their storage goes
        groups.setdefault(upstream.spec_dict[_root(spec)].mem_id, []).append(spec)
    plans: dict[int, BufferPlan] = {}
    next_object = 0
    for mem_id, group in groups.items():
        base = under[mem_id] if mem_id < len(under) else 0
        roots = [s for s in group if getattr(s, "storage_base", None) is None]
        blocks = [Block(s.allocated_memory, s.lifetime[0], s.lifetime[1]) for s in roots]
        bound = base + live_bytes_bound(blocks) + extra_padding
        greedy_bytes = int(upstream.bufsizes[mem_id])
        layout = best_offsets(blocks, orders)
        if base + layout.bytes + extra_padding >= greedy_bytes:
            plans[mem_id] = BufferPlan(greedy_bytes, bound, greedy_bytes, "executorch greedy")
            continue
        check_layout(blocks, layout.offsets)
        root_offset = {id(s): base + o for s, o in zip(roots, layout.offsets)}
        placed = sorted(((root_offset[id(_root(s))] + _offset_in_root(s), s) for s in group),
                        key=lambda p: p[0])
        # mem_obj_id: specs whose bytes overlap share one id (ExecuTorch's Verifier checks it),
        # i.e. one id per run of overlapping byte ranges.
        end = -1
        for offset, spec in placed:
            if offset >= end:
                next_object += 1
            end = max(end, offset + spec.allocated_memory)
            result.spec_dict[spec] = SpecAllocResult(mem_id, next_object, offset)
        result.bufsizes[mem_id] = base + layout.bytes + extra_padding
        plans[mem_id] = BufferPlan(result.bufsizes[mem_id], bound, greedy_bytes,
                                   f"orchestrate lifetime planner ({layout.method})")
    return result, plans


def planning_algorithm(slots: Sequence[ArenaSlot], record: ArenaRecord):
    """A `memory_planning_algo` for ExecuTorch's MemoryPlanningPass: `plan_buffers` per buffer,
    the buffer of each tensor chosen by `split`. Fills `record`."""
    from executorch.exir.memory_planning import (  # lazy: heavy (executorch)
        MemoryPlanningAlgorithmSuite)

    import torch  # lazy: heavy (torch)

    def algo(alignment, specs, graph_module, graph_signature, extra_padding=0):
        plans: dict[int, BufferPlan] = {}

        def lifetime_planner(*args):
            result, found = plan_buffers(*args)
            plans.clear()
            plans.update(found)
            return result

        suite = MemoryPlanningAlgorithmSuite([lifetime_planner])
        has_submodules = any(isinstance(child, torch.fx.GraphModule)
                             for child in graph_module.children())
        if len(slots) < 2 or has_submodules or getattr(graph_module, "input_mem_buffer_sizes",
                                                         None):
            chosen = [0] * len(specs)
            units = [[spec] for spec in specs]
        else:
            # A spec that aliases another's storage goes wherever its base goes.
            groups: dict = {}
            for spec in specs:
                base = spec
                while getattr(base, "storage_base", None) is not None:
                    base = base.storage_base
                groups.setdefault(id(base), []).append(spec)
            units = list(groups.values())
            counts = _accesses(graph_module)
            tensors = [Tensor(i, max(s.allocated_memory for s in unit),
                              sum(counts.get(s, 0) for s in unit))
                       for i, unit in enumerate(units)]

            def size_of(keys) -> int:
                # A list in the program's order, not a set: greedy breaks ties between equal
                # sizes by iteration order, and the .pte must not depend on hash order.
                subset = [s for k in keys for s in units[k]]
                for spec in subset:
                    spec.mem_id = 1
                # One order: the split asks for every candidate set, the final plan tries all.
                return plan_buffers(alignment, subset, graph_module, graph_signature,
                                    extra_padding, orders=("size",))[0].bufsizes[1]

            chosen = split(tensors, slots, size_of)
        used = sorted(set(chosen))
        mem_id = {slot: used.index(slot) + 1 for slot in used}  # no empty buffer between
        for unit, slot in zip(units, chosen):
            for spec in unit:
                spec.mem_id = mem_id[slot]
        bufsizes = suite(alignment, specs, graph_module, graph_signature, extra_padding)
        if used == [0] and len(slots) > 1 and slots[0].budget is not None \
                and bufsizes[1] > slots[0].budget:
            # One arena that the fast region cannot hold (control flow, which is not split):
            # it goes to the last region, which takes what the others cannot.
            used, mem_id, chosen = [len(slots) - 1], {len(slots) - 1: 1}, \
                [len(slots) - 1] * len(units)
        # Upstream plans control-flow submodules first: the last call is the top-level graph.
        counts = {slot: sum(len(u) for u, c in zip(units, chosen) if c == slot) for slot in used}
        record.arenas = tuple(
            Arena(mem_id[slot], slots[slot].region, int(bufsizes[mem_id[slot]]), counts[slot],
                  slots[slot].budget, plans[mem_id[slot]].bound_bytes,
                  plans[mem_id[slot]].greedy_bytes, plans[mem_id[slot]].planner)
            for slot in used)
        record.mem_id_of = {n.name: n.meta["spec"].mem_id for n in graph_module.graph.nodes
                            if getattr(n.meta.get("spec"), "mem_id", None) is not None}
        return bufsizes

    algo.__name__ = "region_split_lifetimes"
    return algo
