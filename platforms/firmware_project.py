"""`orchestrate firmware`'s project: a folder that builds one program into firmware with CMake.

What goes in (written by `write_project`):

    CMakeLists.txt        the targets: runtime core, prim ops, each kernel library, CMSIS-NN, the
                          model and the board, from the third-party sources (ORCHESTRATE_THIRD_PARTY)
    cmake/arm-none-eabi-gcc.cmake   the toolchain file used when the user names none
    memory.ld             the linker script: the platform's regions, each section where the plan
                          put it (code, the .pte, every arena, the weights, pools, stack)
    model/model_io.h      the program's inputs and outputs (shapes, element types, byte layout,
                          int8 scales and zero points) and the buffer sizes
    model/model.h, model.cpp   the C API: model_init(), model_run(inputs, outputs)
    model/model_memory.c  every buffer in the section of its region; model_pte.S embeds the .pte
    generated/            ExecuTorch's codegen for the program's operators only (selective build)
                          and flatc's schema headers
    board/                the platform's board support (startup, semihosting console, counters)
    main.c, example_io.h/.c  an example that runs the model once and prints the outputs
    firmware.json         what was generated, for `orchestrate size --firmware`

The C and C++ sources the project gets are the files beside this module
(`platforms/firmware/`) and the platform's runner board support; the runtime, kernels and
CMSIS-NN are compiled from the unmodified third-party sources in place, never copied.

Profiles: `release` builds the runtime with -Os and the kernels with -O3, without logging or the
program verifier, and links newlib-nano; `check` keeps ExecuTorch's logs on the console and
verifies the program's internal consistency when it loads (-O2 throughout).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kernels.dtypes import ELEMENT_BYTES
from kernels.native_build import build_jobs
from kernels.safe_files import load_yaml
from platforms.platform import Platform
from platforms.runner_build import (FirmwareBuildError, NoRunnerForPlatform, ThirdParty,
                                    Toolchain, cmsis_nn_sources, code_sections, data_sections,
                                    kernel_libraries, kernel_registration, load_firmware_config,
                                    runtime_sources, schema_headers, select_operators,
                                    source_tree_digest)

PROFILES = ("release", "check")
TEMPLATES = Path(__file__).resolve().parent / "firmware"
RECORD_NAME = "firmware.json"
ELF_NAME = "firmware.elf"
MAP_NAME = "firmware.map"
BUILD_DIR = "build"
_C_TYPES = {"uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
            "int64": "int64_t", "float32": "float", "float64": "double", "bool": "bool"}
# Bytes each buffer is aligned to: ExecuTorch's tensors and CMSIS-NN's MVE loads.
_ALIGNMENT = 16
# The .pte's own alignment: its segments are aligned relative to its start.
_IMAGE_ALIGNMENT = 64
# The board files of a platform's runner that a firmware takes (runner.cpp and the log-format
# printf are the check runner's own).
_BOARD_FILES = ("board.h", "startup.c", "semihosting.c", "counters.c")


@dataclass(frozen=True)
class IoTensor:
    """One input or output of the program's method, as the application hands its bytes over."""

    name: str  # input0, output0, ...
    dtype: str  # kernels.dtypes name: int8, float32, int64, bool, ...
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    scale: float | None = None  # int8 program I/O (--io int8): the quantization
    zero_point: int | None = None

    @property
    def elements(self) -> int:
        return math.prod(self.sizes)

    @property
    def nbytes(self) -> int:
        return self.elements * ELEMENT_BYTES[self.dtype]


@dataclass(frozen=True)
class PlannedBuffer:
    mem_id: int
    region: str
    size_bytes: int


@dataclass(frozen=True)
class FirmwareSpec:
    """Everything a project is generated from: the program, its I/O and the plan's memory."""

    program_name: str
    pte: bytes
    pte_sha256: str
    method: str
    operators: tuple[str, ...]
    inputs: tuple[IoTensor, ...]
    outputs: tuple[IoTensor, ...]
    image_region: str
    planned: tuple[PlannedBuffer, ...]
    weights_region: str | None  # None: the weights are read in place from the image
    weights_bytes: int
    temp_pool_bytes: int  # the kernels' scratch (CMSIS-NN buffers), from the plan
    method_pool_bytes: int  # the runtime's per-method structures
    example_inputs: tuple[bytes, ...]
    example_source: str  # where the example inputs come from
    profile: str
    plan_source: str  # what the memory placement above came from
    # Link-time optimization (release default): about a fifth less code; the footprint then
    # attributes each function by its name, after inlining.
    lto: bool = False
    # NPU partitions: the Ethos-U family the program delegates to ("ethos-u55"), where the
    # driver's device layer goes ("hardware": the NPU's registers and interrupt; "qemu-bridge":
    # the runner's semihosting bridge to the host's functional model), the fast scratch, and the
    # region of the temp pool, which holds the NPU scratch (the plan's npu scratch region).
    npu_partitions: int = 0
    npu_accelerator: str | None = None  # "ethos-u55-128"
    npu_product: str | None = None
    npu_device: str = "hardware"
    fast_scratch_bytes: int = 0
    temp_region: str | None = None


@dataclass(frozen=True)
class BoardRecipe:
    """How a project is built for a platform: the platform's runner recipe
    (runner/firmware.yaml) where it has one, else a generic one read off the platform YAML."""

    cpu: str
    cpu_flags: tuple[str, ...]
    optimization: str  # the check profile's, and the runtime's in release when not -Os
    code_regions: tuple[str, ...]  # code goes to the first
    boot_region: str  # where the vector table lies
    data_region: str  # .data, .bss, the stack
    runtime_region: str  # the method and temp pools
    stack_bytes: int
    sources_dir: Path  # the board support files (_BOARD_FILES)
    source: str  # where this recipe comes from, for firmware.json and the docs
    qemu_runs_it: bool  # the platform's QEMU machine runs this build (run_on_qemu)
    npu_products: dict[str, str] = field(default_factory=dict)  # family -> driver define
    npu_base_address: int = 0
    npu_irq: int | None = None  # the NPU's external interrupt number


_RUNNER_BOARD = Path(__file__).resolve().parent / "corstone300" / "runner"
NPU_DEVICES = ("hardware", "qemu-bridge")
# Bytes of npu_new.cpp's pool per NPU partition: EthosUBackend's ExecutionHandle (its VelaHandles
# and a platform state pointer, well under this on a 32-bit core).
_NPU_HANDLE_BYTES = 256
_ETHOS_U_BACKEND = ("EthosUBackend.cpp", "EthosUBackend_Cortex_M.cpp",
                    "EthosUBackend_IoMemcpy.cpp", "VelaBinStream.cpp")
_DEVICE_LAYER = {"ethos-u55": "ethosu_device_u55_u65.c", "ethos-u65": "ethosu_device_u55_u65.c",
                 "ethos-u85": "ethosu_device_u85.c"}
_GENERIC_STACK_BYTES = 16384


def board_recipe(platform: Platform) -> BoardRecipe:
    """The platform's runner recipe, or a generic Armv8-M one from its YAML: code in the regions
    that hold code (the first is the boot region), data and the pools in the first RAM region
    that holds arenas (a TCM before an SRAM), the Corstone-300 runner's board support (reset
    handler, semihosting console, SysTick counters: Armv8-M generic, replaced for a product)."""
    try:
        config = load_firmware_config(platform)
    except NoRunnerForPlatform:
        config = None
    if config is not None:
        return BoardRecipe(config.cpu, tuple(config.cpu_flags), config.optimization,
                           tuple(config.code_regions), config.boot_region, config.data_region,
                           config.runtime_region, config.stack_bytes, config.sources_dir,
                           f"{config.runner_dir.name}/firmware.yaml of {platform.name}", True,
                           dict(config.npu_products), config.npu_base_address,
                           config.npu_irq)
    cores = load_yaml(TEMPLATES / "cores.yaml")
    cpu = platform.cpu_default
    if cpu not in cores:
        raise NoRunnerForPlatform(
            f"platform {platform.name} has no runner recipe and its CPU {cpu} is not one the "
            f"generic board support builds for ({', '.join(cores)}: Armv8-M mainline); add "
            f"{Path(platform.source_file).parent}/runner/firmware.yaml")
    code = [r.name for r in platform.memories if r.may_hold("code")]
    ram = sorted((r for r in platform.memories if r.kind != "flash" and r.may_hold("arena")),
                 key=lambda r: r.kind != "tcm")
    if not code or not ram:
        raise NoRunnerForPlatform(
            f"platform {platform.name} names no region that holds code"
            if not code else f"platform {platform.name} names no RAM region that holds arenas")
    return BoardRecipe(cpu, tuple(cores[cpu]), "-O2", tuple(code), code[0], ram[0].name,
                       ram[0].name, _GENERIC_STACK_BYTES, _RUNNER_BOARD,
                       f"generic Armv8-M recipe from {Path(platform.source_file).name} "
                       "(no runner/firmware.yaml)", False)


def _symbol(name: str) -> str:
    return re.sub(r"\W", "_", name)


def _c_list(values: Sequence[int]) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


# ---------------------------------------------------------------------------------------------
# Generated text


def model_io_header(spec: FirmwareSpec) -> str:
    lines = [
        f"/* Generated by `orchestrate firmware` from {spec.program_name}.pte "
        f"(SHA-256 {spec.pte_sha256}): do not edit. */",
        "#ifndef ORCHESTRATE_MODEL_IO_H",
        "#define ORCHESTRATE_MODEL_IO_H",
        "",
        "#include <stdbool.h>",
        "#include <stdint.h>",
        "",
        f'#define MODEL_PTE_SHA256 "{spec.pte_sha256}"',
        f'#define MODEL_METHOD_NAME "{spec.method}"',
        f"#define MODEL_INPUT_COUNT {len(spec.inputs)}",
        f"#define MODEL_OUTPUT_COUNT {len(spec.outputs)}",
        "",
    ]
    for tensor in (*spec.inputs, *spec.outputs):
        macro = f"MODEL_{tensor.name.upper()}"
        layout = ", ".join("NCHW"[d] if len(tensor.sizes) == 4 else f"d{d}"
                           for d in tensor.dim_order)
        lines.append(f"/* {tensor.name}: {tensor.dtype} {list(tensor.sizes)}, bytes laid out "
                     f"{layout} (dim order {list(tensor.dim_order)}) */")
        lines += [
            f"typedef {_C_TYPES.get(tensor.dtype, 'uint8_t')} {tensor.name}_t;",
            f"#define {macro}_RANK {len(tensor.sizes)}",
            f"#define {macro}_SIZES {_c_list(tensor.sizes)}",
            f"#define {macro}_DIM_ORDER {_c_list(tensor.dim_order)}",
            f"#define {macro}_ELEMENTS {tensor.elements}",
            f"#define {macro}_BYTES {tensor.nbytes}",
        ]
        if tensor.scale is not None:
            formula = ("q = clamp(round(x / scale) + zero_point, -128, 127)"
                       if tensor.name.startswith("input") else "x = (q - zero_point) * scale")
            lines += [f"/* int8 program I/O: {formula} */",
                      f"#define {macro}_SCALE {tensor.scale!r}f",
                      f"#define {macro}_ZERO_POINT {tensor.zero_point}"]
        lines.append("")
    lines += [
        "#define MODEL_INPUT_BYTES_LIST " + _c_list([t.nbytes for t in spec.inputs]),
        "#define MODEL_OUTPUT_BYTES_LIST " + _c_list([t.nbytes for t in spec.outputs]),
        "",
        f"/* Memory, placed by memory.ld where the plan put it ({spec.plan_source}). */",
        f"#define MODEL_PTE_BYTES {len(spec.pte)} /* in {spec.image_region} */",
        f"#define MODEL_PLANNED_BUFFERS {len(spec.planned)}",
    ]
    for index, buffer in enumerate(spec.planned):
        lines.append(f"#define MODEL_PLANNED{index}_BYTES {buffer.size_bytes} "
                     f"/* mem_id {buffer.mem_id}, in {buffer.region} */")
    lines += [
        f"#define MODEL_WEIGHTS_COPY_BYTES {spec.weights_bytes if spec.weights_region else 0} "
        f"/* {'copied to ' + spec.weights_region + ' at model_init' if spec.weights_region else 'read in place from the image'} */",
        f"#define MODEL_METHOD_POOL_BYTES {spec.method_pool_bytes}",
        f"#define MODEL_NPU_PARTITIONS {spec.npu_partitions}"
        + (f" /* {spec.npu_product}, driver device layer: {spec.npu_device} */"
           if spec.npu_partitions else ""),
        f"#define MODEL_NPU_FAST_SCRATCH_BYTES {spec.fast_scratch_bytes}",
        f"#define MODEL_NPU_HANDLE_POOL_BYTES {_NPU_HANDLE_BYTES * max(spec.npu_partitions, 1)} "
        "/* EthosUBackend's ExecutionHandle per partition */",
        f"#define MODEL_TEMP_POOL_BYTES {spec.temp_pool_bytes} /* kernels' scratch (CMSIS-NN) "
        f"and the NPU scratch, reused by each instruction */",
        "",
        "#endif /* ORCHESTRATE_MODEL_IO_H */",
        "",
    ]
    return "\n".join(lines)


def model_memory_source(spec: FirmwareSpec, runtime_region: str) -> str:
    def buffer(name: str, region: str, size: int) -> str:
        return (f'__attribute__((section(".noinit.{_symbol(region)}.{name}"), '
                f"aligned({_ALIGNMENT}))) uint8_t {name}[{max(size, _ALIGNMENT)}];")

    lines = ["/* Generated by `orchestrate firmware`: every buffer in the section of the region "
             "the plan chose (memory.ld). */",
             '#include "model_memory.h"', ""]
    for index, planned in enumerate(spec.planned):
        lines.append("static " + buffer(f"model_planned{index}", planned.region,
                                        planned.size_bytes))
    names = ", ".join(f"model_planned{i}" for i in range(len(spec.planned))) or "0"
    sizes = ", ".join(str(p.size_bytes) for p in spec.planned) or "0"
    lines += [f"uint8_t* const model_planned_buffers[] = {{{names}}};",
              f"const size_t model_planned_buffer_bytes[] = {{{sizes}}};", "",
              buffer("model_method_pool", runtime_region, spec.method_pool_bytes),
              f"const size_t model_method_pool_bytes = {spec.method_pool_bytes};",
              buffer("model_temp_pool", spec.temp_region or runtime_region,
                     spec.temp_pool_bytes),
              f"const size_t model_temp_pool_bytes = {spec.temp_pool_bytes};"]
    if spec.weights_region:
        lines += [buffer("model_weights_pool", spec.weights_region, spec.weights_bytes),
                  f"const size_t model_weights_pool_bytes = {spec.weights_bytes};"]
    else:
        lines += ["uint8_t model_weights_pool[1];", "const size_t model_weights_pool_bytes = 0;"]
    if spec.fast_scratch_bytes:
        lines += [buffer("model_npu_fast_scratch", runtime_region, spec.fast_scratch_bytes),
                  f"const size_t model_npu_fast_scratch_bytes = {spec.fast_scratch_bytes};"]
    else:
        lines += ["uint8_t model_npu_fast_scratch[1];",
                  "const size_t model_npu_fast_scratch_bytes = 0;"]
    return "\n".join(lines) + "\n"


def model_pte_assembly() -> str:
    return f"""/* Generated by `orchestrate firmware`: the program image, in its own section (memory.ld
 * puts it in the region the plan chose). */
  .section .model_pte, "a"
  .balign {_IMAGE_ALIGNMENT}
  .global model_pte
model_pte:
  .incbin "model.pte"
model_pte_end:
  .section .rodata.model_pte_bytes, "a"
  .balign 4
  .global model_pte_bytes
model_pte_bytes:
  .word model_pte_end - model_pte
"""


def example_io_header(spec: FirmwareSpec) -> str:
    lines = [f"/* Generated by `orchestrate firmware`: one example input per program input "
             f"({spec.example_source}), in example_io.c, and room for the outputs. */",
             "#include <stddef.h>", "#include <stdint.h>", '#include "model_io.h"', ""]
    for index, data in enumerate(spec.example_inputs):
        lines.append(f"extern const uint8_t example_input{index}[{len(data)}];")
    for index, tensor in enumerate(spec.outputs):
        lines.append(f"static uint8_t example_output{index}[{max(tensor.nbytes, 1)}] "
                     f"__attribute__((aligned({_ALIGNMENT})));")
    inputs = ", ".join(f"example_input{i}" for i in range(len(spec.inputs)))
    outputs = ", ".join(f"example_output{i}" for i in range(len(spec.outputs)))
    lines += [f"static const void* const example_inputs[MODEL_INPUT_COUNT] = {{{inputs}}};",
              f"static void* const example_outputs[MODEL_OUTPUT_COUNT] = {{{outputs}}};",
              "static const size_t example_output_bytes[MODEL_OUTPUT_COUNT] = "
              "MODEL_OUTPUT_BYTES_LIST;", ""]
    return "\n".join(lines)


def example_io_source(spec: FirmwareSpec) -> str:
    """The example inputs' bytes, each in a section of its own (compiled without link-time
    optimization, which would fold the array into the code's read-only data), so the footprint
    tells the example's data from the code."""
    lines = [f"/* Generated by `orchestrate firmware`: {spec.example_source}. */",
             "#include <stdint.h>", ""]
    for index, data in enumerate(spec.example_inputs):
        body = ",".join(str(b) for b in data)
        lines.append(f"const uint8_t example_input{index}[{len(data)}] "
                     f'__attribute__((section(".rodata.example_input{index}"), '
                     f"aligned({_ALIGNMENT}))) = {{{body}}};")
    return "\n".join(lines) + "\n"


def linker_script(spec: FirmwareSpec, platform: Platform, config: BoardRecipe,
                  code_region: str) -> str:
    regions = platform.memories
    code, data, boot = _symbol(code_region), _symbol(config.data_region), _symbol(config.boot_region)
    image = _symbol(spec.image_region)
    used = {spec.image_region, config.runtime_region, spec.temp_region or config.runtime_region,
            *(p.region for p in spec.planned),
            *((spec.weights_region,) if spec.weights_region else ())}
    memory = "\n".join(
        f"  {_symbol(r.name)} (rwx) : ORIGIN = {r.base_address:#010x}, LENGTH = {r.size_bytes:#x}"
        for r in regions)
    vectors_apart = boot != code
    boot_section = (f"  .vectors : {{ KEEP(*(.vectors)) KEEP(*(.vectors.irq)) }} > {boot} :boot\n"
                    if vectors_apart else "")
    boot_phdr = "  boot PT_LOAD;\n" if vectors_apart else ""
    vectors_in_text = "" if vectors_apart else "    KEEP(*(.vectors))\n    KEEP(*(.vectors.irq))\n"
    image_in_code = image == code
    image_phdr = "" if image_in_code else "  image PT_LOAD;\n"
    image_section = (f"  .model_pte : ALIGN({_IMAGE_ALIGNMENT}) {{ KEEP(*(.model_pte)) }} > "
                     f"{image}{'' if image_in_code else ' :image'}\n")
    noinit = "\n".join(
        f"  .noinit_{_symbol(name)} (NOLOAD) : ALIGN({_ALIGNMENT}) "
        f"{{ *(.noinit.{_symbol(name)}.*) }} > {_symbol(name)} :none"
        for name in sorted(used))
    return f"""/* Generated by `orchestrate firmware` from {platform.source_file.name} and the plan's
 * memory placement ({spec.plan_source}): do not edit. */
MEMORY
{{
{memory}
}}

ENTRY(Reset_Handler)

PHDRS
{{
{boot_phdr}  text PT_LOAD;
{image_phdr}  data PT_LOAD;
  none PT_NULL;
}}

SECTIONS
{{
{boot_section}{code_sections(code, vectors_in_text)}{image_section}
{data_sections(code, data, config.stack_bytes)}  /* No heap: nothing in the firmware allocates. */
  __heap_start = .;
  __heap_end = .;

  /* The arenas, the weights copy and the pools, in the regions the plan chose; not loaded,
   * not zeroed (the runtime initialises what it reads). */
{noinit}
}}
"""


def toolchain_file(toolchain: Toolchain | None) -> str:
    """The CMake toolchain file: the GNU Arm toolchain found when the project was made, or (a
    project written with --no-build on a machine without one) the one on PATH when CMake
    configures."""
    if toolchain is not None:
        found = f"""# Generated by `orchestrate firmware`: the GNU Arm toolchain found when the project was
# made. Name another with -DCMAKE_TOOLCHAIN_FILE=... or set ARM_TOOLCHAIN_DIR.
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR arm)
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
if(NOT ARM_TOOLCHAIN_DIR)
  set(ARM_TOOLCHAIN_DIR "{toolchain.gcc.parent}")
endif()
"""
    else:
        found = """# Generated by `orchestrate firmware --no-build` on a machine without the GNU Arm
# toolchain: arm-none-eabi-gcc is looked up on PATH when CMake configures. Name another with
# -DCMAKE_TOOLCHAIN_FILE=... or set ARM_TOOLCHAIN_DIR.
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR arm)
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
if(NOT ARM_TOOLCHAIN_DIR)
  find_program(ARM_GCC arm-none-eabi-gcc REQUIRED)
  get_filename_component(ARM_TOOLCHAIN_DIR "${ARM_GCC}" DIRECTORY)
endif()
"""
    # gcc-ar and gcc-ranlib index link-time-optimization objects in static libraries.
    return found + f"""set(CMAKE_C_COMPILER "${{ARM_TOOLCHAIN_DIR}}/arm-none-eabi-gcc")
set(CMAKE_CXX_COMPILER "${{ARM_TOOLCHAIN_DIR}}/arm-none-eabi-g++")
set(CMAKE_ASM_COMPILER "${{ARM_TOOLCHAIN_DIR}}/arm-none-eabi-gcc")
set(CMAKE_AR "${{ARM_TOOLCHAIN_DIR}}/arm-none-eabi-gcc-ar")
set(CMAKE_RANLIB "${{ARM_TOOLCHAIN_DIR}}/arm-none-eabi-gcc-ranlib")
"""


def _npu_cmake(spec: FirmwareSpec, config: BoardRecipe, third_party: ThirdParty,
               optimization: str) -> str:
    """ExecuTorch's EthosUBackend and the Ethos-U core driver, compiled in place, with the
    device layer `spec.npu_device` names (object files: the backend registers itself)."""
    tp = third_party.root
    backend = third_party.executorch / "backends/arm/runtime"
    driver = third_party.ethos_u_driver
    define = config.npu_products[spec.npu_product]
    # The driver's own CMake derives these from its ETHOSU_TARGET_NPU_CONFIG ("ethos-u55-128").
    _, arch, macs = (spec.npu_accelerator or "ethos-u55-128").split("-")
    if spec.npu_device == "hardware":
        device = [f"${{ORCHESTRATE_THIRD_PARTY}}/{(driver / 'src' / _DEVICE_LAYER[spec.npu_product]).relative_to(tp)}",
                  "board/npu_hardware.c"]
    else:
        device = ["board/npu/ethosu_bridge.c", "board/npu_qemu_bridge.c"]
    # board/npu/ also holds the two CMSIS-Core intrinsics the driver includes.
    extra_include = "\n  ${CMAKE_CURRENT_LIST_DIR}/board/npu"
    sources = "\n".join(
        [f"  ${{ORCHESTRATE_THIRD_PARTY}}/{(backend / name).relative_to(tp)}"
         for name in _ETHOS_U_BACKEND]
        + [f"  ${{ORCHESTRATE_THIRD_PARTY}}/{(driver / 'src' / 'ethosu_driver.c').relative_to(tp)}"]
        + [f"  {path}" for path in (*device, "board/npu_semaphore.c", "board/npu_new.cpp")])
    return f"""
# The NPU: ExecuTorch's EthosUBackend and the Ethos-U core driver ({define}), device layer:
# {spec.npu_device}.
add_library(ethos_u OBJECT
{sources}
)
target_include_directories(ethos_u PRIVATE
  ${{ORCHESTRATE_THIRD_PARTY}}/{(driver / 'include').relative_to(tp)}
  ${{ORCHESTRATE_THIRD_PARTY}}/{(driver / 'src').relative_to(tp)}{extra_include})
target_compile_definitions(ethos_u PRIVATE {define} ETHOSU_ARCH={arch} ETHOSU_MACS={macs}
  ETHOSU_LOG_SEVERITY=0
  RUNNER_NPU_BASE_ADDRESS={config.npu_base_address:#x}u
  MODEL_NPU_BASE_ADDRESS={config.npu_base_address:#x}u MODEL_NPU_IRQ={config.npu_irq if config.npu_irq is not None else 0})
target_compile_options(ethos_u PRIVATE {optimization})
target_link_libraries(ethos_u PUBLIC executorch_headers)
"""


def _cmake_paths(paths: Sequence[Path], root: Path, variable: str) -> str:
    return "\n".join(f"  ${{{variable}}}/{p.relative_to(root)}" for p in paths)


def cmakelists(spec: FirmwareSpec, platform: Platform, config: BoardRecipe,
               third_party: ThirdParty, kernel_sources: dict[str, list[Path]],
               registrations: Sequence[str], kernel_count: int) -> str:
    tp = third_party.root
    release = spec.profile == "release"
    # Release: the runtime for size, the kernels for speed. The portable kernels are the
    # exception at -O2: in a CMSIS-NN program they are layout and dtype glue, and -O3 unrolls
    # their type switches (DS-CNN's dim-order copy kernel: 20,692 B at -O3, 3,940 B at -O2).
    runtime_opt, kernel_opt, portable_opt = (("-Os", "-O3", "-O2") if release else
                                             (config.optimization,) * 3)
    defines = (["ET_LOG_ENABLED=0", "ET_ENABLE_PROGRAM_VERIFICATION=0"] if release else
               ["ET_LOG_ENABLED=1", "ET_MIN_LOG_LEVEL=Info", "ET_ENABLE_PROGRAM_VERIFICATION=1",
                "MODEL_PROGRAM_VERIFICATION=Program::Verification::InternalConsistency"])
    runtime = runtime_sources(third_party, bundled_program=False)
    core = [p for p in runtime if "kernels/" not in str(p.relative_to(tp))]
    prim = [p for p in runtime if "kernels/prim_ops" in str(p)]
    portable_util = [p for p in runtime if "kernels/portable" in str(p)]
    libraries = []
    for name, sources in kernel_sources.items():
        if sources:
            libraries.append(f"""
add_library({name}_kernels STATIC
{_cmake_paths(sources, tp, 'ORCHESTRATE_THIRD_PARTY')}
)
target_compile_options({name}_kernels PRIVATE {portable_opt if name == 'portable' else kernel_opt})
target_link_libraries({name}_kernels PUBLIC executorch_headers)""")
    kernel_targets = " ".join(f"{name}_kernels" for name, s in kernel_sources.items() if s)
    npu = _npu_cmake(spec, config, third_party, runtime_opt) if spec.npu_partitions else ""
    npu_objects = " $<TARGET_OBJECTS:ethos_u>" if spec.npu_partitions else ""
    board_c = " ".join(f"board/{name}" for name in _BOARD_FILES if name.endswith(".c"))
    pal = ("board/pal_release.cpp board/snprintf_min.c" if release
           else "board/pal.cpp board/printf_c99.c")
    link_extra = ("--specs=nano.specs -Wl,--wrap=snprintf" if release
                  else "-Wl,--wrap=vsnprintf")
    lto = "-flto" if spec.lto else ""
    # GCC resolves --wrap after link-time optimization has dropped the wrapper, so the files
    # defining wrapped or libc-replacing symbols stay out of it.
    # (and so do the newlib system calls semihosting.c defines).
    no_lto = ("\nset_source_files_properties(board/snprintf_min.c board/pal_release.cpp "
              "board/semihosting.c example_io.c PROPERTIES COMPILE_OPTIONS -fno-lto)"
              if spec.lto and release else "")
    return f"""# Generated by `orchestrate firmware` ({spec.profile} profile) for {spec.program_name}.pte on
# {platform.name}. One command builds it:
#   cmake -S . -B build && cmake --build build
# The runtime, the kernels and CMSIS-NN compile from the sources in ORCHESTRATE_THIRD_PARTY, in
# place (`orchestrate sources show` says where they are; `orchestrate sources fetch` clones them).
cmake_minimum_required(VERSION 3.20)
if(NOT CMAKE_TOOLCHAIN_FILE)
  set(CMAKE_TOOLCHAIN_FILE "${{CMAKE_CURRENT_LIST_DIR}}/cmake/arm-none-eabi-gcc.cmake")
endif()
project({_symbol(spec.program_name)}_firmware C CXX ASM)

set(ORCHESTRATE_THIRD_PARTY "{tp}" CACHE PATH
    "ExecuTorch, CMSIS-NN and flatbuffers sources (orchestrate sources show)")
if(NOT EXISTS "${{ORCHESTRATE_THIRD_PARTY}}/executorch/runtime/executor/method.cpp")
  message(FATAL_ERROR "no ExecuTorch sources in ${{ORCHESTRATE_THIRD_PARTY}}: set "
                      "-DORCHESTRATE_THIRD_PARTY=... (orchestrate sources show)")
endif()
set(ET "${{ORCHESTRATE_THIRD_PARTY}}/executorch")

set(CPU_FLAGS {' '.join(config.cpu_flags)})
add_compile_options(${{CPU_FLAGS}} {lto} -ffunction-sections -fdata-sections
  "-ffile-prefix-map=${{ORCHESTRATE_THIRD_PARTY}}=third_party"
  "-ffile-prefix-map=${{CMAKE_CURRENT_LIST_DIR}}=.")
add_compile_definitions(ARM_NN_ENABLE_F32=0 ARM_NN_ENABLE_F16=0)
set(CMAKE_C_STANDARD 11)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_C_EXTENSIONS ON)
set(CMAKE_CXX_EXTENSIONS ON)
set(CMAKE_CXX_FLAGS "${{CMAKE_CXX_FLAGS}} -fno-exceptions -fno-rtti -fno-unwind-tables \\
-fno-asynchronous-unwind-tables -fno-threadsafe-statics -Wno-deprecated-declarations")

# What every ExecuTorch source sees.
add_library(executorch_headers INTERFACE)
target_include_directories(executorch_headers INTERFACE
  ${{ORCHESTRATE_THIRD_PARTY}}
  ${{ET}}/runtime/core/portable_type/c10
  ${{ORCHESTRATE_THIRD_PARTY}}/flatbuffers/include
  ${{ORCHESTRATE_THIRD_PARTY}}/cmsis-nn/Include
  ${{CMAKE_CURRENT_LIST_DIR}}/generated/schema
  ${{CMAKE_CURRENT_LIST_DIR}}/model
  ${{CMAKE_CURRENT_LIST_DIR}}/board)
target_compile_definitions(executorch_headers INTERFACE C10_USING_CUSTOM_GENERATED_MACROS
  FLATBUFFERS_MAX_ALIGNMENT=1024 MAX_KERNEL_NUM={kernel_count} {' '.join(defines)})

# The runtime core: program, method, tensors, the kernel registry, the platform layer's API.
add_library(executorch_core STATIC
{_cmake_paths(core, tp, 'ORCHESTRATE_THIRD_PARTY')}
)
target_compile_options(executorch_core PRIVATE {runtime_opt})
target_link_libraries(executorch_core PUBLIC executorch_headers)

# Primitive operators (symbolic sizes, scalar arithmetic) the runtime always registers.
add_library(prim_ops STATIC
{_cmake_paths(prim, tp, 'ORCHESTRATE_THIRD_PARTY')}
)
target_compile_options(prim_ops PRIVATE {runtime_opt})
target_link_libraries(prim_ops PUBLIC executorch_headers)

# The portable kernels' shared helpers.
add_library(portable_util STATIC
{_cmake_paths(portable_util, tp, 'ORCHESTRATE_THIRD_PARTY')}
)
target_compile_options(portable_util PRIVATE {portable_opt})
target_link_libraries(portable_util PUBLIC executorch_headers)

# The kernels of the program's operators only (selective build).
{''.join(libraries)}

# CMSIS-NN's integer kernels (the linker keeps the functions the kernels call).
add_library(cmsis_nn STATIC
{_cmake_paths(cmsis_nn_sources(third_party), tp, 'ORCHESTRATE_THIRD_PARTY')}
)
target_include_directories(cmsis_nn PUBLIC ${{ORCHESTRATE_THIRD_PARTY}}/cmsis-nn/Include)
target_compile_options(cmsis_nn PRIVATE {kernel_opt})

# The model: the program image, its buffers, the C API and the kernels' registration (object
# files, so their static registration is always linked).
add_library(model OBJECT
  model/model.cpp
  model/model_memory.c
  model/model_pte.S
{chr(10).join('  ' + r for r in registrations)}
)
target_compile_options(model PRIVATE {runtime_opt})
set_source_files_properties(model/model_pte.S PROPERTIES
  OBJECT_DEPENDS "${{CMAKE_CURRENT_LIST_DIR}}/model/model.pte"
  COMPILE_OPTIONS "-I${{CMAKE_CURRENT_LIST_DIR}}/model")
target_link_libraries(model PUBLIC executorch_headers)

# The board: reset, console, counters, ExecuTorch's platform layer, and the example main.
{npu}
add_executable({ELF_NAME} main.c example_io.c {board_c} {pal} $<TARGET_OBJECTS:model>{npu_objects})
target_compile_options({ELF_NAME} PRIVATE {runtime_opt} -DRUNNER_CPU_HZ={platform.cpu_hz})
target_link_libraries({ELF_NAME} PRIVATE executorch_headers
  -Wl,--start-group {kernel_targets} portable_util prim_ops executorch_core cmsis_nn
  -Wl,--end-group)
target_link_options({ELF_NAME} PRIVATE ${{CPU_FLAGS}} {lto} -ffunction-sections -fdata-sections
  -nostartfiles {link_extra}
  "-T${{CMAKE_CURRENT_LIST_DIR}}/memory.ld" -Wl,--gc-sections
  "-Wl,-Map=${{CMAKE_CURRENT_BINARY_DIR}}/{MAP_NAME}")
set_target_properties({ELF_NAME} PROPERTIES LINK_DEPENDS "${{CMAKE_CURRENT_LIST_DIR}}/memory.ld"){no_lto}
"""


# ---------------------------------------------------------------------------------------------
# Writing and building


def write_project(spec: FirmwareSpec, platform: Platform, folder: Path, third_party: ThirdParty,
                  toolchain: Toolchain | None, cache: Path) -> dict:
    """Write the project into `folder` (which must be empty or new); return firmware.json's
    record. Raises FirmwareBuildError / QemuUnavailable subclasses when the platform has no
    firmware recipe or an operator has no kernel in the sources."""
    if spec.profile not in PROFILES:
        raise ValueError(f"unknown profile {spec.profile!r}")
    config = board_recipe(platform)
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
        generated = kernel_registration(third_party, cache / "corstone-runner", tree,
                                        libraries[name], operators)
        target = folder / "generated" / name
        target.mkdir(parents=True)
        for file in sorted(generated.iterdir()):
            if file.suffix in (".cpp", ".h"):
                shutil.copy2(file, target / file.name)
        registrations.append(f"generated/{name}/RegisterCodegenUnboxedKernelsEverything.cpp")
        kernel_sources[name] = list(selection.sources[name])
    schema = schema_headers(third_party, cache / "corstone-runner")
    shutil.copytree(schema / "executorch" / "schema", folder / "generated" / "schema" /
                    "executorch" / "schema")
    for name in ("model.h", "model.cpp", "model_memory.h"):
        _copy(TEMPLATES / name, folder / "model" / name)
    (folder / "model" / "model.pte").write_bytes(spec.pte)
    (folder / "model" / "model_io.h").write_text(model_io_header(spec))
    (folder / "model" / "model_memory.c").write_text(
        model_memory_source(spec, config.runtime_region))
    (folder / "model" / "model_pte.S").write_text(model_pte_assembly())
    for name in _BOARD_FILES:
        _copy(config.sources_dir / name, folder / "board" / name)
    if spec.profile == "release":
        for name in ("pal_release.cpp", "snprintf_min.c"):
            _copy(TEMPLATES / name, folder / "board" / name)
    else:
        for name in ("pal.cpp", "printf_c99.c"):
            _copy(config.sources_dir / name, folder / "board" / name)
    if spec.npu_partitions:
        for name in ("npu_semaphore.c", "npu_new.cpp"):
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
                  jobs: int | None = None) -> Path:
    """Configure and build with CMake; the ELF. The code goes to the first of the recipe's code
    regions it fits in (the linker decides; memory.ld and firmware.json are rewritten for the
    next region and only the link runs again). FirmwareBuildError carries the tool's last
    lines."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise FirmwareBuildError("no cmake on PATH (apt-get install cmake)")
    config = board_recipe(platform)
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
