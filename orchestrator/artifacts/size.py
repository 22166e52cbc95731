"""`orchestrate size`: where every byte of a `.pte` goes.

Read from the serialized program itself (its ProgramView, kernels/program_view.py):
- constants: each tensor EValue with a constant buffer, attributed to the instructions that
  read it (by op); a constant no instruction reads is dead;
- delegate payloads: each Ethos-U delegate's Vela stream split into command stream, weights
  (with their scales and biases, as Vela packs them) and the stream's own headers;
- the rest: flatbuffer tables (value list, instructions, operator names, tensor metadata) and
  alignment padding, which the schema does not let one tell apart without a flatbuffer walk.

Every figure is bytes counted in the file (source: the .pte), none is estimated.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from kernels.program_view import DelegateCall, KernelCall, ProgramView
from npu_driver.payload import PayloadError, parse_payload


@dataclass(frozen=True)
class ConstantTensor:
    value: int  # EValue index
    buffer: int  # constant buffer index
    shape: tuple[int, ...]
    dtype: str
    nbytes: int  # bytes of its constant buffer (a shared buffer is counted once: 0 elsewhere)
    read_by: tuple[str, ...]  # "instruction op" that read it; empty = dead


@dataclass(frozen=True)
class DelegateBytes:
    index: int
    backend: str
    total: int
    command_stream: int | None
    weights: int | None  # Vela packs weights with their scales and biases
    other: int | None  # block headers, IO tables


@dataclass(frozen=True)
class SizeReport:
    pte: str
    total_bytes: int
    constants: tuple[ConstantTensor, ...]
    constant_bytes_live: int
    constant_bytes_dead: int
    delegates: tuple[DelegateBytes, ...]
    delegate_bytes: int
    metadata_and_padding_bytes: int
    values: int
    dead_values: int  # constant EValues no instruction reads
    by_op: dict[str, int]  # op -> constant bytes it reads (shared buffers counted once)

    @property
    def weight_bytes(self) -> int:
        """The plan's "weights": the constants in the .pte (each buffer once) and the NPU weights
        and scales inside the delegates."""
        return (self.constant_bytes_live + self.constant_bytes_dead
                + sum(d.weights or 0 for d in self.delegates))

    def to_json(self) -> dict:
        return {**asdict(self), "weight_bytes": self.weight_bytes}


def _instruction_ops(view: ProgramView):
    """(instruction index, op name, value indices it reads or writes)."""
    for instruction in view.instructions:
        if isinstance(instruction, KernelCall):
            yield instruction.index, instruction.operator.qualified_name, instruction.args
        elif isinstance(instruction, DelegateCall):
            delegate = view.delegates[instruction.delegate_index]
            yield instruction.index, f"delegate {delegate.backend}", instruction.args


def _delegate_bytes(view: ProgramView) -> tuple[DelegateBytes, ...]:
    found = []
    for delegate in view.delegates:
        data = delegate.payload
        cmd = weights = other = None
        if delegate.backend == "EthosUBackend":
            try:
                payload = parse_payload(data)
                cmd, weights = len(payload.cmd_bytes), len(payload.weight_bytes)
                other = len(data) - cmd - weights
            except PayloadError:
                pass
        found.append(DelegateBytes(delegate.index, delegate.backend, len(data), cmd, weights,
                                   other))
    return tuple(found)


def analyze(pte_path) -> SizeReport:
    pte_path = Path(pte_path)
    data = pte_path.read_bytes()
    view = ProgramView.read(data)
    readers: dict[int, list[str]] = {}
    for position, op, args in _instruction_ops(view):
        for value in args:
            readers.setdefault(value, []).append(f"{position} {op}")
    for value in (*view.inputs, *view.outputs):
        readers.setdefault(value, []).append("program io")
    tensors = [v for v in view.values if v.is_tensor and v.buffer > 0]
    # A buffer may back several values (upstream deduplicates equal constants): it is live when
    # any of them is read, and counted once, under its first reader.
    live_buffers = {v.buffer for v in tensors if readers.get(v.index)}
    constants, counted = [], set()
    live = dead = dead_values = 0
    by_op: dict[str, int] = {}
    for tensor in tensors:
        buffer = tensor.buffer
        read_by = tuple(readers.get(tensor.index, ()))
        dead_values += not read_by
        first = buffer not in counted and (bool(read_by) or buffer not in live_buffers)
        nbytes = len(view.constant_buffers[buffer]) if first else 0
        if first:
            counted.add(buffer)
            if read_by:
                live += nbytes
                for reader in {r.split(" ", 1)[1] for r in read_by}:
                    by_op[reader] = by_op.get(reader, 0) + nbytes
            else:
                dead += nbytes
        constants.append(ConstantTensor(tensor.index, buffer, tensor.sizes,
                                        str(tensor.dtype).replace("torch.", ""), nbytes, read_by))
    delegates = _delegate_bytes(view)
    delegate_total = sum(d.total for d in delegates)
    return SizeReport(str(pte_path), len(data), tuple(constants), live, dead, delegates,
                      delegate_total, len(data) - live - dead - delegate_total, len(view.values),
                      dead_values, dict(sorted(by_op.items(), key=lambda kv: -kv[1])))


def render_text(report: SizeReport) -> str:
    def share(n: int) -> str:
        return f"{n:>9,} B {100.0 * n / report.total_bytes:5.1f}%"

    lines = [f"size {report.pte}: {report.total_bytes:,} B (counted in the file)",
             f"  constants read by instructions   {share(report.constant_bytes_live)}",
             f"  constants no instruction reads   {share(report.constant_bytes_dead)}"
             f"  ({report.dead_values} dead value(s))"]
    for d in report.delegates:
        detail = ""
        if d.command_stream is not None:
            detail = (f"  (command stream {d.command_stream:,} B, weights+scales {d.weights:,} B, "
                      f"headers {d.other:,} B)")
        lines.append(f"  delegate {d.index} ({d.backend})       {share(d.total)}{detail}")
    lines.append(f"  flatbuffer tables and padding    {share(report.metadata_and_padding_bytes)}"
                 f"  ({report.values} values)")
    npu = sum(d.weights or 0 for d in report.delegates)
    lines.append(f"  weights {report.weight_bytes:,} B (the plan's figure): the constants"
                 + (f" and the NPU's weights and scales ({npu:,} B)" if npu else ""))
    if report.by_op:
        lines.append("  constant bytes by op:")
        lines += [f"    {op:<48} {n:>9,} B" for op, n in report.by_op.items()]
    return "\n".join(lines)


def render_json(report: SizeReport) -> str:
    return json.dumps(report.to_json(), indent=2)
