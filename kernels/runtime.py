"""Run a `.pte` through the real ExecuTorch runtime with the real Cortex-M kernels and CMSIS-NN.

The wheel's runtime (`libexecutorch.so` behind `executorch.extension.pybindings`) loads the
program, plans its memory and runs its portable and prim ops; `kernels.host_runtime` builds,
from upstream sources, the `cortex_m::` kernels over CMSIS-NN and ExecuTorch's EthosUBackend and
registers them into that runtime. An Ethos-U invocation reaches a host stand-in for the Ethos-U
driver, which calls back into Python with the command stream and the scratch region; the caller
supplies the handler that computes the partition (the orchestrator wires the TOSA reference
model in), so this module knows nothing of TOSA.

Sources: `executorch_src`/`cmsis_nn_src` arguments, else ORCHESTRATE_EXECUTORCH_SRC /
ORCHESTRATE_CMSIS_NN_SRC, else `../shared/third_party/{executorch,cmsis-nn}` next to this
repository. Missing sources, compiler or wheel runtime raise `RuntimeUnavailable`: the check
did not run (never a pass).

By default the runtime runs in a child process (`kernels.host_runtime.worker`), because a kernel
check that fails on the device aborts the process; `RuntimeFailure` then carries the runtime's
log.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable

import torch

from kernels.host_runtime.session import (InstructionOutput, LibraryError, RawValue, RuntimeSession,
                                          SessionError)
from kernels.host_runtime.worker import REQUEST_MARK, receive, send
from kernels.native.errors import HostRuntimeUnavailable
from kernels.native.host import BuiltLibrary, build, default_cache_dir
from kernels.native.sources import TREE_ENVS, source_tree, sources_hint
from kernels.program_view import ProgramView

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_EXECUTORCH_SRC = TREE_ENVS["executorch"]
ENV_CMSIS_NN_SRC = TREE_ENVS["cmsis-nn"]
METHOD = ("ExecuTorch runtime (executorch wheel's libexecutorch.so: program loading, memory plan, "
          "portable and prim ops) + cortex_m kernels and CMSIS-NN C code built for the host")

RuntimeUnavailable = HostRuntimeUnavailable


class RuntimeFailure(RuntimeError):
    """The runtime refused the program, failed a run, or its process aborted (a kernel check
    that would stop the device); the message carries the runtime's own reason and log."""

    @property
    def refusal(self) -> "KernelRefusal | None":
        """The kernel call the runtime refused, read from its log, or None."""
        return kernel_refusal(str(self))


# What method.cpp and the kernels log when a kernel refuses its arguments (ET_KERNEL_CHECK,
# ET_LOG_AND_RETURN_IF_FALSE): "[op_argmax.cpp:45] Check failed (tensors_have_same_dim_order(in,
# out)): " lines, then "[method.cpp:1483] KernelCall failed at instruction 0:5 in operator
# aten::argmax.out: 0x12".
_KERNEL_CALL_FAILED = re.compile(
    r"KernelCall failed at instruction (\d+):(\d+) in operator ([\w:.]+): (0x[0-9a-fA-F]+)")
_CHECK_FAILED = re.compile(r"\[([\w.]+):(\d+)\] Check failed \((.*)\):?\s*(.*)$")
_MISSING_OPERATOR = re.compile(r"Missing operator: \[\d+\] ([\w:.]+)")
# Checks the portable kernels make on dim orders (runtime/core/exec_aten/util/tensor_util.h,
# kernels/portable/cpu/util): a layout copy satisfies them.
DIM_ORDER_CHECKS = ("tensors_have_same_dim_order", "all_contiguous || all_channels_last",
                    "tensor_is_default_dim_order", "tensor_is_default_or_channels_last_dim_order",
                    "is_contiguous_dim_order", "is_channels_last_dim_order")


# A kernel's argument check that calls the failing checks (op_upsample_nearest2d.cpp:105
# `check_upsample_nearest2d_args(in, output_size, scale_factors, out)`), logged after them.
_ARGS_WRAPPER = re.compile(r"\s*check_\w+_args\s*\(")


@dataclass(frozen=True)
class KernelCheck:
    source: str  # "op_argmax.cpp:45"
    condition: str  # "tensors_have_same_dim_order(in, out)"
    detail: str  # what the kernel added, e.g. "2 input tensors have different dim orders"

    @property
    def on_dim_order(self) -> bool:
        return any(check in self.condition for check in DIM_ORDER_CHECKS)

    def text(self) -> str:
        return f"{self.source}: {self.condition}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class KernelRefusal:
    """One kernel call the real runtime refused: where, which operator, and the checks that
    failed on the way (innermost first, as the runtime logged them)."""

    chain: int
    instruction: int
    operator: str  # "aten::argmax.out"
    error: str  # the runtime's Error code, e.g. "0x12" (InvalidArgument)
    checks: tuple[KernelCheck, ...]

    @property
    def on_dim_order(self) -> bool:
        """Every failed check is a dim-order one (a layout copy can satisfy it), or an op's
        argument-check wrapper around one (`check_upsample_nearest2d_args(...)`: it fails
        because the dim-order check inside it did)."""
        return bool(self.checks) and self.checks[0].on_dim_order and all(
            c.on_dim_order or _ARGS_WRAPPER.match(c.condition) for c in self.checks[1:])

    def text(self) -> str:
        checks = "; ".join(c.text() for c in self.checks) or "no check logged"
        return (f"{self.operator} at instruction {self.chain}:{self.instruction} returned "
                f"error {self.error} ({checks})")


def kernel_refusal(log: str) -> KernelRefusal | None:
    """The first refused kernel call in a runtime log, with the checks logged before it."""
    checks: list[KernelCheck] = []
    for line in log.splitlines():
        check = _CHECK_FAILED.search(line)
        if check:
            checks.append(KernelCheck(f"{check.group(1)}:{check.group(2)}",
                                      check.group(3).strip(), check.group(4).strip()))
            continue
        call = _KERNEL_CALL_FAILED.search(line)
        if call:
            return KernelRefusal(int(call.group(1)), int(call.group(2)), call.group(3),
                                 call.group(4), tuple(checks))
    return None


def missing_operators(log: str) -> tuple[str, ...]:
    """Operators the runtime could not find when loading a program ("Missing operator")."""
    return tuple(dict.fromkeys(m.group(1) for m in _MISSING_OPERATOR.finditer(log)))


@dataclass(frozen=True)
class Sources:
    executorch_src: Path
    cmsis_nn_src: Path
    origin: str  # where the trees were found (kernels.native.sources.third_party_root)


@dataclass(frozen=True)
class NpuInvocation:
    """One ethosu_invoke_v3 as the host Ethos-U driver received it. The handler reads the
    partition's inputs from `scratch` at the offsets Vela assigned and writes its outputs there,
    as the NPU's command stream would."""

    command_stream: bytes
    command_stream_sha256: str
    weights_sha256: str
    scratch: memoryview  # region 1, writable
    regions: tuple  # every base-address region (0 weights, 1 scratch, 2 fast scratch)


NpuHandler = Callable[[NpuInvocation], None]


@dataclass(frozen=True)
class RuntimeRun:
    outputs: tuple[torch.Tensor, ...]  # logical tensors, as the runtime returned them
    seconds: tuple[float, ...]  # wall time of each forward() in the runtime's process
    npu_seconds: tuple[float, ...]  # of which spent in the NPU handler (TOSA model, IPC)
    log: str  # what the runtime printed during the run
    instructions: tuple[InstructionOutput, ...] = ()  # per-op outputs (traced runs only)


def find_sources(executorch_src: str | Path | None = None,
                 cmsis_nn_src: str | Path | None = None) -> Sources:
    """Where the upstream sources are (kernels.native.sources.source_tree: argument, then the
    tree's variable, then $ORCHESTRATE_THIRD_PARTY, then ../shared/third_party). Raises
    RuntimeUnavailable when a tree is not there."""
    chosen = [source_tree("executorch", executorch_src), source_tree("cmsis-nn", cmsis_nn_src)]
    for (path, origin), option in zip(chosen, ("--executorch-src or " + ENV_EXECUTORCH_SRC,
                                               "--cmsis-nn-src or " + ENV_CMSIS_NN_SRC)):
        if not path.is_dir():
            raise RuntimeUnavailable(f"no source tree at {path} ({origin}); point {option} "
                                     f"at an unmodified checkout, or {sources_hint()}")
    origins = {origin for _, origin in chosen}
    return Sources(chosen[0][0], chosen[1][0], "/".join(sorted(origins)))


def ensure_library(sources: Sources | None = None, cache_dir: Path | None = None,
                   log: Callable[[str], None] | None = None) -> BuiltLibrary:
    """The host runtime library for `sources`, built now or found in the cache."""
    sources = sources or find_sources()
    return build(sources.executorch_src, sources.cmsis_nn_src, cache_dir, log=log)


def logical(value: RawValue) -> torch.Tensor:
    """A per-op value the runtime logged, as a logical tensor (its bytes read by its strides)."""
    dtype = getattr(torch, value.dtype)
    if not value.data:
        return torch.empty(value.sizes, dtype=dtype)
    flat = torch.frombuffer(bytearray(value.data), dtype=dtype)
    return torch.as_strided(flat, value.sizes, value.strides).clone()


def input_dim_orders(pte: bytes) -> tuple[tuple[int, ...] | None, ...]:
    """The dim_order of each input of the program's first method (None for a non-tensor)."""
    return tuple(value.dim_order if value.is_tensor else None
                 for value in ProgramView.read(pte).input_values)


def in_dim_order(tensor: torch.Tensor, dim_order: tuple[int, ...] | None) -> torch.Tensor:
    """The same logical tensor with its storage laid out in `dim_order`.

    The wheel's pybindings copy an input's storage bytes into the planned input as they are,
    whatever the tensor's strides (measured: a contiguous NCHW tensor fed to a channels-last
    input of `mixed` is read as NHWC), so the storage must already be in the program's order.
    """
    tensor = tensor.detach()
    if dim_order is None or len(dim_order) != tensor.dim():
        return tensor.clone()
    inverse = sorted(range(len(dim_order)), key=lambda d: dim_order[d])
    return tensor.permute(dim_order).contiguous().permute(inverse)


# torch's glog-style info and warning lines in the child's log (e.g. "W1202 15:10:38.719000 ...
# _pytree.py:630] ... Enum subclass ..."): not the runtime's words.
_PYTHON_LOG_NOISE = re.compile(r"^[IW]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")


class HostRuntime:
    """The real runtime with the host kernels, in a child process (or in this one with
    `isolated=False`, where a kernel abort ends this process). Reusable across programs."""

    def __init__(self, library: BuiltLibrary | None = None, isolated: bool = True,
                 sources: Sources | None = None, cache_dir: Path | None = None):
        self.library = library or ensure_library(sources, cache_dir)
        self.isolated = isolated
        self._process: subprocess.Popen | None = None
        self._connection: Connection | None = None
        self._log_path: str | None = None
        self._loaded: set[str] = set()
        self._ready = False
        self._session = None
        self._handler: NpuHandler | None = None
        self._input_orders: dict[str, tuple[tuple[int, ...] | None, ...]] = {}
        self._number = 0  # of the last request sent (kernels/host_runtime/worker.py)

    def __enter__(self) -> "HostRuntime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._number += 1
                send(self._connection, ("request", self._number, ("bye",)))
            except OSError:
                pass
            self._connection.close()
            self._connection = None
            self._ready = False
        if self._process is not None:
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._log_path is not None:
            os.unlink(self._log_path)
            self._log_path = None
        self._loaded.clear()

    # -- child process ----------------------------------------------------------------------

    def prestart(self) -> None:
        """Start the child process now and return at once: it imports the runtime while the
        caller works (the first request waits for it to be ready)."""
        if self._connection is None:
            self._spawn()

    def _start(self) -> None:
        if self._connection is None:
            self._spawn()
        if self._ready:
            return
        try:
            status, detail = self._receive(None)
        except RuntimeFailure as failure:
            self.close()
            raise RuntimeUnavailable(f"the host runtime process did not start: {failure}") from None
        if status != "ok":
            self.close()
            raise RuntimeUnavailable(f"the host runtime library did not load: {detail}")
        self._ready = True

    def _spawn(self) -> None:
        parent, child = socket.socketpair()
        if self._log_path is None:
            handle, self._log_path = tempfile.mkstemp(prefix="orchestrate-runtime-", suffix=".log")
            os.close(handle)
        # Appended to by the child, read from our own handle: no shared file offset.
        log = open(self._log_path, "ab")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "kernels.host_runtime.worker", str(child.fileno()),
             str(self.library.path)],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, env=env, cwd=str(REPO_ROOT))
        log.close()
        child.close()
        self._connection = Connection(parent.detach())
        self._ready = False

    def _log_size(self) -> int:
        return os.path.getsize(self._log_path) if self._log_path else 0

    def _log_tail(self, since: int = 0, lines: int = 30, number: int | None = None) -> str:
        """The log's last `lines` lines written after offset `since`; with `number`, only those
        after the child's mark for request `number` (an abandoned run may still be logging
        when the next request starts)."""
        if self._log_path is None:
            return ""
        with open(self._log_path, "rb") as log:
            log.seek(since)
            text = log.read().decode("utf-8", errors="replace")
        if number is not None:
            mark = f"{REQUEST_MARK} {number}\n"
            text = text[text.index(mark) + len(mark):] if mark in text else text
        kept = [line for line in text.splitlines()
                if line.strip() and "Failed to load" not in line and "torchao" not in line
                and not _PYTHON_LOG_NOISE.match(line) and not line.startswith(REQUEST_MARK)]
        return "\n".join(kept[-lines:])

    def _receive(self, handler: NpuHandler | None, number: int | None = None):
        """The child's answer to request `number` (None: the one it sends when it starts),
        serving that request's NPU invocations on the way. Messages of an earlier request the
        caller abandoned are dropped; an NPU invocation of one is failed."""
        while True:
            try:
                message = receive(self._connection)
            except (EOFError, OSError):
                code = self._process.wait() if self._process else None
                tail = self._log_tail()
                self._drop()
                raise RuntimeFailure(f"the runtime process ended (exit status {code}); its log "
                                     f"ends:\n{tail}") from None
            if number is None:
                return message
            if message[1] != number:  # an abandoned request's: not this one's answer
                if message[0] == "npu":
                    send(self._connection, ("npu_failed", message[1], "abandoned"))
                continue
            if message[0] != "npu":
                return message[0], message[2]
            _, _, command, weights_sha256, regions = message
            views = tuple(memoryview(bytearray(r)) for r in regions)
            try:
                if handler is None:
                    raise RuntimeFailure("the program invoked the Ethos-U NPU but no NPU handler "
                                         "was given")
                handler(NpuInvocation(command, hashlib.sha256(command).hexdigest(),
                                      weights_sha256, views[1] if len(views) > 1 else None,
                                      views))
            except Exception as error:  # noqa: BLE001 - reported back through the driver
                send(self._connection, ("npu_failed", number, f"{type(error).__name__}: {error}"))
                continue
            send(self._connection, ("npu_done", number, [bytes(v) for v in views[1:]]))

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._connection = None
        self._ready = False
        self._process = None
        self._loaded.clear()

    def _request(self, request: tuple, handler: NpuHandler | None = None):
        if self._connection is None or not self._ready:
            self._start()
        since = self._log_size()
        self._number += 1
        number = self._number
        try:
            send(self._connection, ("request", number, request))
        except OSError:
            pass  # the child is gone; _receive reports how it ended
        status, detail = self._receive(handler, number)
        if status != "ok":
            log = self._log_tail(since, number=number)
            raise RuntimeFailure(detail + (f"\nruntime log:\n{log}" if log else ""))
        return detail, self._log_tail(since, number=number)

    # -- in this process ---------------------------------------------------------------------

    def _local(self):
        if self._session is None:
            try:
                self._session = RuntimeSession(self.library.path)
            except LibraryError as error:
                raise RuntimeUnavailable(str(error)) from None
            self._session.npu = self._local_npu
        return self._session

    def _local_npu(self, regions) -> None:
        if self._handler is None:
            raise RuntimeFailure("the program invoked the Ethos-U NPU but no NPU handler was "
                                 "given")
        views = regions.regions
        self._handler(NpuInvocation(regions.command_stream,
                                    hashlib.sha256(regions.command_stream).hexdigest(),
                                    regions.weights_sha256, views[1] if len(views) > 1 else None,
                                    views))

    def _local_call(self, method, *args):
        try:
            return method(*args)
        except SessionError as error:
            raise RuntimeFailure(str(error)) from None

    # -- API ---------------------------------------------------------------------------------

    def load(self, pte: bytes | str | Path) -> str:
        """Load a program (bytes or path) into the runtime; returns its key (SHA-256)."""
        data = Path(pte).read_bytes() if isinstance(pte, (str, Path)) else bytes(pte)
        key = hashlib.sha256(data).hexdigest()
        if key not in self._input_orders:
            self._input_orders[key] = input_dim_orders(data)
        if not self.isolated:
            return self._local_call(self._local().load, data)
        if key not in self._loaded or self._connection is None:
            self._request(("load", data))
            self._loaded.add(key)
        return key

    def reset(self, pte: bytes | str | Path) -> str:
        """Load the program afresh: a program with state starts again from its initial values
        (as a device does when it reloads the method); returns its key."""
        key = self.load(pte)
        if not self.isolated:
            return self._local_call(self._local().reset, key)
        self._request(("reset", key))
        return key

    def run(self, pte: bytes | str | Path, inputs, npu: NpuHandler | None = None,
            repeat: int = 1, trace: bool = False) -> RuntimeRun:
        """Run the program on `inputs` (logical tensors in the program's input dtypes).
        `repeat` runs it that many times and keeps every run's wall time; `trace` runs one
        fresh instance with ETDump and returns every instruction's written tensors too."""
        key = self.load(pte)
        inputs = tuple(in_dim_order(t, order) for t, order in zip(inputs, self._input_orders[key]))
        if not self.isolated:
            session = self._local()
            self._handler = npu
            try:
                if trace:
                    outputs, instructions = self._local_call(session.run_traced, key, inputs)
                    return RuntimeRun(tuple(o.clone() for o in outputs), (), (), "", instructions)
                outputs, seconds, npu_seconds = self._local_call(session.run, key, inputs, repeat)
                return RuntimeRun(tuple(o.clone() for o in outputs), tuple(seconds),
                                  tuple(npu_seconds), "")
            finally:
                self._handler = None
        if trace:
            (outputs, instructions), log = self._request(("trace", key, inputs), npu)
            return RuntimeRun(tuple(outputs), (), (), log, tuple(instructions))
        (outputs, seconds, npu_seconds), log = self._request(("run", key, inputs, repeat), npu)
        return RuntimeRun(tuple(outputs), tuple(seconds), tuple(npu_seconds), log)


def run_pte(pte: str | Path, inputs, npu: NpuHandler | None = None,
            sources: Sources | None = None, trace: bool = False) -> RuntimeRun:
    """Build (or find) the library, run the program once in a fresh child process."""
    with HostRuntime(sources=sources) as runtime:
        return runtime.run(pte, inputs, npu=npu, trace=trace)


__all__ = ["METHOD", "HostRuntime", "KernelCheck", "KernelRefusal", "NpuHandler", "NpuInvocation",
           "RuntimeFailure", "kernel_refusal", "missing_operators",
           "RuntimeRun", "RuntimeUnavailable", "Sources", "default_cache_dir", "ensure_library",
           "find_sources", "logical", "run_pte"]
