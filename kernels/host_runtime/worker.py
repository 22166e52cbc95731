"""The host runtime in a child process: `python -m kernels.host_runtime.worker FD LIBRARY`.

A device kernel that fails an ET_CHECK calls `runtime_abort()`, which ends the process on the
device and here alike; running the runtime in a child keeps that from taking the caller (a test
session, the CLI) down with it, and turns it into a reported failure with the runtime's log.

Protocol over the socket FD (pickled tuples, `multiprocessing.connection`), every message
after the first carrying the number N of the request it belongs to:
  child -> parent, once at start: ("ok", build key) | ("error", message)
  parent -> child: ("request", N, R), R one of ("load", pte_bytes) | ("reset", key)
                   | ("run", key, inputs, repeat) | ("trace", key, inputs) | ("meta", key)
                   | ("bye",)
  child -> parent: ("ok", N, result) | ("error", N, message)
                   | ("npu", N, command_stream, weights_sha256, [region bytes...]) during a run,
                     answered by ("npu_done", N, [region bytes for regions 1..]) or
                     ("npu_failed", N, message).

The numbers keep an abandoned request from answering the next one. A caller that stops while a
run waits for its NPU answer (an exception, Ctrl-C in a notebook) leaves that run here; its next
request finds this process still in the NPU wait. The run then fails ("abandoned"), its answer
goes out under its own number, and the parent discards it; the new request is served next.
Before serving request N the child logs the line `REQUEST_MARK N`, so the parent reads
only request N's part of the log.
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


REQUEST_MARK = "orchestrate-host-runtime: request"


def _tensors(values):
    return tuple(v.detach().clone() for v in values)


def _serve(connection: Connection, library: str) -> None:
    try:
        session = RuntimeSession(library)
    except LibraryError as error:
        send(connection, ("error", str(error)))
        return
    send(connection, ("ok", session.build_key))
    pending: list[tuple] = []  # a request that arrived while an abandoned run waited
    current = [0]

    def npu(invocation) -> None:
        send(connection, ("npu", current[0], invocation.command_stream,
                          invocation.weights_sha256, [bytes(r) for r in invocation.regions]))
        while True:
            reply = receive(connection)
            if reply[0] == "request":  # the caller gave this run up and asks for something new
                pending.append(reply)
                raise SessionError("abandoned by the caller while the NPU invocation waited")
            if reply[1] == current[0]:
                break  # (an answer to an abandoned run's NPU call is dropped)
        if reply[0] != "npu_done":
            raise SessionError(reply[2] if len(reply) > 2 else "NPU handler failed")
        for region, data in zip(invocation.regions[1:], reply[2]):
            if len(data) != len(region):
                raise SessionError(f"NPU handler returned {len(data)} B for a {len(region)} B "
                                   "region")
            region[:] = data

    session.npu = npu
    while True:
        try:
            message = pending.pop(0) if pending else receive(connection)
        except EOFError:
            return
        if message[0] != "request":  # an answer to an NPU wait that is over: nothing to do
            continue
        _, number, request = message
        current[0] = number
        print(f"{REQUEST_MARK} {number}", flush=True)
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
            send(connection, ("error", number, str(error)))
            continue
        send(connection, ("ok", number, result))


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
