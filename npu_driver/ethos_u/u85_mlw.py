"""The MLW stream Vela 5.1 writes for an Ethos-U85 SWD operation, computed from its weights.

The U85's standard weight decoder reads the U55/U65's MLW format (`mlw.py`), but several bit
patterns decode to the same weights: a zero written as +0 or -0, WTRUNC in a slice whose
quotients never reach 2 or that is uncompressed, unary bits past a slice's last weight at the
end of the stream, another choice of slices or divisors. A changed bit of that kind alters no
weight, so comparing the decoded weights with the TOSA graph cannot see it; comparing the
stream with the one Vela's encoder writes for the decoded weights does. This module computes
that stream: the U85 weight check (weight_check.py) decodes a stream, encodes what it decoded
and requires the same bytes, so every bit is accounted for.

The encoder's decisions, as Vela 5.1's regor `mlw_codec` (ETHOSU syntax) makes them for one
section of weights (a stream of fewer than 131,072 weights is one section):

- zero runs: used when runs of two or more zeros hold at least half the zeros and zeros are
  more than 5 times as frequent as the most frequent other value;
- palette: the values by descending frequency (ties: the larger folded code first), at most
  32 (fewer when a large direct code must stay below 512); used when it covers at least half
  the weights; a one-entry palette is padded with a 0 entry; DIROFS is the first folded code
  0..30 that occurs; PALBITS the width of the largest entry (or, without a palette, of the
  largest folded weight), at least 2;
- the weight codes: a palette index, or the folded value (magnitude << 1 | sign) shifted past
  the palette by PALSIZE - DIROFS, zero taking the code of -0;
- slices and divisors: a greedy forward search over the 13 weight (and 4 zero-run) Golomb-Rice
  configurations, counting the bits each would spend and switching when another saves more
  than a 40-bit slice header, the earlier configuration kept when a later one was better from
  the start of its run;
- then each slice as `mlw.py` reads it, unused unary positions zero, a ZDIV 7 end of stream,
  ones to the byte and 0xFF bytes to 16.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

_W_CONFIGS = (0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x20)
_Z_CONFIGS = (0x00, 0x01, 0x02, 0x03)
_HEADER_COST_BITS = 40
_MAX_SLICE = (1 << 15) - 1
SECTION_WEIGHTS = 131072  # weights the encoder takes per section (the weight source's chunk)


class _Writer:
    def __init__(self):
        self.fields: list[tuple[int, int]] = []
        self.bits = 0

    def put(self, width: int, value: int) -> None:
        if width:
            self.fields.append((value & ((1 << width) - 1), width))
            self.bits += width

    def data(self) -> bytes:
        value = 0
        shift = 0
        for field, width in self.fields:
            value |= field << shift
            shift += width
        return value.to_bytes((shift + 7) // 8, "little")


class _Palette:
    """The palette decisions for one section."""

    def __init__(self, weights: np.ndarray):
        counts = np.bincount(weights + 256, minlength=512)
        zeros = int(counts[256])
        is_zero = np.r_[weights == 0, False]
        # lengths of the runs of zeros
        edges = np.flatnonzero(np.diff(np.r_[0, is_zero.astype(np.int8)]))
        runs = edges[1::2] - edges[0::2]
        in_runs = int(runs[runs >= 2].sum())
        others = np.delete(counts, 256)
        self.zero_runs = in_runs >= zeros // 2 and zeros > 5 * int(others.max(initial=0))
        values = np.arange(-255, 256)
        codes = (np.abs(values) << 1) | (values < 0)
        freq = counts[values + 256].copy()
        if self.zero_runs:
            freq[255] = 0  # zeros are coded as runs
        total = int(freq.sum())
        self.only_zeros = total == 0
        used = codes[freq > 0]
        largest = int(used.max()) if used.size else 0
        by_code = np.zeros(512, dtype=np.int64)
        by_code[codes] = freq
        self.direct_offset = 0
        if total:
            present = np.flatnonzero(by_code[:31])
            self.direct_offset = int(present[0]) if present.size else 31
        order = sorted(range(512), key=lambda code: (int(by_code[code]), code), reverse=True)
        only_palette = by_code[order[0]] > 0 and by_code[order[32]] == 0
        limit = 32 if only_palette else min(32, 511 - largest)
        if limit == 1:
            limit = 0
        lut = []
        covered = 0
        for code in order[:limit]:
            if by_code[code] == 0:
                break
            lut.append(code)
            covered += int(by_code[code])
        width_of = max(lut, default=0)
        if len(lut) == 1:
            lut.append(0)
        if covered >= total // 2:
            self.lut = lut
        else:
            self.lut = []
            width_of = largest
        self.palbits = max(2, int(width_of).bit_length())
        self.only_palette = bool(only_palette)
        size = len(self.lut)
        if self.only_palette:
            self.uncompressed_bits = max(size - 1, 0).bit_length()
        elif size == 0:
            self.uncompressed_bits = self.palbits
        else:
            self.uncompressed_bits = 0
        # weight -> code
        inverse = np.zeros(512, dtype=np.int64)
        start = size - self.direct_offset
        for i in range(256):
            inverse[256 + i] = start + 2 * i
            inverse[256 - i] = start + 2 * i + 1
        inverse[0] = 0
        for index, code in enumerate(self.lut):
            inverse[256 + (-(code >> 1) if code & 1 else code >> 1)] = index
        self.inverse = inverse


def _search(values: list[int], zero_runs_mode: bool, uncompressed_bits: int
            ) -> list[tuple[int, int]]:
    """[(configuration index, end position)] of the slices the greedy search chooses."""
    configs = _Z_CONFIGS if zero_runs_mode else _W_CONFIGS
    n = len(configs)
    counts = [0] * n
    reset = [0] * n
    coded = [False] * n
    uncompressed_cost = uncompressed_bits if uncompressed_bits > 0 else 100
    active_count = 0
    active = -1
    result: list[list[int]] = []
    for i, value in enumerate(values):
        best_count = 0x7FFFFFFF
        best = 0
        for j, config in enumerate(configs):
            div, trunc = config & 15, config >> 4
            q = value >> div
            bits = min(q + 1, 2) + div if trunc else q + 1 + div
            can = not (not zero_runs_mode and ((trunc and q > 2) or q > 31))
            if trunc == 2:
                bits, can = uncompressed_cost, True
            if can:
                if not coded[j]:
                    counts[j] = active_count
                counts[j] += bits
                if counts[j] < best_count:
                    best_count, best = counts[j], j
            else:
                reset[j] = i + 1
                counts[j] += _HEADER_COST_BITS
            coded[j] = can
        must = active == -1 or not coded[active]
        if must or (best != active and best_count + _HEADER_COST_BITS < active_count):
            if active != -1:
                if counts[best] < counts[active] and reset[best] <= reset[active]:
                    active = best
                else:
                    result.append([active, i])
            active = best
        active_count = counts[active]
    if not result or result[-1][0] != active:
        result.append([active, 0])
    result[-1][1] = len(values)
    return [(config, end) for config, end in result]


def _slice(out: _Writer, palette: _Palette, weights: list[int], zeros: list[int] | None,
           new_palette: bool, w_config: int, z_config: int) -> None:
    w_cnt = len(weights)
    z_cnt = (w_cnt + (1 if new_palette else 0)) if zeros is not None else 0
    trunc = (_W_CONFIGS[w_config] >> 4) == 1
    uncompressed = (_W_CONFIGS[w_config] >> 4) == 2
    z_div = _Z_CONFIGS[z_config] & 15
    w_div = palette.uncompressed_bits if uncompressed else _W_CONFIGS[w_config] & 15
    out.put(3, z_div if palette.zero_runs else 6)
    out.put(15, w_cnt - 1)
    out.put(3, 7 if uncompressed else w_div)
    out.put(1, int(trunc))
    out.put(1, int(new_palette))
    if new_palette:
        out.put(5, palette.direct_offset)
        out.put(5, max(0, len(palette.lut) - 1))
        out.put(3, palette.palbits - 2)
        for code in palette.lut:
            out.put(palette.palbits, code)
    z_width = 12 if z_div < 3 else 8
    w_pos = z_pos = 0
    w_q, w_r, z_q, z_r = -1, 0, -1, 0
    w_prev: list[int] = []
    z_prev: list[int] = []
    w_prev_on = z_prev_on = False
    while True:
        balance = w_pos - z_pos if palette.zero_runs else 0
        w_on = balance < 8 and w_pos < w_cnt
        z_on = balance >= 0 and palette.zero_runs and z_pos < z_cnt
        w_rem: list[int] = []
        z_rem: list[int] = []
        if w_on:
            unary0 = unary1 = unary1_len = 0
            j = 0
            limit = 8 if (uncompressed and w_div > 5) else 12
            while j < limit:
                if w_q < 0:
                    if w_pos < w_cnt:
                        w_q, w_r = weights[w_pos] >> w_div, weights[w_pos] & ((1 << w_div) - 1)
                    else:
                        w_q, w_r = 0, -1
                while w_q >= 0 and j < limit:
                    if w_q > 0:
                        unary0 |= 1 << j
                        unary1 |= (1 << unary1_len) if w_q > 1 else 0
                        unary1_len += 1
                    j += 1
                    w_q -= 3 if trunc else 2
                if w_q < 0 and w_r >= 0:
                    w_rem.append(w_r)
                    w_pos += 1
        if z_on:
            z_unary = 0
            j = 0
            while j < z_width:
                if z_q < 0:
                    if z_pos < z_cnt:
                        z_q, z_r = zeros[z_pos] >> z_div, zeros[z_pos] & ((1 << z_div) - 1)
                    else:
                        z_q, z_r = 0, -1
                while z_q >= 0 and j < z_width:
                    z_unary |= (1 << j) if z_q > 0 else 0
                    j += 1
                    z_q -= 1
                if z_q < 0 and z_r >= 0:
                    z_rem.append(z_r)
                    z_pos += 1
        if w_on and not uncompressed:
            out.put(12, unary0)
        if z_on:
            out.put(z_width, z_unary)
        if w_on and not uncompressed and unary1_len:
            out.put(unary1_len, unary1)
        if w_prev_on:
            for r in w_prev:
                out.put(w_div, r)
        if z_prev_on and z_div:
            for r in z_prev:
                out.put(z_div, r)
        w_prev, z_prev, w_prev_on, z_prev_on = w_rem, z_rem, w_on, z_on
        if not (w_prev_on or z_prev_on):
            break


def _section(out: _Writer, weights: np.ndarray) -> None:
    palette = _Palette(weights)
    only_zeros = palette.only_zeros
    codes: list[int] = []
    runs: list[int] = []
    values = weights.tolist()
    i = 0
    while True:
        if palette.zero_runs:
            run = 0
            if not only_zeros or i > 0:
                while i < len(values) and values[i] == 0:
                    run += 1
                    i += 1
            runs.append(run)
        if i == len(values):
            break
        codes.append(int(palette.inverse[values[i] + 256]))
        i += 1
    w_slices = _search(codes, False, palette.uncompressed_bits) if codes else []
    z_slices = _search(runs, True, 0) if palette.zero_runs else []
    pos = w_index = z_index = 0
    new_palette = True
    zero_pass = bool(runs)
    while pos < len(codes) or new_palette or zero_pass:
        w_len = min(w_slices[w_index][1] - pos, _MAX_SLICE) if w_index < len(w_slices) else 0
        z_len = min(z_slices[z_index][1] - pos, _MAX_SLICE) if z_index < len(z_slices) else 0
        zeros = runs[pos + (0 if new_palette else 1):] if palette.zero_runs else None
        _slice(out, palette, codes[pos:pos + w_len] if w_len else [],
               zeros if (zeros is not None and z_len) else None, new_palette,
               w_slices[w_index][0] if w_len else 0,
               z_slices[z_index][0] if palette.zero_runs else 0)
        new_palette = False
        if z_len <= 0 < w_len:
            pos += w_len
        elif w_len <= 0 < z_len:
            pos += z_len
        else:
            pos += min(z_len, w_len)
        if w_index < len(w_slices) and w_slices[w_index][1] <= pos:
            w_index += 1
        if z_index < len(z_slices) and z_slices[z_index][1] <= pos:
            z_index += 1
        zero_pass = False


@lru_cache(maxsize=512)
def _encode(weights: bytes) -> bytes:
    values = np.frombuffer(weights, dtype=np.int16).astype(np.int64)
    out = _Writer()
    for start in range(0, values.size, SECTION_WEIGHTS):
        _section(out, values[start:start + SECTION_WEIGHTS])
    out.put(3, 7)  # end of stream
    out.put((8 - out.bits % 8) % 8, 0xFF)
    data = out.data()
    return data + b"\xff" * ((-len(data)) % 16)


def encode(weights: np.ndarray) -> bytes:
    """The stream Vela 5.1's encoder writes for `weights` (signed, -255..255)."""
    return _encode(np.asarray(weights, dtype=np.int16).tobytes())
