"""Give a convolution or linear that the Ethos-U quantizer fused with its activation its own
output quantize: before the Cortex-M passes run on it (`split_fused_activations`), and for a
grouped convolution before the Arm backend lowers it (`grouped_convolutions_split`).

An op routed to the CPU out of an Ethos-U-quantized program (a placement policy's `force_cpu`,
or `--placement cost` moving an island) carries the Ethos-U quantizer's annotation: it fuses
`linear -> relu` (and conv -> relu/relu6/clamp) into one pattern with no quantize between, since
the NPU computes them as one layer. The Cortex-M quantizer (CPU-only programs) puts a quantize
between them, and `ActivationFusionPass` folds the activation into the kernel's output clamp.
Handed the fused form, the CPU route lost the linear: its weights are quantized per channel
with several scales, which `cortex_m::quantized_linear`'s one multiplier cannot honour
(ExecuTorch 1.5.1), and our rewrite to a 1x1 convolution (partitioners/legalize.py
`per_channel_linear_as_conv2d`) needs the linear's own output quantize; so the linear ran in
float on the portable `addmm` with a weight transpose (sensor_mlp forced off ethos-u55-128:
21.2 ms by the model, against 0.42 ms on CMSIS-NN), and a forced ReLU, kept in float as an op
with no CMSIS-NN kernel, made the fold pass retrace the linear's int32 accumulator into a
quantize ("Expecting input to have dtype torch.float32, but got dtype: torch.int32"): the
compile stopped with an internal error.

The fix inserts, between the producer and its activation, a quantize/dequantize pair with the
activation's own output quantization: exactly the Cortex-M quantizer's form. It changes no
value: the activation's output range is [0, max] (relu, relu6, a clamp), so quantizing the
producer's output with it clamps every negative value to the code of 0, as the activation does.
The activation is then a quantized op of its own, which `ActivationFusionPass` folds into the
kernel as in any CPU-only program (and `_float_only_on_cpu` in partitioners/cpu.py no longer
keeps it in float).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from executorch.exir.dialects._ops import ops as exir_ops

from partitioners.records import ORIGIN_KEY, Workaround

_QUANTIZE = exir_ops.edge.quantized_decomposed.quantize_per_tensor.default
_DEQUANTIZE = exir_ops.edge.quantized_decomposed.dequantize_per_tensor.default
_PRODUCERS = {exir_ops.edge.aten.linear.default, exir_ops.edge.aten.convolution.default}
ACTIVATIONS = {exir_ops.edge.aten.relu.default, exir_ops.edge.aten.hardtanh.default,
                exir_ops.edge.aten.clamp.default}


def folds_into_its_producer(node: torch.fx.Node) -> bool:
    """An activation right after a CPU convolution or linear: `ActivationFusionPass` folds it
    into the kernel's output clamp, so it needs no kernel (nor a float one) of its own."""
    producer = node.args[0] if node.args else None
    return (node.target in ACTIVATIONS and isinstance(producer, torch.fx.Node)
            and producer.target in _PRODUCERS and list(producer.users) == [node])


def _output_quantize(node: torch.fx.Node, quantize=_QUANTIZE) -> torch.fx.Node | None:
    """The one `quantize` every user of `node` is (all with the same arguments), else None."""
    users = list(node.users)
    if not users or any(u.target != quantize for u in users):
        return None
    if len({tuple(u.args[1:]) for u in users}) != 1:
        return None
    return users[0]


def _quantized_between(producer: torch.fx.Node, activation: torch.fx.Node, qargs: tuple,
                       quantize, dequantize) -> tuple[torch.fx.Node, torch.fx.Node]:
    """Insert quantize(producer, *qargs) and its dequantize, and make `activation` read the
    dequantize instead of `producer`: (quantize, dequantize)."""
    graph = producer.graph
    with graph.inserting_after(producer):
        q = graph.call_function(quantize, (producer, *qargs))
    with graph.inserting_after(q):
        dq = graph.call_function(dequantize, (q, *qargs))
    activation.replace_input_with(producer, dq)
    return q, dq


def split_fused_activations(program, moved: set[str] | frozenset = frozenset()
                            ) -> list[Workaround]:
    """Insert the quantize/dequantize pair between each fused producer and activation of
    `program` (an edge ExportedProgram whose NPU partitions are already delegated) where the
    producer or the activation is one of the `moved` nodes (a policy or cost placement moved it
    off the NPU); returns what it changed, for the plan. Elsewhere the pattern is left to
    upstream and our narrowed activation fusion (partitioners/activation_narrowing.py), which
    lower it as a CPU-only program has always been lowered."""
    graph = program.graph_module.graph
    changes = []
    for activation in list(graph.nodes):
        if activation.op != "call_function" or activation.target not in ACTIVATIONS:
            continue
        if not folds_into_its_producer(activation) or not (
                activation.name in moved or activation.args[0].name in moved):
            continue
        producer = activation.args[0]
        quantize = _output_quantize(activation)
        if quantize is None:
            continue
        qargs = tuple(quantize.args[1:])
        q, dq = _quantized_between(producer, activation, qargs, _QUANTIZE, _DEQUANTIZE)
        origin = producer.meta.get(ORIGIN_KEY, producer.name)
        for new, val in ((q, quantize.meta.get("val")), (dq, producer.meta.get("val"))):
            new.meta["val"] = val
            new.meta[ORIGIN_KEY] = f"{origin}:{new.name}"
            if "custom" in quantize.meta:
                new.meta["custom"] = dict(quantize.meta["custom"])
        changes.append(Workaround(
            origin, "Ethos-U quantizer's fused pattern (a "
            f"{_short(producer)} fused with its {_short(activation)}, routed to the CPU)",
            f"{_short(producer)} given its own output quantize (the {_short(activation)}'s: "
            f"scale {float(qargs[0]):.6g}, zero point {int(qargs[1])}), so the "
            f"{_short(activation)} is folded into its CMSIS-NN kernel as in a CPU-only program; "
            "no value changes"))
    if changes:
        program.graph_module.recompile()
    return changes


def _short(node: torch.fx.Node) -> str:
    parts = str(getattr(node.target, "__name__", node.target)).split(".")
    return parts[1] if parts[0] == "aten" and len(parts) > 1 else parts[0]


_ATEN_QUANTIZE = torch.ops.quantized_decomposed.quantize_per_tensor.default
_ATEN_DEQUANTIZE = torch.ops.quantized_decomposed.dequantize_per_tensor.default
_ATEN_ACTIVATIONS = {torch.ops.aten.relu.default, torch.ops.aten.relu_.default,
                     torch.ops.aten.hardtanh.default, torch.ops.aten.hardtanh_.default,
                     torch.ops.aten.clamp.default}
# The groups argument's position: conv2d(input, weight, bias, stride, padding, dilation,
# groups), convolution(input, weight, bias, stride, padding, dilation, transposed,
# output_padding, groups).
_GROUPS_AT = {torch.ops.aten.conv2d.default: 6, torch.ops.aten.convolution.default: 8}


@dataclass(frozen=True)
class GroupedSplit:
    """The grouped convolutions given their activation's output quantize before lowering."""

    nodes: tuple[str, ...]
    groups: tuple[int, ...]

    def workaround(self) -> Workaround:
        return Workaround(
            self.nodes[0], "ExecuTorch 1.5.1 Arm backend (DecomposeGroupedConvPass splits a "
            "grouped convolution into one per group, and RewriteConvPass then finds no output "
            "quantization for them when the quantizer fused the convolution with its "
            "activation: \"No output quantization parameter found\", and the whole partition "
            "went to the CPU)",
            f"{len(self.nodes)} grouped convolution(s) ({', '.join(sorted(set(map(str, self.groups))))} "
            "groups) given their activation's output quantize, so each group's convolution "
            "has one and the partition stays on the NPU; no value changes (the activation's "
            "range starts at 0, so the quantize clamps as the activation does)")


def grouped_convolutions_split(program) -> GroupedSplit | None:
    """In a quantized ExportedProgram (ATen dialect, before `to_edge`): insert, between each
    grouped convolution (groups > 1, not depthwise) and the activation the quantizer fused it
    with, a quantize/dequantize pair with the activation's own output quantization. In place,
    once: a program lowered again (after the planner moved ops) reports the same split. None
    when there is none."""
    graph = program.graph_module.graph
    nodes, groups = [], []
    for conv in list(graph.nodes):
        at = _GROUPS_AT.get(conv.target)
        if at is None or len(conv.args) <= at or not isinstance(conv.args[at], int) or \
                conv.args[at] <= 1:
            continue
        source = conv.args[0]
        shape = source.meta.get("val").shape if isinstance(source, torch.fx.Node) and \
            source.meta.get("val") is not None else None
        if shape is None or len(shape) < 2 or conv.args[at] == shape[1]:
            continue  # depthwise: TOSA has it, nothing is split
        users = list(conv.users)
        if len(users) == 1 and users[0].meta.get(_SPLIT_MARK):  # split by an earlier lowering
            nodes.append(conv.name)  # of this program (the planner lowers again after a move)
            groups.append(conv.args[at])
            continue
        if len(users) != 1 or users[0].target not in _ATEN_ACTIVATIONS or \
                users[0].args[0] is not conv:
            continue
        activation = users[0]
        quantize = _output_quantize(activation, _ATEN_QUANTIZE)
        if quantize is None:
            continue
        qargs = tuple(quantize.args[1:])
        if qargs[1] != qargs[2]:
            continue  # the activation's range reaches below 0: not only a clamp at 0
        q, dq = _quantized_between(conv, activation, qargs, _ATEN_QUANTIZE, _ATEN_DEQUANTIZE)
        q.meta[_SPLIT_MARK] = True
        q.meta["val"] = quantize.meta.get("val")
        dq.meta["val"] = conv.meta.get("val")
        for new in (q, dq):
            for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
                if key in conv.meta:
                    new.meta[key] = conv.meta[key]
        nodes.append(conv.name)
        groups.append(conv.args[at])
    if not nodes:
        return None
    program.graph_module.recompile()
    return GroupedSplit(tuple(nodes), tuple(groups))


_SPLIT_MARK = "orchestrate_grouped_split"  # on the quantize grouped_convolutions_split inserted
