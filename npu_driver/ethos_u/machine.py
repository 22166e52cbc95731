"""The register machine: every command sets a register or runs an operation with the registers.

One handler per NPU_OP_* kind (DMA, convolution, depthwise, pooling, elementwise). A handler reads
only the registers its operation uses and refuses a register it needs but that was never set, a
value it does not model, or an access outside a region, naming the command and its word offset.
Execution is in stream order: DMA and kernel operations overlap on the device, but a correct
stream waits (NPU_OP_DMA_WAIT / KERNEL_WAIT, BLOCKDEP) wherever one depends on the other, so
in-order execution gives the device's result. `check_hazards` additionally reports a read of
bytes an un-waited DMA is still writing.

Register fields follow the Ethos-U55/U65 interface definitions (ethosu55_interface.h /
ethosu65_interface.h `struct npu_set_*_t`, mirrored by Vela's ethos_u55_regs.py), and how Vela's
`register_command_stream_generator.py` and regor's `ethos_u55_register_cs_generator.cpp` fill them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from ethosu.vela.ethos_u55_regs.ethos_u55_regs import cmd0, cmd1

from npu_driver.ethos_u import arith
from npu_driver.ethos_u.arch import LUT_SLOT_BYTES, Accelerator
from npu_driver.ethos_u.errors import MemoryFault, UnmodelledCommand, where
from npu_driver.ethos_u.fmap import FeatureMap, Memory, feature_map
from npu_driver.ethos_u.hazards import MAX_OUTSTANDING_DMA, HazardTracker
from npu_driver.ethos_u.stream import Command
from npu_driver.ethos_u.weights import SCALE_RECORD_BYTES, WeightLayout, decode_scales, decode_weights

# Registers with no effect on the values the NPU computes: SHRAM layout, block dependency and the
# OFM block width/height only change scheduling and which SHRAM banks hold what.
_SCHEDULING_ONLY = {cmd0.NPU_SET_IFM_IB_END, cmd0.NPU_SET_AB_START, cmd0.NPU_SET_IFM2_IB_START,
                    cmd0.NPU_SET_BLOCKDEP, cmd0.NPU_SET_OFM_BLK_WIDTH_M1,
                    cmd0.NPU_SET_OFM_BLK_HEIGHT_M1}
_POOL_MODES = {0: "max", 1: "average", 2: "reduce_sum"}
_ELEMENTWISE_MODES = {0: "mul", 1: "add", 2: "sub", 3: "min", 4: "max", 5: "lrelu", 6: "abs",
                      7: "clz", 8: "shr", 9: "shl"}
_UNARY = {"lrelu", "abs", "clz"}
_ACTIVATION_NAMES = {0: "RELU (none)", 3: "TANH", 4: "SIGMOID"}
# activation_clip_range (ethosu55_interface.h): the range a LUT index is clipped to.
_CLIP_RANGES = {0: None, 2: (0, 255), 3: (-128, 127), 5: (-32768, 32767)}
_UPSCALE = {0: "none", 1: "nearest", 2: "zeros"}


@dataclass
class Counters:
    """What one execution did, from the commands (not from timing)."""

    commands: int = 0
    by_opcode: Counter = field(default_factory=Counter)
    operations: Counter = field(default_factory=Counter)  # kind -> executed operations
    macs: int = 0
    macs_by_kind: Counter = field(default_factory=Counter)
    ofm_elements: int = 0
    dma_bytes: Counter = field(default_factory=Counter)  # "src->dst" region names -> bytes
    read_bytes: dict = field(default_factory=dict)  # region -> bytes read (IFM, weights, DMA src)
    written_bytes: dict = field(default_factory=dict)  # region -> bytes written
    region_sizes: dict = field(default_factory=dict)  # region -> bytes (a grown fast scratch)
    region_extent: dict = field(default_factory=dict)  # region -> highest byte touched + 1
    trace: tuple = ()  # fmap.Access records of a traced execution
    weight_streams: list = field(default_factory=list)  # each weight stream read (traced runs)
    # DMA/kernel overlaps the stream does not wait for (see HazardTracker): where the device,
    # which runs DMA and kernel operations concurrently, may compute something else
    hazards: list = field(default_factory=list)

    def summary(self) -> str:
        ops = ", ".join(f"{k} {v}" for k, v in sorted(self.operations.items()))
        return f"{self.commands} commands, {self.macs:,} MACs; {ops}"


def _region_name(region: int, internal: bool = False) -> str:
    return "shram" if internal else f"region{region}"


class Machine:
    """The NPU's register file and operation units over one set of memory regions."""

    def __init__(self, accel: Accelerator, memory: Memory):
        self.accel = accel
        self.memory = memory
        self.regs: dict[object, Command] = {}
        self.counters = Counters()
        self.stopped = False
        self.hazards = HazardTracker(MAX_OUTSTANDING_DMA.get(accel.product, 1))

    # -- registers ---------------------------------------------------------------------------

    def reg(self, opcode, op: Command) -> Command:
        command = self.regs.get(opcode)
        if command is None:
            raise UnmodelledCommand(f"{where(op.name, op.offset)} reads {opcode.name}, which the "
                                    "command stream never set (its reset value is not modelled)")
        return command

    def param(self, opcode, op: Command) -> int:
        return self.reg(opcode, op).param

    def sparam(self, opcode, op: Command) -> int:
        return self.reg(opcode, op).signed_param

    def payload(self, opcode, op: Command) -> int:
        return self.reg(opcode, op).payload

    def address(self, opcode, op: Command) -> int:
        return self.reg(opcode, op).address

    # -- dispatch ----------------------------------------------------------------------------

    def run(self, commands) -> Counters:
        for command in commands:
            if self.stopped:
                break
            self.step(command)
        self.counters.read_bytes = dict(self.memory.read_bytes)
        self.counters.written_bytes = dict(self.memory.written_bytes)
        return self.counters

    def step(self, command: Command) -> None:
        counters = self.counters
        counters.commands += 1
        counters.by_opcode[command.name] += 1
        opcode = command.opcode
        if isinstance(opcode, cmd1) or opcode.value >= 0x100:
            self._set(command)
            return
        handler = {
            cmd0.NPU_OP_STOP: self._op_stop,
            cmd0.NPU_OP_CONV: self._op_conv,
            cmd0.NPU_OP_DEPTHWISE: self._op_depthwise,
            cmd0.NPU_OP_POOL: self._op_pool,
            cmd0.NPU_OP_ELEMENTWISE: self._op_elementwise,
            cmd0.NPU_OP_DMA_START: self._op_dma,
            cmd0.NPU_OP_DMA_WAIT: self._op_wait,
            cmd0.NPU_OP_KERNEL_WAIT: self._op_wait,
            cmd0.NPU_OP_PMU_MASK: self._op_wait,
        }.get(opcode)
        if handler is None:
            raise UnmodelledCommand(f"{where(command.name, command.offset)}: not modelled")
        self.memory.current = (command.name, command.offset)
        self.memory.op_accesses = []
        handler(command)
        if opcode == cmd0.NPU_OP_DMA_WAIT:
            self.hazards.wait(self.hazards.dma, command.param & 0xF)
        elif opcode == cmd0.NPU_OP_KERNEL_WAIT:
            self.hazards.wait(self.hazards.kernels, command.param & 0xF)
        elif opcode in (cmd0.NPU_OP_DMA_START, cmd0.NPU_OP_CONV, cmd0.NPU_OP_DEPTHWISE,
                        cmd0.NPU_OP_POOL, cmd0.NPU_OP_ELEMENTWISE):
            counters.hazards.extend(self.hazards.issue(
                command, self.memory.op_accesses, opcode == cmd0.NPU_OP_DMA_START))

    def _set(self, command: Command) -> None:
        opcode = command.opcode
        if opcode == cmd0.NPU_SET_PARALLEL_MODE and command.param != 0:
            raise UnmodelledCommand(f"{where(command.name, command.offset)}: parallel mode "
                                    f"{command.param} (dual-core Ethos-U65-512) is not modelled")
        if opcode == cmd0.NPU_SET_ACC_FORMAT and command.param & 0x3 not in (0, 1):
            raise UnmodelledCommand(f"{where(command.name, command.offset)}: accumulator format "
                                    f"{command.param & 3} (FP_S5_10) is not modelled")
        if opcode == cmd0.NPU_SET_ACTIVATION and command.param & ~0x701F:
            raise UnmodelledCommand(f"{where(command.name, command.offset)}: ACTIVATION "
                                    f"{command.param:#06x} sets reserved bits")
        self.regs[opcode] = command

    def _op_stop(self, command: Command) -> None:
        self.stopped = True

    def _op_wait(self, command: Command) -> None:
        """DMA_WAIT/KERNEL_WAIT/PMU_MASK: synchronisation and profiling only; in-order execution
        already completes every earlier command."""

    # -- feature maps ------------------------------------------------------------------------

    def _fm(self, name: str, op: Command) -> FeatureMap:
        base = {"IFM": (cmd1.NPU_SET_IFM_BASE0, cmd1.NPU_SET_IFM_BASE1, cmd1.NPU_SET_IFM_BASE2,
                        cmd1.NPU_SET_IFM_BASE3),
                "IFM2": (cmd1.NPU_SET_IFM2_BASE0, cmd1.NPU_SET_IFM2_BASE1,
                         cmd1.NPU_SET_IFM2_BASE2, cmd1.NPU_SET_IFM2_BASE3),
                "OFM": (cmd1.NPU_SET_OFM_BASE0, cmd1.NPU_SET_OFM_BASE1, cmd1.NPU_SET_OFM_BASE2,
                        cmd1.NPU_SET_OFM_BASE3)}[name]
        p0, p1 = (cmd0, cmd1)
        region = self.param(getattr(p0, f"NPU_SET_{name}_REGION"), op)
        if region & ~0x7:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: {name} region {region:#x} "
                                    "has bits above the 3-bit region number")
        return feature_map(
            name, region, [self.address(b, op) for b in base],
            self.param(getattr(p0, f"NPU_SET_{name}_HEIGHT0_M1"), op),
            self.param(getattr(p0, f"NPU_SET_{name}_HEIGHT1_M1"), op),
            self.param(getattr(p0, f"NPU_SET_{name}_WIDTH0_M1"), op),
            self.payload(getattr(p1, f"NPU_SET_{name}_STRIDE_X"), op),
            self.payload(getattr(p1, f"NPU_SET_{name}_STRIDE_Y"), op),
            self.payload(getattr(p1, f"NPU_SET_{name}_STRIDE_C"), op),
            self.param(getattr(p0, f"NPU_SET_{name}_PRECISION"), op),
            where(op.name, op.offset), ofm=name == "OFM")

    def _zero_point(self, opcode, fm: FeatureMap, op: Command) -> int:
        """xFM_ZERO_POINT is 16 bits: signed for a signed map, unsigned otherwise."""
        return self.sparam(opcode, op) if fm.signed else self.param(opcode, op)

    def _ofm_shape(self, op: Command) -> tuple[int, int, int]:
        return (self.param(cmd0.NPU_SET_OFM_HEIGHT_M1, op) + 1,
                self.param(cmd0.NPU_SET_OFM_WIDTH_M1, op) + 1,
                self.param(cmd0.NPU_SET_OFM_DEPTH_M1, op) + 1)

    def _read(self, fm: FeatureMap, shape, op: Command, y0=0, x0=0, c0=0) -> np.ndarray:
        return self.memory.gather(fm, fm.addresses(*shape, y0, x0, c0), where(op.name, op.offset))

    def _write_ofm(self, ofm: FeatureMap, values: np.ndarray, op: Command) -> None:
        self.memory.scatter(ofm, ofm.addresses(*values.shape), values, where(op.name, op.offset))
        self.counters.ofm_elements += values.size
        self._clobber_lut(op)

    # -- kernel geometry ---------------------------------------------------------------------

    def _kernel(self, op: Command):
        """(undilated kh, kw, stride y, x, dilation y, x, part_kernel) from KERNEL_* registers."""
        stride = self.param(cmd0.NPU_SET_KERNEL_STRIDE, op)
        # npu_set_kernel_stride_t: stride_x_lsb 0, stride_y_lsb 1, weight_order 2, dilation_x 3,
        # dilation_y 4, decomposition 5, stride_x_msb 6, stride_y_msb 9
        stride_x = ((stride >> 6) & 1) * 2 + (stride & 1) + 1
        stride_y = ((stride >> 9) & 1) * 2 + ((stride >> 1) & 1) + 1
        dilation_x = ((stride >> 3) & 1) + 1
        dilation_y = ((stride >> 4) & 1) + 1
        if stride & (1 << 5):
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: KERNEL_STRIDE selects the "
                                    "4x4 kernel decomposition, which is not modelled")
        if stride & ~0x27F:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: KERNEL_STRIDE {stride:#x} "
                                    "sets reserved bits")
        kh_m1 = self.param(cmd0.NPU_SET_KERNEL_HEIGHT_M1, op)
        kw_m1 = self.param(cmd0.NPU_SET_KERNEL_WIDTH_M1, op)
        if kh_m1 % dilation_y or kw_m1 % dilation_x:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: dilated kernel extent "
                                    f"{kh_m1 + 1}x{kw_m1 + 1} is not a dilated whole kernel")
        return (kh_m1 // dilation_y + 1, kw_m1 // dilation_x + 1, stride_y, stride_x,
                dilation_y, dilation_x, bool(stride & 4), kh_m1 + 1, kw_m1 + 1)

    def _padding(self, op: Command) -> tuple[int, int, int, int]:
        # pad top/left are 7 bits, bottom/right 8 bits (ethosu_gem.c masks them so)
        return (self.param(cmd0.NPU_SET_IFM_PAD_TOP, op) & 0x7F,
                self.param(cmd0.NPU_SET_IFM_PAD_LEFT, op) & 0x7F,
                self.param(cmd0.NPU_SET_IFM_PAD_BOTTOM, op) & 0xFF,
                self.param(cmd0.NPU_SET_IFM_PAD_RIGHT, op) & 0xFF)

    def _no_operand_scaling(self, op: Command) -> None:
        """IFM_PRECISION's scale mode only applies to elementwise ADD/SUB operands."""
        if (self.param(cmd0.NPU_SET_IFM_PRECISION, op) >> 8) & 0x3:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: IFM_PRECISION selects operand "
                                    "scaling, which only elementwise ADD/SUB use")

    def _padded_ifm(self, op: Command, ofm_shape, kernel, depth: int, *, fill=0, ifm=None):
        """The IFM window the operation reads, zero point removed, with padding (and upscaling)
        applied: shape ((OH-1)*sy + dkh, (OW-1)*sx + dkw, depth). Positions that are padding
        hold `fill` (0 = the zero point, i.e. contributes nothing); also returns the validity
        mask of padded positions (True = real IFM element).

        The IFM extent is implied by the OFM size, kernel, stride and padding: IFM height =
        (OH - 1) * stride_y + dilated kernel height - pad_top - pad_bottom (the Linux driver's
        `calc_sizes` derives it the same way); with IFM_UPSCALE the IFM is first upscaled by 2
        (nearest: each element repeated, zeros: zero-point elements in between)."""
        ifm = ifm or self._fm("IFM", op)
        self._no_operand_scaling(op)
        oh, ow, _ = ofm_shape
        _, _, sy, sx, _, _, _, dkh, dkw = kernel
        top, left, bottom, right = self._padding(op)
        full_h = (oh - 1) * sy + dkh
        full_w = (ow - 1) * sx + dkw
        up_h = full_h - top - bottom
        up_w = full_w - left - right
        if up_h <= 0 or up_w <= 0:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: padding {top}/{left}/"
                                    f"{bottom}/{right} leaves no IFM for a {oh}x{ow} OFM")
        upscale = self.param(cmd0.NPU_SET_IFM_UPSCALE, op) & 0x3
        if upscale == 3:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: IFM_UPSCALE mode 3 is reserved")
        if upscale == 0:
            ih, iw = up_h, up_w
        else:
            ih, iw = (up_h + 1) // 2, (up_w + 1) // 2
        zp = self._zero_point(cmd0.NPU_SET_IFM_ZERO_POINT, ifm, op)
        values = self._read(ifm, (ih, iw, depth), op) - zp
        valid_src = np.ones((ih, iw), dtype=bool)
        if upscale == 1:
            values = values.repeat(2, axis=0).repeat(2, axis=1)[:up_h, :up_w]
            valid_src = valid_src.repeat(2, axis=0).repeat(2, axis=1)[:up_h, :up_w]
        elif upscale == 2:
            spread = np.zeros((ih * 2, iw * 2, depth), dtype=np.int64)
            spread[::2, ::2] = values
            values = spread[:up_h, :up_w]
            valid_src = np.ones((up_h, up_w), dtype=bool)
        padded = np.full((full_h, full_w, depth), fill, dtype=np.int64)
        padded[top:top + up_h, left:left + up_w] = values
        valid = np.zeros((full_h, full_w), dtype=bool)
        valid[top:top + up_h, left:left + up_w] = valid_src
        if upscale:
            self.counters.operations[f"upscale.{_UPSCALE[upscale]}"] += 1
        return padded, valid, ifm

    @classmethod
    def _pool_windows(cls, padded, valid, ofm_shape, kernel, maximum: bool) -> np.ndarray:
        """Each OFM element's window over the padded IFM: its maximum (padding never wins) or
        its sum (padding adds nothing), as int64 accumulators (H, W, C)."""
        oh, ow, oc = ofm_shape
        if maximum:
            lowest = np.iinfo(np.int64).min
            padded = np.where(valid[:, :, None], padded, lowest)
            acc = np.full((oh, ow, oc), lowest, dtype=np.int64)
            for _, _, window in cls._windows(padded, ofm_shape, kernel):
                np.maximum(acc, window, out=acc)
        else:
            acc = np.zeros((oh, ow, oc), dtype=np.int64)
            for _, _, window in cls._windows(padded, ofm_shape, kernel):
                acc += window
        return acc

    @staticmethod
    def _windows(padded: np.ndarray, ofm_shape, kernel):
        """Yield (ky, kx, view) with view[oy, ox, :] = padded[oy*sy + ky*dy, ox*sx + kx*dx, :]."""
        oh, ow, _ = ofm_shape
        kh, kw, sy, sx, dy, dx = kernel[:6]
        for ky in range(kh):
            for kx in range(kw):
                y0, x0 = ky * dy, kx * dx
                yield ky, kx, padded[y0:y0 + (oh - 1) * sy + 1:sy, x0:x0 + (ow - 1) * sx + 1:sx]

    # -- output stage ------------------------------------------------------------------------

    def _rounding(self, op: Command) -> int:
        mode = (self.param(cmd0.NPU_SET_OFM_PRECISION, op) >> 14) & 0x3
        if mode == 3:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: OFM rounding mode 3 is reserved")
        return mode

    def _global_scale(self, op: Command) -> bool:
        """OFM_PRECISION bit 8: 1 = one scale from OFM_SCALE, 0 = per-channel scale records."""
        return bool((self.param(cmd0.NPU_SET_OFM_PRECISION, op) >> 8) & 1)

    def _scale_records(self, op: Command, channels: int):
        region = self.param(cmd0.NPU_SET_SCALE_REGION, op)
        base = self.address(cmd1.NPU_SET_SCALE_BASE, op)
        length = self.payload(cmd1.NPU_SET_SCALE_LENGTH, op)
        need = channels * SCALE_RECORD_BYTES
        if length < need:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: SCALE_LENGTH {length} holds "
                                    f"fewer than the {channels} x 10-byte records the OFM depth "
                                    "needs")
        self._check_second_core(op, cmd1.NPU_SET_SCALE1_LENGTH)
        data = self.memory.read_bytes_at(region, base, need, where(op.name, op.offset),
                                         "scale/bias read")
        return decode_scales(data, channels)

    def _check_second_core(self, op: Command, length_reg) -> None:
        if self.accel.cores == 1 and length_reg in self.regs and self.regs[length_reg].payload:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: {length_reg.name} is non-zero "
                                    "but the configuration has one core")

    def _check_32bit_scale(self, ofm: FeatureMap, scale, shift, op: Command) -> None:
        """A 32-bit OFM of an elementwise or pooling operation: the interface notes that
        OFM_SCALE's scale "is not applied for 32-bit operations" (ethosu55_interface.h
        npu_set_ofm_scale_t); its shift is (an int32 MUL with a TOSA shift of 30 arrives as
        scale 1, shift 30 and matches TOSA). Vela writes scale 1 there; the model refuses
        another scale rather than guess whether it is ignored."""
        if ofm.element_size == 4 and np.any(np.asarray(scale) != 1):
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: a scale other than 1 on a "
                                    "32-bit OFM is not modelled")

    def _accumulate_check(self, acc: np.ndarray, op: Command) -> None:
        fmt = self.param(cmd0.NPU_SET_ACC_FORMAT, op) & 0x3
        bits = 32 if fmt == 0 else 40
        if acc.size and (int(acc.max()) >= (1 << (bits - 1)) or int(acc.min()) < -(1 << (bits - 1))):
            raise UnmodelledCommand(
                f"{where(op.name, op.offset)}: the accumulator reaches {int(acc.min())}.."
                f"{int(acc.max())}, beyond the {bits}-bit accumulator ACC_FORMAT selects (the "
                "hardware's overflow behaviour is not modelled)")

    def _output(self, values: np.ndarray, ofm: FeatureMap, op: Command) -> np.ndarray:
        """Add the OFM zero point, clamp to ACTIVATION_MIN/MAX and the OFM type, apply the
        activation function (LUT), return int64 values in the OFM type's range."""
        zp = self._zero_point(cmd0.NPU_SET_OFM_ZERO_POINT, ofm, op)
        activation = self.param(cmd0.NPU_SET_ACTIVATION, op)
        function = activation & 0x1F
        clip = (activation >> 12) & 0x7
        lo_t, hi_t = ofm.type_range
        if ofm.element_size == 4:
            act_lo, act_hi = lo_t, hi_t  # see below: the 16-bit clamp registers
        else:
            act_lo = self.sparam(cmd0.NPU_SET_ACTIVATION_MIN, op) if ofm.signed else self.param(
                cmd0.NPU_SET_ACTIVATION_MIN, op)
            act_hi = self.sparam(cmd0.NPU_SET_ACTIVATION_MAX, op) if ofm.signed else self.param(
                cmd0.NPU_SET_ACTIVATION_MAX, op)
        # anything beyond 2**40 saturates to the OFM range whatever the zero point
        values = arith.saturate(np.asarray(values), -(1 << 40), 1 << 40) + zp
        if function == 0:
            if clip:
                raise UnmodelledCommand(f"{where(op.name, op.offset)}: ACTIVATION clip range "
                                        f"{clip} without a table lookup")
            if ofm.element_size == 4:
                self._int32_clamp_check(op)
            out = np.clip(values, max(act_lo, lo_t), min(act_hi, hi_t))
            return out
        if 16 <= function <= 23:
            return self._lut(values, function - 16, clip, ofm, act_lo, act_hi, op)
        raise UnmodelledCommand(f"{where('NPU_SET_ACTIVATION', self.regs[cmd0.NPU_SET_ACTIVATION].offset)}"
                                f" used by {op.name} at word {op.offset}: activation function "
                                f"{_ACTIVATION_NAMES.get(function, function)} is not modelled")

    def _int32_clamp_check(self, op: Command) -> None:
        """32-bit OFMs: ACTIVATION_MIN/MAX are 16-bit registers; Vela writes the int16 limits
        for them, so the model refuses a narrower clamp it cannot place."""
        lo = self.sparam(cmd0.NPU_SET_ACTIVATION_MIN, op)
        hi = self.sparam(cmd0.NPU_SET_ACTIVATION_MAX, op)
        if (lo, hi) != (-32768, 32767):
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: clamp {lo}..{hi} on a 32-bit "
                                    "OFM is not modelled (Vela writes -32768..32767 there)")

    def _lut(self, values, slot, clip, ofm, act_lo, act_hi, op):
        """Table lookup of the value (zero point added), first clamped to the clip range (the
        OFM type when 0). 8-bit: a 256-entry int8/uint8 table, 256 bytes at LUT slot `slot`
        (slot address = LUT base + 256 x slot; Vela lut.py, regor InsertLUTDMACommand).
        16-bit: 512 32-bit entries (all 8 slots, 2 KiB), each the int16 base (bits 0-15) and
        slope (bits 16-31) of one 128-value step (Vela lut.py::create_lut_int16_op); the output
        is base + round(slope x (v + 32768) % 128 / 128) for step (v + 32768) // 128, the
        rounding half up (TOSA TABLE's int16 interpolation then its RESCALE by 1/128)."""
        if ofm.element_size == 4 and clip != 3:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: LUT on a 32-bit OFM without "
                                    "the int8 clip range")
        rng = _CLIP_RANGES.get(clip)
        if clip and rng is None:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: ACTIVATION clip range {clip} "
                                    "is reserved")
        if rng is None:
            rng = ofm.type_range
        wide = rng[1] - rng[0] != 255
        if wide and rng != (-32768, 32767):
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: a table lookup over "
                                    f"{rng[0]}..{rng[1]} (uint16) is not modelled")
        # int8-indexed, 32-bit OFM: 256 int32 entries (regor Softmax::GenerateExpTable)
        word_table = ofm.element_size == 4 and not wide
        size = 2048 if wide else 1024 if word_table else 256
        start = self.accel.lut_address + slot * LUT_SLOT_BYTES
        if start + size > self.accel.shram_bytes:
            raise MemoryFault(f"{where(op.name, op.offset)}: LUT slot {slot} ({size} bytes) lies "
                              "beyond SHRAM")
        if not self.memory.shram_valid[start:start + size].all():
            raise MemoryFault(f"{where(op.name, op.offset)}: LUT slot {slot} (SHRAM "
                              f"{start}..{start + size - 1}) was not loaded by a DMA, or a kernel "
                              "operation overwrote it since")
        self.memory._record("read", -1, start, start + size - 1, "LUT")
        raw = bytes(self.memory.shram[start:start + size])
        index = np.clip(values, rng[0], rng[1]) - rng[0]
        if word_table:
            table = np.frombuffer(raw, dtype="<i4")
            out = table.astype(np.int64)[index.astype(np.int64)]
        elif not wide:
            table = np.frombuffer(raw, dtype=np.int8 if rng[0] < 0 else np.uint8)
            out = table.astype(np.int64)[index.astype(np.int64)]
        else:
            entries = np.frombuffer(raw, dtype="<u4").astype(np.int64)
            base = ((entries & 0xFFFF) ^ 0x8000) - 0x8000
            slope = (((entries >> 16) & 0xFFFF) ^ 0x8000) - 0x8000
            step, fraction = index >> 7, index & 0x7F
            out = base[step] + ((slope[step] * fraction + 64) >> 7)
        lo_t, hi_t = ofm.type_range
        self.counters.operations["lut"] += 1
        return np.clip(out, max(act_lo, lo_t), min(act_hi, hi_t))

    def _clobber_lut(self, op: Command) -> None:
        """Without reserved LUT banks (16 SHRAM banks: U55-32/64) a kernel operation's
        accumulators use the LUT banks (regor `reservedEndBanks == 0`); the LUT must be reloaded
        after any operation that does not itself use one."""
        if self.accel.lut_banks_reserved:
            return
        function = self.regs.get(cmd0.NPU_SET_ACTIVATION)
        if function is not None and 16 <= (function.param & 0x1F) <= 23:
            return
        self.memory.shram_valid[self.accel.lut_address:] = False

    # -- DMA ---------------------------------------------------------------------------------

    def _op_dma(self, op: Command) -> None:
        if op.param:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: DMA channel/mode "
                                    f"{op.param:#x} (only channel 0, external) is modelled")
        src_reg = self.param(cmd0.NPU_SET_DMA0_SRC_REGION, op)
        dst_reg = self.param(cmd0.NPU_SET_DMA0_DST_REGION, op)
        for name, value in (("source", src_reg), ("destination", dst_reg)):
            # npu_set_dma0_src_region_t: region 0-2, region_mode 8, stride_mode 9-10,
            # custom_dma_cs 15
            if (value >> 9) & 0x3:
                raise UnmodelledCommand(f"{where(op.name, op.offset)}: DMA {name} stride mode "
                                        f"{(value >> 9) & 3} (2-D/3-D DMA) is not modelled")
            if value & 0x8000:
                raise UnmodelledCommand(f"{where(op.name, op.offset)}: custom DMA is not modelled")
        if src_reg & 0x100:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: DMA from SHRAM (internal "
                                    "source) is not modelled")
        src = self.address(cmd1.NPU_SET_DMA0_SRC, op)
        dst = self.address(cmd1.NPU_SET_DMA0_DST, op)
        length = self.address(cmd1.NPU_SET_DMA0_LEN, op)
        w = where(op.name, op.offset)
        data = self.memory.read_bytes_at(src_reg & 0x7, src, length, w, "DMA source")
        if dst_reg & 0x100:
            # internal destination: the SHRAM (LUT memory); Vela BASE_PTR_INDEX_MEM2MEM
            if dst < 0 or dst + length > self.accel.shram_bytes:
                raise MemoryFault(f"{w}: DMA to SHRAM bytes {dst}..{dst + length - 1}; SHRAM has "
                                  f"{self.accel.shram_bytes} bytes")
            self.memory.shram[dst:dst + length] = data
            self.memory.shram_valid[dst:dst + length] = True
            self.memory._record("write", -1, dst, dst + length - 1, "DMA destination")
            target = "shram"
        else:
            self.memory.write_bytes_at(dst_reg & 0x7, dst, data, w, "DMA destination")
            target = _region_name(dst_reg & 0x7)
        self.counters.dma_bytes[f"{_region_name(src_reg & 7)}->{target}"] += length
        self.counters.operations["dma"] += 1

    # -- convolution / depthwise -------------------------------------------------------------

    def _weights(self, op: Command, layout: WeightLayout) -> np.ndarray:
        region = self.param(cmd0.NPU_SET_WEIGHT_REGION, op)
        base = self.address(cmd1.NPU_SET_WEIGHT_BASE, op)
        length = self.payload(cmd1.NPU_SET_WEIGHT_LENGTH, op)
        self._check_second_core(op, cmd1.NPU_SET_WEIGHT1_LENGTH)
        w = where(op.name, op.offset)
        stream = self.memory.read_bytes_at(region, base, length, w, "weight stream read")
        if self.memory.trace is not None:
            self.counters.weight_streams.append(stream)
        return decode_weights(stream, layout, w)

    def _op_conv(self, op: Command) -> None:
        self._convolution(op, depthwise=False)

    def _op_depthwise(self, op: Command) -> None:
        self._convolution(op, depthwise=True)

    def _convolution(self, op: Command, depthwise: bool) -> None:
        if op.param:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: parameter {op.param:#x} "
                                    "(weights from IFM2) is not modelled")
        ofm = self._fm("OFM", op)
        ofm_shape = oh, ow, oc = self._ofm_shape(op)
        kernel = self._kernel(op)
        kh, kw, _, _, dy, dx, part_kernel = kernel[:7]
        ifm_depth = self.param(cmd0.NPU_SET_IFM_DEPTH_M1, op) + 1
        if depthwise:
            if part_kernel:
                raise UnmodelledCommand(f"{where(op.name, op.offset)}: part-kernel-first weight "
                                        "order on a depthwise operation")
            if ifm_depth < oc:
                raise UnmodelledCommand(f"{where(op.name, op.offset)}: depthwise OFM depth {oc} "
                                        f"exceeds IFM depth {ifm_depth}")
        if self._global_scale(op):
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: global OFM scale on a "
                                    "convolution (no scale records) is not modelled")
        padded, _, ifm = self._padded_ifm(op, ofm_shape, kernel, oc if depthwise else ifm_depth)
        ifm_bits = ifm.element_size * 8
        if ifm_bits == 32:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: 32-bit IFM convolution")
        layout = WeightLayout(
            ofm_depth=oc, kernel_h=kh, kernel_w=kw, ifm_depth=1 if depthwise else ifm_depth,
            ofm_block_depth=self.param(cmd0.NPU_SET_OFM_BLK_DEPTH_M1, op) + 1,
            depthwise=depthwise, part_kernel=part_kernel, ifm_bits=ifm_bits,
            decomp_h=8 // dy, decomp_w=8 // dx, ifm_ublock=self.accel.ifm_ublock_depth,
            ofm_ublock=self.accel.ofm_ublock_depth)
        weights = self._weights(op, layout)  # (oc, kh, kw, ic)
        acc = np.zeros((oh, ow, oc), dtype=np.float64)
        # float64 products and sums are exact here: |ifm - zp| < 2**16 and |w| < 2**9 for
        # every modelled precision, so partial sums stay far below 2**53.
        fweights = weights.astype(np.float64)
        fpadded = padded.astype(np.float64)
        for ky, kx, window in self._windows(fpadded, ofm_shape, kernel):
            if depthwise:
                acc += window * fweights[:, ky, kx, 0]
            else:
                acc += window @ fweights[:, ky, kx, :].T
        acc = acc.astype(np.int64)
        bias, scale, shift = self._scale_records(op, oc)
        acc = acc + bias
        self._accumulate_check(acc, op)
        # (a convolution into a 32-bit OFM does apply its per-channel scales: int16 a16w8
        # convolutions whose int32 results keep scales 165..10911 match TOSA byte for byte)
        out = arith.scale_shift(acc, scale, shift, self._rounding(op))
        out = self._output(out, ofm, op)
        self._write_ofm(ofm, out, op)
        kind = "depthwise" if depthwise else "conv"
        macs = oh * ow * oc * kh * kw * (1 if depthwise else ifm_depth)
        self.counters.operations[kind] += 1
        self.counters.macs += macs
        self.counters.macs_by_kind[kind] += macs

    # -- pooling -----------------------------------------------------------------------------

    def _op_pool(self, op: Command) -> None:
        mode = _POOL_MODES.get(op.param)
        if mode is None:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: pooling mode {op.param} is "
                                    "not MAX (0), AVERAGE (1) or REDUCE_SUM (2)")
        ofm = self._fm("OFM", op)
        ofm_shape = oh, ow, oc = self._ofm_shape(op)
        if mode == "reduce_sum":
            kernel = self._kernel(op)
            if kernel[:6] != (1, 1, 1, 1, 1, 1) or any(self._padding(op)):
                raise UnmodelledCommand(f"{where(op.name, op.offset)}: REDUCE_SUM with a kernel, "
                                        "stride or padding is not modelled")
            if oc != 1:
                raise UnmodelledCommand(f"{where(op.name, op.offset)}: REDUCE_SUM to an OFM of "
                                        f"depth {oc} (it sums the IFM depth into one channel)")
            ifm = self._fm("IFM", op)
            self._no_operand_scaling(op)
            depth = self.param(cmd0.NPU_SET_IFM_DEPTH_M1, op) + 1
            zp = self._zero_point(cmd0.NPU_SET_IFM_ZERO_POINT, ifm, op)
            values = self._read(ifm, (oh, ow, depth), op) - zp
            acc = values.sum(axis=2, keepdims=True)
        else:
            kernel = self._kernel(op)
            kh, kw = kernel[:2]
            if kernel[4:6] != (1, 1):
                raise UnmodelledCommand(f"{where(op.name, op.offset)}: dilated pooling")
            ifm_depth = self.param(cmd0.NPU_SET_IFM_DEPTH_M1, op) + 1
            if ifm_depth < oc:
                raise UnmodelledCommand(f"{where(op.name, op.offset)}: pooling OFM depth {oc} "
                                        f"exceeds IFM depth {ifm_depth}")
            padded, valid, ifm = self._padded_ifm(op, ofm_shape, kernel, oc)
            acc = self._pool_windows(padded, valid, ofm_shape, kernel, maximum=mode == "max")
        if mode == "average" and any(self._padding(op)):
            acc = self._average_padded(acc, valid, kernel, ofm_shape, op)
        if self._global_scale(op):
            scale = self.payload(cmd1.NPU_SET_OFM_SCALE, op)
            shift = self.param(cmd1.NPU_SET_OFM_SCALE, op) & 0x3F
            bias = 0
        else:
            bias, scale, shift = self._scale_records(op, oc)
        acc = acc + bias
        self._accumulate_check(acc, op)
        self._check_32bit_scale(ofm, scale, shift, op)
        out = arith.scale_shift(acc, scale, shift, self._rounding(op))
        out = self._output(out, ofm, op)
        self._write_ofm(ofm, out, op)
        self.counters.operations[f"pool.{mode}"] += 1

    def _average_padded(self, acc, valid, kernel, ofm_shape, op):
        """AVERAGE pooling over a padded window divides by the number of real IFM elements in
        the window. regor emits a unit OFM_SCALE for such a pool (it leaves the division to the
        NPU) and 1/N in OFM_SCALE for an unpadded one. The division is the 32-bit reciprocal
        multiply TOSA specifies for avg_pool2d (`reciprocal_scale`: k = ceil(log2(count)),
        multiplier = ((2**30 + 1) << k) // count, shift 30 + k), rounded as OFM_PRECISION says."""
        count = np.zeros(ofm_shape[:2], dtype=np.int64)
        for _, _, window in self._windows(valid[:, :, None].astype(np.int64), ofm_shape, kernel):
            count += window[:, :, 0]
        if (count == 0).any():
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: an AVERAGE pooling window "
                                    "covers only padding")
        k = np.ceil(np.log2(count)).astype(np.int64)
        k = np.where((np.int64(1) << k) < count, k + 1, k)  # exact ceil for powers of two
        multiplier = ((np.int64((1 << 30) + 1)) << k) // count
        shift = 30 + k
        return arith.scale_shift(acc, multiplier[:, :, None], shift[:, :, None],
                                 self._rounding(op))

    # -- elementwise -------------------------------------------------------------------------

    def _op_elementwise(self, op: Command) -> None:
        mode = _ELEMENTWISE_MODES.get(op.param)
        if mode is None:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: elementwise mode {op.param} "
                                    "is not one of MUL, ADD, SUB, MIN, MAX, LRELU, ABS, CLZ, SHR, SHL")
        ofm = self._fm("OFM", op)
        shape = oh, ow, oc = self._ofm_shape(op)
        ifm = self._fm("IFM", op)
        w = where(op.name, op.offset)
        upscale = self.param(cmd0.NPU_SET_IFM_UPSCALE, op) & 0x3
        if upscale:
            raise UnmodelledCommand(f"{w}: elementwise with IFM upscaling is not modelled")
        ifm_depth = self.param(cmd0.NPU_SET_IFM_DEPTH_M1, op) + 1
        if ifm_depth != oc:
            raise UnmodelledCommand(f"{w}: elementwise IFM depth {ifm_depth} differs from the "
                                    f"OFM depth {oc} (only IFM2 broadcasts)")
        precision = self.param(cmd0.NPU_SET_IFM_PRECISION, op)
        scale_mode = (precision >> 8) & 0x3
        if scale_mode and mode not in ("add", "sub"):
            raise UnmodelledCommand(f"{w}: IFM scale mode {scale_mode} on elementwise "
                                    f"{mode.upper()} (operand scaling is for ADD/SUB)")
        ifm_round = (precision >> 14) & 0x3
        a_zp = self._zero_point(cmd0.NPU_SET_IFM_ZERO_POINT, ifm, op)
        a = self._read(ifm, shape, op) - a_zp
        b = None
        reversed_order = False
        if mode not in _UNARY:
            broadcast = self.param(cmd0.NPU_SET_IFM2_BROADCAST, op)
            if broadcast & ~0xC7:
                raise UnmodelledCommand(f"{w}: IFM2_BROADCAST {broadcast:#x} sets reserved bits")
            reversed_order = bool(broadcast & 0x40)
            ifm2_precision = self.param(cmd0.NPU_SET_IFM2_PRECISION, op)
            if (ifm2_precision & 0x3D) != (precision & 0x3D):
                raise UnmodelledCommand(f"{w}: IFM2 type/precision differs from the IFM's "
                                        "(the interface requires them to match)")
            if broadcast & 0x80:
                # scalar: IFM2_SCALAR (16 bits, the IFM2 element type's signedness)
                signed = bool(ifm2_precision & 1)
                raw = (self.sparam if signed else self.param)(cmd0.NPU_SET_IFM2_SCALAR, op)
                zp2 = self.sparam(cmd0.NPU_SET_IFM2_ZERO_POINT, op) if signed else self.param(
                    cmd0.NPU_SET_IFM2_ZERO_POINT, op)
                b = np.full(shape, raw - zp2, dtype=np.int64)
            else:
                ifm2 = self._fm("IFM2", op)
                shape2 = (1 if broadcast & 1 else oh, 1 if broadcast & 2 else ow,
                          1 if broadcast & 4 else oc)
                zp2 = self._zero_point(cmd0.NPU_SET_IFM2_ZERO_POINT, ifm2, op)
                b = np.broadcast_to(self._read(ifm2, shape2, op) - zp2, shape)
            if reversed_order:
                a, b = b, a
        result = self._elementwise(mode, a, b, scale_mode, ifm_round, ifm.element_size, ofm, op)
        out = self._output(result, ofm, op)
        self._write_ofm(ofm, out, op)
        self.counters.operations[f"elementwise.{mode}"] += 1

    def _elementwise(self, mode, a, b, scale_mode, ifm_round, element_size, ofm, op):
        w = where(op.name, op.offset)
        rounding = self._rounding(op)
        if mode in ("add", "sub"):
            opa = self.reg(cmd1.NPU_SET_OPA_SCALE, op)
            opb = self.reg(cmd1.NPU_SET_OPB_SCALE, op)
            if scale_mode == 0:
                # OPA_OPB_16: both operands multiplied by their 16-bit scales, no shift
                a = a * (opa.payload & 0xFFFF)
                b = b * (opb.payload & 0xFFFF)
            elif scale_mode in (1, 2):
                # OPA_32 / OPB_32: one operand scaled by OPA_SCALE (32-bit scale, 6-bit shift,
                # IFM rounding mode); the other is taken at the fixed-point weight of the
                # scaled one, 2**19 for 8-bit and 2**14 for 16-bit operands (Vela
                # scaling.py::advanced_elementwise_add_sub_scale, input shift 20/15, halved)
                if element_size == 4:
                    raise UnmodelledCommand(f"{w}: 32-bit operand scaling")
                unscaled_shift = 19 if element_size == 1 else 14
                scaled_by = arith.scale_shift
                if scale_mode == 1:
                    a = scaled_by(a, opa.payload, opa.param & 0x3F, ifm_round)
                    b = np.asarray(b, dtype=np.int64) << unscaled_shift
                else:
                    b = scaled_by(b, opa.payload, opa.param & 0x3F, ifm_round)
                    a = np.asarray(a, dtype=np.int64) << unscaled_shift
            else:
                raise UnmodelledCommand(f"{w}: IFM scale mode 3 is reserved")
            result = a + b if mode == "add" else a - b
        elif mode == "mul":
            if scale_mode:
                raise UnmodelledCommand(f"{w}: MUL with IFM scale mode {scale_mode}")
            result = np.asarray(a, dtype=np.int64) * np.asarray(b, dtype=np.int64)
        elif mode in ("min", "max"):
            result = np.minimum(a, b) if mode == "min" else np.maximum(a, b)
        elif mode == "abs":
            result = np.abs(a)
        elif mode in ("shr", "shl", "clz"):  # Vela's TFLite softmax: no OFM scaling
            return arith.bit_operation(mode, a, b, element_size, rounding, w)
        else:
            raise UnmodelledCommand(f"{w}: elementwise {mode.upper()} is not modelled")
        if self._global_scale(op):
            scale = self.payload(cmd1.NPU_SET_OFM_SCALE, op)
            shift = self.param(cmd1.NPU_SET_OFM_SCALE, op) & 0x3F
            if ofm.element_size == 4 and mode == "mul" and element_size == 4:
                # a 32-bit MUL: the scale "is not applied for 32-bit operations" (the interface's
                # npu_set_ofm_scale_t), the shift is (regor: 2**30, shift 31 = round(a*b/2**31))
                return arith.scale_shift(result, 1, shift, rounding)
            self._check_32bit_scale(ofm, scale, shift, op)
            return arith.scale_shift(result, scale, shift, rounding)
        if mode in ("add", "sub", "mul", "abs"):
            raise UnmodelledCommand(f"{w}: elementwise {mode.upper()} with per-channel OFM "
                                    "scaling is not modelled")
        return np.asarray(result, dtype=np.int64)



def run_streams(machine: Machine, streams, regions, growable_regions: tuple[int, ...] = (),
                trace: bool = False, fresh_registers: bool = False) -> Counters:
    """Run each command stream of a payload on `machine` (its memory built over `regions`) and
    hand back its counters: the accesses traced when `trace`, each region's extent and size, and
    a region grown by use in place of the caller's (empty) one. `fresh_registers`: each stream
    starts with no register set (the Ethos-U85 model; the U55/U65 model keeps them)."""
    memory = machine.memory
    if trace:
        memory.trace = []
    for stream in streams:
        machine.stopped = False
        if fresh_registers:
            machine.regs.clear()
        machine.run(stream)
    counters = machine.counters
    counters.trace = tuple(memory.trace) if trace else ()
    counters.region_extent = dict(memory.extent)
    counters.region_sizes = {i: len(r) for i, r in enumerate(memory.regions) if r is not None}
    if isinstance(regions, list):
        # a region grown by use is handed back in place of the caller's (empty) one
        for index in growable_regions:
            if index < len(regions) and memory.regions[index] is not None:
                regions[index] = memory.regions[index].obj
    return counters

