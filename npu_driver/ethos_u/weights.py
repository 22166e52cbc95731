"""Weight streams and scale/bias records as the Ethos-U55/U65 weight decoder consumes them.

Weights. A convolution's weight stream (WEIGHT_REGION/WEIGHT_BASE/WEIGHT_LENGTH) is one MLW
bitstream (decoded by `mlw.decode`, checked against Vela's `ethosu.mlw_codec.decode` by the
tests), giving signed 9-bit values (weight minus its zero point). The decoder hands them to the MAC array in a fixed order that
depends only on registers: per OFM block (OFM_BLK_DEPTH channels) - per IFM block (32 channels,
16 for 16-bit IFMs or part-kernel-first traversal; one for depthwise) - per sub-kernel of at most
8x8 taps (4x4 dilated taps when dilated by 2) - [part-kernel-first: per IFM micro-block] - per OFM
micro-block - per kernel tap (padded to a multiple of 4 taps for depthwise and 8-bit
part-kernel-first, 2 for 16-bit part-kernel-first) - [depth-first: per IFM micro-block] - per OFM
channel of the micro-block - per IFM channel of the micro-block. This is the traversal Vela's
encoder produces (`ethosu/mlw_codec/mlw_encode.c::reorder`, called from
`weight_compressor.py::encode_weights`); the model computes the inverse of it as an index map,
from KERNEL_STRIDE (traversal, dilation), the kernel, IFM/OFM depth and block registers and the
configuration's micro-block depths.

Scales. The scale stream (SCALE_REGION/SCALE_BASE/SCALE_LENGTH) holds one 10-byte record per OFM
channel: bias (40-bit signed), scale (32-bit unsigned), shift (6 bits), little endian
(`weight_compressor.py::encode_bias`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from npu_driver.ethos_u import mlw
from npu_driver.ethos_u.errors import UnmodelledCommand

SCALE_RECORD_BYTES = 10


@dataclass(frozen=True)
class WeightLayout:
    ofm_depth: int
    kernel_h: int
    kernel_w: int
    ifm_depth: int  # 1 for depthwise
    ofm_block_depth: int
    depthwise: bool
    part_kernel: bool
    ifm_bits: int
    decomp_h: int
    decomp_w: int
    ifm_ublock: int
    ofm_ublock: int


@lru_cache(maxsize=256)
def weight_order(layout: WeightLayout) -> np.ndarray:
    """For each position of the decoded stream, the flat OHWI index it feeds (-1: padding)."""
    L = layout
    ifm_block_depth = 16 if (L.part_kernel or L.ifm_bits == 16) else 32
    pieces = []
    for ofm_block_z in range(0, L.ofm_depth, L.ofm_block_depth):
        clipped_ofm = min(L.ofm_block_depth, L.ofm_depth - ofm_block_z)
        for ifm_block_z in range(0, 1 if L.depthwise else L.ifm_depth, ifm_block_depth):
            if L.depthwise:
                clipped_ifm = L.ifm_ublock
            elif L.part_kernel:
                clipped_ifm = min(ifm_block_depth, L.ifm_depth - ifm_block_z)
            else:
                clipped_ifm = ifm_block_depth
            for sub_y in range(0, L.kernel_h, L.decomp_h):
                sub_h = min(L.kernel_h - sub_y, L.decomp_h)
                for sub_x in range(0, L.kernel_w, L.decomp_w):
                    sub_w = min(L.kernel_w - sub_x, L.decomp_w)
                    elements = sub_w * sub_h
                    if L.part_kernel:
                        elements = -(-elements // (2 if L.ifm_bits == 16 else 4)) * (
                            2 if L.ifm_bits == 16 else 4)
                    elif L.depthwise:
                        elements = -(-elements // 4) * 4
                    outer = clipped_ifm if L.part_kernel else 1
                    inner = 1 if L.part_kernel else clipped_ifm
                    element = np.arange(elements)
                    kx = element % sub_w
                    ky = element // sub_w
                    inner_blocks = np.arange(0, inner, L.ifm_ublock)
                    ofm_u = np.arange(L.ofm_ublock)
                    ifm_u = np.arange(1 if L.depthwise else L.ifm_ublock)
                    for ifm_outer in range(0, outer, L.ifm_ublock):
                        for ofm_ublk in range(0, clipped_ofm, L.ofm_ublock):
                            # axes: element, inner IFM micro-block, OFM channel, IFM channel
                            e_ky = ky[:, None, None, None]
                            e_kx = kx[:, None, None, None]
                            ifm_z = (ifm_block_z + ifm_outer + inner_blocks[None, :, None, None]
                                     + ifm_u[None, None, None, :])
                            ofm_z = ofm_block_z + ofm_ublk + ofm_u[None, None, :, None]
                            shape = (elements, inner_blocks.size, L.ofm_ublock, ifm_u.size)
                            e_ky, e_kx, ifm_z, ofm_z = np.broadcast_arrays(e_ky, e_kx, ifm_z,
                                                                           ofm_z)
                            wy = sub_y + e_ky
                            wx = sub_x + e_kx
                            valid = (ifm_z < L.ifm_depth) & (ofm_z < L.ofm_depth) & (e_ky < sub_h)
                            flat = ((ofm_z * L.kernel_h + wy) * L.kernel_w + wx) * L.ifm_depth + ifm_z
                            pieces.append(np.where(valid, flat, -1).reshape(-1))
                            assert valid.shape == shape
    order = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    order.setflags(write=False)
    return order


def decode_weights(stream: bytes, layout: WeightLayout, where: str) -> np.ndarray:
    """The OHWI int64 weights (zero point already removed) a weight stream carries."""
    if layout.ofm_block_depth % layout.ofm_ublock and layout.ofm_block_depth < layout.ofm_depth:
        raise UnmodelledCommand(f"{where}: OFM block depth {layout.ofm_block_depth} is not a "
                                f"multiple of the {layout.ofm_ublock}-channel OFM micro-block")
    order = weight_order(layout)
    try:
        values = mlw.decode(stream, needed=order.size).astype(np.int64)
    except mlw.WeightStreamError as error:
        raise mlw.WeightStreamError(f"{where}: {error}") from None
    if values.size < order.size:
        raise UnmodelledCommand(f"{where}: the weight stream decodes to {values.size} weights; "
                                f"the operation consumes {order.size} (the weight decoder would "
                                "stall waiting for more)")
    used = values[:order.size]
    valid = order >= 0
    weights = np.zeros(layout.ofm_depth * layout.kernel_h * layout.kernel_w * layout.ifm_depth,
                       dtype=np.int64)
    weights[order[valid]] = used[valid]
    return weights.reshape(layout.ofm_depth, layout.kernel_h, layout.kernel_w, layout.ifm_depth)


def decode_scales(stream: bytes, channels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bias int64, scale int64, shift int64) per OFM channel from the scale/bias records."""
    records = np.frombuffer(stream[:channels * SCALE_RECORD_BYTES], dtype=np.uint8).reshape(
        channels, SCALE_RECORD_BYTES).astype(np.int64)
    bias = sum(records[:, i] << (8 * i) for i in range(5))
    bias = np.where(bias >= (1 << 39), bias - (1 << 40), bias)
    scale = sum(records[:, 5 + i] << (8 * i) for i in range(4))
    shift = records[:, 9] & 0x3F
    return bias, scale, shift
