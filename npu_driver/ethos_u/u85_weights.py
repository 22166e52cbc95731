"""Weight streams and scale records as the Ethos-U85's weight decoders consume them (Vela 5.1).

Read from Vela's U85 weight encoder (regor `ethos_u85_weight_encoder.cpp`, `mlw_codec`) and
checked on every zoo stream against the TOSA graph Vela compiled (tests/test_u85_weights.py);
written here from that understanding, strict: a bit the encoder would not have written is an
error, so no bit of a stream changes unseen.

Two bitstream formats, chosen per operation by NPU_SET_WEIGHT_FORMAT:

- SWD (standard weight decoder): the MLW format of the U55/U65 (`mlw.decode`), one stream per
  core: WEIGHT_BASE/LENGTH for core 0, WEIGHT1..3 for cores 1..3 (U85-512 has two cores,
  U85-1024/2048 four). Core k is fed the OFM lanes 4k..4k+3 of every group of 4 x cores.
- FWD (fast weight decoder): one stream for all cores. A 256-bit header (bits least
  significant first): RAW 1, SMALL_LUT 1, 102 zero bits, ZERO_ADJUST 8 (two's complement), 16
  LUT entries of 9 bits, each a folded value (magnitude << 1 | sign). Then one code per
  weight: 2 bits (SMALL_LUT: a LUT index 0..3), 8 bits (RAW: (weight + ZERO_ADJUST) mod 256,
  read back as int8 less ZERO_ADJUST) or 4 bits (a LUT index), then zero bits up to a
  multiple of 256. The encoder fills the LUT in order of first appearance, so a canonical
  stream is the only one that decodes to its weights: the LUT entries after the last one used
  are zero and the indices used are exactly 0..n-1 in order of first use. With more than one
  core the cores' sequences are interleaved in blocks of OFM micro-block depth x IFM
  micro-block depth x sub-kernel rounding / cores weights.

The order the decoder hands weights over (EthosU85WeightOrdering), per core: per OFM block
(OFM_BLK_DEPTH channels) - per IFM block (boustrophedon: ascending in even OFM blocks,
descending in odd ones; one for depthwise) - per sub-kernel column band (8 / dilation taps)
then row band - per IFM micro-block - per OFM micro-block - [part-kernel-first: per stride
phase y, x] - per kernel row, per tap of the row (snake: odd rows right to left) - per 8 IFM
channels (16 when 2:4 sparse, 1 for depthwise) - per group of 4 x cores OFM lanes - the core's
4 lanes - the IFM channels. A sub-kernel's taps are padded with zeros to a multiple of 5
(8-bit part-kernel-first) or 10 (16-bit or sparse part-kernel-first, depthwise; depthwise adds
2 or 6 more taps' zeros per 10 on 16-bit inputs and on the U85-512 and larger).

The IFM block depth is the hardware's rule as Vela states it: 16 for part-kernel-first, 32 for
32-bit IFMs and for dense weights with a 16-deep OFM micro-block on the U85-128/256, 128 for
2:4-sparse 8-bit weights, 64 otherwise. The OFM micro-block depth follows from ACC_FORMAT's
microblock and the configuration.

Scales: one 10-byte record per OFM channel, the count rounded up to a multiple of 16 (of the
micro-block depth rounded to 16), the records past the OFM depth all zero. ACC_FORMAT I32:
bias int32 (bytes 0-3), scale 31 bits (4-7), shift 6 bits (8), byte 9 zero. I48: bias int48
(0-5), scale 15 bits (6-7), shift 6 bits (8), byte 9 zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from npu_driver.ethos_u import mlw, u85_mlw
from npu_driver.ethos_u.errors import UnmodelledCommand
from npu_driver.ethos_u.mlw import WeightStreamError

SCALE_RECORD_BYTES = 10
FWD_HEADER_BITS = 256
FWD_LUT_ENTRIES = 16
_INTERLEAVE = 4  # OFM lanes per core in a group (InterleaveDepth)

# (MACs, ACC_FORMAT microblock) -> OFM micro-block depth: the configuration's micro-blocks
# (ethos_u85.cpp s_EthosU85Configs), each named by its height x width.
_UBLOCK_DEPTH = {
    (128, "U1X2"): 8, (128, "U1X1"): 16,
    (256, "U1X2"): 16, (256, "U1X4"): 8, (256, "U2X2"): 8,
    (512, "U2X2"): 16, (512, "U1X4"): 16,
    (1024, "U2X2"): 32, (1024, "U1X4"): 32, (1024, "U2X4"): 16,
    (2048, "U2X2"): 64, (2048, "U1X4"): 64, (2048, "U4X4"): 16,
}
CORES = {128: 1, 256: 1, 512: 2, 1024: 4, 2048: 4}


@dataclass(frozen=True)
class U85WeightLayout:
    """What decides the order of one operation's weights: from its registers and the
    configuration. `stream`: the core whose SWD stream this is (FWD: 0, all cores)."""

    ofm_depth: int
    kernel_h: int
    kernel_w: int
    ifm_depth: int  # 1 for depthwise
    ofm_block_depth: int
    ifm_block_depth: int
    traversal: str  # "depth_first", "part_kernel" or "depthwise"
    ifm_bits: int
    stride_y: int
    stride_x: int
    dilation_y: int
    dilation_x: int
    ofm_ublock_depth: int
    macs: int
    fast: bool  # FWD
    sparse: bool  # 2:4 sparse
    stream: int = 0

    @property
    def cores(self) -> int:
        return CORES[self.macs]

    @property
    def streams(self) -> int:
        """Weight streams the operation reads: one per core (SWD), one (FWD)."""
        return 1 if self.fast else self.cores

    def shape(self) -> tuple[int, int, int, int]:
        return (self.ofm_depth, self.kernel_h, self.kernel_w, self.ifm_depth)


@dataclass(frozen=True)
class U85ScaleLayout:
    """An operation's scale stream: `records` 10-byte records, in the ACC_FORMAT's layout."""

    records: int
    acc48: bool


def ofm_ublock_depth(macs: int, microblock: str, where: str) -> int:
    try:
        return _UBLOCK_DEPTH[(macs, microblock)]
    except KeyError:
        raise UnmodelledCommand(f"{where}: microblock {microblock} is not one of the Ethos-U85-"
                                f"{macs}'s OFM micro-blocks") from None


def ifm_block_depth(traversal: str, ifm_bits: int, macs: int, ublock_depth: int,
                    sparse: bool) -> int:
    if traversal == "part_kernel":
        return 16
    if ifm_bits == 32 or (macs in (128, 256) and ublock_depth == 16 and not sparse):
        return 32
    if sparse and ifm_bits == 8:
        return 128
    return 64


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _core_order(L: U85WeightLayout, core: int, cores: int) -> list[np.ndarray]:
    """Core `core`'s sequence of flat OHWI indices (-1: a zero the encoder inserts), as
    pieces."""
    depthwise = L.traversal == "depthwise"
    part_kernel = L.traversal == "part_kernel"
    wide = L.ifm_bits == 16
    if part_kernel:
        rounding = 10 if (wide or L.sparse) else 5
        ifm_ublock = 8 if (wide and not L.sparse) else L.ifm_block_depth
        stride_y, stride_x = L.stride_y, L.stride_x
    elif depthwise:
        rounding, ifm_ublock = 10, 1
        stride_y, stride_x = L.stride_y, L.stride_x
    else:
        rounding, ifm_ublock = 1, L.ifm_block_depth
        stride_y = stride_x = 1
    decomp_x, decomp_y = 8 // L.dilation_x, 8 // L.dilation_y
    dw_padding = 0 if (not wide and L.macs <= 256) else 2 if L.macs <= 512 else 6
    step = 1 if depthwise else (16 if L.sparse else 8)
    oud = L.ofm_ublock_depth
    O, KH, KW, I = L.shape()
    lanes = np.array([z + inner for z in range(core * _INTERLEAVE, oud, _INTERLEAVE * cores)
                      for inner in range(_INTERLEAVE)], dtype=np.int64)
    ifm_lanes = np.arange(step, dtype=np.int64)
    pieces: list[np.ndarray] = []

    def zeros(count: int) -> None:
        if count > 0:
            pieces.append(np.full(count, -1, dtype=np.int64))

    increment = -L.ifm_block_depth
    ifm_start = 0
    for ofm_block_z in range(0, O, L.ofm_block_depth):
        increment = -increment
        clipped_ofm = min(L.ofm_block_depth, O - ofm_block_z)
        ifm_block_z = ifm_start
        while 0 <= ifm_block_z < (1 if depthwise else I):
            ifm_start = ifm_block_z
            clipped_ifm = min(L.ifm_block_depth, I - ifm_block_z)
            for sub_x in range(0, KW, decomp_x):
                sub_w = min(KW - sub_x, decomp_x)
                for sub_y in range(0, KH, decomp_y):
                    sub_h = min(KH - sub_y, decomp_y)
                    for ifm_outer in range(0, 1 if depthwise else clipped_ifm, ifm_ublock):
                        for ofm_outer in range(0, clipped_ofm, oud):
                            remaining = _round_up(sub_w * sub_h, rounding)
                            ofm_z = ofm_block_z + ofm_outer + lanes
                            for phase_y in range(stride_y):
                                rows = (sub_h + stride_y - 1 - phase_y) // stride_y
                                for phase_x in range(stride_x):
                                    cols = (sub_w + stride_x - 1 - phase_x) // stride_x
                                    for ky in range(rows):
                                        for kx in range(cols):
                                            x = kx if ky % 2 == 0 else cols - 1 - kx
                                            remaining -= 1
                                            wx = sub_x + phase_x + x * stride_x
                                            wy = sub_y + phase_y + ky * stride_y
                                            for inner in range(0, ifm_ublock, step):
                                                ifm_z = (ifm_block_z + ifm_outer + inner
                                                         + ifm_lanes)
                                                valid = ((ofm_z[:, None] < O)
                                                         & (ifm_z[None, :] < I))
                                                flat = ((ofm_z[:, None] * KH + wy) * KW
                                                        + wx) * I + ifm_z[None, :]
                                                pieces.append(np.where(valid, flat,
                                                                       -1).ravel())
                                            if depthwise and remaining % rounding == 0:
                                                zeros(dw_padding * oud // cores)
                            if remaining > 0:
                                zeros((remaining + (dw_padding if depthwise else 0))
                                      * ifm_ublock * oud // cores)
            ifm_block_z += increment
    return pieces


@lru_cache(maxsize=256)
def weight_order(layout: U85WeightLayout) -> np.ndarray:
    """For each weight the stream delivers, the flat OHWI index it feeds (-1: an inserted
    zero)."""
    L = layout
    if L.fast and L.cores > 1:
        sequences = [np.concatenate(_core_order(L, core, L.cores) or [np.zeros(0, np.int64)])
                     for core in range(L.cores)]
        part_kernel = L.traversal == "part_kernel"
        wide = L.ifm_bits == 16
        ifm_ublock = 8 if (part_kernel and wide and not L.sparse) else L.ifm_block_depth
        rounding = (10 if (wide or L.sparse) else 5) if part_kernel else 1
        block = L.ofm_ublock_depth * ifm_ublock * rounding // L.cores
        longest = max(len(s) for s in sequences)
        order = np.concatenate([s[start:start + block] for start in range(0, longest, block)
                                for s in sequences])
    else:
        cores = 1 if L.fast else L.cores
        pieces = _core_order(L, L.stream, cores)
        order = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    order.setflags(write=False)
    return order


def _fold(values: np.ndarray) -> np.ndarray:
    return (np.abs(values) << 1) | (values < 0)


def _unfold(codes: np.ndarray) -> np.ndarray:
    return np.where(codes & 1, -(codes >> 1), codes >> 1)


def _bits(stream: bytes) -> np.ndarray:
    return np.unpackbits(np.frombuffer(stream, dtype=np.uint8), bitorder="little")


def _field(bits: np.ndarray, start: int, width: int) -> np.ndarray:
    """Consecutive `width`-bit little-endian fields from bit `start` on, to the end."""
    count = (len(bits) - start) // width
    chunk = bits[start:start + count * width].reshape(count, width).astype(np.int64)
    return chunk @ (np.int64(1) << np.arange(width, dtype=np.int64))


def encode_fwd(values: np.ndarray, sparse: bool = False) -> bytes:
    """The FWD stream Vela's encoder writes for `values` (the canonical one)."""
    values = np.asarray(values, dtype=np.int64)
    distinct = list(dict.fromkeys(values.tolist()))  # in order of first appearance
    lut = distinct[:FWD_LUT_ENTRIES] + [0] * (FWD_LUT_ENTRIES - min(len(distinct),
                                                                  FWD_LUT_ENTRIES))
    raw = len(distinct) > FWD_LUT_ENTRIES or sparse
    small = not raw and len(distinct) <= 4
    zero_adjust = 0
    if raw and values.size:
        low, high = int(values.min()), int(values.max())
        if high - low >= 256:
            raise WeightStreamError(f"weights {low}..{high} span more than the FWD's 8 bits")
        zero_adjust = -128 - low if low < -128 else 127 - high if high > 127 else 0
    header = [(int(raw), 1), (int(small), 1), (0, 102), (zero_adjust & 0xFF, 8)]
    header += [(int(v), 9) for v in _fold(np.asarray(lut, dtype=np.int64))]
    if raw:
        codes, width = (values + zero_adjust) & 0xFF, 8
    else:
        index = {value: i for i, value in enumerate(distinct)}
        codes = np.array([index[v] for v in values.tolist()], dtype=np.int64)
        width = 2 if small else 4
    bits = np.concatenate([((np.int64(value) >> np.arange(n)) & 1) for value, n in header]
                          + [((codes[:, None] >> np.arange(width)) & 1).ravel()])
    bits = np.concatenate([bits, np.zeros(_round_up(bits.size, FWD_HEADER_BITS) - bits.size,
                                          dtype=np.int64)])
    return np.packbits(bits.astype(np.uint8), bitorder="little").tobytes()


def decode_fwd(stream: bytes, count: int, sparse: bool = False) -> np.ndarray:
    """The `count` weights of an FWD stream (int64), every bit checked: the stream must be
    the one Vela's encoder writes for the weights it decodes to (WeightStreamError).
    `sparse`: the operation is 2:4 sparse, for which Vela writes RAW codes whatever the
    number of distinct weights."""
    if len(stream) < FWD_HEADER_BITS // 8:
        raise WeightStreamError(f"an FWD stream starts with a 32-byte header; this one has "
                                f"{len(stream)} bytes")
    bits = _bits(stream)
    raw, small = int(bits[0]), int(bits[1])
    width = 8 if raw else 2 if small else 4
    used = FWD_HEADER_BITS + count * width
    if len(bits) < used:
        raise WeightStreamError(f"an FWD stream of {count} {width}-bit codes needs {used} bits; "
                                f"this one has {len(bits)}")
    codes = _field(bits[FWD_HEADER_BITS:used], 0, width) if count else np.zeros(0, np.int64)
    if raw:
        zero_adjust = int(_field(bits[104:112], 0, 8)[0])
        zero_adjust -= 256 if zero_adjust >= 128 else 0
        values = np.where(codes >= 128, codes - 256, codes) - zero_adjust
    else:
        values = _unfold(_field(bits[112:256], 0, 9))[codes]
    canonical = encode_fwd(values, sparse)
    if canonical != bytes(stream):
        raise WeightStreamError(f"the FWD stream is not the one Vela's encoder writes for the "
                                f"{count} weights it decodes to "
                                f"({_first_difference(canonical, bytes(stream))})")
    return values


def decode_stream(stream: bytes, layout: U85WeightLayout, where: str) -> np.ndarray:
    """The weights (int64, in stream order) of one SWD or FWD stream, strictly decoded, exactly
    as many as the decoder consumes."""
    count = weight_order(layout).size
    try:
        if layout.fast:
            return decode_fwd(stream, count, layout.sparse)
        values = mlw.decode(stream, strict=True).astype(np.int64)
    except WeightStreamError as error:
        raise WeightStreamError(f"{where}: {error}") from None
    if values.size != count:
        raise WeightStreamError(f"{where}: the weight stream holds {values.size} weights; the "
                                f"operation consumes {count}")
    canonical = u85_mlw.encode(values)
    if canonical != bytes(stream):
        raise WeightStreamError(f"{where}: the SWD stream is not the one Vela's encoder writes "
                                f"for the {count} weights it decodes to "
                                f"({_first_difference(canonical, bytes(stream))})")
    return values


def _first_difference(ours: bytes, theirs: bytes) -> str:
    a, b = _bits(ours), _bits(theirs)
    size = min(a.size, b.size)
    differ = np.flatnonzero(a[:size] != b[:size])
    at = int(differ[0]) if differ.size else size
    return f"first difference at bit {at} of {b.size}, {a.size} expected"


def decode_weights(streams: list[bytes], layouts: list[U85WeightLayout],
                   where: str) -> np.ndarray:
    """The OHWI int64 weights (zero point removed) an operation's streams carry, one stream
    per core (SWD) or one for all (FWD); a position the order fills with a zero must decode
    to zero."""
    weights = np.zeros(int(np.prod(layouts[0].shape())), dtype=np.int64)
    seen = np.zeros(weights.size, dtype=bool)
    for stream, layout in zip(streams, layouts):
        order = weight_order(layout)
        values = decode_stream(stream, layout, where)
        valid = order >= 0
        if values[~valid].any():
            first = int(np.flatnonzero(values[~valid] != 0)[0])
            raise WeightStreamError(f"{where}: the weight stream holds a non-zero value where "
                                    f"the encoder pads with zeros (padding weight {first})")
        weights[order[valid]] = values[valid]
        seen[order[valid]] = True
    if not seen.all():
        raise UnmodelledCommand(f"{where}: the weight streams leave {int((~seen).sum())} "
                                "weights of the kernel unread")
    return weights.reshape(layouts[0].shape())


def scale_records(ofm_depth: int, ofm_ublock: int) -> int:
    """The number of scale records Vela writes for an OFM of `ofm_depth` channels."""
    return _round_up(ofm_depth, _round_up(ofm_ublock, 16))


def decode_scales(stream: bytes, channels: int, records: int, acc48: bool,
                  where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bias, scale, shift) int64 per OFM channel; the reserved bits and the records past the
    OFM depth must be zero."""
    if len(stream) < records * SCALE_RECORD_BYTES:
        raise WeightStreamError(f"{where}: the scale stream has {len(stream)} bytes, fewer than "
                                f"its {records} records")
    table = np.frombuffer(stream[:records * SCALE_RECORD_BYTES], dtype=np.uint8).reshape(
        records, SCALE_RECORD_BYTES).astype(np.int64)
    if table[channels:].any():
        raise WeightStreamError(f"{where}: a scale record past the OFM's {channels} channels "
                                "is not zero")
    rec = table[:channels]
    if acc48:
        bias = sum(rec[:, i] << (8 * i) for i in range(6))
        bias = np.where(bias >= 1 << 47, bias - (1 << 48), bias)
        scale = rec[:, 6] | (rec[:, 7] << 8)
        reserved = (rec[:, 7] & 0x80) | (rec[:, 8] & 0xC0) | rec[:, 9]
    else:
        bias = sum(rec[:, i] << (8 * i) for i in range(4))
        bias = np.where(bias >= 1 << 31, bias - (1 << 32), bias)
        scale = sum(rec[:, 4 + i] << (8 * i) for i in range(4))
        reserved = (rec[:, 7] & 0x80) | (rec[:, 8] & 0xC0) | rec[:, 9]
    if reserved.any():
        channel = int(np.flatnonzero(reserved)[0])
        raise WeightStreamError(f"{where}: scale record {channel} sets reserved bits")
    return bias, scale, rec[:, 8] & 0x3F
