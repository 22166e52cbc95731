"""The plan's summary: what its rows add up to (ops, MACs, partitions, transitions, memory, latency,
the operators to register), computed once and shown by every view (orchestrator/reports/coverage.py
for text, Markdown and JSON; html.py; explorer.py). The model of the report; it renders nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from cost_models.graph_shapes import numel
from kernels.program_view import ProgramView
from orchestrator.errors import UserError
from platforms.memory_fit import MemoryUse

if TYPE_CHECKING:  # types only; the module imports heavy upstream packages
    from orchestrator.compilation.quantization_points import ActivationRanges
    from orchestrator.planning.structure import ModuleGroup, Recurrence
    from platforms.memory_placement import MemoryPlacement


@dataclass(frozen=True)
class Summary:
    ops: dict  # placement -> op count (kind == op)
    macs: dict  # placement -> MACs
    npu_mac_coverage_pct: float
    npu_partitions: int
    transitions: int  # CPU<->NPU switches in execution order
    hidden_rows: dict  # kind -> count of hidden work rows (quantize, layout, NPU invocation)
    memory: tuple[MemoryUse, ...]
    fits: bool
    pte_bytes: int
    weight_bytes: int
    arena_bytes: int
    npu_scratch_bytes: int
    cmsis_scratch_bytes: int
    operators: tuple[str, ...]  # operators the firmware must register (selective build)
    missing_operators: tuple[str, ...] | None  # vs --runner-ops, None when not checked
    latency_seconds: float | None
    latency_cycles_cpu: int | None
    latency_source: str | None
    per_placement_seconds: dict[str, float]
    npu_utilisation: dict  # partition -> MAC utilisation from Vela
    npu_traffic: dict  # partition -> memory -> bytes per inference, from Vela
    device_faults: tuple[str, ...]  # "row: message" for each op the device runtime would fail
    placement: MemoryPlacement | None = None
    modules: tuple[ModuleGroup, ...] = ()  # rows by source module
    recurrences: tuple[Recurrence, ...] = ()  # unrolled recurrent layers
    hidden_by_engine: dict | None = None  # placement (npu | cmsis-nn | portable) -> {kind: count}
    # With an instructions calibration: the CPU rows' estimated instructions retired and the
    # calibration files they came from; None without one.
    instructions: int | None = None
    instructions_source: str | None = None
    # With calibration data given: each activation quantization point's scale, zero point and
    # clipping rate on it (orchestrator/compilation/quantization_points.py); else None.
    activation_ranges: ActivationRanges | None = None


def constant_tensor_bytes(view: ProgramView) -> int:
    """Bytes of the CPU-side constant tensors (weights, biases, LUTs, kernel sums) in the .pte,
    each constant buffer once however many values share it (as `orchestrate size` counts
    them)."""
    buffers = {v.buffer for v in view.values if v.is_tensor and v.is_constant and v.buffer > 0}
    return sum(len(view.constant_buffers[b]) for b in buffers)


def read_runner_ops(path: str) -> set[str]:
    file = Path(path)
    if not file.is_file():
        raise UserError(f"--runner-ops file '{path}' not found; give a text file with one "
                        "operator per line (e.g. cortex_m::quantized_conv2d.out)")
    ops = set()
    for line in file.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            ops.add(line)
    return ops


def _cmsis_scratch_bytes(final_program) -> int:
    """Bytes of the largest scratch buffer the Cortex-M passes allocate for a CMSIS-NN kernel
    (each lives for its op only, so the arena reuses them: their sum may exceed the arena)."""
    total = 0
    for node in final_program.graph.nodes:
        if node.op != "call_function" or "cortex_m" not in str(node.target):
            continue
        # Scratch buffers are positional alloc arguments; `out=` allocs are the op's outputs.
        for arg in node.args:
            if isinstance(arg, torch.fx.Node) and "alloc" in str(arg.target) and arg.args:
                spec = arg.args[0]
                if isinstance(spec, tuple) and spec and isinstance(spec[0], tuple):
                    total = max(total, numel(spec[0]))
    return total


CONSTANT_TENSOR_ALIGNMENT = 16  # exir/_serialize/_program.py ALIGNMENT, the serializer's default


def constant_segment_bytes(view: ProgramView) -> int:
    """Bytes of the program's constant segment: the CPU weights, as the runtime loads them
    (one block; runtime/executor/program.cpp). The serializer packs `constant_buffer` entries
    each padded to the alignment, the last one unpadded (_extract_constant_segment)."""
    sizes = [len(b) for b in view.constant_buffers]
    if not any(sizes):
        return 0
    padded = [-(-n // CONSTANT_TENSOR_ALIGNMENT) * CONSTANT_TENSOR_ALIGNMENT for n in sizes[:-1]]
    return sum(padded) + sizes[-1]


def summarize(compiled, rows, estimates: dict, runner_ops: set[str] | None,
              placement) -> Summary:
    """`placement`: the plan's memory stage result (platforms.memory_placement)."""
    target = compiled.target
    ops = {p: 0 for p in ("npu", "cmsis-nn", "portable")}
    macs = {p: 0 for p in ("npu", "cmsis-nn", "portable")}
    hidden: dict[str, int] = {}
    by_engine: dict[str, dict[str, int]] = {}
    seconds = {p: 0.0 for p in ("npu", "cmsis-nn", "portable")}
    for row in rows:
        if row.kind == "op":
            ops[row.placement] += 1
            macs[row.placement] += row.macs
        else:
            hidden[row.kind] = hidden.get(row.kind, 0) + 1
            engine = by_engine.setdefault(row.placement, {})
            engine[row.kind] = engine.get(row.kind, 0) + 1
        if row.cost is not None:
            seconds[row.placement] += row.cost.seconds
    total_macs = sum(macs.values())
    sides = [("npu" if r.placement == "npu" else "cpu") for r in rows]
    transitions = sum(1 for a, b in zip(sides, sides[1:]) if a != b)
    scratch = {k: e.scratch_bytes for k, e in estimates.items()}
    weight_bytes = sum(e.weight_bytes for e in estimates.values()) + constant_tensor_bytes(
        compiled.program_view)
    arena = compiled.arena_bytes
    memory = list(placement.items)
    operators = compiled.program_view.operator_names
    missing = None
    if runner_ops is not None:
        missing = tuple(op for op in operators if op not in runner_ops
                        and op.split(".")[0] not in runner_ops)
    costs = [r.cost for r in rows if r.cost is not None]
    latency = sum(c.seconds for c in costs) if costs else None
    sources = []
    for c in costs:
        for part in c.source.split("+"):
            if part not in sources:
                sources.append(part)
    estimated = [c for c in costs if c.instructions is not None]
    calibrations = list(dict.fromkeys(c.instructions_source.split(" (")[0] for c in estimated))
    return Summary(
        instructions=sum(c.instructions for c in estimated) if estimated else None,
        instructions_source="; ".join(calibrations) if calibrations else None,
        ops=ops, macs=macs,
        npu_mac_coverage_pct=(100.0 * macs["npu"] / total_macs) if total_macs else 0.0,
        npu_partitions=len(estimates) if target.npu else 0,
        transitions=transitions, hidden_rows=hidden, hidden_by_engine=by_engine,
        memory=tuple(memory),
        fits=all(m.fits for m in memory), pte_bytes=len(compiled.pte_bytes),
        weight_bytes=weight_bytes, arena_bytes=arena,
        # The temp allocator holds one delegate's scratch at a time (see the memory fit above).
        npu_scratch_bytes=max(scratch.values(), default=0),
        cmsis_scratch_bytes=_cmsis_scratch_bytes(compiled.final_program),
        operators=operators, missing_operators=missing,
        latency_seconds=latency,
        latency_cycles_cpu=int(round(latency * target.cpu_hz)) if latency is not None else None,
        latency_source="+".join(sources) if sources else None,
        per_placement_seconds=seconds,
        npu_utilisation={k: e.utilisation(target.npu_macs or 1) for k, e in estimates.items()},
        npu_traffic={k: dict(e.traffic_bytes) for k, e in estimates.items()},
        device_faults=tuple(f"{r.name}: {f.message}" for r in rows for f in r.device_faults),
        placement=placement,
    )
