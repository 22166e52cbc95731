"""Device legalization: rewrite CPU-side ops that ExecuTorch's portable kernels cannot run as built.

(The user's modules rewritten before capture, Conv1d as Conv2d and average pools over their one
window, are partitioners/module_forms.py.)

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
- `aten.linear` has no kernel in the portable library; upstream's Cortex-M flow keeps it
  undecomposed for CMSIS-NN, so a linear the quantizer left in float (a GRU's gates on a
  CPU-only target) reaches the device as a missing operator. It is rewritten to the portable
  `mm`/`addmm` on the transposed weight (one transpose per weight, shared by every step of an
  unrolled recurrence), with `view_copy` around it for inputs of rank other than 2.
- ExecuTorch 1.5.1's Cortex-M pass turns every int8 `permute_copy` into `cortex_m::transpose`,
  whose kernel (backends/cortex_m/ops/op_transpose.cpp, `kMaxSupportedDims = 4`) refuses rank
  5 and up at run time ("expected tensor rank in [1, 4]"), e.g. a channel shuffle's 5-D
  permute. Those go back to the portable `permute_copy`, which takes any rank.
- ExecuTorch 1.5.1's `cortex_m::quantized_linear` requantizes with one multiplier
  (op_quantized_linear.cpp reads `.at(0)`), so a linear the Ethos-U quantizer quantized per
  output channel with several scales cannot run int8 on CMSIS-NN (a policy forcing DS-CNN's
  classifier to the CPU left it in float, and the runtime has no `dequantize_per_channel.out`
  for its weight). Upstream's convolution substitution takes one multiplier per output channel,
  so before the Cortex-M passes such a linear becomes the same arithmetic as a 1x1 convolution
  (`per_channel_linear_as_conv2d`): its [N, K] int8 input viewed as [N, K, 1, 1], the same
  int8 weight as [M, K, 1, 1] with the same per-channel scales and int32 bias, and the int8
  [N, M, 1, 1] result viewed back; the views sit on the int8 side of the quantize/dequantize, so
  they move codes. Only linears the CPU runs (route_to_cpu) with zero points all 0 and more
  than one distinct scale are rewritten; one scale for every channel keeps the per-tensor
  `quantized_linear` (upstream_cortex_m.per_channel_weights_legalized).
- A dropout in eval mode exports as a clone, and ExecuTorch 1.5.1's Cortex-M pass list keeps
  every clone (`_clone_dim_order` into the dim order its input already has): a copy of the whole
  tensor on the device (DS-CNN's two dropouts, 8,000 B each). A clone whose output has its
  input's dim order is an identity (the test of upstream's own `RemoveCloneOpsTransform`,
  backends/transforms/remove_clone_ops.py, which XNNPACK runs and the Cortex-M list does not);
  those go (`identity_copies_removed`). Upstream's Cortex-M avg_pool2d substitution writes
  `count_include_pad` as an explicit `cortex_m::pad` before the pool even when the padding is
  all zero (DS-CNN's (24, 5) pool): a copy with no padding, removed the same way.
  A copy whose input is a program input or constant, or whose result is a program output, stays
  (the program would then hand out a buffer it does not own), as does every copy of a program
  that writes a buffer in place.
- ExecuTorch 1.5.1 serializes a tensor's dim order from its strides
  (`exir/tensor.py: dim_order_from_stride`), where a size-1 dimension's place is ambiguous: a
  channels-last tensor of one channel, strides (256, 1, 16, 1), is written as dim order
  (0, 2, 1, 3), while torch, and the dim-order copy that made it, say (0, 2, 3, 1). The copy
  kernel compares the two literally and refuses (`out_dim_order[i] == dim_order_ref[i]`): a
  1-channel PixelShuffle output or a 1-channel copy the compile inserts did not run. Both orders
  lay the bytes out alike, so the serialized program gives such a copy's output the order the
  copy asks for (`size1_copy_orders` reports them).
- A CPU kernel that assumes a layout does not check it (kernels/layout_checks.py lists the
  rules). Where a tensor reaches such a kernel in another layout (a CMSIS-NN conv fed by a
  contiguous view, a cortex_m add walking a channels-last and a contiguous operand in lockstep,
  a portable `cat`/`split` over channels-last bytes, a `cortex_m::transpose` of a channels-last
  convolution output), a `_to_dim_order_copy` gives the kernel the layout it reads, and
  raw-walking outputs are copied back to the layout their users expect.
"""


from __future__ import annotations

import operator

import torch
from executorch.backends.arm.common.annotation_meta import ArmAnnotationInfo
from executorch.backends.transforms.utils import (create_constant_placeholder,
                                                  get_param_tensor, is_param_node)
from executorch.exir.dialects._ops import ops as exir_ops
from torch.export.graph_signature import InputKind

from kernels.catalogue import CHANNELS_LAST
from kernels.layout_checks import is_layout_finding, layout_findings
from kernels.reference import TRANSPOSE_MAX_RANK, is_portable_elementwise, layouts_differ
from partitioners.boundary import same_bytes_order
from partitioners.fused_activation_split import ACTIVATIONS
from partitioners.records import (MOVED_OFF_CMSIS_KEY, ORIGIN_KEY, REMOVED_COPIES_KEY, Workaround,
                                  quantize_scalar)

_SCALAR_OVERLOADS = {"add": "Scalar", "sub": "Scalar", "mul": "Scalar", "div": "Scalar",
                     "gt": "Scalar", "ge": "Scalar", "lt": "Scalar", "le": "Scalar",
                     "eq": "Scalar", "ne": "Scalar"}


def _edge_op(name: str, overload: str):
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
        value = quantize_scalar(value, scale, zero_point, qmin, qmax)
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


def float_linear_via_matmul(program) -> list[Workaround]:
    """`linear(x, w, b)` in float -> `addmm(b, x, permute(w))` (or `mm`), reshaped around."""
    graph = program.graph_module.graph
    fixes, transposed = [], {}
    for node in list(graph.nodes):
        if node.op != "call_function" or _target_parts(node)[:2] != ["aten", "linear"]:
            continue
        x, weight = node.args[0], node.args[1]
        bias = node.args[2] if len(node.args) > 2 else None
        x_val, w_val, out_val = _val(x), _val(weight), _val(node)
        if x_val is None or w_val is None or not x_val.dtype.is_floating_point \
                or w_val.dim() != 2:
            continue
        origin = node.meta.get(ORIGIN_KEY, node.name)
        k, n = int(w_val.shape[1]), int(w_val.shape[0])
        rows = int(x_val.numel() // k)
        with graph.inserting_before(node):
            if weight not in transposed:
                t = graph.call_function(_edge_op("permute_copy", "default"), (weight, [1, 0]))
                t.meta["val"] = w_val.t().contiguous()
                t.meta[ORIGIN_KEY] = f"{origin}:transpose_weight"
                transposed[weight] = t
            current = x
            if x_val.dim() != 2:
                current = graph.call_function(_edge_op("view_copy", "default"), (x, [rows, k]))
                current.meta["val"] = x_val.contiguous().reshape(rows, k)
                current.meta[ORIGIN_KEY] = f"{origin}:flatten"
            if bias is not None:
                product = graph.call_function(_edge_op("addmm", "default"),
                                              (bias, current, transposed[weight]))
            else:
                product = graph.call_function(_edge_op("mm", "default"),
                                              (current, transposed[weight]))
            product.meta["val"] = out_val.contiguous().reshape(rows, n)
            product.meta[ORIGIN_KEY] = origin
            result = product
            if out_val.dim() != 2:
                result = graph.call_function(_edge_op("view_copy", "default"),
                                             (product, list(out_val.shape)))
                result.meta["val"] = out_val.contiguous()
                result.meta[ORIGIN_KEY] = f"{origin}:unflatten"
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        fixes.append(Workaround(
            origin, "ExecuTorch 1.5.1 portable kernel library (no aten::linear kernel)",
            f"float linear {tuple(x_val.shape)} x {tuple(w_val.shape)}^T rewritten to "
            f"{'addmm' if bias is not None else 'mm'} on the transposed weight "
            f"'{weight.name}'" + (" with view_copy around it" if x_val.dim() != 2 else "")))
    return fixes




def wide_transpose_to_portable(program) -> list[Workaround]:
    """`cortex_m.transpose` of rank > 4 -> the portable `permute_copy` (same permutation)."""
    fixes = []
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function" or _target_parts(node)[:2] != ["cortex_m", "transpose"]:
            continue
        val = _val(node.args[0])
        if val is None or val.dim() <= TRANSPOSE_MAX_RANK:
            continue
        node.target = _edge_op("permute_copy", "default")
        node.meta[MOVED_OFF_CMSIS_KEY] = (
            "cortex_m::transpose", f"rank {val.dim()} above op_transpose.cpp's "
            f"kMaxSupportedDims = {TRANSPOSE_MAX_RANK}")
        fixes.append(Workaround(
            node.meta.get(ORIGIN_KEY, node.name),
            "ExecuTorch 1.5.1 Cortex-M pass (permute_copy substitution ignores the kernel's rank "
            "limit)",
            f"a rank-{val.dim()} int8 permute was routed to cortex_m::transpose, whose kernel "
            f"refuses rank above {TRANSPOSE_MAX_RANK} at run time; it runs on the "
            "portable permute_copy instead"))
    return fixes


def _with_dim_order(val, order: tuple[int, ...]):
    """`val` (a fake tensor) laid out in `order`, for a copy node's meta."""
    inverse = [order.index(d) for d in range(len(order))]
    return val.permute(*order).contiguous().permute(*inverse)


def layout_copy(graph, place, source, order: tuple[int, ...], origin: str, cache: dict):
    """A `_to_dim_order_copy` of `source` into `order` at `place` (one per source and order)."""
    key = (source, order)
    if key not in cache:
        with place:
            copy = graph.call_function(exir_ops.edge.dim_order_ops._to_dim_order_copy.default,
                                       (source,), {"dim_order": list(order)})
        copy.meta["val"] = _with_dim_order(_val(source), order)
        copy.meta[ORIGIN_KEY] = origin
        cache[key] = copy
    return cache[key]


def _replace_input(node, old, new) -> None:
    node.args = tuple([new if a is old else a for a in arg] if isinstance(arg, (list, tuple))
                      else (new if arg is old else arg) for arg in node.args)


def copy_to_kernel_layouts(program) -> list[Workaround]:
    """Copies that give every CPU kernel its operands in the layout it reads (see above)."""
    graph = program.graph_module.graph
    fixes, cache = [], {}
    for node in list(graph.nodes):
        findings = layout_findings(node)
        if not findings:
            continue
        origin = node.meta.get(ORIGIN_KEY, node.name)
        for check, fields in findings:
            if not is_layout_finding(check):
                continue  # not a layout finding (e.g. transpose-rank): no copy fixes it
            tensor = next(n for n in node.all_input_nodes if n.name == fields["tensor"])
            val = _val(tensor)
            if check == "layout-nhwc-read":
                order = CHANNELS_LAST
            elif check == "layout-raw-lockstep":
                order = tuple(fields["out_order"])
            else:  # layout-view, layout-raw-walk: the kernel walks contiguous bytes
                order = tuple(range(val.dim()))
            targets = [tensor] if check != "layout-raw-walk" else (
                [t for t in node.args[0] if _val(t) is not None]
                if isinstance(node.args[0], (list, tuple))
                else [t for t in node.all_input_nodes if _val(t) is not None])
            for source in targets:
                wanted = order if check != "layout-raw-walk" else \
                    tuple(range(_val(source).dim()))  # each operand contiguous in its own rank
                if tuple(_val(source).dim_order()) == wanted:
                    continue
                copy = layout_copy(graph, graph.inserting_before(node), source, wanted,
                                    f"{origin}:to_kernel_layout", cache)
                _replace_input(node, source, copy)
            copied_back = check == "layout-raw-walk" and \
                _restore_raw_walk_outputs(graph, node, origin)
            fixes.append(Workaround(
                origin, "ExecuTorch 1.5.1 CPU kernels (layout assumed, not checked)",
                f"{fields['op']} reads {fields['tensor']} as dim_order {order} but it is laid out "
                f"{tuple(fields['order'])}; a copy into the kernel's layout was inserted"
                + (" and its outputs copied back" if copied_back else "")))
    return fixes


def _restore_raw_walk_outputs(graph, node, origin: str) -> bool:
    """A raw-walking kernel now writes contiguous bytes: declare them so, and copy back.
    Whether any output needed its copy back."""
    outs = node.meta["val"]
    if isinstance(outs, torch.Tensor):
        return _declare_contiguous(graph, node, outs, origin)
    node.meta["val"] = type(outs)(v.contiguous() for v in outs)
    copied = [_declare_contiguous(graph, user, outs[user.args[1]], origin)
              for user in list(node.users) if user.target is operator.getitem]
    return any(copied)


def _declare_contiguous(graph, producer, val, origin: str) -> bool:
    """`producer` holds `val`'s elements contiguous: say so, and give its readers a copy in
    `val`'s layout. Whether that copy was needed."""
    producer.meta["val"] = val.contiguous()
    order = tuple(int(d) for d in val.dim_order())
    readers = list(producer.users)
    if order == tuple(range(val.dim())) or not readers:
        return False
    copy = layout_copy(graph, graph.inserting_after(producer), producer, order,
                        f"{origin}:restore_dim_order", {})
    for reader in readers:
        _replace_input(reader, producer, copy)
    return True


def runtime_node(program, operator: str, ordinal: int):
    """The `ordinal`-th call (0-based, in execution order) of `operator` ("aten::argmax.out")
    in `program`: how an instruction the runtime names is found among the graph's nodes (the
    emitter keeps the graph's order, and turns `aten.argmax.default` into `aten::argmax.out`)."""
    base = operator.split(".")[0]
    seen = 0
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        parts = _target_parts(node)
        if len(parts) < 2 or f"{parts[0]}::{parts[1]}" != base:
            continue
        if seen == ordinal:
            return node
        seen += 1
    return None


def contiguous_operands(program, node, refused: str) -> Workaround | None:
    """Give `node` every tensor operand in the default (contiguous) dim order and declare its
    output contiguous, copying it back for readers that expect another layout: what the real
    runtime's dim-order checks (`refused`, the kernel's own words) accept. None when every
    operand and output already is contiguous (a copy cannot help)."""
    graph = program.graph_module.graph
    origin = node.meta.get(ORIGIN_KEY, node.name)
    cache, copied = {}, []
    for source in list(node.all_input_nodes):
        val = _val(source)
        if val is None or val.dim() < 2 or tuple(val.dim_order()) == tuple(range(val.dim())):
            continue
        copy = layout_copy(graph, graph.inserting_before(node), source,
                            tuple(range(val.dim())), f"{origin}:to_contiguous", cache)
        _replace_input(node, source, copy)
        copied.append(source.name)
    out = _val(node)
    restored = out is not None and tuple(out.dim_order()) != tuple(range(out.dim()))
    if restored:
        _declare_contiguous(graph, node, out, origin)
    if not copied and not restored:
        return None
    graph.eliminate_dead_code()
    program.graph_module.recompile()
    what = (f"{', '.join(copied)} copied to contiguous" if copied else "") + (
        (" and " if copied else "") + "its output written contiguous, then copied back"
        if restored else "")
    return Workaround(origin, "ExecuTorch 1.5.1 portable kernel dim-order check (found by "
                      "running the program in the real runtime)",
                      f"the runtime refused {refused}; {what}")


def _identity_copy(node) -> tuple[str, str] | None:
    """(the upstream component, what makes `node` a copy that changes nothing), or None."""
    parts = _target_parts(node)
    if node.op != "call_function":
        return None
    if parts[:2] == ["dim_order_ops", "_clone_dim_order"]:
        out, source = _val(node), _val(node.args[0])
        if out is None or source is None or out.dim_order() != source.dim_order():
            return None
        return ("ExecuTorch 1.5.1 CortexMPassManager (keeps identity clones)",
                "a clone into the dim order its input already has (an eval-mode dropout, "
                "for one, exports as such a clone)")
    if parts[:2] == ["cortex_m", "pad"]:
        if len(node.args) != 4 or any(node.args[1]) or any(node.args[2]):
            return None  # (input, pre, post, zero point) as upstream writes it, or not ours
        return ("ExecuTorch 1.5.1 Cortex-M avg_pool2d substitution (pads by zero)",
                "a cortex_m::pad of zero on every side (the avg_pool2d substitution's "
                "count_include_pad)")
    return None


def identity_copies_removed(program) -> list[Workaround]:
    """Drop every copy that changes nothing (see above); its users read its input."""
    graph = program.graph_module.graph
    fixes = []
    if program.graph_signature.buffers_to_mutate:
        return fixes  # a copy may be what keeps a value from a later in-place write
    for node in list(graph.nodes):
        found = _identity_copy(node)
        source = node.args[0] if node.args else None
        if (found is None or not isinstance(source, torch.fx.Node)
                or source.op != "call_function"
                or any(user.op == "output" for user in node.users)):
            continue
        upstream, why = found
        origin = node.meta.get(ORIGIN_KEY, node.name)
        program.graph_module.meta.setdefault(REMOVED_COPIES_KEY, {})[origin] = why
        node.replace_all_uses_with(source)
        graph.erase_node(node)
        fixes.append(Workaround(
            origin, upstream,
            f"{why}: removed, so its consumer reads {source.meta.get(ORIGIN_KEY, source.name)} "
            f"and the device copies {_nbytes(source):,} B less per inference"))
    return fixes


def _nbytes(node) -> int:
    val = _val(node)
    return int(val.numel() * val.element_size()) if val is not None else 0


DIM_ORDER_COPIES = (["dim_order_ops", "_clone_dim_order"], ["dim_order_ops", "_to_dim_order_copy"])


def size1_copy_orders(program) -> list[Workaround]:
    """The dim-order copies whose output upstream serializes in another order than the one the
    copy asks for, differing only in a size-1 dimension's place (see above); the serialized
    program writes their outputs in the asked order (orchestrator/compilation/pipeline.py:
    `copy_outputs_in_asked_order`). Upstream's own passes refuse a graph that asks for the
    stride-derived order (it maps to no torch memory format), so the graph is left as it is."""
    from executorch.exir.tensor import dim_order_from_stride  # lazy: heavy (executorch)

    fixes = []
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function" or _target_parts(node)[:2] not in DIM_ORDER_COPIES:
            continue
        val, asked = _val(node), node.kwargs.get("dim_order")
        if val is None or asked is None:
            continue
        written = [int(d) for d in dim_order_from_stride(val.stride())]
        if list(asked) == written or not same_bytes_order(list(val.shape), list(asked), written):
            continue
        fixes.append(Workaround(
            node.meta.get(ORIGIN_KEY, node.name),
            "ExecuTorch 1.5.1 TensorSpec (dim order from strides: a size-1 dimension's place)",
            f"a copy into dim order {tuple(asked)} of a {list(val.shape)} tensor, whose output "
            f"upstream serializes as {tuple(written)} (the same bytes), which the copy kernel "
            f"refuses; the program writes that output as {tuple(asked)}"))
    return fixes


def odd_orders_made_contiguous(program) -> list[Workaround]:
    """A CPU op's output whose dim order is neither contiguous nor channels-last (up to where
    size-1 dimensions sit) is declared contiguous.

    Fake-tensor stride propagation gives a broadcast of a (2, 1, 2, 1) by a (1, 2, 1, 2)
    channels-last operand the order (0, 3, 2, 1). No portable kernel takes such a layout (they
    check all-contiguous or all-channels-last), and upstream's own dim-order copy cannot express
    it (`get_memory_format` raises "Failed to map a given dim_order"), so a copy back into it
    ended the compile in an internal error. The values are the same; only their layout moves."""
    fixes = []
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem \
                or "call_delegate" in str(node.target):
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() < 3:
            continue
        shape, order = list(val.shape), [int(d) for d in val.dim_order()]
        standard = [list(range(val.dim()))] + ([list(CHANNELS_LAST)] if val.dim() == 4 else [])
        if any(same_bytes_order(shape, order, known) for known in standard):
            continue
        node.meta["val"] = val.contiguous()
        fixes.append(Workaround(
            node.meta.get(ORIGIN_KEY, node.name),
            "ExecuTorch 1.5.1 dim orders (broadcast strides give one no kernel or copy takes)",
            f"the {shape} output's dim order {tuple(order)} is neither contiguous nor "
            "channels-last; it is laid out contiguous"))
    return fixes


def broadcast_outputs_contiguous(program) -> list[Workaround]:
    """A broadcasting portable elementwise op whose output is not laid out contiguous: its
    operands copied to contiguous and its output written contiguous, then copied back
    (`contiguous_operands`).

    The portable elementwise kernels (ExecuTorch 1.5.1 elementwise_util.h,
    broadcast_indexes_range.h) read broadcast inputs through their strides but write the output
    as the row-major bytes of its sizes (kernels/reference.py), whatever its dim_order: a
    channels-last output is read back wrong. The dim-order check passes where the broadcast
    operand's size-1 dims make its layout ambiguous: a CPU-only squeeze-excite raised to
    int16 (so its `x * scale` in float, [1, 8, 8, 8] channels-last by [1, 8, 1, 1]) was 2,150
    int16 steps off the quantized reference, the same bytes on the host runtime and QEMU."""
    fixes = []
    for node in list(program.graph_module.graph.nodes):
        parts = _target_parts(node)
        if node.op != "call_function" or len(parts) < 2 or parts[0] != "aten" \
                or not is_portable_elementwise(f"aten::{parts[1]}"):
            continue
        out = _val(node)
        if out is None or out.dim() < 2 or not layouts_differ(
                tuple(out.shape), tuple(out.dim_order()), tuple(range(out.dim()))):
            continue
        shapes = [tuple(_val(a).shape) for a in node.all_input_nodes if _val(a) is not None]
        if all(_without_leading_ones(shape) == _without_leading_ones(tuple(out.shape))
               for shape in shapes):
            continue  # no broadcast: raw bytes in lockstep, any shared layout
        fix = contiguous_operands(program, node, "nothing (it computed wrong numbers)")
        if fix is not None:
            fixes.append(Workaround(
                fix.node, "ExecuTorch 1.5.1 portable elementwise kernels (a broadcast writes "
                "the output row-major whatever its dim_order)",
                f"{parts[1]} broadcasts into a {tuple(int(d) for d in out.dim_order())} output: "
                f"{fix.message.split('; ', 1)[1]}"))
    return fixes


def _without_leading_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def legalize_for_device(program) -> list[Workaround]:
    """Apply every rewrite above to the final CPU-side program, in place."""
    fixes = (odd_orders_made_contiguous(program) + identity_copies_removed(program)
             + scalarize_constant_operands(program) + sort_values_via_topk(program)
             + float_linear_via_matmul(program) + wide_transpose_to_portable(program)
             + copy_to_kernel_layouts(program) + broadcast_outputs_contiguous(program))
    fixes += size1_copy_orders(program)  # last: the copies above included
    if fixes:
        program.graph_module.graph.eliminate_dead_code()
        program.graph_module.recompile()
    return fixes


def _dequantize_per_tensor(node) -> bool:
    return isinstance(node, torch.fx.Node) and _target_parts(node)[:2] == [
        "quantized_decomposed", "dequantize_per_tensor"]


def _per_channel_weight(program, linear):
    """(weight dequantize, int8 weight, scales) of a linear whose constant weight is quantized
    per output channel (axis 0) with zero points all 0 and more than one distinct scale, else
    None."""
    weight = linear.args[1] if len(linear.args) > 1 else None
    if not isinstance(weight, torch.fx.Node) or _target_parts(weight)[:2] != [
            "quantized_decomposed", "dequantize_per_channel"]:
        return None
    codes, scales, zero_points = weight.args[0], weight.args[1], weight.args[2]
    axis = weight.args[3] if len(weight.args) > 3 else 0
    if axis != 0 or not all(isinstance(n, torch.fx.Node) and is_param_node(program, n)
                            for n in (codes, scales, zero_points)):
        return None
    codes_t, scales_t, zps_t = (get_param_tensor(program, n)
                                for n in (codes, scales, zero_points))
    if codes_t is None or codes_t.dim() != 2 or scales_t is None or zps_t is None \
            or bool((zps_t != 0).any()) or len({float(s) for s in scales_t.flatten()}) < 2:
        return None
    return weight, codes_t, scales_t


def _view_after_activation(graph, view_out, shape_1x1) -> None:
    """`conv -> q -> view -> dq -> relu -> q` becomes `conv -> q -> dq -> relu -> q -> view`:
    a ReLU (or relu6, clamp) right after the rewritten linear stays next to the convolution, so
    `ActivationFusionPass` folds it into the kernel's output clamp instead of leaving a portable
    clamp on int8 codes (the activations are elementwise: the layout changes no value)."""
    users = list(view_out.users)
    dequantize = users[0] if len(users) == 1 else None
    if dequantize is None or not _dequantize_per_tensor(dequantize):
        return
    activations = list(dequantize.users)
    if len(activations) != 1 or activations[0].target not in ACTIVATIONS:
        return
    activation = activations[0]
    quantizes = list(activation.users)
    if len(quantizes) != 1 or _target_parts(quantizes[0])[:2] != ["quantized_decomposed",
                                                                   "quantize_per_tensor"]:
        return
    quantize = quantizes[0]
    shape = list(_val(quantize).shape)
    dequantize.args = (view_out.args[0], *dequantize.args[1:])
    for moved in (dequantize, activation, quantize):
        moved.meta["val"] = _val(moved).contiguous().reshape(shape_1x1)
    with graph.inserting_after(quantize):
        after = graph.call_function(view_out.target, (quantize, shape))
    after.meta.update(view_out.meta)
    after.meta["val"] = _val(view_out)
    quantize.replace_all_uses_with(after)
    after.args = (quantize, shape)
    graph.erase_node(view_out)


def per_channel_linear_as_conv2d(program, skip=()) -> list[Workaround]:
    """Every quantized `linear` (not in `skip`) whose weight has several per-channel scales
    (see the module docstring), as `view -> conv2d 1x1 -> view` on the int8 side of its
    quantize/dequantize, in place, before the Cortex-M passes. One Workaround per linear."""
    graph = program.graph_module.graph
    fixes = []
    for node in list(graph.nodes):
        if node.op != "call_function" or _target_parts(node)[:2] != ["aten", "linear"] \
                or node.name in skip or ArmAnnotationInfo.CUSTOM_META_KEY not in \
                node.meta.get("custom", {}):
            continue
        weight = _per_channel_weight(program, node)
        x = node.args[0]
        users = list(node.users)
        if weight is None or not _dequantize_per_tensor(x) or len(users) != 1 or \
                _target_parts(users[0])[:2] != ["quantized_decomposed", "quantize_per_tensor"]:
            continue
        dequantize_weight, codes, scales = weight
        quantize = users[0]
        bias = node.args[2] if len(node.args) > 2 else None
        x_val, out_val, q_val = _val(x.args[0]), _val(node), _val(quantize)
        if x_val is None or out_val is None or q_val is None:
            continue
        channels, k = (int(d) for d in codes.shape)
        rows = int(x_val.numel() // k)
        origin = node.meta.get(ORIGIN_KEY, node.name)

        def derived(new, val, suffix=None, annotated=False):
            new.meta.update({key: value for key, value in node.meta.items()
                             if key in ("nn_module_stack", "stack_trace", "source_fn_stack")})
            if annotated:
                new.meta["custom"] = dict(node.meta["custom"])
            new.meta["val"] = val
            new.meta[ORIGIN_KEY] = f"{origin}:{suffix}" if suffix else origin
            return new

        with graph.inserting_after(dequantize_weight.args[0]):
            codes_1x1 = create_constant_placeholder(
                program, graph, f"{node.name}_weight_1x1", InputKind.PARAMETER,
                codes.reshape(channels, k, 1, 1).contiguous())
        with graph.inserting_before(node):
            view_in = derived(graph.call_function(
                exir_ops.edge.aten.view_copy.default, (x.args[0], [rows, k, 1, 1])),
                x_val.contiguous().reshape(rows, k, 1, 1), "as_1x1_input")
            x_1x1 = derived(graph.call_function(x.target, (view_in, *x.args[1:]), x.kwargs),
                            _val(x).contiguous().reshape(rows, k, 1, 1), "as_1x1_input")
            w_1x1 = derived(graph.call_function(
                dequantize_weight.target, (codes_1x1, *dequantize_weight.args[1:]),
                dequantize_weight.kwargs),
                _val(dequantize_weight).reshape(channels, k, 1, 1), "weight_1x1")
            conv = derived(graph.call_function(
                exir_ops.edge.aten.convolution.default,
                (x_1x1, w_1x1, bias, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)),
                out_val.contiguous().reshape(rows, channels, 1, 1), annotated=True)
        with graph.inserting_after(quantize):
            view_out = derived(graph.call_function(
                exir_ops.edge.aten.view_copy.default, (quantize, list(q_val.shape))),
                q_val, "from_1x1_output")
        quantize.replace_all_uses_with(view_out)
        view_out.args = (quantize, list(q_val.shape))
        quantize.args = (conv, *quantize.args[1:])
        quantize.meta["val"] = q_val.contiguous().reshape(rows, channels, 1, 1)
        graph.erase_node(node)
        for dead in (x, dequantize_weight):
            if not dead.users:
                graph.erase_node(dead)
        _view_after_activation(graph, view_out, (rows, channels, 1, 1))
        distinct = len({float(s) for s in scales.flatten()})
        fixes.append(Workaround(
            origin, "ExecuTorch 1.5.1 cortex_m::quantized_linear (one requantization multiplier)",
            f"int8 linear {tuple(x_val.shape)} x {tuple(codes.shape)}^T with {distinct} different "
            f"per-channel weight scales rewritten to a 1x1 convolution over view_copy "
            f"[{rows}, {k}, 1, 1] -> [{rows}, {channels}, 1, 1] and back: "
            "cortex_m::quantized_conv2d requantizes each output channel with its own multiplier, "
            "the same int8 weights, scales and arithmetic"))
    if fixes:
        program.graph_module.recompile()
    return fixes
