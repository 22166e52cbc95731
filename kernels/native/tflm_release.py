"""The incumbent's release firmware, to weigh beside an `orchestrate firmware` release project:
TensorFlow Lite Micro and one `.tflite` linked into one image, built by the TFLM runner's recipe
(kernels/native/tflm.py) with what a release takes, the same as the firmware project's:

- the core's flags, link-time optimization, `-ffunction-sections -fdata-sections`,
  `--gc-sections` and newlib-nano, for every object but newlib's system calls (semihosting.c);
- each runtime at its own release levels: TFLM's interpreter at -Os and its kernels at -O2 with
  its BUILD_TYPE=release defines (NDEBUG, TF_LITE_STRIP_ERROR_STRINGS), as the project builds
  ExecuTorch's runtime at -Os and its kernels at -O3 without logging; CMSIS-NN at the project's
  kernel level on both sides, so the same CMSIS-NN code is weighed;
- the model in flash (`tflm_model.S`: input section `.rodata.model_tflite`), the tensor arena a
  static buffer of the size given (platforms/qemu_tflm.py finds the smallest TFLM allocates the
  model in), the NPU's fast scratch a static buffer too;
- with an NPU, the Ethos-U core driver with its own device layer for silicon and the NPU's
  interrupt vector, as the project links it for hardware;
- main() in runner/tflm/release.cc: the project's example main's work (one inference, outputs
  printed, the stack's high-water mark).

The linker map's input files are the cached objects, which carry no source names: `TflmRelease`
keeps each object's component, and the symbols each defines for what the optimizer rewrote.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kernels.cache_root import cache_root
from kernels.native.cache import atomic_write, digest, publish_folder
from kernels.native.errors import FirmwareBuildError
from kernels.native.runner import RunnerSpec
from kernels.native.sources import find_third_party
from kernels.native.tflm import (TFLM_RECIPE_VERSION, ReleaseBuild, TflmBuilder,
                                 operator_registration, with_kernel_sets)
from kernels.native.toolchains import build_jobs, find_toolchain

RELEASE_RECIPE_VERSION = "1"
# The input section holding the model (tflm_model.S).
MODEL_SECTION = ".rodata.model_tflite"
# The firmware project's release levels (orchestrator/firmware/generated.py: runtime, kernels).
RELEASE_BOARD_OPTIMIZATION = "-Os"
RELEASE_KERNEL_OPTIMIZATION = "-O3"
_LINK_FLAGS = ("-flto", "-ffunction-sections", "-fdata-sections", "--specs=nano.specs")

# An object's component, by the source it was compiled from (first match wins).
_SOURCE_COMPONENTS = (
    ("model (.tflite)", re.compile(r"tflm_model\.S$")),
    ("TFLM kernels", re.compile(r"tensorflow/lite/micro/kernels/")),
    ("TFLM interpreter", re.compile(r"tensorflow/")),
    ("CMSIS-NN", re.compile(r"cmsis-nn/")),
    ("Ethos-U driver", re.compile(r"ethos-u-core-driver/")),
)
BOARD = "board + main"
COMPONENT_ORDER = ("model (.tflite)", "TFLM interpreter", "TFLM kernels", "CMSIS-NN",
                   "Ethos-U driver", BOARD)


@dataclass(frozen=True)
class TflmRelease:
    """A linked release image: its ELF and map, each object's component, what it was sized
    for, and what the build cost."""

    elf: Path
    map_path: Path
    objects: dict[str, str]  # object path -> component
    arena_bytes: int
    fast_scratch_bytes: int
    cached: bool
    seconds: float


def source_component(source: str) -> str:
    for name, pattern in _SOURCE_COMPONENTS:
        if pattern.search(source):
            return name
    return BOARD


def build_tflm_release(
    tflite: str | Path,
    operators: Iterable[str],
    spec: RunnerSpec,
    *,
    arena_bytes: int,
    npu_irq: int | None = None,
    npu_accelerator: str | None = None,
    fast_scratch_bytes: int = 0,
    third_party: str | Path | None = None,
    cache_dir: str | Path | None = None,
    jobs: int | None = None,
) -> TflmRelease:
    """Build (or take from the cache) TFLM's release image of `tflite` (whose operators are
    `operators`, "ethos-u" for a Vela-compiled file's, which needs the spec's `npu_define` and
    `npu_accelerator` such as "ethos-u55-128", the spec's register address and `npu_irq`) with
    an arena of `arena_bytes`.
    Raises what build_tflm_runner raises."""
    started = time.monotonic()
    tflite = Path(tflite).resolve()
    toolchain = find_toolchain()
    sources = find_third_party(third_party)
    operators = tuple(sorted(set(operators)))
    npu = bool(spec.npu_define)
    if npu and (not npu_accelerator or npu_irq is None or not spec.npu_base_address):
        raise FirmwareBuildError("a release image with an NPU needs its accelerator "
                                 "(ethos-u55-128), the NPU's register address and its interrupt")
    arch, macs = "", 0
    if npu:  # "ethos-u55-128": the driver's ETHOSU_ARCH and ETHOSU_MACS
        _, arch, mac_text = npu_accelerator.split("-")
        macs = int(mac_text)
    release = ReleaseBuild(tflite, RELEASE_BOARD_OPTIMIZATION, RELEASE_KERNEL_OPTIMIZATION,
                           arch, macs)
    cache = Path(cache_dir).expanduser() if cache_dir else cache_root()
    builder = TflmBuilder(spec, sources, toolchain, cache, jobs or build_jobs(), release)
    header, registers = operator_registration(operators, builder.tflm, npu)
    arena_bytes = (arena_bytes + 15) // 16 * 16
    config = ("/* Generated by kernels/native/tflm_release.py. */\n"
              "#ifndef ORCHESTRATE_TFLM_RELEASE_H\n#define ORCHESTRATE_TFLM_RELEASE_H\n"
              f"#define TFLM_RELEASE_ARENA_BYTES {arena_bytes}u\n"
              f"#define TFLM_RELEASE_NPU {int(npu)}\n"
              f"#define TFLM_RELEASE_NPU_BASE {spec.npu_base_address:#x}u\n"
              f"#define TFLM_RELEASE_NPU_IRQ {npu_irq or 0}\n"
              f"#define TFLM_RELEASE_FAST_SCRATCH_BYTES {fast_scratch_bytes}u\n#endif\n")
    model_s = ("/* Generated by kernels/native/tflm_release.py: the model in flash. */\n"
               f'  .section {MODEL_SECTION},"a"\n  .balign 16\n  .global tflm_model\n'
               f'tflm_model:\n  .incbin "{tflite}"\n  .size tflm_model, . - tflm_model\n')
    schema = builder.tflm_schema()
    generated = builder.cache / "tflm-generated" / digest(header, config, model_s)[:16]
    for name, text in (("tflm_operators.h", header), ("tflm_release.h", config),
                       ("tflm_model.S", model_s)):
        if not (generated / name).is_file():
            atomic_write(generated / name, text)

    def attempt(kernels) -> TflmRelease:
        units = builder.tflm_units(schema, generated, kernels)
        keys = [builder.object_key(unit, schema) for unit in units]
        key = digest("tflm-release", RELEASE_RECIPE_VERSION, TFLM_RECIPE_VERSION,
                     toolchain.version, json.dumps(sorted(keys)), spec.recipe_text,
                     builder.linker_script("<code>", True), json.dumps(operators))
        folder = builder.cache / "tflm-release" / key
        if (folder / "objects.json").is_file():
            return _release(folder, arena_bytes, fast_scratch_bytes, True, started)
        objects = builder.compile_all(units, schema)
        (builder.cache / "tflm-release").mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=builder.cache / "tflm-release", prefix=".tmp-"))
        try:
            builder.link(objects, staging / "firmware.elf", _LINK_FLAGS)
        except FirmwareBuildError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        # The map names each object by its cache path: keep what each was compiled from.
        atomic_write(staging / "objects.json", json.dumps(
            {str(obj): source_component(str(unit.source)) for obj, unit in zip(objects, units)},
            indent=0))
        publish_folder(staging, folder)
        return _release(folder, arena_bytes, fast_scratch_bytes, False, started)

    return with_kernel_sets(builder.tflm, registers, npu, "TFLM's release image", attempt)


def _release(folder: Path, arena_bytes: int, fast_scratch_bytes: int, cached: bool,
             started: float) -> TflmRelease:
    return TflmRelease(folder / "firmware.elf", folder / "firmware.map",
                       json.loads((folder / "objects.json").read_text()), arena_bytes,
                       fast_scratch_bytes, cached, time.monotonic() - started)
