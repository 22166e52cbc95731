"""A full-integer model file's own quantization, kept: every observer upstream's quantizer placed
is pinned to the scale and zero point the file gives the tensor it observes.

Upstream decides where the program quantizes (EthosUQuantizer or CortexMQuantizer, which ops are
fused, which share a range); the file decides the values. Observers are matched to the file's
tensors through the module the importer built (orchestrator/sources/tflite_module.py): a
placeholder is a graph input, a `get_attr` is a weight, bias or constant whose TFLite tensor the
module records, and a computed node carries the `op<index>` submodule it came from in its
`nn_module_stack`. Within one operator's submodule the last observed node is the operator's output
tensor; an observed node before it (the pad of an uneven SAME convolution, the steps upstream
decomposes a softmax into) keeps its input's range when it only moves values (pad, views,
max pooling) and its calibrated range otherwise, and the result lists those.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch
from executorch.backends.arm.common.annotation_meta import ArmAnnotationInfo
from executorch.backends.cortex_m.quantizer.quantization_configs import (
    INT8_ACTIVATION_PER_TENSOR_QSPEC, SOFTMAX_OUTPUT_FIXED_QSPEC, SOFTMAX_TARGETS)
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.observer import ObserverBase
from torchao.quantization.pt2e.quantizer import (QuantizationAnnotation, Quantizer,
                                                 SharedQuantizationSpec)

from orchestrator.errors import UserError
from partitioners.records import Workaround

WORKAROUND_NODE = "(model file)"  # the Workaround node of a quantization kept from a .tflite
ONNX_WORKAROUND_NODE = "(ONNX file)"  # ... from a QDQ .onnx
_SCOPE = re.compile(r"^op(\d+)(?:\.|$)")
# Ops that move values without computing new ones: their output has their input's range.
_SAME_RANGE = ("pad", "constant_pad_nd", "view", "reshape", "permute", "clone", "squeeze",
               "unsqueeze", "max_pool2d", "cat", "slice", "select", "expand", "_to_copy",
               "flatten", "hardtanh", "relu", "contiguous", "transpose")


@dataclass(frozen=True)
class PinnedQuantization:
    """What the pinning did: observers set from the file, and those left to calibration."""

    pinned: int
    kept_input_range: tuple[str, ...]  # nodes inside an operator given their input's range
    calibrated: tuple[str, ...]  # "node (TFLite op)" whose range came from calibration
    kind: str = "tflite"  # the file's format (FileQuantization.kind)
    # weights the file quantizes per channel where the kernel takes one scale (an ONNX Gemm's
    # on CMSIS-NN): quantized per tensor from the file's dequantized values
    requantized: tuple[str, ...] = ()

    def note(self) -> str:
        text = f"quantization from the file: {self.pinned} quantization points pinned to its scales"
        if self.calibrated:
            text += (f"; {len(self.calibrated)} inside an operator the file does not quantize "
                     f"(calibrated): {', '.join(self.calibrated[:6])}"
                     + (" ..." if len(self.calibrated) > 6 else ""))
        if self.requantized:
            text += (f"; {len(self.requantized)} kept as the kernel needs them (a weight the "
                     f"file quantizes per channel quantized per tensor, a fixed output range): "
                     f"{', '.join(self.requantized)}")
        return text

    def workaround(self) -> Workaround:
        """The pinning as the compile's record of a rewrite (its node: WORKAROUND_NODE for a
        .tflite, whose program also rounds as TFLM does; ONNX_WORKAROUND_NODE for a QDQ .onnx)."""
        return Workaround(WORKAROUND_NODE if self.kind == "tflite" else ONNX_WORKAROUND_NODE,
                          "the model file's own quantization", self.note())


def operator_of(node: Node) -> int | None:
    """The index of the TFLite operator whose `op<index>` submodule made this node, if any."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, _ in reversed(list(stack.values())):
        match = _SCOPE.match(str(path).removeprefix("L['self'].").removeprefix("L__self__."))
        if match:
            return int(match.group(1))
    return None


def _observers(prepared: GraphModule, modules: dict) -> list[tuple[Node, object]]:
    found = []
    for node in prepared.graph.nodes:
        if node.op == "call_module" and isinstance(modules.get(node.target), ObserverBase):
            found.append((node, modules[node.target]))
    return found


def _op_name(node: Node) -> str:
    return str(getattr(node.target, "__name__", node.target)).split(".")[0]


def _constant_attribute(observed: Node) -> str | None:
    """The importer's attribute name (`op3.weight`, `op5.constant1`) of a constant, from the
    operator that reads it: capture renames parameters (`_param_constant0`), the reader keeps
    its scope and the argument position."""
    for user in observed.users:
        while user.op == "call_module" and user.users and str(user.target).startswith(
                "activation_post_process"):
            user = next(iter(user.users))
        scope = operator_of(user) if user.op == "call_function" else None
        if scope is None:
            continue
        reached = [i for i, arg in enumerate(user.args) if _source(arg) is observed]
        if not reached:
            continue
        name = _op_name(user)
        if any(name.startswith(k) for k in ("conv", "linear", "addmm", "mm")):
            return f"op{scope}." + {1: "weight", 2: "bias"}.get(reached[0], "?")
        return f"op{scope}.constant{reached[0]}"
    return None


def _source(arg):
    """What an argument reads, looking through observers."""
    while isinstance(arg, Node) and arg.op == "call_module" and \
            str(arg.target).startswith("activation_post_process"):
        arg = arg.args[0]
    return arg


def pin(prepared: GraphModule, quantization) -> PinnedQuantization:
    """Pin every observer of `prepared` that observes a tensor the file quantizes."""
    modules = dict(prepared.named_modules())
    observers = _observers(prepared, modules)
    placeholders = [n for n in prepared.graph.nodes if n.op == "placeholder"]
    # The last observed node of each operator's scope is its output.
    last_in_scope: dict[int, Node] = {}
    for node, _ in observers:
        observed = _source(node.args[0])
        scope = operator_of(observed) if observed.op == "call_function" else None
        if scope is not None:
            last_in_scope[scope] = observed
    tensor_of: dict[Node, int] = {}
    pinned, kept, calibrated, requantized = 0, [], [], []
    for position, node in enumerate(placeholders):
        if position < len(quantization.graph_inputs):
            tensor_of[node] = quantization.graph_inputs[position]
            if tensor_of[node] not in quantization.by_tensor:
                # An input the file quantizes only after a reshape (a QDQ .onnx): the range
                # of that reshape, which the quantizer shares with the input.
                users = [u for o in node.users for u in (o.users if o.op == "call_module"
                                                         else [o])]
                for user in users:
                    scope = operator_of(user) if user.op == "call_function" else None
                    if scope is not None and any(_op_name(user).startswith(name)
                                                 for name in _SAME_RANGE) and \
                            quantization.operator_outputs.get(scope) in quantization.by_tensor:
                        tensor_of[node] = quantization.operator_outputs[scope]
                        kept.append(f"{node.name} (given {user.name}'s range)")
                        break
    biases, used = [], set()

    def tensor_for(observed: Node) -> int | None:
        if observed in tensor_of:
            return tensor_of[observed]
        found = None
        if observed.op == "get_attr":
            attribute = _constant_attribute(observed)
            found = quantization.by_attribute.get(attribute) if attribute else None
        elif observed.op == "call_function":
            scope = operator_of(observed)
            if scope is not None and last_in_scope.get(scope) is observed:
                found = quantization.operator_outputs.get(scope)
            elif any(_op_name(observed).startswith(name) for name in _SAME_RANGE) and \
                    observed.args and isinstance(observed.args[0], Node):
                found = tensor_for(observed.args[0])
                if found is not None:
                    kept.append(observed.name)
        tensor_of[observed] = found
        return found

    for node, observer in observers:
        observed = _source(node.args[0])
        tensor = tensor_for(observed)
        used.add(tensor)
        entry = quantization.by_tensor.get(tensor) if tensor is not None else None
        if entry is None:
            scope = operator_of(observed)
            where = quantization.operator_names.get(scope, "?") if scope is not None else "-"
            calibrated.append(f"{observed.name} ({where})")
            continue
        if "FixedQParams" in type(observer).__name__:
            # a range the kernel fixes (CMSIS-NN's softmax output, 1/256 and -128: a .tflite's
            # own; a QDQ .onnx's 1/255 would put the softmax back on the float kernel)
            if _differs(observer, entry):
                requantized.append(f"{observed.name} (tensor {entry.tensor} '{entry.name}': "
                                   "the kernel's fixed range)")
            continue
        if entry.dtype == "int32" and quantization.kind != "tflite":
            # a .tflite's bias scale is its input scale x weight scale, bit for bit as TFLM
            # reads it; a QDQ .onnx's is that product for its own input scale
            biases.append((node, observer, observed))
            continue
        if not _set(observer, entry, observed):
            requantized.append(f"{observed.name} (tensor {entry.tensor} '{entry.name}')")
            continue
        pinned += 1
    pinned += sum(_pin_bias(modules, *bias) for bias in biases)
    if quantization.kind != "tflite":  # a .tflite's value-moving operators keep their input's
        # range by TFLite's rules; a QDQ .onnx may give them their own, which upstream shares
        requantized += [f"{quantization.operator_names[op]} (node {op}): its input's range, "
                        "which upstream's quantizer shares with it"
                        for op, tensor in sorted(quantization.operator_outputs.items())
                        if tensor in quantization.by_tensor and tensor not in used]
    return PinnedQuantization(pinned, tuple(dict.fromkeys(kept)),
                              tuple(dict.fromkeys(calibrated)), quantization.kind,
                              tuple(requantized))


def _differs(observer, entry) -> bool:
    scale, zero = observer.calculate_qparams()
    return len(entry.scales) != 1 or float(scale.reshape(-1)[0]) != np.float32(entry.scales[0]) \
        or int(zero.reshape(-1)[0]) != entry.zero_points[0]


def _pin_bias(modules: dict, node: Node, observer, observed: Node) -> bool:
    """An int32 bias observer set to input scale x weight scale (zero point 0), the scales its
    convolution or linear is given: the file's bias scale is that product for the file's own
    input scale, and the NPU lowering adds the bias to the accumulator of that product (a QDQ
    .onnx whose input range differs from the program's would otherwise be off by the ratio).
    `modules`: the prepared graph's named modules."""
    for consumer in node.users:
        if consumer.op != "call_function" or len(consumer.args) < 3:
            continue
        found = [modules.get(str(a.target)) if isinstance(a, Node) and a.op == "call_module"
                 else None for a in consumer.args[:2]]
        if any(not isinstance(f, ObserverBase) for f in found):
            return False
        (x_scale, _), (w_scale, _) = (f.calculate_qparams() for f in found)
        scale = (x_scale.double() * w_scale.double()).to(torch.float32).reshape(-1)
        per_channel = "per_channel" in str(getattr(observer, "qscheme", ""))
        if not per_channel and scale.numel() > 1:
            return False
        scale = scale if per_channel else scale.reshape(())
        zero = torch.zeros(scale.shape, dtype=torch.int32)
        observer.calculate_qparams = lambda: (scale, zero)
        return True
    return False


def _set(observer, entry, observed: Node) -> bool:
    """Pin `observer` to the file's `entry`; False (left to the observer) for a weight the file
    quantizes per channel where the quantizer quantizes it per tensor."""
    dtype = getattr(observer, "dtype", None)
    wanted = {"int8": torch.int8, "int16": torch.int16, "int32": torch.int32}.get(entry.dtype)
    if dtype is not None and wanted is not None and dtype != wanted:
        raise UserError(
            f"tensor {entry.tensor} '{entry.name}' is {entry.dtype} in the file where the "
            f"quantizer gives {observed.name} {str(dtype).removeprefix('torch.')}; only int8 "
            "activations with int8 weights are kept from a file")
    scales = np.asarray(entry.scales, dtype=np.float32)
    zeros = np.asarray(entry.zero_points, dtype=np.int64)
    per_channel = hasattr(observer, "ch_axis") and "per_channel" in str(
        getattr(observer, "qscheme", ""))
    if per_channel:
        channels = observed.meta["val"].shape[observer.ch_axis] if "val" in observed.meta else \
            len(scales)
        if len(scales) == 1:
            scales, zeros = np.repeat(scales, channels), np.repeat(zeros, channels)
        if len(scales) != channels or observer.ch_axis != entry.axis:
            raise UserError(f"tensor {entry.tensor} '{entry.name}' has {len(scales)} scales along "
                            f"dimension {entry.axis}; the quantizer observes {observed.name} "
                            f"per channel along {observer.ch_axis} ({channels} channels)")
    elif len(scales) != 1 and observed.op == "get_attr":
        return False  # a per-channel weight where the kernel takes one scale: re-quantized
    elif len(scales) != 1:
        raise UserError(f"tensor {entry.tensor} '{entry.name}' has {len(scales)} scales; the "
                        f"quantizer quantizes {observed.name} per tensor")
    quant_min = getattr(observer, "quant_min", None)
    quant_max = getattr(observer, "quant_max", None)
    # The dtypes the observer's own qparams come in (it has seen the calibration samples).
    own_scale, own_zero = observer.calculate_qparams()
    scale_t = torch.from_numpy(scales.copy()).to(own_scale.dtype)
    zero_t = torch.from_numpy(zeros.copy()).to(own_zero.dtype)
    if not per_channel and own_scale.dim() == 0:
        scale_t, zero_t = scale_t.reshape(()), zero_t.reshape(())
    if quant_min is not None and quant_max is not None and not all(
            quant_min <= z <= quant_max for z in zeros.tolist()):
        raise UserError(f"tensor {entry.tensor} '{entry.name}' has a zero point outside "
                        f"[{quant_min}, {quant_max}]")
    observer.calculate_qparams = lambda: (scale_t, zero_t)
    return True


def softmax_on_cmsis_nn(quantizer, modules: tuple[str, ...]):
    """The Ethos-U quantizer with the file's SOFTMAX operators (`modules`) quantized as
    CortexMQuantizer quantizes a softmax (its input's range, CMSIS-NN's fixed output range 1/256,
    -128), not decomposed: they run on the CPU as `cortex_m::softmax` (arm_softmax_s8, TFLM's
    own algorithm), where upstream's Arm quantizer would decompose each into six int8 steps
    with calibrated ranges of their own (up to 50 steps from TFLM's output on MLPerf Tiny's
    keyword spotter). The partitioner is told to leave them to the CPU by the policy
    (`Policy.kept_on_cpu`)."""
    if not modules:
        return quantizer
    for module in modules:  # no annotation and no decomposition by the Arm quantizer
        quantizer.set_module_name(module, None)

    class SoftmaxOnCmsisNn(Quantizer):
        def transform_for_annotation(self, model):
            return quantizer.transform_for_annotation(model)

        def annotate(self, model):
            model = quantizer.annotate(model)
            for node in model.graph.nodes:
                scope = operator_of(node) if node.op == "call_function" else None
                if node.target not in SOFTMAX_TARGETS or f"op{scope}" not in modules:
                    continue
                producer = node.args[0]
                annotated = producer.meta.get("quantization_annotation")
                spec = SharedQuantizationSpec(producer) if annotated is not None and \
                    annotated.output_qspec is not None else INT8_ACTIVATION_PER_TENSOR_QSPEC
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map={producer: spec}, output_qspec=SOFTMAX_OUTPUT_FIXED_QSPEC,
                    _annotated=True)
                # the mark upstream's FoldAndAnnotateQParamsPass folds quantize/dequantize by
                # (without it the softmax stays float, on the portable kernel)
                node.meta.setdefault("custom", {})[ArmAnnotationInfo.CUSTOM_META_KEY] = dict(
                    ArmAnnotationInfo(quantized=True))
            return model

        def validate(self, model):
            return quantizer.validate(model)

    return SoftmaxOnCmsisNn()


def calibration_samples(quantization, example_inputs, count: int = 8, seed: int = 0):
    """Samples spread over every value the file's integer inputs can take, dequantized with the
    inputs' own scales: what the ranges left to calibration (inside an operator) are observed on
    when the user gives no calibration data."""
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(count):
        sample = []
        for index, example in zip(quantization.graph_inputs, example_inputs):
            entry = quantization.by_tensor.get(index)
            if entry is None:  # an input the file does not quantize
                sample.append(torch.randn(example.shape, generator=generator))
                continue
            info = torch.iinfo(getattr(torch, entry.dtype))
            q = torch.randint(info.min, info.max + 1, example.shape, generator=generator)
            sample.append(((q - entry.zero_points[0]) * entry.scales[0]).to(torch.float32))
        samples.append(tuple(sample))
    return tuple(samples)
