"""orchestrate: one ExecuTorch .pte for a Cortex-M + Ethos-U microcontroller, every op placed.

The Python API (`plan`, `compile`, `verify`, `measure`) is in orchestrator/api.py; the CLI is a shell over it.
"""

from orchestrator import numerics as _numerics

# Before anything imports torch: the float kernels it picks decide calibration results.
_numerics.pin()

from orchestrator.api import CompileResult, compile, measure, plan, verify  # noqa: E402,A004

__all__ = ["CompileResult", "compile", "measure", "plan", "verify"]
