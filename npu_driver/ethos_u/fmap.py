"""Feature maps in memory: the IFM/IFM2/OFM register groups, tile addressing, NHWC and NHCWB16.

A feature map is described by its region, four tile base addresses, the tile split (HEIGHT0,
HEIGHT1, WIDTH0), the strides and the precision register (element type, size, layout). Element
(y, x, c) of the map lies in tile 0 when x < WIDTH0 and y < HEIGHT0, tile 1 (to the right) when
x >= WIDTH0 and y < HEIGHT1, tile 2 (below tile 0) when x < WIDTH0 and y >= HEIGHT0, tile 3
otherwise; coordinates are taken relative to the tile's origin. Its byte address is

    NHWC:     BASE[t] + y * STRIDE_Y + x * STRIDE_X + c * element_size
    NHCWB16:  BASE[t] + y * STRIDE_Y + x * STRIDE_X + (c // 16) * STRIDE_C + (c % 16) * element_size

(Vela `register_command_stream_util.py::get_address`, regor
`ethos_u55_register_cs_generator.cpp::AddressForCoordinate`/`GetTiles`, the Linux
`ethosu_gem.c::feat_matrix_length`). STRIDE_C is ignored for NHWC (regor notes "Ethos-U55 ignores
channel stride for NHWC tensors"). Strides are signed 32-bit (regor emits negative strides to
reverse an axis).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npu_driver.ethos_u.errors import MemoryFault, UnmodelledCommand

NHWC = 0
NHCWB16 = 1
_SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _s32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


@dataclass(frozen=True)
class Access:
    """One memory access of a traced execution: bytes lowest..highest (inclusive)."""

    command: str  # NPU_OP_* name
    offset: int  # its word offset
    kind: str  # read / write
    region: int  # region number (-1: SHRAM)
    lowest: int
    highest: int
    what: str  # IFM / IFM2 / OFM / weight stream read / scale/bias read / DMA source ...


@dataclass(frozen=True)
class FeatureMap:
    """One feature map as the registers describe it (shape in elements, H x W x C)."""

    name: str  # IFM / IFM2 / OFM
    region: int
    bases: tuple[int, int, int, int]
    height0: int
    height1: int
    width0: int
    stride_x: int
    stride_y: int
    stride_c: int
    signed: bool
    element_size: int
    layout: int

    @property
    def dtype(self) -> np.dtype:
        table = _SIGNED if self.signed else _UNSIGNED
        return np.dtype(table[self.element_size]).newbyteorder("<")

    @property
    def type_range(self) -> tuple[int, int]:
        info = np.iinfo(self.dtype)
        return int(info.min), int(info.max)

    def addresses(self, height: int, width: int, depth: int,
                  y0: int = 0, x0: int = 0, c0: int = 0) -> np.ndarray:
        """Byte addresses of elements [y0, y0+height) x [x0, x0+width) x [c0, c0+depth)."""
        return self._yx(height, width, y0, x0)[:, :, None] + self._coff(depth, c0)[None, None, :]

    def extent(self, height: int, width: int, depth: int) -> tuple[int, int]:
        """Lowest and highest byte of elements [0, height) x [0, width) x [0, depth): an
        address is a tile's (y, x) part plus a channel part, so each is bounded alone."""
        yx = self._yx(height, width, 0, 0)
        coff = self._coff(depth, 0)
        return (int(yx.min() + coff.min()),
                int(yx.max() + coff.max()) + self.element_size - 1)

    def _yx(self, height: int, width: int, y0: int, x0: int) -> np.ndarray:
        y = np.arange(y0, y0 + height, dtype=np.int64)[:, None]
        x = np.arange(x0, x0 + width, dtype=np.int64)[None, :]
        right = x >= self.width0
        below = np.where(right, y >= self.height1, y >= self.height0)
        tile = right.astype(np.int64) + 2 * below.astype(np.int64)
        ty = y - np.where(below, np.where(right, self.height1, self.height0), 0)
        tx = x - np.where(right, self.width0, 0)
        base = np.asarray(self.bases, dtype=np.int64)[tile]
        return base + ty * self.stride_y + tx * self.stride_x  # (H, W)

    def _coff(self, depth: int, c0: int) -> np.ndarray:
        c = np.arange(c0, c0 + depth, dtype=np.int64)
        if self.layout == NHWC:
            return c * self.element_size
        return (c // 16) * self.stride_c + (c % 16) * self.element_size


def feature_map(name: str, region: int, bases, height0_m1: int, height1_m1: int,
                width0_m1: int, stride_x: int, stride_y: int, stride_c: int,
                precision: int, where: str, ofm: bool = False) -> FeatureMap:
    """Decode the precision register (ethosu55_interface.h npu_set_ifm_precision_t: bit 0 type,
    bits 2-3 precision, bits 6-7 format; npu_set_ofm_precision_t: bit 0 type, bits 1-2
    precision, bits 6-7 format) and build the map."""
    signed = bool(precision & 1)
    size_code = (precision >> 1) & 0x3 if ofm else (precision >> 2) & 0x3
    layout = (precision >> 6) & 0x3
    if size_code == 3:
        raise UnmodelledCommand(f"{where}: {name} precision B64 is not modelled")
    if layout not in (NHWC, NHCWB16):
        raise UnmodelledCommand(f"{where}: {name} format {layout} is not NHWC (0) or NHCWB16 (1)")
    return FeatureMap(name, region, tuple(int(b) for b in bases), height0_m1 + 1,
                      height1_m1 + 1, width0_m1 + 1, _s32(stride_x), _s32(stride_y),
                      _s32(stride_c), signed, 1 << size_code, layout)


class Memory:
    """The base-address regions as byte arrays (index = region number), plus the SHRAM."""

    def __init__(self, regions, shram_bytes: int, growable: tuple[int, ...] = ()):
        self.growable = set(growable)  # regions sized by use (a fast scratch of unknown size)
        self.regions = []
        for index, region in enumerate(regions):
            if region is None:
                self.regions.append(None)
                continue
            view = memoryview(region)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            self.regions.append(view)
        self.shram = bytearray(shram_bytes)
        # SHRAM bytes a LUT activation may read: only those a DMA wrote and no kernel clobbered.
        self.shram_valid = np.zeros(shram_bytes, dtype=bool)
        self.read_bytes: dict[int, int] = {}
        self.written_bytes: dict[int, int] = {}
        self.trace: list | None = None  # Access records when tracing
        self.current: tuple[str, int] = ("", -1)  # the command being executed
        self.op_accesses: list[tuple[str, int, int, int]] = []  # the current command's accesses
        self.extent: dict[int, int] = {}  # region -> highest byte touched + 1

    def _record(self, kind: str, region: int, lowest: int, highest: int, what: str) -> None:
        self.op_accesses.append((kind, region, lowest, highest))
        if self.trace is not None:
            self.trace.append(Access(self.current[0], self.current[1], kind, region, lowest,
                                     highest, what))

    def grow(self, region: int, size: int) -> None:
        if region not in self.growable or size <= len(self.regions[region] or b""):
            return
        grown = bytearray(-(-size // 4096) * 4096)
        old = self.regions[region]
        if old is not None:
            grown[:len(old)] = old
        self.regions[region] = memoryview(grown)

    def view(self, region: int, where: str) -> memoryview:
        if region in self.growable and self.regions[region] is None:
            self.grow(region, 1)
        if region < 0 or region >= len(self.regions) or self.regions[region] is None:
            raise MemoryFault(f"{where}: region {region} has no base address (the driver set "
                              f"{len(self.regions)} base addresses)")
        return self.regions[region]

    def _array(self, region: int, where: str, writable: bool) -> np.ndarray:
        view = self.view(region, where)
        if writable and view.readonly:
            raise MemoryFault(f"{where}: region {region} is read-only here, but the command "
                              "writes it")
        return np.frombuffer(view, dtype=np.uint8)

    def _check(self, region: int, lowest: int, highest: int, size: int, where: str, what: str):
        if highest + 1 > self.extent.get(region, 0):
            self.extent[region] = highest + 1
        if lowest < 0 or highest >= size:
            raise MemoryFault(f"{where}: {what} touches bytes {lowest}..{highest} of region "
                              f"{region}, which has {size} bytes")

    def gather(self, fm: FeatureMap, addresses: np.ndarray, where: str) -> np.ndarray:
        """Read elements at byte addresses (any shape) as int64 values."""
        if addresses.size == 0:
            return np.zeros(addresses.shape, dtype=np.int64)
        size = fm.element_size
        self.grow(fm.region, int(addresses.max()) + size)
        data = self._array(fm.region, where, False)
        self._check(fm.region, int(addresses.min()), int(addresses.max()) + size - 1,
                    data.size, where, f"{fm.name} read")
        flat = addresses.reshape(-1)
        if size == 1:
            raw = data[flat]
        else:
            raw = data[flat[:, None] + np.arange(size)].reshape(-1)
        values = raw.view(fm.dtype).astype(np.int64).reshape(addresses.shape)
        self._record("read", fm.region, int(addresses.min()), int(addresses.max()) + size - 1,
                     fm.name)
        self.read_bytes[fm.region] = self.read_bytes.get(fm.region, 0) + flat.size * size
        return values

    def scatter(self, fm: FeatureMap, addresses: np.ndarray, values: np.ndarray, where: str):
        """Write int64 values (already in the element type's range) at byte addresses."""
        if addresses.size == 0:
            return
        size = fm.element_size
        self.grow(fm.region, int(addresses.max()) + size)
        data = self._array(fm.region, where, True)
        self._check(fm.region, int(addresses.min()), int(addresses.max()) + size - 1,
                    data.size, where, f"{fm.name} write")
        flat = addresses.reshape(-1)
        raw = values.reshape(-1).astype(fm.dtype).view(np.uint8)
        if size == 1:
            data[flat] = raw
        else:
            data[(flat[:, None] + np.arange(size)).reshape(-1)] = raw
        self._record("write", fm.region, int(addresses.min()), int(addresses.max()) + size - 1,
                     fm.name)
        self.written_bytes[fm.region] = self.written_bytes.get(fm.region, 0) + flat.size * size

    def read_bytes_at(self, region: int, address: int, length: int, where: str,
                      what: str) -> bytes:
        self.grow(region, address + length)
        view = self.view(region, where)
        self._check(region, address, address + length - 1, len(view), where, what)
        self._record("read", region, address, address + length - 1, what)
        self.read_bytes[region] = self.read_bytes.get(region, 0) + length
        return bytes(view[address:address + length])

    def write_bytes_at(self, region: int, address: int, data: bytes, where: str, what: str):
        self.grow(region, address + len(data))
        view = self.view(region, where)
        if view.readonly:
            raise MemoryFault(f"{where}: region {region} is read-only here, but {what} writes it")
        self._check(region, address, address + len(data) - 1, len(view), where, what)
        view[address:address + len(data)] = data
        self._record("write", region, address, address + len(data) - 1, what)
        self.written_bytes[region] = self.written_bytes.get(region, 0) + len(data)
