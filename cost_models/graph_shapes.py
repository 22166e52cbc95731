"""Shapes, dtypes, MACs and the cost-model OpShape of one node of an (edge) graph.

Works on aten ops (quantized graph, delegate subgraphs) and on `cortex_m::` ops, reading only the
fake-tensor metadata upstream attaches to every node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cost_models.op_shapes import OpShape


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
        groups = node.args[8] if "convolution" in lowered and len(node.args) > 8 else 1
        return "depthwise_conv" if isinstance(groups, int) and groups > 1 else "conv"
    for needle, kind in _KIND_BY_NAME:
        if needle in lowered:
            return kind
    return "copy"


def _conv_macs(node, out: torch.Tensor, lowered: str) -> tuple[int, int, int, tuple[int, int]]:
    """(macs, in_channels, out_channels, kernel_hw) of a conv, aten (OIHW) or cortex_m (OHWI)."""
    weight = _val(node.args[1])
    inp = _val(node.args[0])
    if weight is None or inp is None:
        return 0, 0, 0, (1, 1)
    cin = int(inp.shape[1])
    cout = int(out.shape[1])
    if "cortex_m" in lowered:
        # cortex_m weights are pre-permuted: conv OHWI, depthwise 1HW(C*mult).
        kh, kw = int(weight.shape[1]), int(weight.shape[2])
        per_output = (kh * kw) if "depthwise" in lowered else kh * kw * int(weight.shape[3])
    else:
        kh, kw = int(weight.shape[2]), int(weight.shape[3])
        per_output = kh * kw * int(weight.shape[1])
    return numel(out.shape) * per_output, cin, cout, (kh, kw)


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
        window = node.args[1] if isinstance(node.args[1], (list, tuple)) else (1, 1)
        if "mean" in lowered and inputs and inputs[0] is not None:
            window = tuple(int(s) for s in inputs[0].shape[2:])
        kernel = (int(window[0]), int(window[-1])) if window else (1, 1)
        cin = cout = int(out.shape[1]) if out.dim() > 1 else 0
    input_bytes = sum(_bytes(t) for t in inputs[:1])
    if kind in ("add", "mul", "batch_matmul"):
        input_bytes = sum(_bytes(t) for t in inputs[:2])
    shape = OpShape(kind=kind, macs=int(macs), input_bytes=int(input_bytes),
                    output_bytes=_bytes(out), weight_bytes=int(weight_bytes),
                    in_channels=cin, out_channels=cout, kernel_hw=kernel,
                    elements=numel(out.shape) if out is not None else 0)
    return NodeInfo(node.name, op, input_shapes, output_shape, dtypes, int(macs), shape)
