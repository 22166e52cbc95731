"""orchestrate: one ExecuTorch .pte for a Cortex-M + Ethos-U microcontroller, every op placed."""

from orchestrator import numerics as _numerics

# Before anything imports torch: the float kernels it picks decide calibration results.
_numerics.pin()
