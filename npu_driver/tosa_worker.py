"""The TOSA reference model in a child process, so a graph that crashes it is a verdict, not the
end of the tool.

The reference model is native code: a damaged `model.tosa` (or one a tool wrote wrongly) can
make it dereference garbage and kill the process that called it (measured: a segmentation fault
with no output). `IsolatedTosa.run` hands each graph and its inputs to a child process started
once (spawned, so it shares no state with the parent) and returns its outputs; when the child
dies, the call raises TosaTwinError naming the signal, and the next call starts a new child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from npu_driver.tosa_twin import TosaGraphIO, TosaTwinError, run_tosa

# A graph the reference model runs for longer than this is reported, not waited for.
TIMEOUT_SECONDS = 600
_ROOT = str(Path(__file__).resolve().parent.parent)  # so the child imports this checkout


def _serve(requests: Connection, replies: Connection) -> None:
    """The child: run each (graph, io, inputs) request until the parent closes the pipe."""
    while True:
        try:
            request = requests.recv()
        except (EOFError, OSError):
            return
        tosa_bytes, io, inputs = request
        try:
            reply = ("ok", run_tosa(tosa_bytes, io, inputs))
        except TosaTwinError as error:
            reply = ("error", str(error))
        except Exception as error:  # noqa: BLE001 - reported to the parent, never lost
            reply = ("error", f"{type(error).__name__}: {error}")
        replies.send(reply)


class IsolatedTosa:
    """One child process running the TOSA reference model for this process's verifications."""

    def __init__(self):
        self._process: subprocess.Popen | None = None
        self._connection: Connection | None = None  # replies
        self._requests: Connection | None = None
        self._lock = threading.Lock()

    def _start(self) -> None:
        # A fresh interpreter running this module (not multiprocessing's spawn, which re-runs
        # the caller's main script); requests and replies travel on their own pipes, since the
        # reference model's output is redirected from the standard streams while it runs.
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "npu_driver.tosa_worker", str(request_read), str(reply_write)],
            pass_fds=(request_read, reply_write), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=_ROOT)
        os.close(request_read)
        os.close(reply_write)
        self._requests = Connection(request_write, readable=False)
        self._connection = Connection(reply_read, writable=False)

    def _stop(self) -> None:
        for connection in (self._requests, self._connection):
            if connection is not None:
                connection.close()
        if self._process is not None:
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process, self._connection, self._requests = None, None, None

    def run(self, tosa_bytes: bytes, io: TosaGraphIO, inputs: list[np.ndarray]
            ) -> list[np.ndarray]:
        """`run_tosa` in the child; a crash or a hang is a TosaTwinError saying so."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            try:
                self._requests.send((tosa_bytes, io, list(inputs)))
                if not self._connection.poll(TIMEOUT_SECONDS):
                    self._stop()
                    raise TosaTwinError(f"the TOSA reference model ran for more than "
                                        f"{TIMEOUT_SECONDS} s on this graph and was stopped")
                kind, value = self._connection.recv()
            except (EOFError, OSError, BrokenPipeError):
                try:
                    code = self._process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    code = None
                self._stop()
                raise TosaTwinError("the TOSA reference model crashed on this graph ("
                                    + (f"signal {signal.Signals(-code).name}" if code and code < 0
                                       else f"exit {code}")
                                    + "); the graph is damaged or outside what it accepts") \
                    from None
        if kind == "error":
            raise TosaTwinError(value)
        return value

    def close(self) -> None:
        with self._lock:
            self._stop()


_SHARED: IsolatedTosa | None = None


def shared() -> IsolatedTosa:
    """The process's TOSA child, started on first use."""
    global _SHARED
    if _SHARED is None:
        _SHARED = IsolatedTosa()
    return _SHARED


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]),
                                                                    readable=False))
