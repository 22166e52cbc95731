"""What each op of a model costs to run, in the units a CPU cost model needs.

An OpShape is the int8-deployment view of one op: how many multiply-accumulates it does and
how many bytes it reads and writes. The CPU cost model (cost_models.cpu) turns it into cycles.

op_shapes_from_module() derives these from an eager float nn.Module with one forward pass, so
the cost model can be calibrated against published latencies of models we never lower. It
describes the graph the int8 flow deploys, not the float graph that ran:

- BatchNorm right after a conv or linear is folded into it (that op gains an int32 bias);
- ReLU / ReLU6 / Hardtanh right after a conv, linear, add or max pool is fused into that op's
  output clamp, as the Cortex-M backend's ActivationFusionPass does
  (executorch/backends/cortex_m/passes/activation_fusion_pass.py, FUSE_OPS);
- Dropout, Identity, Flatten and reshapes/views cost nothing;
- every activation is int8 (1 byte per element), weights are int8 and biases int32.
"""

from __future__ import annotations

import math
import operator
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

OP_KINDS: frozenset[str] = frozenset(
    {
        "conv",
        "depthwise_conv",
        "fully_connected",
        "batch_matmul",
        "avg_pool",
        "max_pool",
        "add",
        "mul",
        "softmax",
        "lut_activation",
        "relu",
        "pad",
        "transpose",
        "quantize",
        "dequantize",
        "copy",
    }
)

# int8 deployment: activations and weights are one byte, biases are int32 (CMSIS-NN s8 kernels).
ACTIVATION_BYTES = 1
WEIGHT_BYTES = 1
BIAS_BYTES = 4


@dataclass(frozen=True)
class OpShape:
    """One deployed op: its kind, work (MACs) and traffic (bytes), int8 unless stated.

    elements is the output element count; kernel_hw is (1, 1) for ops without a window.
    """

    kind: str
    macs: int
    input_bytes: int
    output_bytes: int
    weight_bytes: int = 0
    in_channels: int = 0
    out_channels: int = 0
    kernel_hw: tuple[int, int] = (1, 1)
    elements: int = 0
    # An elementwise op whose portable kernel walks its tensors index by index
    # (BroadcastIndexesRange, cost_models/cpu.py portable_cost): its tensor operands (inputs and
    # output), else 0; `broadcast` when an input is broadcast to the output's shape.
    walked_operands: int = 0
    broadcast: bool = False

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise ValueError(f"OpShape kind {self.kind!r} is not one of {sorted(OP_KINDS)}")
        for name in ("macs", "input_bytes", "output_bytes", "weight_bytes",
                     "in_channels", "out_channels", "elements", "walked_operands"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"OpShape.{name} must be a non-negative int, got {value!r}")
        if len(self.kernel_hw) != 2 or min(self.kernel_hw) < 1:
            raise ValueError(f"OpShape.kernel_hw must be two positive ints, got {self.kernel_hw!r}")


# Ops whose int8 output clamp absorbs a following ReLU/ReLU6/Hardtanh (ActivationFusionPass).
_FUSES_CLAMP = frozenset({"conv", "depthwise_conv", "fully_connected", "add", "max_pool"})
# Ops a following BatchNorm folds into (the quantizer folds BN into the preceding conv/linear).
_FOLDS_BATCHNORM = frozenset({"conv", "depthwise_conv", "fully_connected"})

_FREE_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Identity, nn.Flatten, nn.Unflatten)
_CLAMP_MODULES = (nn.ReLU, nn.ReLU6, nn.Hardtanh)
_LUT_MODULES = (nn.Sigmoid, nn.Tanh, nn.Hardswish, nn.Hardsigmoid, nn.SiLU, nn.GELU)
_BATCHNORM_MODULES = (nn.BatchNorm1d, nn.BatchNorm2d)


def _numel(value: Any) -> int:
    return value.numel() if isinstance(value, torch.Tensor) else 0


def _tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]


@dataclass
class _Pending:
    """An op being recorded; frozen into an OpShape once the forward pass is over, because a
    later BatchNorm may still add the folded int32 bias to it."""

    shape: OpShape
    has_bias: bool = False
    folded_bias_channels: int = 0

    def freeze(self) -> OpShape:
        extra = self.folded_bias_channels * BIAS_BYTES
        return replace(self.shape, weight_bytes=self.shape.weight_bytes + extra)


class _Recorder:
    def __init__(self) -> None:
        self.ops: list[_Pending] = []
        # id(tensor) -> (tensor, producing op). The tensor is held so its id is not reused by a
        # later allocation during the pass.
        self._producers: dict[int, tuple[torch.Tensor, _Pending]] = {}
        self.module_depth = 0

    def producer(self, tensor: Any) -> _Pending | None:
        if not isinstance(tensor, torch.Tensor):
            return None
        entry = self._producers.get(id(tensor))
        return entry[1] if entry is not None and entry[0] is tensor else None

    def mark(self, tensor: Any, pending: _Pending) -> None:
        if isinstance(tensor, torch.Tensor):
            self._producers[id(tensor)] = (tensor, pending)

    def emit(self, shape: OpShape, output: Any, has_bias: bool = False) -> None:
        pending = _Pending(shape, has_bias)
        self.ops.append(pending)
        self.mark(output, pending)

    def clamp(self, source: Any, output: Any) -> None:
        """A ReLU-like clamp: free if fused into its producer, else a standalone relu op."""
        producer = self.producer(source)
        if producer is not None and producer.shape.kind in _FUSES_CLAMP:
            self.mark(output, producer)
            return
        self.emit(_elementwise("relu", [source], output), output)

    def batchnorm(self, source: torch.Tensor, output: torch.Tensor, channels: int) -> None:
        producer = self.producer(source)
        if producer is not None and producer.shape.kind in _FOLDS_BATCHNORM:
            if producer.folded_bias_channels == 0 and not producer.has_bias:
                producer.folded_bias_channels = channels
            self.mark(output, producer)
            return
        # A BatchNorm with nothing to fold into runs as x * scale + shift.
        scaled = _elementwise("mul", [source], output)
        self.emit(scaled, output)
        self.emit(_elementwise("add", [output], output), output)


def _elementwise(kind: str, inputs: Sequence[Any], output: torch.Tensor) -> OpShape:
    elements = output.numel()
    return OpShape(
        kind=kind,
        macs=0,
        input_bytes=sum(_numel(t) for t in inputs) * ACTIVATION_BYTES,
        output_bytes=elements * ACTIVATION_BYTES,
        elements=elements,
        in_channels=output.shape[1] if output.dim() > 1 else 0,
        out_channels=output.shape[1] if output.dim() > 1 else 0,
    )


def _conv_shape(module: nn.Conv1d | nn.Conv2d, x: torch.Tensor, y: torch.Tensor) -> tuple[OpShape, bool]:
    kernel = tuple(module.kernel_size)
    kernel_hw = (kernel[0], kernel[1]) if len(kernel) == 2 else (1, kernel[0])
    cin, cout, groups = module.in_channels, module.out_channels, module.groups
    macs = y.numel() * (cin // groups) * kernel_hw[0] * kernel_hw[1]
    depthwise = groups > 1 and groups == cin
    has_bias = module.bias is not None
    weight_bytes = module.weight.numel() * WEIGHT_BYTES + (cout * BIAS_BYTES if has_bias else 0)
    shape = OpShape(
        kind="depthwise_conv" if depthwise else "conv",
        macs=macs,
        input_bytes=x.numel() * ACTIVATION_BYTES,
        output_bytes=y.numel() * ACTIVATION_BYTES,
        weight_bytes=weight_bytes,
        in_channels=cin,
        out_channels=cout,
        kernel_hw=kernel_hw,
        elements=y.numel(),
    )
    return shape, has_bias


def _linear_shape(module: nn.Linear, x: torch.Tensor, y: torch.Tensor) -> tuple[OpShape, bool]:
    has_bias = module.bias is not None
    shape = OpShape(
        kind="fully_connected",
        macs=y.numel() * module.in_features,
        input_bytes=x.numel() * ACTIVATION_BYTES,
        output_bytes=y.numel() * ACTIVATION_BYTES,
        weight_bytes=module.weight.numel() * WEIGHT_BYTES
        + (module.out_features * BIAS_BYTES if has_bias else 0),
        in_channels=module.in_features,
        out_channels=module.out_features,
        elements=y.numel(),
    )
    return shape, has_bias


def _pool_shape(kind: str, x: torch.Tensor, y: torch.Tensor, kernel_size: Any = None) -> OpShape:
    if kernel_size is not None:
        size = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        kernel_hw = (size[0], size[-1]) if len(size) == 2 else (1, size[0])
    elif x.dim() == 4:
        # An adaptive pool's window, as the fixed pool it deploys as sees it (integer ratio).
        kernel_hw = (max(1, x.shape[-2] // y.shape[-2]), max(1, x.shape[-1] // y.shape[-1]))
    else:
        kernel_hw = (1, max(1, x.shape[-1] // y.shape[-1]))
    return OpShape(
        kind=kind,
        macs=0,
        input_bytes=x.numel() * ACTIVATION_BYTES,
        output_bytes=y.numel() * ACTIVATION_BYTES,
        in_channels=x.shape[1],
        out_channels=y.shape[1],
        kernel_hw=kernel_hw,
        elements=y.numel(),
    )


def _module_hook(recorder: _Recorder) -> Callable[[nn.Module, tuple, Any], None]:
    def hook(module: nn.Module, inputs: tuple, output: Any) -> None:
        recorder.module_depth -= 1
        x = inputs[0] if inputs else None
        if isinstance(module, _FREE_MODULES):
            producer = recorder.producer(x)
            if producer is not None:
                recorder.mark(output, producer)
        elif isinstance(module, (nn.Conv1d, nn.Conv2d)):
            shape, has_bias = _conv_shape(module, x, output)
            recorder.emit(shape, output, has_bias)
        elif isinstance(module, nn.Linear):
            shape, has_bias = _linear_shape(module, x, output)
            recorder.emit(shape, output, has_bias)
        elif isinstance(module, _BATCHNORM_MODULES):
            recorder.batchnorm(x, output, module.num_features)
        elif isinstance(module, (nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)):
            recorder.emit(_pool_shape("avg_pool", x, output, getattr(module, "kernel_size", None)), output)
        elif isinstance(module, (nn.MaxPool1d, nn.MaxPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d)):
            recorder.emit(_pool_shape("max_pool", x, output, getattr(module, "kernel_size", None)), output)
        elif isinstance(module, _CLAMP_MODULES):
            recorder.clamp(x, output)
        elif isinstance(module, _LUT_MODULES):
            recorder.emit(_elementwise("lut_activation", [x], output), output)
        elif isinstance(module, nn.Softmax):
            recorder.emit(_elementwise("softmax", [x], output), output)
        elif isinstance(module, (nn.ZeroPad2d, nn.ConstantPad2d, nn.ConstantPad1d)):
            recorder.emit(_elementwise("pad", [x], output), output)

    return hook


def _enter_module(recorder: _Recorder) -> Callable[[nn.Module, tuple], None]:
    def pre_hook(module: nn.Module, inputs: tuple) -> None:
        recorder.module_depth += 1

    return pre_hook


_HANDLED_MODULES = (
    _FREE_MODULES
    + _CLAMP_MODULES
    + _LUT_MODULES
    + _BATCHNORM_MODULES
    + (
        nn.Conv1d, nn.Conv2d, nn.Linear, nn.Softmax,
        nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
        nn.MaxPool1d, nn.MaxPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
        nn.ZeroPad2d, nn.ConstantPad2d, nn.ConstantPad1d,
    )
)

# Functions called directly in a forward() (outside the modules above), by the op they deploy as.
_BINARY_FUNCTIONS: dict[Any, str] = {
    torch.add: "add", torch.Tensor.add: "add", torch.Tensor.__add__: "add",
    torch.Tensor.__radd__: "add", torch.Tensor.__iadd__: "add", torch.Tensor.add_: "add",
    torch.sub: "add", torch.Tensor.sub: "add", torch.Tensor.__sub__: "add",
    torch.Tensor.__rsub__: "add", torch.Tensor.__isub__: "add", torch.Tensor.sub_: "add",
    torch.mul: "mul", torch.Tensor.mul: "mul", torch.Tensor.__mul__: "mul",
    torch.Tensor.__rmul__: "mul", torch.Tensor.__imul__: "mul", torch.Tensor.mul_: "mul",
    operator.add: "add", operator.mul: "mul",
    # Comparisons, min/max and select are one elementwise pass over two inputs, the add class
    # (the Cortex-M backend lowers minimum/maximum to CMSIS-NN elementwise kernels).
    torch.gt: "add", torch.Tensor.gt: "add", torch.Tensor.__gt__: "add",
    torch.lt: "add", torch.Tensor.lt: "add", torch.Tensor.__lt__: "add",
    torch.ge: "add", torch.Tensor.__ge__: "add", torch.le: "add", torch.Tensor.__le__: "add",
    torch.minimum: "add", torch.maximum: "add", torch.where: "add",
}
# Functions whose fresh output is only a dtype/memory-format change of their input.
_NOT_COMPUTE = frozenset({torch.Tensor.contiguous, torch.Tensor.clone, torch.clone, torch.Tensor.to,
                          torch.Tensor.float, torch.Tensor.type_as, torch.Tensor.detach})
_CLAMP_FUNCTIONS = frozenset({
    F.relu, F.relu_, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_,
    F.relu6, F.hardtanh, F.hardtanh_, torch.clamp, torch.Tensor.clamp, torch.Tensor.clamp_,
})
_UNARY_FUNCTIONS: dict[Any, str] = {
    torch.sigmoid: "lut_activation", torch.Tensor.sigmoid: "lut_activation",
    F.sigmoid: "lut_activation", torch.tanh: "lut_activation", torch.Tensor.tanh: "lut_activation",
    F.tanh: "lut_activation", F.hardswish: "lut_activation", F.hardsigmoid: "lut_activation",
    F.silu: "lut_activation", F.gelu: "lut_activation",
    F.softmax: "softmax", torch.softmax: "softmax", torch.Tensor.softmax: "softmax",
    F.pad: "pad",
    torch.permute: "transpose", torch.Tensor.permute: "transpose",
    torch.transpose: "transpose", torch.Tensor.transpose: "transpose",
    torch.cat: "copy", torch.concat: "copy",
}
_POOL_FUNCTIONS: dict[Any, str] = {
    F.avg_pool2d: "avg_pool", F.adaptive_avg_pool2d: "avg_pool",
    F.max_pool2d: "max_pool", F.adaptive_max_pool2d: "max_pool",
}
_MATMUL_FUNCTIONS = frozenset({torch.matmul, torch.Tensor.matmul, torch.bmm, torch.Tensor.__matmul__})


class _FunctionRecorder(TorchFunctionMode):
    """Records ops written as function calls in forward() (residual adds, F.relu, ...).

    Calls made inside a hooked module are that module's own implementation and are skipped.
    """

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder
        self.uncosted: set[str] = set()  # compute functions with no OpShape kind (sort, topk ...)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        if self.recorder.module_depth == 0:
            if isinstance(output, torch.Tensor):
                self._record(func, args, output)
            elif isinstance(output, tuple):
                # Multi-output functions computing new tensors (sort, topk ...) have no OpShape
                # kind; ones returning views (split, chunk, unbind) cost nothing.
                source = next((a for a in args if isinstance(a, torch.Tensor)), None)
                fresh = [o for o in output if isinstance(o, torch.Tensor)
                         and (source is None or not _shares_storage(source, o))]
                if fresh:
                    self.uncosted.add(getattr(func, "__name__", str(func)))
        return output

    def _record(self, func: Any, args: tuple, output: torch.Tensor) -> None:
        recorder = self.recorder
        if func in _BINARY_FUNCTIONS:
            # torch.where(cond, x, y) reads its two value inputs; the others read args 0 and 1.
            inputs = args[1:3] if func is torch.where else args[:2]
            recorder.emit(_elementwise(_BINARY_FUNCTIONS[func], _tensors(inputs), output), output)
        elif func in _CLAMP_FUNCTIONS:
            recorder.clamp(args[0], output)
        elif func in _UNARY_FUNCTIONS:
            inputs = args[0] if func in (torch.cat, torch.concat) else args[:1]
            recorder.emit(_elementwise(_UNARY_FUNCTIONS[func], _tensors(inputs), output), output)
        elif func in _POOL_FUNCTIONS:
            adaptive = func in (F.adaptive_avg_pool2d, F.adaptive_max_pool2d)
            kernel_size = None if adaptive or len(args) < 2 else args[1]
            recorder.emit(_pool_shape(_POOL_FUNCTIONS[func], args[0], output, kernel_size), output)
        elif func in _MATMUL_FUNCTIONS:
            lhs, rhs = args[0], args[1]
            recorder.emit(
                OpShape(
                    kind="batch_matmul",
                    macs=output.numel() * lhs.shape[-1],
                    input_bytes=(lhs.numel() + rhs.numel()) * ACTIVATION_BYTES,
                    output_bytes=output.numel() * ACTIVATION_BYTES,
                    in_channels=lhs.shape[-1],
                    out_channels=output.shape[-1],
                    elements=output.numel(),
                ),
                output,
            )
        else:
            source = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if source is not None and _shares_storage(source, output):
                # A view (flatten, reshape, squeeze, getitem ...) moves no data in the deployed
                # graph; it passes its producer on so a later ReLU can still fuse.
                producer = recorder.producer(source)
                if producer is not None and source.numel() == output.numel():
                    recorder.mark(output, producer)
            elif source is not None and func not in _NOT_COMPUTE:
                self.uncosted.add(getattr(func, "__name__", str(func)))


def _shares_storage(source: torch.Tensor, output: torch.Tensor) -> bool:
    return source.untyped_storage().data_ptr() == output.untyped_storage().data_ptr()


def op_shapes_from_module(module: nn.Module, example_inputs: tuple[Any, ...]) -> list[OpShape]:
    """The int8-deployment ops of `module`, in execution order, from one float forward pass.

    Leaf modules must be of a kind listed here (conv, linear, pools, BatchNorm, activations,
    softmax, pads, dropout/identity/flatten); any other leaf module with parameters raises
    ValueError rather than being silently left out of the cost. A function call outside the
    tables above that computes a new tensor (sort, topk ...) is left out with a warning.
    """
    # A leaf module we do not map but whose parameters feed its compute (LSTM, LayerNorm,
    # Embedding ...) would silently vanish from the cost; parameter-free ones are fine, their
    # function calls are recorded.
    unknown = sorted(
        {
            type(m).__name__
            for m in module.modules()
            if not list(m.children())
            and not isinstance(m, _HANDLED_MODULES)
            and list(m.parameters(recurse=False))
        }
    )
    if unknown:
        raise ValueError(f"op_shapes_from_module: no OpShape mapping for module type(s) {unknown}")

    recorder = _Recorder()
    handles = []
    for m in module.modules():
        if isinstance(m, _HANDLED_MODULES):
            handles.append(m.register_forward_pre_hook(_enter_module(recorder)))
            handles.append(m.register_forward_hook(_module_hook(recorder)))
    was_training = module.training
    module.eval()
    functions = _FunctionRecorder(recorder)
    try:
        with torch.no_grad(), functions:
            module(*example_inputs)
    finally:
        for handle in handles:
            handle.remove()
        module.train(was_training)
    if functions.uncosted:
        warnings.warn(
            f"op_shapes_from_module: no OpShape kind for {sorted(functions.uncosted)}; left out of the cost",
            stacklevel=2,
        )
    return [pending.freeze() for pending in recorder.ops]


def total_macs(shapes: Sequence[OpShape]) -> int:
    return sum(s.macs for s in shapes)


def im2col_bytes(op: OpShape) -> int:
    """Input bytes CMSIS-NN gathers into its im2col buffer: one C_in slice per output pixel per
    kernel tap (arm_convolve_s8.c and arm_depthwise_conv_s8_opt.c copy `input_ch` bytes per tap).

    A 1x1 conv reads its input in place (arm_convolve_1x1_s8_fast, or arm_convolve_1x1_s8 when
    strided or padded), with no gather.
    """
    if op.kind == "depthwise_conv":
        return op.macs
    if op.kind == "conv" and op.kernel_hw != (1, 1) and op.out_channels:
        return op.macs // op.out_channels
    return 0


def im2col_taps(op: OpShape) -> int:
    """How many C_in slices im2col_bytes is gathered in: one per output pixel per kernel tap,
    each a bounds check, an address computation and a copy call in the kernel's gather loop."""
    if im2col_bytes(op) == 0 or not op.out_channels:
        return 0
    return op.elements // op.out_channels * math.prod(op.kernel_hw)


# Elementwise ops of two or more tensors, whose portable kernels broadcast them
# (kernels/portable/cpu/util/elementwise_util.h). `where` mixes a bool condition with its
# values, so its kernel always takes the generic path that walks every tensor by index.
_BROADCASTING = frozenset({
    "add", "sub", "rsub", "mul", "div", "where", "eq", "ne", "lt", "le", "gt", "ge", "maximum",
    "minimum", "pow", "atan2", "remainder", "fmod", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "floor_divide", "hypot", "copysign"})
_ALWAYS_WALKED = frozenset({"where"})


def index_walk(op: str, input_shapes, output_shape) -> tuple[int, bool]:
    """(tensor operands its portable kernel walks by index, whether an input is broadcast) of
    the elementwise op `op` ("aten.where.self") on tensors of `input_shapes` (the tensor inputs
    only) giving `output_shape`; (0, False) for an op on the kernel's fast path (same shapes,
    one dtype) and for every other op."""
    parts = str(op).split(".")
    base = parts[1] if len(parts) > 1 and parts[0] in ("aten", "edge") else parts[0]
    shapes = [tuple(shape) for shape in input_shapes or ()]
    if (base not in _BROADCASTING or len(shapes) < 2 or output_shape is None
            or parts[-1] == "Scalar"):  # a Scalar overload: one tensor, whatever the graph held
        return 0, False
    broadcast = any(shape != tuple(output_shape) for shape in shapes)
    if not broadcast and base not in _ALWAYS_WALKED:
        return 0, False
    return len(shapes) + 1, broadcast


def walked_op(op: str, kernel: str | None) -> str:
    """The op whose kernel a row runs, for index_walk: its portable kernel where the row names
    one (a comparison the CPU route gave a Scalar overload: "aten.gt.Scalar" for
    "aten.gt.Tensor"), else the op."""
    return kernel if kernel and str(kernel).startswith("aten.") else op

