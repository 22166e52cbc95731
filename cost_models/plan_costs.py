"""Attach a Cost to every row of a plan: Vela for NPU work, our models for CPU work.

- NPU ops: the cycles of the Vela layer computing the op (matched by MAC count); Vela cycles no op
  claims (rescales, layout ops Vela adds) go on the partition's invocation row, so the rows of a
  partition add up to Vela's own total for it.
- NPU invocation: the remainder above plus the CPU-side driver cost and the copies of the
  delegate's inputs and outputs into and out of the NPU scratch (model:transition).
- CMSIS-NN ops: the per-tier CPU model, with weights and activations read at the speed of the
  regions the memory placement chose (model:memory); boundary quantize/dequantize and layout copies: the
  transition model; portable ops: the portable (float) model.
Seconds use the target's clocks (platform YAML, overridable with --cpu-hz/--npu-hz).
"""

from __future__ import annotations

from dataclasses import replace

from cost_models.cost import Cost
from cost_models.cpu import (cmsis_nn_cost, npu_io_copy_cost, portable_copy_cost, portable_cost,
                             transition_cost)
from cost_models.graph_shapes import numel
from cost_models.npu import VelaPartitionEstimate, match_layers_to_ops
from cost_models.op_shapes import index_walk, walked_op
from kernels.dtypes import element_bytes


CPU_ENGINES = ("layout", "portable-copy", "cmsis-nn", "portable")
# The layout ops the portable library runs as an element-by-element dim-order copy.
PORTABLE_COPIES = ("_to_dim_order_copy", "_clone_dim_order", "clone")


def cpu_op_cost(engine: str, shape, target, memory=None, layout_bytes: int | None = None) -> Cost:
    """The one CPU cost rule, for the plan and for cost placement: a CMSIS-NN layout op
    (`cortex_m::transpose`) by the transition model on the bytes it moves (`layout_bytes`, else
    the op's output bytes), a portable dim-order copy by the portable model per element moved,
    a CMSIS-NN op by the per-tier model, anything else by the portable (float) model; `memory`
    charges reads at the placed regions' speed."""
    moved = shape.output_bytes if layout_bytes is None else layout_bytes
    if engine == "layout":
        return transition_cost("layout_copy", target.cpu, target.cpu_hz, moved)
    if engine == "portable-copy":
        return portable_copy_cost(shape.elements, target.cpu, target.cpu_hz)
    if engine == "cmsis-nn":
        return cmsis_nn_cost(shape, target.cpu, target.cpu_hz, memory)
    if engine == "portable":
        return portable_cost(shape, target.cpu, target.cpu_hz, memory)
    raise ValueError(f"CPU engine {engine!r} is not one of {', '.join(CPU_ENGINES)}")


def attach_costs(rows, target, estimates: dict[int, VelaPartitionEstimate], memory=None):
    """Return the rows with `cost` set. `estimates` maps NPU partition index to Vela's figures;
    `memory` (a function of the row giving its cost_models.cpu.MemoryTimings) charges CPU
    reads at the placed regions' speed."""
    npu_hz = target.npu_hz or 1
    cpu_hz = target.cpu_hz
    per_op: dict[int, dict[str, int]] = {}
    remainder: dict[int, int] = {}
    for index, estimate in estimates.items():
        ops = [(r.name, r.macs, r.op) for r in rows if r.placement == "npu" and r.partition == index
               and r.kind != "npu-invocation"]
        per_op[index], remainder[index] = match_layers_to_ops(estimate, ops)
    costed = []
    for row in rows:
        cost = None
        if row.kind == "npu-invocation":
            npu_part = Cost.from_cycles(remainder.get(row.partition, 0), npu_hz, "vela")
            estimate = estimates.get(row.partition)
            # ethos-u-core-driver cleans the data cache over the base regions its flush mask
            # names before the run and invalidates those of its invalidate mask after it;
            # ethosu_init sets both masks to the scratch (base pointer 1, which holds the IO)
            # alone. The command stream and the weights are read-only to the CPU: no maintenance.
            invoke_bytes = estimate.scratch_bytes if estimate else 0
            driver = transition_cost("npu_invocation", target.cpu, cpu_hz, invoke_bytes)
            copies = npu_io_copy_cost(row.io_bytes, target.cpu, cpu_hz)
            cost = Cost(npu_part.cycles + driver.cycles + copies.cycles,
                        npu_part.seconds + driver.seconds + copies.seconds,
                        "vela+model:transition")
        elif row.placement == "npu":
            cycles = per_op.get(row.partition, {}).get(row.name, 0)
            cost = Cost.from_cycles(cycles, npu_hz, "vela")
        elif row.kind in ("boundary-quantize", "boundary-dequantize", "requantize"):
            # a CPU requantize is a dequantize row and a quantize row (--precision)
            kind = "dequantize" if row.kind == "boundary-dequantize" or "dequantize" in row.op \
                else "quantize"
            elements = numel(row.output_shape)
            cost = transition_cost(kind, target.cpu, cpu_hz, elements)
        elif row.kind == "layout" and row.info is not None:
            # A layout copy moves the tensor as stored: 4 bytes per element for a float value.
            cost = cpu_op_cost("portable-copy" if row.placement == "portable" else "layout",
                               row.info.op_shape, target,
                               layout_bytes=numel(row.output_shape) * element_bytes(row.out_dtype, 1))
        elif row.info is not None:
            cost = cpu_op_cost("cmsis-nn" if row.placement == "cmsis-nn" else "portable",
                               _as_run(row), target, memory(row) if memory else None)
        costed.append(replace(row, cost=cost))
    return tuple(costed)


def _as_run(row):
    """The row's op shape with the index walk of the kernel it runs (op_shapes.walked_op)."""
    shape = row.info.op_shape
    walked, broadcast = index_walk(walked_op(row.op, row.kernel), row.input_shapes,
                                   row.output_shape)
    if (walked, broadcast) == (shape.walked_operands, shape.broadcast):
        return shape
    return replace(shape, walked_operands=walked, broadcast=broadcast)

