"""Upstream's log and warning noise, silenced once per process.

Upstream libraries log deprecation notes, optional-extension load failures (torchao's CUDA
kernels), pytree registrations and Vela progress; the report is the output. The CLI calls
`quiet_upstream` unless --verbose, and a sweep's worker processes call it first thing when
their parent is quiet (orchestrator/sweeps/local.py), before they import torch.
"""

from __future__ import annotations

import logging
import os
import warnings


def quiet_upstream() -> None:
    warnings.filterwarnings("ignore")
    # ERROR too: torch's fake-tensor tracer logs a whole traceback at ERROR level when an upstream
    # pass fails on a node, which the CPU routing then handles (partitioners/cpu.py).
    logging.disable(logging.ERROR)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def upstream_is_quiet() -> bool:
    """Whether this process silenced upstream (so its workers should too)."""
    return logging.root.manager.disable >= logging.ERROR
