"""The verification methods' names and what each reports (`MethodResult`): shared by the twin's
method here and the device-code methods and the verdict in orchestrator/device_runs/.
"""

from __future__ import annotations

from dataclasses import dataclass

TWIN, RUNTIME, QEMU = "twin", "host runtime", "QEMU Cortex-M55"


@dataclass(frozen=True)
class MethodResult:
    name: str
    outcome: str  # passed | failed | partial | inconclusive | not-run
    detail: str  # the method's own verdict line, or why it did not run
    device_code: bool  # the method executes the device's own runtime and kernels
    text: str = ""  # the method's full report (text)
    report: dict | None = None  # the method's JSON report
