"""The host twin of the device runtime: executes a final `.pte` byte for byte.

The host ExecuTorch runtime cannot run our programs (no `cortex_m::` kernels, no EthosUBackend),
and running the edge program in Python treats tensors logically, so it cannot see a layout
mismatch at a CPU/NPU boundary. The twin instead walks the first chain of the program's
ProgramView (kernels/program_view.py) the way `runtime/executor/method.cpp` does, with every tensor EValue a slice of the planned memory arena
(or of the program's constant data), holding bytes laid out by its dim_order:

- a KernelCall runs through `kernels.reference`, which reads and writes those bytes the way the
  device kernel does (CMSIS-NN: NHWC activations; portable: dim_order, raw or row-major);
- a DelegateCall to EthosUBackend is matched by the SHA-256 of its payload to a partition in
  `<stem>.artifacts/manifest.json`, whose TOSA graph (itself hash-checked) runs in the TOSA
  reference model. Input and output bytes are handed over exactly as
  `backends/arm/runtime/EthosUBackend.cpp::execute` (inputs: one memcpy of `nbytes` into the
  scratch at the Vela offset, after the dtype/element-size and element-count checks) and
  `EthosUBackend_Cortex_M.cpp::platform_execute` (outputs: memcpy, or the chunked
  `copy_with_layout_adjustment` when the tensor and Vela byte counts differ) do it in ExecuTorch
  commit cff6f4dd32e6 (August 2026; the same logic as the 1.5.1 wheel's `arm_vela.py` format).
  No re-layout happens anywhere: the TOSA graph sees the producer's bytes reinterpreted as its
  input shape, which is what the NPU sees.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from kernels import reference
from kernels.program_view import (DelegateCall, FreeCall, JumpFalseCall, KernelCall, MoveCall,
                                  ProgramView, Value)
from kernels.reference import KernelError, KernelFault, LayoutRead, RawTensor
from kernels.upstream_runtime import UpstreamVersionError
from orchestrator.artifacts.manifest import MANIFEST_NAME, Manifest, artifacts_dir_for
from orchestrator.errors import NotRun
from orchestrator.verification.floats import within_float_bound
from orchestrator.verification.npu import NpuExecutor
from orchestrator.verification.program import (ETHOS_U_BACKEND, NpuPartition, TwinError,
                                               load_partitions, load_reference)
# EthosUBackend.cpp accepts these (ExecuTorch dtype, Vela element size) pairs for inputs.
_NPU_INPUT_TYPES = {(torch.int32, 4), (torch.int8, 1), (torch.uint8, 1), (torch.int16, 2),
                    (torch.bool, 1)}


class TwinCannotRun(NotRun):
    """The program is fine as far as we know, but the twin has no host execution for one of its
    instructions: verification did not run (exit 5), which is neither a pass nor the user's fault."""


@dataclass(frozen=True)
class DeviceFault:
    """A check the device runtime or a kernel would fail at this instruction; its message is a
    catalogue entry's text (kernels/faults.py, tests/test_architecture.py)."""

    instruction: int
    op: str
    check: str
    message: str
    key: str = ""  # the catalogue entry the message comes from


@dataclass(frozen=True)
class TraceEntry:
    """One executed instruction: what ran, on which EValues, how bytes were interpreted."""

    instruction: int
    kind: str  # kernel | delegate | move | jump | free
    op: str
    inputs: tuple[int, ...]  # tensor EValue indices read
    outputs: tuple[int, ...]  # tensor EValue indices written
    semantics: str
    layout_reads: tuple[LayoutRead, ...]
    seconds: float


@dataclass(frozen=True)
class TwinRun:
    outputs: tuple[torch.Tensor, ...]  # logical tensors (read by each output's dim_order)
    output_bytes: tuple[bytes, ...]  # the output EValues' bytes as the device leaves them
    input_bytes: tuple[bytes, ...]  # the input EValues' bytes as the twin wrote them
    intermediates: dict[int, torch.Tensor]  # EValue index -> logical tensor after it was written
    op_trace: tuple[TraceEntry, ...]
    faults: tuple[DeviceFault, ...]
    seconds: float
    took: tuple[TakenFloat, ...] = ()  # the device's float values the run carried on from


@dataclass(frozen=True)
class DeviceFloats:
    """One sample's float values from a device, for the twin to take (floats.py)."""

    origin: str  # how they were found: RUNTIME_TRACE or OUTPUT_DIGESTS
    values: dict  # {instruction: the values for its outputs, outputs last}


RUNTIME_TRACE = "the host runtime's traced run of the same inputs"
OUTPUT_DIGESTS = ("the floats whose move across their rounding boundary gives the output digests "
                  "the device logged (boundary_search.py)")


@dataclass(frozen=True)
class TakenFloat:
    """A float output the twin took from a device's run (within the summation-order bound)."""

    instruction: int
    op: str
    value: int  # the EValue
    elements: int  # elements whose bits differed


@dataclass(frozen=True)
class TensorSpec:
    dtype: torch.dtype
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]


@dataclass(frozen=True)
class TwinProgram:
    """A parsed `.pte` with its delegates resolved to hash-checked TOSA graphs."""

    pte_path: Path
    pte_bytes: bytes = field(repr=False)
    view: ProgramView = field(repr=False)
    partitions: tuple[NpuPartition, ...]  # indexed like view.delegates
    config: dict  # config methods, e.g. {"input0_scale": 0.03, ...}
    isa_tier: str | None = None  # the core's ISA tier from the manifest: kernels differ per tier
    manifest: Manifest | None = field(default=None, repr=False)  # None: no artifacts folder
    # The reference programs of the artifacts folder, read on first use (name -> program, module)
    references: dict = field(default_factory=dict, repr=False, compare=False)
    # A program with state: the arenas one run leaves for the next, as the device's Method
    # keeps its planned memory from one `execute` to the next ("arenas"; `reset` drops them)
    carried: dict = field(default_factory=dict, repr=False, compare=False)
    # Float values a device's kernels wrote (the host runtime's traced run) that differ from the
    # twin's within the summation-order bound (floats.py), per sample (`input_key` of its
    # program inputs): a DeviceFloats. Recorded where taking them makes a device's outputs and
    # the twin's agree; a bundle's expectation takes them again.
    device_floats: dict = field(default_factory=dict, repr=False, compare=False)

    def require_manifest(self, action: str = "verify") -> Manifest:
        """The hash-checked manifest; without an artifacts folder, the one-line refusal."""
        return self.manifest if self.manifest is not None else Manifest.load(self.pte_path,
                                                                             action)

    def reference(self, name: str):
        """(ExportedProgram, module) of `float.pt2` or `quantized.pt2`, loaded once as data."""
        if name not in self.references:
            self.references[name] = load_reference(self.require_manifest().file(name))
        return self.references[name]

    @staticmethod
    def _spec(value: Value) -> TensorSpec:
        return TensorSpec(value.dtype, value.sizes, value.dim_order)

    @property
    def input_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(self._spec(v) for v in self.view.input_values)

    @property
    def output_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(self._spec(v) for v in self.view.output_values)

    def tensor_indices(self, index: int) -> tuple[int, ...]:
        """The tensor EValues an argument names: itself, or the items of a tensor list."""
        return self.view.tensor_indices(index)

    def producer(self, value_index: int) -> tuple[int, KernelCall | DelegateCall, str] | None:
        """The (instruction index, KernelCall/DelegateCall, op name) that writes an EValue."""
        for call in self.view.instructions:
            if isinstance(call, KernelCall):
                op = call.operator
                outs = reference.out_positions(op.name, op.overload)
                if any(value_index in self.tensor_indices(call.args[p]) for p in outs):
                    return call.index, call, f"{op.name}.{op.overload}"
            elif isinstance(call, DelegateCall):
                partition = self.partitions[call.delegate_index]
                n_in = len(partition.payload.inputs) if partition else 0
                if value_index in call.args[n_in:]:
                    name = partition.delegate_name if partition else f"delegate {call.delegate_index}"
                    return call.index, call, f"{ETHOS_U_BACKEND} {name}"
        return None

    @property
    def accelerator(self) -> str | None:
        """The NPU the program was compiled for (manifest target), None for CPU-only."""
        npu = self.manifest.target.get("npu") if self.manifest is not None else None
        return npu if isinstance(npu, str) else None

    def npu_executor(self, npu_model: str = "auto") -> NpuExecutor:
        return NpuExecutor(npu_model, self.accelerator)

    def run(self, inputs: tuple[torch.Tensor, ...], keep_intermediates: bool = False,
            npu: NpuExecutor | None = None, device_floats: dict | None = None) -> TwinRun:
        """Execute the program; `npu` computes its Ethos-U invocations (default: the
        functional model on the Vela command stream where the NPU is modelled).
        `device_floats` ({instruction: the values a device logged for it, outputs last}): where
        a kernel's float output differs from the device's within the summation-order bound,
        the twin carries on from the device's value (floats.py says why; `TwinRun.took`)."""
        execution = _Execution(self, keep_intermediates, npu or self.npu_executor(),
                               self.carried.get("arenas"), device_floats)
        if self.has_state:
            self.carried["arenas"] = execution.arenas
        return execution.run(tuple(inputs))

    @property
    def has_state(self) -> bool:
        """The program carries state from one run to the next (its mutable buffers)."""
        return bool(self.view.state_values)

    def state(self) -> tuple[torch.Tensor, ...]:
        """The state values (logical tensors, in value order) as the next run reads them."""
        execution = _Execution(self, False, self.npu_executor(), self.carried.get("arenas"))
        return tuple(reference.read_by_dim_order(execution.values[v.index])
                     for v in self.view.state_values)

    def reset(self) -> None:
        """Start the program's state again from its initial values (the device reloads the
        method), and the references' (read again from their files); no effect on a program
        without state."""
        if self.has_state:
            self.carried.clear()
            self.references.clear()


def input_key(inputs) -> tuple[bytes, ...]:
    """A sample's key in `TwinProgram.device_floats`: its program inputs' bytes."""
    return tuple(t.detach().contiguous().numpy().tobytes() for t in inputs)


def load_twin(pte_path) -> TwinProgram:
    """Parse the `.pte` and resolve every Ethos-U delegate to its hash-checked TOSA graph."""
    pte_path = Path(pte_path)
    if not pte_path.is_file():
        raise TwinError(f"program {pte_path} does not exist")
    pte_bytes = pte_path.read_bytes()
    try:
        view = ProgramView.read(pte_bytes)
    except UpstreamVersionError:
        raise  # an unsupported ExecuTorch is that, not "not a .pte"
    except Exception as error:  # noqa: BLE001 - any parse failure means "not a .pte"
        raise TwinError(f"{pte_path} is not an ExecuTorch program ({type(error).__name__}: "
                        f"{error})") from None
    if view.has_data_segments and not view.mutable_buffers:
        raise TwinError(f"{pte_path.name} has named data segments, which the twin does not "
                        "load")
    for value in view.state_values:  # data: each state's initial value is where it says
        if value.buffer >= len(view.mutable_buffers) or \
                len(view.mutable_buffers[value.buffer]) < value.nbytes:
            raise TwinError(f"{pte_path.name}: state value {value.index} names initial data "
                            f"{value.buffer} of its mutable segment, which does not hold its "
                            f"{value.nbytes} B; recompile it")
    manifest = (Manifest.load(pte_path, pte_bytes=pte_bytes)
                if (artifacts_dir_for(pte_path) / MANIFEST_NAME).is_file() else None)
    return TwinProgram(pte_path, pte_bytes, view, load_partitions(pte_path, view, manifest),
                       dict(view.config), manifest.isa_tier if manifest else None, manifest)


def as_program(program) -> TwinProgram:
    """`program` when it is already loaded (one verify reads its files once), else the `.pte`
    path it names, loaded."""
    return program if isinstance(program, TwinProgram) else load_twin(program)


def run_twin(pte_path, inputs: tuple[torch.Tensor, ...], keep_intermediates: bool = False,
             npu_model: str = "auto") -> TwinRun:
    """Execute the `.pte` on `inputs` (logical tensors in the program's input dtypes)."""
    twin = load_twin(pte_path)
    return twin.run(tuple(inputs), keep_intermediates, twin.npu_executor(npu_model))


def _without_ones(shape) -> tuple[int, ...]:
    return tuple(int(d) for d in shape if d != 1)


class _Execution:
    """One run's state: the arena, the EValues and the trace."""

    def __init__(self, twin: TwinProgram, keep_intermediates: bool, npu: NpuExecutor,
                 arenas: list[bytearray] | None = None, device_floats: dict | None = None):
        self.twin = twin
        self.device_floats = device_floats or {}
        self.took: list[TakenFloat] = []
        self.npu = npu
        self.view = twin.view
        self.keep = keep_intermediates
        carried = arenas is not None
        self.arenas = arenas if carried else [bytearray(size)
                                              for size in self.view.non_const_buffer_sizes]
        # Tensors become their bytes; other values stay as the view has them.
        self.values: list[RawTensor | Value] = [
            self._tensor(value) if value.is_tensor else value for value in self.view.values]
        if not carried:  # `load_method` copies each state's initial value into its arena
            for value in self.view.state_values:
                initial = self.view.mutable_buffers[value.buffer]
                self.values[value.index].data[:] = initial[:value.nbytes]
        self.trace: list[TraceEntry] = []
        self.faults: list[DeviceFault] = []
        self.intermediates: dict[int, torch.Tensor] = {}

    def _tensor(self, value: Value) -> RawTensor:
        nbytes = value.nbytes
        offset = value.storage_offset * value.element_bytes
        if value.is_planned:
            arena = self.arenas[value.mem_id]
            start = value.mem_offset + offset
            if start + nbytes > len(arena):
                raise TwinError(f"EValue {value.index} ({nbytes} B at {start}) overruns memory "
                                f"arena {value.mem_id} of {len(arena)} B")
            data = memoryview(arena)[start:start + nbytes]
        elif value.buffer > 0:  # a constant (a planned one above is a state)
            storage = self.view.constant_buffers[value.buffer]
            data = memoryview(bytearray(storage[offset:offset + nbytes]))
        else:
            data = memoryview(bytearray(nbytes))  # unplanned: the runtime would allocate it
        return RawTensor(value.dtype, value.sizes, value.dim_order, data)

    def resolve(self, index: int):
        value = self.values[index]
        if isinstance(value, RawTensor):
            return value
        kind = value.kind
        if kind in ("Int", "Double", "Bool", "String"):
            return value.scalar
        if kind == "Null":
            return None
        if kind == "IntList":
            return [self.resolve(i) for i in value.items]
        if kind in ("DoubleList", "BoolList"):
            return list(value.items)
        if kind == "TensorList":
            return [self.resolve(i) for i in value.items]
        if kind == "OptionalTensorList":
            return [None if i < 0 else self.resolve(i) for i in value.items]
        return value

    def _set_inputs(self, inputs: tuple[torch.Tensor, ...]) -> tuple[bytes, ...]:
        indices = self.view.inputs
        if len(inputs) != len(indices):
            raise TwinError(f"the program takes {len(indices)} input(s), got {len(inputs)}")
        written = []
        for position, (index, tensor) in enumerate(zip(indices, inputs)):
            target = self.values[index]
            if not isinstance(target, RawTensor):
                raise TwinError(f"program input {position} is not a tensor")
            if tuple(tensor.shape) != target.sizes or tensor.dtype != target.dtype:
                hint = ""
                if target.dtype == torch.int8 and tensor.dtype.is_floating_point:
                    hint = (f"; the program takes int8 (--io int8): quantize with "
                            f"input{position}_scale/_zp")
                raise TwinError(f"program input {position} is {list(target.sizes)} "
                                f"{target.dtype}, got {list(tensor.shape)} {tensor.dtype}{hint}")
            reference.write_by_dim_order(target, tensor)
            written.append(bytes(target.data))
        return tuple(written)

    def run(self, inputs: tuple[torch.Tensor, ...]) -> TwinRun:
        start = time.perf_counter()
        input_bytes = self._set_inputs(inputs)
        instructions = self.view.instructions
        position = 0
        while position < len(instructions):
            position = self._step(position, instructions[position])
        outputs, output_bytes = [], []
        for index in self.view.outputs:
            raw = self.values[index]
            outputs.append(reference.read_by_dim_order(raw))
            output_bytes.append(bytes(raw.data))
        return TwinRun(tuple(outputs), tuple(output_bytes), input_bytes, self.intermediates,
                       tuple(self.trace), tuple(self.faults), time.perf_counter() - start,
                       tuple(self.took))

    def _record(self, position, kind, op, inputs, outputs, semantics, reads, began):
        if self.keep:
            for index in outputs:
                self.intermediates[index] = reference.read_by_dim_order(self.values[index])
        self.trace.append(TraceEntry(position, kind, op, tuple(inputs), tuple(outputs), semantics,
                                     tuple(reads), time.perf_counter() - began))

    def _step(self, position: int, call) -> int:
        began = time.perf_counter()
        if isinstance(call, KernelCall):
            self._kernel(position, call, began)
        elif isinstance(call, DelegateCall):
            self._delegate(position, call, began)
        elif isinstance(call, MoveCall):
            self.values[call.move_to] = self.values[call.move_from]
            self._record(position, "move", "move", (), (), "EValue move", (), began)
        elif isinstance(call, JumpFalseCall):
            condition = self.resolve(call.cond_value_index)
            if isinstance(condition, RawTensor):
                condition = bool(reference.read_by_dim_order(condition).item())
            self._record(position, "jump", "jump_false", (), (), "control flow", (), began)
            if not condition:
                return call.destination_instruction
        elif isinstance(call, FreeCall):
            self._record(position, "free", "free", (), (), "no-op for planned memory", (), began)
        else:
            raise TwinError(f"instruction {position} has unknown kind {type(call).__name__}")
        return position + 1

    def _kernel(self, position: int, call: KernelCall, began: float) -> None:
        op = call.operator
        key = f"{op.name}.{op.overload or 'default'}"
        args = [self.resolve(i) for i in call.args]
        try:
            outs = reference.out_positions(op.name, op.overload)
            result = reference.execute(op.name, op.overload, args, self.twin.isa_tier)
        except KernelError as error:
            raise TwinCannotRun(f"not run: the twin cannot execute instruction {position} "
                                f"({key}): {error}") from None
        except (RuntimeError, ValueError, TypeError, IndexError) as error:
            # torch refused the host computation (a CPU kernel limit, not the program's fault).
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise TwinCannotRun(f"not run: the twin's host computation of instruction {position} "
                                f"({key}) failed: {type(error).__name__}: {first[:200]}") from error
        for fault in result.faults:
            self.faults.append(DeviceFault(position, key, fault.check, fault.message, fault.key))
        # Tensor-list arguments (cat's inputs, split's outputs) stand for their items.
        inputs = [t for p, i in enumerate(call.args[:len(args)]) if p not in outs
                  for t in self.twin.tensor_indices(i)]
        outputs = [t for p in outs for t in self.twin.tensor_indices(call.args[p])]
        if position in self.device_floats:
            self._take_device_floats(position, key, inputs, outputs)
        self._record(position, "kernel", key, inputs, outputs, result.semantics,
                     result.layout_reads, began)

    def _take_device_floats(self, position: int, key: str, inputs, outputs) -> None:
        """Carry on from the device's float outputs of this instruction where they differ
        from the twin's within the summation-order bound (floats.py)."""
        logged = self.device_floats[position]
        values = logged[-len(outputs):] if outputs else ()
        if len(values) != len(outputs):
            return
        read = sum(self.values[i].numel for i in inputs if isinstance(self.values[i], RawTensor))
        written = sum(self.values[i].numel for i in outputs)
        reduction = max(1, read // max(1, written))
        for index, device in zip(outputs, values):
            raw = self.values[index]
            if not raw.dtype.is_floating_point:
                continue
            mine = reference.read_by_dim_order(raw)
            if not within_float_bound(device, mine, reduction):
                continue
            same_bits = (mine.contiguous().view(torch.int32) ==
                         device.contiguous().view(torch.int32)) \
                if mine.dtype == torch.float32 else (mine == device)
            differing = int((~same_bits).sum())
            if differing:
                reference.write_by_dim_order(raw, device)
                self.took.append(TakenFloat(position, key, index, differing))

    def _delegate(self, position: int, call: DelegateCall, began: float) -> None:
        partition = self.twin.partitions[call.delegate_index]
        payload = partition.payload
        n_in, n_out = len(payload.inputs), len(payload.outputs)
        op = f"{ETHOS_U_BACKEND} {partition.delegate_name}"
        if len(call.args) != n_in + n_out:
            raise TwinError(f"instruction {position} ({op}) passes {len(call.args)} EValues; "
                            f"the payload declares {n_in} inputs and {n_out} outputs")
        ins = [self.resolve(i) for i in call.args[:n_in]]
        outs = [self.resolve(i) for i in call.args[n_in:]]
        reads: list[LayoutRead] = []
        arrays = []
        for slot, (tensor, vela, spec) in enumerate(zip(ins, payload.inputs, partition.io.inputs)):
            if (tensor.dtype, vela.elem_size) not in _NPU_INPUT_TYPES:
                fault = reference.device_fault("npu-input-type", op, "input type", slot=slot,
                                               dtype=tensor.dtype, elem_size=vela.elem_size)
                self.faults.append(DeviceFault(position, op, fault.check, fault.message,
                                               fault.key))
            if tensor.numel != vela.elements:
                raise TwinError(f"instruction {position} ({op}): input {slot} has "
                                f"{tensor.numel} elements, Vela expects {vela.elements} (the "
                                "device rejects the call)")
            if _without_ones(tensor.physical_shape) != _without_ones(spec.shape):
                reads.append(LayoutRead(f"input {slot}", tensor.dim_order,
                                        f"TOSA {list(spec.shape)}", "read"))
            # EthosUBackend.cpp: one memcpy of tensor_in.nbytes() into the scratch.
            raw = bytes(tensor.data[:tensor.nbytes])
            arrays.append(np.frombuffer(raw, dtype=spec.numpy_type).reshape(spec.shape).copy())
        results = self.npu.run(partition, arrays, f"instruction {position} ({op})")
        for slot, (tensor, vela, spec, array) in enumerate(
                zip(outs, payload.outputs, partition.io.outputs, results)):
            if _without_ones(tensor.physical_shape) != _without_ones(spec.shape):
                reads.append(LayoutRead(f"output {slot}", tensor.dim_order,
                                        f"TOSA {list(spec.shape)}", "write"))
            fault = _copy_output(array.tobytes(), vela, tensor, op, slot)
            if fault:
                self.faults.append(DeviceFault(position, op, fault.check, fault.message,
                                               fault.key))
        self._record(position, "delegate", op,
                     [i for i in call.args[:n_in]], [i for i in call.args[n_in:]],
                     f"{self.npu.method} [{partition.tosa_relpath}]", reads, began)


def _copy_output(scratch: bytes, vela, tensor: RawTensor, op: str,
                 slot: int) -> KernelFault | None:
    """Copy one delegate output from the Ethos-U scratch into its EValue as the device does;
    the fault (a catalogue entry) where the device refuses the copy.

    EthosUBackend_Cortex_M.cpp: memcpy when the byte counts agree; otherwise
    `copy_with_layout_adjustment` copies `tensor_bytes / chunk_count` bytes out of every Vela
    chunk (the last 6-D dim, possibly padded), or expands packed int4 to int8.
    """
    tensor_bytes = tensor.nbytes
    if tensor_bytes == vela.nbytes:
        tensor.data[:tensor_bytes] = scratch[:tensor_bytes]
        return None
    chunk_count = math.prod(d or 1 for d in vela.shape6d[:-1])
    vela_chunk = (vela.shape6d[-1] or 1) * vela.elem_size
    if tensor_bytes % chunk_count:
        return reference.device_fault("npu-output-chunks", op, "output copy", slot=slot,
                                      tensor_bytes=tensor_bytes, chunk_count=chunk_count)
    chunk = tensor_bytes // chunk_count
    if vela_chunk < chunk:
        if chunk % vela_chunk:
            return reference.device_fault("npu-output-chunk-bytes", op, "output copy", slot=slot,
                                          chunk=chunk, vela_chunk=vela_chunk)
        if chunk == 2 * vela_chunk and vela.elem_size == 1 and tensor.dtype == torch.int8:
            packed = np.frombuffer(scratch, dtype=np.uint8)[:chunk_count * vela_chunk]
            low = (packed & 0x0F).astype(np.int16)
            high = ((packed >> 4) & 0x0F).astype(np.int16)
            low[low >= 8] -= 16
            high[high >= 8] -= 16
            tensor.data[:tensor_bytes] = np.stack([low, high], axis=1).astype(np.int8).tobytes()
            return None
        return reference.device_fault("npu-output-expansion", op, "output copy", slot=slot,
                                      factor=chunk // vela_chunk, elem_size=vela.elem_size)
    out = bytearray(tensor_bytes)
    for c in range(chunk_count):
        out[c * chunk:(c + 1) * chunk] = scratch[c * vela_chunk:c * vela_chunk + chunk]
    tensor.data[:tensor_bytes] = bytes(out)
    return None
