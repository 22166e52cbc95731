"""The core table (kernels/native/cores.yaml): every Cortex-M tier has its flags, and what the
table says CMSIS-NN compiles for a core is what GCC's predefined macros make its headers select."""

from __future__ import annotations

import subprocess

import pytest

from kernels.native.cores import cores
from kernels.native.errors import QemuUnavailable
from kernels.native.toolchains import find_toolchain
from platforms import CPU_TIERS, cpu_tier, load_platform
from platforms.firmware_recipe import board_recipe, load_firmware_config
from tests.device_tools import missing

TIERS = ("cortex-m0", "cortex-m0plus", "cortex-m3", "cortex-m23", "cortex-m4", "cortex-m7",
         "cortex-m33", "cortex-m35p", "cortex-m55", "cortex-m85")


def test_the_table_covers_every_cortex_m_tier():
    assert tuple(cores()) == TIERS


def test_the_platforms_isa_tier_is_the_tables():
    assert dict(CPU_TIERS) == {name: core.tier for name, core in cores().items()}
    assert [cpu_tier(name) for name in ("cortex-m0plus", "cortex-m4", "cortex-m85")] == [
        "scalar", "dsp", "mve"]


def test_the_generic_board_recipe_builds_for_the_cores_with_a_stack_limit_register():
    assert [name for name, core in cores().items() if core.msplim] == [
        "cortex-m33", "cortex-m35p", "cortex-m55", "cortex-m85"]


def test_a_runner_recipe_takes_its_cores_flags_from_the_table():
    for name in ("corstone300", "corstone320"):
        config = load_firmware_config(load_platform(name))
        assert config.cpu_flags == cores()[config.cpu].flags
        assert board_recipe(load_platform(name)).cpu_flags == config.cpu_flags


def _predefined(flags: tuple[str, ...]) -> dict[str, str]:
    try:
        gcc = find_toolchain().gcc
    except QemuUnavailable as error:
        missing(str(error))
    out = subprocess.run([str(gcc), *flags, "-E", "-dM", "-x", "c", "-"], input="",
                         capture_output=True, text=True, check=True).stdout
    return {parts[1]: parts[2] if len(parts) > 2 else "" for line in out.splitlines()
            if (parts := line.split(maxsplit=2))[0] == "#define"}


@pytest.mark.parametrize("name", TIERS)
def test_cmsis_nn_selects_the_kernels_the_table_names(name):
    """The core's tier is what its flags compile: arm_nn_math_types.h defines ARM_MATH_DSP when
    __ARM_FEATURE_DSP == 1, ARM_MATH_MVEI when __ARM_FEATURE_MVE & 1."""
    core = cores()[name]
    macros = _predefined(core.flags)
    selected = (("ARM_MATH_DSP",) if macros.get("__ARM_FEATURE_DSP") == "1" else ()) + (
        ("ARM_MATH_MVEI",) if int(macros.get("__ARM_FEATURE_MVE", "0")) & 1 else ())
    assert selected == core.cmsis_nn_defines
    assert ("__ARM_ARCH_8M_MAIN__" in macros) == core.msplim
