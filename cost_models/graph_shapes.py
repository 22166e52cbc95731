"""Shapes, dtypes, MACs and the cost-model OpShape of one node of an (edge) graph.

Works on aten ops (quantized graph, delegate subgraphs) and on `cortex_m::` ops, reading only the
fake-tensor metadata upstream attaches to every node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cost_models.op_shapes import OpShape, index_walk


@dataclass(frozen=True)
class NodeInfo:
    name: str
    op: str  # e.g. "aten.convolution.default", "cortex_m.quantized_conv2d.default"
    input_shapes: tuple[tuple[int, ...], ...]
    output_shape: tuple[int, ...]
    dtypes: str  # "int8,int8 -> int8"
    macs: int
    op_shape: OpShape


def op_name(target) -> str:
    name = getattr(target, "__name__", None) or str(target)
    return name


def _val(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if isinstance(val, (tuple, list)) and val and isinstance(val[0], torch.Tensor):
        return val[0]
    return val if isinstance(val, torch.Tensor) else None


def numel(shape) -> int:
    """Elements of a tensor of this shape (a 0-d tensor holds one)."""
    return int(math.prod(shape)) if shape else 1


def _bytes(tensor: torch.Tensor | None) -> int:
    """Deployed bytes: int8, one byte per element. Between Q/DQ pairs the edge graph carries
    logical float32 tensors (and dequantized float weights) that the device never stores."""
    if tensor is None:
        return 0
    return numel(tensor.shape) * (1 if tensor.dtype.is_floating_point else tensor.element_size())


def _bias_bytes(node) -> int:
    """int32 bias of a conv/linear (CMSIS-NN s8 kernels), when the node has one."""
    index = 2
    if len(node.args) > index and isinstance(node.args[index], torch.fx.Node):
        bias = _val(node.args[index])
        return numel(bias.shape) * 4 if bias is not None else 0
    return 0


_KIND_BY_NAME = (
    ("depthwise_conv", "depthwise_conv"),
    ("transpose_conv", "conv"),
    ("conv", "conv"),
    ("linear", "fully_connected"),
    ("addmm", "fully_connected"),
    ("aten.mm", "fully_connected"),
    ("bmm", "batch_matmul"),
    ("batch_matmul", "batch_matmul"),
    ("avg_pool", "avg_pool"),
    ("mean", "avg_pool"),
    ("max_pool", "max_pool"),
    ("softmax", "softmax"),
    ("dequantize", "dequantize"),
    ("quantize", "quantize"),
    ("add", "add"),
    ("sub", "add"),
    ("minimum", "add"),
    ("maximum", "add"),
    ("mul", "mul"),
    ("div", "mul"),
    ("sigmoid", "lut_activation"),
    ("tanh", "lut_activation"),
    ("hardswish", "lut_activation"),
    ("gelu", "lut_activation"),
    ("silu", "lut_activation"),
    ("quantized_activation", "lut_activation"),
    ("relu", "relu"),
    ("clamp", "relu"),
    ("hardtanh", "relu"),
    ("pad", "pad"),
    ("permute", "transpose"),
    ("transpose", "transpose"),
)


def _kind(op: str, node: torch.fx.Node) -> str:
    lowered = op.lower()
    if "convolution" in lowered or "conv2d" in lowered:
        if "depthwise" in lowered:
            return "depthwise_conv"
        if "convolution" not in lowered or len(node.args) <= 8:
            return "conv"
        # Depthwise as upstream's AtenToCortexMPass detects it: groups == in_channels, i.e. one
        # input channel per group. Other grouped convs run CMSIS-NN's (grouped) convolve.
        groups, transposed = node.args[8], node.args[6]
        weight = _val(node.args[1])
        depthwise = (isinstance(groups, int) and groups > 1 and transposed is not True
                     and weight is not None and weight.dim() >= 3 and int(weight.shape[1]) == 1)
        return "depthwise_conv" if depthwise else "conv"
    for needle, kind in _KIND_BY_NAME:
        if needle in lowered:
            return kind
    return "copy"


def _conv_macs(node, out: torch.Tensor, lowered: str) -> tuple[int, int, int, tuple[int, int]]:
    """(macs, in_channels, out_channels, kernel_hw) of a conv of any spatial rank.

    aten weights are O,I/groups,*kernel (transposed: I,O/groups,*kernel); cortex_m weights are
    pre-permuted: conv OHWI with I per group, depthwise 1HW(C*mult), transpose conv (O/groups)HWI.
    A 1-D conv's kernel_hw is (1, k), as `op_shapes` describes it; a 3-D conv folds its depth
    into the first entry so that the product of kernel_hw is still the taps per output.
    """
    weight = _val(node.args[1])
    inp = _val(node.args[0])
    if weight is None or inp is None or weight.dim() < 3:
        return 0, 0, 0, (1, 1)
    nhwc = "nhwc" in lowered  # the `_nhwc` cortex_m variants state their sizes as NHWC
    cin = int(inp.shape[-1] if nhwc else inp.shape[1])
    cout = int(out.shape[-1] if nhwc else out.shape[1])
    if "cortex_m" in lowered:
        kernel = tuple(int(s) for s in weight.shape[1:-1])
        if "transpose" in lowered:
            # Every input element meets (O/groups) x taps weights.
            macs = numel(inp.shape) * int(weight.shape[0]) * math.prod(kernel)
        elif "depthwise" in lowered:
            macs = numel(out.shape) * math.prod(kernel)
        else:
            macs = numel(out.shape) * math.prod(kernel) * int(weight.shape[-1])
    else:
        kernel = tuple(int(s) for s in weight.shape[2:])
        transposed = "convolution" in lowered and len(node.args) > 6 and node.args[6] is True
        if transposed:
            macs = numel(inp.shape) * int(weight.shape[1]) * math.prod(kernel)
        else:
            macs = numel(out.shape) * int(weight.shape[1]) * math.prod(kernel)
    if len(kernel) == 1:
        kernel_hw = (1, kernel[0])
    else:
        kernel_hw = (math.prod(kernel[:-1]), kernel[-1])
    return macs, cin, cout, kernel_hw


def _window_hw(node, lowered: str, inp: torch.Tensor | None) -> tuple[int, int]:
    """A pool's window as kernel_hw: (k_h, k_w), (1, k) for a 1-D window; a mean's window is
    the extent of the dims it reduces."""
    if "mean" in lowered:
        if inp is None or inp.dim() == 0:
            return (1, 1)
        dims = node.args[1] if len(node.args) > 1 and isinstance(node.args[1], (list, tuple)) \
            else range(inp.dim())
        window = tuple(int(inp.shape[d % inp.dim()]) for d in dims)
    else:
        window = node.args[1] if isinstance(node.args[1], (list, tuple)) else (node.args[1],)
        window = tuple(int(w) for w in window if isinstance(w, int))
    if not window:
        return (1, 1)
    if len(window) == 1:
        return (1, max(window[0], 1))
    return (max(math.prod(window[:-1]), 1), max(window[-1], 1))


def describe(node: torch.fx.Node) -> NodeInfo:
    op = op_name(node.target)
    lowered = op.lower()
    out = _val(node)
    inputs = [_val(a) for a in node.all_input_nodes]
    input_shapes = tuple(tuple(int(s) for s in t.shape) for t in inputs if t is not None)
    output_shape = tuple(int(s) for s in out.shape) if out is not None else ()
    in_dtypes = ",".join(str(t.dtype).replace("torch.", "") for t in inputs if t is not None)
    dtypes = f"{in_dtypes} -> {str(out.dtype).replace('torch.', '') if out is not None else '-'}"
    kind = _kind(op, node)
    macs, cin, cout, kernel = 0, 0, 0, (1, 1)
    weight_bytes = 0
    if out is not None and kind in ("conv", "depthwise_conv") and len(node.args) > 1:
        macs, cin, cout, kernel = _conv_macs(node, out, lowered)
        weight_bytes = _bytes(_val(node.args[1])) + _bias_bytes(node)
    elif out is not None and kind == "fully_connected" and len(node.args) > 1:
        weight_index = 2 if "addmm" in lowered else 1
        weight = _val(node.args[weight_index])
        if weight is not None:
            in_features = int(weight.shape[-1]) if "linear" in lowered else int(weight.shape[0])
            macs = numel(out.shape) * in_features
            cin, cout = in_features, int(out.shape[-1])
            weight_bytes = _bytes(weight) + (_bias_bytes(node) if "linear" in lowered else 0)
    elif out is not None and kind == "batch_matmul" and len(inputs) >= 1 and inputs[0] is not None:
        macs = numel(out.shape) * int(inputs[0].shape[-1])
    elif out is not None and kind in ("avg_pool", "max_pool") and len(node.args) > 1:
        kernel = _window_hw(node, lowered, inputs[0] if inputs else None)
        cin = cout = int(out.shape[1]) if out.dim() > 1 else 0
    input_bytes = sum(_bytes(t) for t in inputs[:1])
    if kind in ("add", "mul", "batch_matmul"):
        input_bytes = sum(_bytes(t) for t in inputs[:2])
    walked, broadcast = index_walk(op, input_shapes, output_shape if out is not None else None)
    shape = OpShape(kind=kind, macs=int(macs), input_bytes=int(input_bytes),
                    output_bytes=_bytes(out), weight_bytes=int(weight_bytes),
                    in_channels=cin, out_channels=cout, kernel_hw=kernel,
                    elements=numel(out.shape) if out is not None else 0,
                    walked_operands=walked, broadcast=broadcast)
    return NodeInfo(node.name, op, input_shapes, output_shape, dtypes, int(macs), shape)
