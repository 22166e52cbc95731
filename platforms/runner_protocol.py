"""What the QEMU harness (platforms/qemu.py) and the runner firmware (platforms/<platform>/runner/)
exchange: the mailbox the harness writes into memory before the CPU starts (runner_mailbox_t in
runner/board.h), the lines the runner prints (runner.cpp) and its exit codes (runner_exit_code in
runner/board.h), and what one inference's figures read from that log are (QemuCase,
QemuTraceEntry). A change here is a change to the C side, and the reverse.

The generic ExecuTorch/BundleIO verdict lines, common to the FVP's runner, are read by
platforms/fvp.parse_runner_log.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

# Mirrors runner_mailbox_t in runner/board.h.
MAILBOX_PLANNED = 4  # RUNNER_MAILBOX_PLANNED
MAILBOX = struct.Struct("<IIII" + "16s" * MAILBOX_PLANNED + "16sffI16sI")
MAILBOX_MAGIC = 0x4E55524F
MAILBOX_VERSION = 4

# What the runner prints (runner.cpp, ExecuTorch's ET_LOG), read back by the harness.
ET_LOG_PREFIX = re.compile(r"^[DIWEF] \[executorch:[^\]]*\]\s*")
CASE_TICKS = re.compile(r"Inference\[(\d+)\]: (\d+) SysTick ticks")
CASE_RESULT = re.compile(r"BundleIO index\[(\d+)\] Test_result: (PASS|FAIL)")
# A failed case's output bytes as the device wrote them, by digest (runner.cpp report_mismatch)
CASE_DIGEST = re.compile(r"Output (\d+) of case (\d+): FNV-1a 0x([0-9a-f]{16})")
CALIBRATION = re.compile(r"Calibration: (\d+) instructions in (\d+) SysTick ticks")
CONSTANT_SEGMENT = re.compile(
    r"constant segment: (\d+) bytes (?:copied to (\S+)|read in place) at (0x[0-9a-fA-F]+)")
PLANNED_BUFFER = re.compile(
    r"planned buffer \d+ \(mem_id (\d+)\): (\d+) bytes in (\S+) at (0x[0-9a-fA-F]+|\(nil\))")
# The trace build's clock (DWT cycles where the core counts them, else SysTick ticks), each
# instruction's scope (OPERATOR_CALL, DELEGATE_CALL, or a backend's own scope such as
# EthosUBackend::execute()) with its kernel, and the whole inference; ticks and starts on the
# clock's timeline with the tracer's own ticks removed.
TRACE_CLOCK = re.compile(r"Trace clock: (DWT cycles|SysTick ticks)")
TRACE_TICKS = re.compile(
    r"Trace\[(\d+)\] instruction (\d+) (\S+) (\S+): (\d+) ticks from (\d+) "
    r"\(kernel (\d+) from (\d+)\)")
TRACE_EXECUTE = re.compile(r"Trace\[(\d+)\] Method::execute: (\d+) ticks from (\d+)")
TRACE_TENSOR = re.compile(
    r"Trace\[(\d+)\] instruction (\d+) tensor \d+: (\d+) bytes crc32 ([0-9a-f]{8})")
# runner_exit_code in runner/board.h.
EXIT_MEANING = {10: "outputs differ from the bundled expectation",
                11: "the runner could not load or run the program", 12: "CPU fault",
                13: "ExecuTorch aborted"}


@dataclass(frozen=True)
class QemuCase:
    index: int
    passed: bool | None
    instructions: int | None  # per inference, from the icount-driven SysTick
    ticks: int
    # A failed case: the FNV-1a of each output's bytes the device wrote (`fnv1a64`), by output
    digests: tuple[int, ...] = ()


def fnv1a64(data: bytes) -> int:
    """FNV-1a, 64-bit: the digest the runner logs of a failed case's outputs."""
    value = 0xcbf29ce484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return value


@dataclass(frozen=True)
class QemuTraceEntry:
    """One instruction of one inference in a trace build, or the whole inference (kind
    EXECUTE, instruction -1). Ticks are the trace clock's (QemuResult.trace_clock); starts are on
    its timeline with the tracer's own ticks removed."""

    case: int
    instruction: int  # index in the method's chain, as the twin's op trace counts them
    kind: str  # OPERATOR_CALL, DELEGATE_CALL, a backend's scope (EthosUBackend::execute()), EXECUTE
    kernel: str  # the operator the kernel registered, e.g. quantized_conv2d.out; "" for no kernel
    ticks: int
    instructions: int | None  # the whole instruction: argument unboxing, kernel, dispatch
    kernel_instructions: int | None  # the kernel call alone
    tensors: tuple[tuple[int, int], ...]  # (bytes, crc32) of each tensor it logged: its outputs
    start_ticks: int = 0
    kernel_ticks: int = 0
    kernel_start_ticks: int = 0


EXECUTE = "Method::execute"  # QemuTraceEntry.kind of the whole inference


# The incumbent's runner (runner/tflm/runner.cc, tflm_mailbox_t): TensorFlow Lite Micro running
# a .tflite; its inputs and outputs travel as host files over semihosting.
TFLM_MAILBOX = struct.Struct("<IIII16sIIIII")
TFLM_MAILBOX_MAGIC = 0x4C46544F  # "OTFL"
TFLM_MAILBOX_VERSION = 2
TFLM_INPUT_FILE = "orchestrate-tflm-in"
TFLM_OUTPUT_FILE = "orchestrate-tflm-out"
TFLM_ARENA = re.compile(r"TFLM arena: (\d+) of (\d+) bytes used in (\S+) at (0x[0-9a-fA-F]+)")
TFLM_PROFILE = re.compile(r"^TFLM profile\[(\d+)\]:$")
TFLM_PROFILE_ROW = re.compile(r"^(\d+),([^,]+),(-?\d+)$")
TFLM_ERROR = re.compile(r"^E (.*)$", re.MULTILINE)
