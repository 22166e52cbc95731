"""Device legalization: rewrite CPU-side ops that ExecuTorch's portable kernels cannot run as built.

Each rewrite corrects an upstream gap the host twin exposed, keeps the op's meaning, and is
reported in the plan (as a `Workaround`) so the user sees what changed and why:

- `aten.sort` has no kernel in ExecuTorch 1.5.1's portable library (the program fails to load
  with "Missing operator"). When only the sorted values are used, `topk(k = size of dim)`
  computes them, and the portable `topk.values` kernel exists. That kernel walks its input with
  contiguous strides (kernels/portable/cpu/op_topk.cpp: `getLeadingDims`, `strides()[dim]`), so
  a channels-last input is copied to contiguous first and the result copied back.
- The portable elementwise kernels require all tensors contiguous or all channels-last
  (`tensors_have_same_dim_order`); our channels-last export makes `x * c` or `x > c` with a
  single-element `c` fail with InvalidArgument. When `c` is known at compile time (a lifted
  constant, or a constant an NPU partition outputs), the `.Scalar` overload of the op, which
  checks only `x` and `out`, takes its value instead.
"""

from __future__ import annotations

import operator

import torch

from kernels.catalogue import CHANNELS_LAST
from partitioners.records import ORIGIN_KEY, Workaround

_SCALAR_OVERLOADS = {"add": "Scalar", "sub": "Scalar", "mul": "Scalar", "div": "Scalar",
                     "gt": "Scalar", "ge": "Scalar", "lt": "Scalar", "le": "Scalar",
                     "eq": "Scalar", "ne": "Scalar"}


def _edge_op(name: str, overload: str):
    from executorch.exir.dialects._ops import ops as exir_ops

    return getattr(getattr(exir_ops.edge.aten, name), overload)


def _target_parts(node) -> list[str]:
    return str(getattr(node.target, "__name__", node.target)).split(".")


def _val(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _is_channels_last_4d(val) -> bool:
    return val is not None and val.dim() == 4 and tuple(val.dim_order()) == CHANNELS_LAST


def _constant_value(program, node: torch.fx.Node):
    """The single value of a compile-time-constant, single-element tensor operand, else None."""
    if node.op == "placeholder":
        signature = program.graph_signature
        name = (signature.inputs_to_lifted_tensor_constants.get(node.name)
                or signature.inputs_to_buffers.get(node.name)
                or signature.inputs_to_parameters.get(node.name))
        if name is None:
            return None
        tensor = program.constants.get(name)
        if tensor is None:
            tensor = program.state_dict.get(name)
        if isinstance(tensor, torch.Tensor) and tensor.numel() == 1:
            return tensor.reshape(()).item()
        return None
    if node.op == "call_function" and node.target is operator.getitem:
        return _delegate_constant_output(program, node)
    return None


def _delegate_constant_output(program, getitem: torch.fx.Node):
    """A delegate output that is `quantize(full(v))` or `full(v)` inside the partition."""
    call = getitem.args[0]
    if "executorch_call_delegate" not in str(getattr(call, "target", "")):
        return None
    lowered = getattr(program.graph_module, call.args[0].target)
    output = next(n for n in lowered.original_module.graph.nodes if n.op == "output")
    produced = output.args[0][getitem.args[1]]
    quantize = None
    if "quantize_per_tensor" in str(produced.target):
        quantize, produced = produced, produced.args[0]
    if "full" not in str(produced.target) or not isinstance(produced.args[1], (int, float)):
        return None
    value = produced.args[1]
    if quantize is not None:
        scale, zero_point, qmin, qmax = (float(quantize.args[1]), int(quantize.args[2]),
                                         int(quantize.args[3]), int(quantize.args[4]))
        value = int(min(qmax, max(qmin, round(value / scale) + zero_point)))
    return value


def scalarize_constant_operands(program) -> list[Workaround]:
    """`op.Tensor(x, c)` -> `op.Scalar(x, value of c)` for a channels-last `x` and a constant,
    single-element `c` (see the module docstring for the dim-order rule this avoids)."""
    fixes = []
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        parts = _target_parts(node)
        if node.op != "call_function" or len(parts) < 3 or parts[0] != "aten" \
                or parts[1] not in _SCALAR_OVERLOADS or parts[2] != "Tensor" or len(node.args) < 2:
            continue
        tensor_arg, other = node.args[0], node.args[1]
        if not isinstance(other, torch.fx.Node) or not _is_channels_last_4d(_val(tensor_arg)):
            continue
        other_val = _val(other)
        if other_val is None or other_val.numel() != 1 or _is_channels_last_4d(other_val):
            continue
        value = _constant_value(program, other)
        if value is None:
            continue
        node.target = _edge_op(parts[1], _SCALAR_OVERLOADS[parts[1]])
        node.args = (tensor_arg, value, *node.args[2:])
        fixes.append(Workaround(
            node.meta.get(ORIGIN_KEY, node.name),
            "ExecuTorch portable kernels (tensors_have_same_dim_order)",
            f"{parts[1]}.Tensor of a channels-last tensor and the single-element constant "
            f"'{other.name}' fails the dim-order check on the device; rewritten to "
            f"{parts[1]}.Scalar with {value!r}"))
    return fixes


def sort_values_via_topk(program) -> list[Workaround]:
    """`sort(x).values` -> `topk(x, k=size)`, wrapped in contiguous copies when `x` is not."""
    from executorch.exir.dialects._ops import ops as exir_ops

    fixes = []
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        parts = _target_parts(node)
        if node.op != "call_function" or parts[:2] != ["aten", "sort"]:
            continue
        users = list(node.users)
        if any(u.target is not operator.getitem for u in users) \
                or any(u.args[1] != 0 for u in users):
            continue  # indices are used: topk's tie order may differ from a stable sort
        source = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else -1
        descending = bool(node.args[2]) if len(node.args) > 2 else False
        source_val = _val(source)
        original_order = list(source_val.dim_order())
        contiguous_order = list(range(source_val.dim()))
        size = int(source_val.shape[dim])
        with graph.inserting_before(node):
            current = source
            if original_order != contiguous_order:
                current = graph.call_function(
                    exir_ops.edge.dim_order_ops._to_dim_order_copy.default, (current,),
                    {"dim_order": contiguous_order})
                current.meta["val"] = source_val.contiguous()
            topk = graph.call_function(exir_ops.edge.aten.topk.default,
                                       (current, size, dim, descending, True))
            topk.meta["val"] = torch.topk(_val(current), size, dim, descending, True)
            values = graph.call_function(operator.getitem, (topk, 0))
            values.meta["val"] = topk.meta["val"][0]
            result = values
            if original_order != contiguous_order:
                result = graph.call_function(
                    exir_ops.edge.dim_order_ops._to_dim_order_copy.default, (values,),
                    {"dim_order": original_order})
                result.meta["val"] = _val(users[0]) if users else values.meta["val"]
        origin = node.meta.get(ORIGIN_KEY, node.name)
        topk.meta[ORIGIN_KEY] = values.meta[ORIGIN_KEY] = origin
        if current is not source:
            current.meta[ORIGIN_KEY] = f"{origin}:to_contiguous"
            result.meta[ORIGIN_KEY] = f"{origin}:restore_dim_order"
        for user in users:
            user.replace_all_uses_with(result)
            graph.erase_node(user)
        graph.erase_node(node)
        fixes.append(Workaround(
            origin, "ExecuTorch 1.5.1 portable kernel library (no aten::sort kernel)",
            f"sort along dim {dim} rewritten to topk(k={size}, largest={descending}, sorted=True)"
            + (" between copies to and from contiguous dim_order (op_topk.cpp walks contiguous "
               "strides)" if original_order != contiguous_order else "")))
    return fixes


def legalize_for_device(program) -> list[Workaround]:
    """Apply every rewrite above to the final CPU-side program, in place."""
    fixes = scalarize_constant_operands(program) + sort_values_via_topk(program)
    if fixes:
        program.graph_module.graph.eliminate_dead_code()
        program.graph_module.recompile()
    return fixes
