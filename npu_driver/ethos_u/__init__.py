"""A bit-exact functional model of the Ethos-U55/U65 NPU executing Vela's command stream.

Entry points:

- `execute(command_stream, regions, accelerator=None) -> Counters`: what the NPU does for one
  `ethosu_invoke_v3(custom_data_ptr, custom_data_size, base_addr, base_addr_size, n)` call. The
  `command_stream` is the whole custom-operator payload (COP1 header, driver actions, commands,
  i.e. a delegate payload's `cmd_bytes`); `regions[i]` is the memory base address i points at
  (a writable buffer: bytearray, writable memoryview, numpy uint8 array; None for an absent
  one). The regions are mutated in place exactly as the NPU writes them. `accelerator` (e.g.
  "ethos-u55-128") is the NPU the call runs on; its configuration must match the stream's
  OPTIMIZER_CONFIG as the driver's ethosu_dev_verify_optimizer_config requires. None: the
  configuration the stream was compiled for.
- `run_partition(payload, inputs, accelerator=None) -> (outputs, Counters)`: one delegate
  invocation set up as ExecuTorch's EthosUBackend does (EthosUBackend.cpp::execute and
  EthosUBackend_Cortex_M.cpp::platform_execute): base address 0 = the payload's weight data,
  1 = a zeroed scratch of `scratch_bytes` with each input's bytes copied to its Vela offset,
  2 = the fast scratch. Returns each output's bytes read back from its Vela offset.
- `run_npu_partition(partition, arrays, accelerator=None) -> (arrays, Counters)`: the same for an
  `orchestrator.verification.twin.NpuPartition`, taking and returning numpy arrays shaped and typed like the
  partition's TOSA graph IO (`run_tosa`'s convention), for byte-for-byte comparison.
- `invocation_handler(accelerator=None)`: a `kernels.runtime` NpuHandler running each
  `NpuInvocation` (the host Ethos-U driver's callback) on its regions in place.
- `disassemble(command_stream) -> str`: the commands, one per line, with word offsets.
- `check_stream(command_stream, region_sizes, accel)`: the stream checker `execute` runs first
  (checker.py): every access bounded, reserved bits, registers set, a STOP at the end.
- `check_partition_weights(payload, tosa_bytes)`: every weight and scale stream against the
  TOSA graph's constants, whatever the inputs (weight_check.py), on the U55/U65 and the U85.
- Ethos-U85: `u85_commands` (the U85 command table, generated from `ethosu85_interface.h`),
  `u85_checker.check_u85_stream` (the stream checker's rules on U85 streams) and
  `u85_weights` (its SWD/FWD weight streams and scale records, `u85_mlw` the stream Vela's
  encoder writes for given weights); `u85_machine` executes U85 streams (`execute`,
  `run_partition` and the rest dispatch a U85 payload to it by its OPTIMIZER_CONFIG): bit-exact
  against the TOSA reference model on the zoo's U85 partitions, refusing what it does not
  execute (kept accumulators, table lookups, ...) by command and word offset.

`Counters` (what an execution did): commands and their count per opcode, operations per kind,
MACs (convolution and depthwise), DMA bytes per source->destination, bytes read and written per
region, and `hazards`: DMA/kernel overlaps the stream does not wait for (the device runs DMA
and kernels concurrently; the model executes in order, so its result is the device's only when
this list is empty).

Everything the model cannot execute faithfully raises a `NpuModelError` subclass naming the
command and its word offset; nothing is skipped. Refused as not modelled (UnmodelledCommand):
NPU_OP_IRQ; dual-core operation (PARALLEL_MODE != 0, non-zero WEIGHT1/SCALE1 lengths: U65-512);
2-D/3-D and custom DMA, DMA from SHRAM, DMA channel/mode != 0; the FP_S5_10 accumulator and
the 4x4 kernel decomposition; the built-in TANH/SIGMOID activation functions and uint16 tables;
elementwise LRELU, MUL with operand scaling, 32-bit operand scaling, CLZ/SHL/SHR on operands
other than 32-bit or by amounts outside 0..31; IFM upscaling on elementwise operations; OFM
scales other than 1 on 32-bit elementwise/pooling OFMs, but a 32-bit MUL's (its shift alone
applies, as the interface says); clamps narrower than int16 on 32-bit OFMs; accumulator overflow beyond ACC_FORMAT's
width; reserved register values; and any register an operation reads but the stream never set.
Verified byte-exact against the TOSA reference model (tests/test_npu_model.py,
benchmarks/npu_model.py): int8 and int16 convolution, depthwise, max/average/reduce-sum pooling,
elementwise ADD/SUB (all three operand-scaling modes, 8-bit), MUL, MIN, MAX, ABS, int8 and
int16 LUTs, IFM2 broadcast and scalars, NHWC and NHCWB16, tiles, padding, strides 1-2,
dilation 2, nearest and zero upscaling, NATURAL and DBL rounding, 32-bit OFMs; on U55-64/128/256
and U65-256. Implemented from the register definitions but exercised by no stream Vela 5.1
produced here: TRUNCATE rounding, DBL with shifts above 31, per-channel pooling scales, 16-bit
OPA_32/OPB_32 operand scaling (the fixed 2**14 weight of the unscaled operand).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from npu_driver.ethos_u.arch import ACCELERATORS, Accelerator, accelerator_for
from npu_driver.ethos_u.checker import StreamCheck, StreamRefused, check_stream
from npu_driver.ethos_u.disasm import disassemble
from npu_driver.ethos_u.errors import (CommandStreamError, ConfigMismatch, MemoryFault,
                                       NpuModelError, UnmodelledCommand)
from npu_driver.ethos_u.fmap import Memory
from npu_driver.ethos_u.machine import Counters, Machine, run_streams
from npu_driver.ethos_u.mlw import WeightStreamError
from npu_driver.ethos_u.u85_checker import check_u85_stream
from npu_driver.ethos_u.u85_machine import execute_u85
from npu_driver.ethos_u.weight_check import WeightMismatch, WeightReport, check_weights
from npu_driver.ethos_u.stream import (ACTION_OPTIMIZER_CONFIG, Command, CustomOperatorPayload,
                                       OptimizerConfig, decode_commands,
                                       parse_custom_operator_payload)

__all__ = ["ACCELERATORS", "Accelerator", "CommandStreamError", "ConfigMismatch", "Counters",
           "MemoryFault", "NpuModelError", "UnmodelledCommand", "execute", "run_partition",
           "run_npu_partition", "parse_custom_operator_payload", "resolve_accelerator",
           "execute_backend_invocation",
           "SCRATCH_REGION", "WEIGHTS_REGION", "FAST_SCRATCH_REGION", "WeightStreamError",
           "HazardError", "disassemble", "invocation_handler", "StreamCheck", "StreamRefused",
           "check_stream", "check_partition_weights", "WeightMismatch", "WeightReport"]

# EthosUBackend_Cortex_M.cpp::platform_execute: bases = {weight_data, scratch, fast_scratch}
WEIGHTS_REGION = 0
SCRATCH_REGION = 1
FAST_SCRATCH_REGION = 2


def resolve_accelerator(cop: CustomOperatorPayload, accelerator: str | None) -> Accelerator:
    """The configuration to run, checked against the stream's OPTIMIZER_CONFIG like the driver."""
    config = cop.optimizer_configs[0] if cop.optimizer_configs else None
    if accelerator is None:
        if config is None:
            raise ConfigMismatch("the command stream has no OPTIMIZER_CONFIG; name the "
                                 "accelerator to run it on")
        try:
            return accelerator_for(config.product, config.macs_per_cc_log2)
        except KeyError as error:
            raise ConfigMismatch(f"OPTIMIZER_CONFIG at word {config.offset}: {error}") from None
    if accelerator not in ACCELERATORS:
        raise ConfigMismatch(f"unknown accelerator {accelerator!r}; modelled: "
                             f"{', '.join(ACCELERATORS)}")
    accel = ACCELERATORS[accelerator]
    if config is not None:
        problems = []
        if config.product != accel.product:
            problems.append(f"product {config.product} (stream) vs {accel.product} (NPU)")
        if config.macs_per_cc_log2 != accel.log2_macs:
            problems.append(f"{1 << config.macs_per_cc_log2} MACs/cycle (stream) vs "
                            f"{accel.macs} (NPU)")
        if problems:
            raise ConfigMismatch(f"OPTIMIZER_CONFIG at word {config.offset} was compiled for "
                                 f"another NPU: {'; '.join(problems)} "
                                 "(ethosu_dev_verify_optimizer_config refuses it)")
    return accel


def execute(command_stream: bytes, regions: Sequence, accelerator: str | None = None, *,
            growable_regions: tuple[int, ...] = (), trace: bool = False) -> Counters:
    """Run one custom-operator payload over `regions` (mutated in place). `growable_regions`:
    regions sized by use instead of refusing an access beyond them (diagnosis; the fast
    scratch of unknown size). `trace`: record every memory access in `Counters.trace`.
    An Ethos-U85 payload runs in the U85 model (u85_machine.execute_u85)."""
    if _for_u85(bytes(command_stream[:12]), accelerator):
        return execute_u85(command_stream, regions, accelerator,
                           growable_regions=growable_regions, trace=trace)
    cop = parse_custom_operator_payload(bytes(command_stream))
    accel = resolve_accelerator(cop, accelerator)
    # Bound every access before any byte moves, as the Linux driver does before submitting
    check_stream(command_stream, [None if r is None else memoryview(r).nbytes for r in regions],
                 accel, tuple(growable_regions))
    machine = Machine(accel, Memory(regions, accel.shram_bytes, growable_regions))
    return run_streams(machine, cop.command_streams, regions, tuple(growable_regions), trace)


def execute_backend_invocation(command_stream: bytes, regions: list,
                               accelerator: str | None = None) -> Counters:
    """One invocation on the regions EthosUBackend handed the driver (mutated in place). A
    0-byte fast scratch (the host build, or a firmware that defines no `ethosu_fast_scratch`)
    is sized by what the stream uses, so a Dedicated_Sram program can be computed; the bytes
    it needs are in `Counters.region_sizes`."""
    absent = tuple(i for i in (FAST_SCRATCH_REGION,) if i < len(regions) and not len(regions[i]))
    # The weights region is the program's constant data (in flash where the firmware executes
    # the .pte in place): read-only here as in run_partition, so the twin, the host runtime
    # and the QEMU bridge refuse a stream that writes it alike (the bridge and the host
    # runtime handed it over writable, and passed what the twin refused).
    if regions and regions[WEIGHTS_REGION] is not None:
        regions[WEIGHTS_REGION] = memoryview(regions[WEIGHTS_REGION]).toreadonly()
    return execute(command_stream, regions, accelerator, growable_regions=absent)


def check_partition_weights(payload, tosa_bytes: bytes,
                            accelerator: str | None = None) -> WeightReport:
    """Every weight and scale stream of an EthosUPayload against its TOSA graph's constants,
    whatever the inputs (weight_check.py); the regions are the payload's weight data and
    scratch, the fast scratch sized by use. An Ethos-U85 payload (by `accelerator`, or by its
    OPTIMIZER_CONFIG when None) is walked by the U85 stream checker, its streams decoded in
    the U85's formats (u85_weights.py)."""
    regions = [len(payload.weight_bytes), payload.scratch_bytes, None]
    if _for_u85(payload.cmd_bytes, accelerator):
        check = check_u85_stream(payload.cmd_bytes, regions, accelerator, (FAST_SCRATCH_REGION,),
                                 lut_loads=True)
        return check_weights(payload.weight_bytes, check, tosa_bytes)
    accel = resolve_accelerator(parse_custom_operator_payload(payload.cmd_bytes), accelerator)
    check = check_stream(payload.cmd_bytes, regions, accel, (FAST_SCRATCH_REGION,))
    return check_weights(payload.weight_bytes, check, tosa_bytes)


def _for_u85(command_stream: bytes, accelerator: str | None) -> bool:
    """Whether the payload is for an Ethos-U85: the accelerator named, or else the product of
    the OPTIMIZER_CONFIG that opens it (config_r.product 2)."""
    if accelerator is not None:
        return accelerator.startswith("ethos-u85-")
    words = [int.from_bytes(command_stream[i:i + 4], "little") for i in range(4, 12, 4)]
    return (len(command_stream) >= 12 and words[0] & 0xFF == ACTION_OPTIMIZER_CONFIG
            and (words[1] >> 28) & 0xF == 2)


def run_partition(payload, inputs: Sequence, accelerator: str | None = None, *,
                  fast_scratch_bytes: int | None = None, trace: bool = False,
                  grow_scratch: bool = False) -> tuple[list[bytes], Counters]:
    """One invocation of an EthosUPayload (npu_driver.payload). `inputs` are numpy arrays or
    bytes, one per `payload.inputs`, each exactly that input's byte size; returns the bytes of
    each `payload.outputs`. `fast_scratch_bytes` None: the fast scratch is as large as the
    stream uses (the payload does not record the firmware's `ethosu_fast_scratch_size`)."""
    if len(inputs) != len(payload.inputs):
        raise ValueError(f"the payload has {len(payload.inputs)} input(s), got {len(inputs)}")
    weights = memoryview(bytes(payload.weight_bytes))
    scratch = bytearray(payload.scratch_bytes)
    fast = None if fast_scratch_bytes is None else bytearray(fast_scratch_bytes)
    for index, (vela, data) in enumerate(zip(payload.inputs, inputs)):
        raw = np.ascontiguousarray(data).tobytes() if isinstance(data, np.ndarray) else bytes(data)
        if len(raw) != vela.nbytes:
            raise ValueError(f"input {index} is {len(raw)} bytes; the payload expects "
                             f"{vela.nbytes} ({list(vela.shape6d)} x {vela.elem_size} B)")
        if vela.region != SCRATCH_REGION:
            raise ValueError(f"input {index} lives in region {vela.region}; EthosUBackend copies "
                             "inputs into the scratch (region 1)")
        scratch[vela.offset:vela.offset + len(raw)] = raw
    regions = [weights, scratch, fast]
    growable = (() if fast_scratch_bytes is not None else (FAST_SCRATCH_REGION,)) + (
        (SCRATCH_REGION,) if grow_scratch else ())
    counters = execute(payload.cmd_bytes, regions, accelerator, growable_regions=growable,
                       trace=trace)
    scratch = regions[SCRATCH_REGION]
    outputs = []
    for index, vela in enumerate(payload.outputs):
        if vela.region != SCRATCH_REGION:
            raise ValueError(f"output {index} lives in region {vela.region}; EthosUBackend "
                             "copies outputs from the scratch (region 1)")
        outputs.append(bytes(scratch[vela.offset:vela.offset + vela.nbytes]))
    return outputs, counters


def run_npu_partition(partition, arrays: Sequence[np.ndarray], accelerator: str | None = None,
                      **options) -> tuple[list[np.ndarray], Counters]:
    """`run_partition` for an orchestrator.verification.twin.NpuPartition, with TOSA-shaped numpy IO."""
    outputs, counters = run_partition(partition.payload, list(arrays), accelerator, **options)
    shaped = [np.frombuffer(data, dtype=spec.numpy_type).reshape(spec.shape).copy()
              for data, spec in zip(outputs, partition.io.outputs)]
    return shaped, counters


class HazardError(NpuModelError):
    """The stream lets a DMA and a kernel operation touch the same bytes concurrently."""


def invocation_handler(accelerator: str | None = None, *, fail_on_hazard: bool = True,
                       on_counters=None):
    """An NpuHandler for kernels.runtime.HostRuntime: executes `invocation.command_stream` over
    `invocation.regions` (base address 0 weights, 1 scratch, 2 fast scratch, as
    EthosUBackend_Cortex_M.cpp::platform_execute passes them to ethosu_invoke_v3), in place.
    `on_counters(counters)` receives each invocation's counters."""

    def handle(invocation) -> None:
        counters = execute(invocation.command_stream, list(invocation.regions), accelerator)
        if on_counters is not None:
            on_counters(counters)
        if fail_on_hazard and counters.hazards:
            raise HazardError(counters.hazards[0])

    return handle
