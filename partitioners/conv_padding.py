"""Fold an explicit PAD into the convolution after it, in the TOSA graph handed to Vela.

A TFLite file's SAME-padded convolution with stride 2 on an even input pads unevenly (0 before,
1 after). PyTorch's convolution pads both sides alike, so the rebuilt model (and any PyTorch model
written with `F.pad` before a convolution) carries an explicit pad: the Arm backend lowers it to
a TOSA PAD feeding the CONV2D / DEPTHWISE_CONV2D, whose own `pad` attribute (top, bottom, left,
right) could hold it. Vela 5.1's graph optimiser folds such a PAD only when its pad value is 0
(regor `GraphIrOptimiser::ReplacePadByExplicitPadding`); its TOSA front end reads the value as
the raw int8 code, which is the input's zero point (-128 for an image input), so the fold never
happens and each PAD becomes two or three NPU memory copies of the whole feature map:
MobileNetV1-0.25 (MLPerf Tiny visual wake words) on the U55-128 spent 116,623 of its 412,488
estimated cycles on them; Vela's TFLite front end folds the same pads.

`FoldPadIntoConvolution` (run by the Arm backend after its RewritePadPass, see
`partitioners/upstream_ethos_u.conv_pads_folded`) moves the pad amounts into the convolution's
`pad` when the padding is exactly what the convolution's own padding computes: the PAD pads only
height and width, by non-negative amounts, with the code of real zero (the convolution's input
zero point: TOSA pads a convolution with it), its only reader is the convolution, and each
resulting pad is smaller than the dilated kernel (Vela's own limit for explicit padding), and
the stride is at most 3 (above, the pad may be the explicit form of a Vela workaround). The
output size is unchanged (the same total height and width), and so is every value.
"""

from __future__ import annotations

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult

_PAD = exir_ops.backend.tosa.PAD.default
_CONVOLUTIONS = {exir_ops.backend.tosa.CONV2D.default: (1, 2),  # weight OHWI: kernel H, W
                 exir_ops.backend.tosa.DEPTHWISE_CONV2D.default: (0, 1)}  # weight HWCM


def _constant_list(node) -> list | None:
    """The integers of a TOSA CONST_SHAPE node (or a plain list), else None."""
    if isinstance(node, (list, tuple)):
        values = list(node)
    elif isinstance(node, torch.fx.Node) and node.target == exir_ops.backend.tosa.CONST_SHAPE.default:
        values = list(node.args[0])
    else:
        return None
    return values if all(isinstance(v, int) for v in values) else None


def _input_zero_point(conv: torch.fx.Node) -> int | float:
    """The code of real zero in the convolution's input: its zero point, or 0 unquantized."""
    qparams = conv.meta.get("input_qparams") or {}
    first = qparams.get(0)
    return 0 if first is None else first.zp


def foldable(conv: torch.fx.Node) -> list[int] | None:
    """The convolution's new (top, bottom, left, right) padding if the PAD feeding it folds."""
    pad = conv.args[0]
    if not isinstance(pad, torch.fx.Node) or pad.target != _PAD or len(pad.users) != 1:
        return None
    amounts = _constant_list(pad.args[1])
    own = _constant_list(conv.args[4])
    if amounts is None or own is None or len(amounts) != 8 or len(own) != 4:
        return None
    n0, n1, top, bottom, left, right, c0, c1 = amounts  # NHWC: the layout TOSA convolves in
    if any((n0, n1, c0, c1)) or min(top, bottom, left, right) < 0:
        return None
    if max(conv.args[3]) > 3:
        # a stride above 3: Vela decomposes the convolution into per-tap 1x1 convolutions and,
        # on the U85, loses its padding; partitioners/quantizable.py
        # (strided_conv_padding_explicit) makes such padding explicit on purpose
        return None
    value = pad.kwargs.get("value", 0)
    if value != _input_zero_point(conv):
        return None
    kernel_axes = _CONVOLUTIONS[conv.target]
    weight = conv.args[1].meta["val"].shape
    dilation = list(conv.args[5])
    kh = (weight[kernel_axes[0]] - 1) * dilation[0] + 1
    kw = (weight[kernel_axes[1]] - 1) * dilation[1] + 1
    padding = [own[0] + top, own[1] + bottom, own[2] + left, own[3] + right]
    if max(padding[:2]) >= kh or max(padding[2:]) >= kw:
        return None
    return padding


class FoldPadIntoConvolution(ExportPass):
    """See the module docstring. `folded` receives (convolution node, its new padding)."""

    def __init__(self, folded: list[tuple[str, tuple[int, ...]]]) -> None:
        super().__init__()
        self.folded = folded

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        modified = False
        for conv in list(graph.nodes):
            if conv.op != "call_function" or conv.target not in _CONVOLUTIONS:
                continue
            padding = foldable(conv)
            if padding is None:
                continue
            pad = conv.args[0]
            shape = pad.args[1]
            conv.args = (pad.args[0], *conv.args[1:4], padding, *conv.args[5:])
            graph.erase_node(pad)
            if isinstance(shape, torch.fx.Node) and not shape.users:
                graph.erase_node(shape)
            self.folded.append((conv.name, tuple(padding)))
            modified = True
        if modified:
            graph.lint()
            graph_module.recompile()
        return PassResult(graph_module, modified)
