"""`orchestrate compare --firmware`: what each side ships, weighed from the linker maps of two
release images of the same model for the same core.

- Ours: `orchestrate firmware PROGRAM.pte --profile release` (the CMake project: ExecuTorch's
  runtime at -Os, the program's kernels and CMSIS-NN at -O3, no logging, link-time
  optimization, newlib-nano; the NPU driver's device layer for silicon), read as `orchestrate
  size --firmware` reads it.
- The incumbent's: TensorFlow Lite Micro and the (Vela-compiled) `.tflite` linked into one image
  with the same core flags, link-time optimization, section garbage collection and newlib-nano,
  TFLM at its own release levels, CMSIS-NN at the project's (kernels/native/tflm_release.py),
  its arena the smallest in which TFLM allocates the model (found on QEMU).

Flash is what is loaded: code, read-only data, .data's initial values and the model (the
`.pte`, the `.tflite`), without our project's example input (the incumbent's main feeds zeros).
RAM is what the image reserves besides its stack: .data, .bss (TFLM's arena is a static buffer)
and the buffers our plan places (arenas, a weights copy when the plan makes one, the method and
temp pools). Both images run on QEMU when they need no NPU (an NPU image drives the NPU's
registers, which QEMU does not model), which also measures each stack's high-water mark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kernels.native.errors import QemuUnavailable
from kernels.native.tflm_release import COMPONENT_ORDER, MODEL_SECTION
from orchestrator.errors import NotRun, UserError
from orchestrator.firmware import make_firmware, run_on_qemu
from orchestrator.firmware.footprint import (Footprint, component_of, footprint, nm_owners,
                                             read_map)
from platforms.qemu_tflm import smallest_tflm_arena, tflm_release_image

OURS_SOURCE = ("`orchestrate firmware --profile release` (runtime -Os, kernels and CMSIS-NN -O3, "
               "LTO, newlib-nano)")
INCUMBENT_SOURCE = ("TFLM release image (interpreter -Os, kernels -O2, BUILD_TYPE=release "
                    "defines, CMSIS-NN -O3, LTO, newlib-nano)")
_STACK_USED = re.compile(r"^stack_used_bytes: (\d+)$", re.M)


@dataclass(frozen=True)
class ReleaseImage:
    """One side's release image, as its linker map weighs it."""

    flash_bytes: int  # code, read-only data, .data's initial values and the model
    model_bytes: int
    ram_bytes: int  # .data, .bss and placed buffers; the stack apart
    stack_bytes: int  # reserved by the linker script
    components: dict[str, dict[str, int]]
    map_path: Path
    stack_used_bytes: int | None = None  # measured on QEMU (stack painting)
    ran: str = ""  # what the QEMU run of the image showed
    ram_detail: str = ""

    @property
    def code_bytes(self) -> int:
        return self.flash_bytes - self.model_bytes


def _weigh(fp: Footprint, exclude: tuple[str, ...]) -> tuple[int, int, int]:
    """Flash, the model's bytes and RAM (without the stack) of a map."""
    code = fp.code_bytes(exclude=exclude)
    static = sum(kinds.get("data init", 0) + kinds.get("bss", 0)
                 for kinds in fp.components.values())
    return code + fp.pte_bytes, fp.pte_bytes, static + sum(fp.regions.values())


def ours_release(pte: Path, folder: Path, run: bool) -> ReleaseImage:
    """Our program's release project, written and built in `folder` (and run on QEMU)."""
    made = make_firmware(pte, folder, profile="release", build=True, run=run)
    fp = footprint(made.folder)
    flash, model, ram = _weigh(fp, ("program (.pte)", "example input (example_io.c)"))
    memory = made.record.get("memory", {})
    detail = (f"of which the plan's buffers {sum(fp.regions.values()):,} B (a weights copy "
              f"{memory.get('weights_bytes', 0):,} B in {memory.get('weights_region') or '-'})"
              if memory.get("weights_region") else
              f"of which the plan's buffers {sum(fp.regions.values()):,} B (weights read in "
              "place)")
    used, ran = None, ""
    if run:
        result = run_on_qemu(made.folder)
        used = result.stack_used_bytes
        ran = f"ran on QEMU: exit code {result.exit_code}"
    return ReleaseImage(flash, model, ram, fp.stack_bytes, fp.components, fp.map_path, used,
                        ran, detail)


def incumbent_release(tflite: Path, operators, platform, *, cpu: str | None, npu: str | None,
                      used_bytes: int, npu_handler, fast_scratch_bytes: int, run: bool,
                      timeout_s: int) -> ReleaseImage:
    """TFLM's release image of `tflite` (and its QEMU run when it needs no NPU), its arena the
    smallest TFLM allocates the model in (found on QEMU: more than the `used_bytes` TFLM reports,
    since its planner's scratch lives in the arena while it plans)."""
    arena_bytes = smallest_tflm_arena(tflite, operators, platform, used_bytes=used_bytes,
                                      cpu=cpu, npu=npu, npu_handler=npu_handler,
                                      npu_fast_scratch_bytes=fast_scratch_bytes,
                                      timeout_s=timeout_s)
    if arena_bytes is None:
        raise NotRun(f"TFLM allocated {tflite.name} in no arena up to 64 times the "
                     f"{used_bytes:,} B it reported using; no release image was built")
    release, ran = tflm_release_image(tflite, operators, platform, arena_bytes=arena_bytes,
                                      cpu=cpu, npu=npu, npu_fast_scratch_bytes=fast_scratch_bytes,
                                      run=run, timeout_s=timeout_s)
    objects = release.objects
    owners = nm_owners((Path(path), component) for path, component in objects.items())
    components, buffers, stack = read_map(
        release.map_path, owners, lambda origin: objects.get(origin) or component_of(origin),
        MODEL_SECTION)
    fp = Footprint(release.map_path, components, buffers, stack)
    flash, model, ram = _weigh(fp, ())
    # an image the optimizer emptied (a driver at a null address is a trap it reasons from)
    # holds neither the model nor the interpreter: no figure of it means anything
    kept = {name for name, kinds in components.items() if sum(kinds.values())}
    needed = {"TFLM interpreter", "TFLM kernels"} | ({"Ethos-U driver"} if npu else set())
    if model != tflite.stat().st_size or not needed <= kept:
        raise NotRun(f"TFLM's release image of {tflite.name} ({release.map_path}) holds "
                     f"{model:,} B of the {tflite.stat().st_size:,} B model and "
                     f"{', '.join(sorted(needed & kept)) or 'none'} of "
                     f"{', '.join(sorted(needed))}; its figures are not reported")
    used, ran_text = None, ""
    if ran is not None:
        painted = _STACK_USED.search(ran.log)
        used = int(painted[1]) if painted and ran.exit_code == 0 else None
        ran_text = f"ran on QEMU: exit code {ran.exit_code}"
    return ReleaseImage(flash, model, ram, fp.stack_bytes, components, release.map_path, used,
                        ran_text, f"of which the tensor arena {release.arena_bytes:,} B, the "
                        "smallest in which TFLM's AllocateTensors succeeds (found on QEMU; TFLM "
                        f"reports using {used_bytes:,} B of it)")


def release_images(pte: Path, tflite: Path, operators, platform, work: Path, *,
                   cpu: str | None, npu: str | None, arena_used_bytes: int | None,
                   npu_handler, fast_scratch_bytes: int, timeout_s: int
                   ) -> tuple[ReleaseImage | None, ReleaseImage | None, list[str]]:
    """Both sides' release images; a side that could not be built is None and the list says
    why."""
    run = npu is None
    why: list[str] = []
    ours = theirs = None
    try:
        ours = ours_release(pte, work / "release-ours", run)
    except (UserError, NotRun, QemuUnavailable) as error:
        why.append(f"our release firmware: {str(error).removeprefix('not run: ')}")
    if arena_used_bytes is None:
        why.append("the incumbent's release image: its arena size comes from its QEMU run, "
                   "which did not report one")
    else:
        try:
            theirs = incumbent_release(tflite, operators, platform, cpu=cpu, npu=npu,
                                       used_bytes=arena_used_bytes, npu_handler=npu_handler,
                                       fast_scratch_bytes=fast_scratch_bytes, run=run,
                                       timeout_s=timeout_s)
        except (NotRun, QemuUnavailable) as error:
            why.append(f"the incumbent's release image: {str(error).removeprefix('not run: ')}")
    return ours, theirs, why


def component_lines(ours: ReleaseImage | None, theirs: ReleaseImage | None) -> list[str]:
    """Each side's flash per component (code+rodata+.data init, and the model), largest first."""
    lines = []
    for side, image in (("ours", ours), ("incumbent", theirs)):
        if image is None:
            continue
        flash = {name: kinds.get("code", 0) + kinds.get("data init", 0) + kinds.get(".pte", 0)
                 for name, kinds in image.components.items()
                 if name != "example input (example_io.c)"}  # not in the flash figure
        order = {name: i for i, name in enumerate(COMPONENT_ORDER)}
        parts = ", ".join(f"{name} {size:,}" for name, size in
                          sorted(flash.items(), key=lambda kv: (-kv[1], order.get(kv[0], 99)))
                          if size)
        lines.append(f"release flash by component, {side} (B, linker map {image.map_path}): "
                     f"{parts}")
    return lines
