"""The CPU/NPU boundary layout check, run on every compile.

An Ethos-U delegate reads and writes raw bytes in the layout its TOSA graph was compiled for (the
dim_order of the delegate's own placeholders and outputs); the runtime hands buffers over without
re-layout. A CMSIS-NN kernel reads and writes 4-D activations as NHWC whatever the tensor says.
So a boundary tensor is only correct if the layout the producer writes equals the layout the
consumer reads. An NCHW export breaks this silently: running the edge program in Python still
matches, because it treats tensors logically. This check compares the layouts the two sides
actually use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.catalogue import CHANNELS_LAST, CPU_KERNELS, cortex_m_op_name


def same_bytes_order(sizes, first, second) -> bool:
    """Two dim orders that differ only in where size-1 dimensions sit (the same byte layout)."""
    keep = [d for d in first if sizes[d] != 1], [d for d in second if sizes[d] != 1]
    return keep[0] == keep[1] and sorted(first) == sorted(second)


@dataclass(frozen=True)
class BoundaryTensor:
    """One tensor crossing a CPU/NPU boundary, with the layout each side uses."""

    tensor: str
    direction: str  # "cpu->npu" | "npu->cpu"
    delegate: str
    cpu_node: str
    shape: tuple[int, ...]
    cpu_dim_order: tuple[int, ...]
    npu_dim_order: tuple[int, ...]

    @property
    def consistent(self) -> bool:
        """The two sides lay the bytes out alike: the same dim order, or orders that differ only
        in where size-1 dimensions sit (a [1, 24, 1, 1] pool output is the same 24 bytes NCHW
        and NHWC)."""
        return same_bytes_order(self.shape, self.cpu_dim_order, self.npu_dim_order)

    def describe(self) -> str:
        return (f"tensor '{self.tensor}' {self.direction} ({self.delegate}, CPU side "
                f"'{self.cpu_node}'): CPU uses dim_order {self.cpu_dim_order}, NPU was compiled "
                f"for {self.npu_dim_order}, shape {self.shape}")


def _dim_order(node) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if isinstance(val, torch.Tensor):
        return tuple(int(d) for d in val.dim_order())
    return None


def _cpu_layout(node: torch.fx.Node, dim_order: tuple[int, ...]) -> tuple[int, ...]:
    """The layout a CPU node really reads/writes for a value whose recorded dim_order is given."""
    op = cortex_m_op_name(node.target)
    if op is not None and CPU_KERNELS[op].reads_nhwc and len(dim_order) == 4:
        return CHANNELS_LAST
    return dim_order


def _user_inputs(lowered_module) -> list[torch.fx.Node]:
    program = lowered_module.original_module
    signature = program.graph_signature
    user = set(signature.user_inputs)
    return [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user]


def _user_outputs(lowered_module) -> list[torch.fx.Node]:
    program = lowered_module.original_module
    output = next(n for n in program.graph.nodes if n.op == "output")
    return [a for a in output.args[0] if isinstance(a, torch.fx.Node)]


def boundary_tensors(program) -> list[BoundaryTensor]:
    """Every tensor crossing between a delegate and a CPU node in the final (edge) program."""
    graph_module = program.graph_module
    tensors: list[BoundaryTensor] = []
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or "executorch_call_delegate" not in str(node.target):
            continue
        lowered = getattr(graph_module, node.args[0].target)
        delegate = node.args[0].target
        for arg, placeholder in zip(node.args[1:], _user_inputs(lowered)):
            producer_order = _dim_order(arg)
            npu_order = _dim_order(placeholder)
            if producer_order is None or npu_order is None or arg.op != "call_function":
                continue
            tensors.append(BoundaryTensor(
                arg.name, "cpu->npu", delegate, arg.name,
                tuple(int(s) for s in arg.meta["val"].shape),
                _cpu_layout(arg, producer_order), npu_order))
        outputs = _user_outputs(lowered)
        for getitem in node.users:
            index = getitem.args[1]
            npu_order = _dim_order(outputs[index])
            if npu_order is None:
                continue
            for consumer in getitem.users:
                if consumer.op != "call_function" or "executorch_call_delegate" in str(consumer.target):
                    continue
                tensors.append(BoundaryTensor(
                    getitem.name, "npu->cpu", delegate, consumer.name,
                    tuple(int(s) for s in getitem.meta["val"].shape),
                    _cpu_layout(consumer, npu_order), npu_order))
    return tensors


class BoundaryLayoutError(Exception):
    """A tensor is written in one layout and read in another at a CPU/NPU boundary."""


def check_boundaries(program) -> list[BoundaryTensor]:
    """Raise BoundaryLayoutError naming the first inconsistent tensor; return all boundaries."""
    tensors = boundary_tensors(program)
    bad = [t for t in tensors if not t.consistent]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise BoundaryLayoutError(
            f"layout mismatch at a CPU/NPU boundary: {bad[0].describe()}{more}; export the model "
            "in channels_last (the default) so both sides agree")
    return tensors
