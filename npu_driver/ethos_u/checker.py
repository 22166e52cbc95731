"""The command-stream checker: every memory access of a stream, bounded before anything runs.

What the Linux `accel/ethosu` driver does before it submits a user's command stream
(`ethosu_gem.c::ethosu_gem_cmdstream_copy_and_validate`): replay the `NPU_SET_*` registers in
one state value and, at each command that starts an operation, derive the bytes it reaches:

- IFM: the extent the OFM size, kernel, stride, dilation, padding and upscaling imply (height =
  (OFM height - 1) x stride + dilated kernel height - top - bottom padding, halved when
  upscaled), over IFM_DEPTH channels; an elementwise IFM is the OFM's shape;
- IFM2: the OFM's shape with the broadcast dimensions at 1, nothing for a scalar or a unary op;
- OFM: its shape; each feature map through its tiles, strides and layout (`fmap.FeatureMap`);
- weights and scales: WEIGHT_BASE/LENGTH and SCALE_BASE/LENGTH (no scales with a global scale);
- DMA: source and destination, the destination in SHRAM when internal.

Each access must lie inside its region as the caller sizes it (the `.pte`'s weight data, the
scratch the payload declares); besides, every reserved bit must be zero
(`reserved_bits.json`, from Arm's interface headers), every register an operation reads must
have been set (the driver starts from all ones to catch a missing one), and each command stream
must end with NPU_OP_STOP. A refusal names the command and its word offset.

The check also hands back what it found (`StreamCheck`): every access, each weight and scale
stream with the decoder layout its operation implies, and the DMA copies, so the weights can be
checked against the TOSA graph without running the stream (`weight_check.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ethosu.vela.ethos_u55_regs.ethos_u55_regs import cmd0, cmd1

from npu_driver.ethos_u.arch import PRODUCT_U65, Accelerator
from npu_driver.ethos_u.errors import CommandStreamError, MemoryFault, where
from npu_driver.ethos_u.fmap import Access, FeatureMap, feature_map
from npu_driver.ethos_u.reserved_bits import reserved_masks
from npu_driver.ethos_u.stream import Command, parse_custom_operator_payload
from npu_driver.ethos_u.weights import SCALE_RECORD_BYTES, WeightLayout

SHRAM = -1  # region number of an internal (SHRAM) DMA end
_UNARY_ELEMENTWISE = {5, 6, 7}  # LRELU, ABS, CLZ: no IFM2


class StreamRefused(MemoryFault):
    """The checker refuses the stream: an access outside its region, a reserved bit set, a
    register read before it was set, or no NPU_OP_STOP at the end."""


@dataclass(frozen=True)
class StreamRead:
    """A weight or scale stream an operation reads: `length` bytes at `base` of `region`."""

    command: str
    offset: int
    region: int
    base: int
    length: int
    layout: WeightLayout | None  # weights: the order the weight decoder hands them over
    channels: int  # scales: the OFM channels, one 10-byte record each


@dataclass(frozen=True)
class DmaCopy:
    offset: int
    src_region: int
    src: int
    dst_region: int  # SHRAM for an internal destination
    dst: int
    length: int


@dataclass(frozen=True)
class StreamCheck:
    commands: int
    accesses: tuple[Access, ...]
    weights: tuple[StreamRead, ...]
    scales: tuple[StreamRead, ...]
    dmas: tuple[DmaCopy, ...]
    # NPU_SET_OP_SCALAR values (Ethos-U85: an elementwise operand from the command stream)
    scalars: tuple[int, ...] = ()

    def extent(self) -> dict[int, int]:
        """Region -> highest byte any command reaches + 1 (the driver's region_size)."""
        out: dict[int, int] = {}
        for access in self.accesses:
            out[access.region] = max(out.get(access.region, 0), access.highest + 1)
        return out


def check_stream(command_stream: bytes, region_sizes: Sequence[int | None],
                 accel: Accelerator, unbounded: tuple[int, ...] = ()) -> StreamCheck:
    """Check a custom-operator payload (COP1) against regions of `region_sizes` bytes (None: the
    region has no base address); regions in `unbounded` are sized by use (a fast scratch whose
    size the program does not record). Raises StreamRefused or CommandStreamError."""
    return Checker(accel, list(region_sizes), set(unbounded)).run(command_stream)


class Checker:
    """The register replay, one handler per operation kind. Registers and handlers are keyed
    by command name, which the Ethos-U products share for the registers they share; `opcodes`
    is the product's decoder table (None: Vela's Ethos-U55/U65 enums). A sibling product's
    checker (u85_checker.py) changes the handlers that differ."""

    opcodes: tuple[dict, dict] | None = None

    def __init__(self, accel, sizes: list, unbounded: set):
        self.accel = accel
        self.sizes = sizes
        self.unbounded = unbounded
        self.masks = reserved_masks(self.product_name())
        self.bases = {name: tuple(getattr(cmd1, f"NPU_SET_{name}_BASE{i}") for i in range(4))
                      for name in ("IFM", "IFM2", "OFM")}
        self.regs: dict[str, Command] = {}  # command name -> the command that last set it
        self.commands = 0
        self.accesses: list[Access] = []
        self.weights: list[StreamRead] = []
        self.scales: list[StreamRead] = []
        self.dmas: list[DmaCopy] = []
        self.scalars: list[Command] = []  # NPU_SET_OP_SCALAR commands (Ethos-U85)
        self.operations = self.handlers()

    def product_name(self) -> str:
        return "ethos-u65" if self.accel.product == PRODUCT_U65 else "ethos-u55"

    def handlers(self) -> dict:
        """Command name -> the handler of the operation it starts."""
        return {"NPU_OP_CONV": self._conv, "NPU_OP_DEPTHWISE": self._conv,
                "NPU_OP_POOL": self._pool, "NPU_OP_ELEMENTWISE": self._elementwise,
                "NPU_OP_DMA_START": self._dma}

    def run(self, command_stream: bytes) -> StreamCheck:
        cop = parse_custom_operator_payload(bytes(command_stream), self.opcodes)
        for commands in cop.command_streams:
            self.regs.clear()
            self.check_stop(commands)
            for command in commands:
                self.step(command)
        return StreamCheck(self.commands, tuple(self.accesses), tuple(self.weights),
                           tuple(self.scales), tuple(self.dmas),
                           tuple(sorted({c.payload for c in self.scalars})))

    def check_stop(self, commands) -> None:
        if not commands or commands[-1].name != "NPU_OP_STOP":
            last = commands[-1] if commands else None
            raise StreamRefused(
                "the command stream does not end with NPU_OP_STOP" + (
                    f" (its last command is {where(last.name, last.offset)})" if last else
                    " (it is empty)"))

    # -- state -------------------------------------------------------------------------------

    def step(self, command: Command) -> None:
        self.commands += 1
        self._reserved(command)
        opcode = command.opcode
        handler = self.operations.get(command.name)
        if handler is None and (command.payload is not None or opcode.value >= 0x100):
            self.regs[command.name] = command
            if command.name == "NPU_SET_OP_SCALAR":
                self.scalars.append(command)
            return
        if handler is not None:
            handler(command)

    def _reserved(self, command: Command) -> None:
        mask = self.masks.get(command.name, 0)
        word = (command.param << 16) | ((command.payload or 0) << 32)
        if word & mask:
            raise StreamRefused(f"{where(command.name, command.offset)}: reserved bits "
                                f"{word & mask:#x} are set (the interface requires them zero)")

    def reg(self, opcode, op: Command) -> Command:
        """The command that last set register `opcode` (an enum member or its name)."""
        name = opcode if isinstance(opcode, str) else opcode.name
        command = self.regs.get(name)
        if command is None:
            raise StreamRefused(f"{where(op.name, op.offset)} reads {name}, which the "
                                "command stream never set")
        return command

    def param(self, opcode, op: Command) -> int:
        return self.reg(opcode, op).param

    # -- accesses ----------------------------------------------------------------------------

    def _access(self, op: Command, kind: str, region: int, lowest: int, length: int,
                what: str) -> None:
        w = where(op.name, op.offset)
        highest = lowest + length - 1
        if length <= 0:
            return
        if region == SHRAM:
            size = self.accel.shram_bytes
        elif region in self.unbounded:
            size = None
        elif region >= len(self.sizes) or self.sizes[region] is None:
            raise StreamRefused(f"{w}: {what} in region {region}, which has no base address "
                                f"(the driver set {len(self.sizes)})")
        else:
            size = self.sizes[region]
        if lowest < 0 or (size is not None and highest >= size):
            place = "SHRAM" if region == SHRAM else f"region {region}"
            raise StreamRefused(f"{w}: {what} reaches bytes {lowest}..{highest} of {place}, "
                                f"which has {size} bytes")
        self.accesses.append(Access(op.name, op.offset, kind, region, lowest, highest, what))

    def _fm(self, name: str, op: Command) -> FeatureMap:
        c0, c1 = cmd0, cmd1
        region = self.param(getattr(c0, f"NPU_SET_{name}_REGION"), op) & 0x7
        return feature_map(
            name, region, [self.reg(b, op).address for b in self.bases[name]],
            self.param(getattr(c0, f"NPU_SET_{name}_HEIGHT0_M1"), op),
            self.param(getattr(c0, f"NPU_SET_{name}_HEIGHT1_M1"), op),
            self.param(getattr(c0, f"NPU_SET_{name}_WIDTH0_M1"), op),
            self.reg(getattr(c1, f"NPU_SET_{name}_STRIDE_X"), op).payload,
            self.reg(getattr(c1, f"NPU_SET_{name}_STRIDE_Y"), op).payload,
            self.reg(getattr(c1, f"NPU_SET_{name}_STRIDE_C"), op).payload,
            self.param(getattr(c0, f"NPU_SET_{name}_PRECISION"), op),
            where(op.name, op.offset), ofm=name == "OFM")

    def _map(self, name: str, op: Command, shape, kind: str) -> FeatureMap:
        fm = self._fm(name, op)
        lowest, highest = fm.extent(*shape)
        self._access(op, kind, fm.region, lowest, highest - lowest + 1, name)
        return fm

    def _ofm_shape(self, op: Command) -> tuple[int, int, int]:
        return (self.param(cmd0.NPU_SET_OFM_HEIGHT_M1, op) + 1,
                self.param(cmd0.NPU_SET_OFM_WIDTH_M1, op) + 1,
                self.param(cmd0.NPU_SET_OFM_DEPTH_M1, op) + 1)

    def _kernel(self, op: Command):
        """(kernel h, w, stride y, x, dilation y, x, part-kernel-first, dilated h, w)."""
        stride = self.param(cmd0.NPU_SET_KERNEL_STRIDE, op)
        # npu_set_kernel_stride_t: stride_x_lsb 0, stride_y_lsb 1, weight_order 2,
        # dilation_x 3, dilation_y 4, decomposition 5, stride_x_msb 6, stride_y_msb 9
        sx = ((stride >> 6) & 1) * 2 + (stride & 1) + 1
        sy = ((stride >> 9) & 1) * 2 + ((stride >> 1) & 1) + 1
        dx, dy = ((stride >> 3) & 1) + 1, ((stride >> 4) & 1) + 1
        dkh = self.param(cmd0.NPU_SET_KERNEL_HEIGHT_M1, op) + 1
        dkw = self.param(cmd0.NPU_SET_KERNEL_WIDTH_M1, op) + 1
        return ((dkh - 1) // dy + 1, (dkw - 1) // dx + 1, sy, sx, dy, dx, bool(stride & 4),
                dkh, dkw)

    def _ifm(self, op: Command, ofm_shape, kernel, depth: int) -> FeatureMap:
        oh, ow, _ = ofm_shape
        sy, sx, dkh, dkw = kernel[2], kernel[3], kernel[7], kernel[8]
        top = self.param(cmd0.NPU_SET_IFM_PAD_TOP, op) & 0x7F
        left = self.param(cmd0.NPU_SET_IFM_PAD_LEFT, op) & 0x7F
        bottom = self.param(cmd0.NPU_SET_IFM_PAD_BOTTOM, op) & 0xFF
        right = self.param(cmd0.NPU_SET_IFM_PAD_RIGHT, op) & 0xFF
        height = (oh - 1) * sy + dkh - top - bottom
        width = (ow - 1) * sx + dkw - left - right
        if height <= 0 or width <= 0:
            raise StreamRefused(f"{where(op.name, op.offset)}: padding {top}/{left}/{bottom}/"
                                f"{right} leaves no IFM for a {oh}x{ow} OFM")
        if self.param(cmd0.NPU_SET_IFM_UPSCALE, op) & 0x3:
            height, width = (height + 1) // 2, (width + 1) // 2
        return self._map("IFM", op, (height, width, depth), "read")

    def _stream(self, op: Command, kind: str, layout: WeightLayout | None, channels: int):
        region = self.param(getattr(cmd0, f"NPU_SET_{kind}_REGION"), op) & 0x7
        base = self.reg(getattr(cmd1, f"NPU_SET_{kind}_BASE"), op).address
        length = self.reg(getattr(cmd1, f"NPU_SET_{kind}_LENGTH"), op).payload
        what = "weight stream" if kind == "WEIGHT" else "scale/bias records"
        if kind == "SCALE" and length < channels * SCALE_RECORD_BYTES:
            raise StreamRefused(f"{where(op.name, op.offset)}: SCALE_LENGTH {length} holds fewer "
                                f"than the {channels} x 10-byte records the OFM depth needs")
        self._access(op, "read", region, base, length, what)
        read = StreamRead(op.name, op.offset, region, base, length, layout, channels)
        (self.weights if kind == "WEIGHT" else self.scales).append(read)

    def _scaled(self, op: Command) -> bool:
        """Per-channel scale records (OFM_PRECISION bit 8 clear) rather than OFM_SCALE."""
        return not (self.param(cmd0.NPU_SET_OFM_PRECISION, op) >> 8) & 1

    # -- operations --------------------------------------------------------------------------

    def _conv(self, op: Command) -> None:
        depthwise = op.name == "NPU_OP_DEPTHWISE"
        ofm_shape = self._ofm_shape(op)
        kernel = self._kernel(op)
        ifm_depth = self.param(cmd0.NPU_SET_IFM_DEPTH_M1, op) + 1
        ifm = self._ifm(op, ofm_shape, kernel, ifm_depth)
        self._map("OFM", op, ofm_shape, "write")
        layout = WeightLayout(
            ofm_depth=ofm_shape[2], kernel_h=kernel[0], kernel_w=kernel[1],
            ifm_depth=1 if depthwise else ifm_depth,
            ofm_block_depth=self.param(cmd0.NPU_SET_OFM_BLK_DEPTH_M1, op) + 1,
            depthwise=depthwise, part_kernel=kernel[6], ifm_bits=ifm.element_size * 8,
            decomp_h=8 // kernel[4], decomp_w=8 // kernel[5],
            ifm_ublock=self.accel.ifm_ublock_depth, ofm_ublock=self.accel.ofm_ublock_depth)
        self._stream(op, "WEIGHT", layout, ofm_shape[2])
        if self._scaled(op):
            self._stream(op, "SCALE", None, ofm_shape[2])

    def _pool(self, op: Command) -> None:
        ofm_shape = self._ofm_shape(op)
        ifm_depth = self.param(cmd0.NPU_SET_IFM_DEPTH_M1, op) + 1
        self._ifm(op, ofm_shape, self._kernel(op), ifm_depth)
        self._map("OFM", op, ofm_shape, "write")
        if self._scaled(op):
            self._stream(op, "SCALE", None, ofm_shape[2])

    def _elementwise(self, op: Command) -> None:
        shape = oh, ow, oc = self._ofm_shape(op)
        self._map("IFM", op, shape, "read")
        if op.param not in _UNARY_ELEMENTWISE:
            broadcast = self.param(cmd0.NPU_SET_IFM2_BROADCAST, op)
            if not broadcast & 0x80:  # not a scalar from IFM2_SCALAR
                self._map("IFM2", op, (1 if broadcast & 1 else oh, 1 if broadcast & 2 else ow,
                                       1 if broadcast & 4 else oc), "read")
        self._map("OFM", op, shape, "write")

    def _dma(self, op: Command) -> None:
        src_reg = self.param(cmd0.NPU_SET_DMA0_SRC_REGION, op)
        dst_reg = self.param(cmd0.NPU_SET_DMA0_DST_REGION, op)
        src = self.reg(cmd1.NPU_SET_DMA0_SRC, op).address
        dst = self.reg(cmd1.NPU_SET_DMA0_DST, op).address
        length = self.reg(cmd1.NPU_SET_DMA0_LEN, op).address
        mode = (src_reg >> 9) & 0x3
        src_len = dst_len = length
        if mode:  # 2-D/3-D: rows of `length` bytes, SIZE0 (and SIZE1) of them, strided
            # (ethosu_gem.c::dma_length bounds each end the same way)
            src_len = self._strided(op, length, mode, "SRC")
            dst_len = self._strided(op, length, mode, "DST")
        src_region = SHRAM if src_reg & 0x100 else src_reg & 0x7
        dst_region = SHRAM if dst_reg & 0x100 else dst_reg & 0x7
        self._access(op, "read", src_region, src, src_len, "DMA source")
        self._access(op, "write", dst_region, dst, dst_len, "DMA destination")
        self.dmas.append(DmaCopy(op.offset, src_region, src, dst_region, dst,
                                 length if not mode else -1))

    def _strided(self, op: Command, length: int, mode: int, end: str) -> int:
        def stride(index: int) -> int:
            value = self.reg(getattr(cmd1, f"NPU_SET_DMA0_{end}_STRIDE{index}"), op).address
            return value - (1 << 40) if value & (1 << 39) else value

        total = (length + max(stride(0), 0)) * self.param(cmd0.NPU_SET_DMA0_SIZE0, op)
        if mode == 2:
            total = (total + max(stride(1), 0)) * self.param(cmd0.NPU_SET_DMA0_SIZE1, op)
        return total

