"""Static layout checks: every tensor a CPU kernel reads or writes, in the layout it assumes.

A device kernel that assumes a layout does not check it (the twin shows what it reads: see
kernels/reference.py), so a program whose tensors are laid out otherwise runs and computes wrong
numbers. The compile applies the same rules to the final graph, tensor by tensor, not only at
CPU/NPU boundaries:

- CMSIS-NN kernels that read 4-D activations as NHWC (conv, depthwise, pool, ...) need their
  input channels-last;
- the raw-byte cortex_m kernels (add, mul, minimum, linear, ...) walk every operand in lockstep
  with the output: operands of the output's shape need its dim_order; a broadcasting maximum or
  minimum walks each tensor as the row-major layout of its sizes: all contiguous;
- cortex_m::transpose (op_transpose.cpp) hands `arm_transpose_s8` the input's and the output's
  sizes and never their dim_order: it reads the input's bytes as the row-major layout of its
  sizes and writes the output's likewise, so both must be contiguous (a CRNN's permute of a
  channels-last convolution's output moved the wrong elements);
- `view_copy` is a memcpy that reinterprets the bytes as the new shape's contiguous layout: its
  input must be contiguous;
- the portable `cat`, `split_with_sizes_copy` and `unbind_copy` walk raw bytes by the sizes
  (op_cat.cpp, op_split_with_sizes_copy.cpp), and `gather`, `scatter`, `flip`, `roll`,
  `permute_copy`, `index_put` index them with coordinateToIndex of the sizes
  (kernels/reference.py SIZES_WALK_KERNELS): on a non-contiguous dim_order they move the wrong
  elements.

Beside the layout rules, one shape rule the plan reads from the same findings: cortex_m::transpose
refuses an input of rank 0 or above `kMaxSupportedDims` (op_transpose.cpp); its `transpose-rank`
finding is a device fault, not a `layout-*` one, so the compile does not refuse it as a
miscompile (the program fails on the device instead of computing wrong numbers).

Each finding is (check, detail) data; partitioners/reasons.py words it.
"""

from __future__ import annotations

import torch

from kernels.catalogue import CHANNELS_LAST, CPU_KERNELS
from kernels.reference import (RAW_CMSIS, SIZES_WALK_KERNELS, TRANSPOSE_MAX_RANK,
                               layouts_differ, transpose_rank_supported)

def is_layout_finding(check: str) -> bool:
    """Whether a finding is a layout one (`layout-*`: a kernel reads a tensor in another layout
    than it has, computing wrong numbers), which a layout copy fixes; else a shape rule such as
    `transpose-rank`."""
    return check.startswith("layout-")


_VIEWS = frozenset({"view_copy", "_unsafe_view", "view"})
# cortex_m ops whose kernel broadcasts by handing CMSIS-NN the tensors' sizes as its n, h, w, c
# (op_maximum.cpp, op_minimum.cpp: "Create CMSIS-NN dims directly from tensor sizes"): a
# broadcast walks every tensor's bytes as the row-major layout of its sizes, so all must be
# contiguous (a (1, 2, 3, 1) by (4, 1, 1, 3) maximum in channels-last: 44 of 72 outputs wrong,
# the same on the host and on QEMU).
_BROADCAST_BY_SIZES = frozenset({"maximum", "minimum"})
_RAW_WALK_PORTABLE = frozenset({"cat", "split_with_sizes_copy", "split_copy", "unbind_copy"}
                               | {name.split("::")[1] for name in SIZES_WALK_KERNELS})


def _parts(node) -> tuple[str, str]:
    text = str(getattr(node.target, "__name__", node.target))
    parts = text.split(".")
    if parts[0] in ("aten", "cortex_m", "dim_order_ops") and len(parts) > 1:
        return parts[0], parts[1]
    return "", parts[0]


def _tensor(value) -> torch.Tensor | None:
    val = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _order(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in t.dim_order())


def _tensor_inputs(node):
    for arg in node.args:
        items = arg if isinstance(arg, (list, tuple)) else (arg,)
        for item in items:
            t = _tensor(item)
            if t is not None:
                yield item, t


def layout_findings(node: torch.fx.Node) -> list[tuple[str, dict]]:
    """(check, fields) for every tensor of `node` laid out otherwise than its kernel reads it,
    and for a cortex_m::transpose input of a rank the kernel refuses."""
    if node.op != "call_function":
        return []
    namespace, op = _parts(node)
    out = _tensor(node)
    findings = []
    kernel = CPU_KERNELS.get(op) if namespace == "cortex_m" else None
    if kernel is not None and kernel.reads_nhwc:
        inputs = list(_tensor_inputs(node))
        if inputs:
            arg, t = inputs[0]
            if t.dim() == 4 and layouts_differ(tuple(t.shape), _order(t), CHANNELS_LAST):
                findings.append(("layout-nhwc-read", {
                    "op": f"cortex_m::{op}", "tensor": arg.name, "order": _order(t)}))
    if namespace == "cortex_m" and op in RAW_CMSIS and op != "transpose" and out is not None:
        for arg, t in _tensor_inputs(node):
            if tuple(t.shape) == tuple(out.shape) and layouts_differ(tuple(t.shape), _order(t),
                                                                     _order(out)):
                findings.append(("layout-raw-lockstep", {
                    "op": f"cortex_m::{op}", "tensor": arg.name, "order": _order(t),
                    "out_order": _order(out)}))
    if namespace == "cortex_m" and op == "transpose":
        inputs = list(_tensor_inputs(node))
        walked = inputs[:1] + ([(node, out)] if out is not None else [])
        for arg, t in walked:
            if layouts_differ(tuple(t.shape), _order(t), tuple(range(t.dim()))):
                findings.append(("layout-raw-walk", {"op": "cortex_m::transpose",
                                                     "tensor": inputs[0][0].name,
                                                     "order": _order(t)}))
                break
        if inputs and not transpose_rank_supported(inputs[0][1].dim()):
            findings.append(("transpose-rank", {"op": "cortex_m::transpose",
                                                "rank": inputs[0][1].dim(),
                                                "max_rank": TRANSPOSE_MAX_RANK}))
    if namespace == "cortex_m" and op in _BROADCAST_BY_SIZES and out is not None:
        tensors = list(_tensor_inputs(node))
        # A one-element operand (a hardswish's clamp bound) reads the same in any layout.
        if any(tuple(t.shape) != tuple(out.shape) and t.numel() > 1 for _, t in tensors):
            walked = tensors + [(node, out)]
            for arg, t in walked:
                if layouts_differ(tuple(t.shape), _order(t), tuple(range(t.dim()))):
                    findings.append(("layout-raw-walk", {"op": f"cortex_m::{op}",
                                                         "tensor": tensors[0][0].name,
                                                         "order": _order(t)}))
                    break
    if namespace == "aten" and (op in _VIEWS or op in _RAW_WALK_PORTABLE):
        for arg, t in _tensor_inputs(node):
            if layouts_differ(tuple(t.shape), _order(t), tuple(range(t.dim()))):
                check = "layout-view" if op in _VIEWS else "layout-raw-walk"
                findings.append((check, {"op": f"aten::{op}", "tensor": arg.name,
                                         "order": _order(t)}))
                break
        else:
            # Contiguous inputs, but the kernel would write an output declared otherwise.
            if op in _RAW_WALK_PORTABLE and out is not None and \
                    layouts_differ(tuple(out.shape), _order(out), tuple(range(out.dim()))):
                first = next(iter(_tensor_inputs(node)), None)
                if first is not None:
                    findings.append(("layout-raw-walk", {"op": f"aten::{op}",
                                                         "tensor": first[0].name,
                                                         "order": _order(out)}))
    return findings
