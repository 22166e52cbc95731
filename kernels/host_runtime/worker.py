"""The host runtime in a child process: `python -m kernels.host_runtime.worker FD LIBRARY`.

A device kernel that fails an ET_CHECK calls `runtime_abort()`, which ends the process on the
device and here alike; running the runtime in a child keeps that from taking the caller (a test
session, the CLI) down with it, and turns it into a reported failure with the runtime's log.

Protocol over the socket FD (pickled tuples, `multiprocessing.connection`):
  parent -> child: ("load", pte_bytes) | ("reset", key) | ("run", key, inputs, repeat)
                   | ("trace", key, inputs)
                   | ("meta", key) | ("bye",)
  child -> parent: ("ok", result) | ("error", message)
                   | ("npu", command_stream, weights_sha256, [region bytes...]) during a run,
                     answered by ("npu_done", [region bytes for regions 1..]) or
                     ("npu_failed", message).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import sys
from multiprocessing.connection import Connection

from kernels.host_runtime.session import LibraryError, RuntimeSession, SessionError


def send(connection: Connection, message) -> None:
    """Plain pickle: torch's multiprocessing reductions would pass tensors as shared-memory file
    descriptors, which need a resource sharer this pair of processes does not run."""
    connection.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(connection: Connection):
    return pickle.loads(connection.recv_bytes())


def _tensors(values):
    return tuple(v.detach().clone() for v in values)


def _serve(connection: Connection, library: str) -> None:
    try:
        session = RuntimeSession(library)
    except LibraryError as error:
        send(connection, ("error", str(error)))
        return
    send(connection, ("ok", session.build_key))

    def npu(invocation) -> None:
        send(connection, ("npu", invocation.command_stream, invocation.weights_sha256,
                         [bytes(r) for r in invocation.regions]))
        reply = receive(connection)
        if reply[0] != "npu_done":
            raise SessionError(reply[1] if len(reply) > 1 else "NPU handler failed")
        for region, data in zip(invocation.regions[1:], reply[1]):
            if len(data) != len(region):
                raise SessionError(f"NPU handler returned {len(data)} B for a {len(region)} B "
                                   "region")
            region[:] = data

    session.npu = npu
    while True:
        try:
            request = receive(connection)
        except EOFError:
            return
        kind = request[0]
        try:
            if kind == "bye":
                return
            if kind == "load":
                result = session.load(request[1])
            elif kind == "reset":
                result = session.reset(request[1])
            elif kind == "meta":
                meta = session.method_meta(request[1])
                result = (tuple(tuple(meta.input_tensor_meta(i).sizes())
                                for i in range(meta.num_inputs())),
                          tuple(tuple(meta.output_tensor_meta(i).sizes())
                                for i in range(meta.num_outputs())))
            elif kind == "run":
                outputs, seconds, npu_seconds = session.run(request[1], request[2], request[3])
                result = (_tensors(outputs), seconds, npu_seconds)
            elif kind == "trace":
                outputs, trace = session.run_traced(request[1], request[2])
                result = (_tensors(outputs), trace)
            else:
                raise SessionError(f"unknown request {kind!r}")
        except SessionError as error:
            send(connection, ("error", str(error)))
            continue
        send(connection, ("ok", result))


def main(argv: list[str]) -> int:
    connection = Connection(int(argv[0]))
    try:
        _serve(connection, argv[1])
    finally:
        connection.close()
    return 0


def _exit_now(status: int) -> None:
    """End the process without tearing down torch and the runtime's libraries (1.5-2.4 s that
    the parent's exit waited for at every compile): nothing is left to write once the parent
    said bye, except buffered output, which is flushed first (C stdio too: the runtime's log)."""
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)
    os._exit(status)


if __name__ == "__main__":
    _exit_now(main(sys.argv[1:]))
