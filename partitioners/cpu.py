"""CPU routing: ExecuTorch's CortexMPassManager on what the NPU did not take, with its reasons kept.

`AtenToCortexMPass` decides, per node, through one substitution function per aten op: the function
returns a CMSIS-NN-backed `cortex_m::` node, or `None` when one of its conditions fails, and the
node then stays on a portable kernel. Upstream records no reason. The adapter
(partitioners/upstream_cortex_m.py) runs the unchanged functions and reports, for each `None`,
the condition of upstream's own source that held (or the quantizer check behind a flag it
read); here that becomes a `CpuDecision` with a category and the text a user reads.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
from dataclasses import dataclass
from typing import Iterator

import torch
from executorch.backends.arm.common.annotation_meta import ArmAnnotationInfo
from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
from executorch.backends.cortex_m.target_config import CortexMTargetConfig

from partitioners import s16_operators, upstream_cortex_m
from partitioners.activation_narrowing import NARROWED_KEY, with_narrowed_fusion
from partitioners.early_batch_matmul import EARLY_BMM_KEY, with_early_batch_matmul
from partitioners.fused_activation_split import folds_into_its_producer, split_fused_activations
from partitioners.legalize import legalize_for_device, per_channel_linear_as_conv2d
from partitioners.reasons import CATALOGUE
# stamp_origins is re-exported for callers that import it from here.
from partitioners.records import (ORIGIN_KEY, Workaround, quantize_scalar,  # noqa: F401
                                  reassign_shared_origins, stamp_origins)


@dataclass(frozen=True)
class CpuDecision:
    """Why a CPU node did (kernel) or did not (reason) become a CMSIS-NN-backed cortex_m op."""

    origin: str
    aten_op: str
    # lowered | no-kernel | not-quantized | layout | shape-limit | dtype | condition |
    # upstream-failure | per-channel-weights | int16 (a16w8: no s16 operator)
    category: str
    message: str
    check: str  # where the decision was made: "file.py:line" of upstream code


_CATEGORY_PATTERNS = (
    ("not-quantized", re.compile(r"qparams|quantiz", re.I)),
    ("layout", re.compile(r"dim_order|channels_last|memory_format|nhwc|layout", re.I)),
    ("dtype", re.compile(r"dtype|int8|int16|float", re.I)),
    ("shape-limit", re.compile(r"stride|dilation|kernel|padding|groups|shape|size|rank|dim|ceil|divisor", re.I)),
)

_READABLE = {
    "not-quantized": "not quantized: the node carries no input/output qparams, so no int8 kernel applies",
    "layout": "layout condition of the CMSIS-NN kernel not met",
    "dtype": "dtype not supported by the CMSIS-NN kernel",
    "shape-limit": "shape/geometry outside what the CMSIS-NN kernel supports",
    "condition": "a condition of the Cortex-M lowering failed",
}


def _categorize(condition: str) -> str:
    for category, pattern in _CATEGORY_PATTERNS:
        if pattern.search(condition):
            return category
    return "condition"


def _op_name(target) -> str:
    return str(getattr(target, "__name__", target))


def _decision(origin: str, aten_op: str,
             outcome: upstream_cortex_m.Lowered | upstream_cortex_m.Declined) -> CpuDecision:
    """The CpuDecision of one substitution's outcome. Line numbers stay out of the message
    (plan.json must not change with unrelated upstream edits); they go to `check`."""
    if isinstance(outcome, upstream_cortex_m.Lowered):
        return CpuDecision(origin, aten_op, "lowered", f"lowered to {outcome.op}", outcome.where)
    flag = outcome.flag
    if flag is not None:
        text = " or ".join(flag.held)
        detail = f" ({flag.values})" if flag.values else ""
        reason = (f"`{text}`{detail}: the quantizer's {flag.check} marks the node "
                  f"`{flag.flag}`")
        where = f"{outcome.where} after {flag.where}"
    else:
        text = " or ".join(outcome.held)
        reason = f"`{text}`" + (f" ({outcome.values})" if outcome.values else "")
        where = outcome.where
    category = _categorize(text)
    return CpuDecision(origin, aten_op, category, f"{_READABLE[category]} ({reason})", where)


@contextlib.contextmanager
def cmsis_decisions_recorded() -> Iterator[dict[str, CpuDecision]]:
    """Record every AtenToCortexMPass substitution decision, keyed by the node's origin name."""
    decisions: dict[str, CpuDecision] = {}

    def record(node, outcome) -> None:
        origin = node.meta.get(ORIGIN_KEY, node.name)
        decisions[origin] = _decision(origin, _op_name(node.target), outcome)

    with upstream_cortex_m.substitutions_observed(record):
        yield decisions


@contextlib.contextmanager
def per_channel_weights_legalized() -> Iterator[list[Workaround]]:
    """The Ethos-U quantizer's per-channel weight zero points (all 0) in the scalar form
    `cortex_m::quantized_linear` takes, where that is exact (upstream_cortex_m's docstring): one
    Workaround per linear rewritten. Enter it after `cmsis_decisions_recorded`."""
    fixes: list[Workaround] = []

    def record(node, channels: int, scale: float) -> None:
        fixes.append(Workaround(
            node.meta.get(ORIGIN_KEY, node.name),
            "ExecuTorch 1.5.1 AtenToCortexMPass (`weight_zp != 0` refuses per-channel zero "
            "points even when all are 0)",
            f"{_op_name(node.target)} weight quantized per channel ({channels} channels, zero "
            f"points all 0, one scale {scale:.6g}) given to cortex_m::quantized_linear in the "
            "per-tensor form it takes: the same int8 arithmetic"))

    with upstream_cortex_m.per_channel_weights_legalized(record):
        yield fixes


@contextlib.contextmanager
def single_channel_convolutions_as_conv2d() -> Iterator[list[Workaround]]:
    """A convolution with one input channel (groups 1) on CMSIS-NN's convolution kernel, not
    the depthwise kernel upstream takes it for (upstream_cortex_m's docstring): one Workaround
    per convolution. Enter it before `cmsis_decisions_recorded`."""
    fixes: list[Workaround] = []

    def record(node) -> None:
        out_channels = getattr(node.meta.get("val"), "shape", (0, 0))[1]
        fixes.append(Workaround(
            node.meta.get(ORIGIN_KEY, node.name),
            "ExecuTorch 1.5.1 AtenToCortexMPass (`in_channels == groups` taken as depthwise)",
            f"{_op_name(node.target)} with one input channel and groups 1 (not depthwise) on "
            f"cortex_m::quantized_conv2d (CMSIS-NN's convolution, as TFLM runs it) in place of "
            f"the depthwise kernel with a depth multiplier of {out_channels}: the same values, "
            "its weight in OHWI order"))

    with upstream_cortex_m.single_channel_convolutions_as_conv2d(record):
        yield fixes


def has_cmsis_substitution(target) -> bool:
    return upstream_cortex_m.has_substitution(target)


_COMPARISONS = {"gt": math.floor, "le": math.floor, "ge": math.ceil, "lt": math.ceil}


def requantize_comparison_scalars(program) -> list[Workaround]:
    """Put the scalar of an int8 comparison in the int8 domain.

    Upstream defect (ExecuTorch 1.5.1): FoldAndAnnotateQParamsPass folds the dequantize in front
    of `gt(x, 0.0)` into the node's `input_qparams`, so the portable `gt.Scalar` kernel compares
    the int8 values, but the scalar stays in the float domain. With a zero point of -8 every
    int8 value in (-8, 0] lands on the wrong side (measured on the `mixed` model, CPU-only:
    9 int8 steps off after the following `where`). For x_q integer and t = s / scale + zp,
    x > s  <=>  x_q > floor(t), x >= s <=> x_q >= ceil(t), and likewise for lt/le.
    """
    fixes = []
    for node in program.graph_module.graph.nodes:
        name = str(getattr(node.target, "__name__", node.target))
        parts = name.split(".")
        if node.op != "call_function" or len(parts) < 3 or parts[0] != "aten" \
                or parts[1] not in _COMPARISONS or parts[2] != "Scalar":
            continue
        qparams = node.meta.get("input_qparams", {}).get(0)
        source = node.args[0]
        val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if qparams is None or val is None or val.dtype not in (torch.int8, torch.int16):
            continue
        scalar = float(node.args[1])
        threshold = _COMPARISONS[parts[1]](scalar / float(qparams.scale) + int(qparams.zp))
        node.args = (source, int(threshold))
        fixes.append(Workaround(
            node.meta.get(ORIGIN_KEY, node.name), "FoldAndAnnotateQParamsPass (ExecuTorch 1.5.1)",
            f"{parts[1]}.Scalar compares int8 values (scale {float(qparams.scale):.6g}, zero point "
            f"{int(qparams.zp)}) with the float scalar {scalar:g}; threshold requantized to "
            f"{int(threshold)}"))
    if fixes:
        program.graph_module.recompile()
    return fixes


# "While executing %aten_bmm_default_1 : [num_users=1] = call_function[...]": how torch.fx
# names the node an upstream pass failed on.
_FAILED_NODE = re.compile(r"While executing %(\w+)")
# Distinct upstream failures answered by keeping a node in float, one pass-manager run each
# (the attention block moved off the U55 takes 9; a node with the same op and operands as one
# that failed is kept with it: _operand_signature).
MAX_FLOAT_FALLBACKS = 32


def _operand_signature(node) -> tuple | None:
    """(op, each tensor operand's shape and dtype): what upstream's substitution checks of an
    op read (quantized_add's broadcast test reads the shapes). None: no tensor operands."""
    operands = []
    for arg in node.all_input_nodes:
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            operands.append((tuple(val.shape), val.dtype))
    return (node.target, tuple(operands)) if operands else None


def _same_operands(program, name: str) -> list[str]:
    """The other nodes of `program` with node `name`'s op and operand shapes and dtypes."""
    nodes = {n.name: n for n in program.graph_module.graph.nodes if n.op == "call_function"}
    signature = _operand_signature(nodes[name]) if name in nodes else None
    if signature is None:
        return []
    return [other for other, node in nodes.items()
            if other != name and _operand_signature(node) == signature]


def _root_message(error: BaseException) -> str:
    error = _root_error(error)
    text = " ".join(str(error).split("Original traceback:")[0].split())
    return f"{type(error).__name__}: {text}"


def _root_error(error: BaseException) -> BaseException:
    seen = set()
    while (error.__cause__ or error.__context__) is not None and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return error


def _failed_node(error: BaseException) -> str | None:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        match = _FAILED_NODE.search(str(error))
        if match:
            return match.group(1)
        error = error.__cause__ or error.__context__
    return None


def _failed_origin(error: BaseException, name: str) -> str | None:
    """The pre-pass name (ORIGIN_KEY) of the node `name` an upstream pass failed on, read from
    the node itself in the failing frames: a node a substitution created (the
    `cortex_m_quantized_add` whose fake kernel refuses a broadcast) has a new name, but it
    carries the name of the node it replaced."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback = error.__traceback__
        while traceback is not None:
            for value in traceback.tb_frame.f_locals.values():
                if isinstance(value, torch.fx.Node) and value.name == name:
                    return value.meta.get(ORIGIN_KEY)
            traceback = traceback.tb_next
        error = error.__cause__ or error.__context__
    return None


def _keep_float(program, name: str) -> bool:
    """Take the quantizer's mark off node `name`, so FoldAndAnnotateQParamsPass leaves its
    quantize/dequantize in place and the node runs in float on its portable kernel."""
    for node in program.graph_module.graph.nodes:
        if node.name == name:
            custom = node.meta.get("custom", {})
            if ArmAnnotationInfo.CUSTOM_META_KEY not in custom:
                return False
            # A new dict: a deep copy of a GraphModule copies each node's meta shallowly, so the
            # `custom` dict is shared with the program copied from (measured: taking the mark off
            # a copy took it off the compile's edge program too).
            node.meta["custom"] = {key: value for key, value in custom.items()
                                   if key != ArmAnnotationInfo.CUSTOM_META_KEY}
            return True
    return False


_FILLS = {"full_like": 1, "full": 1, "fill": 1}  # op -> position of the fill value


def requantize_fill_values(program) -> list[Workaround]:
    """Make an int8 `full`/`full_like`/`fill` fill int8 codes.

    Upstream defect (ExecuTorch 1.5.1): FoldAndAnnotateQParamsPass always folds the quantize
    after a constant op into its `output_qparams`, for the Arm backend's constant folding to
    compute it in int8 later; the Cortex-M passes do not, so the fill value stays the float one
    and is written raw: `zeros_like(x)` of an int8 tensor with zero point 33 held 0 (33 int8
    steps off: measured on a `where(x > t, x, zeros_like(x))`). A `full` whose dtype argument
    says float keeps producing float, and the dequantize after it refuses it at run time
    (`input.scalar_type() 6 does not match dtype 1`: the attention's `full([1], 0.5)` scale of
    ViT's encoder moved off the U55). The value is quantized with the node's own output scale
    and zero point, and the fill made in the quantized dtype."""
    fixes = []
    for node in program.graph_module.graph.nodes:
        parts = str(getattr(node.target, "__name__", node.target)).split(".")
        if node.op != "call_function" or len(parts) < 2 or parts[0] != "aten" \
                or parts[1] not in _FILLS:
            continue
        qparams = (node.meta.get("output_qparams") or {}).get(0)
        val = node.meta.get("val")
        position = _FILLS[parts[1]]
        if qparams is None or not isinstance(val, torch.Tensor) or \
                qparams.dtype not in (torch.int8, torch.int16) or len(node.args) <= position:
            continue
        value = node.args[position]
        if not isinstance(value, (int, float)):
            continue
        quantized = quantize_scalar(value, qparams.scale, qparams.zp, qparams.qmin,
                                    qparams.qmax)
        float_fill = val.dtype.is_floating_point
        if quantized == value and not float_fill:
            continue
        args = list(node.args)
        args[position] = quantized
        node.args = tuple(args)
        what = f"with the float value {value:g}; fill value quantized to {quantized}"
        if float_fill:
            node.kwargs = {**node.kwargs, "dtype": qparams.dtype}
            node.meta["val"] = val.to(qparams.dtype)
            what = (f"its quantize folded away but its dtype left {val.dtype}: made "
                    f"{qparams.dtype}, {what}")
        fixes.append(Workaround(
            node.meta.get(ORIGIN_KEY, node.name), "FoldAndAnnotateQParamsPass (ExecuTorch 1.5.1)",
            f"{parts[1]} fills an int8 tensor (scale {float(qparams.scale):.6g}, zero point "
            f"{int(qparams.zp)}) {what}"))
    if fixes:
        program.graph_module.recompile()
    return fixes


# Portable kernels that give the same int8 codes as the op on real values when input and output
# share their quantization (data movement, selection, order): they may run on int8 codes.
_EXACT_ON_CODES = ("view_copy", "permute_copy", "squeeze_copy", "unsqueeze_copy", "cat",
                   "split_copy", "split_with_sizes_copy", "slice_copy", "select_copy", "clone",
                   "expand_copy", "_to_dim_order_copy", "_clone_dim_order", "max_pool2d",
                   "max_pool2d_with_indices", "amax", "amin", "max", "min", "argmax", "argmin",
                   "topk", "sort", "flip", "roll", "gather", "index_select", "pixel_shuffle",
                   "repeat", "unbind_copy")


def _float_only_on_cpu(node) -> bool:
    """An NPU-quantized op whose CPU kernel is a float portable one: no Cortex-M substitution
    and not exact on int8 codes."""
    name = _op_name(node.target).split(".")[-2] if "." in _op_name(node.target) else ""
    return (node.op == "call_function" and not has_cmsis_substitution(node.target)
            and name not in _EXACT_ON_CODES and not folds_into_its_producer(node))


def int16_activations(node) -> bool:
    """An op the quantizer gave int16 activations (A16W8): an int16 dequantize feeds it or an
    int16 quantize follows it."""
    def of(other, name: str, position: int) -> bool:
        text = str(other.target)
        return (other.op == "call_function" and name in text and len(other.args) > position
                and other.args[position] == torch.int16
                and (name == "dequantize" or "dequantize" not in text))

    return node.op == "call_function" and "quantize_per" not in str(node.target) and (
        any(of(a, "dequantize", 5) for a in node.all_input_nodes)
        or any(of(u, "quantize_per_tensor", 5) for u in node.users))




def route_to_cpu(edge_manager, cpu: str, legalize: bool = True, forced=()):
    """Run CortexMPassManager for `cpu` on the edge program (the manager is left as it was).

    Returns the transformed ExportedProgram, the per-node CMSIS-NN decisions and the upstream
    defects worked around on the way.

    When an upstream pass fails on a node (e.g. a kernel substitution that raises), that node is
    kept in float on its portable kernel, with its quantize and dequantize, and the passes run
    again on a fresh copy; the plan names the failure. (The attention block's second `bmm`, which
    ReplaceScalarWithTensorArgPass's retrace failed on, is lowered early instead:
    partitioners/early_batch_matmul.py.)

    `forced`: nodes a placement policy moved off the NPU. They carry the Ethos-U quantizer's
    mark, so upstream's FoldAndAnnotateQParamsPass would fold their quantize/dequantize into them
    even where only a float portable kernel exists (exp, sum, reciprocal: it would compute on
    int8 codes, which the device refuses or miscomputes); those are kept in float up front.
    """



    program = edge_manager.exported_program()
    stamp_origins(program.graph_module)
    kept_float: dict[str, str] = {}  # node name -> the upstream failure
    failures = 0  # pass-manager runs that failed (a failure's same-operand twins ride along)
    per_channel_refused: dict[str, str] = {}  # node name -> why its linear cannot be int8
    forced = set(forced)
    float_only = [n for n in program.graph_module.graph.nodes
                  if n.name in forced and _float_only_on_cpu(n)
                  and _keep_float(copy.deepcopy(program), n.name)]
    # Upstream would hand an int16 op to an int8-only cortex_m kernel (a forced int16 conv
    # became cortex_m::quantized_conv2d, which the runtime refused with error 0x12).
    wide = [n for n in program.graph_module.graph.nodes
            if n not in float_only and int16_activations(n)
            and _keep_float(copy.deepcopy(program), n.name)]
    float_only += wide
    while True:
        # The passes rewrite the graph in place before they fail: each attempt gets a copy.
        candidate = copy.deepcopy(program)
        for name in [*kept_float, *per_channel_refused, *(n.name for n in float_only)]:
            _keep_float(candidate, name)
        split = split_fused_activations(candidate, forced)
        as_conv = per_channel_linear_as_conv2d(candidate, skip=set(kept_float))
        try:
            with single_channel_convolutions_as_conv2d() as as_conv2d, \
                    cmsis_decisions_recorded() as decisions, \
                    per_channel_weights_legalized() as legalized:
                transformed = CortexMPassManager(
                    candidate, passes=with_early_batch_matmul(
                        with_narrowed_fusion(CortexMPassManager.legacy_pass_list)),
                    target_config=CortexMTargetConfig.from_target_string(cpu)
                ).transform()
            break
        except Exception as error:  # noqa: BLE001 - upstream pass failure: fall back per node
            name = _failed_node(error)
            if name is not None and not any(n.name == name
                                            for n in program.graph_module.graph.nodes):
                name = _failed_origin(error, name) or name
            if (name is None or name in kept_float or name in per_channel_refused
                    or failures >= MAX_FLOAT_FALLBACKS
                    or not _keep_float(copy.deepcopy(program), name)):
                raise
            failures += 1
            root = _root_error(error)
            if isinstance(root, upstream_cortex_m.PerChannelWeightScales):
                per_channel_refused[name] = str(root)
            else:
                kept_float[name] = _root_message(error)[:300]
                for twin_name in _same_operands(program, name):
                    if twin_name not in kept_float and _keep_float(copy.deepcopy(program),
                                                                    twin_name):
                        kept_float[twin_name] = (f"as {name}, the same op on the same operand "
                                                 f"shapes: {kept_float[name]}")[:300]
    decisions = dict(decisions)
    reassign_shared_origins(program.graph_module, transformed.graph_module)
    fallbacks = []
    for name, failure in kept_float.items():
        node = next(n for n in program.graph_module.graph.nodes if n.name == name)
        origin = node.meta.get(ORIGIN_KEY, name)
        decisions[origin] = CpuDecision(
            origin, _op_name(node.target), "upstream-failure",
            f"kept in float on the portable kernel: ExecuTorch's Cortex-M passes fail on this "
            f"node when it is quantized ({failure})", "CortexMPassManager")
        fallbacks.append(Workaround(
            origin, "ExecuTorch 1.5.1 CortexMPassManager (fails on this node)",
            f"{_op_name(node.target)} kept in float on the portable kernel, between its "
            f"dequantize and quantize, because the Cortex-M passes fail on it quantized: "
            f"{failure}"))
    for name, refusal in per_channel_refused.items():
        node = next(n for n in program.graph_module.graph.nodes if n.name == name)
        origin = node.meta.get(ORIGIN_KEY, name)
        decisions[origin] = CpuDecision(
            origin, _op_name(node.target), "per-channel-weights",
            f"kept in float on the portable kernel: {refusal}",
            "partitioners/upstream_cortex_m.py (per_channel_weights_legalized)")
        fallbacks.append(Workaround(
            origin, "ExecuTorch 1.5.1 cortex_m::quantized_linear (one requantization multiplier)",
            f"{_op_name(node.target)} kept in float on the portable kernel, between its "
            f"dequantize and quantize: {refusal}"))
    for node in wide:
        origin = node.meta.get(ORIGIN_KEY, node.name)
        decisions[origin] = CpuDecision(origin, _op_name(node.target), "int16",
                                        CATALOGUE["no-s16-operator"].template,
                                        "partitioners/cpu.py (int16_activations)")
    for node in s16_operators.rewrite(transformed):
        origin = node.meta.get(ORIGIN_KEY, node.name)
        decisions[origin] = CpuDecision(
            origin, decisions[origin].aten_op if origin in decisions else origin, "lowered",
            f"int16 on CMSIS-NN's {node.meta[s16_operators.S16_KEY]} (orchestrate:: s16 "
            "operator, kernels/s16)", "partitioners/s16_operators.py")
    wide_origins = {node.meta.get(ORIGIN_KEY, node.name) for node in wide}
    s16_operators.fold_fallback_weights(
        transformed, lambda node: node.meta.get(ORIGIN_KEY, node.name) in wide_origins)
    for node in float_only:
        if node in wide:
            continue
        fallbacks.append(Workaround(
            node.meta.get(ORIGIN_KEY, node.name),
            "ExecuTorch 1.5.1 FoldAndAnnotateQParamsPass (folds quantize/dequantize into an op "
            "that only a float portable kernel runs)",
            f"{_op_name(node.target)} (forced off the NPU, no CMSIS-NN kernel) kept in float on "
            "the portable kernel between its dequantize and quantize, so it computes on real "
            "values, not on int8 codes"))
    # `aot_arm_compiler.py` swaps only the Q/DQ nodes in its NPU path; the full pass manager is
    # what turns a rejected conv into a CMSIS-NN kernel instead of a float aten op.

    # Order matters: requantize first, so legalization's new int8 `.Scalar` nodes are not
    # requantized twice.
    for node in transformed.graph_module.graph.nodes:
        if EARLY_BMM_KEY in node.meta:
            fallbacks.append(Workaround(
                node.meta.get(ORIGIN_KEY, node.name),
                "ExecuTorch 1.5.1 ReplaceScalarWithTensorArgPass (its retrace fails on a bmm whose "
                "operands retrace to two dtypes)",
                f"aten.bmm lowered to {_op_name(node.target)} right after "
                f"FoldAndAnnotateQParamsPass by upstream's own substitution: its operands "
                f"retrace as {' and '.join(node.meta[EARLY_BMM_KEY])} (a folded linear's output "
                f"and a requantized value), which upstream's later retrace refuses"))
        if NARROWED_KEY in node.meta:
            activation, qmin, qmax = node.meta[NARROWED_KEY]
            fallbacks.append(Workaround(
                node.meta.get(ORIGIN_KEY, node.name),
                "ExecuTorch 1.5.1 ActivationFusionPass (declines bounds narrower than the "
                "quantization range)",
                f"{activation} fused into {_op_name(node.target)} with output bounds [{qmin}, "
                f"{qmax}]; upstream left the op computing on raw int8 values in float"))
    workarounds = (split + fallbacks + as_conv + legalized + as_conv2d
                   + requantize_comparison_scalars(transformed) + requantize_fill_values(transformed))
    if legalize:
        workarounds += legalize_for_device(transformed)
    return transformed, decisions, tuple(workarounds)
