"""Host float arithmetic that gives the same results on every x86-64 machine.

Calibration runs the float model and its observed ranges become the program's scales, so a
last-bit difference in a float kernel changes the `.pte`. The CPU wheel of torch picks its
kernels by the host's instruction set at run time: MKL (matrix products) by its own dispatch,
ATen's vectorized kernels and oneDNN up to AVX-512 where the host has it. Measured here on
`mixed` for Ethos-U55-128: the default (AVX-512) build and one with MKL pinned gave different
`.pte` bytes, so an AVX2-only machine computed a different program from the same commit.

`pin()` fixes every one of those choices to a path that every x86-64 machine with AVX2 runs
identically: MKL's conditional numerical reproducibility in its COMPATIBLE branch, ATen and
oneDNN capped at AVX2. The libraries read these settings once, when torch is first imported,
so `pin()` runs when `orchestrator` is imported, before torch is; `state()` records what was in
force (the manifest keeps it) and whether the pin came too late to take effect.
"""

from __future__ import annotations

import os
import sys

SETTINGS = {
    "MKL_CBWR": "COMPATIBLE",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
# Intra-op threads for the float runs whose results become program bytes (calibration) or
# verdicts (references): reductions split across threads may sum in another order.
THREADS = 1

_pinned_before_torch: bool | None = None


def pin() -> None:
    """Set the reproducible-numerics environment; effective only before torch is imported."""
    global _pinned_before_torch
    if _pinned_before_torch is not None:
        return
    _pinned_before_torch = "torch" not in sys.modules
    for name, value in SETTINGS.items():
        os.environ[name] = value


def state() -> dict:
    """What governs the host's float results in this process, for the manifest."""
    import torch  # lazy: order (torch after pin())

    return {
        "settings": {name: os.environ.get(name) for name in SETTINGS},
        "pinned_before_torch_import": bool(_pinned_before_torch),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": THREADS,
        "reproducible": bool(_pinned_before_torch)
        and all(os.environ.get(n) == v for n, v in SETTINGS.items()),
    }


class single_threaded:
    """Run a float computation with THREADS intra-op threads, restoring the count after."""

    def __enter__(self):
        import torch  # lazy: order (torch after pin())

        self._saved = torch.get_num_threads()
        torch.set_num_threads(THREADS)
        return self

    def __exit__(self, *exc):
        import torch  # lazy: order (torch after pin())

        torch.set_num_threads(self._saved)
        return False
