"""int16 convolution and linear on the CPU through our CMSIS-NN s16 operators (kernels/s16).

Upstream's Cortex-M passes (ExecuTorch 1.5.1) quantize int8 only, so partitioners/cpu.py keeps
an int16 op that leaves the NPU in float on its portable kernel, between its int16 dequantize and
quantize. This pass, run on the routed program, rewrites each such

    dequantize(int16 x) -> convolution | addmm | linear (weight = dequantize_per_channel(int8),
                                                       bias = dequantize_per_channel(int32))
                        -> quantize(int16)

into `orchestrate::quantized_conv2d_s16` or `orchestrate::quantized_linear_s16`: weights int8
(OHWI for the convolution, as CMSIS-NN reads them), bias int64 (what the s16 kernels take), and
per output channel the requantization multiplier and shift of in_scale * w_scale / out_scale,
computed here with upstream's `quantize_multiplier_aot` as its Cortex-M passes do for int8.

A node that does not match (grouped or transposed convolution, a zero point, a shift CMSIS-NN's
`arm_nn_requantize_s64` cannot apply) stays on the portable fallback with its reason.

`ORCHESTRATE_NO_S16_OPERATORS=1`, for benchmarks only, keeps every one on the float fallback and
folds its weights' dequantize_per_channel into float constants: the ExecuTorch sources here have
no kernel for `quantized_decomposed::dequantize_per_channel.out` (kernels/quantized is not in
the snapshot, nor in the wheel's runtime), so without the fold the fallback runs nowhere but in
the twin.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from kernels import s16
from partitioners.records import ORIGIN_KEY

S16_KEY = "orchestrate_s16_operator"  # node.meta: the CMSIS-NN function the op calls
_OFF = "ORCHESTRATE_NO_S16_OPERATORS"


@dataclass(frozen=True)
class _Match:
    op: torch.fx.Node
    dequantize: torch.fx.Node
    quantize: torch.fx.Node
    weight: torch.fx.Node  # the dequantize_per_channel of the int8 weight
    bias: torch.fx.Node | None  # the dequantize_per_channel of the int32 bias


def _named(node, *names: str) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and any(name in str(node.target) for name in names))


def _int16_symmetric(node, position_dtype: int = 5) -> bool:
    return (len(node.args) > position_dtype and node.args[position_dtype] == torch.int16
            and node.args[2] == 0)


def _per_channel(node, dtype) -> bool:
    return (_named(node, "dequantize_per_channel") and node.args[6] == dtype
            and node.args[3] == 0 and node.args[0].op == "placeholder")


def _match(node) -> _Match | None:
    if not _named(node, "aten.convolution.default", "aten.addmm.default", "aten.linear.default"):
        return None
    if "convolution" in str(node.target):
        x, weight, bias = node.args[0], node.args[1], node.args[2]
        transposed, groups = node.args[6], node.args[8]
        if transposed or groups != 1 or len(node.meta["val"].shape) != 4:
            return None
    elif "addmm" in str(node.target):
        bias, x, weight_t = node.args[0], node.args[1], node.args[2]
        if not (_named(weight_t, "permute_copy") and list(weight_t.args[1]) == [1, 0]
                and len(weight_t.users) == 1):
            return None
        weight = weight_t.args[0]
    else:
        x, weight = node.args[0], node.args[1]
        bias = node.args[2] if len(node.args) > 2 else None
    users = list(node.users)
    if not (_named(x, "dequantize_per_tensor") and _int16_symmetric(x)
            and len(users) == 1 and _named(users[0], "quantize_per_tensor")
            and _int16_symmetric(users[0]) and _per_channel(weight, torch.int8)
            and (bias is None or _per_channel(bias, torch.int32))):
        return None
    return _Match(node, x, users[0], weight, bias)


@dataclass(frozen=True)
class _Activation:
    """A ReLU (hardtanh, clamp) on the op's int16 output, between a dequantize and a quantize of
    the op's own output scale: the kernel's activation bounds compute it."""

    dequantize: torch.fx.Node
    activation: torch.fx.Node
    quantize: torch.fx.Node
    low: int  # the bounds in int16 codes (zero point 0)
    high: int


def _activation_after(quantize) -> _Activation | None:
    """`quantize -> dequantize -> relu | hardtanh | clamp -> quantize`, all four with the same
    scale, zero point and range, as upstream's ActivationFusionPass folds for int8: with the
    same scale, quantize(clamp(dequantize(q), a, b)) is clamp(q, round(a / scale), round(b /
    scale)), and a ReLU is clamp(q, 0, max)."""
    from partitioners.fused_activation_split import (  # lazy: heavy (executorch)
        ACTIVATIONS)

    def only_user(node):
        users = list(node.users)
        return users[0] if len(users) == 1 else None

    dequantize = only_user(quantize)
    activation = only_user(dequantize) if dequantize is not None else None
    out = only_user(activation) if activation is not None else None
    if not (_named(dequantize, "dequantize_per_tensor") and _named(activation, "")
            and activation.target in ACTIVATIONS and not activation.kwargs
            and _named(out, "quantize_per_tensor") and "dequantize" not in str(out.target)
            and tuple(dequantize.args[1:]) == tuple(quantize.args[1:]) == tuple(out.args[1:])):
        return None
    scale, low, high = float(quantize.args[1]), int(quantize.args[3]), int(quantize.args[4])
    name = str(activation.target)
    if "relu" in name:
        bounds = (0.0, None)
    else:
        defaults = (-1.0, 1.0) if "hardtanh" in name else (None, None)
        given = list(activation.args[1:3]) + [None] * 2
        bounds = tuple(given[i] if len(activation.args) > i + 1 else defaults[i]
                       for i in range(2))
    if any(b is not None and not isinstance(b, (int, float)) for b in bounds):
        return None
    if bounds[0] is not None:
        low = max(low, int(round(float(bounds[0]) / scale)))
    if bounds[1] is not None:
        high = min(high, int(round(float(bounds[1]) / scale)))
    return _Activation(dequantize, activation, out, low, high) if low <= high else None


def _requantization(in_scale: float, weight_scales: torch.Tensor, out_scale: float):
    """Per output channel (multiplier, shift), or None when a shift is outside what
    arm_nn_requantize_s64 (`val >> (14 - shift)` on an int64) can apply."""
    from executorch.backends.cortex_m.passes.passes_utils import (  # lazy: heavy (executorch)
        quantize_multiplier_aot)

    pairs = [quantize_multiplier_aot(in_scale * float(w) / out_scale) for w in weight_scales]
    if any(not -48 <= shift <= 14 for _, shift in pairs):
        return None
    return (torch.tensor([m for m, _ in pairs], dtype=torch.int32),
            torch.tensor([s for _, s in pairs], dtype=torch.int32))


def rewrite(program) -> list[torch.fx.Node]:
    """Rewrite every matching int16 conv/linear of `program` (an ExportedProgram, in place)
    into our s16 operators; the new nodes (their meta keeps the rewritten op's)."""
    if os.environ.get(_OFF, "") == "1":
        _fold_weight_dequantize(program)
        return []
    from executorch.backends.transforms.utils import (  # lazy: heavy (executorch)
        create_constant_placeholder, delete_constant_placeholder, get_param_tensor)
    from executorch.exir.dialects._ops import ops as exir_ops  # lazy: heavy (executorch)
    from executorch.exir.passes import make_alloc_node  # lazy: heavy (executorch)
    from torch.export.graph_signature import InputKind  # lazy: heavy (torch.export)

    graph = program.graph_module.graph
    rewritten = []
    for match in [m for m in map(_match, list(graph.nodes)) if m is not None]:
        node = match.op
        in_scale, out_scale = float(match.dequantize.args[1]), float(match.quantize.args[1])
        weight_scales = get_param_tensor(program, match.weight.args[1]).flatten()
        requant = _requantization(in_scale, weight_scales, out_scale)
        if requant is None:
            continue
        multipliers, shifts = requant
        weight = get_param_tensor(program, match.weight.args[0]).to(torch.int8)
        out_channels = weight.shape[0]
        bias = (torch.zeros(out_channels, dtype=torch.int64) if match.bias is None
                else get_param_tensor(program, match.bias.args[0]).to(torch.int64).flatten())
        conv = "convolution" in str(node.target)
        if conv:
            weight = weight.permute(0, 2, 3, 1).contiguous()  # OIHW -> OHWI, as CMSIS-NN reads
        user_inputs = set(program.graph_signature.user_inputs)
        first = next(n for n in graph.nodes if n.op != "placeholder" or n.name in user_inputs)
        constants = {}
        with graph.inserting_before(first):
            for role, data in (("weight", weight), ("bias", bias),
                               ("multipliers", multipliers), ("shifts", shifts)):
                constants[role] = create_constant_placeholder(
                    program, graph, f"{node.name}_s16_{role}", InputKind.PARAMETER, data)
        low, high = int(match.quantize.args[3]), int(match.quantize.args[4])
        folded = _activation_after(match.quantize)
        if folded is not None:
            low, high = folded.low, folded.high
        with graph.inserting_before(match.quantize):
            if conv:
                stride, padding, dilation = (list(node.args[i]) for i in (3, 4, 5))
                kh, kw = int(weight.shape[1]), int(weight.shape[2])
                scratch_bytes = s16.conv_scratch_bytes(int(weight.shape[3]), kh, kw)
                with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
                    scratch = make_alloc_node(program.graph_module,
                                              mode.from_tensor(torch.empty(0)), None)
                scratch.args = (((scratch_bytes,), torch.uint8),)
                scratch.meta["val"] = torch.empty((scratch_bytes,), dtype=torch.uint8,
                                                  device="meta")
                target = exir_ops.edge.orchestrate.quantized_conv2d_s16.default
                args = (_channels_last(graph, match.dequantize.args[0], node), constants["weight"],
                        constants["bias"], stride, padding, dilation, constants["multipliers"],
                        constants["shifts"], low, high, scratch)
                function = s16.CMSIS_FUNCTIONS["quantized_conv2d_s16"]
            else:
                target = exir_ops.edge.orchestrate.quantized_linear_s16.default
                args = (match.dequantize.args[0], constants["weight"], constants["bias"],
                        constants["multipliers"], constants["shifts"], low, high)
                function = s16.CMSIS_FUNCTIONS["quantized_linear_s16"]
            replacement = graph.call_function(target, args)
        replaced = folded.quantize if folded is not None else match.quantize
        val = replaced.meta["val"]
        replacement.meta = {**node.meta, "val": val, S16_KEY: function}
        result = replacement
        if conv and _reordered(val):
            # The kernel writes NHWC; the consumers keep the layout they were compiled for.
            replacement.meta["val"] = _in_order(val, _CHANNELS_LAST)
            with graph.inserting_after(replacement):
                result = _dim_order_copy(graph, replacement, _order(val), node)
        replaced.replace_all_uses_with(result)
        dead = [match.quantize, node]
        if folded is not None:
            dead = [folded.quantize, folded.activation, folded.dequantize, *dead]
        if not conv and "addmm" in str(node.target):
            dead.append(node.args[2])
        dead += [match.weight, match.bias, match.dequantize]
        for candidate in dead:
            if candidate is not None and not candidate.users:
                graph.erase_node(candidate)
        for placeholder in [match.weight.args[0], match.weight.args[1], match.weight.args[2],
                            *(match.bias.args[:3] if match.bias is not None else ())]:
            if isinstance(placeholder, torch.fx.Node) and not placeholder.users:
                delete_constant_placeholder(program, placeholder)
        rewritten.append(replacement)
    if rewritten:
        graph.eliminate_dead_code()
        program.graph_module.recompile()
    return rewritten


_CHANNELS_LAST = (0, 2, 3, 1)  # NHWC: the only layout CMSIS-NN's s16 convolution reads


def _order(val) -> tuple[int, ...]:
    return tuple(int(d) for d in val.dim_order())


def _in_order(val, order: tuple[int, ...]):
    """`val` (a fake tensor) laid out in dim order `order`."""
    inverse = [order.index(d) for d in range(len(order))]
    return val.permute(*order).contiguous().permute(*inverse)


def _reordered(val) -> bool:
    """A 4-D value the s16 convolution refuses: more than one channel and a dim_order other than
    NHWC (kernels/s16/op_quantized_conv2d_s16.cpp checks the dim_order itself, not the bytes, so
    a [1, C, 1, 1] counts). A Conv1d's [N, C, 1, W] (its 2-D form) is laid out NCHW: the kernel
    refused it at run time (error 0x12, "input and output must have channels_last
    dim_order")."""
    return val.dim() == 4 and val.shape[1] > 1 and _order(val) != _CHANNELS_LAST


def _dim_order_copy(graph, source, order: tuple[int, ...], op: torch.fx.Node) -> torch.fx.Node:
    """A `_to_dim_order_copy` of `source` into `order`, a layout row of `op`'s in the plan."""
    from executorch.exir.dialects._ops import ops as exir_ops  # lazy: heavy (executorch)

    copy = graph.call_function(exir_ops.edge.dim_order_ops._to_dim_order_copy.default,
                               (source,), {"dim_order": list(order)})
    copy.meta["val"] = _in_order(source.meta["val"], order)
    copy.meta[ORIGIN_KEY] = f"{op.meta.get(ORIGIN_KEY, op.name)}:to_s16_layout"
    return copy


def _channels_last(graph, x: torch.fx.Node, op: torch.fx.Node) -> torch.fx.Node:
    """`x`, or its NHWC copy where it is laid out otherwise."""
    return _dim_order_copy(graph, x, _CHANNELS_LAST, op) if _reordered(x.meta["val"]) else x


def fold_fallback_weights(program, falls_back) -> list[torch.fx.Node]:
    """The constant weights of every op `falls_back(node)` names (an int16 op with no s16
    operator, on its portable kernel in float) dequantized ahead of time into float constants;
    the ops whose weights were folded. The runtime has no `dequantize_per_channel.out` (module
    docstring), so a CPU-only depthwise convolution given int16 activations (DS-CNN's
    feature_extractor.4) stopped the host runtime with error 0x14, missing operator, where
    only the twin ran it."""
    graph = program.graph_module.graph
    folded = [n for n in graph.nodes if n.op == "call_function" and falls_back(n)
              and any(_named(a, "dequantize_per_channel") for a in n.all_input_nodes)]
    _fold_weight_dequantize(program, lambda dq: bool(dq.users) and all(
        u in folded for u in dq.users))
    return folded


def _fold_weight_dequantize(program, which=lambda node: True) -> None:
    """Every dequantize_per_channel of constants that `which` names replaced by its float value
    (a constant)."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  # lazy: heavy (torch.ao)
    from executorch.backends.transforms.utils import (  # lazy: heavy (executorch)
        create_constant_placeholder, delete_constant_placeholder, get_param_tensor)
    from torch.export.graph_signature import InputKind  # lazy: heavy (torch.export)

    graph = program.graph_module.graph
    user_inputs = set(program.graph_signature.user_inputs)
    for node in list(graph.nodes):
        if not _named(node, "dequantize_per_channel") or not which(node):
            continue
        operands = [a for a in node.args[:3] if isinstance(a, torch.fx.Node)]
        if not all(a.op == "placeholder" and a.name not in user_inputs for a in operands):
            continue
        values = [get_param_tensor(program, a) if isinstance(a, torch.fx.Node) else a
                  for a in node.args[:3]]
        real = torch.ops.quantized_decomposed.dequantize_per_channel(*values, *node.args[3:7])
        first = next(n for n in graph.nodes if n.op != "placeholder" or n.name in user_inputs)
        with graph.inserting_before(first):
            constant = create_constant_placeholder(program, graph, f"{node.name}_float",
                                                   InputKind.PARAMETER, real)
        node.replace_all_uses_with(constant)
        graph.erase_node(node)
        for operand in operands:
            if not operand.users:
                delete_constant_placeholder(program, operand)
    program.graph_module.recompile()
