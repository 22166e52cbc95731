"""Weights checked without inputs: every weight and scale stream against the TOSA graph.

A damaged weight byte is seen by executing the stream only when the samples exercise it (a
channel that random weights leave dead hides it). Here each Ethos-U partition's weight data is
checked whatever the inputs: the stream checker (`checker.py`, `u85_checker.py` for the
Ethos-U85) lists every weight and scale stream an operation reads, with the decoder layout its
registers imply; each is traced back through the DMA that copied it to the bytes of the
`.pte`'s weight data (region 0), decoded in its product's format (U55/U65:
`weights.decode_weights`, strictly, `mlw.decode(strict=True)`; U85: `u85_weights`, its SWD
streams one per core and FWD streams, each required to be the stream Vela's encoder writes for
what it decodes to, and its scale records) and compared with the constants of the TOSA graph
Vela was given, as Vela lowers them:

- a CONV2D's OHWI weights, a DEPTHWISE_CONV2D's [KH, KW, C, M] weights as output channel
  c x M + m (an NPU depthwise when M is 1, a convolution of one input channel when C is 1),
  less the weight zero point; an operation may cover a run of the TOSA op's output channels
  (Vela splits the OFM depth into stripes);
- its 10-byte scale records: the TOSA bias, and the multiplier and shift of the RESCALE that
  consumes the convolution (Vela folds that RESCALE into the operation's output scaling).

Every byte of the weight data must then be accounted for: part of a stream that matched,
consumed as data (an IFM or a lookup table: reported as not checked), or padding, which Vela
leaves zero. A stream whose kernel no TOSA constant has (Vela built it: e.g. a MEAN's
weights) is reported as not checked, by name, as is one that shares a TOSA kernel's shape but
differs from every run of its channels in half its weights or more (a LayerNorm's mean, a 1x1x48
kernel of ones, beside a Linear of 48 inputs); a stream that differs from one in fewer, or only
in its scales, fails, naming the command and its word offset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npu_driver.ethos_u import mlw, u85_weights
from npu_driver.ethos_u.checker import SHRAM, StreamCheck, StreamRead
from npu_driver.ethos_u.errors import NpuModelError, where
from npu_driver.ethos_u.u85_weights import U85ScaleLayout, U85WeightLayout
from npu_driver.ethos_u.weights import SCALE_RECORD_BYTES, decode_scales, decode_weights, weight_order
from npu_driver.tosa_twin import main_block

WEIGHTS_REGION = 0
_INT = {3: np.int8, 4: np.int16, 5: np.int32}


class WeightMismatch(NpuModelError):
    """A weight or scale stream, or a padding byte, differs from what the TOSA graph says."""


@dataclass(frozen=True)
class TosaKernel:
    """One TOSA convolution's constants in NPU order: weights (O, KH, KW, I) less their zero
    point, and per output channel the bias, multiplier and shift (None: no RESCALE)."""

    name: str
    weights: np.ndarray
    bias: np.ndarray
    multiplier: np.ndarray | None
    shift: np.ndarray | None


@dataclass(frozen=True)
class WeightReport:
    """What was checked: one line per stream, and the bytes of the weight data by fate."""

    checked: tuple[str, ...]
    unchecked: tuple[str, ...]
    weight_bytes: int
    checked_bytes: int
    padding_bytes: int
    data_bytes: int

    def summary(self) -> str:
        return (f"{len(self.checked)} weight/scale stream(s) equal to the TOSA graph's "
                f"constants, {len(self.unchecked)} not checked; of {self.weight_bytes:,} B of "
                f"weight data {self.checked_bytes:,} B checked, {self.padding_bytes:,} B zero "
                f"padding, {self.data_bytes:,} B not checked (read as data or by a stream "
                f"not checked)")


def tosa_kernels(tosa_bytes: bytes) -> list[TosaKernel]:
    """The CONV2D and DEPTHWISE_CONV2D constants of the graph's main block."""
    return _tosa_graph(tosa_bytes)[0]


def _tosa_graph(tosa_bytes: bytes) -> tuple[list[TosaKernel], list[bytes]]:
    """(the convolutions' constants, the raw bytes of every constant tensor)."""
    from tosa.Op import Op  # lazy: heavy (tosa), as tosa_twin imports it

    block = main_block(tosa_bytes)
    tensors = {block.Tensors(i).Name(): block.Tensors(i) for i in range(block.TensorsLength())}
    ops = [block.Operators(i) for i in range(block.OperatorsLength())]
    rescale_of = {}
    for op in ops:
        if op.Op() == Op.RESCALE:
            rescale_of[op.Inputs(0)] = op

    def const(name: bytes) -> np.ndarray:
        tensor = tensors[name]
        shape = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
        raw = tensor.DataAsNumpy().tobytes() if tensor.DataLength() else b""
        count = int(np.prod(shape)) if shape else 1
        if tensor.Type() == 6:  # INT48: 6-byte little-endian words
            words = np.frombuffer(raw[:6 * count], dtype=np.uint8).reshape(count, 6).astype(
                np.int64)
            value = sum(words[:, i] << (8 * i) for i in range(6))
            return np.where(value >= 1 << 47, value - (1 << 48), value).reshape(shape)
        return np.frombuffer(raw, dtype=_INT[tensor.Type()])[:count].astype(
            np.int64).reshape(shape)

    raw_constants = [tensor.DataAsNumpy().tobytes() for tensor in tensors.values()
                     if tensor.DataLength()]
    kernels = []
    for op in ops:
        if op.Op() not in (Op.CONV2D, Op.DEPTHWISE_CONV2D):
            continue
        weights, bias, weight_zp = (const(op.Inputs(i)) for i in (1, 2, 4))
        if op.Op() == Op.DEPTHWISE_CONV2D:
            kh, kw, c, m = weights.shape
            weights = weights.transpose(2, 3, 0, 1).reshape(c * m, kh, kw, 1)
        channels = weights.shape[0]
        rescale = rescale_of.get(op.Outputs(0))
        multiplier = shift = None
        if rescale is not None:
            multiplier = np.broadcast_to(const(rescale.Inputs(1)).ravel(), (channels,))
            shift = np.broadcast_to(const(rescale.Inputs(2)).ravel(), (channels,))
        kernels.append(TosaKernel(
            tensors[op.Outputs(0)].Name().decode(), weights - weight_zp.ravel()[0],
            np.broadcast_to(bias.ravel(), (channels,)), multiplier, shift))
    return kernels, raw_constants


def check_weights(weight_data: bytes, check: StreamCheck, tosa_bytes: bytes) -> WeightReport:
    """Check every weight and scale stream `check` lists against the TOSA graph; raise
    WeightMismatch naming the command and word offset of the first that differs."""
    try:
        kernels, raw_constants = _tosa_graph(tosa_bytes)
    except Exception as error:  # noqa: BLE001 - a damaged graph file is data, not our bug
        # Nothing to compare with: the TOSA reference model, which runs this graph next in a
        # child process, refuses it (or crashes) in its own words, as verify reports.
        return WeightReport((), (f"every stream: the partition's TOSA graph does not parse "
                                 f"({type(error).__name__})",), len(weight_data), 0, 0,
                            len(weight_data))
    fate = np.zeros(len(weight_data), dtype=np.int8)  # 0 unread, 1 checked, 2 data
    checked, unchecked = [], []
    scales = {read.offset: read for read in check.scales}
    operations: dict[int, list[StreamRead]] = {}
    for read in check.weights:  # an Ethos-U85 operation reads one stream per core (SWD)
        operations.setdefault(read.offset, []).append(read)
    for reads in operations.values():
        read = reads[0]
        w = where(read.command, read.offset)
        sources = [_source(r, check) for r in reads]
        scale = scales.get(read.offset)
        scale_source = _source(scale, check) if scale else None
        if None in sources or (scale is not None and scale_source is None):
            unchecked.append(f"{w}: its weights or scales are not copied from the weight data")
            for r, source in zip(reads, sources):
                _mark_data(fate, r, source, None, None)
            _mark_data(fate, None, None, scale, scale_source)
            continue
        streams = [weight_data[s:s + r.length] for r, s in zip(reads, sources)]
        values = _decode_weights(streams, [r.layout for r in reads], w)
        records = (_decode_scales(weight_data[scale_source:scale_source + scale.length], scale,
                                  w) if scale else None)
        found = _match(values, records, kernels)
        if found is None:
            shaped = [k for k in kernels if _closest(values, k) < 0.5]
            if shaped:
                raise WeightMismatch(
                    f"{w}: its {values.shape[0]} channel(s) of {values.shape[1]}x"
                    f"{values.shape[2]}x{values.shape[3]} weights and scales match no run of "
                    f"channels of the TOSA graph's {', '.join(k.name for k in shaped)}: the "
                    "weight data differs from the graph Vela compiled")
            unchecked.append(f"{w}: no TOSA constant has a {values.shape[1]}x"
                             f"{values.shape[2]}x{values.shape[3]} kernel (Vela made it)")
            for r, source in zip(reads, sources):
                _mark_data(fate, r, source, None, None)
            _mark_data(fate, None, None, scale, scale_source)
            continue
        for r, source in zip(reads, sources):
            fate[source:source + r.length] = 1
        if scale:
            fate[scale_source:scale_source + scale.length] = 1
            _zero_tail(weight_data, scale, scale_source)
        checked.append(f"{w}: {found}")
    for scale in check.scales:
        if scale.offset not in {r.offset for r in check.weights}:
            unchecked.append(f"{where(scale.command, scale.offset)}: scales of a pooling")
            src = _source(scale, check)
            if src is not None:
                fate[src:src + scale.length] = np.maximum(fate[src:src + scale.length], 2)
    _mark_consumed_data(fate, check)
    # Vela (U85) also stores each OP_SCALAR value it writes into the stream, as an int32 in
    # the weight data, and never reads it there: those 4 bytes are the stream's own value
    scalars = [value.to_bytes(4, "little") for value in check.scalars]
    stored = _stored_constants(weight_data, fate, raw_constants + scalars)
    stray = np.flatnonzero((fate == 0) & (np.frombuffer(weight_data, dtype=np.uint8) != 0))
    if stray.size:
        raise WeightMismatch(f"the weight data holds {stray.size} non-zero byte(s) that no "
                             f"command reads (first at byte {int(stray[0])}); Vela leaves "
                             "padding zero")
    checked.extend(stored)
    return WeightReport(tuple(checked), tuple(unchecked), len(weight_data),
                        int((fate == 1).sum()), int((fate == 0).sum()), int((fate == 2).sum()))


def _decode_weights(streams: list[bytes], layouts: list, w: str) -> np.ndarray:
    """The OHWI weights an operation's stream(s) carry, by the product's weight format: one
    MLW stream in the U55/U65 decoder's order, or the U85's SWD/FWD stream(s)."""
    if isinstance(layouts[0], U85WeightLayout):
        try:
            return u85_weights.decode_weights(streams, layouts, w)
        except mlw.WeightStreamError as error:
            raise WeightMismatch(str(error)) from None
    (stream,), (layout,) = streams, layouts
    try:
        total = mlw.decode(stream, strict=True).size
    except mlw.WeightStreamError as error:
        raise WeightMismatch(f"{w}: {error}") from None
    if total != weight_order(layout).size:
        raise WeightMismatch(f"{w}: the weight stream holds {total} weights; the operation "
                             f"consumes {weight_order(layout).size}")
    return decode_weights(stream, layout, w)


def _decode_scales(stream: bytes, scale: StreamRead, w: str):
    """(bias, scale, shift) per OFM channel: the U55/U65's 10-byte records, or the U85's
    (u85_weights.decode_scales: its accumulator format, records rounded up, reserved bits)."""
    if isinstance(scale.layout, U85ScaleLayout):
        try:
            return u85_weights.decode_scales(stream, scale.channels, scale.layout.records,
                                             scale.layout.acc48, w)
        except mlw.WeightStreamError as error:
            raise WeightMismatch(str(error)) from None
    return decode_scales(stream, scale.channels)


def _windows(values: np.ndarray, kernel: TosaKernel):
    """(label, the kernel's weights over that window) for each window of `kernel` a stream of
    `values`' shape can be: the whole kernel, or a part of its taps with all its input
    channels (Vela splits a kernel it cannot stride, the mixed model's 4x4 stride-4
    convolution, into one 1x1 operation per tap, accumulating)."""
    _, h, w, depth = values.shape
    _, kh, kw, kernel_depth = kernel.weights.shape
    if depth != kernel_depth or h > kh or w > kw:
        return
    for y in range(kh - h + 1):
        for x in range(kw - w + 1):
            label = "" if (h, w) == (kh, kw) else f" taps {y}..{y + h - 1} x {x}..{x + w - 1}"
            yield label, kernel.weights[:, y:y + h, x:x + w, :]


def _closest(values: np.ndarray, kernel: TosaKernel) -> float:
    """The smallest share of weights that differ between `values` and a run of `kernel`'s
    channels (over its windows): a damaged stream differs from its kernel in a few (or, with
    equal weights, only in its scales: 0), a kernel Vela built itself that happens to share a
    TOSA kernel's shape (the 1x1x48 ones of a LayerNorm's mean beside a Linear of 48 inputs) in
    nearly all."""
    channels = values.shape[0]
    shares = [float(np.mean(window[first:first + channels] != values))
              for _, window in _windows(values, kernel)
              for first in range(window.shape[0] - channels + 1)]
    return min(shares, default=1.0)


def _match(values: np.ndarray, records, kernels: list[TosaKernel]) -> str | None:
    channels = values.shape[0]
    for kernel in kernels:
        for label, window in _windows(values, kernel):
            for first in range(window.shape[0] - channels + 1):
                span = slice(first, first + channels)
                if not np.array_equal(window[span], values):
                    continue
                if records is not None:
                    bias, scale, shift = records
                    if not np.array_equal(kernel.bias[span], bias):
                        continue
                    if kernel.multiplier is not None and not _same_scale(
                            scale, shift, kernel.multiplier[span], kernel.shift[span]):
                        continue
                return f"{kernel.name} channels {first}..{first + channels - 1}{label}"
    return None


def _stored_constants(weight_data: bytes, fate: np.ndarray, constants: list[bytes]) -> list[str]:
    """Runs of bytes no command reads that hold TOSA constants (or the stream's OP_SCALAR
    values) whole, each from a 16-byte boundary (Vela's tensor alignment) and followed by zeros
    to the next: Vela stores a constant the stream takes another way (as IFM2_SCALAR, OP_SCALAR
    on the U85) all the same. Marked checked; a run holding anything else stays unread."""
    found = []
    unread = np.flatnonzero(fate == 0)
    if not unread.size:
        return found
    starts = unread[np.r_[True, np.diff(unread) > 1]]
    ends = unread[np.r_[np.diff(unread) > 1, True]] + 1
    by_length = sorted({c for c in constants if c}, key=len, reverse=True)
    for start, end in zip(starts.tolist(), ends.tolist()):
        if not any(weight_data[start:end]):
            continue
        held, position = [], start
        while position < end and any(weight_data[position:end]):
            slot_end = min(-(-(position + 1) // 16) * 16, end)
            constant = next((c for c in by_length if position + len(c) <= end
                             and weight_data[position:position + len(c)] == c), None)
            if constant is not None:
                stop = min(-(-(position + len(constant)) // 16) * 16, end)
                if any(weight_data[position + len(constant):stop]):
                    break
                held.append(len(constant))
                position = stop
            elif not any(weight_data[position:slot_end]):
                position = slot_end
            else:
                break
        else:
            fate[start:end] = 1
            found.append(f"weight data bytes {start}..{end - 1}: {len(held)} TOSA constant(s) "
                         f"or OP_SCALAR value(s) ({', '.join(f'{n} B' for n in held)}) no "
                         "command reads, then zeros")
    return found


def _same_scale(scale, shift, multiplier, tosa_shift) -> bool:
    """The record's scale x 2**-shift is the RESCALE's multiplier x 2**-shift with the
    multiplier's low bits dropped: Vela lowers a TOSA scale to fewer significant bits (DS-CNN:
    1545767504 >> 40 becomes 96610469 >> 36), exactly or rounded to nearest."""
    drop = np.asarray(tosa_shift, dtype=np.int64) - shift
    if (drop < 0).any():
        return False
    multiplier = np.asarray(multiplier, dtype=np.int64)
    exact = (scale << drop) == multiplier
    half = np.where(drop > 0, np.int64(1) << np.maximum(drop - 1, 0), 0)
    rounded = ((multiplier + half) >> drop) == scale
    return bool((exact | rounded).all())


def _zero_tail(weight_data: bytes, scale: StreamRead, source: int) -> None:
    tail = weight_data[source + scale.channels * SCALE_RECORD_BYTES:source + scale.length]
    if any(tail):
        raise WeightMismatch(f"{where(scale.command, scale.offset)}: the scale stream's bytes "
                             "after its records are not zero")


def _source(read: StreamRead, check: StreamCheck) -> int | None:
    """The weight-data offset `read`'s bytes come from: in place (region 0), or the source of
    the last DMA from region 0 that wrote all of them, with nothing written there since."""
    if read.region == WEIGHTS_REGION:
        return read.base
    last = read.base + read.length - 1
    writer = None
    for access in check.accesses:
        if access.offset >= read.offset:
            break
        if (access.kind == "write" and access.region == read.region
                and access.lowest <= last and access.highest >= read.base):
            writer = access
    if writer is None or writer.what != "DMA destination":
        return None
    dma = next(d for d in check.dmas if d.offset == writer.offset)
    if (dma.src_region != WEIGHTS_REGION or dma.length < 0 or dma.dst > read.base
            or dma.dst + dma.length < read.base + read.length):
        return None
    return dma.src + read.base - dma.dst


def _mark_data(fate, read, source, scale, scale_source) -> None:
    """Mark a stream's bytes (and its scales', when given) read as data, not checked."""
    for stream, start in ((read, source), (scale, scale_source)):
        if stream is not None and start is not None:
            fate[start:start + stream.length] = np.maximum(fate[start:start + stream.length], 2)


def _mark_consumed_data(fate: np.ndarray, check: StreamCheck) -> None:
    """Weight-data bytes an IFM, IFM2, a gather's indices or lookup table reads, in place or
    through a DMA. A tensor read in place is data up to the next 16-byte boundary: Vela
    allocates constant tensors in 16-byte units and fills the whole allocation (a PAD's fill,
    e.g. 128 B of the zero point for 126 B read: ExecuTorch's pad_rank4_all_dims on U85-256)."""
    for access in check.accesses:
        if access.what not in ("IFM", "IFM2", "DMA index"):
            continue
        read = StreamRead(access.command, access.offset, access.region, access.lowest,
                          access.highest - access.lowest + 1, None, 0)
        source = _source(read, check)
        if source is not None:
            end = source + read.length
            if access.region == WEIGHTS_REGION:
                end = min(len(fate), -(-end // 16) * 16)
            span = slice(source, end)
            fate[span] = np.maximum(fate[span], 2)
    for dma in check.dmas:
        if dma.src_region == WEIGHTS_REGION and dma.dst_region == SHRAM and dma.length > 0:
            span = slice(dma.src, dma.src + dma.length)
            fate[span] = np.maximum(fate[span], 2)
