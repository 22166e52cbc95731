"""A `.tflite` graph rebuilt as a PyTorch module with the file's own weights, and the file's
quantization kept beside it for the quantize stage (orchestrator/compilation/file_quantization.py).

Each TFLite operator becomes one submodule named `op<index>` (its index in the file's operator
list, as Netron shows it), so every node torch.export records carries the operator it came from in
its `nn_module_stack`: the quantize stage maps each observer to the TFLite tensor it observes, and
the plan names the TFLite operator and tensor behind each row.

Layout: TFLite tensors are NHWC; the module takes and computes rank-4 tensors as NCHW (PyTorch's
convention), and the pipeline exports it channels-last, so the program's rank-4 inputs and
outputs hold the same bytes as the TFLite tensors (N, H, W, C in memory). Axes named by the file
(concatenation, mean, pad, slice, transpose, reshape) are mapped from NHWC to NCHW here.

Weights: a quantized weight or bias is dequantized with its own scales and zero points, so the
quantizer's observers see exactly the file's values, and pinning the file's scales back recovers
the file's integers (round(q * s / s) == q).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from orchestrator.errors import UserError
from orchestrator.sources.tflite_file import TfliteGraph, TfliteOperator, TfliteTensor
from orchestrator.sources.tflite_pools import pool_window_counts, raw_sum_pools
from orchestrator.sources.tflite_pools import same_padding as _same_padding

# NHWC axis -> NCHW axis, for rank-4 tensors
_NHWC_TO_NCHW = {0: 0, 1: 2, 2: 3, 3: 1}

# The TFLite operators this importer rebuilds (docs/models.md lists them).
SUPPORTED_OPERATORS = (
    "ADD", "AVERAGE_POOL_2D", "CONCATENATION", "CONV_2D", "DEPTHWISE_CONV_2D", "DEQUANTIZE",
    "FULLY_CONNECTED", "HARD_SWISH", "LEAKY_RELU", "LOGISTIC", "MAX_POOL_2D", "MEAN", "MUL",
    "PAD", "PADV2", "QUANTIZE", "RELU", "RELU6", "RELU_N1_TO_1", "RESHAPE",
    "RESIZE_NEAREST_NEIGHBOR", "SOFTMAX", "SQUEEZE", "STRIDED_SLICE", "SUB", "TANH", "TILE",
    "TRANSPOSE", "SHAPE and PACK (on constants)",
)


@dataclass(frozen=True)
class TensorQuantization:
    """One TFLite tensor's quantization, as the file states it."""

    tensor: int
    name: str
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    axis: int  # the PyTorch dimension the scales run along (per-channel weights)
    dtype: str  # "int8" | "int16" | "int32"


@dataclass(frozen=True)
class FileQuantization:
    """What a full-integer `.tflite` fixes: the quantization of every tensor the program
    computes, by the TFLite tensor index and by the module attribute holding a constant."""

    path: str
    by_tensor: dict[int, TensorQuantization]
    by_attribute: dict[str, int]  # "op3.weight" -> TFLite tensor index
    graph_inputs: tuple[int, ...]
    graph_outputs: tuple[int, ...]
    operator_outputs: dict[int, int]  # operator index -> its output tensor
    operator_names: dict[int, str]  # operator index -> "CONV_2D"
    tensor_names: dict[int, str]
    on_cpu: dict[int, str] = field(default_factory=dict)  # operator index -> why CMSIS-NN
    # "tflite": the program takes the file's int8 tensors and rounds as TFLM does; "onnx": a
    # QDQ file's float inputs and outputs, quantized inside with its scales
    kind: str = "tflite"

    @property
    def cmsis_nn_modules(self) -> tuple[str, ...]:
        """The operators CortexMQuantizer quantizes even on an NPU target: a SOFTMAX, whose TFLM
        algorithm (arm_softmax_s8) the Arm backend's decomposition does not compute."""
        return tuple(f"op{i}" for i, name in sorted(self.operator_names.items())
                     if name in ("SOFTMAX", "Softmax"))

    @property
    def kept_on_cpu(self) -> tuple[tuple[str, str], ...]:
        """(module, why) of every operator that runs on CMSIS-NN even on an NPU target, so the
        program computes what TFLM computes (Policy.kept_on_cpu)."""
        return tuple((f"op{i}", why) for i, why in sorted(self.on_cpu.items()))

    def digest_text(self) -> str:
        """What the cache key must change with."""
        return repr(sorted((k, v.scales, v.zero_points, v.axis, v.dtype)
                           for k, v in self.by_tensor.items())) + repr(sorted(self.by_attribute.items()))


class Unsupported(UserError):
    pass


def _refuse(graph: TfliteGraph, op: TfliteOperator, why: str) -> Unsupported:
    return Unsupported(f"{graph.path.name}: TFLite operator {op.opcode} (operator {op.index} of "
                       f"the graph) {why}; orchestrate rebuilds {', '.join(SUPPORTED_OPERATORS)}")


def _dequantized(tensor: TfliteTensor) -> np.ndarray:
    values = tensor.data
    if not tensor.quantized or values.dtype.kind == "f":
        return np.asarray(values, dtype=np.float32)
    scales = np.asarray(tensor.scales, dtype=np.float32)
    zeros = np.asarray(tensor.zero_points, dtype=np.float32)
    if len(scales) > 1:
        shape = [1] * values.ndim
        shape[tensor.quantized_dimension] = len(scales)
        scales, zeros = scales.reshape(shape), zeros.reshape(shape)
    return ((values.astype(np.float32) - zeros) * scales).astype(np.float32)


def _activation(name: str | None):
    if name in (None, "None", "NONE"):
        return None
    table = {"Relu": F.relu, "Relu6": lambda x: F.hardtanh(x, 0.0, 6.0),
             "ReluN1To1": lambda x: F.hardtanh(x, -1.0, 1.0), "Tanh": torch.tanh}
    return table.get(name)


def _pool_window(graph: TfliteGraph, op: TfliteOperator):
    """A TFLite pool's kernel, stride and padding (top, bottom, left, right).

    Along an axis with one output position the stride moves no window: it is 1 there, as the
    Arm backend's Ethos-U check refuses a stride above 3 (MLPerf Tiny's keyword spotter: its
    25x5 pool over 25x5 at stride 25x5 stayed on the CPU) and Vela's TFLite front end takes the
    file's pool."""
    options = op.options
    x, out = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    kernel = (options["filter_height"], options["filter_width"])
    stride = (options["stride_h"], options["stride_w"])
    padding = (0, 0, 0, 0)
    if options.get("padding") == "SAME":
        padding = (*_same_padding(x.shape[1], kernel[0], stride[0], 1),
                   *_same_padding(x.shape[2], kernel[1], stride[1], 1))
    if len(out.shape) == 4:
        stride = tuple(1 if n == 1 else s for n, s in zip(out.shape[1:3], stride))
    return kernel, stride, padding


class _Conv(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None, stride, dilation, padding, groups,
                 activation):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.stride, self.dilation, self.groups = stride, dilation, groups
        top, bottom, left, right = padding
        # Symmetric padding stays in the convolution; the SAME padding of an even input with a
        # stride puts one more row or column after, which only an explicit pad states.
        self.explicit = None if (top == bottom and left == right) else (left, right, top, bottom)
        self.padding = (top, left) if self.explicit is None else (0, 0)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        if self.explicit is not None:
            x = F.pad(x, self.explicit)
        y = F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                     self.groups)
        return self.activation(y) if self.activation is not None else y


class _Linear(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None, in_rank: int, out_shape, activation):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.in_rank, self.out_shape, self.activation = in_rank, tuple(out_shape), activation

    def forward(self, x: Tensor) -> Tensor:
        if self.in_rank == 4 and x.shape[2] * x.shape[3] > 1 and x.shape[1] > 1:
            x = x.permute(0, 2, 3, 1)  # TFLite flattens NHWC
        x = x.reshape(-1, self.weight.shape[1])
        y = F.linear(x, self.weight, self.bias)
        if tuple(y.shape) != self.out_shape:
            y = y.reshape(self.out_shape)
        return self.activation(y) if self.activation is not None else y


class _Elementwise(nn.Module):
    def __init__(self, kind: str, constants: dict[int, Tensor], activation):
        super().__init__()
        self.kind, self.activation = kind, activation
        self.slots = tuple(sorted(constants))
        for slot, value in constants.items():
            self.register_buffer(f"constant{slot}", value)

    def forward(self, *xs: Tensor) -> Tensor:
        values = list(xs)
        for slot in self.slots:
            values.insert(slot, getattr(self, f"constant{slot}"))
        a, b = values
        y = a + b if self.kind == "ADD" else a * b if self.kind == "MUL" else a - b
        return self.activation(y) if self.activation is not None else y


class _Function(nn.Module):
    """An operator without weights: one function of its inputs."""

    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *xs: Tensor) -> Tensor:
        return self.function(*xs)


def _to_torch_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], shape[3], shape[1], shape[2]) if len(shape) == 4 else tuple(shape)


def _to_nhwc(x: Tensor) -> Tensor:
    return x.permute(0, 2, 3, 1) if x.dim() == 4 else x


def _from_nhwc(x: Tensor) -> Tensor:
    return x.permute(0, 3, 1, 2) if x.dim() == 4 else x


def _constant_ints(graph: TfliteGraph, op: TfliteOperator, slot: int) -> list[int]:
    if len(op.inputs) <= slot or op.inputs[slot] < 0:
        raise _refuse(graph, op, f"has no input {slot}")
    tensor = graph.tensors[op.inputs[slot]]
    if tensor.data is None:
        raise _refuse(graph, op, f"takes its input {slot} ({tensor.name}) at run time; only a "
                                 "constant one can be rebuilt")
    return [int(v) for v in np.asarray(tensor.data).reshape(-1)]


def _axis(axis: int, rank: int) -> int:
    axis = axis + rank if axis < 0 else axis
    return _NHWC_TO_NCHW[axis] if rank == 4 else axis


class FileGraphModule(nn.Module):
    """A model file's graph as a module: `steps` of (submodule name, the tensor indices it
    reads, the tensor index it writes), run in order from `graph_inputs` to `graph_outputs`
    (TfliteModule, onnx_module.OnnxModule)."""

    graph_inputs: tuple[int, ...] | list[int]
    graph_outputs: tuple[int, ...] | list[int]
    steps: list[tuple[str, tuple[int, ...], int]]

    def forward(self, *inputs: Tensor):
        values: dict[int, Tensor] = dict(zip(self.graph_inputs, inputs))
        for name, runtime_inputs, output in self.steps:
            values[output] = getattr(self, name)(*(values[i] for i in runtime_inputs))
        outputs = tuple(values[i] for i in self.graph_outputs)
        return outputs[0] if len(outputs) == 1 else outputs


class TfliteModule(FileGraphModule):
    """The graph of a `.tflite` file as a module: one `op<index>` submodule per operator, run in
    the file's order."""

    def __init__(self, graph: TfliteGraph):
        super().__init__()
        self.raw_pools = raw_sum_pools(graph)
        self.graph_inputs = graph.inputs
        self.graph_outputs = graph.outputs
        self.steps: list[tuple[str, tuple[int, ...], int]] = []
        self.attributes: dict[str, int] = {}
        # op<index> -> (operator index, TFLite opcode, output tensor index, its name): what a
        # plan row names so a user finds the op in the file (Netron shows both)
        self.origin: dict[str, tuple[int, str, int, str]] = {}
        for op in graph.operators:
            module, runtime_inputs = self._build(graph, op)
            if len(op.outputs) != 1:
                raise _refuse(graph, op, f"has {len(op.outputs)} outputs")
            name = f"op{op.index}"
            self.add_module(name, module)
            for attribute in ("weight", "bias"):
                tensor = getattr(module, f"_tflite_{attribute}", None)
                if tensor is not None:
                    self.attributes[f"{name}.{attribute}"] = tensor
            for slot, tensor in getattr(module, "_tflite_constants", {}).items():
                self.attributes[f"{name}.constant{slot}"] = tensor
            self.steps.append((name, runtime_inputs, op.outputs[0]))
            self.origin[name] = (op.index, op.opcode, op.outputs[0],
                                 graph.tensors[op.outputs[0]].name)

    # -- one builder per TFLite operator ---------------------------------------------------------

    def _build(self, graph: TfliteGraph, op: TfliteOperator):
        builder = getattr(self, f"_build_{op.opcode.lower().replace(':', '_')}", None)
        if builder is None:
            raise _refuse(graph, op, "cannot be rebuilt as a PyTorch operation")
        for index in op.inputs:
            if index >= 0 and graph.tensors[index].dtype.kind not in "fiub":
                raise _refuse(graph, op, f"reads a {graph.tensors[index].dtype} tensor")
        return builder(graph, op)

    def _runtime(self, graph: TfliteGraph, op: TfliteOperator, slots) -> tuple[int, ...]:
        found = []
        for slot in slots:
            tensor = graph.tensors[op.inputs[slot]]
            if tensor.data is not None:
                raise _refuse(graph, op, f"reads the constant {tensor.name} where a computed "
                                         "tensor is expected")
            found.append(op.inputs[slot])
        return tuple(found)

    def _activation_of(self, graph, op):
        name = op.options.get("fused_activation_function")
        if name not in (None, "None") and _activation(name) is None:
            raise _refuse(graph, op, f"has the fused activation {name}")
        return _activation(name)

    def _weights(self, graph, op, slot: int, layout):
        tensor = graph.tensors[op.inputs[slot]]
        if tensor.data is None:
            raise _refuse(graph, op, f"takes its weights ({tensor.name}) at run time")
        return tensor, torch.from_numpy(layout(_dequantized(tensor)).copy())

    def _bias(self, graph, op):
        if len(op.inputs) < 3 or op.inputs[2] < 0:
            return None, None
        tensor = graph.tensors[op.inputs[2]]
        if tensor.data is None:
            raise _refuse(graph, op, "takes its bias at run time")
        return tensor, torch.from_numpy(_dequantized(tensor).reshape(-1).copy())

    def _conv(self, graph, op, depthwise: bool):
        options = op.options
        x = graph.tensors[op.inputs[0]]
        if len(x.shape) != 4:
            raise _refuse(graph, op, f"reads a rank-{len(x.shape)} input")
        w_tensor, weight = self._weights(
            graph, op, 1, (lambda w: np.transpose(w, (3, 0, 1, 2))) if depthwise
            else (lambda w: np.transpose(w, (0, 3, 1, 2))))
        b_tensor, bias = self._bias(graph, op)
        stride = (options.get("stride_h", 1), options.get("stride_w", 1))
        dilation = (options.get("dilation_h_factor", 1), options.get("dilation_w_factor", 1))
        kernel = (weight.shape[2], weight.shape[3])
        if options.get("padding") == "SAME":
            top, bottom = _same_padding(x.shape[1], kernel[0], stride[0], dilation[0])
            left, right = _same_padding(x.shape[2], kernel[1], stride[1], dilation[1])
        else:
            top = bottom = left = right = 0
        groups = x.shape[3] if depthwise else 1
        if not depthwise and weight.shape[1] != x.shape[3]:
            if x.shape[3] % weight.shape[1]:
                raise _refuse(graph, op, f"has {weight.shape[1]} filter channels for an input of "
                                         f"{x.shape[3]}")
            groups = x.shape[3] // weight.shape[1]
        module = _Conv(weight, bias, stride, dilation, (top, bottom, left, right), groups,
                       self._activation_of(graph, op))
        module._tflite_weight = w_tensor.index
        module._tflite_bias = b_tensor.index if b_tensor is not None else None
        return module, self._runtime(graph, op, [0])

    def _build_conv_2d(self, graph, op):
        return self._conv(graph, op, depthwise=False)

    def _build_depthwise_conv_2d(self, graph, op):
        return self._conv(graph, op, depthwise=True)

    def _build_fully_connected(self, graph, op):
        if op.options.get("weights_format", 0) not in (0, None):
            raise _refuse(graph, op, "uses shuffled weights")
        x = graph.tensors[op.inputs[0]]
        w_tensor, weight = self._weights(graph, op, 1, lambda w: w)
        b_tensor, bias = self._bias(graph, op)
        out_shape = _to_torch_shape(graph.tensors[op.outputs[0]].shape)
        shifted = next((p for p in self.raw_pools.values() if op.index in p.consumers), None)
        if shifted is not None:
            # its input is a raw-sum pool's codes read with zero point 0: the bias takes the
            # file's zero point times each row's weights (RawSumPool says why)
            rows = w_tensor.data.astype(np.int64).reshape(w_tensor.data.shape[0], -1).sum(1)
            codes = b_tensor.data.astype(np.int64) - shifted.zero_point * rows
            bias = torch.from_numpy((codes * np.asarray(b_tensor.scales, np.float64))
                                    .astype(np.float32))
        module = _Linear(weight, bias, len(x.shape), out_shape, self._activation_of(graph, op))
        module._tflite_weight = w_tensor.index
        module._tflite_bias = b_tensor.index if b_tensor is not None else None
        return module, self._runtime(graph, op, [0])

    def _elementwise(self, graph, op):
        out = graph.tensors[op.outputs[0]]
        constants, runtime = {}, []
        for slot, index in enumerate(op.inputs[:2]):
            tensor = graph.tensors[index]
            if tensor.data is not None:
                value = _dequantized(tensor)
                if value.ndim == 4:
                    value = np.transpose(value, (0, 3, 1, 2))
                elif value.ndim and len(out.shape) == 4:  # broadcast along NHWC's last axis
                    value = value.reshape((1,) * (4 - value.ndim) + value.shape)
                    value = np.transpose(value, (0, 3, 1, 2))
                constants[slot] = torch.from_numpy(np.ascontiguousarray(value))
            else:
                runtime.append(index)
        if not runtime:
            raise _refuse(graph, op, "has only constant inputs")
        module = _Elementwise(op.opcode, constants, self._activation_of(graph, op))
        module._tflite_constants = {slot: op.inputs[slot] for slot in constants}
        return module, tuple(runtime)

    _build_add = _build_mul = _build_sub = _elementwise

    def _pool(self, graph, op, kind: str):
        x = graph.tensors[op.inputs[0]]
        kernel, stride, (top, bottom, left, right) = _pool_window(graph, op)
        if top != bottom or left != right:
            raise _refuse(graph, op, f"pads its {kernel[0]}x{kernel[1]} window unevenly "
                                     f"(SAME on a {x.shape[1]}x{x.shape[2]} input)")
        activation = self._activation_of(graph, op)
        if kind == "avg":
            def function(t):
                y = F.avg_pool2d(t, kernel, stride, (top, left), count_include_pad=False)
                return activation(y) if activation is not None else y
        else:
            def function(t):
                y = F.max_pool2d(t, kernel, stride, (top, left))
                return activation(y) if activation is not None else y
        return _Function(function), self._runtime(graph, op, [0])

    def _build_average_pool_2d(self, graph, op):
        found = self.raw_pools.get(op.index)
        if found is None:
            return self._pool(graph, op, "avg")
        x = graph.tensors[op.inputs[0]]
        kernel, stride, padding = _pool_window(graph, op)  # padding all 0: none reaches a window
        channels, count = x.shape[3], kernel[0] * kernel[1]
        module = _Conv(torch.full((channels, 1, *kernel), 1.0 / count),
                       torch.full((channels,), float(found.scale) * found.zero_point), stride,
                       (1, 1), padding, channels, None)
        module._tflite_weight, module._tflite_bias = found.weight, found.bias
        return module, self._runtime(graph, op, [0])

    def _build_max_pool_2d(self, graph, op):
        return self._pool(graph, op, "max")

    def _build_reshape(self, graph, op):
        x = graph.tensors[op.inputs[0]]
        out = graph.tensors[op.outputs[0]]
        target = _to_torch_shape(out.shape)
        plain = len(x.shape) != 4 or (x.shape[1] * x.shape[2] == 1) or x.shape[3] == 1
        out_plain = len(out.shape) != 4 or (out.shape[1] * out.shape[2] == 1) or out.shape[3] == 1

        def function(t):
            if not plain:
                t = _to_nhwc(t)
            if plain and out_plain:
                return t.reshape(target)
            y = t.reshape(out.shape)
            return _from_nhwc(y) if len(out.shape) == 4 else y
        return _Function(function), self._runtime(graph, op, [0])

    _build_squeeze = _build_reshape

    def _build_softmax(self, graph, op):
        beta = float(op.options.get("beta", 1.0))
        rank = len(graph.tensors[op.inputs[0]].shape)
        dim = 1 if rank == 4 else -1
        return _Function(lambda t: torch.softmax(t * beta if beta != 1.0 else t, dim=dim)), \
            self._runtime(graph, op, [0])

    def _unary(self, function):
        def build(graph, op):
            return _Function(function), self._runtime(graph, op, [0])
        return build

    def _build_logistic(self, graph, op):
        return self._unary(torch.sigmoid)(graph, op)

    def _build_tanh(self, graph, op):
        return self._unary(torch.tanh)(graph, op)

    def _build_hard_swish(self, graph, op):
        return self._unary(F.hardswish)(graph, op)

    def _build_relu(self, graph, op):
        return self._unary(F.relu)(graph, op)

    def _build_relu6(self, graph, op):
        return self._unary(lambda t: F.hardtanh(t, 0.0, 6.0))(graph, op)

    def _build_relu_n1_to_1(self, graph, op):
        return self._unary(lambda t: F.hardtanh(t, -1.0, 1.0))(graph, op)

    def _build_leaky_relu(self, graph, op):
        alpha = float(op.options.get("alpha", 0.2))
        return self._unary(lambda t: F.leaky_relu(t, alpha))(graph, op)

    def _build_quantize(self, graph, op):
        # Between int8 tensors a QUANTIZE requantizes: the output's own scale, pinned by the
        # quantize stage, does it; from float it is where the program's int8 begins.
        return self._unary(lambda t: t.clone())(graph, op)

    def _build_dequantize(self, graph, op):
        source = graph.tensors[op.inputs[0]]
        if source.data is not None:  # a float16 or int8 constant made float for the next op
            raise _refuse(graph, op, "dequantizes a constant (weights stored as float16); "
                                     "convert the model with float32 or int8 weights")
        return self._unary(lambda t: t)(graph, op)

    def _build_mean(self, graph, op):
        rank = len(graph.tensors[op.inputs[0]].shape)
        axes = tuple(sorted(_axis(a, rank) for a in _constant_ints(graph, op, 1)))
        keep = bool(op.options.get("keep_dims", False))
        out_shape = _to_torch_shape(graph.tensors[op.outputs[0]].shape)

        def function(t):
            y = t.mean(dim=axes, keepdim=True)
            if keep:
                return y
            return y.reshape(out_shape) if rank != 4 or len(out_shape) != 4 else y
        return _Function(function), self._runtime(graph, op, [0])

    def _build_pad(self, graph, op):
        rank = len(graph.tensors[op.inputs[0]].shape)
        pads = _constant_ints(graph, op, 1)
        pairs = [(pads[2 * i], pads[2 * i + 1]) for i in range(rank)]
        if rank == 4:
            pairs = [pairs[0], pairs[3], pairs[1], pairs[2]]
        flat = []
        for before, after in reversed(pairs):  # F.pad: last dimension first
            flat += [before, after]
        value = 0.0
        if op.opcode == "PADV2" and len(op.inputs) > 2 and op.inputs[2] >= 0:
            constant = graph.tensors[op.inputs[2]]
            value = float(_dequantized(constant).reshape(-1)[0]) if constant.data is not None \
                else 0.0
        return _Function(lambda t: F.pad(t, flat, value=value)), self._runtime(graph, op, [0])

    _build_padv2 = _build_pad

    def _build_concatenation(self, graph, op):
        rank = len(graph.tensors[op.outputs[0]].shape)
        axis = _axis(int(op.options.get("axis", 0)), rank)
        activation = self._activation_of(graph, op)

        def function(*xs):
            y = torch.cat(xs, dim=axis)
            return activation(y) if activation is not None else y
        return _Function(function), self._runtime(graph, op, range(len(op.inputs)))

    def _build_transpose(self, graph, op):
        rank = len(graph.tensors[op.inputs[0]].shape)
        perm = _constant_ints(graph, op, 1)
        out_rank = len(graph.tensors[op.outputs[0]].shape)

        def function(t):
            y = _to_nhwc(t) if rank == 4 else t
            y = y.permute(*perm)
            return _from_nhwc(y) if out_rank == 4 else y
        return _Function(function), self._runtime(graph, op, [0])

    def _build_resize_nearest_neighbor(self, graph, op):
        if op.options.get("align_corners"):
            raise _refuse(graph, op, "aligns corners")
        size = tuple(_constant_ints(graph, op, 1))
        mode = "nearest-exact" if op.options.get("half_pixel_centers") else "nearest"
        source = graph.tensors[op.inputs[0]].shape
        if len(source) == 4 and len(size) == 2 and \
                all(n > 0 and m % n == 0 for n, m in zip(source[1:3], size)):
            # An integer upscale reads source pixel floor((d + 0.5) / k) = floor(d / k) either
            # way: plain nearest, which the Arm backend lowers to TOSA RESIZE (the NPU takes
            # 2x, 4x and 8x on the U55) where nearest-exact decomposes into an index gather
            # that stays in float on the CPU
            mode = "nearest"
        return _Function(lambda t: F.interpolate(t, size=size, mode=mode)), \
            self._runtime(graph, op, [0])

    def _build_tile(self, graph, op):
        multiples = _constant_ints(graph, op, 1)
        if len(multiples) == 4:  # NHWC -> NCHW
            multiples = [multiples[0], multiples[3], multiples[1], multiples[2]]
        return _Function(lambda t: t.repeat(*multiples)), self._runtime(graph, op, [0])

    def _build_strided_slice(self, graph, op):
        options = op.options
        if options.get("ellipsis_mask") or options.get("new_axis_mask") or options.get("offset"):
            raise _refuse(graph, op, "uses an ellipsis, new-axis or offset mask")
        rank = len(graph.tensors[op.inputs[0]].shape)
        shape = graph.tensors[op.inputs[0]].shape
        begin, end, strides = (_constant_ints(graph, op, i) for i in (1, 2, 3))
        begin_mask, end_mask = options.get("begin_mask", 0), options.get("end_mask", 0)
        shrink = options.get("shrink_axis_mask", 0)
        slices = []
        for axis in range(rank):
            b = None if begin_mask >> axis & 1 else begin[axis]
            e = None if end_mask >> axis & 1 else end[axis]
            if shrink >> axis & 1:
                b = begin[axis] % shape[axis]
                e, step = b + 1, 1
            else:
                step = strides[axis]
            slices.append(slice(b, e, step))
        out_shape = _to_torch_shape(graph.tensors[op.outputs[0]].shape)

        def function(t):
            y = _to_nhwc(t) if rank == 4 else t
            y = y[tuple(slices)]
            if shrink or len(out_shape) != y.dim():
                y = y.reshape(graph.tensors[op.outputs[0]].shape)
            return _from_nhwc(y) if y.dim() == 4 else y
        return _Function(function), self._runtime(graph, op, [0])


def _strided(value: np.ndarray, op: TfliteOperator, begin, end, strides) -> np.ndarray:
    options = op.options
    slices, shrink = [], options.get("shrink_axis_mask", 0)
    for axis in range(value.ndim):
        if shrink >> axis & 1:
            slices.append(begin[axis])
            continue
        slices.append(slice(None if options.get("begin_mask", 0) >> axis & 1 else begin[axis],
                            None if options.get("end_mask", 0) >> axis & 1 else end[axis],
                            strides[axis]))
    return value[tuple(slices)]


# Operators computed once when every input is a constant (or, for SHAPE, has a fixed shape):
# the shape arithmetic a converter writes for a flatten or a squeeze-excite reshape.
_FOLDED = {
    "SHAPE": lambda op, values, shapes: np.asarray(shapes[0], dtype=np.int32),
    "PACK": lambda op, values, shapes: np.stack(values, axis=int(op.options.get("axis", 0))),
    "CONCATENATION": lambda op, values, shapes: np.concatenate(
        values, axis=int(op.options.get("axis", 0))),
    "RESHAPE": None,  # the output tensor's shape
    "STRIDED_SLICE": lambda op, values, shapes: _strided(values[0], op, *values[1:4]),
}


def fold_constants(graph: TfliteGraph) -> TfliteGraph:
    """The graph with every operator of `_FOLDED` whose inputs are known computed into a
    constant (numpy, on the file's data); nothing else changes."""
    tensors, operators = list(graph.tensors), []
    for op in graph.operators:
        inputs = [tensors[i] for i in op.inputs if i >= 0]
        known = op.opcode == "SHAPE" or all(t.data is not None for t in inputs)
        if op.opcode not in _FOLDED or not known or len(op.outputs) != 1 \
                or op.outputs[0] in graph.outputs:
            operators.append(op)
            continue
        out = tensors[op.outputs[0]]
        if op.opcode == "RESHAPE":
            value = np.asarray(inputs[0].data).reshape(out.shape)
        else:
            value = np.asarray(_FOLDED[op.opcode](op, [None if t.data is None else
                                                       np.asarray(t.data) for t in inputs],
                                                  [t.shape for t in inputs]))
        if tuple(value.shape) != tuple(out.shape):
            raise _refuse(graph, op, f"computes a {list(value.shape)} constant where the file "
                                     f"says {list(out.shape)}")
        value = value.astype(out.dtype)
        value.setflags(write=False)
        tensors[out.index] = replace(out, data=value)
    return replace(graph, tensors=tuple(tensors), operators=tuple(operators))


def build(graph: TfliteGraph) -> tuple[TfliteModule, tuple[Tensor, ...], FileQuantization | None]:
    """The module, example inputs (zeros in the file's shapes, float) and, for a full-integer
    file, its quantization."""
    graph = fold_constants(graph)
    module = TfliteModule(graph).eval()
    example_inputs = tuple(torch.zeros(_to_torch_shape(graph.tensors[i].shape))
                           for i in graph.inputs)
    for i in graph.inputs:
        tensor = graph.tensors[i]
        if tensor.dtype.kind not in "fi":
            raise UserError(f"{graph.path.name}: input {tensor.name} is {tensor.dtype}; only "
                            "float32, int8 and int16 inputs can be rebuilt")
    quantization = file_quantization(graph, module) if graph.full_integer else None
    return module, example_inputs, quantization


def file_quantization(graph: TfliteGraph, module: TfliteModule) -> FileQuantization:
    by_tensor = {}
    for tensor in graph.tensors:
        if not tensor.quantized:
            continue
        axis = tensor.quantized_dimension
        if len(tensor.scales) > 1 and tensor.data is not None and tensor.data.ndim == 4:
            axis = 0  # per output channel: CONV's O of OHWI, DEPTHWISE's C of 1HWC both become 0
        elif len(tensor.shape) == 4:
            axis = _NHWC_TO_NCHW[axis]
        by_tensor[tensor.index] = TensorQuantization(
            tensor.index, tensor.name, tensor.scales, tensor.zero_points, axis,
            tensor.dtype.name)
    for pool in module.raw_pools.values():
        for index in pool.codes:  # the pool's output and its reshapes: zero point 0
            entry = by_tensor[index]
            by_tensor[index] = TensorQuantization(entry.tensor, entry.name, entry.scales,
                                                  (0,), entry.axis, entry.dtype)
        channels, weight_scale = pool.channels, 1.0 / (8 * pool.count)
        by_tensor[pool.weight] = TensorQuantization(
            pool.weight, f"{pool.name} (raw-sum weight)", (weight_scale,) * channels,
            (0,) * channels, 0, "int8")
        by_tensor[pool.bias] = TensorQuantization(
            pool.bias, f"{pool.name} (raw-sum bias)",
            (float(np.float32(pool.scale) * np.float32(weight_scale)),) * channels,
            (0,) * channels, 0, "int32")
    operator_outputs = {op.index: op.outputs[0] for op in graph.operators}
    on_cpu = {op.index: SOFTMAX_ON_CPU for op in graph.operators if op.opcode == "SOFTMAX"}
    on_cpu.update({op.index: _EVEN_POOL_ON_CPU.format(counts=", ".join(map(str, counts)))
                   for op in graph.operators if op.opcode == "AVERAGE_POOL_2D"
                   and op.index not in module.raw_pools
                   for counts in [pool_window_counts(graph, op)]
                   if any(count % 2 == 0 for count in counts)})
    return FileQuantization(
        str(graph.path), by_tensor, dict(module.attributes), graph.inputs, graph.outputs,
        operator_outputs, {op.index: op.opcode for op in graph.operators},
        {t.index: t.name for t in graph.tensors}, on_cpu)


SOFTMAX_ON_CPU = ("the model file's SOFTMAX runs on CMSIS-NN (arm_softmax_s8, TFLM's algorithm); "
                  "the Arm backend decomposes a softmax into int8 steps TFLM does not compute")
_EVEN_POOL_ON_CPU = (
    "the model file's AVERAGE_POOL_2D divides by an even element count ({counts}), so a sum "
    "can fall halfway between two steps: TFLM and CMSIS-NN round such a tie away from zero, an "
    "Ethos-U average pool (TOSA AVG_POOL2D) rounds it up; on CMSIS-NN the program computes "
    "what TFLM computes (MLPerf Tiny ResNet-8 on U85-256 with it on the NPU: 8 of 160 output "
    "values off, by up to 10 steps)")


def int8_inputs(graph: TfliteGraph, count: int, seed: int = 0) -> list[list[np.ndarray]]:
    """Random integer inputs in the file's own types and shapes (what TFLM is given)."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        sample = []
        for i in graph.inputs:
            tensor = graph.tensors[i]
            info = np.iinfo(tensor.dtype)
            sample.append(rng.integers(info.min, info.max + 1, size=tensor.shape,
                                       dtype=tensor.dtype))
        samples.append(sample)
    return samples
