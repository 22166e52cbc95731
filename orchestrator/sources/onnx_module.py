"""An `.onnx` file read as data and rebuilt as a PyTorch module with the file's own weights; a
QDQ file's quantization (QuantizeLinear/DequantizeLinear, the form ONNX Runtime's static
quantization writes) kept beside it for the quantize stage, as a `.tflite`'s is
(orchestrator/compilation/file_quantization.py pins upstream's observers to it).

Why our own importer: the maintained converters either drop QDQ (onnx2torch refuses
QuantizeLinear) or need a second framework installed (onnx2tf needs TensorFlow); the network forms
a microcontroller model uses are few, and rebuilding them the way the `.tflite` importer does
gives the same guarantees: the file is parsed as protobuf data (the `onnx` package's message
classes, no ONNX Runtime, no custom domains, no external data files), every shape and size is
checked before an array is made, and each node becomes one `op<index>` submodule, so the plan
names the ONNX node behind each row and the pinning finds each tensor's scales.

A QDQ pair around a tensor is not rebuilt: the tensor keeps the pair's scale and zero point
(uint8 as int8, zero point - 128: the same real values), a weight's DequantizeLinear gives the
float weight and its per-channel scales, and where ONNX Runtime removed a ReLU because the
quantized range starts at zero (zero point at the type's minimum after a convolution, Gemm or
MatMul) the module clamps at zero, as the file's integers do. Layout is the file's: ONNX is
NCHW, as PyTorch is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from google.protobuf.message import DecodeError
from onnx import numpy_helper
from torch import Tensor, nn

from orchestrator.errors import UserError
from orchestrator.sources.tflite_file import MAX_DIMENSION, MAX_TENSOR_ELEMENTS
from orchestrator.sources.tflite_module import (FileGraphModule, FileQuantization,
                                               TensorQuantization)

MAX_FILE_BYTES = 512 << 20
# The ONNX operators this importer rebuilds (docs/models.md lists them).
SUPPORTED_OPERATORS = (
    "Add", "AveragePool", "BatchNormalization", "Cast", "Clip", "Concat", "Constant", "Conv",
    "DequantizeLinear", "Div", "Dropout", "Flatten", "Gather", "Gemm", "GlobalAveragePool",
    "GlobalMaxPool", "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "MatMul", "MaxPool",
    "Mul", "Pad", "QuantizeLinear", "ReduceMean", "Relu", "Reshape", "Resize", "Shape",
    "Sigmoid", "Softmax", "Squeeze", "Sub", "Tanh", "Transpose", "Unsqueeze")
_DTYPES = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32,
           7: torch.int64, 9: torch.bool, 10: torch.float16, 11: torch.float64}
_LINEAR_OPS = ("Conv", "Gemm", "MatMul", "Add")


class Unsupported(UserError):
    pass


def _refuse(path: Path, problem: str) -> UserError:
    return UserError(f"{path}: {problem}; give an .onnx file written by an ONNX exporter (with "
                     "its weights inside the file)")


def _check_tensor(path: Path, tensor: onnx.TensorProto, where: str) -> None:
    if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
        raise _refuse(path, f"{where} '{tensor.name}' keeps its data in an external file, which "
                            "is not read (save the model with its data inside)")
    dims = list(tensor.dims)
    if any(d < 0 or d > MAX_DIMENSION for d in dims) or math.prod(dims) > MAX_TENSOR_ELEMENTS:
        raise _refuse(path, f"{where} '{tensor.name}' has the shape {dims}, outside what a "
                            "microcontroller model holds")
    if tensor.data_type not in _DTYPES:
        raise _refuse(path, f"{where} '{tensor.name}' has ONNX data type {tensor.data_type}, "
                            "which is not rebuilt")


def _array(path: Path, tensor: onnx.TensorProto, where: str) -> np.ndarray:
    _check_tensor(path, tensor, where)
    try:
        return np.array(numpy_helper.to_array(tensor))
    except (ValueError, TypeError) as error:
        raise _refuse(path, f"{where} '{tensor.name}' holds data that does not match its "
                            f"shape {list(tensor.dims)} ({error})") from None


def read_onnx(path: Path) -> onnx.ModelProto:
    """The file parsed as an ONNX protobuf message, its structure checked (nothing run)."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise _refuse(path, f"the file is {size:,} bytes, more than {MAX_FILE_BYTES:,}")
    data = path.read_bytes()
    try:
        model = onnx.ModelProto.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise _refuse(path, f"not an ONNX model (its protobuf does not parse: {error})") from None
    graph = model.graph
    if not graph.node or not graph.output:
        raise _refuse(path, "the file holds no graph (no nodes or no outputs)")
    for tensor in graph.initializer:
        _check_tensor(path, tensor, "initializer")
    for index, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx"):
            raise Unsupported(f"{path.name}: ONNX node {node.op_type} (node {index}, domain "
                              f"'{node.domain}') is from a custom domain; orchestrate rebuilds "
                              f"the standard operators {', '.join(SUPPORTED_OPERATORS)}")
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                _check_tensor(path, attribute.t, f"node {index}'s constant")
            if attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                raise Unsupported(f"{path.name}: ONNX node {node.op_type} (node {index}) holds "
                                  "a subgraph (control flow), which is not rebuilt")
    return model


@dataclass(frozen=True)
class _Quant:
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    axis: int
    dtype: str


class _Node(nn.Module):
    """One ONNX node: a function of its runtime inputs, its constant inputs held as buffers
    (a convolution's or Gemm's weight and bias as parameters, so the quantizer sees them)."""

    def __init__(self, function, slots: int, constants: dict[int, Tensor | None], weight=None,
                 bias=None):
        super().__init__()
        self.function, self.slots = function, slots
        self.constant_slots = tuple(sorted(constants))  # a None one: the parameter, or absent
        for slot, value in constants.items():
            self.register_buffer(f"constant{slot}", value)
        self.weight = nn.Parameter(weight, requires_grad=False) if weight is not None else None
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def forward(self, *runtime: Tensor) -> Tensor:
        values, given = [], iter(runtime)
        for slot in range(self.slots):
            values.append(getattr(self, f"constant{slot}") if slot in self.constant_slots
                          else next(given))
        return self.function(self, *values)


def _attributes(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _pads(pads, rank: int):
    """ONNX pads [begin..., end...] as (symmetric padding or None, F.pad's list)."""
    pads = list(pads or [0] * 2 * rank)
    begin, end = pads[:rank], pads[rank:]
    explicit = []
    for b, e in zip(reversed(begin), reversed(end)):
        explicit += [b, e]
    return (tuple(begin) if begin == end else None), explicit


def _auto_pads(auto: str, sizes, kernel, strides, dilations) -> list[int]:
    begin, end = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else large)
        end.append(large if auto == "SAME_UPPER" else small)
    return begin + end


class OnnxModule(FileGraphModule):
    """The graph of an `.onnx` file as a module: one `op<index>` submodule per computing node,
    run in the file's order (ONNX requires topological order)."""

    origin_format = "ONNX"

    def __init__(self, model: onnx.ModelProto, path: Path):
        super().__init__()
        self.path, graph = path, model.graph
        self.names: list[str] = []  # tensor index -> ONNX value name
        self.index: dict[str, int] = {}
        self.constants: dict[int, Tensor] = {}
        self.examples: dict[int, Tensor] = {}
        self.quant: dict[int, _Quant] = {}
        self.steps: list[tuple[str, tuple[int, ...], int]] = []
        self.attributes: dict[str, int] = {}
        self.origin: dict[str, tuple[int, str, int, str]] = {}
        self.operator_names: dict[int, str] = {}
        self.operator_outputs: dict[int, int] = {}
        initializers = {t.name for t in graph.initializer}
        for tensor in graph.initializer:
            self._new(tensor.name, constant=torch.from_numpy(_array(path, tensor, "initializer")))
        self.graph_inputs = []
        for value in graph.input:
            if value.name in initializers:
                continue
            shape = self._input_shape(value)
            kind = value.type.tensor_type.elem_type
            if kind != onnx.TensorProto.FLOAT:
                raise _refuse(path, f"input '{value.name}' has ONNX data type {kind}; only "
                                    "float inputs are rebuilt")
            self.graph_inputs.append(self._new(value.name, example=torch.zeros(shape)))
        for position, node in enumerate(graph.node):
            self._node(position, node)
        missing = [v.name for v in graph.output if v.name not in self.index]
        if missing:
            raise _refuse(path, f"the graph output '{missing[0]}' is computed by no node")
        self.graph_outputs = [self.index[v.name] for v in graph.output]
        if any(i in self.constants for i in self.graph_outputs):
            raise _refuse(path, "a graph output is a constant")

    # -- values ---------------------------------------------------------------------------------

    def _new(self, name: str, constant: Tensor | None = None, example: Tensor | None = None):
        index = len(self.names)
        self.names.append(name)
        self.index[name] = index
        if constant is not None:
            self.constants[index] = constant
        if example is not None:
            self.examples[index] = example
        return index

    def _input_shape(self, value) -> tuple[int, ...]:
        dims = value.type.tensor_type.shape.dim
        shape = []
        for axis, dim in enumerate(dims):
            if dim.HasField("dim_value") and 0 < dim.dim_value <= MAX_DIMENSION:
                shape.append(dim.dim_value)
            elif axis == 0:
                shape.append(1)  # a symbolic batch: one sample per inference
            else:
                raise _refuse(self.path, f"input '{value.name}' has no fixed size on axis "
                                         f"{axis}; export it with a fixed input shape")
        if math.prod(shape) > MAX_TENSOR_ELEMENTS:
            raise _refuse(self.path, f"input '{value.name}' has the shape {shape}")
        return tuple(shape)

    def _value(self, node, position: int, slot: int) -> int:
        name = node.input[slot] if slot < len(node.input) else ""
        if not name:
            return -1
        if name not in self.index:
            raise _refuse(self.path, f"node {position} ({node.op_type}) reads '{name}', which "
                                     "no earlier node computes")
        return self.index[name]

    def _unsupported(self, node, position: int, why: str) -> Unsupported:
        return Unsupported(f"{self.path.name}: ONNX operator {node.op_type} (node {position} of "
                           f"the graph{', ' + repr(node.name) if node.name else ''}) {why}; "
                           f"orchestrate rebuilds {', '.join(SUPPORTED_OPERATORS)}")

    # -- nodes ----------------------------------------------------------------------------------

    def _node(self, position: int, node) -> None:
        inputs = [self._value(node, position, s) for s in range(len(node.input))]
        attrs = _attributes(node)
        if len(node.output) != 1 and node.op_type not in ("Dropout",):
            raise self._unsupported(node, position, f"has {len(node.output)} outputs")
        output = node.output[0]
        kind = node.op_type
        constant = all(i < 0 or i in self.constants for i in inputs)
        if kind in ("Identity", "Dropout"):
            self.index[output] = inputs[0]
            return
        if kind == "Constant":
            if "value" not in attrs:
                raise self._unsupported(node, position, "holds no tensor 'value'")
            self._new(output, constant=torch.from_numpy(np.array(numpy_helper.to_array(
                attrs["value"]))))
            return
        if kind == "Shape":
            source = self.constants.get(inputs[0], self.examples.get(inputs[0]))
            self._new(output, constant=torch.tensor(list(source.shape), dtype=torch.int64))
            return
        if kind == "QuantizeLinear":
            self._quantize(node, position, inputs, attrs, output, constant)
            return
        if kind == "DequantizeLinear":
            self._dequantize(node, position, inputs, attrs, output)
            return
        builder = getattr(self, f"_build_{kind.lower()}", None)
        if builder is None:
            raise self._unsupported(node, position, "cannot be rebuilt as a PyTorch operation")
        function, weight, bias, weight_of = builder(node, position, inputs, attrs)
        # constant inputs as buffers; a weight's or bias's slot (a parameter) and an absent
        # optional input read None
        constants = {s: (None if s in weight_of or i < 0 else self.constants[i])
                     for s, i in enumerate(inputs) if i < 0 or i in self.constants}
        runtime = tuple(i for i in inputs if i >= 0 and i not in self.constants)
        module = _Node(function, len(inputs), constants, weight, bias)
        with torch.no_grad():
            example = module(*(self.examples[i] for i in runtime))
        if constant:  # folded: a computation of constants is a constant
            self._new(output, constant=example.detach())
            return
        name = f"op{position}"
        self.add_module(name, module)
        index = self._new(output, example=example.detach())
        for attribute, source in weight_of.values():
            if source is not None and source in self.quant:
                self.attributes[f"{name}.{attribute}"] = source
        self.steps.append((name, runtime, index))
        self.origin[name] = (position, kind, index, output)
        self.operator_names[position] = kind
        self.operator_outputs[position] = index

    def _quantize(self, node, position, inputs, attrs, output, constant) -> None:
        if constant:
            raise self._unsupported(node, position, "quantizes a constant (a weight is written "
                                                    "as int8 with a DequantizeLinear)")
        quant = self._quant_of(node, position, inputs, attrs)
        self.quant.setdefault(inputs[0], quant)
        self.index[output] = inputs[0]  # the pair's tensor is the float one it quantizes

    def _dequantize(self, node, position, inputs, attrs, output) -> None:
        quant = self._quant_of(node, position, inputs, attrs)
        if inputs[0] not in self.constants:
            self.index[output] = inputs[0]
            return
        values = self.constants[inputs[0]].to(torch.float64)
        shape = [1] * values.dim()
        if len(quant.scales) > 1:
            shape[quant.axis] = len(quant.scales)
        scales = torch.tensor(quant.scales, dtype=torch.float64).reshape(shape)
        zeros = torch.tensor(quant.zero_points, dtype=torch.float64).reshape(shape)
        offset = 128 if self.constants[inputs[0]].dtype == torch.uint8 else 0
        dequantized = ((values - offset - zeros) * scales).to(torch.float32)
        index = self._new(output, constant=dequantized)
        self.quant[index] = quant

    def _quant_of(self, node, position, inputs, attrs) -> _Quant:
        scale = self.constants.get(inputs[1]) if len(inputs) > 1 else None
        zero = self.constants.get(inputs[2]) if len(inputs) > 2 and inputs[2] >= 0 else None
        if scale is None:
            raise self._unsupported(node, position, "takes its scale at run time")
        dtype = zero.dtype if zero is not None else torch.uint8
        if node.op_type == "DequantizeLinear" and inputs[0] in self.constants:
            dtype = self.constants[inputs[0]].dtype
        names = {torch.int8: "int8", torch.uint8: "int8", torch.int16: "int16",
                 torch.int32: "int32"}
        if dtype not in names:
            raise self._unsupported(node, position, f"quantizes to {dtype}")
        scales = tuple(float(s) for s in scale.reshape(-1))
        zeros = tuple(int(z) - (128 if dtype == torch.uint8 else 0)
                      for z in (zero.reshape(-1) if zero is not None else [0] * len(scales)))
        if len(zeros) == 1 and len(scales) > 1:
            zeros = zeros * len(scales)
        rank = self.constants[inputs[0]].dim() if inputs[0] in self.constants else \
            self.examples[inputs[0]].dim()
        axis = int(attrs.get("axis", 1))
        return _Quant(scales, zeros, axis + rank if axis < 0 else axis, names[dtype])

    def _weight(self, node, position, index: int, transform=None, axis_map=None):
        """A constant weight, transformed (a Gemm's transposed B), and the tensor whose
        quantization the pinning reads for it (a new one when the transform moves its axis)."""
        if index not in self.constants:
            raise self._unsupported(node, position, "takes its weights at run time")
        value = self.constants[index]
        if transform is None:
            return value.float(), index
        source = index
        if index in self.quant and axis_map is not None:
            quant = self.quant[index]
            source = self._new(f"{self.names[index]}.T", constant=transform(value))
            self.quant[source] = _Quant(quant.scales, quant.zero_points, axis_map[quant.axis],
                                        quant.dtype)
        return transform(value).float().contiguous(), source

    # -- builders: (function(module, *inputs), weight, bias, {slot: (attribute, tensor)}) -------

    def _build_conv(self, node, position, inputs, attrs):
        weight, source = self._weight(node, position, inputs[1])
        bias, bias_source = (self._weight(node, position, inputs[2])
                             if len(inputs) > 2 and inputs[2] >= 0 else (None, None))
        rank = weight.dim() - 2
        if rank not in (1, 2):
            raise self._unsupported(node, position, f"is a {rank}-D convolution")
        strides = list(attrs.get("strides", [1] * rank))
        dilations = list(attrs.get("dilations", [1] * rank))
        groups = int(attrs.get("group", 1))
        auto = attrs.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        pads = attrs.get("pads")
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            sizes = self.examples[inputs[0]].shape[2:]
            pads = _auto_pads(auto, sizes, weight.shape[2:], strides, dilations)
        symmetric, explicit = _pads(pads, rank)
        conv = F.conv2d if rank == 2 else F.conv1d

        def function(module, x, *_):
            if symmetric is None:
                x = F.pad(x, explicit)
            if x.dim() == 4:  # CMSIS-NN convolves NHWC: ExecuTorch's Cortex-M quantizer leaves
                # a convolution whose output is not channels-last in float (one after a Reshape)
                x = x.contiguous(memory_format=torch.channels_last)
            return conv(x, module.weight, module.bias, strides, symmetric or 0, dilations, groups)
        return function, weight, bias, {1: ("weight", source), 2: ("bias", bias_source)}

    def _build_gemm(self, node, position, inputs, attrs):
        if attrs.get("transA", 0):
            raise self._unsupported(node, position, "transposes its input A")
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        if alpha != 1.0 or beta != 1.0:
            raise self._unsupported(node, position, f"scales by alpha {alpha}, beta {beta}")
        if attrs.get("transB", 0):
            weight, source = self._weight(node, position, inputs[1])
        else:
            weight, source = self._weight(node, position, inputs[1], lambda w: w.t(), {0: 1, 1: 0})
        bias, bias_source = (self._weight(node, position, inputs[2])
                             if len(inputs) > 2 and inputs[2] >= 0 else (None, None))
        if bias is not None and bias.dim() != 1:
            bias = bias.reshape(-1)

        def function(module, x, *_):
            return F.linear(x, module.weight, module.bias)
        return function, weight, bias, {1: ("weight", source), 2: ("bias", bias_source)}

    def _build_matmul(self, node, position, inputs, attrs):
        if inputs[1] not in self.constants or self.constants[inputs[1]].dim() != 2:
            return (lambda module, a, b: torch.matmul(a, b)), None, None, {}
        weight, source = self._weight(node, position, inputs[1], lambda w: w.t(), {0: 1, 1: 0})

        def function(module, x, _):
            return F.linear(x, module.weight)
        return function, weight, None, {1: ("weight", source)}

    def _elementwise(operation):
        def build(self, node, position, inputs, attrs):
            return (lambda module, a, b: operation(a, b)), None, None, {}
        return build

    _build_add = _elementwise(torch.add)
    _build_sub = _elementwise(torch.sub)
    _build_mul = _elementwise(torch.mul)
    _build_div = _elementwise(torch.div)

    def _unary(operation):
        def build(self, node, position, inputs, attrs):
            return (lambda module, x, *_: operation(x)), None, None, {}
        return build

    _build_relu = _unary(F.relu)
    _build_sigmoid = _unary(torch.sigmoid)
    _build_tanh = _unary(torch.tanh)
    _build_hardswish = _unary(F.hardswish)
    _build_globalaveragepool = _unary(lambda x: F.adaptive_avg_pool2d(x, 1))
    _build_globalmaxpool = _unary(lambda x: F.adaptive_max_pool2d(x, 1))

    def _build_leakyrelu(self, node, position, inputs, attrs):
        slope = float(attrs.get("alpha", 0.01))
        return (lambda module, x: F.leaky_relu(x, slope)), None, None, {}

    def _build_hardsigmoid(self, node, position, inputs, attrs):
        alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
        if abs(alpha - 1 / 6) < 1e-6 and beta == 0.5:
            return (lambda module, x: F.hardsigmoid(x)), None, None, {}
        return (lambda module, x: torch.clamp(x * alpha + beta, 0.0, 1.0)), None, None, {}

    def _build_clip(self, node, position, inputs, attrs):
        bounds = []
        for slot, name in ((1, "min"), (2, "max")):
            if len(inputs) > slot and inputs[slot] >= 0:
                if inputs[slot] not in self.constants:
                    raise self._unsupported(node, position, f"takes its {name} at run time")
                bounds.append(float(self.constants[inputs[slot]]))
            else:
                bounds.append(attrs.get(name))
        low, high = bounds
        if low is not None and high is not None:
            return (lambda module, x, *_: F.hardtanh(x, low, high)), None, None, {}
        return (lambda module, x, *_: torch.clamp(x, low, high)), None, None, {}

    def _build_softmax(self, node, position, inputs, attrs):
        axis = int(attrs.get("axis", -1))
        return (lambda module, x: torch.softmax(x, axis)), None, None, {}

    def _pool(self, node, position, inputs, attrs, kind: str):
        kernel = list(attrs["kernel_shape"])
        rank = len(kernel)
        if rank != 2:
            raise self._unsupported(node, position, f"pools over {rank} dimensions")
        strides = list(attrs.get("strides", [1] * rank))
        if any(d != 1 for d in attrs.get("dilations", [1] * rank)):
            raise self._unsupported(node, position, "is dilated")
        auto = attrs.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        pads = attrs.get("pads")
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            pads = _auto_pads(auto, self.examples[inputs[0]].shape[2:], kernel, strides,
                              [1] * rank)
        symmetric, _ = _pads(pads, rank)
        if symmetric is None:
            raise self._unsupported(node, position, f"pads unevenly ({list(pads)})")
        ceil = bool(attrs.get("ceil_mode", 0))
        if kind == "max":
            return (lambda module, x: F.max_pool2d(x, kernel, strides, symmetric,
                                                   ceil_mode=ceil)), None, None, {}
        include = bool(attrs.get("count_include_pad", 0))
        return (lambda module, x: F.avg_pool2d(x, kernel, strides, symmetric, ceil_mode=ceil,
                                               count_include_pad=include)), None, None, {}

    def _build_maxpool(self, node, position, inputs, attrs):
        return self._pool(node, position, inputs, attrs, "max")

    def _build_averagepool(self, node, position, inputs, attrs):
        return self._pool(node, position, inputs, attrs, "avg")

    def _build_batchnormalization(self, node, position, inputs, attrs):
        epsilon = float(attrs.get("epsilon", 1e-5))
        return (lambda module, x, scale, shift, mean, var: F.batch_norm(
            x, mean, var, scale, shift, False, 0.0, epsilon)), None, None, {}

    def _shape_input(self, node, position, inputs, slot: int, what: str) -> list[int]:
        if len(inputs) <= slot or inputs[slot] < 0:
            return []
        if inputs[slot] not in self.constants:
            raise self._unsupported(node, position, f"takes its {what} at run time")
        return [int(v) for v in self.constants[inputs[slot]].reshape(-1)]

    def _build_reshape(self, node, position, inputs, attrs):
        shape = self._shape_input(node, position, inputs, 1, "shape")
        source = self.constants.get(inputs[0], self.examples.get(inputs[0]))
        if not attrs.get("allowzero", 0):
            shape = [source.shape[i] if v == 0 else v for i, v in enumerate(shape)]
        return (lambda module, x, _: x.reshape(shape)), None, None, {}

    def _build_flatten(self, node, position, inputs, attrs):
        axis = int(attrs.get("axis", 1))
        return (lambda module, x: x.reshape(math.prod(x.shape[:axis]), -1)), None, None, {}

    def _build_transpose(self, node, position, inputs, attrs):
        perm = list(attrs.get("perm", []))
        return (lambda module, x: x.permute(*perm) if perm else x.permute(
            *reversed(range(x.dim())))), None, None, {}

    def _build_squeeze(self, node, position, inputs, attrs):
        axes = self._shape_input(node, position, inputs, 1, "axes") or list(
            attrs.get("axes", []))

        def function(module, x, *_):
            dims = [a % x.dim() for a in axes] or [d for d, s in enumerate(x.shape) if s == 1]
            for d in sorted(dims, reverse=True):
                x = x.squeeze(d)
            return x
        return function, None, None, {}

    def _build_unsqueeze(self, node, position, inputs, attrs):
        axes = self._shape_input(node, position, inputs, 1, "axes") or list(
            attrs.get("axes", []))

        def function(module, x, *_):
            rank = x.dim() + len(axes)
            for d in sorted(a % rank for a in axes):
                x = x.unsqueeze(d)
            return x
        return function, None, None, {}

    def _build_concat(self, node, position, inputs, attrs):
        axis = int(attrs["axis"])
        return (lambda module, *xs: torch.cat(xs, axis)), None, None, {}

    def _build_gather(self, node, position, inputs, attrs):
        axis = int(attrs.get("axis", 0))
        if inputs[1] not in self.constants:
            raise self._unsupported(node, position, "takes its indices at run time")
        return (lambda module, x, i: torch.index_select(x, axis, i.reshape(-1).long()).reshape(
            [*x.shape[:axis], *i.shape, *x.shape[axis + 1:]])), None, None, {}

    def _build_cast(self, node, position, inputs, attrs):
        dtype = _DTYPES.get(int(attrs["to"]))
        if dtype is None:
            raise self._unsupported(node, position, f"casts to ONNX type {attrs['to']}")
        return (lambda module, x: x.to(dtype)), None, None, {}

    def _build_pad(self, node, position, inputs, attrs):
        mode = attrs.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode != "constant":
            raise self._unsupported(node, position, f"pads in mode {mode}")
        pads = self._shape_input(node, position, inputs, 1, "pads") or list(
            attrs.get("pads", []))
        value = float(self.constants[inputs[2]]) if len(inputs) > 2 and inputs[2] >= 0 else 0.0
        rank = len(pads) // 2
        _, explicit = _pads(pads, rank)
        return (lambda module, x, *_: F.pad(x, explicit, value=value)), None, None, {}

    def _build_reducemean(self, node, position, inputs, attrs):
        axes = self._shape_input(node, position, inputs, 1, "axes") or list(
            attrs.get("axes", []))
        keep = bool(attrs.get("keepdims", 1))
        return (lambda module, x, *_: x.mean(axes or list(range(x.dim())), keepdim=keep)), \
            None, None, {}

    def _build_resize(self, node, position, inputs, attrs):
        mode = attrs.get("mode", b"nearest")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        transform = attrs.get("coordinate_transformation_mode", b"half_pixel")
        transform = transform.decode() if isinstance(transform, bytes) else transform
        nearest = attrs.get("nearest_mode", b"round_prefer_floor")
        nearest = nearest.decode() if isinstance(nearest, bytes) else nearest
        if mode != "nearest" or transform != "asymmetric" or nearest != "floor":
            raise self._unsupported(node, position, f"resizes in mode {mode} ({transform}, "
                                                    f"{nearest}); PyTorch's nearest is "
                                                    "asymmetric with floor")
        sizes = self._shape_input(node, position, inputs, 3, "sizes")
        scales = [float(v) for v in self.constants[inputs[2]].reshape(-1)] \
            if len(inputs) > 2 and inputs[2] >= 0 and inputs[2] in self.constants else []
        if sizes:
            return (lambda module, x, *_: F.interpolate(x, size=sizes[2:], mode="nearest")), \
                None, None, {}
        return (lambda module, x, *_: F.interpolate(x, scale_factor=scales[2:],
                                                    mode="nearest")), None, None, {}


def _relu_removed(module: OnnxModule) -> None:
    """Where ONNX Runtime's quantizer removed a ReLU after a convolution, Gemm, MatMul or Add
    because the output's range starts at zero, the module clamps at zero as the file's
    integers do (a float network otherwise: the next layer would see negative values)."""
    for name, _, output in module.steps:
        position = module.origin[name][0]
        quant = module.quant.get(output)
        if quant is None or module.operator_names[position] not in _LINEAR_OPS:
            continue
        lowest = {"int8": -128, "int16": -32768}.get(quant.dtype)
        if lowest is not None and all(z == lowest for z in quant.zero_points):
            node = getattr(module, name)
            inner = node.function
            node.function = lambda m, *xs, inner=inner: F.relu(inner(m, *xs))


_SOFTMAX_ON_CPU = (
    "the QDQ file's Softmax runs on CMSIS-NN (arm_softmax_s8, one int8 kernel); the Arm backend "
    "decomposes a softmax into int8 steps whose ranges the file does not give (the digits CNN "
    "on U55-128 with it on the NPU: top-1 10.1% where the quantized reference has 79.1%)")


def build_onnx(path: Path):
    """The module, example inputs (zeros in the file's shapes) and, for a QDQ file, its
    quantization (a FileQuantization, as a `.tflite`'s)."""
    model = read_onnx(path)
    module = OnnxModule(model, Path(path)).eval()
    example_inputs = tuple(module.examples[i] for i in module.graph_inputs)
    if not module.quant:
        return module, example_inputs, None
    _relu_removed(module)
    by_tensor = {index: TensorQuantization(index, module.names[index], q.scales, q.zero_points,
                                           q.axis, q.dtype)
                 for index, q in module.quant.items()}
    quantization = FileQuantization(
        str(path), by_tensor, dict(module.attributes), tuple(module.graph_inputs),
        tuple(module.graph_outputs), dict(module.operator_outputs),
        dict(module.operator_names), dict(enumerate(module.names)),
        {position: _SOFTMAX_ON_CPU for position, kind in module.operator_names.items()
         if kind == "Softmax"}, kind="onnx")
    return module, example_inputs, quantization
