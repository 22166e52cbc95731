"""The Ethos-U delegate payload of a `.pte`: command stream, weights, scratch size and IO layout.

The format is the `vela_bin_stream` that ExecuTorch's `backends/arm/arm_vela.py::vela_compile`
writes and `backends/arm/runtime/VelaBinStream.cpp::vela_bin_read` reads on the device: a run of
blocks, each a 32-byte header (16-byte NUL-padded name, uint32 unpadded length, uint8 external
flag, 11 reserved bytes) followed by the data padded to 16 bytes. The stream opens with the
`vela_bin_stream` block and closes with `vela_end_stream`; in between come `cmd_data`,
`weight_data`, `scratch_size` (uint32) and `inputs`/`outputs` (int32 count, then per tensor a
6-D shape, element size, byte offset into the scratch region and region number, all int32).

The parser accepts exactly what the device reader accepts and refuses the rest with the reason,
so a payload the twin runs is one the firmware would load.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass


BLOCK_HEADER = struct.Struct("<16sIB11s")
BLOCK_ALIGNMENT_BYTES = 16
VELA_SHAPE_DIMS = 6
_IO_STRUCT = struct.Struct("<9i")
_STREAM_HEADER = "vela_bin_stream"
_STREAM_FOOTER = "vela_end_stream"
_KNOWN_BLOCKS = ("cmd_data", "weight_data", "scratch_size", "inputs", "outputs")
# VelaBinStream.cpp accepts only command streams that start with the driver's magic.
_COMMAND_STREAM_MAGICS = (b"COP1", b"COP2")


class PayloadError(ValueError):
    """A delegate payload the device's `vela_bin_read` would reject."""


@dataclass(frozen=True)
class VelaIO:
    """One delegate input or output as the device sees it: a slice of the Ethos-U scratch."""

    shape6d: tuple[int, ...]
    elem_size: int  # bytes per element
    offset: int  # bytes from the start of the region
    region: int  # Ethos-U base-address index (1 = scratch in ExecuTorch's runtime)

    @property
    def elements(self) -> int:
        return math.prod(self.shape6d)

    @property
    def nbytes(self) -> int:
        return self.elements * self.elem_size


@dataclass(frozen=True)
class EthosUPayload:
    """A parsed `vela_bin_stream`."""

    cmd_bytes: bytes
    weight_bytes: bytes
    scratch_bytes: int  # Ethos-U scratch the runtime allocates from its temp allocator
    inputs: tuple[VelaIO, ...]
    outputs: tuple[VelaIO, ...]


def _padded(length: int) -> int:
    return -(-length // BLOCK_ALIGNMENT_BYTES) * BLOCK_ALIGNMENT_BYTES


def _blocks(data: bytes) -> list[tuple[str, bytes]]:
    blocks = []
    position = 0
    while position < len(data):
        if position + BLOCK_HEADER.size > len(data):
            raise PayloadError(f"truncated block header at byte {position} of {len(data)}")
        raw_name, length, external, _reserved = BLOCK_HEADER.unpack_from(data, position)
        name = raw_name.split(b"\0", 1)[0].decode("ascii", errors="replace")
        start = position + BLOCK_HEADER.size
        if start + length > len(data):
            raise PayloadError(f"block '{name}' claims {length} bytes but the payload ends at "
                               f"{len(data)}")
        if external:
            # The block holds a named-data key; the bytes live outside the payload.
            raise PayloadError(f"block '{name}' is stored as external named data; compile with "
                               "the Vela blocks inline (the twin reads the .pte alone)")
        blocks.append((name, data[start:start + length]))
        position = start + _padded(length)
    return blocks


def _ios(block: bytes, which: str) -> tuple[VelaIO, ...]:
    if len(block) < 4:
        raise PayloadError(f"'{which}' block is {len(block)} bytes; it needs at least a count")
    (count,) = struct.unpack_from("<i", block, 0)
    if len(block) < 4 + count * _IO_STRUCT.size:
        raise PayloadError(f"'{which}' block lists {count} tensors but holds {len(block)} bytes")
    ios = []
    for index in range(count):
        fields = _IO_STRUCT.unpack_from(block, 4 + index * _IO_STRUCT.size)
        ios.append(VelaIO(tuple(fields[:VELA_SHAPE_DIMS]), *fields[VELA_SHAPE_DIMS:]))
    return tuple(ios)


def parse_payload(data: bytes) -> EthosUPayload:
    """Parse an EthosUBackend delegate payload as `VelaBinStream.cpp::vela_bin_read` does."""
    if len(data) % BLOCK_ALIGNMENT_BYTES:
        raise PayloadError(f"payload is {len(data)} bytes, not a multiple of 16")
    blocks = _blocks(data)
    if not blocks or blocks[0][0] != _STREAM_HEADER:
        raise PayloadError(f"payload does not start with a '{_STREAM_HEADER}' block")
    if blocks[-1][0] != _STREAM_FOOTER:
        raise PayloadError(f"payload does not end with a '{_STREAM_FOOTER}' block")
    named = {}
    for name, body in blocks[1:-1]:
        if name not in _KNOWN_BLOCKS:
            raise PayloadError(f"unknown block '{name}' (the device reader rejects it)")
        named[name] = body
    missing = [name for name in _KNOWN_BLOCKS if name not in named]
    if missing:
        raise PayloadError(f"payload lacks block(s) {', '.join(missing)}")
    if named["cmd_data"][:4] not in _COMMAND_STREAM_MAGICS:
        raise PayloadError("command stream does not start with COP1/COP2")
    (scratch,) = struct.unpack_from("<I", named["scratch_size"], 0)
    return EthosUPayload(bytes(named["cmd_data"]), bytes(named["weight_data"]), int(scratch),
                         _ios(named["inputs"], "inputs"), _ios(named["outputs"], "outputs"))
