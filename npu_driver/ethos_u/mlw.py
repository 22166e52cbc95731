"""The Ethos-U weight decoder's input format (MLW), decoded with every malformed case refused.

Vela's `ethosu.mlw_codec.decode` is the reference decoder for this format, but it is written
for streams Vela made: on a malformed stream it calls exit(1) (bit-buffer underrun) or fails an
assert, taking the whole process down. A tampered payload must instead give an error naming the
command, so the model decodes here and the test suite checks this decoder against
`mlw_codec.decode` on every weight stream it compiles (tests/test_npu_model.py).

Format (as Vela's encoder writes it, `mlw_encode.c`, and its decoder reads it): bits are taken
least-significant first. The stream is a sequence of slices, each with a header

    ZDIV 3 bits     zero-run Golomb-Rice divisor 0..3, 6 = no zero runs, 7 = end of stream
                    (then byte-align; 4 and 5 are invalid)
    SLICELEN 15     number of weight symbols - 1
    WDIV 3          weight Golomb-Rice divisor 0..5, 7 = uncompressed (6 invalid)
    WTRUNC 1        truncated unary (quotients 0..2)
    NEWPAL 1        a palette follows (required for the first slice after an end of stream):
                    DIROFS 5, PALSIZE 5 (+1 when non-zero), PALBITS 3 (+2), PALSIZE entries

and then interleaved chunks: per chunk the weight quotients (12-bit unary map WUNARY0, then one
WUNARY1 bit per set WUNARY0 bit), the zero-run quotients (12-bit, or 8-bit for ZDIV >= 3,
unary), then the remainders of the previous chunk's weight and zero-run symbols. Weights and
zero runs are throttled so neither gets more than 8 symbols ahead. A weight symbol below
PALSIZE indexes the palette, others are symbol - PALSIZE + DIROFS; the value is a
sign-magnitude code (bit 0 sign) of at most 9 bits. Zero runs insert that many zeros after each
weight (and before the first one when the slice has a palette).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from npu_driver.ethos_u.errors import NpuModelError

ZDIV_DISABLE = 6
ZDIV_END = 7
WDIV_UNCOMPRESSED = 7


class WeightStreamError(NpuModelError):
    """A weight stream the NPU's weight decoder cannot decode."""


class _Bits:
    __slots__ = ("data", "pos", "end")

    def __init__(self, data: bytes):
        self.data = bytes(data) + bytes(8)
        self.pos = 0
        self.end = len(data) * 8

    def get(self, n: int, field: str) -> int:
        if n == 0:
            return 0
        pos = self.pos
        if pos + n > self.end:
            raise WeightStreamError(f"the weight stream ends inside its {field} field "
                                    f"(bit {pos} + {n} of {self.end})")
        byte = pos >> 3
        value = (int.from_bytes(self.data[byte:byte + 4], "little") >> (pos & 7)) & ((1 << n) - 1)
        self.pos = pos + n
        return value


def _unary_symbols(bits: int, width: int, carry: int):
    """Quotients from a unary map: each 0 bit ends a symbol (the run of 1s before it)."""
    symbols = []
    count = carry
    for i in range(width):
        if bits >> i & 1:
            count += 1
        else:
            symbols.append(count)
            count = 0
    return symbols, count


def _remainders(bits: _Bits, quotients: list[int], div: int, values: list[int], field: str):
    """Append (q << div) + remainder for each quotient; the remainders are consecutive
    div-bit fields, read at once."""
    if not quotients:
        return
    if div == 0:
        values.extend(quotients)
        return
    count = len(quotients)
    pos = bits.pos
    if pos + count * div > bits.end:
        raise WeightStreamError(f"the weight stream ends inside its {field} field "
                                f"(bit {pos} + {count * div} of {bits.end})")
    byte = pos >> 3
    word = int.from_bytes(bits.data[byte:byte + (count * div + 14) // 8 + 1], "little") >> (pos & 7)
    mask = (1 << div) - 1
    values.extend((q << div) + ((word >> (i * div)) & mask) for i, q in enumerate(quotients))
    bits.pos = pos + count * div


def decode(stream: bytes, needed: int | None = None, *, strict: bool = False) -> np.ndarray:
    """The signed 9-bit weights of `stream` (int16), stopping after the slice that completes
    `needed` weights when given (the decoder reads no further than the weights it must
    deliver). `strict`: every bit is checked, including those the decoder skips, the byte
    alignment after an end of stream, which Vela's encoder fills with ones (as it pads a
    stream with 0xFF end markers), so no bit of a stream can change unseen."""
    return _decode(bytes(stream), needed, strict).copy()


@lru_cache(maxsize=512)
def _decode(stream: bytes, needed: int | None, strict: bool = False) -> np.ndarray:
    bits = _Bits(stream)
    out: list[int] = []
    first = True
    previous_zero_runs = None
    palette: list[int] = []
    palsize = palbits = direct_offset = 0
    while needed is None or len(out) < needed:
        zdiv = bits.get(3, "ZDIV") if bits.pos < bits.end else ZDIV_END
        while zdiv == ZDIV_END:
            skipped = (8 - (bits.pos & 7)) & 7
            if bits.get(skipped, "byte alignment") != (1 << skipped) - 1 and strict:
                raise WeightStreamError(f"the byte alignment after the end of stream at bit "
                                        f"{bits.pos - skipped - 3} is not the encoder's ones")
            first = True
            if bits.pos >= bits.end:
                break
            zdiv = bits.get(3, "ZDIV")
        if zdiv == ZDIV_END:
            break  # end of the stream
        if zdiv not in (0, 1, 2, 3, ZDIV_DISABLE):
            raise WeightStreamError(f"invalid zero-run divisor ZDIV {zdiv} at bit {bits.pos - 3}")
        zero_runs = zdiv != ZDIV_DISABLE
        nvalues = bits.get(15, "SLICELEN") + 1
        wdiv = bits.get(3, "WDIV")
        trunc = bits.get(1, "WTRUNC")
        new_palette = bits.get(1, "NEWPAL")
        if first and not new_palette:
            raise WeightStreamError(f"a slice at bit {bits.pos} starts the stream without a "
                                    "palette")
        if not new_palette and zero_runs != previous_zero_runs:
            raise WeightStreamError(f"a slice at bit {bits.pos} switches zero-run mode without "
                                    "a new palette")
        first = False
        previous_zero_runs = zero_runs
        if new_palette:
            direct_offset = bits.get(5, "DIROFS")
            palsize = bits.get(5, "PALSIZE")
            palsize = palsize + 1 if palsize else 0
            palbits = bits.get(3, "PALBITS") + 2
            palette = [bits.get(palbits, "PALETTE") for _ in range(palsize)]
        if wdiv == WDIV_UNCOMPRESSED:
            uncompressed = True
            wdiv = max(palsize - 1, 0).bit_length() if palsize else palbits
        elif wdiv < 6:
            uncompressed = False
        else:
            raise WeightStreamError(f"invalid weight divisor WDIV {wdiv}")
        z_nvalues = nvalues + (1 if new_palette else 0)
        z_width = 12 if zdiv < 3 else 8
        w_values: list[int] = []
        z_values: list[int] = []
        w_pos = z_pos = 0
        w_carry = z_carry = 0
        w_prev: list[int] = []
        z_prev: list[int] = []
        w_prev_on = z_prev_on = False
        max_symbols = 8 if uncompressed and wdiv > 5 else 12
        while True:
            balance = w_pos - z_pos if zero_runs else 0
            w_on = (balance < 8 or not zero_runs) and w_pos < nvalues
            z_on = balance >= 0 and zero_runs and z_pos < z_nvalues
            w_syms: list[int] = []
            z_syms: list[int] = []
            if w_on:
                unary0 = 0 if uncompressed else bits.get(12, "WUNARY0")
            if z_on:
                z_syms, z_carry = _unary_symbols(bits.get(z_width, "ZUNARY"), z_width, z_carry)
                z_pos += len(z_syms)
            if w_on:
                unary0 &= (1 << max_symbols) - 1
                unary1 = bits.get(bin(unary0).count("1"), "WUNARY1")
                count = w_carry
                for i in range(max_symbols):
                    code = 0
                    if unary0 >> i & 1:
                        code = 1 + (unary1 & 1)
                        unary1 >>= 1
                    count += code
                    if code < 2 or trunc:
                        w_syms.append(count)
                        count = 0
                w_carry = count
                w_pos += len(w_syms)
            if w_prev_on:
                _remainders(bits, w_prev[:nvalues - len(w_values)], wdiv, w_values, "WREMAIN")
            if z_prev_on:
                _remainders(bits, z_prev[:z_nvalues - len(z_values)], zdiv, z_values, "ZREMAIN")
            w_prev, z_prev, w_prev_on, z_prev_on = w_syms, z_syms, w_on, z_on
            if not (w_prev_on or z_prev_on):
                break
        if zero_runs and len(z_values) < z_nvalues:
            raise WeightStreamError("a slice ends before all its zero runs")
        if len(w_values) < nvalues:
            raise WeightStreamError("a slice ends before all its weights")
        if zero_runs and new_palette:
            out.extend([0] * z_values[0])
        z_base = 1 if new_palette else 0
        for i, symbol in enumerate(w_values):
            value = palette[symbol] if symbol < palsize else symbol - palsize + direct_offset
            if value >= 512:
                raise WeightStreamError(f"weight code {value} exceeds the decoder's 9 bits")
            out.append(-(value >> 1) if value & 1 else value >> 1)
            if zero_runs:
                out.extend([0] * z_values[i + z_base])
    result = np.asarray(out, dtype=np.int16)
    result.setflags(write=False)
    return result
