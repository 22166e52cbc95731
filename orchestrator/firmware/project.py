"""`orchestrate firmware`'s project: a folder that builds one program into firmware with CMake.

What goes in (written by `write_project`):

    CMakeLists.txt        the targets: runtime core, prim ops, each kernel library, CMSIS-NN, the
                          model and the board, from the third-party sources (ORCHESTRATE_THIRD_PARTY)
    cmake/arm-none-eabi-gcc.cmake   the toolchain file used when the user names none
    memory.ld             the linker script: the platform's regions, each section where the plan
                          put it (code, the .pte, every arena, the weights, pools, stack)
    model/model_io.h      the program's inputs and outputs (shapes, element types, byte layout,
                          int8 scales and zero points) and the buffer sizes
    model/model.h, model.cpp   the C API: model_init(), model_run(inputs, outputs), model_reset()
    model/model_memory.c  every buffer in the section of its region; model_pte.S embeds the .pte
    generated/            ExecuTorch's codegen for the program's operators only (selective build)
                          and flatc's schema headers
    board/                the platform's board support (startup, semihosting console, counters)
    main.c, example_io.h/.c  an example that runs the model on each example frame (the
                          frames of one stream for a program with state) and prints the outputs
    firmware.json         what was generated, for `orchestrate size --firmware`

The C and C++ sources the project gets are the files in `templates/` beside this module and the platform's runner board support; the runtime, kernels and
CMSIS-NN are compiled from the unmodified third-party sources in place, never copied.

Profiles: `release` builds the runtime with -Os and the kernels with -O3, without logging or the
program verifier, and links newlib-nano; `check` keeps ExecuTorch's logs on the console and
verifies the program's internal consistency when it loads (-O2 throughout).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from kernels.native.errors import FirmwareBuildError
from kernels.native.operators import (kernel_libraries, kernel_registration, schema_headers,
                                      select_operators)
from kernels.native.runner import CACHE_FOLDER
from kernels.native.sources import ThirdParty, source_tree_digest
from kernels.native.toolchains import Toolchain, build_jobs
from orchestrator.firmware.generated import (cmakelists, example_io_header, example_io_source,
                                             linker_script, model_io_header, model_memory_source,
                                             model_pte_assembly, stream_check, toolchain_file)
from orchestrator.firmware.spec import (BOARD_FILES, BUILD_DIR, ELF_NAME, NPU_DEVICES, PROFILES,
                                        RECORD_NAME, FirmwareSpec, IoTensor)
from platforms.firmware_recipe import BoardRecipe, NoRunnerForPlatform, board_recipe
from platforms.platform import Platform

# The C and C++ sources every project gets (the model's API, the example main, the release
# platform layer, the NPU glue).
TEMPLATES = Path(__file__).resolve().parent / "templates"


def write_project(spec: FirmwareSpec, platform: Platform, folder: Path, third_party: ThirdParty,
                  toolchain: Toolchain | None, cache: Path,
                  recipe: BoardRecipe | None = None) -> dict:
    """Write the project into `folder` (which must be empty or new); return firmware.json's
    record. Raises FirmwareBuildError / QemuUnavailable subclasses when the platform has no
    firmware recipe or an operator has no kernel in the sources. `recipe`: another board recipe
    than the platform's (a QEMU machine's, for the check copy of `firmware --run`)."""
    if spec.profile not in PROFILES:
        raise ValueError(f"unknown profile {spec.profile!r}")
    config = recipe or board_recipe(platform, spec.cpu)
    if spec.npu_partitions:
        check_npu(spec, platform, config, third_party)
    selection = select_operators(spec.operators, third_party)
    libraries = kernel_libraries(third_party)
    tree = source_tree_digest(third_party)
    registrations, kernel_sources = [], {}
    for name, operators in selection.by_library.items():
        kernel_sources[name] = list(selection.sources[name])
        if not operators:
            continue
        generated = kernel_registration(third_party, cache / CACHE_FOLDER, tree,
                                        libraries[name], operators)
        target = folder / "generated" / name
        target.mkdir(parents=True)
        for file in sorted(generated.iterdir()):
            if file.suffix in (".cpp", ".h"):
                shutil.copy2(file, target / file.name)
        registrations.append(f"generated/{name}/RegisterCodegenUnboxedKernelsEverything.cpp")
        kernel_sources[name] = [_own_source(path, third_party, folder / "kernels" / name)
                                for path in selection.sources[name]]
    schema = schema_headers(third_party, cache / CACHE_FOLDER)
    shutil.copytree(schema / "executorch" / "schema", folder / "generated" / "schema" /
                    "executorch" / "schema")
    for name in ("model.h", "model.cpp", "model_memory.h"):
        _copy(TEMPLATES / name, folder / "model" / name)
    (folder / "model" / "model.pte").write_bytes(spec.pte)
    (folder / "model" / "model_io.h").write_text(model_io_header(spec))
    (folder / "model" / "model_memory.c").write_text(
        model_memory_source(spec, config.runtime_region))
    (folder / "model" / "model_pte.S").write_text(model_pte_assembly())
    for name in BOARD_FILES:
        _copy(config.sources_dir / name, folder / "board" / name)
    if spec.profile == "release":
        for name in ("pal_release.cpp", "snprintf_min.c"):
            _copy(TEMPLATES / name, folder / "board" / name)
    else:
        for name in ("pal.cpp", "printf_c99.c"):
            _copy(config.sources_dir / name, folder / "board" / name)
    if spec.npu_partitions:
        for name in ("npu_semaphore.c", "npu_new.cpp") + (
                ("npu_stream_check.c",) if stream_check(spec) else ()):
            _copy(TEMPLATES / name, folder / "board" / name)
        bridge = spec.npu_device == "qemu-bridge"
        name = "npu_qemu_bridge.c" if bridge else "npu_hardware.c"
        _copy(TEMPLATES / name, folder / "board" / name)
        for path in sorted((config.sources_dir / "npu").iterdir()):
            if path.suffix == ".h" or (bridge and path.suffix == ".c"):
                _copy(path, folder / "board" / "npu" / path.name)
    _copy(TEMPLATES / "main.c", folder / "main.c")
    (folder / "example_io.h").write_text(example_io_header(spec))
    (folder / "example_io.c").write_text(example_io_source(spec))
    # The first code region; build_project moves the code on when the linker says it does not fit.
    code_region = config.code_regions[0]
    (folder / "memory.ld").write_text(linker_script(spec, platform, config, code_region))
    (folder / "cmake").mkdir()
    (folder / "cmake" / "arm-none-eabi-gcc.cmake").write_text(toolchain_file(toolchain))
    kernel_count = sum(len(ops) for ops in selection.by_library.values()) + len(selection.prim) + 64
    (folder / "CMakeLists.txt").write_text(
        cmakelists(spec, platform, config, third_party, kernel_sources, registrations,
                   kernel_count))
    record = {
        "firmware_version": 1,
        "program": f"{spec.program_name}.pte",
        "pte_sha256": spec.pte_sha256,
        "pte_bytes": len(spec.pte),
        "platform": platform.name,
        "cpu": config.cpu,
        "cpu_hz": platform.cpu_hz,
        "board": config.source,
        "qemu_runs_it": config.qemu_runs_it,
        "profile": spec.profile,
        "lto": spec.lto,
        "npu": ({"partitions": spec.npu_partitions, "product": spec.npu_product,
                 "device": spec.npu_device, "fast_scratch_bytes": spec.fast_scratch_bytes}
                if spec.npu_partitions else None),
        "operators": list(spec.operators),
        "kernel_libraries": {name: list(ops) for name, ops in selection.by_library.items() if ops},
        "memory": {
            "source": spec.plan_source,
            "code_region": code_region,
            "image_region": spec.image_region,
            "data_region": config.data_region,
            "runtime_region": config.runtime_region,
            "planned": [{"mem_id": p.mem_id, "region": p.region, "bytes": p.size_bytes}
                        for p in spec.planned],
            "weights_region": spec.weights_region,
            "weights_bytes": spec.weights_bytes if spec.weights_region else 0,
            "method_pool_bytes": spec.method_pool_bytes,
            "temp_pool_bytes": spec.temp_pool_bytes,
            "temp_region": spec.temp_region or config.runtime_region,
            "stack_bytes": config.stack_bytes,
        },
        "example_inputs": spec.example_source,
        "example_frames": spec.frames,
        "state_bytes": spec.state_bytes,
        "inputs": [_tensor_record(t) for t in spec.inputs],
        "outputs": [_tensor_record(t) for t in spec.outputs],
    }
    (folder / RECORD_NAME).write_text(json.dumps(record, indent=1) + "\n")
    return record


def check_npu(spec: FirmwareSpec, platform: Platform, config: BoardRecipe,
              third_party: ThirdParty) -> None:
    """Raise NoRunnerForPlatform when this platform's recipe cannot build the program's NPU."""
    if spec.npu_product not in config.npu_products:
        raise NoRunnerForPlatform(
            f"the program delegates to {spec.npu_product or 'an NPU'}; the {platform.name} board "
            f"recipe ({config.source}) builds {', '.join(config.npu_products) or 'no NPU'}")
    if spec.npu_device not in NPU_DEVICES:
        raise ValueError(f"unknown NPU device layer {spec.npu_device!r}")
    if spec.npu_device == "hardware" and (config.npu_irq is None or not config.npu_base_address):
        raise NoRunnerForPlatform(
            f"the {platform.name} recipe ({config.source}) names no NPU register address and "
            "interrupt (npu: base_address, irq) for a hardware build; --npu-device qemu-bridge "
            "builds for QEMU")
    if not (third_party.ethos_u_driver / "src" / "ethosu_driver.c").is_file():
        raise NoRunnerForPlatform(f"no Ethos-U core driver in {third_party.ethos_u_driver}")


def _tensor_record(tensor: IoTensor) -> dict:
    return {"name": tensor.name, "dtype": tensor.dtype, "sizes": list(tensor.sizes),
            "dim_order": list(tensor.dim_order), "bytes": tensor.nbytes,
            "scale": tensor.scale, "zero_point": tensor.zero_point}


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def build_project(folder: Path, spec: FirmwareSpec, platform: Platform,
                  jobs: int | None = None, recipe: BoardRecipe | None = None) -> Path:
    """Configure and build with CMake; the ELF. The code goes to the first of the recipe's code
    regions it fits in (the linker decides; memory.ld and firmware.json are rewritten for the
    next region and only the link runs again). FirmwareBuildError carries the tool's last
    lines."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise FirmwareBuildError("no cmake on PATH (apt-get install cmake)")
    config = recipe or board_recipe(platform, spec.cpu)
    build = folder / BUILD_DIR
    _run_tool([cmake, "-S", str(folder), "-B", str(build), "-DCMAKE_BUILD_TYPE=None"])
    tried = []
    for region in config.code_regions:
        if tried:
            (folder / "memory.ld").write_text(linker_script(spec, platform, config, region))
            record = json.loads((folder / RECORD_NAME).read_text())
            record["memory"]["code_region"] = region
            (folder / RECORD_NAME).write_text(json.dumps(record, indent=1) + "\n")
        try:
            _run_tool([cmake, "--build", str(build), "-j", str(jobs or build_jobs())])
            return build / ELF_NAME
        except FirmwareBuildError as error:
            if "will not fit in region" not in str(error) and "overflowed by" not in str(error):
                raise
            tried.append(f"{region}: " + next((line.strip() for line in str(error).splitlines()
                                               if "overflowed by" in line), "does not fit"))
    raise FirmwareBuildError("the firmware fits in none of the code regions: " + "; ".join(tried))


def _run_tool(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise FirmwareBuildError(f"{' '.join(Path(a).name if i == 0 else a for i, a in enumerate(argv[:2]))} "
                                 f"failed:\n{(result.stdout + result.stderr)[-4000:]}")


def _own_source(path: Path, third_party, target: Path) -> Path:
    """A kernel source of the third-party tree as it is; one of ours (kernels/s16) copied into
    the project, as a path relative to it, so the project builds without this checkout."""
    if path.is_relative_to(third_party.root):
        return path
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, target / path.name)
    return target.relative_to(target.parents[1]) / path.name
