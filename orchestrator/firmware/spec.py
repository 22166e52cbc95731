"""What a firmware project is generated from: the program's inputs and outputs, the plan's
memory, the example inputs and the build's choices (`FirmwareSpec`), and the names of the files
`orchestrate firmware` writes and builds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernels.dtypes import ELEMENT_BYTES

PROFILES = ("release", "check")
NPU_DEVICES = ("hardware", "qemu-bridge")
RECORD_NAME = "firmware.json"
ELF_NAME = "firmware.elf"
MAP_NAME = "firmware.map"
BUILD_DIR = "build"
# The board files of a platform's runner that a firmware takes (runner.cpp and the log-format
# printf are the check runner's own).
BOARD_FILES = ("board.h", "startup.c", "semihosting.c", "counters.c")


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
    # Per program input, the example's bytes: `frames` inputs one after the other (the frames
    # of one stream for a program with state, each run in turn by the example main).
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
    # The core the program was compiled for (its manifest's): the project is built with its
    # flags, so the kernels are the program's tier's. None: the platform's recipe's core.
    cpu: str | None = None
    frames: int = 1
    # Bytes of state the program carries from one inference to the next (its mutable buffers,
    # in the planned arenas); model_reset() starts it again from the initial values.
    state_bytes: int = 0
