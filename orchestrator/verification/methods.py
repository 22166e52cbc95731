"""The one interface every verification method has, its inputs and what it reports.

A method is a `Verifier`: `run(program, inputs) -> MethodResult`, the result saying what the
method concluded, what it exercised (which runtime, kernels and NPU computation ran) and, for
every method that compares outputs, its full report. The methods themselves are registered in
orchestrator/device_runs/combined.py (`VERIFIERS`: twin, host runtime, QEMU, FVP); adding one
(e.g. a board over a debug probe) is one class there and one name here, and `verify` runs it
with the others and lets the verdict rule (`combine`) weigh it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the twin imports torch (seconds)
    from orchestrator.verification.twin import TwinProgram

TWIN, RUNTIME, QEMU, FVP = "twin", "host runtime", "QEMU Cortex-M55", "Corstone FVP"
TFLM = "TFLM reference"  # a program from a full-integer .tflite against the file in TFLM
_CORE = re.compile(r"Cortex-M\d+\w*\+?", re.IGNORECASE)


def qemu_label(core: str | None) -> str:
    """What the QEMU method is called in a report: QEMU and the core that executed the program
    ("QEMU Cortex-M3" for a scalar program on mps2-an385; "QEMU Cortex-M55 (M85)" for a
    Cortex-M85 build on QEMU's Cortex-M55), from a core description
    (FirmwareConfig.core_text) or a `--cpu` name; QEMU's method name (QEMU, above) stays the
    key `--methods` and the JSON use."""
    found = [m.replace("cortex-m", "Cortex-M") for m in _CORE.findall(core or "")]
    if not found:
        return QEMU
    if " build " in (core or "") and len(found) > 1:  # "<built> build (...) on QEMU's <ran>"
        return f"QEMU {found[-1]} ({found[0].removeprefix('Cortex-')})"
    return f"QEMU {found[0]}"


@dataclass(frozen=True)
class MethodResult:
    name: str
    outcome: str  # passed | failed | partial | inconclusive | not-run
    detail: str  # the method's own verdict line, or why it did not run
    device_code: bool  # the method executes the device's own runtime and kernels
    text: str = ""  # the method's full report (text)
    report: dict | None = None  # the method's JSON report
    exercised: str = ""  # what ran: runtime, kernels, how the NPU partitions were computed
    label: str = ""  # how reports name it, when not by `name` (QEMU: the core that ran it)

    @property
    def shown(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class VerifyInputs:
    """What every method is asked with. A method uses the fields it has a use for (QEMU and the
    FVP run their own BundleIO cases; the twin and the host runtime run `samples`)."""

    samples: int = 16
    calibration: str | Path | None = None  # inputs to verify with (default: generated)
    per_op: bool = False
    max_steps: float = 1  # int8 steps per rounding stage (the twin's local check)
    npu_model: str = "auto"  # how NPU partitions are computed (orchestrator/verification/npu.py)
    platform: str | None = None  # QEMU/FVP: the installed platform (default: the program's)
    timeout_s: int = 600
    executorch_src: str | Path | None = None  # host runtime: the third-party source trees
    cmsis_nn_src: str | Path | None = None
    runner_elf: str | Path | None = None  # FVP: the arm_executor_runner to run
    atol: float = 0.0  # QEMU: BundleIO absolute tolerance (0: byte-exact)
    # progress(stage, "start" | "done", seconds): the twin's samples as it checks them (a
    # recurrence's local check takes seconds a sample); None: silent
    progress: Callable[[str, str, float], None] | None = field(default=None, compare=False)
    qemu_samples: int = 4  # the BundleIO cases QEMU and the FVP run (frames, for a state)


class Verifier(Protocol):
    """One verification method."""

    name: str  # TWIN, RUNTIME, QEMU, FVP, ...
    device_code: bool  # it executes the device's own runtime and kernels

    def run(self, program: TwinProgram, inputs: VerifyInputs) -> MethodResult:
        """Verify `program`: the `.pte` and its artifacts folder as `verify` read them, once,
        for every method (orchestrator/verification/twin.py `load_twin`); a method reads no
        file of it again. Never raises for a machine that lacks what the method needs: that is
        a "not-run" result saying why."""
        ...
