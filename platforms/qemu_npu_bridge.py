"""The host side of the runner's NPU bridge: Ethos-U invocations handed over semihosting.

QEMU's Corstone-300 (mps3-an547) models no Ethos-U. The NPU build of the runner firmware links
ExecuTorch's EthosUBackend and the real Ethos-U core driver, and replaces only the driver's
register level (runner/npu/ethosu_bridge.c): where the NPU would be started, the firmware writes
a request to the host file `orchestrate-npu-req` and reads the reply from `orchestrate-npu-rep`.
Both are FIFOs this module creates in QEMU's working folder (semihosting opens host paths
relative to it). One message per open: the writer closes the FIFO after the message, so the
reader sees its end.

The protocol (runner/npu/npu_bridge.h; little-endian uint32 fields):

    request: magic "ONPQ", version, sequence (1, 2, ...), payload_bytes, stream_offset,
             stream_words, region_count, region_count x region size; the custom-operator payload
             (COP1 header and commands, as ethosu_invoke_v3 received it); each region's bytes.
    reply:   magic "ONPR", version, the request's sequence, status (0 = done), region_count,
             region_count x bytes written back (0 or the region's size); those regions' bytes.

The NPU computation is a callable the caller passes (`NpuHandler`): platforms/ cannot import the
functional model (npu_driver/); orchestrator/device_runs/qemu_npu.py supplies it. This module
checks every request (magic, version, the expected sequence number, sizes) and refuses a stale
or foreign one with `BridgeProtocolError`, naming what was wrong.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REQUEST_MAGIC = 0x51504E4F  # "ONPQ"
REPLY_MAGIC = 0x52504E4F  # "ONPR"
VERSION = 1
REQUEST_FILE = "orchestrate-npu-req"
REPLY_FILE = "orchestrate-npu-rep"
MAX_REGIONS = 8
# The regions the NPU writes (EthosUBackend_Cortex_M.cpp: 0 weights, 1 scratch, 2 fast scratch).
WEIGHTS, SCRATCH, FAST_SCRATCH = 0, 1, 2
WRITABLE_REGIONS = (SCRATCH, FAST_SCRATCH)

_REQUEST_HEAD = struct.Struct("<7I")
_REPLY_HEAD = struct.Struct("<5I")


class BridgeProtocolError(RuntimeError):
    """A request that is not the next one of this run's protocol: wrong magic or version, an
    unexpected sequence number (stale or foreign), or sizes that do not add up."""


class NpuBridgeRefused(RuntimeError):
    """A handler's refusal of an invocation it cannot compute (the invoke fails)."""


@dataclass(frozen=True)
class Request:
    sequence: int
    payload: bytes  # the custom-operator payload (COP1 ...)
    stream_offset: int  # where the command stream the driver started lies in the payload
    stream_words: int
    regions: tuple[bytes, ...]  # each base address's bytes, as the firmware sent them


def pack_request(sequence: int, payload: bytes, regions: list[bytes], stream_offset: int = 0,
                 stream_words: int = 0, *, magic: int = REQUEST_MAGIC,
                 version: int = VERSION) -> bytes:
    """A request as the firmware writes it (for tests and diagnosis)."""
    head = _REQUEST_HEAD.pack(magic, version, sequence, len(payload), stream_offset,
                              stream_words, len(regions))
    return b"".join([head, struct.pack(f"<{len(regions)}I", *map(len, regions)), payload,
                     *regions])


def parse_request(data: bytes, expected_sequence: int) -> Request:
    """Check and split one request; BridgeProtocolError when it is not the expected one."""
    if len(data) < _REQUEST_HEAD.size:
        raise BridgeProtocolError(f"NPU bridge request of {len(data)} bytes: shorter than its "
                                  f"{_REQUEST_HEAD.size}-byte header")
    magic, version, sequence, payload_bytes, offset, words, count = _REQUEST_HEAD.unpack_from(data)
    if magic != REQUEST_MAGIC:
        raise BridgeProtocolError(f"NPU bridge request with magic {magic:#010x}, not "
                                  f"{REQUEST_MAGIC:#010x} (\"ONPQ\"): not from the runner")
    if version != VERSION:
        raise BridgeProtocolError(f"NPU bridge request of protocol version {version}; this host "
                                  f"speaks version {VERSION} (firmware and host disagree)")
    if sequence != expected_sequence:
        raise BridgeProtocolError(
            f"NPU bridge request {sequence} when request {expected_sequence} was due: "
            f"{'stale (already answered)' if sequence < expected_sequence else 'foreign'}")
    if count > MAX_REGIONS:
        raise BridgeProtocolError(f"NPU bridge request {sequence} names {count} regions "
                                  f"(at most {MAX_REGIONS})")
    sizes_end = _REQUEST_HEAD.size + 4 * count
    if len(data) < sizes_end:
        raise BridgeProtocolError(f"NPU bridge request {sequence} is truncated in its sizes")
    sizes = struct.unpack_from(f"<{count}I", data, _REQUEST_HEAD.size)
    expected = sizes_end + payload_bytes + sum(sizes)
    if len(data) != expected:
        raise BridgeProtocolError(f"NPU bridge request {sequence} is {len(data)} bytes; its "
                                  f"header says {expected}")
    if offset + 4 * words > payload_bytes:
        raise BridgeProtocolError(f"NPU bridge request {sequence}: the command stream "
                                  f"({words} words at byte {offset}) lies outside the "
                                  f"{payload_bytes}-byte payload")
    payload = data[sizes_end:sizes_end + payload_bytes]
    regions, at = [], sizes_end + payload_bytes
    for size in sizes:
        regions.append(data[at:at + size])
        at += size
    return Request(sequence, payload, offset, words, tuple(regions))


def pack_reply(sequence: int, status: int, regions: list, *, magic: int = REPLY_MAGIC,
               version: int = VERSION) -> bytes:
    """The reply: the writable regions' bytes (after the NPU ran) when status is 0, else none."""
    written = [bytes(r) if status == 0 and i in WRITABLE_REGIONS and r is not None else b""
               for i, r in enumerate(regions)]
    head = _REPLY_HEAD.pack(magic, version, sequence, status, len(regions))
    return b"".join([head, struct.pack(f"<{len(written)}I", *map(len, written)), *written])


def parse_reply(data: bytes) -> tuple[int, int, int, int, list[bytes]]:
    """(magic, version, sequence, status, regions) of a reply (tests)."""
    magic, version, sequence, status, count = _REPLY_HEAD.unpack_from(data)
    sizes = struct.unpack_from(f"<{count}I", data, _REPLY_HEAD.size)
    at, regions = _REPLY_HEAD.size + 4 * count, []
    for size in sizes:
        regions.append(data[at:at + size])
        at += size
    return magic, version, sequence, status, regions


# (payload, regions as mutable bytearrays) -> NPU commands executed; raises to fail the invoke.
NpuHandler = Callable[[bytes, list], int]


@dataclass
class BridgeLog:
    """What the bridge served over one run."""

    invocations: int = 0
    commands: int = 0
    errors: list[str] = field(default_factory=list)


class BridgeServer:
    """Serves the firmware's NPU requests from a thread while QEMU runs in `folder`."""

    def __init__(self, folder: str | Path, handler: NpuHandler):
        self.folder = Path(folder)
        self.handler = handler
        self.log = BridgeLog()
        self.request_path = self.folder / REQUEST_FILE
        self.reply_path = self.folder / REPLY_FILE
        for path in (self.request_path, self.reply_path):
            os.mkfifo(path, 0o600)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="npu-bridge", daemon=True)

    def __enter__(self) -> BridgeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """End the thread: it may be blocked opening the request FIFO, which a writer unblocks."""
        self._stop.set()
        deadline = time.monotonic() + 10
        while self._thread.is_alive() and time.monotonic() < deadline:
            try:
                fd = os.open(self.request_path, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass
            self._thread.join(0.05)

    def _serve(self) -> None:
        sequence = 1
        while not self._stop.is_set():
            with open(self.request_path, "rb") as request_file:  # blocks until a writer opens
                data = request_file.read()
            if self._stop.is_set() and not data:
                return
            status, regions = 1, []
            try:
                request = parse_request(data, sequence)
                regions = [bytearray(r) for r in request.regions]
                commands = self.handler(request.payload, regions)
                # Only what the NPU changed goes back: two base addresses may name the same
                # memory (TFLM hands Vela's scratch and fast-scratch tensors, which alias in
                # Shared_Sram), and an untouched copy written back would undo the other's writes.
                regions = [None if i in WRITABLE_REGIONS and region is not None
                           and bytes(region) == request.regions[i] else region
                           for i, region in enumerate(regions)]
                self.log.invocations += 1
                self.log.commands += int(commands)
                status = 0
            except BridgeProtocolError as error:
                self.log.errors.append(str(error))
                regions = []
            except Exception as error:  # noqa: BLE001 - the NPU faulted: the invoke fails
                self.log.errors.append(f"NPU invocation {sequence}: {error}")
            reply = pack_reply(sequence, status, regions)
            sequence += 1
            if not self._write_reply(reply):
                return

    def _write_reply(self, reply: bytes) -> bool:
        """Open the reply FIFO once the firmware reads it; give up when the run has ended."""
        while True:
            try:
                fd = os.open(self.reply_path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as error:
                if error.errno != errno.ENXIO or self._stop.is_set():
                    return False
                time.sleep(0.001)
        os.set_blocking(fd, True)
        try:
            view = memoryview(reply)
            while view:
                view = view[os.write(fd, view):]
        except BrokenPipeError:
            return False
        finally:
            os.close(fd)
        return True
