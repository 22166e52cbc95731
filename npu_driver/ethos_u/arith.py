"""Integer arithmetic of the Ethos-U55/U65 output stage: scale, shift, round, saturate.

`scale_shift(value, scale, shift, mode)` computes round(value * scale / 2**shift) with the
rounding the OFM_PRECISION (or IFM_PRECISION for operand scaling) register selects
(ethosu55_interface.h `round_mode`: DBL = 0, TRUNCATE = 1, NATURAL = 2; Vela calls DBL "TFL"):

- NATURAL: add 2**(shift-1) then shift right arithmetically (round half towards +infinity); this
  is TOSA's `apply_scale_32(..., double_round=false)` (RESCALE rounding_mode SINGLE_ROUND).
- DBL: as NATURAL, plus a second rounding term of +-2**30 when shift > 31 (sign of the value):
  TOSA's double_round, the fixed-point TFLite SaturatingRoundingDoublingHighMul +
  RoundingDivideByPOT pair folded into one shift.
- TRUNCATE: the exact quotient rounded towards zero.

Products are exact (Python integers when they could exceed 62 bits).
"""

from __future__ import annotations

import numpy as np

from npu_driver.ethos_u.errors import UnmodelledCommand

ROUND_DBL = 0
ROUND_TRUNCATE = 1
ROUND_NATURAL = 2
ROUND_NAMES = {ROUND_DBL: "DBL", ROUND_TRUNCATE: "TRUNCATE", ROUND_NATURAL: "NATURAL"}
# DBL with a double-rounding shift d (the Ethos-U85's dbl_rnd field, 1..30): the mode value
# ROUND_DBL_SHIFTED + d. regor's own reference (compiler/graphir_optimiser.cpp `Scale`): natural
# rounding plus sign x 2**(30 - d) where the shift exceeds 31 - d; d = 0 is ROUND_DBL.
ROUND_DBL_SHIFTED = 16


def double_rounding(mode: int) -> tuple[int, int]:
    """(the base mode, its double-rounding shift) of a mode value."""
    return (ROUND_DBL, mode - ROUND_DBL_SHIFTED) if mode >= ROUND_DBL_SHIFTED else (mode, 0)


def _fits(values: np.ndarray, scale) -> bool:
    vmax = int(np.abs(values).max()) if values.size else 0
    smax = int(np.abs(np.asarray(scale)).max()) if np.size(scale) else 0
    return vmax * max(smax, 1) < (1 << 61)


def scale_shift(values: np.ndarray, scale, shift, mode: int) -> np.ndarray:
    """round(values * scale / 2**shift); `scale`/`shift` scalars or arrays broadcastable to values."""
    values = np.asarray(values, dtype=np.int64)
    scale = np.asarray(scale, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    if _fits(values, scale):
        product = values * scale
        return _round_shift(product, shift, mode)
    product = values.astype(object) * scale.astype(object)
    result = _round_shift_object(product, np.broadcast_to(shift, product.shape), mode)
    return result


def _round_shift(product: np.ndarray, shift: np.ndarray, mode: int) -> np.ndarray:
    shift = np.broadcast_to(shift, product.shape)
    mode, double = double_rounding(mode)
    if mode == ROUND_TRUNCATE:
        magnitude = np.abs(product) >> shift
        return np.where(product < 0, -magnitude, magnitude)
    rounding = np.where(shift > 0, np.left_shift(np.int64(1), np.maximum(shift - 1, 0)), 0)
    if mode == ROUND_DBL:
        nudge = 1 << (30 - double)
        rounding = rounding + np.where(shift > 31 - double,
                                       np.where(product >= 0, nudge, -nudge), 0)
    # product + rounding stays below 2**62 by _fits; shifts of 63 give 0 or -1 as hardware would
    return (product + rounding) >> shift


def _round_shift_object(product: np.ndarray, shift: np.ndarray, mode: int) -> np.ndarray:
    out = np.empty(product.shape, dtype=object)
    flat_p, flat_s, flat_o = product.reshape(-1), shift.reshape(-1), out.reshape(-1)
    mode, double = double_rounding(mode)
    for i in range(flat_p.size):
        p, s = int(flat_p[i]), int(flat_s[i])
        if mode == ROUND_TRUNCATE:
            q = abs(p) >> s
            flat_o[i] = -q if p < 0 else q
            continue
        r = (1 << (s - 1)) if s > 0 else 0
        if mode == ROUND_DBL and s > 31 - double:
            r += (1 << (30 - double)) if p >= 0 else -(1 << (30 - double))
        flat_o[i] = (p + r) >> s
    return out


def saturate(values: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Clamp (object or int64 arrays) into [lo, hi] and return int64."""
    if values.dtype == object:
        values = np.clip(values, lo, hi).astype(np.int64)
        return values
    return np.clip(values, lo, hi)


def bit_operation(mode: str, a, b, element_size: int, rounding: int, w: str) -> np.ndarray:
    """SHR, SHL and CLZ on 32-bit operands (the zero points already taken off): SHR an
    arithmetic shift right by IFM2 rounded as OFM_PRECISION says (NATURAL: half up), SHL a
    shift left saturated to int32 at the output, CLZ the leading zeros of the 32-bit value
    (32 for 0). Shift amounts outside 0..31 are refused, as is another operand width: what
    the hardware does there is not documented here. Checked against TFLM's softmax, which
    Vela builds from them, byte for byte (tests/test_compare.py); `w` names the command in a
    refusal. The Ethos-U55/U65 and U85 models both use it."""
    if element_size != 4:
        raise UnmodelledCommand(f"{w}: elementwise {mode.upper()} on {8 * element_size}-bit "
                                "operands (modelled on 32-bit ones)")
    a = np.asarray(a, dtype=np.int64)
    if mode == "clz":
        unsigned = np.where(a < 0, a + (1 << 32), a).astype(np.uint64)
        lengths = np.zeros(unsigned.shape, dtype=np.int64)
        remaining = unsigned.copy()
        while np.any(remaining):
            lengths += remaining != 0
            remaining >>= np.uint64(1)
        return 32 - lengths
    b = np.asarray(b, dtype=np.int64)
    if b.size and (int(b.min()) < 0 or int(b.max()) > 31):
        raise UnmodelledCommand(f"{w}: elementwise {mode.upper()} by {int(b.min())}.."
                                f"{int(b.max())} (modelled for 0..31)")
    if mode == "shl":
        return a << b
    return scale_shift(a, 1, b, rounding)
