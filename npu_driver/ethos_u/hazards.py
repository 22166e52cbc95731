"""DMA and kernel operations that may overlap on the device, checked against the waits that
order them (`HazardTracker`): the register machine executes in stream order, which is what the
device computes only when every dependent pair is ordered by NPU_OP_DMA_WAIT / KERNEL_WAIT."""

from __future__ import annotations

from collections import deque

from npu_driver.ethos_u.stream import Command


# Vela's model of the queues (architecture_features.py: max_outstanding_dma 1 on U55, 2 on
# U65; max_outstanding_kernels 2), under which it computes the DMA_WAIT/KERNEL_WAIT counts.
MAX_OUTSTANDING_DMA = {0: 1, 1: 2}
MAX_OUTSTANDING_KERNELS = 2


def _conflicts(first, second) -> tuple | None:
    """The first pair of accesses (kind, region, lowest, highest) where one writes what the
    other touches."""
    for a in first:
        for b in second:
            if a[1] == b[1] and "write" in (a[0], b[0]) and a[2] <= b[3] and b[2] <= a[3]:
                return a, b
    return None


class HazardTracker:
    """DMA and kernel operations run concurrently on the device; NPU_OP_DMA_WAIT n (at most n
    DMAs still running) and NPU_OP_KERNEL_WAIT n order them. A kernel operation touching bytes
    an outstanding DMA writes (or writing bytes it reads), or a DMA doing so to an outstanding
    kernel operation, is a hazard: in-order execution (this model) is then not what the device
    is guaranteed to compute. Kernel-to-kernel overlap is governed by BLOCKDEP, not checked."""

    def __init__(self, max_dma: int, max_kernels: int = MAX_OUTSTANDING_KERNELS):
        self.dma = deque()
        self.kernels = deque()
        self.max_dma = max_dma
        self.max_kernels = max_kernels

    def wait(self, queue: deque, outstanding: int) -> None:
        while len(queue) > outstanding:
            queue.popleft()

    def issue(self, command: Command, accesses, is_dma: bool) -> list[str]:
        found = []
        others, own, limit = ((self.kernels, self.dma, self.max_dma) if is_dma else
                              (self.dma, self.kernels, self.max_kernels))
        for other_command, other_accesses in others:
            clash = _conflicts(accesses, other_accesses)
            if clash:
                (kind, region, lo, hi), (okind, _, olo, ohi) = clash
                place = "SHRAM" if region < 0 else f"region {region}"
                found.append(f"{command.name} at word {command.offset} {kind}s {place} bytes "
                             f"{lo}..{hi} while {other_command.name} at word "
                             f"{other_command.offset} ({okind}s {olo}..{ohi}) may still run: "
                             f"no {'KERNEL' if is_dma else 'DMA'}_WAIT orders them")
        self.wait(own, limit - 1)
        own.append((command, tuple(accesses)))
        return found
