"""The Plan: one OpPlacement per op of the quantized graph, plus the hidden CPU work.

Every reason here is data handed over by the check that decided (the Ethos-U partitioner's
`WhyNoPartitionReporter`, the Cortex-M substitution that returned None), never re-derived from
strings. Costs are attached by a later stage (`cost_models.plan_costs`), so a row has room for
them from the start.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from executorch.exir.tensor import dim_order_from_stride

from cost_models.cost import Cost
from cost_models.graph_shapes import NodeInfo, describe, op_name
from cost_models.op_shapes import OpShape
from kernels.layout_checks import layout_findings
from partitioners.s16_operators import S16_KEY
from kernels.catalogue import (CPU_KERNELS, cortex_m_op_name, dsp_avgpool_scratch_refusal,
                               mve_conv_1xn_refusal, specialised_function)
from kernels.device_ops import device_operator_names
from kernels.reference import is_portable_elementwise, same_dim_order_family
from partitioners.cpu import ORIGIN_KEY, CpuDecision, has_cmsis_substitution
from partitioners.records import MOVED_OFF_CMSIS_KEY, REMOVED_COPIES_KEY, module_of
from partitioners.reasons import LOWERING_REFUSAL, VELA_REFUSAL, Reason, because  # noqa: F401 - Reason: the Plan's
from orchestrator.compilation import precision as precisions
from orchestrator.compilation.upstream_exir import emitter_contiguous_ops

PLACEMENTS = ("npu", "cmsis-nn", "portable")
# requantize: where an int8 value meets an int16 consumer or back (--precision), on the NPU a
# RESCALE inside the partition, on the CPU a dequantize and a quantize (both rows)
ROW_KINDS = ("op", "boundary-quantize", "boundary-dequantize", "layout", "npu-invocation",
             "requantize")

# Nodes that move no data or are bookkeeping of the runtime, not ops a user asks about.
_SKIPPED = ("getitem", "alloc", "executorch_call_delegate", "view_copy", "squeeze_copy",
            "unsqueeze_copy", "_assert", "sym_size")
_QDQ = ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel",
        "dequantize_per_channel")
# Ops that only copy bytes into another layout, matched by their exact op name: a substring
# match would class `cortex_m::quantized_transpose_conv2d` (a convolution) as a copy.
_LAYOUT = frozenset({"_to_dim_order_copy", "_clone_dim_order", "permute_copy", "transpose_copy",
                     "clone", "transpose"})


def _is_layout(target) -> bool:
    parts = op_name(target).split(".")
    return (parts[1] if len(parts) >= 2 else parts[0]) in _LAYOUT


@dataclass(frozen=True)
class OpPlacement:
    name: str
    op: str
    kind: str  # one of ROW_KINDS
    placement: str  # one of PLACEMENTS
    partition: int | None  # NPU partition index for placement == "npu"
    kernel: str | None  # CMSIS-NN function (cmsis-nn), portable kernel name, or NPU partition
    tier: str | None  # ISA tier of a CPU kernel
    input_shapes: tuple[tuple[int, ...], ...]
    output_shape: tuple[int, ...]
    dtypes: str
    macs: int
    reasons: tuple[Reason, ...]
    info: NodeInfo | None = field(default=None, compare=False, repr=False)
    cost: Cost | None = None
    fused: tuple[str, ...] = ()  # pre-CPU-pass nodes folded into this kernel (e.g. a ReLU)
    device_faults: tuple[Reason, ...] = ()  # why the device runtime would fail on this op
    module: str = ""  # innermost source module (nn_module_stack path); "" = the model's forward
    module_type: str = ""  # its class name, e.g. GRU
    # a8w8 | a16w8 | float (orchestrator/compilation/precision.py: of_dtypes); "" for a row
    # without dtypes (an NPU invocation)
    precision: str = ""
    # An NPU invocation's inputs and outputs in bytes: what EthosUBackend copies into the NPU
    # scratch before the run and out of it after; 0 for every other row.
    io_bytes: int = 0

    @property
    def out_dtype(self) -> str:
        """The output dtype from `dtypes` ("int8,int8 -> int8 ..."), e.g. "int8"."""
        return self.dtypes.split("->")[-1].strip().split(" ")[0] if self.dtypes else ""


def _is(target, names) -> bool:
    text = op_name(target)
    return any(n in text for n in names)


def _delegates(program) -> list[tuple[torch.fx.Node, str, object]]:
    gm = program.graph_module
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and "executorch_call_delegate" in str(node.target):
            name = node.args[0].target
            found.append((node, name, getattr(gm, name)))
    return found


def _module_fields(node) -> dict:
    path, type_name = module_of(node)
    return {"module": path, "module_type": type_name}


def _npu_rows(index: int, lowered) -> list[OpPlacement]:
    rows = []
    for node in lowered.original_module.graph.nodes:
        widths = _requantized(node)
        if widths is not None:  # a RESCALE between int8 and int16 on the NPU
            shape = tuple(int(s) for s in node.meta["val"].shape)
            rows.append(OpPlacement(
                name=node.name, op=f"requantize {widths[0]} -> {widths[1]}", kind="requantize",
                placement="npu", partition=index, kernel=f"ethos-u partition {index}",
                tier=None, input_shapes=(shape,), output_shape=shape,
                dtypes=f"{widths[0]} -> {widths[1]}", macs=0, reasons=(),
                precision=precisions.A16W8, **_module_fields(node)))
            continue
        if node.op != "call_function" or _is(node.target, _QDQ) or _is(node.target, _SKIPPED):
            continue
        info = describe(node)
        dtypes = _npu_dtype(node, info.dtypes)
        rows.append(OpPlacement(
            name=node.name, op=info.op, kind="layout" if _is_layout(node.target) else "op",
            placement="npu", partition=index, kernel=f"ethos-u partition {index}", tier=None,
            input_shapes=info.input_shapes, output_shape=info.output_shape,
            dtypes=dtypes, macs=info.macs, reasons=(), info=info,
            precision=precisions.of_dtypes(dtypes), **_module_fields(node)))
    return rows


def _requantized(node: torch.fx.Node) -> tuple[str, str] | None:
    """(from, to) of a quantize that reads a dequantize of the other integer width: where an
    int8 region meets an int16 one (upstream's quantizer puts the pair at a module of another
    precision)."""
    if node.op != "call_function" or not _is(node.target, ("quantize_per_tensor",)) or \
            _is(node.target, ("dequantize",)) or len(node.args) < 6:
        return None
    source = node.args[0]
    if not isinstance(source, torch.fx.Node) or source.op != "call_function" or \
            not _is(source.target, ("dequantize_per_tensor",)) or len(source.args) < 6:
        return None
    widths = (_dtype_text(source.args[5]), _dtype_text(node.args[5]))
    return widths if set(widths) == {"int8", "int16"} else None


def _npu_dtype(node: torch.fx.Node, logical: str) -> str:
    """Inside a delegate the graph is fake-quantized float; the NPU computes in the Q dtypes.

    Each input takes the dtype of the dequantize that feeds it (int8 activations and weights,
    int32 bias) or, from another op of the partition, that op's NPU dtype; the output takes the
    dtype of the quantize after it: "int8,int8,int32 -> int8".
    """
    inputs = [_q_dtype(a) for a in node.all_input_nodes
              if getattr(a.meta.get("val"), "dtype", None) is not None]
    out = _quantized_as(node) or logical.split("->")[-1].strip()
    return f"{','.join(inputs)} -> {out}"


def _quantized_as(node: torch.fx.Node) -> str | None:
    """The dtype of the first quantize after `node` (within a few hops), if any."""
    frontier, seen = list(node.users), set()
    while frontier:
        user = frontier.pop(0)
        if user in seen:
            continue
        seen.add(user)
        if _is(user.target, ("quantize_per_tensor",)) and len(user.args) > 5:
            return _dtype_text(user.args[5])
        if len(seen) < 8:
            frontier.extend(user.users)
    return None


def _q_dtype(value: torch.fx.Node) -> str:
    """The dtype a delegate op's input holds on the NPU."""
    if value.op == "call_function" and _is(value.target, ("dequantize_per_tensor",)) \
            and len(value.args) > 5:
        return _dtype_text(value.args[5])
    if value.op == "call_function" and _is(value.target, ("dequantize_per_channel",)) \
            and len(value.args) > 6:
        return _dtype_text(value.args[6])
    own = value.meta["val"].dtype
    if value.op == "call_function" and own.is_floating_point:
        return _quantized_as(value) or _dtype_text(own)
    return _dtype_text(own)


def _dtype_text(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _not_npu_reason(origin: str, lowered_stage, pre_cpu, npu: str | None, kind: str,
                    widths: tuple[str, str] | None = None) -> Reason:
    if kind == "requantize":
        return because("requantize", source=widths[0], target=widths[1])
    if npu is None:
        return because("no-npu")
    rejection = lowered_stage.npu_rejections.get(origin)
    if rejection is not None and rejection.device_refusal:
        key = "vela-refused-npu" if rejection.device_refusal.startswith(VELA_REFUSAL) \
            else "backend-refused-npu" \
            if rejection.device_refusal.startswith(LOWERING_REFUSAL) else "device-refused-npu"
        return because(key, rejection.context, why=rejection.device_refusal)
    if rejection is not None and rejection.policy_rule:
        return because("policy-forced-cpu", rejection.context, rule=rejection.policy_rule)
    if rejection is not None:
        return because("npu-operator-support", rejection.context, message=rejection.message)
    if kind in ("boundary-quantize", "boundary-dequantize"):
        return because(f"{kind}-int16" if widths and "int16" in widths else kind)
    if ":" in origin:
        return because("inserted-by-legalization")
    if origin not in pre_cpu:
        return because("inserted-by-cortex-m-passes")
    return because("left-out-of-partitions")


def _not_cmsis_reason(origin: str, target, decision: CpuDecision | None,
                      aten_target) -> Reason:
    if decision is not None and decision.category == "int16":
        return because("no-s16-operator", debug=decision.check)
    if decision is not None and decision.category != "lowered":
        return because("cmsis-condition", debug=decision.check, message=decision.message)
    name = op_name(aten_target if aten_target is not None else target)
    if aten_target is not None and has_cmsis_substitution(aten_target):
        return because("cmsis-substitution-not-applied", op=name)
    return because("no-cmsis-kernel", op=name)


def _io_bytes(delegate_call) -> int:
    """Bytes of a delegate call's tensor inputs and outputs."""
    values = [a.meta.get("val") for a in delegate_call.args[1:] if hasattr(a, "meta")]
    out = delegate_call.meta.get("val")
    values += list(out) if isinstance(out, (list, tuple)) else [out]
    return sum(int(v.numel()) * v.element_size() for v in values if hasattr(v, "element_size"))


def place(final_program, lowered_stage, decisions: dict[str, CpuDecision],
          pre_cpu: dict[str, tuple[NodeInfo, object, tuple[str, ...]]], target) -> tuple[OpPlacement, ...]:
    """Every op of the final program, in execution order, with where it runs and why.

    `pre_cpu` maps each edge node name before CPU routing to (NodeInfo, aten target, input names):
    MACs and shapes are reported for the op the user wrote, not its rewritten form.
    """
    rows: list[OpPlacement] = []
    delegates = {node: (idx, name, mod) for idx, (node, name, mod) in enumerate(_delegates(final_program))}
    seen_origins: set[str] = set()
    for node in final_program.graph.nodes:
        if node.op != "call_function":
            continue
        if node in delegates:
            index, name, lowered = delegates[node]
            rows.append(OpPlacement(
                name=f"{name}", op="EthosUBackend invocation", kind="npu-invocation",
                placement="npu", partition=index, kernel=f"ethos-u partition {index}",
                tier=None, input_shapes=tuple(tuple(int(s) for s in a.meta["val"].shape)
                                              for a in node.args[1:] if "val" in a.meta),
                output_shape=(), dtypes="", macs=0, reasons=(), io_bytes=_io_bytes(node)))
            rows.extend(_npu_rows(index, lowered))
            continue
        if _is(node.target, _SKIPPED):
            continue
        origin = node.meta.get(ORIGIN_KEY, node.name)
        seen_origins.add(origin)
        pre = pre_cpu.get(origin)
        info = pre[0] if pre else describe(node)
        aten_target = pre[1] if pre else None
        cortex_op = cortex_m_op_name(node.target)
        widths = _cpu_requantized(node)
        if widths is not None:
            kind = "requantize"
        elif _is(node.target, ("quantize_per_tensor",)) and not _is(node.target, ("dequantize",)):
            kind, widths = "boundary-quantize", _qdq_width(node)
        elif _is(node.target, ("dequantize_per_tensor",)):
            kind, widths = "boundary-dequantize", _qdq_width(node)
        elif _is_layout(node.target):
            kind = "layout"
        else:
            kind = "op"
        reasons = [_not_npu_reason(origin, lowered_stage, pre_cpu, target.npu, kind, widths)]
        if cortex_op is not None:
            placement = "cmsis-nn"
            kernel = (specialised_function(cortex_op, node, target.tier)
                      if cortex_op in CPU_KERNELS else cortex_op)
        elif S16_KEY in node.meta:
            placement, kernel = "cmsis-nn", node.meta[S16_KEY]
        else:
            placement = "portable"
            kernel = op_name(node.target)
            moved = node.meta.get(MOVED_OFF_CMSIS_KEY)
            reasons.append(
                because("cmsis-kernel-limit", op=op_name(aten_target or node.target),
                        kernel=moved[0], limit=moved[1]) if moved else
                _not_cmsis_reason(origin, node.target, decisions.get(origin), aten_target))
        current = describe(node)
        if placement == "portable":
            rows.extend(_emitter_copy(node, origin, _module_fields(node)))
        faults = (_dim_order_faults(node) if placement == "portable" else ()) + tuple(
            because(check, **fields) for check, fields in layout_findings(node)) + \
            tier_faults(node, target.tier)
        rows.append(OpPlacement(
            name=origin, op=info.op, kind=kind, placement=placement, partition=None,
            kernel=kernel, tier=target.tier if placement == "cmsis-nn" else None,
            input_shapes=info.input_shapes, output_shape=info.output_shape, dtypes=current.dtypes,
            macs=info.macs, reasons=tuple(reasons), info=info, device_faults=faults,
            precision=precisions.of_dtypes(current.dtypes), **_module_fields(node)))
    removed = final_program.graph_module.meta.get(REMOVED_COPIES_KEY, {})
    return tuple(_attach_fused(rows, pre_cpu, seen_origins | set(removed), lowered_stage))


def _emitter_copy(node: torch.fx.Node, origin: str, module: dict) -> list[OpPlacement]:
    """The row of the copy `to_executorch` inserts before `node`: a portable op whose kernel
    wants a contiguous first input (upstream_exir.emitter_contiguous_ops) reading one that is
    not; else none."""
    if op_name(node.target) not in emitter_contiguous_ops() or not node.all_input_nodes:
        return []
    source = node.all_input_nodes[0]
    value = source.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return []
    order = tuple(int(d) for d in value.dim_order())
    if order == tuple(range(value.dim())):
        return []
    shape = tuple(int(d) for d in value.shape)
    size = int(value.numel()) * value.element_size()
    dtype = str(value.dtype).replace("torch.", "")
    op = "dim_order_ops._to_dim_order_copy.default"
    info = NodeInfo(f"{origin}:to_contiguous", op, (shape,), shape, f"{dtype} -> {dtype}", 0,
                    OpShape(kind="copy", macs=0, input_bytes=size, output_bytes=size,
                            elements=int(value.numel())))
    reason = because("emitter-dim-order-copy", op=op_name(node.target), order=order)
    return [OpPlacement(
        name=info.name, op=op, kind="layout", placement="portable", partition=None, kernel=op,
        tier=None, input_shapes=(shape,), output_shape=shape, dtypes=info.dtypes, macs=0,
        reasons=(reason,), info=info, precision=precisions.of_dtypes(info.dtypes), **module)]


def _qdq_width(node: torch.fx.Node) -> tuple[str, str] | None:
    """("int16", "int16") for a CPU quantize or dequantize of int16 (the reason names it)."""
    dtype = node.args[5] if len(node.args) > 5 else None
    return ("int16", "int16") if dtype == torch.int16 else None


def _cpu_requantized(node: torch.fx.Node) -> tuple[str, str] | None:
    """(from, to) of a CPU quantize reading a dequantize of the other integer width, or of a
    dequantize every user of which is such a quantize: the two halves of a requantize."""
    if _is(node.target, ("dequantize_per_tensor",)):
        found = {_requantized(user) for user in node.users}
        return found.pop() if len(found) == 1 and None not in found else None
    return _requantized(node)


def op_key(target) -> str:
    """`aten::gt` for aten.gt.Scalar: the operator name a runtime registers kernels under."""
    text = op_name(target)
    parts = text.split(".")
    return f"{parts[0]}::{parts[1]}" if len(parts) >= 2 else text


def tier_faults(node: torch.fx.Node, tier: str) -> tuple[Reason, ...]:
    """What the tier's own kernel path refuses that the host's C path (which the device check
    runs) accepts: the MVE 1xN convolution's padding rule, the DSP average pool's buffer
    (kernels/catalogue.py)."""
    if tier == "dsp" and "quantized_avg_pool2d" in str(node.target):
        return _dsp_avgpool_faults(node, tier)
    if tier != "mve" or "quantized_conv2d" not in str(node.target):
        return ()
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:2]]
    out = node.meta.get("val")
    if not all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in (*vals, out)):
        return ()
    refusal = mve_conv_1xn_refusal(tuple(vals[0].shape), tuple(vals[1].shape),
                                   tuple(out.shape), tuple(node.args[3]), tuple(node.args[4]),
                                   tuple(node.args[5]))
    if refusal is None:
        return ()
    return (because("mve-conv-1xn-padding", op="cortex_m::quantized_conv2d", tier=tier,
                    **refusal),)


def _dsp_avgpool_faults(node: torch.fx.Node, tier: str) -> tuple[Reason, ...]:
    """arm_avgpool_s8's DSP path refuses an empty scratch (kernels/catalogue.py)."""
    source = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    scratch = node.args[8] if len(node.args) > 8 else None
    scratch = scratch.meta.get("val") if isinstance(scratch, torch.fx.Node) else None
    if not (isinstance(source, torch.Tensor) and source.dim() == 4
            and isinstance(scratch, torch.Tensor)):
        return ()
    channels = int(source.shape[3] if "nhwc" in str(node.target) else source.shape[1])
    refusal = dsp_avgpool_scratch_refusal(channels, scratch.numel() * scratch.element_size())
    if refusal is None:
        return ()
    return (because("dsp-avgpool-scratch", op="cortex_m::quantized_avg_pool2d", tier=tier,
                    **refusal),)


def _dim_order_faults(node: torch.fx.Node) -> tuple[Reason, ...]:
    """The portable elementwise kernels' dim-order check, applied to this node's tensors with
    the dim orders the serialized program gives them: upstream derives each from the strides
    (`dim_order_from_stride`), which places a size-1 dimension otherwise than torch's
    `dim_order()` (a channels-last (2, 1, 2, 1) is (0, 1, 2, 3) in the program, (0, 2, 1, 3)
    to torch), and the kernel compares the serialized arrays."""
    key = op_key(node.target)
    if not is_portable_elementwise(key):
        return ()
    orders = []
    for value in [*node.all_input_nodes, node]:
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            orders.append(tuple(int(d) for d in dim_order_from_stride(val.stride())))
    if same_dim_order_family(orders):
        return ()
    return (because("dim-order-family", op=key, orders=", ".join(str(o) for o in orders)),)


def missing_kernel_faults(rows, program_operators) -> tuple:
    """Mark rows whose operator has no kernel in the libraries the device runner links."""
    available = device_operator_names()
    missing = {op.split(".")[0]: op for op in program_operators if op not in available}
    if not missing:
        return tuple(rows)
    out = []
    for row in rows:
        key = op_key(row.op) if row.placement == "portable" else None
        if key in missing:
            fault = because("missing-kernel", op=missing[key])
            row = replace(row, device_faults=row.device_faults + (fault,))
        out.append(row)
    return tuple(out)


def _attach_fused(rows, pre_cpu, seen_origins, lowered_stage):
    """Name the CPU nodes a Cortex-M pass folded into a neighbour (e.g. ReLU into a conv's clamp)."""
    by_name = {r.name: i for i, r in enumerate(rows)}
    fused: dict[int, list[str]] = {}
    for origin, (info, aten_target, inputs) in pre_cpu.items():
        if origin in seen_origins or _is(aten_target, _QDQ) or _is(aten_target, _SKIPPED):
            continue
        producer = next((i for i in inputs if i in by_name), None)
        # Walk through folded Q/DQ nodes to the kernel that absorbed this one.
        frontier = list(inputs)
        while producer is None and frontier:
            candidate = frontier.pop(0)
            if candidate in by_name:
                producer = candidate
            elif candidate in pre_cpu:
                frontier.extend(pre_cpu[candidate][2])
        if producer is not None:
            fused.setdefault(by_name[producer], []).append(origin)
    return [replace(r, fused=tuple(fused.get(i, ()))) for i, r in enumerate(rows)]


def snapshot_pre_cpu(program) -> dict[str, tuple[NodeInfo, object, tuple[str, ...]]]:
    """Describe each call_function node of the edge program before the Cortex-M passes rewrite it."""
    snapshot = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or "executorch_call_delegate" in str(node.target):
            continue
        try:
            info = describe(node)
        except Exception:  # noqa: BLE001 - a node without tensor metadata has nothing to report
            continue
        snapshot[node.name] = (info, node.target, tuple(a.name for a in node.all_input_nodes))
    return snapshot
