"""The Ethos-U85 command stream: decoded from its own table and checked before anything runs.

The U85 runs the same kind of stream as the U55/U65 (a COP1 payload, cmd0/cmd1 words, `NPU_SET_*`
registers then an `NPU_OP_*` that starts an operation), with its own command set
(`u85_commands.json`, from `ethosu85_interface.h`). The checker replays it with the U55/U65
checker's logic (checker.py: the same register names give the same feature-map, kernel, padding
and weight/scale extents) and changes what the U85 does differently, as the Linux
`accel/ethosu` driver's `ethosu_gem_cmdstream_copy_and_validate` does for a U85:

- feature-map storage (`activation_storage`, precision bits 14-15): a CHAINED map lives in the
  NPU's chaining buffer and a NONE map is not written (accumulators kept for the next
  operation): neither touches memory; TILE3X1 is refused as not checked;
- a transposed OFM (activation_transpose) is bounded as the map its registers describe, the
  OFM's H x W x C permuted into the transpose's order;
- elementwise: the IFM has a broadcast register too; broadcast_mode SCALAR (8) reads no map
  (IFM2 from OP_SCALAR); LRELU, ABS, CLZ and NOT read no IFM2;
- convolution: `weights_ifm2` takes the weights from IFM2 (no weight stream); up to four weight
  streams (WEIGHT, WEIGHT1-3 BASE/LENGTH, one per weight decoder), each bounded in WEIGHT_REGION;
- pooling mode NONE reads no IFM;
- resize: the IFM is KERNEL_HEIGHT x KERNEL_WIDTH elements at the OFM's depth;
- reserved bits from the U85 masks (`reserved_bits.json`, "ethos-u85").

- a 2-D DMA with indexed source rows (regor's GATHER): the indices, the source rows up to
  IDX_MAX and the destination rows;

What it cannot bound it refuses (UnmodelledCommand, naming the command and word offset):
NPU_OP_BRANCH, other indexed DMA, and DMA to or from the NPU's internal memory (the
U85 model's own check, `lut_loads=True`, bounds a DMA into the 2048-byte LUT memory). (The
Linux driver refuses storage NONE and transposed OFMs, which Vela 5.1 emits.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from npu_driver.ethos_u.checker import (Checker, DmaCopy, StreamCheck, StreamRead,
                                        StreamRefused)
from npu_driver.ethos_u.errors import ConfigMismatch, UnmodelledCommand, where
from npu_driver.ethos_u.fmap import FeatureMap
from npu_driver.ethos_u.stream import CustomOperatorPayload, parse_custom_operator_payload
from npu_driver.ethos_u.u85_commands import U85_OPCODES, describe, enum_names, table
from npu_driver.ethos_u.u85_weights import (U85ScaleLayout, U85WeightLayout, ifm_block_depth,
                                            ofm_ublock_depth, scale_records)

PRODUCT_U85 = 2  # config_r.product of an Ethos-U85 (ethosu85_interface.h CONFIG)
_STORAGE = enum_names("activation_storage")
_TRANSPOSE = enum_names("activation_transpose")
_ELEMENTWISE = table()["enums"]["elementwise_mode"]
_UNARY = {_ELEMENTWISE[name] for name in ("LRELU", "ABS", "CLZ", "NOT")}
_SCALAR = table()["enums"]["broadcast_mode"]["SCALAR"]
_POOL_NONE = table()["enums"]["pooling_mode"]["NONE"]
_MICROBLOCK = enum_names("microblock")


@dataclass(frozen=True)
class U85Accelerator:
    """An Ethos-U85 configuration: what its OPTIMIZER_CONFIG must say."""

    name: str
    macs: int

    product = PRODUCT_U85

    @property
    def config_macs_log2(self) -> int:
        """config_r.macs_per_cc: log2 of the MACs per cycle (8 in an ethos-u85-256 stream)."""
        return self.macs.bit_length() - 1

    @property
    def shram_bytes(self) -> int:
        """The internal memory a DMA of region_mode INTERNAL writes: the U85's LUT memory,
        2048 bytes (regor ethos_u85.cpp `_lutRam`, 8 slots of 256 bytes)."""
        return 2048


U85_ACCELERATORS = {a.name: a for a in (
    U85Accelerator("ethos-u85-128", 128), U85Accelerator("ethos-u85-256", 256),
    U85Accelerator("ethos-u85-512", 512), U85Accelerator("ethos-u85-1024", 1024),
    U85Accelerator("ethos-u85-2048", 2048))}


def parse_u85_payload(data: bytes) -> CustomOperatorPayload:
    """A COP1 payload whose command streams are decoded with the Ethos-U85 command table."""
    return parse_custom_operator_payload(bytes(data), U85_OPCODES)


def resolve_u85(cop: CustomOperatorPayload, accelerator: str | None) -> U85Accelerator:
    """The U85 configuration to check for, against the stream's OPTIMIZER_CONFIG."""
    config = cop.optimizer_configs[0] if cop.optimizer_configs else None
    if config is not None and config.product != PRODUCT_U85:
        raise ConfigMismatch(f"OPTIMIZER_CONFIG at word {config.offset} is for product "
                             f"{config.product}, not an Ethos-U85 ({PRODUCT_U85})")
    if accelerator is None:
        if config is None:
            raise ConfigMismatch("the command stream has no OPTIMIZER_CONFIG; name the "
                                 "accelerator to check it for")
        found = [a for a in U85_ACCELERATORS.values()
                 if a.config_macs_log2 == config.macs_per_cc_log2]
        if not found:
            raise ConfigMismatch(f"OPTIMIZER_CONFIG at word {config.offset}: no Ethos-U85 "
                                 f"configuration has macs_per_cc {config.macs_per_cc_log2}")
        return found[0]
    if accelerator not in U85_ACCELERATORS:
        raise ConfigMismatch(f"unknown Ethos-U85 {accelerator!r}; known: "
                             f"{', '.join(U85_ACCELERATORS)}")
    accel = U85_ACCELERATORS[accelerator]
    if config is not None and config.macs_per_cc_log2 != accel.config_macs_log2:
        raise ConfigMismatch(f"OPTIMIZER_CONFIG at word {config.offset} was compiled for "
                             f"another NPU: macs_per_cc {config.macs_per_cc_log2} (stream) vs "
                             f"{accel.config_macs_log2} ({accel.name}); "
                             "ethosu_dev_verify_optimizer_config refuses it")
    return accel


def check_u85_stream(command_stream: bytes, region_sizes: Sequence[int | None],
                     accelerator: str | None = None,
                     unbounded: tuple[int, ...] = (), *, lut_loads: bool = False) -> StreamCheck:
    """Check an Ethos-U85 COP1 payload against regions of `region_sizes` bytes, as
    `checker.check_stream` does for the U55/U65; `lut_loads` bounds a DMA into the LUT memory
    (U85Checker.lut_loads). Raises StreamRefused, CommandStreamError, ConfigMismatch or
    UnmodelledCommand (what it cannot bound)."""
    accel = resolve_u85(parse_u85_payload(command_stream), accelerator)
    checker = U85Checker(accel, list(region_sizes), set(unbounded))
    checker.lut_loads = lut_loads
    return checker.run(command_stream)


def disassemble_u85(command_stream: bytes) -> str:
    """The U85 commands one per line: word offset, name, named fields."""
    cop = parse_u85_payload(command_stream)
    lines = [f"{c.offset:6}  OPTIMIZER_CONFIG  product {c.product}, macs_per_cc "
             f"{c.macs_per_cc_log2}, command stream v{c.cmd_stream_version}"
             for c in cop.optimizer_configs]
    for stream in cop.command_streams:
        lines.extend(f"{c.offset:6}  {c.name:<28} {describe(c)}".rstrip() for c in stream)
    return "\n".join(lines)


class U85Checker(Checker):
    """checker.Checker with the Ethos-U85's command table and its differences."""

    opcodes = U85_OPCODES
    lut_loads = False  # bound a DMA into the LUT memory (u85_machine.execute_u85) or refuse it

    def product_name(self) -> str:
        return "ethos-u85"

    def handlers(self) -> dict:
        return {**super().handlers(), "NPU_OP_CONV": self._u85_conv,
                "NPU_OP_DEPTHWISE": self._u85_conv, "NPU_OP_POOL": self._u85_pool,
                "NPU_OP_ELEMENTWISE": self._u85_elementwise, "NPU_OP_DMA_START": self._u85_dma,
                "NPU_OP_RESIZE": self._u85_resize, "NPU_OP_BRANCH": self._refuse}

    @staticmethod
    def _refuse(op) -> None:
        raise UnmodelledCommand(f"{where(op.name, op.offset)}: the U85 stream checker does not "
                                f"bound {op.name} ({describe(op) or 'no fields'})")

    def _storage(self, name: str, op) -> str:
        precision = self.param(f"NPU_SET_{name}_PRECISION", op)
        return _STORAGE.get(precision >> 14, str(precision >> 14))

    def _map(self, name: str, op, shape, kind: str) -> FeatureMap | None:
        storage = self._storage(name, op)
        if storage in ("CHAINED", "NONE"):
            # CHAINED: in the chaining buffer; NONE: not in memory (Vela writes an OFM of
            # storage NONE with ACC_FORMAT acc_output DISABLE, the accumulators kept for the
            # next operation). No memory access either way.
            return None
        if storage != "TILE2X2":
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: {name} storage {storage} "
                                    "is not bounded by the U85 stream checker (TILE2X2, "
                                    "CHAINED and NONE are)")
        if name == "OFM":
            transpose = _TRANSPOSE.get((self.param("NPU_SET_OFM_PRECISION", op) >> 11) & 0x7)
            if transpose is None:
                raise StreamRefused(f"{where(op.name, op.offset)}: OFM transpose "
                                    f"{(self.param('NPU_SET_OFM_PRECISION', op) >> 11) & 7} is "
                                    "a reserved value")
            # The OFM is written in the transposed order, which its tile and stride registers
            # describe: a CHW transpose of an 8x8x16 OFM is a 16x8x8 map (Vela 5.1 sets
            # HEIGHT0_M1 15 for it). Reverse (bits 9-10) writes the same elements reordered.
            sizes = dict(zip("HWC", shape))
            shape = tuple(sizes[axis] for axis in transpose)
        return super()._map(name, op, shape, kind)

    def _u85_conv(self, op) -> None:
        ofm_shape = self._ofm_shape(op)
        kernel = self._kernel(op)
        ifm_depth = self.param("NPU_SET_IFM_DEPTH_M1", op) + 1
        self._ifm(op, ofm_shape, kernel, ifm_depth)
        weights_from_ifm2 = op.name == "NPU_OP_CONV" and op.param & 1
        if weights_from_ifm2:
            # the IFM2 holds the weights as a 1 x OFM depth x IFM depth map: regor's
            # RewriteMatmul transposes TOSA MATMUL's [N, C, W] operand so, its width the OFM
            # depth and its depth the IFM's, as the model reads it
            self._map("IFM2", op, (1, ofm_shape[2], ifm_depth), "read")
        self._map("OFM", op, ofm_shape, "write")
        acc = self.param("NPU_SET_ACC_FORMAT", op)
        ublock = ofm_ublock_depth(self.accel.macs, _MICROBLOCK.get((acc >> 8) & 0x7, "?"),
                                  where(op.name, op.offset))
        if not weights_from_ifm2:
            layout = self._weight_layout(op, ofm_shape[2], kernel, ifm_depth, ublock)
            self._stream(op, "WEIGHT", layout, ofm_shape[2])
            for index in (1, 2, 3):
                self._extra_weights(op, index, layout)
        if self._scaled(op):
            self._stream(op, "SCALE", U85ScaleLayout(scale_records(ofm_shape[2], ublock),
                                                     bool(acc & 0x3)), ofm_shape[2])

    def _weight_layout(self, op, ofm_depth: int, kernel, ifm_depth: int,
                       ublock: int) -> U85WeightLayout:
        """The registers that decide the order of the weights (u85_weights.py)."""
        depthwise = op.name == "NPU_OP_DEPTHWISE"
        traversal = "depthwise" if depthwise else "part_kernel" if kernel[6] else "depth_first"
        ifm_bits = 8 << ((self.param("NPU_SET_IFM_PRECISION", op) >> 2) & 0x3)
        weight_format = self.param("NPU_SET_WEIGHT_FORMAT", op)
        sparse = bool(weight_format & 0x10)
        if (self.param("NPU_SET_KERNEL_STRIDE", op) >> 5) & 1:
            raise UnmodelledCommand(f"{where(op.name, op.offset)}: the 4x4 kernel "
                                    "decomposition is not decoded (Vela decomposes 8x8)")
        return U85WeightLayout(
            ofm_depth=ofm_depth, kernel_h=kernel[0], kernel_w=kernel[1],
            ifm_depth=1 if depthwise else ifm_depth,
            ofm_block_depth=self.param("NPU_SET_OFM_BLK_DEPTH_M1", op) + 1,
            ifm_block_depth=ifm_block_depth(traversal, ifm_bits, self.accel.macs, ublock,
                                            sparse),
            traversal=traversal, ifm_bits=ifm_bits, stride_y=kernel[2], stride_x=kernel[3],
            dilation_y=kernel[4], dilation_x=kernel[5], ofm_ublock_depth=ublock,
            macs=self.accel.macs, fast=bool(weight_format & 0x1), sparse=sparse)

    def _extra_weights(self, op, index: int, layout: U85WeightLayout) -> None:
        """WEIGHTn_BASE/LENGTH: the SWD stream of core n, in WEIGHT_REGION (unset on
        configurations with fewer cores; length 0 where the operation has one stream)."""
        base = self.regs.get(f"NPU_SET_WEIGHT{index}_BASE")
        length = self.regs.get(f"NPU_SET_WEIGHT{index}_LENGTH")
        if base is None and length is None:
            return
        length = self.reg(f"NPU_SET_WEIGHT{index}_LENGTH", op).payload
        if index >= layout.streams:
            if length:
                raise StreamRefused(f"{where(op.name, op.offset)}: WEIGHT{index}_LENGTH is "
                                    f"{length}; the operation has {layout.streams} weight "
                                    "stream(s)")
            return
        base = self.reg(f"NPU_SET_WEIGHT{index}_BASE", op).address
        region = self.param("NPU_SET_WEIGHT_REGION", op) & 0x7
        self._access(op, "read", region, base, length, f"weight stream {index}")
        self.weights.append(StreamRead(op.name, op.offset, region, base, length,
                                       replace(layout, stream=index), 0))

    def _u85_pool(self, op) -> None:
        ofm_shape = self._ofm_shape(op)
        if op.param & 0x7 != _POOL_NONE:
            self._ifm(op, ofm_shape, self._kernel(op),
                      self.param("NPU_SET_IFM_DEPTH_M1", op) + 1)
        self._map("OFM", op, ofm_shape, "write")
        if self._scaled(op):
            self._stream(op, "SCALE", None, ofm_shape[2])

    def _u85_elementwise(self, op) -> None:
        shape = self._ofm_shape(op)
        mode = op.param & 0x3F
        for name in ("IFM",) if mode in _UNARY else ("IFM", "IFM2"):
            broadcast = self.param(f"NPU_SET_{name}_BROADCAST", op) & 0xF
            if broadcast == _SCALAR:
                continue  # a scalar (IFM2: OP_SCALAR), no feature map read
            oh, ow, oc = shape
            self._map(name, op, (1 if broadcast & 1 else oh, 1 if broadcast & 2 else ow,
                                 1 if broadcast & 4 else oc), "read")
        self._map("OFM", op, shape, "write")

    def _u85_resize(self, op) -> None:
        """RESIZE reads an IFM of KERNEL_HEIGHT x KERNEL_WIDTH elements (regor writes the
        IFM's height and the width the OFM reaches there) at the OFM's depth, and writes the
        OFM."""
        shape = self._ofm_shape(op)
        self._map("IFM", op, (self.param("NPU_SET_KERNEL_HEIGHT_M1", op) + 1,
                              self.param("NPU_SET_KERNEL_WIDTH_M1", op) + 1, shape[2]), "read")
        self._map("OFM", op, shape, "write")

    def _u85_dma(self, op) -> None:
        for end in ("SRC", "DST"):
            register = self.param(f"NPU_SET_DMA0_{end}_REGION", op)
            if register & 0x800 and (end == "DST" or (register >> 9) & 0x3 != 1):
                raise UnmodelledCommand(f"{where(op.name, op.offset)}: indexed DMA "
                                        f"({end} idx_mode{'' if end == 'DST' else ', 3-D'}) is "
                                        "not bounded by the U85 checker")
            if register & 0x100 and (end == "SRC" or not self.lut_loads):
                raise UnmodelledCommand(f"{where(op.name, op.offset)}: DMA {end} in the NPU's "
                                        "internal memory is not bounded by the U85 checker")
        if self.param("NPU_SET_DMA0_SRC_REGION", op) & 0x800:
            self._gather(op)
            return
        self._dma(op)

    def _gather(self, op) -> None:
        """A 2-D DMA whose source rows are indexed (regor's GATHER): SIZE0 int32 indices at
        DMA0_IDX in IDX_REGION, each at most IDX_MAX, row i copied from SRC + index x
        SRC_STRIDE0 to DST + i x DST_STRIDE0, LEN bytes each."""
        def address(name: str) -> int:
            value = self.reg(f"NPU_SET_DMA0_{name}", op).address
            return value - (1 << 40) if value & (1 << 39) else value

        length, rows = address("LEN"), self.param("NPU_SET_DMA0_SIZE0", op)
        idx_max = self.reg("NPU_SET_DMA0_IDX_MAX", op).payload & 0x7FFFFFFF
        src_region = self.param("NPU_SET_DMA0_SRC_REGION", op) & 0x7
        dst_region = self.param("NPU_SET_DMA0_DST_REGION", op) & 0x7
        self._access(op, "read", self.param("NPU_SET_DMA0_IDX_REGION", op) & 0x7,
                     address("IDX"), 4 * rows, "DMA index")
        self._access(op, "read", src_region, address("SRC"),
                     idx_max * max(address("SRC_STRIDE0"), 0) + length, "DMA source")
        self._access(op, "write", dst_region, address("DST"),
                     (rows - 1) * max(address("DST_STRIDE0"), 0) + length, "DMA destination")
        # rows picked by index: no byte-for-byte copy the weight check could trace (-1)
        self.dmas.append(DmaCopy(op.offset, src_region, address("SRC"), dst_region,
                                 address("DST"), -1))


__all__ = ["PRODUCT_U85", "U85_ACCELERATORS", "U85Accelerator", "U85Checker", "StreamRefused",
           "check_u85_stream", "disassemble_u85", "parse_u85_payload", "resolve_u85"]
