"""One read-only view of an ExecuTorch program, named the same way by every reader.

A `.pte` (or the schema Program a compile serialized) is read here once into frozen values:
the first execution plan's values (tensors with their dtype, sizes, dim_order and where their
bytes live: a constant buffer or a planned buffer at an offset), its instructions (kernel and
delegate calls with the value indices they pass), its operators, its delegates with their
payload bytes, the constant buffers, the planned buffer sizes and the constant methods
(`input0_scale`, ...). `size`, the plan's summary, the Model Explorer overlay, the device check,
the host runtime and the twin read programs through it; upstream's reader is reached through
kernels/upstream_runtime.py only.

Names: a value's `index` is its EValue index, an instruction's `index` its position in its
chain; a tensor's `buffer` is its constant buffer (0: none) and `mem_id`/`mem_offset` its planned
buffer and byte offset (None: not planned); `non_const_buffer_sizes` keeps the schema's name
(index 0 is reserved).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Union

from dataclasses import dataclass, field

import torch

from kernels.upstream_runtime import deserialize_pte

if TYPE_CHECKING:  # types only: importing exir takes seconds
    from executorch.exir.schema import Program

TENSOR = "Tensor"
SCALAR_KINDS = ("Int", "Double", "Bool", "String")
INDEX_LIST_KINDS = ("IntList", "TensorList", "OptionalTensorList")  # items are value indices


@dataclass(frozen=True)
class Value:
    """One EValue. `kind` is the schema's name for it ("Tensor", "Int", "IntList", ...)."""

    index: int
    kind: str
    scalar: int | float | bool | str | None = None  # Int, Double, Bool, String
    # IntList, TensorList, OptionalTensorList: value indices (-1: an absent optional tensor);
    # DoubleList, BoolList: the items themselves.
    items: tuple[int | float | bool, ...] = ()
    # Tensors only:
    scalar_type: int | None = None  # ExecuTorch's ScalarType number (kernels/dtypes.py)
    dtype: torch.dtype | None = None
    sizes: tuple[int, ...] = ()
    dim_order: tuple[int, ...] = ()
    storage_offset: int = 0  # elements
    buffer: int = 0  # constant buffer index; 0: none
    mem_id: int | None = None  # planned buffer (index into non_const_buffer_sizes)
    mem_offset: int | None = None  # bytes into that buffer

    @property
    def is_tensor(self) -> bool:
        return self.kind == TENSOR

    @property
    def is_planned(self) -> bool:
        return self.mem_id is not None

    @property
    def is_constant(self) -> bool:
        """A tensor whose bytes come from a constant buffer, not from planned memory."""
        return self.buffer > 0 and self.mem_id is None

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size() if self.dtype is not None else 0

    @property
    def nbytes(self) -> int:
        """Bytes of a tensor's elements (0 for other values)."""
        count = 1
        for size in self.sizes:
            count *= int(size)
        return count * self.element_bytes if self.is_tensor else 0


@dataclass(frozen=True)
class Operator:
    name: str  # "cortex_m::quantized_add", "aten::add"
    overload: str  # "out", "" when none

    @property
    def qualified_name(self) -> str:
        """"name.overload", or the name when it has no overload (as operators.txt lists it)."""
        return f"{self.name}.{self.overload}" if self.overload else self.name


@dataclass(frozen=True)
class KernelCall:
    index: int  # instruction position in its chain
    op_index: int
    operator: Operator
    args: tuple[int, ...]  # value indices


@dataclass(frozen=True)
class DelegateCall:
    index: int
    delegate_index: int
    args: tuple[int, ...]  # value indices: the delegate's inputs, then its outputs


@dataclass(frozen=True)
class MoveCall:
    index: int
    move_from: int
    move_to: int


@dataclass(frozen=True)
class JumpFalseCall:
    index: int
    cond_value_index: int
    destination_instruction: int


@dataclass(frozen=True)
class FreeCall:
    index: int
    value_index: int


Instruction = Union[KernelCall, DelegateCall, MoveCall, JumpFalseCall, FreeCall]


@dataclass(frozen=True)
class Delegate:
    index: int
    backend: str  # "EthosUBackend"
    payload: bytes = field(repr=False)  # the backend's processed bytes (b"" when not inline)
    inline: bool  # the payload lies in the program's backend_delegate_data


@dataclass(frozen=True)
class ProgramView:
    """The first execution plan of a program ("forward"), its data, and its constant methods."""

    name: str
    values: tuple[Value, ...] = field(repr=False)
    inputs: tuple[int, ...]  # value indices
    outputs: tuple[int, ...]
    chains: tuple[tuple[Instruction, ...], ...] = field(repr=False)
    operators: tuple[Operator, ...] = field(repr=False)
    delegates: tuple[Delegate, ...] = field(repr=False)
    constant_buffers: tuple[bytes, ...] = field(repr=False)  # index 0: the reserved empty one
    non_const_buffer_sizes: tuple[int, ...]  # planned buffers, bytes; index 0 is reserved
    config: dict[str, int | float | bool] = field(default_factory=dict)  # constant methods
    has_data_segments: bool = False  # mutable or named data segments outside the Program
    # The mutable data segment's buffers (index 0 reserved): the initial values of the state a
    # program carries from one `execute` to the next (orchestrator/compilation/program_state.py)
    mutable_buffers: tuple[bytes, ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, program: Program, has_data_segments: bool = False,
           mutable_buffers: tuple[bytes, ...] = ()) -> ProgramView:
        """The view of a schema Program (as a compile serialized it, or as read from a .pte)."""
        from executorch.exir.tensor import get_scalar_type  # lazy: heavy (executorch)

        plan = program.execution_plan[0]
        return cls(
            plan.name or "",
            tuple(_value(index, evalue.val, get_scalar_type)
                  for index, evalue in enumerate(plan.values)),
            tuple(int(i) for i in plan.inputs), tuple(int(i) for i in plan.outputs),
            tuple(tuple(_instruction(position, instruction.instr_args, plan.operators)
                        for position, instruction in enumerate(chain.instructions))
                  for chain in plan.chains),
            tuple(Operator(op.name, op.overload or "") for op in plan.operators),
            tuple(_delegate(index, delegate, program)
                  for index, delegate in enumerate(plan.delegates)),
            # A program without constants serializes no buffer; read back it has the
            # reserved one.
            tuple(bytes(buffer.storage) for buffer in program.constant_buffer) or (b"",),
            tuple(int(size) for size in plan.non_const_buffer_sizes),
            _config_methods(program), has_data_segments, mutable_buffers)

    @classmethod
    def read(cls, pte_bytes: bytes) -> ProgramView:
        """The view of a `.pte` (upstream's exceptions pass through: anything it cannot parse
        raises)."""
        pte = deserialize_pte(pte_bytes)
        return cls.of(pte.program, bool(pte.mutable_data or pte.named_data),
                      tuple(bytes(b.storage) for b in pte.mutable_data or ()))

    @property
    def state_values(self) -> tuple[Value, ...]:
        """The tensors planned in an arena with an initial value: the state the runtime copies
        in at `load_method` and the program writes back on every `execute`."""
        return tuple(v for v in self.values if v.is_tensor and v.is_planned and v.buffer > 0)

    @property
    def state_bytes(self) -> int:
        """The bytes of every state value (0: a program without state)."""
        return sum(v.nbytes for v in self.state_values)

    def state_shared_with(self) -> tuple[tuple[int, int], ...]:
        """(state value, other value) whose planned bytes overlap: what another value writes
        there between two runs is lost from the state. A view of the state (the same bytes,
        the same element count) is the state itself, not counted."""
        shared = []
        for state in self.state_values:
            start, end = state.mem_offset, state.mem_offset + state.nbytes
            for other in self.values:
                if other.index == state.index or not (other.is_tensor and other.is_planned) \
                        or other.mem_id != state.mem_id or other.nbytes == 0:
                    continue
                low = other.mem_offset + other.storage_offset * other.element_bytes
                if (low, other.nbytes) == (start, state.nbytes):
                    continue
                if low < end and start < low + other.nbytes:
                    shared.append((state.index, other.index))
        return tuple(shared)

    @property
    def instructions(self) -> tuple[Instruction, ...]:
        return self.chains[0] if self.chains else ()

    @property
    def arena_bytes(self) -> int:
        """The planned memory: the sum of the non-constant buffers."""
        return sum(self.non_const_buffer_sizes)

    @property
    def input_values(self) -> tuple[Value, ...]:
        return tuple(self.values[i] for i in self.inputs)

    @property
    def output_values(self) -> tuple[Value, ...]:
        return tuple(self.values[i] for i in self.outputs)

    @property
    def operator_names(self) -> tuple[str, ...]:
        """The qualified names of the program's operators, sorted, each once."""
        return tuple(sorted({op.qualified_name for op in self.operators}))

    def kernel_calls(self, chain: int = 0, stop: int | None = None) -> Iterator[KernelCall]:
        """The kernel calls of a chain, up to instruction `stop` (exclusive)."""
        instructions = self.chains[chain]
        for instruction in instructions[:stop] if stop is not None else instructions:
            if isinstance(instruction, KernelCall):
                yield instruction

    def delegate_calls(self, chain: int = 0) -> Iterator[DelegateCall]:
        for instruction in self.chains[chain]:
            if isinstance(instruction, DelegateCall):
                yield instruction

    def tensor_indices(self, index: int) -> tuple[int, ...]:
        """The tensor values an argument names: itself, or the items of a tensor list."""
        value = self.values[index]
        if value.kind == "TensorList":
            return tuple(int(i) for i in value.items)
        if value.kind == "OptionalTensorList":
            return tuple(int(i) for i in value.items if i >= 0)
        return (index,) if value.is_tensor else ()


def _value(index: int, val, get_scalar_type) -> Value:
    kind = type(val).__name__
    if kind == TENSOR:
        info = val.allocation_info
        planned = info is not None
        return Value(index, kind, scalar_type=int(getattr(val.scalar_type, "value",
                                                          val.scalar_type)),
                     dtype=get_scalar_type(val.scalar_type),
                     sizes=tuple(int(s) for s in val.sizes),
                     dim_order=tuple(int(d) for d in val.dim_order),
                     storage_offset=int(val.storage_offset), buffer=int(val.data_buffer_idx),
                     mem_id=int(info.memory_id) if planned else None,
                     mem_offset=(int(info.memory_offset_low) + (int(info.memory_offset_high) << 32)
                                 if planned else None))
    if kind == "Int":
        return Value(index, kind, scalar=int(val.int_val))
    if kind == "Double":
        return Value(index, kind, scalar=float(val.double_val))
    if kind == "Bool":
        return Value(index, kind, scalar=bool(val.bool_val))
    if kind == "String":
        return Value(index, kind, scalar=val.string_val)
    if kind in INDEX_LIST_KINDS:
        return Value(index, kind, items=tuple(int(i) for i in val.items))
    if kind in ("DoubleList", "BoolList"):
        return Value(index, kind, items=tuple(val.items))
    return Value(index, kind)  # Null


def _instruction(position: int, call, operators) -> Instruction:
    kind = type(call).__name__
    if kind == "KernelCall":
        op = operators[call.op_index]
        return KernelCall(position, int(call.op_index), Operator(op.name, op.overload or ""),
                          tuple(int(a) for a in call.args))
    if kind == "DelegateCall":
        return DelegateCall(position, int(call.delegate_index), tuple(int(a) for a in call.args))
    if kind == "MoveCall":
        return MoveCall(position, int(call.move_from), int(call.move_to))
    if kind == "JumpFalseCall":
        return JumpFalseCall(position, int(call.cond_value_index),
                             int(call.destination_instruction))
    if kind == "FreeCall":
        return FreeCall(position, int(call.value_index))
    raise ValueError(f"instruction {position} has unknown kind {kind}")


def _delegate(index: int, delegate, program) -> Delegate:
    from executorch.exir.schema import DataLocation  # lazy: heavy (executorch)

    inline = delegate.processed.location == DataLocation.INLINE
    payload = bytes(program.backend_delegate_data[delegate.processed.index].data) if inline \
        else b""
    return Delegate(index, delegate.id, payload, inline)


def _config_methods(program) -> dict[str, int | float | bool]:
    """The constant methods (`input0_scale`, ...): plans with one output and no instructions."""
    config: dict[str, int | float | bool] = {}
    for plan in program.execution_plan[1:]:
        if len(plan.outputs) != 1 or plan.chains and plan.chains[0].instructions:
            continue
        value = plan.values[plan.outputs[0]].val
        kind = type(value).__name__
        if kind == "Double":
            config[plan.name] = float(value.double_val)
        elif kind == "Int":
            config[plan.name] = int(value.int_val)
        elif kind == "Bool":
            config[plan.name] = bool(value.bool_val)
    return config
