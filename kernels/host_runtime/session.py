"""One process's view of the host runtime: the library loaded into the wheel's ExecuTorch runtime,
programs loaded by `executorch.extension.pybindings`, and runs with optional per-op outputs.

Loading order matters: `portable_lib` is imported first (`upstream_runtime.load_runtime()`) so
that its `libexecutorch.so` (the one holding the kernel and backend registries) is the one our
library binds to; our library is then opened with RTLD_GLOBAL, which runs EthosUBackend.cpp's
static registration, and the generated Cortex-M Kernel table is registered explicitly.

Per-op outputs come from the runtime itself: a program loaded with ETDump enabled and a debug
buffer records, after every instruction, the tensors its kernel wrote (the generated kernel
wrappers call `event_tracer_log_evalue` on their out argument, and method.cpp does the same for
delegate outputs), with sizes, strides and an offset into the debug buffer.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kernels import upstream_runtime
from kernels.dtypes import SCALAR_TYPE_NAMES

PROBE_OP = b"cortex_m::quantize_per_tensor.out"
DEBUG_BUFFER_BYTES = 64 << 20

NPU_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                ctypes.c_int)


class SessionError(RuntimeError):
    """The runtime refused a program or failed a run (the message carries the runtime's reason)."""


class LibraryError(RuntimeError):
    """The library could not be loaded or registered into this process's runtime."""


@dataclass(frozen=True)
class RawValue:
    """A tensor the runtime wrote, as bytes in its memory order plus what is needed to read it."""

    dtype: str  # numpy/torch dtype name
    sizes: tuple[int, ...]
    strides: tuple[int, ...]  # in elements, from the tensor's dim_order
    data: bytes


@dataclass(frozen=True)
class InstructionOutput:
    """The tensors one instruction of chain 0 wrote, in the order the runtime logged them."""

    instruction: int
    name: str  # the runtime's profiling name, e.g. native_call_quantized_linear.out
    values: tuple[RawValue, ...]


@dataclass(frozen=True)
class NpuRegions:
    """What ethosu_invoke_v3 received: the command stream and the base-address regions
    (0 weights, 1 scratch holding the IO, 2 fast scratch), as writable views."""

    command_stream: bytes
    weights_sha256: str
    regions: tuple  # memoryview per region; region 0 read-only by contract


def _region_view(address: int, size: int) -> memoryview:
    if not address or not size:
        return memoryview(bytearray(0))
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


class RuntimeSession:
    """The host runtime inside this process. `npu` is called for every Ethos-U invocation with
    an NpuRegions and must write the partition's outputs into region 1 (or raise)."""

    def __init__(self, library_path: str | Path):
        upstream_runtime.load_runtime()
        try:
            self._lib = ctypes.CDLL(str(library_path), mode=ctypes.RTLD_GLOBAL)
        except OSError as error:
            raise LibraryError(f"cannot load {library_path}: {error}") from None
        self._lib.orchestrate_host_register_kernels.argtypes = [ctypes.c_char_p]
        self._lib.orchestrate_host_register_kernels.restype = ctypes.c_int
        self._lib.orchestrate_host_build_key.restype = ctypes.c_char_p
        self._lib.orchestrate_host_set_npu_callback.argtypes = [NPU_CALLBACK]
        status = self._lib.orchestrate_host_register_kernels(PROBE_OP)
        if status == -1:
            raise LibraryError("another library already registered the cortex_m kernels in this "
                               "process (a second host runtime build?); use a fresh process")
        if status != 0:
            raise LibraryError(f"registering the cortex_m kernels failed with runtime error "
                               f"{status:#x}")
        if "EthosUBackend" not in upstream_runtime.registered_backend_names():
            raise LibraryError("EthosUBackend did not register into the wheel's runtime")
        self.build_key = self._lib.orchestrate_host_build_key().decode()
        self.npu = None
        self.npu_seconds = 0.0
        self._npu_error: str | None = None
        # Kept referenced: ctypes frees the trampoline with the Python object.
        self._callback = NPU_CALLBACK(self._on_npu)
        self._lib.orchestrate_host_set_npu_callback(self._callback)
        self._programs: dict[str, tuple[bytes, object]] = {}

    def _on_npu(self, command, command_bytes, bases, sizes, count) -> int:
        began = time.perf_counter()
        try:
            if self.npu is None:
                raise SessionError("the program has an Ethos-U delegate but no NPU handler was "
                                   "given")
            regions = tuple(_region_view(bases[i], sizes[i]) for i in range(count))
            weights = bytes(regions[0]) if count else b""
            self.npu(NpuRegions(ctypes.string_at(command, command_bytes),
                                hashlib.sha256(weights).hexdigest(), regions))
            return 0
        except BaseException as error:  # noqa: BLE001 - must not unwind into C++
            self._npu_error = f"{type(error).__name__}: {error}"
            return 1
        finally:
            self.npu_seconds += time.perf_counter() - began

    @staticmethod
    def program_key(pte: bytes) -> str:
        return hashlib.sha256(pte).hexdigest()

    def load(self, pte: bytes) -> str:
        key = self.program_key(pte)
        if key not in self._programs:
            data = bytes(pte)
            try:
                # The module reads the buffer in place without owning it: keep `data` alive.
                module = upstream_runtime.load_from_buffer(data)
            except Exception as error:  # noqa: BLE001 - pybind raises RuntimeError and others
                raise SessionError(f"the runtime refused the program: {error}") from None
            self._programs[key] = (data, module)
        return key

    def reset(self, key: str) -> str:
        """A fresh instance of a loaded program: `load_method` again copies every state's
        initial value in (a program with state carries it from one run to the next)."""
        if key not in self._programs:
            raise SessionError(f"no program {key[:12]} is loaded")
        data = self._programs.pop(key)[0]
        return self.load(data)

    def method_meta(self, key: str):
        return self._programs[key][1].method_meta("forward")

    def _forward(self, module, inputs):
        self._npu_error = None
        try:
            return module.forward(list(inputs))
        except Exception as error:  # noqa: BLE001
            detail = f" (NPU: {self._npu_error})" if self._npu_error else ""
            raise SessionError(f"the runtime failed the run: {error}{detail}") from None

    def run(self, key: str, inputs, repeat: int = 1):
        """(outputs of the last run, wall seconds per run, NPU-callback seconds per run)."""
        module = self._programs[key][1]
        seconds, npu, outputs = [], [], None
        for _ in range(max(1, repeat)):
            self.npu_seconds = 0.0
            began = time.perf_counter()
            outputs = self._forward(module, inputs)
            seconds.append(time.perf_counter() - began)
            npu.append(self.npu_seconds)
        return tuple(outputs), seconds, npu

    def run_traced(self, key: str, inputs) -> tuple[tuple, tuple[InstructionOutput, ...]]:
        """One run of a fresh instance of the program with ETDump and a debug buffer: the
        outputs and every instruction's written tensors."""
        data = self._programs[key][0]
        try:
            module = upstream_runtime.load_from_buffer(
                data, enable_etdump=True, debug_buffer_size=DEBUG_BUFFER_BYTES)
        except Exception as error:  # noqa: BLE001
            raise SessionError(f"the runtime refused the program: {error}") from None
        outputs = self._forward(module, inputs)
        with tempfile.TemporaryDirectory(prefix="orchestrate-etdump-") as folder:
            etdump, debug = os.path.join(folder, "run.etdp"), os.path.join(folder, "debug.bin")
            module.write_etdump_result_to_file(etdump, debug)
            trace = _instruction_outputs(Path(etdump).read_bytes(), Path(debug).read_bytes())
        return tuple(outputs), trace


def _raw(tensor, buffer: bytes) -> RawValue:
    import numpy as np  # lazy: heavy (numpy)

    dtype = SCALAR_TYPE_NAMES.get(int(tensor.scalar_type.value))
    if dtype is None:
        raise SessionError(f"ETDump tensor of unsupported scalar type {tensor.scalar_type}")
    count = 1
    for size in tensor.sizes:
        count *= int(size)
    itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    start = int(tensor.offset)
    return RawValue(dtype, tuple(int(s) for s in tensor.sizes),
                    tuple(int(s) for s in tensor.strides), buffer[start:start + count * itemsize])


def _instruction_outputs(etdump: bytes, debug: bytes) -> tuple[InstructionOutput, ...]:
    from executorch.devtools.etdump.serialize import (  # lazy: heavy (executorch)
        deserialize_from_etdump_flatcc)

    document = deserialize_from_etdump_flatcc(etdump)
    # run_data[0] is Program::load_method; the last block is the run.
    events = document.run_data[-1].events or []
    names: dict[int, str] = {}
    values: dict[int, list[RawValue]] = {}
    for event in events:
        profile = event.profile_event
        if profile is not None and profile.chain_index == 0 and profile.name != "OPERATOR_CALL":
            names.setdefault(int(profile.instruction_id), profile.name)
        debug_event = event.debug_event
        if debug_event is None or debug_event.chain_index != 0:
            continue  # chain -1: the method's outputs, logged once more at the end
        entry = debug_event.debug_entry
        found = values.setdefault(int(debug_event.instruction_id), [])
        if entry.tensor is not None:
            found.append(_raw(entry.tensor, debug))
        elif entry.tensor_list is not None:
            found.extend(_raw(t, debug) for t in entry.tensor_list.tensors)
    return tuple(InstructionOutput(i, names.get(i, ""), tuple(v)) for i, v in sorted(values.items()))
