"""Offsets inside one planned buffer from the tensors' sizes and lifetimes, and the lower bound.

A planned buffer holds tensors that each live over an interval of instructions. Two tensors may
share bytes when their lifetimes do not overlap; no layout can be smaller than the peak, over
instructions, of the bytes live there (`live_bytes_bound`). ExecuTorch's `greedy` groups tensors
into shared objects stacked one after another, so a small tensor that could fill a hole beside
a large one opens an object of its own: MobileNet-v1-0.25 CPU-only with int8 I/O plans 73,728 B
where 55,296 B are live at the peak.

`best_offsets` places each tensor, in one order, at an offset where it overlaps no placed tensor
it is alive with: the smallest hole that holds it (best fit) or the lowest (first fit), else on
top, the "greedy by size" of TFLite's arena planner (Pisarchyk & Lee, 2020). It tries a few
orders (size, lifetime start, size x duration, duration), each improved by moving the block that
ends on top to the front, and keeps the smallest buffer, stopping at the bound. Sizes are already aligned (ExecuTorch's `allocated_memory`), so every offset, a
sum of sizes, is aligned too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class Block:
    """One tensor to place: its aligned bytes and its lifetime (first and last instruction
    index, both inclusive, as ExecuTorch's `TensorSpec.lifetime`)."""

    bytes: int
    first: int
    last: int

    def alive_with(self, other: "Block") -> bool:
        return not (self.last < other.first or self.first > other.last)


@dataclass(frozen=True)
class Layout:
    """Where each block starts (same order as the blocks), the buffer's bytes and how it was
    found (the order and the fit)."""

    offsets: tuple[int, ...]
    bytes: int
    method: str


def live_bytes_bound(blocks: Sequence[Block]) -> int:
    """The peak, over instructions, of the bytes of the blocks alive there: a lower bound on any
    layout of these blocks (two blocks alive at one instruction cannot share a byte)."""
    events: list[tuple[int, int]] = []
    for b in blocks:
        if b.bytes:
            events.append((b.first, b.bytes))
            events.append((b.last + 1, -b.bytes))
    live = peak = 0
    # At one index, the blocks that ended free their bytes before the ones starting take theirs.
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        live += delta
        peak = max(peak, live)
    return peak


def _neighbours(blocks: Sequence[Block]) -> list[list[int]]:
    """For each block, the blocks of non-zero size alive with it: one sweep by lifetime start,
    so the cost is the pairs that overlap, not all pairs."""
    neighbours: list[list[int]] = [[] for _ in blocks]
    active: list[int] = []
    for i in sorted(range(len(blocks)), key=lambda i: blocks[i].first):
        if not blocks[i].bytes:
            continue
        active = [j for j in active if blocks[j].last >= blocks[i].first]
        for j in active:
            neighbours[i].append(j)
            neighbours[j].append(i)
        active.append(i)
    return neighbours


def _place(blocks: Sequence[Block], neighbours: list[list[int]], order: Sequence[int],
           best_fit: bool) -> tuple[list[int], int]:
    offsets: list[int | None] = [None] * len(blocks)
    top = 0
    for i in order:
        block = blocks[i]
        busy = sorted((offsets[j], offsets[j] + blocks[j].bytes) for j in neighbours[i]
                      if offsets[j] is not None)
        chosen, smallest, cursor = None, None, 0
        for start, end in busy:
            hole = start - cursor
            if hole >= block.bytes and (smallest is None or hole < smallest):
                chosen, smallest = cursor, hole
                if not best_fit:
                    break
            cursor = max(cursor, end)
        offsets[i] = cursor if chosen is None else chosen
        top = max(top, offsets[i] + block.bytes)
    return offsets, top


# Each key sorts the block indices; ties go to the program's order (the index), so the layout
# is reproducible.
ORDERS: dict[str, Callable[[Block, int], tuple]] = {
    "size": lambda b, i: (-b.bytes, b.first, i),
    "lifetime start": lambda b, i: (b.first, -b.bytes, i),
    "size x duration": lambda b, i: (-b.bytes * (b.last - b.first + 1), -b.bytes, i),
    "duration": lambda b, i: (-(b.last - b.first), -b.bytes, i),
}


# Overlapping pairs one search may visit: MobileNet-v1-0.25's 58 tensors take a few ms; a
# program of thousands of tensors still plans in about a second.
_WORK_PAIRS = 2_000_000


def best_offsets(blocks: Sequence[Block], orders: Sequence[str] = tuple(ORDERS)) -> Layout:
    """The smallest layout found from `orders` x (best fit, first fit). From each start, the
    block that ends on top is moved to the front of the order and the blocks placed again, while
    that finds a new order and the work allows (a large block whose lifetime meets two others
    is best placed before them: MobileNet's 36,864 B activation beside the 18,432 B one before
    it). The first layout found wins a tie; the search stops once a layout reaches
    `live_bytes_bound`."""
    bound = live_bytes_bound(blocks)
    neighbours = _neighbours(blocks)
    pairs = sum(len(n) for n in neighbours) + len(blocks)
    rounds = max(1, min(2 * len(blocks), _WORK_PAIRS // (pairs * 2 * len(orders))))
    best: Layout | None = None
    for name in orders:
        key = ORDERS[name]
        start = sorted(range(len(blocks)), key=lambda i: key(blocks[i], i))
        for best_fit in (True, False):
            order, seen = list(start), set()
            for moved in range(rounds):
                offsets, top = _place(blocks, neighbours, order, best_fit)
                if best is None or top < best.bytes:
                    best = Layout(tuple(offsets), top,
                                  f"by {name}, {'best' if best_fit else 'first'} fit"
                                  + (f", {moved} moved to the front" if moved else ""))
                if best.bytes <= bound:
                    return best
                seen.add(tuple(order))
                on_top = next(i for i in order if offsets[i] + blocks[i].bytes == top)
                order.remove(on_top)
                order.insert(0, on_top)
                if tuple(order) in seen:
                    break
    return best if best is not None else Layout((), 0, "empty")


def check_layout(blocks: Sequence[Block], offsets: Sequence[int]) -> None:
    """Raise when two blocks alive together share a byte (the planner's own invariant)."""
    for i, alive in enumerate(_neighbours(blocks)):
        a = blocks[i]
        for j in alive:
            b = blocks[j]
            if i < j and offsets[i] < offsets[j] + b.bytes and offsets[j] < offsets[i] + a.bytes:
                raise AssertionError(f"blocks {i} and {j} are alive together and overlap: "
                                     f"{a} at {offsets[i]}, {b} at {offsets[j]}")
