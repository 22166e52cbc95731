"""orchestrate: one ExecuTorch .pte for a Cortex-M + Ethos-U microcontroller, every op placed.

The Python API (`plan`, `compile`, `verify`, `sweep`, `size`, `measure`, `calibrate`) is in
orchestrator/api.py; the CLI is a shell over it.
"""

from orchestrator import numerics as _numerics

# Before anything imports torch: the float kernels it picks decide calibration results.
_numerics.pin()

from orchestrator.api import (  # noqa: E402,A004
    CompileResult, calibrate, compile, measure, plan, size, sweep, verify)

__all__ = ["CompileResult", "calibrate", "compile", "measure", "plan", "size", "sweep", "verify"]
