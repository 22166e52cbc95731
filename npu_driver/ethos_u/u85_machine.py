"""The Ethos-U85 register machine: a U85 command stream executed from its own bytes.

The same shape as the Ethos-U55/U65 machine (machine.py): register state as one value (the
command that last set each register, by name), one handler per operation kind, and everything
it does not execute refused naming the command and its word offset (UnmodelledCommand). It
reads the U85's own definitions: the command table and named fields of `u85_commands.json`
(from `ethosu85_interface.h`), the feature-map storage, transposes and broadcast the U85
stream checker knows (u85_checker.py), and the U85 weight and scale formats
(u85_weights.py). The checker runs first (`execute_u85`): every access is bounded before a
byte moves, and it hands over each operation's weight and scale streams with the decoder
layout their registers imply, which the machine decodes and computes with.

What differs from the U55/U65 and is modelled here, as Vela 5.1's U85 generator (regor
`ethos_u85_register_cs_generator.cpp`) fills the registers:

- the rounding mode of the output stage is NPU_SET_OFM_SCALE's `round_mode` (not a bit of
  OFM_PRECISION), also with per-channel scales, where OFM_SCALE's scale and shift are unused;
- scale records are 32-bit (ACC_FORMAT I32: int32 bias, 31-bit scale) or 48-bit (I48: int48
  bias, 16-bit scale), `u85_weights.decode_scales`; weights come in SWD streams one per core
  or one interleaved FWD stream, dense or 2:4 sparse (`u85_weights.decode_weights`);
- pooling SUM (regor's average pooling over a kernel larger than 8x8: the window's sum, the
  1/N in the global OFM_SCALE) and AVERAGE (the NPU divides by the window's element count,
  the OFM_SCALE a unit one) next to MAX; REDUCE_SUM (the IFM's depth summed); NONE with
  ACC_FORMAT acc_input IFM2 (regor's NullPool: int32 accumulators loaded from IFM2, rescaled);
- convolution weights read from IFM2 (a matrix product: a 1 x OFM depth x IFM depth map);
- elementwise ADD, SUB, MIN and MAX scale each operand by its own IFM_SCALE / IFM2_SCALE
  first (the TOSA RESCALEs to a common scale fused), MUL multiplies the operands (unit operand
  scales required), and the result is scaled by OFM_SCALE; IFM as well as IFM2 can broadcast,
  a SCALAR operand comes from OP_SCALAR;
- chaining: an OFM of storage CHAINED goes to the chaining buffer its OFM_REGION names, output
  stage applied, and the next operation reads it as a CHAINED IFM/IFM2;
- a transposed OFM is written in the transposed order its tile and stride registers describe;
- 8-bit lookup tables (LUT_S8_S8, LUT_U8_U8): 256 entries at 256 x `table` in the 2048-byte
  LUT memory, loaded by a 1-D DMA of region_mode INTERNAL (regor's LUT DMAs), indexed by the
  output value saturated to 8 bits;
- the 16-bit interpolating table LUT_S16_S16 (regor's RewriteTable: 512 int16 base/slope
  pairs, the whole 2048-byte LUT memory), base + (slope x fraction + 64) >> 7 over 128-value
  steps, as on the Ethos-U55 (A16W8 sigmoid and tanh);
- accumulators kept between convolutions (ACC_FORMAT acc_output DISABLE, OFM storage NONE,
  then acc_input KEEP): regor's DecomposeForStrides gives a stride the NPU lacks (4 and up) as
  one 1x1 convolution per kernel position, each reading the IFM stepped by the stride through
  its stride registers, with IFM_PAD_* in stepped units (CalculateStripePadding);
- resize (NPU_OP_RESIZE, NEAREST and BILINEAR): TOSA RESIZE's integer algorithm on the
  scale n (RESIZE_*_SCALE_N_M1), the step d (one_step_int x n + one_step_mod) and the offset
  the registers hold, over a KERNEL_HEIGHT x KERNEL_WIDTH IFM; the result carries 16 fraction
  bits into OFM_SCALE (regor writes shift 16 plus the fused RESCALE's);
- comparisons CMP_EQ/NE/GE/GT (operands scaled as ADD's; true is all ones, regor's internal
  bool) and bitwise AND, OR, XOR, AND_NOT (IFM & ~IFM2), NOT, with zero points 0 and unit
  scales (regor's SELECT: OR(AND(a, mask), AND_NOT(b, mask))).

The registers are executed as they read, also where Vela 5.1 fills them wrongly: the mixed
model's 4x4 stride-4 pad-1 convolution follows a SLICE (ExecuTorch trims 32x32 to 31x31) that
regor moves into the convolution's IFM slice; DecomposeConv2D's `ifmSlice.Initialize(-padding)`
then keeps the slice's offset 0, so the 16 accumulating 1x1 convolutions read rows and columns
4i + k with PAD_* 0 instead of 4i + k - 1: the stream computes the convolution unpadded over the
untrimmed map, and differs from the TOSA graph (tests/test_u85_machine.py shows it equals the
graph with that padding removed). Likewise an A16W8 LSTM's second step: regor loads the 2 KiB
tanh table over the sigmoid table a chained group's first lookup still needs (its LUT DMAs all go
before the group), so the stream computes tanh(forget gate) (docs/verify.md).

Executed bit-exact against the TOSA reference model (tests/test_u85_machine.py,
benchmarks/u85_model.py): all of the above, on the edge-case models of tests/npu_edge_models.py
(conv_edges, elementwise_edges, matmul_edges, strided_edges, bilinear_edges), A16W8 int16_edges,
and every partition of the zoo and the 26 user families (examples/user_models.py) on
U85-128/256/512/2048 (34 of 34 on each since compile pads the mixed model's strided convolution
explicitly; docs/benchmarks.md). Implemented from the register definitions but exercised by no
stream here: TRUNCATE_TO_ZERO rounding, LUT_U8_U8 (the A16W8 convolutions use I48 accumulators).

Executed and equal to TFLM byte for byte on the incumbent's files (Vela's TFLite output run by
TFLM's Ethos-U kernel over the QEMU bridge, orchestrator/comparison/compare.py): the softmax
regor builds for a TFLite SOFTMAX (compiler/softmax.cpp), with LUT_S8_S32 (the ACTIVATION clamp
bounds its index), IFM scales with double rounding (`dbl_rnd`, regor's reference `Scale`),
elementwise CLZ, SHL and SHR on 32-bit values, 32-bit MULs (OFM_SCALE's shift alone) and 32-bit
ADD/SUB saturating at the output; 32 of 32 random inputs of MLPerf Tiny's four files each.

Refused as not modelled (each by command and word offset): resize mode REPLICATE, a resize whose
block steps are not its scale's, with IFM padding, upscaling or per-channel scales;
NPU_OP_BRANCH, NPU_OP_IRQ; DMA other than a 1-D copy (into a region or the LUT memory) or a
2-D gather; accumulators kept by an operation other
than a convolution, or kept and then not of the next OFM's shape; accumulators from IFM2 other
than pooling NONE's, TILE3X1 storage, reversed OFMs; rounding modes other than NATURAL and
TRUNCATE_TO_ZERO where a shift is not 0, and double rounding with another mode; pooling MIN and
ARGMAX; elementwise LRELU, LSR, DIV; LUT_S8_S16, LUT_S16_S32 and the
U85's LUT_TANH and LUT_SIGMOID (regor writes the last two for TFLite graphs only, never for the
TOSA graphs ExecuTorch gives it, so no stream here exercises them); comparisons or bitwise
operations with other zero points or scales; IFM upscaling; an accumulator beyond its width.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from typing import Sequence

import numpy as np

from npu_driver.ethos_u import arith
from npu_driver.ethos_u.checker import StreamCheck
from npu_driver.ethos_u.errors import UnmodelledCommand, where
from npu_driver.ethos_u.fmap import FeatureMap, Memory, feature_map
from npu_driver.ethos_u.machine import Counters, Machine, run_streams
from npu_driver.ethos_u.stream import Command
from npu_driver.ethos_u.u85_checker import (U85Accelerator, U85Checker, parse_u85_payload,
                                            resolve_u85)
from npu_driver.ethos_u.u85_commands import enum_names, fields
from npu_driver.ethos_u.u85_elementwise import ResizeAndElementwise
from npu_driver.ethos_u.u85_weights import (U85ScaleLayout, decode_scales, decode_weights,
                                            ofm_ublock_depth, scale_records)

_STORAGE = enum_names("activation_storage")
_TRANSPOSE = enum_names("activation_transpose")
_REVERSE = enum_names("activation_reverse")
_POOL = enum_names("pooling_mode")
_ROUND_OFM = enum_names("round_mode_ofm")
_ACTIVATION = enum_names("activation_function")
_ACC_INPUT = enum_names("acc_input")
_ACC_OUTPUT = enum_names("acc_output")
_UPSCALE = enum_names("ifm_upscale_mode")
_MICROBLOCK = enum_names("microblock")
# round_mode_ofm / round_mode_ifm members the model executes, as arith's rounding modes:
# NATURAL rounds half up (TOSA RESCALE SINGLE_ROUND), TRUNCATE_TO_ZERO rounds towards zero,
# DOUBLE_SYMMETRIC is the Ethos-U55's DBL (TOSA RESCALE DOUBLE_ROUND, which Vela writes as it:
# a second rounding term of +-2**30 by the value's sign when the shift is above 31).
_ROUNDING = {"NATURAL": arith.ROUND_NATURAL, "TRUNCATE_TO_ZERO": arith.ROUND_TRUNCATE,
             "DOUBLE_SYMMETRIC": arith.ROUND_DBL}


class U85Machine(ResizeAndElementwise):
    """The U85's register file and operation units over one set of memory regions."""

    def __init__(self, accel: U85Accelerator, memory: Memory, check: StreamCheck):
        self.accel = accel
        self.memory = memory
        self.regs: dict[str, Command] = {}
        self.counters = Counters()
        self.stopped = False
        # the streams the checker bounded, by the word offset of the operation reading them
        self.weight_reads = defaultdict(list)
        for read in check.weights:
            self.weight_reads[read.offset].append(read)
        self.scale_reads = {read.offset: read for read in check.scales}
        self.chain: dict[int, np.ndarray] = {}  # chaining buffer -> the OFM values it holds
        # accumulators a convolution with acc_output DISABLE left for the next one (acc_input
        # KEEP): (values, the bias of its scale records)
        self.kept: tuple[np.ndarray, np.ndarray] | None = None

    # -- registers ---------------------------------------------------------------------------

    def reg(self, name: str, op: Command) -> Command:
        command = self.regs.get(name)
        if command is None:
            raise UnmodelledCommand(f"{where(op.name, op.offset)} reads {name}, which the "
                                    "command stream never set (its reset value is not modelled)")
        return command

    def field(self, name: str, field: str, op: Command) -> int:
        return fields(self.reg(name, op))[field]

    def param(self, name: str, op: Command) -> int:
        return self.reg(name, op).param

    def sparam(self, name: str, op: Command) -> int:
        return self.reg(name, op).signed_param

    # -- dispatch ----------------------------------------------------------------------------

    def handlers(self) -> dict:
        return {"NPU_OP_STOP": self._op_stop, "NPU_OP_CONV": self._op_conv,
                "NPU_OP_DEPTHWISE": self._op_depthwise, "NPU_OP_POOL": self._op_pool,
                "NPU_OP_ELEMENTWISE": self._op_elementwise, "NPU_OP_DMA_START": self._op_dma,
                "NPU_OP_RESIZE": self._op_resize,
                "NPU_OP_DMA_WAIT": self._op_wait,
                "NPU_OP_KERNEL_WAIT": self._op_wait, "NPU_OP_PMU_MASK": self._op_wait}

    def run(self, commands) -> Counters:
        handlers = self.handlers()
        for command in commands:
            if self.stopped:
                break
            self.step(command, handlers)
        self.counters.read_bytes = dict(self.memory.read_bytes)
        self.counters.written_bytes = dict(self.memory.written_bytes)
        return self.counters

    def step(self, command: Command, handlers: dict) -> None:
        self.counters.commands += 1
        self.counters.by_opcode[command.name] += 1
        if command.name.startswith("NPU_SET_"):
            self.regs[command.name] = command
            return
        handler = handlers.get(command.name)
        if handler is None:
            raise UnmodelledCommand(f"{where(command.name, command.offset)}: not modelled by "
                                    "the Ethos-U85 model")
        self.memory.current = (command.name, command.offset)
        self.memory.op_accesses = []
        handler(command)

    def _op_stop(self, op: Command) -> None:
        self.stopped = True

    def _op_wait(self, op: Command) -> None:
        """DMA_WAIT/KERNEL_WAIT/PMU_MASK: synchronisation and profiling; in-order execution
        already completes every earlier command."""

    # -- feature maps ------------------------------------------------------------------------

    def _refuse(self, op: Command, what: str):
        return UnmodelledCommand(f"{where(op.name, op.offset)}: {what} is not modelled by the "
                                 "Ethos-U85 model")

    def _storage(self, name: str, op: Command) -> str:
        precision = self.field(f"NPU_SET_{name}_PRECISION", "activation_storage", op)
        return _STORAGE.get(precision, "reserved")

    def _fm(self, name: str, op: Command) -> FeatureMap:
        """The feature map the registers describe. A CHAINED map lives in the NPU's chaining
        buffer (its REGION register holds the buffer's number): only its element type is
        taken from the registers."""
        precision = self.reg(f"NPU_SET_{name}_PRECISION", op)
        storage = self._storage(name, op)
        region = self.field(f"NPU_SET_{name}_REGION", "region", op)
        if storage == "CHAINED":
            return feature_map(name, region, (0, 0, 0, 0), 0, 0, 0, 0, 0, 0, precision.param,
                               where(op.name, op.offset), ofm=name == "OFM")
        if storage != "TILE2X2":
            raise self._refuse(op, f"{name} storage {storage}")
        # The IFM/IFM2/OFM_PRECISION type, precision and format fields sit where the
        # Ethos-U55's do (ethosu85_interface.h npu_set_*_precision_t), so fmap decodes them.
        return feature_map(
            name, region, [self.reg(f"NPU_SET_{name}_BASE{i}", op).address for i in range(4)],
            self.param(f"NPU_SET_{name}_HEIGHT0_M1", op),
            self.param(f"NPU_SET_{name}_HEIGHT1_M1", op),
            self.param(f"NPU_SET_{name}_WIDTH0_M1", op),
            self.reg(f"NPU_SET_{name}_STRIDE_X", op).payload,
            self.reg(f"NPU_SET_{name}_STRIDE_Y", op).payload,
            self.reg(f"NPU_SET_{name}_STRIDE_C", op).payload,
            precision.param, where(op.name, op.offset), ofm=name == "OFM")

    def _zero_point(self, name: str, fm: FeatureMap, op: Command) -> int:
        """xFM_ZERO_POINT is 16 bits: signed for a signed map, unsigned otherwise."""
        return self.sparam(name, op) if fm.signed else self.param(name, op)

    def _ofm_shape(self, op: Command) -> tuple[int, int, int]:
        return (self.param("NPU_SET_OFM_HEIGHT_M1", op) + 1,
                self.param("NPU_SET_OFM_WIDTH_M1", op) + 1,
                self.param("NPU_SET_OFM_DEPTH_M1", op) + 1)

    def _read(self, fm: FeatureMap, shape, op: Command) -> np.ndarray:
        if self._storage(fm.name, op) == "CHAINED":
            values = self.chain.get(fm.region)
            if values is None:
                raise self._refuse(op, f"a read of chaining buffer {fm.region}, which no "
                                       "operation wrote")
            if values.shape != tuple(shape):
                raise self._refuse(op, f"a {'x'.join(map(str, shape))} read of chaining buffer "
                                       f"{fm.region}, which holds "
                                       f"{'x'.join(map(str, values.shape))}")
            lo, hi = fm.type_range
            if values.size and (values.min() < lo or values.max() > hi):
                raise self._refuse(op, f"chaining buffer {fm.region} read as another type")
            return values
        return self.memory.gather(fm, fm.addresses(*shape), where(op.name, op.offset))

    def _write_ofm(self, ofm: FeatureMap, values: np.ndarray, op: Command) -> None:
        """The OFM into memory, or into its chaining buffer (CHAINED: the next operation reads
        it as its IFM or IFM2, the output stage already applied). A transposed OFM is written
        in its transposed order, which its tile and stride registers describe (Vela 5.1:
        OFM_HEIGHT/WIDTH/DEPTH before the transposition, the tiles after). A reversed OFM
        (activation_reverse H, W or C) is written mirrored along that axis of the operation's
        OFM: regor leaves the base, tile and stride registers those of the unreversed map
        (GetTiles knows no reverse) and never combines a reverse with a transpose or chaining."""
        self.counters.ofm_elements += values.size
        if self._storage("OFM", op) == "CHAINED":
            self.chain[ofm.region] = np.array(values, dtype=np.int64)
            self.counters.operations["chained"] += 1
            return
        precision = fields(self.reg("NPU_SET_OFM_PRECISION", op))
        transpose = _TRANSPOSE.get(precision["activation_transpose"], "reserved")
        reverse = _REVERSE.get(precision["activation_reverse"], "reserved")
        if reverse == "reserved" or transpose == "reserved" or (
                reverse != "NONE" and transpose != "HWC"):
            raise self._refuse(op, f"an OFM written reversed ({reverse}) and transposed "
                                   f"({transpose})")
        if reverse != "NONE":
            values = np.flip(values, "HWC".index(reverse))
            self.counters.operations[f"reverse.{reverse}"] += 1
        if transpose != "HWC":
            values = np.transpose(values, ["HWC".index(axis) for axis in transpose])
            self.counters.operations[f"transpose.{transpose}"] += 1
        self.memory.scatter(ofm, ofm.addresses(*values.shape), values, where(op.name, op.offset))

    # -- kernel geometry ---------------------------------------------------------------------

    def _kernel(self, op: Command):
        """(undilated kh, kw, stride y, x, dilation y, x, part-kernel-first, dilated kh, kw),
        the tuple machine.Machine._windows takes."""
        stride = fields(self.reg("NPU_SET_KERNEL_STRIDE", op))
        if stride["decomposition"]:
            raise self._refuse(op, "the 4x4 kernel decomposition")
        sx = stride["stride_x_msb"] * 2 + stride["stride_x_lsb"] + 1
        sy = stride["stride_y_msb"] * 2 + stride["stride_y_lsb"] + 1
        dx, dy = stride["dilation_x"] + 1, stride["dilation_y"] + 1
        dkh = self.param("NPU_SET_KERNEL_HEIGHT_M1", op) + 1
        dkw = self.param("NPU_SET_KERNEL_WIDTH_M1", op) + 1
        if (dkh - 1) % dy or (dkw - 1) % dx:
            raise self._refuse(op, f"a dilated kernel extent {dkh}x{dkw} that is not a whole "
                                   "dilated kernel")
        return ((dkh - 1) // dy + 1, (dkw - 1) // dx + 1, sy, sx, dy, dx,
                bool(stride["weight_order"]), dkh, dkw)

    def _padding(self, op: Command) -> tuple[int, int, int, int]:
        return tuple(self.field(f"NPU_SET_IFM_PAD_{side}", "pad", op)
                     for side in ("TOP", "LEFT", "BOTTOM", "RIGHT"))

    def _padded_ifm(self, op: Command, ofm_shape, kernel, depth: int):
        """The IFM window the operation reads, zero point removed, padding positions 0, and the
        mask of real IFM positions: shape ((OH-1)*sy + dkh, (OW-1)*sx + dkw, depth). The IFM
        extent follows from the OFM, kernel, stride and padding as in the U55 model."""
        ifm = self._fm("IFM", op)
        oh, ow, _ = ofm_shape
        sy, sx, dkh, dkw = kernel[2], kernel[3], kernel[7], kernel[8]
        top, left, bottom, right = self._padding(op)
        full_h, full_w = (oh - 1) * sy + dkh, (ow - 1) * sx + dkw
        ih, iw = full_h - top - bottom, full_w - left - right
        if ih <= 0 or iw <= 0:
            raise self._refuse(op, f"padding {top}/{left}/{bottom}/{right} that leaves no IFM")
        upscale = _UPSCALE.get(self.field("NPU_SET_IFM_UPSCALE", "mode", op), "reserved")
        if upscale != "NONE":
            raise self._refuse(op, f"IFM upscaling {upscale}")
        zp = self._zero_point("NPU_SET_IFM_ZERO_POINT", ifm, op)
        values = self._read(ifm, (ih, iw, depth), op) - zp
        padded = np.zeros((full_h, full_w, depth), dtype=np.int64)
        padded[top:top + ih, left:left + iw] = values
        valid = np.zeros((full_h, full_w), dtype=bool)
        valid[top:top + ih, left:left + iw] = True
        return padded, valid, ifm

    # -- accumulator and output stage --------------------------------------------------------

    def _accumulator(self, op: Command, keeps: bool = False) -> int:
        """ACC_FORMAT: the accumulator's width in bits. Accumulators kept between operations
        (acc_input KEEP, acc_output DISABLE) only where `keeps` (convolutions); elsewhere, and
        with accumulators kept by the operation before, refused."""
        acc = fields(self.reg("NPU_SET_ACC_FORMAT", op))
        source = _ACC_INPUT.get(acc["acc_input"], "reserved")
        output = _ACC_OUTPUT.get(acc["acc_output"], "reserved")
        if (source, output) != ("RESET", "ENABLE") and not (
                keeps and source in ("RESET", "KEEP") and output in ("ENABLE", "DISABLE")):
            raise self._refuse(op, f"ACC_FORMAT acc_input {source} / acc_output {output} "
                                   f"on {op.name}")
        if not keeps and self.kept is not None:
            raise self._refuse(op, f"{op.name} after an operation that kept its accumulators")
        return 48 if acc["acc_format"] else 32

    def _acc_mode(self, op: Command) -> tuple[bool, bool]:
        """(acc_input KEEP, acc_output DISABLE) of ACC_FORMAT."""
        acc = fields(self.reg("NPU_SET_ACC_FORMAT", op))
        return (_ACC_INPUT.get(acc["acc_input"]) == "KEEP",
                _ACC_OUTPUT.get(acc["acc_output"]) == "DISABLE")

    def _check_accumulator(self, acc: np.ndarray, bits: int, op: Command) -> None:
        if acc.size and (int(acc.max()) >= 1 << (bits - 1) or int(acc.min()) < -(1 << (bits - 1))):
            raise self._refuse(op, f"an accumulator reaching {int(acc.min())}..{int(acc.max())}"
                                   f", beyond the {bits}-bit accumulator (its overflow)")

    def _rounding(self, name: str, op: Command, table: dict[int, str], shift) -> int:
        """The arith rounding mode `name`'s round_mode selects. With every shift 0 nothing is
        rounded, whatever the mode (regor writes DOUBLE_SYMMETRIC with unit scales)."""
        scale = fields(self.reg(name, op))
        mode = table.get(scale["round_mode"], "reserved")
        if scale["dbl_rnd"]:
            # regor writes 20 (8-bit operands) or 15 for the TFLite ops it scales the TFLite
            # way (its softmax); its reference `Scale` rounds DOUBLE_SYMMETRIC so
            if mode != "DOUBLE_SYMMETRIC" or not 0 < scale["dbl_rnd"] <= 30:
                raise self._refuse(op, f"{name} double rounding shift {scale['dbl_rnd']} with "
                                       f"round_mode {mode}")
            return arith.ROUND_DBL_SHIFTED + scale["dbl_rnd"]
        if mode not in _ROUNDING:
            if mode != "reserved" and not np.any(np.asarray(shift)):
                return arith.ROUND_NATURAL
            raise self._refuse(op, f"{name} round_mode {mode}")
        return _ROUNDING[mode]

    def _global_scale(self, op: Command) -> bool:
        return bool(self.field("NPU_SET_OFM_PRECISION", "scale_mode", op))

    def _scale_pair(self, name: str, op: Command) -> tuple[int, int]:
        scale = fields(self.reg(name, op))
        return scale["scale"], scale["shift"]

    def _scale_records(self, op: Command, channels: int):
        read = self.scale_reads.get(op.offset)
        if read is None:  # the checker reads scales wherever the registers select them
            raise self._refuse(op, "per-channel scaling without a scale stream")
        w = where(op.name, op.offset)
        data = self.memory.read_bytes_at(read.region, read.base, read.length, w,
                                         "scale/bias read")
        layout = read.layout
        if layout is None:  # the checker lays out a convolution's records only
            acc = fields(self.reg("NPU_SET_ACC_FORMAT", op))
            ublock = ofm_ublock_depth(self.accel.macs, _MICROBLOCK.get(acc["microblock"], "?"), w)
            layout = U85ScaleLayout(scale_records(channels, ublock), bool(acc["acc_format"]))
        return decode_scales(data, channels, layout.records, layout.acc48, w)

    def _output(self, values: np.ndarray, ofm: FeatureMap, op: Command) -> np.ndarray:
        """Add the OFM zero point, look the value up in a table (LUT_S8_S8, LUT_U8_U8), clamp
        to ACTIVATION_MIN/MAX (clip range B16) and the OFM type."""
        activation = fields(self.reg("NPU_SET_ACTIVATION", op))
        function = _ACTIVATION.get(activation["activation_function"], "reserved")
        if function not in ("LUT_NONE", "LUT_S8_S8", "LUT_U8_U8", "LUT_S16_S16", "LUT_S8_S32"):
            raise self._refuse(op, f"activation function {function}")
        type_lo, type_hi = lo, hi = ofm.type_range
        if activation["activation_clip_range"] == 0:  # B16: ACTIVATION_MIN/MAX, 16 bits
            lo = max(lo, self._zero_point("NPU_SET_ACTIVATION_MIN", ofm, op))
            hi = min(hi, self._zero_point("NPU_SET_ACTIVATION_MAX", ofm, op))
        zp = self._zero_point("NPU_SET_OFM_ZERO_POINT", ofm, op)
        values = arith.saturate(np.asarray(values), -(1 << 48), 1 << 48) + zp
        if function == "LUT_S8_S32":
            # the clamp bounds the table's index (regor writes -128..127 for the int8-indexed
            # exponent of its softmax), the int32 entries go out as they are
            index = np.clip(values, lo, hi)
            return np.clip(self._lut(index, function, activation["table"], ofm, op),
                           type_lo, type_hi)
        if function != "LUT_NONE":
            values = self._lut(values, function, activation["table"], ofm, op)
        return np.clip(values, lo, hi)

    def _lut(self, values, function: str, table: int, ofm: FeatureMap, op: Command):
        """An 8-bit table: 256 entries at LUT memory byte 256 x `table` (regor: 8 slots of
        256 bytes, a 256-byte table's index its slot), indexed by the value (zero point added)
        saturated to the table's 8-bit input type; loaded by a DMA into the LUT memory.

        LUT_S16_S16: the whole 2048-byte LUT memory (table 0), 512 entries of an int16 base
        and an int16 slope (regor's RewriteTable: base = TOSA TABLE value i, slope = value
        i+1 - value i), indexed by the value saturated to int16 plus 32768: step = index >> 7,
        fraction = index & 127, output base + (slope x fraction + 64) >> 7, TOSA TABLE's
        int16 interpolation with the RESCALE by 1/128 regor fuses (QuantizedScale(1, 7),
        RoundMode::NATURAL), as on the Ethos-U55 (machine.Machine._lut)."""
        wide = function == "LUT_S16_S16"
        words = function == "LUT_S8_S32"  # 256 int32 entries (regor's softmax exponent)
        signed = function != "LUT_U8_U8"
        size, low = (2048, -32768) if wide else (1024 if words else 256, -128 if signed else 0)
        if ofm.element_size != (2 if wide else 4 if words else 1) or ofm.signed != signed:
            raise self._refuse(op, f"{function} into a {ofm.element_size * 8}-bit "
                                   f"{'signed' if ofm.signed else 'unsigned'} OFM")
        if (wide or words) and table % (size // 256):
            raise self._refuse(op, f"{function} table {table} (a 2048-byte table fills the LUT "
                                   "memory)")
        start = 256 * table
        if not self.memory.shram_valid[start:start + size].all():
            raise self._refuse(op, f"{function} table {table}, which no DMA loaded")
        self.memory._record("read", -1, start, start + size - 1, "LUT")
        raw = bytes(self.memory.shram[start:start + size])
        index = np.clip(values, low, low + (1 << (16 if wide else 8)) - 1) - low
        self.counters.operations["lut"] += 1
        if words:
            return np.frombuffer(raw, dtype="<i4").astype(np.int64)[index]
        if not wide:
            return np.frombuffer(raw, dtype=np.int8 if signed else np.uint8).astype(
                np.int64)[index]
        entries = np.frombuffer(raw, dtype="<i2").astype(np.int64).reshape(512, 2)
        step, fraction = index >> 7, index & 0x7F
        return entries[step, 0] + ((entries[step, 1] * fraction + 64) >> 7)

    def _op_dma(self, op: Command) -> None:
        """A 1-D copy from a region into the LUT memory (regor's LUT DMAs) or into a region,
        and a 2-D copy whose source rows are indexed (regor's GATHER, below)."""
        src = fields(self.reg("NPU_SET_DMA0_SRC_REGION", op))
        dst = fields(self.reg("NPU_SET_DMA0_DST_REGION", op))
        if src["region_mode"] or dst["idx_mode"]:
            raise self._refuse(op, "a DMA from the NPU's internal memory or scattering")
        if src["idx_mode"]:
            self._gather(op, src, dst)
            return
        if src["stride_mode"]:
            raise self._refuse(op, "a 2-D/3-D DMA")
        w = where(op.name, op.offset)
        length = self.reg("NPU_SET_DMA0_LEN", op).address
        at = self.reg("NPU_SET_DMA0_DST", op).address
        data = self.memory.read_bytes_at(src["region"], self.reg("NPU_SET_DMA0_SRC", op).address,
                                         length, w, "DMA source")
        if not dst["region_mode"]:
            self.memory.write_bytes_at(dst["region"], at, data, w, "DMA destination")
            self.counters.dma_bytes[f"region{src['region']}->region{dst['region']}"] += length
            self.counters.operations["dma"] += 1
            return
        # the checker bounded the destination in the 2048-byte LUT memory
        self.memory.shram[at:at + length] = data
        self.memory.shram_valid[at:at + length] = True
        self.memory._record("write", -1, at, at + length - 1, "DMA destination")
        self.counters.dma_bytes[f"region{src['region']}->lut"] += length
        self.counters.operations["dma"] += 1

    def _gather(self, op: Command, src: dict, dst: dict) -> None:
        """regor's GATHER (high_level_command_stream_generator.cpp, 2-D mode): SIZE0 int32
        indices at DMA0_IDX in IDX_REGION; row i, LEN bytes, copied from SRC + index_i x
        SRC_STRIDE0 to DST + i x DST_STRIDE0. IDX_MAX is the largest index (the values' row
        count less one); what the DMA does with a larger one is not modelled, and refused."""
        if src["stride_mode"] != 1 or dst["region_mode"]:
            raise self._refuse(op, "an indexed DMA other than 2-D between regions")
        w = where(op.name, op.offset)

        def signed(name: str) -> int:
            value = self.reg(f"NPU_SET_DMA0_{name}", op).address
            return value - (1 << 40) if value & (1 << 39) else value

        rows, length = self.param("NPU_SET_DMA0_SIZE0", op), signed("LEN")
        raw = self.memory.read_bytes_at(self.field("NPU_SET_DMA0_IDX_REGION", "region", op),
                                        signed("IDX"), 4 * rows, w, "DMA index")
        indices = np.frombuffer(raw, dtype="<i4")
        idx_max = self.field("NPU_SET_DMA0_IDX_MAX", "idx_max", op)
        if indices.size and (indices.min() < 0 or indices.max() > idx_max):
            raise self._refuse(op, f"a gather index {int(indices.min())}..{int(indices.max())} "
                                   f"outside 0..IDX_MAX {idx_max}")
        source, target = signed("SRC"), signed("DST")
        for row, index in enumerate(indices.tolist()):
            data = self.memory.read_bytes_at(src["region"],
                                             source + index * signed("SRC_STRIDE0"), length, w,
                                             "DMA source")
            self.memory.write_bytes_at(dst["region"], target + row * signed("DST_STRIDE0"), data,
                                       w, "DMA destination")
        self.counters.dma_bytes[f"region{src['region']}->region{dst['region']}"] += rows * length
        self.counters.operations["dma.gather"] += 1

    def _scale_output(self, acc: np.ndarray, op: Command, channels: int) -> np.ndarray:
        """acc x scale / 2**shift, rounded as OFM_SCALE's round_mode says: per channel from
        the scale records (bias added first), or OFM_SCALE's own scale and shift."""
        if self._global_scale(op):
            scale, shift = self._scale_pair("NPU_SET_OFM_SCALE", op)
            rounding = self._rounding("NPU_SET_OFM_SCALE", op, _ROUND_OFM, shift)
            return arith.scale_shift(acc, scale, shift, rounding)
        bias, scale, shift = self._scale_records(op, channels)
        rounding = self._rounding("NPU_SET_OFM_SCALE", op, _ROUND_OFM, shift)
        return arith.scale_shift(acc + bias, scale, shift, rounding)

    # -- convolution / depthwise -------------------------------------------------------------

    def _op_conv(self, op: Command) -> None:
        self._convolution(op, depthwise=False, weights_ifm2=bool(fields(op)["weights_ifm2"]))

    def _op_depthwise(self, op: Command) -> None:
        self._convolution(op, depthwise=True)

    def _convolution(self, op: Command, depthwise: bool, weights_ifm2: bool = False) -> None:
        bits = self._accumulator(op, keeps=True)
        keep_input, keep_output = self._acc_mode(op)
        ofm = None if keep_output else self._fm("OFM", op)
        ofm_shape = oh, ow, oc = self._ofm_shape(op)
        kernel = self._kernel(op)
        kh, kw = kernel[:2]
        ifm_depth = self.param("NPU_SET_IFM_DEPTH_M1", op) + 1
        if depthwise and ifm_depth < oc:
            raise self._refuse(op, f"a depthwise OFM depth {oc} beyond the IFM depth {ifm_depth}")
        padded, _, ifm = self._padded_ifm(op, ofm_shape, kernel, oc if depthwise else ifm_depth)
        if ifm.element_size == 4:
            raise self._refuse(op, "a 32-bit IFM convolution")
        weights = (self._ifm2_weights(op, oc, ifm_depth, kernel) if weights_ifm2
                   else self._weights(op))  # (oc, kh, kw, ic)
        # float64 products and sums are exact: |ifm - zp| < 2**17, |w| < 2**9 and at most
        # 2**20 terms keep every partial sum below 2**53
        fweights = weights.astype(np.float64)
        acc = np.zeros((oh, ow, oc), dtype=np.float64)
        for ky, kx, window in Machine._windows(padded.astype(np.float64), ofm_shape, kernel):
            if depthwise:
                acc += window * fweights[:, ky, kx, 0]
            else:
                acc += window @ fweights[:, ky, kx, :].T
        acc = acc.astype(np.int64)
        acc = self._keep(op, acc, keep_input, keep_output)
        self._check_accumulator(acc, bits, op)
        if not keep_output:
            out = self._output(self._scale_output(acc, op, oc), ofm, op)
            self._write_ofm(ofm, out, op)
        kind = "depthwise" if depthwise else "conv"
        macs = oh * ow * oc * kh * kw * (1 if depthwise else ifm_depth)
        self.counters.operations[kind] += 1
        self.counters.macs += macs
        self.counters.macs_by_kind[kind] += macs

    def _keep(self, op: Command, acc: np.ndarray, keep_input: bool,
              keep_output: bool) -> np.ndarray:
        """Accumulators kept between convolutions (regor's DecomposeForStrides: a convolution
        of a stride the NPU lacks as one 1x1 convolution per kernel position, each reading
        the IFM stepped by the stride, summed in the accumulators): acc_input KEEP adds the
        accumulators the operation before left (of this OFM's shape), acc_output DISABLE
        leaves them for the next one and writes no OFM (its storage NONE). Every step's scale
        records carry the whole convolution's bias, which the output stage adds once, at the
        step that enables the output; steps whose biases differ are refused, as it would be
        open which one the NPU adds."""
        kept, self.kept = self.kept, None  # acc_input RESET discards them
        if not (keep_input or keep_output):
            return acc
        if self._global_scale(op):
            bias = np.zeros(acc.shape[2], dtype=np.int64)
        else:
            bias = self._scale_records(op, acc.shape[2])[0]
        if keep_input:
            if kept is None or kept[0].shape != acc.shape:
                raise self._refuse(op, "acc_input KEEP without accumulators of the OFM's "
                                       "shape kept by the operation before")
            if not np.array_equal(kept[1], bias):
                raise self._refuse(op, "kept accumulators whose steps' scale records carry "
                                       "different biases")
            acc = acc + kept[0]
        if keep_output:
            if self._storage("OFM", op) != "NONE":
                raise self._refuse(op, f"acc_output DISABLE with OFM storage "
                                       f"{self._storage('OFM', op)}")
            self.kept = (acc, bias)
            self.counters.operations["accumulators kept"] += 1
        return acc

    def _ifm2_weights(self, op: Command, oc: int, ic: int, kernel) -> np.ndarray:
        """Weights read from IFM2 (a matrix product: regor's dynamic weights, a global
        OFM scale): a 1 x OFM depth x IFM depth map, element (0, o, i) the weight of OFM
        channel o and IFM channel i, its zero point removed; a 1x1 kernel only."""
        if kernel[:6] != (1, 1, 1, 1, 1, 1):
            raise self._refuse(op, "weights from IFM2 with a kernel other than 1x1, stride 1")
        if not self._global_scale(op):
            raise self._refuse(op, "weights from IFM2 with per-channel scales")
        fm = self._fm("IFM2", op)
        zp = self._zero_point("NPU_SET_IFM2_ZERO_POINT", fm, op)
        return (self._read(fm, (1, oc, ic), op)[0] - zp)[:, None, None, :]

    def _weights(self, op: Command) -> np.ndarray:
        reads = self.weight_reads.get(op.offset)
        if not reads:
            raise self._refuse(op, "a convolution without a weight stream")
        w = where(op.name, op.offset)
        streams = [self.memory.read_bytes_at(r.region, r.base, r.length, w,
                                             "weight stream read") for r in reads]
        if self.memory.trace is not None:
            self.counters.weight_streams.extend(streams)
        return _decoded_weights(tuple(streams), tuple(r.layout for r in reads), w)

    # -- pooling -----------------------------------------------------------------------------

    def _op_pool(self, op: Command) -> None:
        mode = _POOL.get(fields(op)["pooling_mode"], "reserved")
        if mode not in ("MAX", "SUM", "AVERAGE", "REDUCE_SUM", "NONE"):
            raise self._refuse(op, f"pooling mode {mode}")
        if mode == "NONE":
            self._accumulators_from_ifm2(op)
            return
        bits = self._accumulator(op)
        ofm = self._fm("OFM", op)
        ofm_shape = oh, ow, oc = self._ofm_shape(op)
        kernel = self._kernel(op)
        if mode == "REDUCE_SUM":
            # the IFM's depth summed into one channel (regor's ReduceSum), 1x1, unpadded
            if kernel[:6] != (1, 1, 1, 1, 1, 1) or any(self._padding(op)) or oc != 1:
                raise self._refuse(op, "REDUCE_SUM with a kernel, stride, padding or an OFM "
                                       "deeper than one channel")
            depth = self.param("NPU_SET_IFM_DEPTH_M1", op) + 1
            padded, _, _ = self._padded_ifm(op, ofm_shape, kernel, depth)
            acc = padded.sum(axis=2, keepdims=True)
            self._check_accumulator(acc, bits, op)
            out = self._output(self._scale_output(acc, op, oc), ofm, op)
            self._write_ofm(ofm, out, op)
            self.counters.operations["pool.reduce_sum"] += 1
            return
        if kernel[4:6] != (1, 1):
            raise self._refuse(op, "dilated pooling")
        ifm_depth = self.param("NPU_SET_IFM_DEPTH_M1", op) + 1
        if ifm_depth < oc:
            raise self._refuse(op, f"a pooling OFM depth {oc} beyond the IFM depth {ifm_depth}")
        padded, valid, _ = self._padded_ifm(op, ofm_shape, kernel, oc)
        # SUM: the window's sum, padding contributing nothing (regor's average pooling over a
        # kernel larger than 8x8, its 1/N in the global OFM_SCALE)
        acc = Machine._pool_windows(padded, valid, ofm_shape, kernel, maximum=mode == "MAX")
        self._check_accumulator(acc, bits, op)
        if mode == "AVERAGE":
            acc = self._average(acc, valid, kernel, ofm_shape, op)
        out = self._output(self._scale_output(acc, op, oc), ofm, op)
        self._write_ofm(ofm, out, op)
        self.counters.operations[f"pool.{mode.lower()}"] += 1

    def _accumulators_from_ifm2(self, op: Command) -> None:
        """Pooling NONE with ACC_FORMAT acc_input IFM2 (regor's NullPool, the rescale of a
        32-bit tensor): the accumulators are loaded from IFM2, a map of the OFM's shape in the
        accumulator's format, and go through the output stage; the IFM is not read."""
        acc_format = fields(self.reg("NPU_SET_ACC_FORMAT", op))
        source = _ACC_INPUT.get(acc_format["acc_input"], "reserved")
        output = _ACC_OUTPUT.get(acc_format["acc_output"], "reserved")
        if (source, output) != ("IFM2", "ENABLE") or acc_format["acc_format"]:
            raise self._refuse(op, f"pooling NONE with ACC_FORMAT acc_input {source} / "
                                   f"acc_output {output} (only I32 accumulators from IFM2)")
        if not self._unit_kernel(op):
            raise self._refuse(op, "pooling NONE with a kernel, stride or padding")
        ofm = self._fm("OFM", op)
        shape = self._ofm_shape(op)
        ifm2 = self._fm("IFM2", op)
        if ifm2.element_size != 4 or self.param("NPU_SET_IFM2_ZERO_POINT", op):
            raise self._refuse(op, "accumulators loaded from an IFM2 that is not int32 with "
                                   "zero point 0")
        acc = self._read(ifm2, shape, op)
        out = self._output(self._scale_output(acc, op, shape[2]), ofm, op)
        self._write_ofm(ofm, out, op)
        self.counters.operations["pool.none"] += 1

    def _unit_kernel(self, op: Command) -> bool:
        return self._kernel(op)[:6] == (1, 1, 1, 1, 1, 1) and not any(self._padding(op))

    def _average(self, acc, valid, kernel, ofm_shape, op: Command) -> np.ndarray:
        """AVERAGE (regor's average pooling up to 8x8, with a unit OFM_SCALE): the window's
        sum divided by its number of real IFM elements, as the 32-bit reciprocal multiply TOSA
        specifies for avg_pool2d (k = ceil(log2(count)), multiplier = ((2**30 + 1) << k) //
        count, shift 30 + k), rounded as OFM_SCALE's round_mode says; the OFM_SCALE after."""
        count = np.zeros(ofm_shape[:2], dtype=np.int64)
        for _, _, window in Machine._windows(valid[:, :, None].astype(np.int64), ofm_shape,
                                             kernel):
            count += window[:, :, 0]
        if (count == 0).any():
            raise self._refuse(op, "an AVERAGE pooling window that covers only padding")
        k = np.array([(int(c) - 1).bit_length() for c in count.ravel()],
                     dtype=np.int64).reshape(count.shape)
        multiplier = (np.int64((1 << 30) + 1) << k) // count
        rounding = self._rounding("NPU_SET_OFM_SCALE", op, _ROUND_OFM, 30 + k)
        return arith.scale_shift(acc, multiplier[:, :, None], (30 + k)[:, :, None], rounding)


@lru_cache(maxsize=256)
def _decoded_weights(streams: tuple[bytes, ...], layouts: tuple, where: str) -> np.ndarray:
    """`u85_weights.decode_weights`, once per distinct stream bytes and layout: the strict
    decode (each stream re-encoded and compared) dominated repeated invocations."""
    weights = decode_weights(list(streams), list(layouts), where)
    weights.setflags(write=False)
    return weights


def execute_u85(command_stream: bytes, regions: Sequence, accelerator: str | None = None, *,
                growable_regions: tuple[int, ...] = (), trace: bool = False) -> Counters:
    """Run one Ethos-U85 custom-operator payload over `regions` (mutated in place), as
    `npu_driver.ethos_u.execute` runs a U55/U65 one: the U85 stream checker bounds every
    access first, then the machine executes. Raises UnmodelledCommand for what it does not
    execute (naming the command and its word offset), StreamRefused for an access outside its
    region, WeightStreamError for a weight stream Vela's encoder would not have written."""
    cop = parse_u85_payload(command_stream)
    accel = resolve_u85(cop, accelerator)
    sizes = [None if r is None else memoryview(r).nbytes for r in regions]
    checker = U85Checker(accel, sizes, set(growable_regions))
    checker.lut_loads = True  # the machine executes LUT loads: bound them in the LUT memory
    check = checker.run(bytes(command_stream))
    memory = Memory(regions, accel.shram_bytes, growable_regions)  # the LUT memory as SHRAM
    machine = U85Machine(accel, memory, check)
    return run_streams(machine, cop.command_streams, regions, tuple(growable_regions), trace,
                       fresh_registers=True)


__all__ = ["U85Machine", "execute_u85"]
