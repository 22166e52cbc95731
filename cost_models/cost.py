"""The cost of one op or transition: cycles on the core that runs it, seconds, and where the
number comes from.

source names the estimator, so a report can say how much to trust a figure:
  vela              NPU cycles from Vela's per-layer performance estimate
  model:<tier>      our CMSIS-NN cost model for the CPU's ISA tier (model:scalar|dsp|mve)
  model:portable    our cost model for ExecuTorch portable (float) kernels
  model:transition  our cost model for hidden CPU work (NPU invocation, boundary q/dq, copies)
  model:memory      the CPU's reads of weights and activations at the speed of the region
                    they are placed in (platform YAML `cpu_read`, each figure with its source)
  measured          timed on hardware or an FVP
A sum over several sources keeps all of them, joined by '+', in first-seen order. A model part
scaled by a calibration file (cost_models/profile_calibration.py) names it:
"model:mve (calibrated: cortex-m55-board.yaml)"; a model part an instruction calibration raised
to its estimate (the model's cycles were fewer than the instructions the kernel retires) names it
as "model:mve (raised to instructions: cortex-m55-qemu.yaml)".

With a calibration, a CPU cost may also carry the model's instruction estimate (instructions
retired, the unit of a QEMU profile: never cycles) and the model's cycles before a cycles
calibration scaled them; both are None otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

_SOURCE_PART = re.compile(r"^(vela|measured|model:(scalar|dsp|mve|portable|transition|memory))"
                          r"( \((calibrated|raised to instructions): "
                          r"[A-Za-z0-9][A-Za-z0-9._-]*\))?$")


def _check_source(source: str) -> None:
    parts = source.split("+")
    bad = [p for p in parts if not _SOURCE_PART.match(p)]
    if bad:
        raise ValueError(
            f"Cost source {source!r}: {bad} not one of vela, measured, model:scalar, model:dsp, "
            "model:mve, model:portable, model:transition, model:memory (joined by '+'; a "
            "calibrated part ends in ' (calibrated: NAME)' or ' (raised to instructions: NAME)')"
        )


@dataclass(frozen=True)
class Cost:
    cycles: int
    seconds: float
    source: str
    instructions: int | None = None  # the model's estimate of instructions retired
    instructions_source: str | None = None  # "calibrated: NAME (kernel or class)"
    model_cycles: int | None = None  # the model's cycles where a calibration replaced them

    def __post_init__(self) -> None:
        if self.cycles < 0 or self.seconds < 0:
            raise ValueError(f"Cost must be non-negative, got {self.cycles} cycles, {self.seconds} s")
        if (self.instructions is None) != (self.instructions_source is None):
            raise ValueError("Cost: an instruction estimate needs its source, and only with one")
        _check_source(self.source)

    @classmethod
    def from_cycles(cls, cycles: float, hz: int, source: str) -> "Cost":
        """Cycles of a clock running at hz; fractional model cycles round up to whole ones."""
        if hz <= 0:
            raise ValueError(f"clock must be positive, got {hz} Hz")
        whole = int(-(-cycles // 1))
        return cls(cycles=whole, seconds=whole / hz, source=source)

    def to_json(self) -> dict:
        """plan.json's cost block: the calibration's figures only when there are some."""
        block = {"cycles": self.cycles, "seconds": self.seconds, "source": self.source}
        if self.model_cycles is not None:
            block["model_cycles"] = self.model_cycles
        if self.instructions is not None:
            block.update(instructions=self.instructions,
                         instructions_source=self.instructions_source)
        return block

    @classmethod
    def from_json(cls, block: dict) -> "Cost":
        return cls(int(block["cycles"]), float(block["seconds"]), str(block["source"]),
                   block.get("instructions"), block.get("instructions_source"),
                   block.get("model_cycles"))

    @staticmethod
    def total(costs: Iterable["Cost"], hz: int) -> "Cost":
        """The sum of costs counted in cycles of one clock (hz), e.g. the CPU's.

        Seconds are summed as given, so costs measured on another clock (an NPU's) keep their
        own time; cycles are each cost's seconds re-expressed at hz, so they add up.
        """
        costs = list(costs)
        if hz <= 0:
            raise ValueError(f"clock must be positive, got {hz} Hz")
        seconds = sum(c.seconds for c in costs)
        sources: list[str] = []
        for cost in costs:
            for part in cost.source.split("+"):
                if part not in sources:
                    sources.append(part)
        if not sources:
            raise ValueError("Cost.total needs at least one cost")
        return Cost(cycles=round(seconds * hz), seconds=seconds, source="+".join(sources))
