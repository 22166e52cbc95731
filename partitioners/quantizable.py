"""Rewrites before CortexMQuantizer, so that what CMSIS-NN can run is annotated for int8.

On a CPU-only target, a recurrent layer reached the device in float: ExecuTorch 1.5.1's
`CortexMQuantizer` annotates linear, add, mul, sigmoid, tanh, ... but not `aten.gru.input` or
`aten.lstm.input`, which torch.export keeps as one node, so the whole recurrence was unrolled
later (in `to_edge`) as float ops on the portable kernels (gru_kws: 9,984 of 10,176 MACs). Three
rewrites, each reported in the plan as a `Workaround`, let the quantizer see the cell ops:

- `decompose_recurrences`: torch's own decompositions of the recurrent ops (torch._decomp) turn
  each layer into its per-step linear, sigmoid/tanh and elementwise ops before quantization.
- `fold_constant_state`: a zero initial state (`torch.zeros` inside nn.GRU/nn.LSTM when no state
  is passed) makes the first step compute `linear(zeros, W_hh, b_hh)`: a linear whose input is
  a float constant. Upstream's Cortex-M passes fuse it into `cortex_m::quantized_linear` reading
  that float constant, which the kernel refuses at run time ("input.scalar_type() 6 does not
  match dtype 1"). Every value computed only from tensor-creation ops and parameters is a
  constant: torchao's own ConstantFolder evaluates it (`h0 @ W_hh + b_hh` becomes `b_hh`), and
  the step starts from constants like any other operand.
- `explicit_rank_broadcast`: the decomposed cell adds a (1, 1, H) recurrent term to a (1, H)
  input term. The shapes differ only by a leading 1, yet CortexMQuantizer's add/mul check
  (`CortexMAddMulCheck`: operands of different shapes are refused unless it is a channel
  broadcast, since CMSIS-NN's elementwise kernels take equal shapes) leaves it unannotated, so
  every gate add stayed float between a dequantize and a quantize. When the operand has exactly
  the output's elements, a `view` to the output's shape makes the add elementwise, with the same
  values.

`tests/test_user_models.py` shows the upstream behaviour (the GRU node and the broadcasting add
left unannotated) and the result (every MAC of gru_kws and lstm_classifier on CMSIS-NN, every
value checked by the twin); docs/benchmarks.md has their QEMU instruction counts.
"""

from __future__ import annotations

import math
import operator

import torch
from torch._decomp import get_decompositions

from kernels.catalogue import transpose_conv_rows_dropped
from partitioners.records import Workaround, attribute_at, module_of

_RECURRENT_OPS = ("gru", "lstm", "rnn_tanh", "rnn_relu")
_ELEMENTWISE = ("add", "sub", "mul")
_UPSTREAM = "ExecuTorch 1.5.1 CortexMQuantizer"
# A folded value becomes flash constant bytes; a larger tensor-creation op stays a runtime op.
_FOLD_MAX_ELEMENTS = 16384


def _recurrent_ops() -> list:
    return [getattr(torch.ops.aten, name).input for name in _RECURRENT_OPS]


def _module_path(node) -> str:
    return module_of(node)[0] or node.name


def decompose_recurrences(program: torch.export.ExportedProgram
                          ) -> tuple[torch.export.ExportedProgram, list[Workaround]]:
    """The program with every GRU/LSTM/RNN layer decomposed into its cell ops."""
    ops = _recurrent_ops()
    layers = [n for n in program.graph.nodes if n.op == "call_function" and n.target in ops]
    if not layers:
        return program, []

    decomposed = program.run_decompositions(get_decompositions(ops))
    fixes = []
    for node in layers:
        kind = str(node.target).split(".")[1]
        fixes.append(Workaround(
            _module_path(node), _UPSTREAM,
            f"aten.{kind}.input decomposed into its per-step linear, activation and elementwise "
            "ops before quantization (torch's own decomposition), because the quantizer "
            "annotates those ops but not the recurrent node, which left the whole recurrence "
            "float on the portable kernels"))
    return decomposed, fixes


def _constant_rooted(graph: torch.fx.Graph) -> set:
    """Nodes whose value depends on a tensor-creation op (zeros, full, ...) and on nothing the
    caller passes in: computed from factories and parameters only."""
    rooted: set = set()
    variable: set = set()
    for node in graph.nodes:
        inputs = node.all_input_nodes
        if node.op == "placeholder" or any(i in variable for i in inputs):
            variable.add(node)
        elif node.op == "call_function" and (not inputs or any(i in rooted for i in inputs)):
            rooted.add(node)
    return rooted


def fold_constant_state(module: torch.fx.GraphModule) -> list[Workaround]:
    """Replace every value computed only from tensor-creation ops and parameters by its
    constant (in place); the rewrite's report."""
    rooted = _constant_rooted(module.graph)
    if not rooted:
        return []
    from torchao.quantization.pt2e.constant_fold import ConstantFolder, replace_node_with_constant  # lazy: heavy (torchao)

    with torch.utils._python_dispatch._disable_current_modes(), torch.no_grad():
        folder = ConstantFolder(module, skip_constructors=False)
        folder.run()
        folded = [(node, value) for node, value in folder.node_replacements.items()
                  if node in rooted and isinstance(value, torch.Tensor)
                  and value.numel() <= _FOLD_MAX_ELEMENTS]
        by_module: dict[str, list[str]] = {}
        for node, value in folded:
            if any(u.op == "call_function" and u not in rooted for u in node.users):
                by_module.setdefault(_module_path(node), []).append(
                    f"{node.name} {list(value.shape)}")
            replace_node_with_constant(module, node, value.detach().clone())
    fixes = [Workaround(path, _UPSTREAM,
                        f"{', '.join(names)} computed from constants only (a zero initial state "
                        "and parameters): folded into constants before quantization, so no "
                        "quantized kernel reads a float constant (cortex_m::quantized_linear "
                        "refuses one at run time)") for path, names in by_module.items()]
    module.graph.eliminate_dead_code()
    module.recompile()
    return fixes


def explicit_rank_broadcast(module: torch.fx.GraphModule) -> list[Workaround]:
    """View each add/sub/mul operand that has exactly the output's elements in another rank
    (a (1, H) plus a (1, 1, H)) to the output's shape (in place); the rewrite's report."""
    targets = {getattr(torch.ops.aten, name).Tensor for name in _ELEMENTWISE}
    viewed: dict[tuple, list[str]] = {}
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target not in targets:
            continue
        out = node.meta.get("val")
        if not isinstance(out, torch.Tensor):
            continue
        for operand in node.args[:2]:
            val = operand.meta.get("val") if isinstance(operand, torch.fx.Node) else None
            if (not isinstance(val, torch.Tensor) or tuple(val.shape) == tuple(out.shape)
                    or val.numel() != out.numel() or not val.is_contiguous()):
                continue
            with module.graph.inserting_before(node):
                view = module.graph.call_function(torch.ops.aten.view.default,
                                                  (operand, list(out.shape)))
            view.meta.update({k: v for k, v in operand.meta.items()
                              if k in ("nn_module_stack", "stack_trace", "source_fn_stack")})
            view.meta["val"] = val.view(tuple(out.shape))
            node.replace_input_with(operand, view)
            key = (_module_path(node), tuple(val.shape), tuple(out.shape))
            viewed.setdefault(key, []).append(node.name)
    fixes = [Workaround(path, _UPSTREAM,
                        f"{len(names)} elementwise op(s) ({', '.join(names[:3])}"
                        f"{', ...' if len(names) > 3 else ''}): an operand {list(shape)} viewed "
                        f"as {list(out)} (the same elements), because the quantizer's add/mul check "
                        "refuses operands of different shapes and left the op float")
             for (path, shape, out), names in viewed.items()]
    if fixes:
        module.recompile()
    return fixes


def transpose_conv_padding_cropped(module: torch.fx.GraphModule) -> list[Workaround]:
    """A transposed convolution whose height padding CMSIS-NN's row loop gets wrong
    (kernels/catalogue.py: transpose_conv_rows_dropped) computed with the padding rounded down
    to a multiple of the stride, and the rows that padding would have cropped sliced off (in
    place); the rewrite's report. The same values: a transposed convolution's padding only
    crops its full output, so cropping fewer rows and slicing the rest off is the same
    tensor, and the kernel then takes a geometry it computes right."""
    target = torch.ops.aten.conv_transpose2d.input
    fixes = []
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target != target:
            continue
        args = list(node.args) + [None] * (8 - len(node.args))
        source, out = args[0].meta.get("val"), node.meta.get("val")
        stride = _pair(args[3], 1)
        padding = _pair(args[4], 0)
        if not isinstance(source, torch.Tensor) or not isinstance(out, torch.Tensor) \
                or source.dim() != 4:
            continue
        why = transpose_conv_rows_dropped(int(source.shape[1]), stride, padding)
        if why is None:
            continue
        extra = padding[0] % stride[0]
        # conv_transpose2d.input(input, weight, bias=None, stride=1, padding=0, ...)
        new_args = (list(node.args) + [None, 1, 0][len(node.args) - 2:])[:max(5, len(node.args))]
        new_args[4] = [padding[0] - extra, padding[1]]
        node.args = tuple(new_args)
        node.meta["val"] = out.new_empty((out.shape[0], out.shape[1], out.shape[2] + 2 * extra,
                                          out.shape[3]))
        with module.graph.inserting_after(node):
            crop = module.graph.call_function(torch.ops.aten.slice.Tensor,
                                              (node, 2, extra, extra + out.shape[2]))
        crop.meta.update({k: v for k, v in node.meta.items()
                          if k in ("nn_module_stack", "stack_trace", "source_fn_stack")})
        crop.meta["val"] = out
        for user in list(node.users):
            if user is not crop:
                user.replace_input_with(node, crop)
        fixes.append(Workaround(
            _module_path(node), "CMSIS-NN arm_transpose_conv_s8 (rows of a padded first input "
            "row dropped)",
            f"{why}: computed with height padding {padding[0] - extra} and {extra} row(s) "
            f"sliced off each end, the same values"))
    if fixes:
        module.recompile()
    return fixes


def _grouped_transpose_convs(module: torch.fx.GraphModule):
    """(node, groups) of every transposed convolution of groups > 1 whose weight is a module
    attribute, in graph order (a list: the caller rewrites the graph)."""
    target = torch.ops.aten.conv_transpose2d.input
    found = []
    for node in module.graph.nodes:
        if node.op != "call_function" or node.target != target or len(node.args) < 7:
            continue
        weight = node.args[1]
        if int(node.args[6]) > 1 and isinstance(weight, torch.fx.Node) and \
                weight.op == "get_attr":
            found.append((node, int(node.args[6])))
    return found


def grouped_transpose_conv_split(module: torch.fx.GraphModule) -> list[Workaround]:
    """A transposed convolution of `groups` > 1 as one ungrouped transposed convolution per
    group, on its slice of the input channels, concatenated (in place); the rewrite's report.

    Upstream's Cortex-M pass turns a quantized grouped transposed convolution into
    `cortex_m::quantized_transpose_conv2d` without its groups (CMSIS-NN's transpose kernels
    have none): a (4, 4, 3, 3) weight of groups=2 became 4 output channels where the model has
    8, and verify ended in an internal error; CortexMQuantizer leaves it float instead (3,600
    MACs on the portable kernel). Ungrouped, each group is a transposed convolution every
    engine takes, with the same values (an NPU target: `grouped_transpose_conv_block_diagonal`,
    since EthosUQuantizer leaves the slices float)."""
    target = torch.ops.aten.conv_transpose2d.input
    fixes = []
    for node, groups in _grouped_transpose_convs(module):
        x, weight, bias = node.args[0], node.args[1], node.args[2]
        w = _attribute(module, weight.target)
        b = _attribute(module, bias.target) if isinstance(bias, torch.fx.Node) and \
            bias.op == "get_attr" else None
        if w is None or (bias is not None and b is None):
            continue
        cin_g, cout_g = w.shape[0] // groups, w.shape[1]
        outputs = []
        with module.graph.inserting_before(node):
            for g in range(groups):
                w_name = _new_attribute(module, f"{weight.target}_group{g}",
                                        w[g * cin_g:(g + 1) * cin_g].detach().clone())
                b_node = None
                if b is not None:
                    b_name = _new_attribute(module, f"{bias.target}_group{g}",
                                            b[g * cout_g:(g + 1) * cout_g].detach().clone())
                    b_node = module.graph.get_attr(b_name)
                part = module.graph.call_function(torch.ops.aten.slice.Tensor,
                                                  (x, 1, g * cin_g, (g + 1) * cin_g))
                conv = module.graph.call_function(
                    target, (part, module.graph.get_attr(w_name), b_node, *node.args[3:6], 1,
                             *node.args[7:]))
                for made in (part, conv):
                    made.meta.update({k: v for k, v in node.meta.items()
                                      if k in ("nn_module_stack", "stack_trace",
                                               "source_fn_stack")})
                outputs.append(conv)
            joined = module.graph.call_function(torch.ops.aten.cat.default, (outputs, 1))
        joined.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        node.replace_all_uses_with(joined)
        module.graph.erase_node(node)
        fixes.append(Workaround(
            _module_path(joined), "ExecuTorch 1.5.1 Cortex-M passes (transposed convolution "
            "groups dropped)",
            f"a transposed convolution of {groups} groups computed as {groups} ungrouped ones "
            f"on {cin_g} input channels each, concatenated: the same values"))
    if fixes:
        module.graph.eliminate_dead_code()
        module.recompile()
    return fixes


def grouped_transpose_conv_block_diagonal(module: torch.fx.GraphModule) -> list[Workaround]:
    """On an NPU target, a transposed convolution of `groups` > 1 as one ungrouped transposed
    convolution whose weight is the groups' weights on its block diagonal and zero elsewhere
    (in place); the rewrite's report.

    EthosUQuantizer quantizes a grouped transposed convolution's bias with per-channel scales
    taken along the weight's second dimension, the output channels of one group (4 where the
    bias of groups=2 has 8: an internal error at quantize), and what the NPU leaves of it
    reaches upstream's Cortex-M pass, which drops the groups. Slicing the input per group (the
    CPU-only rewrite) leaves the slices unquantized under EthosUQuantizer. Ungrouped with zero
    weights across groups, the same values come out (a zero weight quantizes to 0 exactly);
    the engines compute `groups` times the MACs."""
    fixes = []
    for node, groups in _grouped_transpose_convs(module):
        weight = node.args[1]
        w = _attribute(module, weight.target)
        if w is None:
            continue
        cin_g, cout_g = w.shape[0] // groups, w.shape[1]
        full = torch.zeros(w.shape[0], cout_g * groups, *w.shape[2:], dtype=w.dtype)
        for g in range(groups):
            full[g * cin_g:(g + 1) * cin_g, g * cout_g:(g + 1) * cout_g] = \
                w[g * cin_g:(g + 1) * cin_g].detach()
        name = _new_attribute(module, f"{weight.target}_ungrouped", full)
        with module.graph.inserting_before(node):
            ungrouped = module.graph.get_attr(name)
        ungrouped.meta.update(weight.meta)  # the quantizer reads the weight's value there
        if isinstance(weight.meta.get("val"), torch.Tensor):
            ungrouped.meta["val"] = weight.meta["val"].new_empty(full.shape)
        node.args = (node.args[0], ungrouped, *node.args[2:6], 1, *node.args[7:])
        fixes.append(Workaround(
            _module_path(node), "ExecuTorch 1.5.1 EthosUQuantizer (a grouped transposed "
            "convolution's bias quantized with one group's channel scales) and Cortex-M passes "
            "(its groups dropped)",
            f"a transposed convolution of {groups} groups computed as one ungrouped transposed "
            f"convolution with the groups' weights on the block diagonal: the same values, "
            f"{groups}x the MACs"))
    if fixes:
        module.graph.eliminate_dead_code()
        module.recompile()
    return fixes


def _attribute(module: torch.nn.Module, dotted: str):
    value = attribute_at(module, dotted)
    return value if isinstance(value, torch.Tensor) else None


def _new_attribute(module: torch.nn.Module, base: str, value: torch.Tensor) -> str:
    name = base.replace(".", "_")
    while hasattr(module, name):
        name += "_"
    module.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
    return name


def _spatial(value, default: int, rank: int) -> list[int]:
    """A convolution's stride/padding/dilation argument as one int per spatial dimension."""
    if value is None:
        return [default] * rank
    if isinstance(value, int):
        return [value] * rank
    value = [int(v) for v in value]
    return value * rank if len(value) == 1 else value


def _pair(value, default: int) -> tuple[int, int]:
    return tuple(_spatial(value, default, 2))


_HARDSWISH_PRODUCERS = ("conv", "linear", "batch_norm")  # DecomposeHardswishPass's fused inputs


def _batchnorm_producer(node) -> tuple[torch.fx.Node, torch.fx.Node | None] | None:
    """The layer a BatchNorm `node` (eval) can fold into, and the squeeze between them: a
    linear with a 2-D output, or a 2-D convolution squeezed back to 3-D (a Conv1d as
    module_forms.conv1d_as_conv2d computes it); each read by nothing else."""
    source = node.args[0]
    if not (isinstance(source, torch.fx.Node) and source.op == "call_function"
            and len(source.users) == 1) or bool(node.args[5]):
        return None
    if source.target == torch.ops.aten.linear.default:
        value = source.meta.get("val")
        return (source, None) if isinstance(value, torch.Tensor) and value.dim() == 2 else None
    if source.target in (torch.ops.aten.squeeze.dim, torch.ops.aten.squeeze.dims):
        conv = source.args[0]
        value = source.meta.get("val")
        if (isinstance(conv, torch.fx.Node) and conv.op == "call_function"
                and conv.target == torch.ops.aten.conv2d.default and len(conv.users) == 1
                and isinstance(value, torch.Tensor) and value.dim() == 3):
            return conv, source
    return None


def linear_batchnorm_folded(module: torch.fx.GraphModule) -> list[Workaround]:
    """A BatchNorm1d (eval) over a linear's 2-D output, or over a Conv1d's output that is not
    in the same Sequential (a BatchNorm called in `forward`), folded into the layer's weight and
    bias (in place); the rewrite's report.

    The quantizers fold a BatchNorm into the convolution right before it, not into a linear:
    under EthosUQuantizer the Arm backend's lowering then met the float constant its own fold
    left (`TOSA-1.0+INT ... doesn't support tensor ... fused_const, dtype=FP32`: the partition
    left the NPU) and on the CPU the linear ran as a float addmm on int8 activations, which the
    runtime refuses. A Conv1d compiled CPU-only is a 1xK Conv2d whose output is squeezed back
    (module_forms.conv1d_as_conv2d, which keeps a BatchNorm1d of the same Sequential in the 2-D
    form): the squeeze between them hid the pair from the fold, so the norm stayed a float
    portable op between a dequantize and a quantize, and a 1-D ResNet's quantization failed in
    upstream code (`_native_batch_norm_legit_no_training is not differentiable with respect to
    argument 'running_mean'`). Folded, it is one layer with the same values (eval statistics
    are constants): W' = W * g / sqrt(var + eps) per output channel, b' = (b - mean) * g /
    sqrt(var + eps) + beta."""
    fixes = []
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target != torch.ops.aten.batch_norm.default:
            continue
        found = _batchnorm_producer(node)
        if found is None:
            continue
        layer, squeeze = found
        params = [_attribute(module, a.target) if isinstance(a, torch.fx.Node) and
                  a.op == "get_attr" else None for a in (layer.args[1], *node.args[1:5])]
        bias_node = layer.args[2] if len(layer.args) > 2 else None
        bias = (_attribute(module, bias_node.target) if isinstance(bias_node, torch.fx.Node)
                and bias_node.op == "get_attr" else None)
        weight, gamma, beta, mean, var = params
        if weight is None or mean is None or var is None or (bias_node is not None and
                                                              bias is None):
            continue
        with torch.no_grad():
            scale = (gamma if gamma is not None else torch.ones_like(mean)) / torch.sqrt(
                var + float(node.args[7]))
            folded_weight = weight.detach() * scale.reshape(-1, *[1] * (weight.dim() - 1))
            folded_bias = ((bias.detach() if bias is not None else torch.zeros_like(mean))
                           - mean) * scale + (beta if beta is not None else 0)
        weight_name = _new_attribute(module, f"{layer.args[1].target}_bn_folded", folded_weight)
        bias_name = _new_attribute(module, f"{layer.args[1].target}_bn_folded_bias",
                                   folded_bias.detach().clone())
        with module.graph.inserting_before(layer):
            new_weight = module.graph.get_attr(weight_name)
            new_bias = module.graph.get_attr(bias_name)
        for made, tensor in ((new_weight, folded_weight), (new_bias, folded_bias)):
            old = layer.args[1].meta.get("val")
            if isinstance(old, torch.Tensor):  # the quantizer reads the weight's value there
                made.meta["val"] = old.new_empty(tensor.shape)
        layer.args = (layer.args[0], new_weight, new_bias, *layer.args[3:])
        node.replace_all_uses_with(squeeze if squeeze is not None else layer)
        module.graph.erase_node(node)
        fixes.append(Workaround(
            _module_path(layer), "ExecuTorch 1.5.1 quantizers (a BatchNorm folds into the "
            "convolution right before it, not into a linear, nor through the squeeze of a "
            "Conv1d computed as a 1xK Conv2d)",
            f"a BatchNorm1d after a {'Conv1d' if squeeze is not None else 'linear'} folded into "
            "its weight and bias (eval statistics): one layer with the same values"))
    if fixes:
        module.graph.eliminate_dead_code()
        module.recompile()
    return fixes


def hardswish_as_elementwise(module: torch.fx.GraphModule,
                             int16_modules: tuple[str, ...] = ()) -> list[Workaround]:
    """A hardswish whose input is not a convolution or linear (after a mean, a residual add), or
    that is inside one of `int16_modules` (--precision a16w8), as `x * hardtanh(x + 3, 0, 6) / 6`
    (in place); the rewrite's report.

    ExecuTorch 1.5.1's Cortex-M quantizer annotates every hardswish, but its
    DecomposeHardswishPass lowers only one fused after a convolution or linear; any other stays
    an int8 `aten::hardswish`, for which no kernel library of the device runtime has a kernel,
    so the program does not load. The elementwise form is the same function and each of its ops
    has a kernel. An int16 one is never lowered (the pass is int8), and its float fallback would
    be the same missing `aten::hardswish` (a CPU-only transposed decoder with its encoder raised
    was refused: "the program needs aten::hardswish.out")."""
    from torchao.quantization.pt2e.quantizer.utils import (  # lazy: heavy (torchao)
        get_module_name_filter)

    in_int16 = [get_module_name_filter(name) for name in int16_modules]
    fixes = []
    targets = (torch.ops.aten.hardswish.default, torch.ops.aten.hardswish_.default)
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target not in targets:
            continue
        source = node.args[0]
        producer = str(getattr(source, "target", ""))
        if isinstance(source, torch.fx.Node) and any(p in producer for p in _HARDSWISH_PRODUCERS) \
                and len(source.users) == 1 and not any(inside(node) for inside in in_int16):
            continue  # the Cortex-M passes lower it with the op before it
        graph = module.graph
        with graph.inserting_before(node):
            shifted = graph.call_function(torch.ops.aten.add.Tensor, (source, 3.0))
            gate = graph.call_function(torch.ops.aten.hardtanh.default, (shifted, 0.0, 6.0))
            product = graph.call_function(torch.ops.aten.mul.Tensor, (source, gate))
            result = graph.call_function(torch.ops.aten.div.Tensor, (product, 6.0))
        val = node.meta.get("val")
        for new in (shifted, gate, product, result):
            new.meta.update({k: v for k, v in node.meta.items()
                             if k in ("nn_module_stack", "stack_trace", "source_fn_stack")})
            if isinstance(val, torch.Tensor):
                new.meta["val"] = val
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        fixes.append(Workaround(
            _module_path(result), _UPSTREAM,
            f"hardswish after {producer.split('.')[-2] if '.' in producer else producer or 'an input'} "
            "computed as x * hardtanh(x + 3, 0, 6) / 6: the Cortex-M passes lower only a "
            "hardswish fused after a convolution or linear, and no device kernel library has "
            "an int8 hardswish"))
    if fixes:
        module.recompile()
    return fixes


def int16_hardsigmoid_as_elementwise(module: torch.fx.GraphModule,
                                     int16_modules: tuple[str, ...]) -> list[Workaround]:
    """A hardsigmoid inside one of `int16_modules` (--precision a16w8) as
    `hardtanh(x + 3, 0, 6) / 6` (in place); the rewrite's report.

    An int8 hardsigmoid folds into the convolution or linear before it on CMSIS-NN; an int16 one
    runs in float on its portable kernel, and no kernel library of the device runtime has
    `aten::hardsigmoid` (a CPU-only MobileNetV3 block raised was refused at load: "the program
    needs aten::hardsigmoid.out"). The elementwise form is the same function and each of its
    ops has a kernel."""
    from torchao.quantization.pt2e.quantizer.utils import (  # lazy: heavy (torchao)
        get_module_name_filter)

    in_int16 = [get_module_name_filter(name) for name in int16_modules]
    fixes = []
    targets = (torch.ops.aten.hardsigmoid.default, torch.ops.aten.hardsigmoid_.default)
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target not in targets or not any(
                inside(node) for inside in in_int16):
            continue
        graph = module.graph
        with graph.inserting_before(node):
            shifted = graph.call_function(torch.ops.aten.add.Tensor, (node.args[0], 3.0))
            gate = graph.call_function(torch.ops.aten.hardtanh.default, (shifted, 0.0, 6.0))
            result = graph.call_function(torch.ops.aten.div.Tensor, (gate, 6.0))
        for new in (shifted, gate, result):
            new.meta.update({k: v for k, v in node.meta.items()
                             if k in ("nn_module_stack", "stack_trace", "source_fn_stack", "val")})
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        fixes.append(Workaround(
            _module_path(result), "no device kernel library has aten::hardsigmoid",
            "int16 hardsigmoid computed as hardtanh(x + 3, 0, 6) / 6 on portable kernels in "
            "float (--precision a16w8): an int8 one folds into the CMSIS-NN kernel before it, "
            "an int16 one has no kernel of its own on the device"))
    if fixes:
        module.recompile()
    return fixes



_SQUEEZES = ("squeeze.dim", "squeeze.dims", "squeeze.default")
_ELEMENTWISE_ACTIVATIONS = ("relu.default", "relu_.default", "hardtanh.default",
                            "hardtanh_.default", "clamp.default", "relu6.default")


def _aten_name(node) -> str:
    return str(node.target).removeprefix("aten.") if node.op == "call_function" else ""


def activations_before_squeeze(module: torch.fx.GraphModule) -> list[Workaround]:
    """An activation applied to a squeezed convolution output (`torch.relu(conv1d(x))`, once
    module_forms.conv1d_as_conv2d has made the Conv1d a 1xK Conv2d and squeezed its output back)
    applied before the squeeze instead (in place); the rewrite's report.

    Upstream's Cortex-M activation fusion folds a ReLU into the CMSIS-NN convolution's output
    clamp only when the ReLU reads the convolution itself; with the squeeze between them the
    ReLU stayed an op of its own (an outside model's Conv1d + functional ReLU, CPU-only M55:
    158,779 QEMU instructions, against 111,123 for the same layers in an nn.Sequential, whose
    ReLU the Conv1d rewrite keeps next to the convolution). An elementwise activation commutes
    with a squeeze, so the values are the same."""
    fixes = []
    for node in list(module.graph.nodes):
        if not any(_aten_name(node) == name for name in _ELEMENTWISE_ACTIVATIONS):
            continue
        squeeze = node.args[0]
        if not isinstance(squeeze, torch.fx.Node) or \
                not any(_aten_name(squeeze) == name for name in _SQUEEZES) or \
                len(squeeze.users) != 1:
            continue
        source = squeeze.args[0]
        if not isinstance(source, torch.fx.Node) or "conv" not in _aten_name(source):
            continue
        graph = module.graph
        with graph.inserting_before(squeeze):
            activated = graph.call_function(node.target, (source, *node.args[1:]), node.kwargs)
        activated.meta.update({k: v for k, v in node.meta.items()
                               if k in ("nn_module_stack", "stack_trace", "source_fn_stack")})
        if isinstance(source.meta.get("val"), torch.Tensor):
            activated.meta["val"] = source.meta["val"]
        squeeze.replace_input_with(source, activated)
        node.replace_all_uses_with(squeeze)
        graph.erase_node(node)
        fixes.append(Workaround(
            _module_path(squeeze), "ExecuTorch 1.5.1 Cortex-M activation fusion (folds an "
            "activation that reads a convolution, not one that reads its squeezed output)",
            f"{_aten_name(activated).split('.')[0]} applied before the squeeze of the 1-D "
            "convolution's output, so it folds into the CMSIS-NN convolution's clamp (the "
            "same values: an elementwise activation commutes with a squeeze)"))
    if fixes:
        module.recompile()
    return fixes


def strided_conv_padding_explicit(module: torch.fx.GraphModule) -> list[Workaround]:
    """On an Ethos-U85 target, a 1-D or 2-D convolution with a stride above 3, padding, and an
    input that does not divide into its strides computed as: the input cropped to the rows and
    columns the convolution reads, padded explicitly (`constant_pad_nd` with 0.0, the input's
    zero point once quantized, as the convolution's own padding), and the convolution unpadded
    (in place); the rewrite's report. The same values.

    ExecuTorch's Arm backend meets TOSA's exact-size rule for such a convolution by slicing the
    input to the rows it reads; Vela 5.1 for the U85 decomposes a stride above 3 into one
    accumulating 1x1 convolution per kernel tap (regor's DecomposeConv2D), folds that SLICE
    into the taps' reads and loses the padding with it: every tap reads row
    stride*i + tap with zero padding registers, where the TOSA graph reads stride*i + tap -
    padding. Executed by our Ethos-U85 model (npu_driver/ethos_u/u85_machine.py) the command
    stream gives the unpadded convolution over the uncropped input, 729-1,544 bytes of 1-2 kB
    off the TOSA reference model's, for 4x4/4 pad 1 (32x32, 33x33, 32x30), 5x5/4 pad 2,
    5x5/5 pad 1, (4,3)/(4,1) pad (1,1) or (0,1), and a Conv1d 4/4 pad 1 on 64 (188 of 256
    bytes). Stride 3 or less, or an input that divides, or no padding, compiles right and is left alone; so is the explicit form, which
    Vela lowers with a separate pad (a MemoryCopy) and, for the mixed model's convolution, 64
    1x1 convolutions where the miscompiled form had 16: Vela estimates it at 36,220 NPU cycles
    against 8,704 on U85-256 (padding the input's end instead and cropping the output is
    estimated at 24,749 and not done). `tests/test_u85_machine.py` shows both."""
    fixes = []
    convolutions = {torch.ops.aten.conv1d.default: 1, torch.ops.aten.conv2d.default: 2}
    for node in list(module.graph.nodes):
        rank = convolutions.get(node.target) if node.op == "call_function" else None
        if rank is None:
            continue
        # conv{1,2}d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)
        args = list(node.args) + [None] * (7 - len(node.args))
        for index, name in enumerate(("bias", "stride", "padding", "dilation", "groups"), 2):
            if name in node.kwargs:
                args[index] = node.kwargs[name]
        source, weight = args[0], args[1]
        value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        w = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dim() != rank + 2 or \
                not isinstance(w, torch.Tensor) or isinstance(args[4], str):
            continue
        stride, padding, dilation = (_spatial(args[i], default, rank)
                                     for i, default in ((3, 1), (4, 0), (5, 1)))
        if max(stride) <= 3 or max(padding) == 0:
            continue
        sizes = [int(value.shape[2 + i]) for i in range(rank)]
        kernels = [dilation[i] * (int(w.shape[2 + i]) - 1) + 1 for i in range(rank)]
        if all((sizes[i] + 2 * padding[i] - kernels[i]) % stride[i] == 0 for i in range(rank)):
            continue
        # the padded extent the convolution reads, and the input rows/columns inside it
        read = [((sizes[i] + 2 * padding[i] - kernels[i]) // stride[i]) * stride[i] + kernels[i]
                for i in range(rank)]
        used = [min(sizes[i], read[i] - padding[i]) for i in range(rank)]
        after = [read[i] - padding[i] - used[i] for i in range(rank)]
        cropped = source
        meta = {k: v for k, v in node.meta.items()
                if k in ("nn_module_stack", "stack_trace", "source_fn_stack")}
        shape = list(value.shape)
        with module.graph.inserting_before(node):
            for i in range(rank):
                if used[i] < sizes[i]:
                    cropped = module.graph.call_function(torch.ops.aten.slice.Tensor,
                                                         (cropped, 2 + i, 0, used[i]))
                    shape[2 + i] = used[i]
                    cropped.meta.update(meta)
                    cropped.meta["val"] = value.new_empty(shape)
            # constant_pad_nd takes (before, after) pairs from the last dimension back
            pads = [p for i in reversed(range(rank)) for p in (padding[i], after[i])]
            padded = module.graph.call_function(torch.ops.aten.constant_pad_nd.default,
                                                (cropped, pads, 0.0))
        padded.meta.update(meta)
        padded.meta["val"] = value.new_empty((*value.shape[:2], *read))
        node.args = (padded, weight, args[2], list(stride), [0] * rank, list(dilation),
                     args[6] if args[6] is not None else 1)
        node.kwargs = {}
        x = "x"
        fixes.append(Workaround(
            _module_path(node), "Vela 5.1 for the Ethos-U85 (regor's DecomposeConv2D of a "
            "stride above 3 drops the padding with the input slice it folds)",
            f"a {x.join(map(str, kernels))} convolution of stride {x.join(map(str, stride))} "
            f"and padding {x.join(map(str, padding))} on a {x.join(map(str, sizes))} input "
            f"computed unpadded on the input cropped to {x.join(map(str, used))} and padded "
            f"explicitly to {x.join(map(str, read))}: the same values; the explicit pad and the "
            f"unpadded convolution cost more NPU cycles (the plan's Vela estimate includes "
            f"them)"))
    if fixes:
        module.recompile()
    return fixes


def heads_selected_before_permute(module: torch.fx.GraphModule,
                                  npu: str = "ethos-u85") -> list[Workaround]:
    """On an Ethos-U target, each of q, k and v of `qkv.reshape(B, N, 3, H, D).permute(2, 0,
    3, 1, 4).unbind(0)` (timm's and torchvision's attention) taken before the permute, as
    `qkv.view(B, N, 3, H * D).select(2, i).view(B, N, H, D).permute(0, 2, 1, 3)`: the same
    values (in place); the rewrite's report.

    After the permute, each of the three is a TOSA SLICE of extent 1 on the leading axis. Vela
    5.1 for the U85 folds that SLICE into the next elementwise op's IFM (the MUL scaling q and
    k) and splits the op per batch, taking the extent-1 axis for a broadcast (regor's
    DecomposeLeadingDimensions: "Don't offset broadcasted axis"): every batch reads batch 0's
    q. Selected before the permute, the slice keeps the batch's extent and Vela steps it
    (`tests/test_u85_machine.py` shows both streams against the TOSA graph). For the U55 and
    U65 the same form is what Vela 5.1 compiles: in upstream's form it dies with SIGSEGV in
    its native compiler on MobileViT-XXS's one partition (compile moved all 1,525 ops to the
    CPU: 182.0 M instructions per inference on QEMU's M55), in this form that partition
    compiles (100% of the MACs on the NPU, 43,688 CPU instructions) and verifies; measured by
    benchmarks/public_models.py, too large for the suite. The select is made
    on the axes after it merged into one: ExecuTorch 1.5.1's Arm backend lowers a `select` on
    the middle of five axes, feeding `scaled_dot_product_attention`'s second matmul, as a
    contiguous SLICE of the batch and that axis merged, which takes the wrong rows when the
    batch is above 1 (v of 4 batches: 161 steps off the quantized reference on U55 and U85
    alike)."""
    aten = torch.ops.aten
    selects = (aten.select.int, aten.unbind.int)
    fixes = []
    for permute in list(module.graph.nodes):
        if permute.op != "call_function" or permute.target != aten.permute.default:
            continue
        source = permute.args[0]
        value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dim() != 5:  # (B, N, 3, H, D) only
            continue
        dims = [d % value.dim() for d in permute.args[1]]
        users = list(permute.users)
        if dims[0] == 0 or not users or not all(
                u.op == "call_function" and u.target in selects
                and (u.args[1] if len(u.args) > 1 else u.kwargs.get("dim", 0)) % len(dims) == 0
                for u in users):
            continue
        axis = dims[0]
        rest = [d - (d > axis) for d in dims[1:]]  # the other axes' order once `axis` is gone
        taken = []  # (node to replace, index along `axis`)
        for user in users:
            if user.target == aten.select.int:
                taken.append((user, user.args[2]))
            else:
                getitems = list(user.users)
                if not all(g.op == "call_function" and g.target is operator.getitem
                           for g in getitems):
                    break
                taken += [(g, g.args[1]) for g in getitems]
        else:
            shape = [int(n) for n in value.shape]
            merged = shape[:axis + 1] + [math.prod(shape[axis + 1:])]
            for node, index in taken:
                meta = {k: v for k, v in node.meta.items()
                        if k in ("nn_module_stack", "stack_trace", "source_fn_stack")}
                steps = ((aten.view.default, (merged,)), (aten.select.int, (axis, index)),
                         (aten.view.default, (shape[:axis] + shape[axis + 1:],)),
                         (aten.permute.default, (rest,)))
                moved, val = source, value
                with module.graph.inserting_before(node):
                    for target, args in steps:
                        moved = module.graph.call_function(target, (moved, *args))
                        moved.meta.update(meta)
                        val = target(val, *args)
                        moved.meta["val"] = val
                node.replace_all_uses_with(moved)
            for node in [*(n for n, _ in taken), *users, permute]:
                if not node.users:
                    module.graph.erase_node(node)
            fixes.append(Workaround(
                _module_path(permute), "Vela 5.1 for the Ethos-U85 (regor's "
                "DecomposeLeadingDimensions takes a folded SLICE's extent-1 leading axis for a "
                "broadcast and never steps it)" if npu.startswith("ethos-u85") else
                "Vela 5.1 (its native compiler dies with SIGSEGV on an attention in this form: "
                "MobileViT-XXS on the U55)",
                f"the {len(taken)} slices of a permute({dims}) taken along axis {axis} before "
                f"it, each then permuted by {rest}: the same values"))
    if fixes:
        module.graph.lint()
        module.recompile()
    return fixes


def legalized(module: torch.fx.GraphModule, npu: str | None, raised) -> list[Workaround]:
    """Every rewrite above the quantizer of `npu` (None: CPU-only) needs, in the order they
    apply; `raised` holds the modules given int16 activations."""
    fixes: list[Workaround] = []
    # first: an activation after a folded norm then follows the squeezed convolution itself
    fixes += linear_batchnorm_folded(module)
    if not npu:
        fixes += fold_constant_state(module)
        fixes += explicit_rank_broadcast(module)
        fixes += hardswish_as_elementwise(module, raised)
        fixes += int16_hardsigmoid_as_elementwise(module, raised)
        fixes += activations_before_squeeze(module)
        fixes += transpose_conv_padding_cropped(module)
    fixes += (grouped_transpose_conv_block_diagonal(module) if npu
              else grouped_transpose_conv_split(module))
    if npu and npu.startswith("ethos-u85"):
        fixes += strided_conv_padding_explicit(module)
    if npu:
        fixes += heads_selected_before_permute(module, npu)
    return fixes
