"""The Cortex-M cores, as data (cores.yaml beside this module): the ISA tier of each (which
CMSIS-NN kernels it runs), the compiler flags a firmware for it is built with, its
architecture, and whether the shipped board support runs on it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType

from kernels.safe_files import load_yaml

CORES_FILE = Path(__file__).resolve().parent / "cores.yaml"
# What CMSIS-NN's arm_nn_math_types.h defines for each tier.
CMSIS_NN_DEFINES = {"scalar": (), "dsp": ("ARM_MATH_DSP",), "mve": ("ARM_MATH_DSP", "ARM_MATH_MVEI")}


@dataclass(frozen=True)
class Core:
    name: str  # "cortex-m55"
    flags: tuple[str, ...]  # every source is compiled and linked with these
    architecture: str  # "armv8.1-m.main"
    tier: str  # "scalar", "dsp" or "mve": which CMSIS-NN kernels these flags compile
    msplim: bool  # has the stack limit register the shipped board support sets

    @property
    def cmsis_nn_defines(self) -> tuple[str, ...]:
        """ARM_MATH_DSP / ARM_MATH_MVEI as CMSIS-NN's headers define them for these flags."""
        return CMSIS_NN_DEFINES[self.tier]


@cache
def cores() -> Mapping[str, Core]:
    """Every core of the table, by name."""
    table = load_yaml(CORES_FILE)
    return MappingProxyType({
        name: Core(name, tuple(str(f) for f in entry["flags"]), str(entry["architecture"]),
                   str(entry["tier"]), bool(entry["msplim"]))
        for name, entry in table.items()})


def core(name: str) -> Core:
    """One core; KeyError names the cores the table has."""
    table = cores()
    if name not in table:
        raise KeyError(f"no compiler flags for core {name!r} in {CORES_FILE.name} "
                       f"({', '.join(table)})")
    return table[name]
