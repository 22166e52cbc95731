"""Host execution of the CPU ops of a `.pte`, byte for byte as the device kernels read and write.

Every tensor arrives as raw bytes laid out by its dim_order (`RawTensor`). What a kernel makes of
those bytes depends on the kernel, not on the tensor, and that is the point of this module:

- CMSIS-NN kernels (`cortex_m::` ops with `CPU_KERNELS[op].reads_nhwc`) read and write 4-D
  activations as NHWC bytes whatever dim_order the tensor records; weights and the other
  operands as the row-major bytes of their sizes. The values are then computed by ExecuTorch's
  reference implementations (`executorch/backends/cortex_m/ops/operators.py`, fixed-point,
  CMSIS-NN requantization), called through their functional overloads because the `.out`
  overloads in the program have no Python implementation.
- The other `cortex_m::` kernels (quantize, dequantize, LUT activation, add, mul, div,
  minimum, maximum, transpose, softmax, linear, batch matmul) walk the raw bytes as the
  row-major layout of the sizes, checking no dim_order; add and mul with a channels-only
  operand (`is_channel_broadcast`) walk the other operand and the output as NHWC; transpose
  refuses an input of rank 0 or above 4 (`kMaxSupportedDims`).
- Portable elementwise kernels (`kernels/portable/cpu/util/elementwise_util.h`,
  `broadcast_indexes_range.h`) first require all operands to share a dim_order family
  (`tensors_have_same_dim_order`: all contiguous or all channels-last), then walk the raw bytes
  in lockstep when no operand is broadcast; when one is, they read inputs through their strides
  and write the output as row-major bytes of its sizes.
- `view_copy` is a memcpy that requires the default dim_order; the dim_order copies convert
  between layouts; cat, split_copy, split_with_sizes_copy and unbind_copy (tensor lists in or
  out) check the dim-order family, then walk the raw bytes by the sizes (getLeadingDims);
  every other aten op is computed by torch on the tensors read by their dim_order (the
  portable kernels' contract) and written back by the output's dim_order.

A check a device kernel would fail is returned as a `KernelFault` (the device returns
InvalidArgument at that instruction, or cannot load the program when the kernel is missing); the
value is still computed as if the check had passed, so the rest of the program can be compared.
Its text is the catalogue entry of that check (kernels/faults.py, registered in
partitioners/reasons.py), the one the plan shows for the same rule.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from kernels import upstream_runtime
from kernels.catalogue import CHANNELS_LAST, CPU_KERNELS
from kernels.faults import fault_text

# Portable kernels built on apply_{uni,bi,tri}tensor_elementwise_fn.
_ELEMENTWISE = frozenset({
    "aten::add", "aten::sub", "aten::mul", "aten::div", "aten::rsub", "aten::remainder",
    "aten::fmod", "aten::pow", "aten::atan2", "aten::maximum", "aten::minimum",
    "aten::floor_divide", "aten::gt", "aten::ge", "aten::lt", "aten::le", "aten::eq", "aten::ne",
    "aten::bitwise_and", "aten::bitwise_or", "aten::bitwise_xor", "aten::logical_and",
    "aten::logical_or", "aten::logical_xor", "aten::where", "aten::clamp",
})
_DIM_ORDER_COPIES = frozenset({"dim_order_ops::_to_dim_order_copy", "dim_order_ops::_clone_dim_order"})
# Portable kernels that index their tensors with coordinateToIndex / indexToCoordinate
# (runtime/core/exec_aten/util/tensor_util.h: offsets from getTrailingDims of the *sizes*), so
# the raw bytes are read and written as the row-major layout of the sizes whatever the
# dim_order. gather and scatter check no dim order at all; flip, roll and permute_copy accept
# "all contiguous or all channels-last" and then walk channels-last bytes as if contiguous
# (measured: a gather along channels of a channels-last int8 tensor read the NHWC bytes as NCHW
# in the host runtime and on QEMU's Cortex-M55).
SIZES_WALK_KERNELS = frozenset({"aten::gather", "aten::scatter", "aten::scatter_add",
                                "aten::index_put", "aten::flip", "aten::roll",
                                "aten::permute_copy"})
# Portable kernels that take or return tensor lists and walk them with getLeadingDims.
_LEADING_DIMS_KERNELS = frozenset({"aten::cat", "aten::split_copy", "aten::split_with_sizes_copy",
                                   "aten::unbind_copy"})
# cortex_m kernels that walk their tensors' bytes as the row-major layout of the sizes: their
# op_*.cpp hand `sizes()` and data pointers to CMSIS-NN and never read the dim_order (the
# elementwise ones: "TBD (#16032): Validate dim_order"). Channel-broadcast add/mul are the
# exception handled below. `pad` (is_channels_last_tensor) is dim-order aware.
RAW_CMSIS = frozenset({"quantize_per_tensor", "dequantize_per_tensor", "quantized_activation",
                        "quantized_add", "quantized_mul", "quantized_div", "minimum", "maximum",
                        "transpose", "softmax", "quantized_linear", "quantized_batch_matmul"})
# op_transpose.cpp: `kMaxSupportedDims = 4`; an input of rank 0 or above it fails the kernel
# ("transpose_out: expected tensor rank in [1, 4], got N", InvalidArgument).
TRANSPOSE_MAX_RANK = 4


def transpose_rank_supported(rank: int) -> bool:
    """Whether cortex_m::transpose (op_transpose.cpp) accepts an input of `rank` dimensions."""
    return 1 <= rank <= TRANSPOSE_MAX_RANK


# op_quantized_add.cpp / op_quantized_mul.cpp: when one 4-D operand holds only the channels
# (`is_channel_broadcast`), the kernel adds that C-vector to every C-element chunk of the other
# operand's bytes, i.e. reads the big operand and writes the output as NHWC.
_CHANNEL_BROADCAST_CMSIS = frozenset({"quantized_add", "quantized_mul"})


class KernelError(Exception):
    """An op the twin has no host execution for."""


@dataclass(frozen=True)
class RawTensor:
    """A tensor EValue: its metadata and a writable view of exactly its bytes."""

    dtype: torch.dtype
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    data: memoryview

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def nbytes(self) -> int:
        return self.numel * _itemsize(self.dtype)

    @property
    def physical_shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[d] for d in self.dim_order)


@dataclass(frozen=True)
class KernelFault:
    """A check the device kernel performs and this call fails, worded by its catalogue entry."""

    op: str
    check: str  # the device kernel's own check, e.g. "tensors_have_same_dim_order"
    message: str
    key: str = ""  # the catalogue entry (kernels/faults.py) the message comes from


def device_fault(key: str, op: str, check: str, **fields) -> KernelFault:
    """The KernelFault of catalogue entry `key` (kernels/faults.py) for the kernel of `op`, its
    text filled with `op` and `fields`."""
    return KernelFault(op, check, fault_text(key, op=op, **fields), key)


@dataclass(frozen=True)
class LayoutRead:
    """A kernel reading (or writing) a tensor's bytes in a layout other than its dim_order."""

    argument: str
    dim_order: tuple[int, ...]
    used_as: str  # e.g. "NHWC"
    direction: str  # "read" | "write"


@dataclass(frozen=True)
class KernelResult:
    semantics: str  # how the bytes were read and computed, for the trace
    faults: tuple[KernelFault, ...]
    layout_reads: tuple[LayoutRead, ...]


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _flat(t: RawTensor) -> torch.Tensor:
    if t.nbytes == 0:
        return torch.empty(0, dtype=t.dtype)
    return torch.frombuffer(t.data, dtype=t.dtype, count=t.numel)


def read_by_dim_order(t: RawTensor) -> torch.Tensor:
    """The logical tensor the bytes hold when read by the recorded dim_order."""
    inverse = tuple(int(i) for i in np.argsort(t.dim_order))
    return _flat(t).reshape(t.physical_shape).permute(inverse).clone()


def read_row_major(t: RawTensor) -> torch.Tensor:
    """The bytes read as the row-major layout of the sizes, ignoring dim_order."""
    return _flat(t).reshape(t.sizes).clone()


def read_nhwc(t: RawTensor) -> torch.Tensor:
    """A 4-D tensor's bytes read as NHWC for sizes (N, C, H, W): how CMSIS-NN sees activations."""
    n, c, h, w = t.sizes
    return _flat(t).reshape(n, h, w, c).permute(0, 3, 1, 2).clone()


def _store(t: RawTensor, physical: torch.Tensor) -> None:
    if physical.numel() != t.numel:
        raise KernelError(f"kernel produced {physical.numel()} elements for a {list(t.sizes)} "
                          "output")
    data = physical.to(t.dtype).contiguous().numpy().tobytes()
    t.data[:len(data)] = data


def write_by_dim_order(t: RawTensor, value: torch.Tensor) -> None:
    _store(t, value.reshape(t.sizes).permute(t.dim_order))


def write_row_major(t: RawTensor, value: torch.Tensor) -> None:
    _store(t, value.reshape(t.sizes))


def write_nhwc(t: RawTensor, value: torch.Tensor) -> None:
    _store(t, value.reshape(t.sizes).permute(0, 2, 3, 1))


def layouts_differ(sizes, order_a, order_b) -> bool:
    """Whether two dim_orders place the bytes differently (size-1 dims can move freely)."""
    keep_a = [d for d in order_a if sizes[d] != 1]
    keep_b = [d for d in order_b if sizes[d] != 1]
    return keep_a != keep_b


@functools.lru_cache(maxsize=1)
def portable_kernel_names() -> frozenset[str]:
    """`ns::name.overload` of every kernel in ExecuTorch's portable library (host build)."""
    return upstream_runtime.operator_names()


class _ExactIntegerFunctional:
    """`torch.nn.functional` with a `conv2d` that takes integer tensors at any dilation.

    Upstream's Python references of the CMSIS-NN convolutions (executorch/backends/cortex_m/ops/
    operators.py) accumulate with `F.conv2d` on int32 tensors; torch 2.13 has no integer
    dilated convolution ("slow_conv_dilated<>" not implemented for 'Int'), so a dilated
    depthwise conv (a DS-TCN keyword spotter) could not be computed. Here it runs in float64,
    which holds every int8 x int8 accumulation exactly (|sum| < 2**53), and is rounded back."""

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    @staticmethod
    def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        dilated = any(d != 1 for d in ((dilation,) if isinstance(dilation, int) else dilation))
        if input.dtype.is_floating_point or not dilated:
            return torch.nn.functional.conv2d(input, weight, bias, stride, padding, dilation,
                                              groups)
        out = torch.nn.functional.conv2d(
            input.double(), weight.double(), None if bias is None else bias.double(), stride,
            padding, dilation, groups)
        return torch.round(out).to(input.dtype)


@contextlib.contextmanager
def _integer_convolutions():
    from executorch.backends.cortex_m.ops import operators  # lazy: heavy (executorch)

    original = operators.F
    operators.F = _ExactIntegerFunctional()
    try:
        yield
    finally:
        operators.F = original


@functools.lru_cache(maxsize=None)
def op_overload(name: str, overload: str):
    """The torch OpOverload for a program operator, registering the namespaces it needs."""
    namespace, op = name.split("::")
    if namespace == "cortex_m":
        # Importing the passes package first avoids a circular import inside operators.py.
        import executorch.backends.cortex_m.passes  # noqa: F401  # lazy: heavy (executorch; before operators)
        import executorch.backends.cortex_m.ops.operators  # noqa: F401  # lazy: heavy (executorch)
    elif namespace == "quantized_decomposed":
        # A float fallback's runtime weight dequantize (dequantize_per_channel.out): its `.out`
        # overload is registered by ExecuTorch's quantized kernels library, which a fresh
        # verify process has not loaded.
        import executorch.kernels.quantized  # noqa: F401  # lazy: heavy (executorch)
    elif namespace == "orchestrate":
        import kernels.s16  # noqa: F401  # lazy: heavy (torch.library: our s16 operators' schemas)
    elif namespace == "dim_order_ops":
        import executorch.exir.passes.dim_order_ops_registry  # noqa: F401  # lazy: heavy (executorch)
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        raise KernelError(f"no torch registration for {name}.{overload or 'default'}") from None


def _is_out(argument) -> bool:
    return bool(argument.kwarg_only and argument.alias_info is not None
                and argument.alias_info.is_write)


def _scalar_type(value):
    from executorch.exir.scalar_type import ScalarType  # lazy: heavy (executorch)
    from executorch.exir.tensor import get_scalar_type  # lazy: heavy (executorch)

    return get_scalar_type(ScalarType(value)) if isinstance(value, int) else value


def _convert(argument, value):
    """A program value as torch expects it for this schema argument (tensors excluded)."""
    real = str(getattr(argument, "real_type", argument.type))
    if "ScalarType" in real and value is not None:
        return _scalar_type(value)
    if "Layout" in real and isinstance(value, int):
        return torch.strided
    return value


def _tensor_args(schema, args):
    return [(a, v) for a, v in zip(schema.arguments, args)
            if isinstance(v, RawTensor) and not _is_out(a)]


def _is_tensor_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, RawTensor) for v in value)


def _is_optional_tensor_list(value) -> bool:
    return isinstance(value, list) and any(isinstance(v, RawTensor) for v in value) and \
        all(v is None or isinstance(v, RawTensor) for v in value)


def _outs(schema, args) -> list[tuple[object, RawTensor | list[RawTensor]]]:
    """(argument, tensor) per out argument; a `Tensor(a!)[] out` (split, unbind) gives the
    list of its tensors."""
    outs = []
    for argument, value in zip(schema.arguments, args):
        if _is_out(argument):
            if not isinstance(value, RawTensor) and not _is_tensor_list(value):
                raise KernelError(f"out argument {argument.name} is neither a tensor nor a "
                                  "tensor list")
            outs.append((argument, value))
    return outs


def _out_tensors(outs) -> list[RawTensor]:
    return [t for _, value in outs for t in (value if isinstance(value, list) else [value])]


def _empty_like(value):
    if isinstance(value, list):
        return [torch.empty(v.sizes, dtype=v.dtype) for v in value]
    return torch.empty(value.sizes, dtype=value.dtype)


def same_dim_order_family(dim_orders) -> bool:
    """`tensors_have_same_dim_order` (runtime/core/exec_aten/util/tensor_util_portable.cpp):
    all tensors contiguous, or all channels-last; a 1-D constant beside a channels-last 4-D
    activation fails it."""
    def contiguous(order):
        return tuple(order) == tuple(range(len(order)))

    def channels_last(order):
        n = len(order)
        return n in (4, 5) and tuple(order) == (0, *range(2, n), 1)

    orders = list(dim_orders)
    return all(contiguous(o) for o in orders) or all(channels_last(o) for o in orders)


def is_portable_elementwise(op_key: str) -> bool:
    """`aten::gt` style key of an op whose portable kernel applies the dim-order check above."""
    return op_key in _ELEMENTWISE


def _same_dim_order_family(tensors: list[RawTensor]) -> bool:
    return same_dim_order_family(t.dim_order for t in tensors)


def _drop_leading_ones(sizes) -> tuple[int, ...]:
    sizes = list(sizes)
    while sizes and sizes[0] == 1:
        sizes.pop(0)
    return tuple(sizes)


def _missing_kernel(key: str) -> tuple[KernelFault, ...]:
    if key in portable_kernel_names():
        return ()
    return (device_fault("missing-kernel", key, "kernel registered"),)


def _is_channel_broadcast(tensors: list[RawTensor]) -> bool:
    """`is_channel_broadcast` (backends/cortex_m/ops/cortex_m_ops_common.h)."""
    if len(tensors) != 2 or len(tensors[0].sizes) != 4 or len(tensors[1].sizes) != 4:
        return False
    a, b = tensors
    if a.sizes[1] != b.sizes[1]:
        return False
    return a.numel == a.sizes[1] or b.numel == b.sizes[1]


def _cmsis_faults(op: str, key: str, schema, args) -> tuple[KernelFault, ...]:
    """The checks a cortex_m kernel performs that this call fails."""
    if op == "transpose":
        (_, value), *_ = _tensor_args(schema, args)
        rank = len(value.sizes)
        if not transpose_rank_supported(rank):
            return (device_fault("transpose-rank", key, "kMaxSupportedDims", rank=rank,
                                 max_rank=TRANSPOSE_MAX_RANK),)
    return ()


def _cmsis(name: str, key: str, schema, args, tier: str | None = None) -> KernelResult:
    op = name.split("::")[1]
    kernel = CPU_KERNELS.get(op)
    explicit_nhwc = op.endswith("_nhwc")  # sizes already NHWC: the bytes are row-major
    nhwc_activations = kernel is not None and kernel.reads_nhwc and not explicit_nhwc
    elementwise = op in RAW_CMSIS
    tensors = [value for _, value in _tensor_args(schema, args)]
    channel_broadcast = op in _CHANNEL_BROADCAST_CMSIS and _is_channel_broadcast(tensors)
    reads: list[LayoutRead] = []
    values = []
    for argument, value in zip(schema.arguments, args):
        if _is_out(argument):
            continue
        if isinstance(value, RawTensor):
            nhwc_read = ((nhwc_activations and argument.name == "input" and len(value.sizes) == 4)
                         or (channel_broadcast and value.numel != value.sizes[1]))
            if nhwc_read:
                if layouts_differ(value.sizes, value.dim_order, CHANNELS_LAST):
                    reads.append(LayoutRead(argument.name, value.dim_order, "NHWC", "read"))
                values.append(read_nhwc(value))
            elif nhwc_activations or explicit_nhwc or elementwise:
                values.append(read_row_major(value))
            else:
                values.append(read_by_dim_order(value))
        elif isinstance(value, list) and value and isinstance(value[0], RawTensor):
            values.append([read_by_dim_order(v) for v in value])
        else:
            values.append(_convert(argument, value))
    device_semantics = _DEVICE_SEMANTICS.get(op)
    with _integer_convolutions():
        if device_semantics is not None and (op in _TIER_INDEPENDENT or tier is not None):
            result = device_semantics(*values, tier=tier)
        else:
            result = op_overload(name, "default")(*values)
    (argument, out), = _outs(schema, args)
    if op == "transpose":
        # arm_transpose_s8 gets the sizes only: the input's bytes are read, and the output's
        # written, as the row-major layout of their sizes whatever their dim_order.
        (operand_argument, operand), *_ = _tensor_args(schema, args)
        for name, value, access in ((operand_argument.name, operand, "read"),
                                    (argument.name, out, "write")):
            if layouts_differ(value.sizes, value.dim_order, tuple(range(len(value.sizes)))):
                reads.append(LayoutRead(name, value.dim_order, "row-major by the sizes", access))
    elif elementwise and not channel_broadcast:
        # Walked in lockstep with the output's bytes: an operand laid out otherwise is
        # reinterpreted (the device kernel checks no dim_order).
        for operand_argument, operand in _tensor_args(schema, args):
            if operand.sizes == out.sizes and layouts_differ(out.sizes, operand.dim_order,
                                                             out.dim_order):
                reads.append(LayoutRead(operand_argument.name, operand.dim_order,
                                        f"dim_order {tuple(out.dim_order)} (raw lockstep)",
                                        "read"))
    if (nhwc_activations or channel_broadcast) and len(out.sizes) == 4:
        if layouts_differ(out.sizes, out.dim_order, CHANNELS_LAST):
            reads.append(LayoutRead(argument.name, out.dim_order, "NHWC", "write"))
        write_nhwc(out, result)
        semantics = ("CMSIS-NN reference (channel broadcast over NHWC bytes)" if channel_broadcast
                     else "CMSIS-NN reference (activations as NHWC bytes)")
    elif explicit_nhwc or elementwise:
        write_row_major(out, result)
        semantics = "CMSIS-NN reference (raw bytes, row-major by the sizes)"
    else:
        write_by_dim_order(out, result)
        semantics = "CMSIS-NN reference (by dim_order)"
    # A failed check stops the device here; the value is computed as if it had passed.
    return KernelResult(semantics, _cmsis_faults(op, key, schema, args), tuple(reads))


def _avgpool_s8(input, kernel_size, stride, padding, ceil_mode, zero_point, multiplier, shift,
                scratch, tier=None):
    """`arm_avgpool_s8` as every CMSIS-NN path computes it (Source/PoolingFunctions/
    arm_avgpool_s8.c): the sum of the raw int8 values over the window's in-bounds elements,
    `(sum +- count/2) / count` in integers (half away from zero), clamped to int8 (the bounds
    op_quantized_avg_pool2d.cpp passes). The zero point, multiplier and shift are not used.

    ExecuTorch 1.5.1's Python reference (`quantized_avg_pool2d_impl`) averages in float and
    rounds half to even instead: one step apart on ties (ResNet-8 on the real runtime: a sum of
    -7072 over 64 elements is -111 on the device, -110 in the Python reference)."""
    def pair(v):
        return tuple(v) if len(v) == 2 else (v[0], v[0])

    x = input.to(torch.float64)
    window = dict(kernel_size=pair(kernel_size), stride=pair(stride), padding=pair(padding),
                  ceil_mode=bool(ceil_mode), count_include_pad=True, divisor_override=1)
    sums = F.avg_pool2d(x, **window).round().to(torch.int64)  # exact: integers below 2**53
    counts = F.avg_pool2d(torch.ones_like(x), **window).round().to(torch.int64)
    half = counts // 2
    rounded = torch.where(sums > 0, sums + half, sums - half)
    return torch.div(rounded, counts, rounding_mode="trunc").clamp(-128, 127).to(torch.int8)


def _quantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype, tier=None):
    """op_quantize_per_tensor.cpp: `inv_scale = 1.0f / (float)scale`, then per element
    `zp + nearbyint(inv_scale * x)` in float32 (the scalar path, and the MVE path's tail); the
    MVE path takes 16 elements at a time through `vfmaq_f32(magic, x, inv_scale)`, a fused
    multiply-add that rounds the exact product once (half to even). Upstream's Python
    reference rounds the float32 product, as the scalar path does: on the MVE tier one step
    apart where rounding the product to float32 lands it on a half (7.5 / 3.0: exactly
    2.50000007, so 3 on the MVE path; 2.5 in float32, so 2 on the scalar path)."""
    x = input.to(torch.float32).reshape(-1)
    inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(float(scale), dtype=torch.float32)
    scalar = torch.round(x * inv)  # float32 product, then nearbyint
    if tier == "mve":
        fused = torch.round(x.to(torch.float64) * inv.to(torch.float64))  # exact product
        vector = x.numel() - x.numel() % 16
        scalar = torch.cat([fused[:vector].to(torch.float32), scalar[vector:]])
    q = (scalar.to(torch.int64) + int(zero_point)).clamp(int(quant_min), int(quant_max))
    return q.to(dtype).reshape(input.shape)


def _quantized_linear(input, weights, bias, kernel_sum, input_offset, filter_offset,
                      output_offset, requantize_multipliers, requantize_shifts, activation_max,
                      activation_min, tier=None):
    """`arm_fully_connected_s8` as the tier's path computes it from these arguments. The MVE path
    reads the precomputed kernel sum (ctx.buf) and ignores the bias; the DSP and scalar C paths
    (arm_nn_vec_mat_mult_t_s8.c without ARM_MATH_MVEI) read the bias and ignore the kernel sum.
    Upstream's reference dispatches on which argument is present, which is the MVE path for
    arguments prepared for the M55/M85; on a C path those arguments give sum((x + input offset)
    * (w + filter offset)) with no bias (measured: the host runtime's x86 build writes exactly
    this)."""
    op = op_overload("cortex_m::quantized_linear", "default")
    if tier in ("scalar", "dsp") and kernel_sum is not None:
        kernel_sum = None
    return op(input, weights, bias, kernel_sum, input_offset, filter_offset, output_offset,
              requantize_multipliers, requantize_shifts, activation_max, activation_min)


# `cortex_m::` ops whose device kernel computes otherwise than upstream's Python reference
# (per ISA tier where the tier's paths differ); the twin runs these.
_DEVICE_SEMANTICS = {"quantized_avg_pool2d": _avgpool_s8,
                     "quantize_per_tensor": _quantize_per_tensor,
                     "quantized_linear": _quantized_linear}
# The tier of the host runtime's CMSIS-NN build: its C path (no MVE, no DSP intrinsics on x86).
HOST_TIER = "scalar"
# Ops whose arguments or arithmetic differ between the MVE path and the C path, so a host run
# checks them in their C-path form and only an MVE core (QEMU's Cortex-M55) checks the MVE form.
MVE_ONLY_SEMANTICS = frozenset({"quantized_linear", "quantize_per_tensor"})
# Ops whose device semantics are the same on every tier: used even without a known tier.
_TIER_INDEPENDENT = frozenset({"quantized_avg_pool2d"})


def _elementwise(name: str, key: str, opov, schema, args) -> KernelResult:
    tensors = _tensor_args(schema, args)
    (out_arg, out), = _outs(schema, args)
    faults = list(_missing_kernel(key))
    if not _same_dim_order_family([t for _, t in tensors] + [out]):
        orders = ", ".join(f"{a.name} {tuple(t.dim_order)}" for a, t in tensors)
        faults.append(device_fault("dim-order-family", key, "tensors_have_same_dim_order",
                                   orders=f"{orders}, out {tuple(out.dim_order)}"))
    if faults:
        # The device stops here; computing the op by dim_order keeps the rest comparable.
        result = _by_dim_order(key, opov, schema, args, "torch by dim_order (device kernel faults)")
        return KernelResult(result.semantics, tuple(faults), ())
    broadcast = any(_drop_leading_ones(t.sizes) != _drop_leading_ones(out.sizes) for _, t in tensors)
    values, kwargs = [], {}
    for argument, value in zip(schema.arguments, args):
        if _is_out(argument):
            kwargs[argument.name] = torch.empty(out.sizes, dtype=out.dtype)
        elif isinstance(value, RawTensor):
            # Broadcasting reads inputs through their dim_order strides; otherwise all operands
            # are walked as one linear run of raw bytes.
            values.append(read_by_dim_order(value) if broadcast else
                          read_row_major(value).reshape(out.sizes))
        elif argument.kwarg_only:
            kwargs[argument.name] = _convert(argument, value)
        else:
            values.append(_convert(argument, value))
    opov(*values, **kwargs)
    write_row_major(out, kwargs[out_arg.name])
    semantics = ("portable elementwise (broadcast: inputs by strides, output row-major)"
                 if broadcast else "portable elementwise (raw bytes in lockstep)")
    return KernelResult(semantics, (), ())


def _view_copy(key: str, schema, args) -> KernelResult:
    (_, source), = _tensor_args(schema, args)
    (_, out), = _outs(schema, args)
    faults = list(_missing_kernel(key))
    default = tuple(range(len(source.dim_order)))
    if not _same_dim_order_family([source, out]) or tuple(source.dim_order) != default:
        faults.append(device_fault("default-dim-order", key, "tensor_is_default_dim_order",
                                   order=tuple(source.dim_order)))
    out.data[:source.nbytes] = source.data[:source.nbytes]
    return KernelResult("portable view_copy (memcpy)", tuple(faults), ())


def _logical(t: RawTensor) -> torch.Tensor:
    """The tensor by its dim_order, for torch to compute on. Integer tensors are handed over
    contiguous: integer results do not depend on the layout, and torch 2.13's CPU
    max_pool2d_with_indices rejects any int8 channels-last input ("Expected input_depth *
    input_height * input_width <= std::numeric_limits<integer_t>::max()", its index bound
    taken from the int8 element type). Float tensors keep their strides, as before."""
    value = read_by_dim_order(t)
    return value if value.dtype.is_floating_point else value.contiguous()


def _call(opov, schema, args, read, write) -> None:
    """Run `opov` on the KernelCall's arguments: tensors (and tensor lists) read from their
    bytes with `read`, every out tensor (or each of an out list) written back with `write`."""
    values, kwargs = [], {}
    for argument, value in zip(schema.arguments, args):
        if _is_out(argument):
            kwargs[argument.name] = _empty_like(value)
            continue
        if isinstance(value, RawTensor):
            converted = read(value)
        elif value and _is_tensor_list(value):
            converted = [read(v) for v in value]
        elif value and _is_optional_tensor_list(value):
            # `Tensor?[] indices` (aten::index.Tensor_out): None keeps a dimension whole.
            converted = [None if v is None else read(v) for v in value]
        else:
            converted = _convert(argument, value)
        if argument.kwarg_only:
            kwargs[argument.name] = converted
        else:
            values.append(converted)
    opov(*values, **kwargs)
    for argument, out in _outs(schema, args):
        results = kwargs[argument.name]
        for tensor, result in zip(out if isinstance(out, list) else [out],
                                  results if isinstance(out, list) else [results]):
            write(tensor, result)


def _by_dim_order(key: str, opov, schema, args, semantics: str) -> KernelResult:
    faults = list(_missing_kernel(key))
    _call(opov, schema, args, _logical, write_by_dim_order)
    return KernelResult(semantics, tuple(faults), ())


def _leading_dims(key: str, opov, schema, args) -> KernelResult:
    """cat, split_copy, split_with_sizes_copy, unbind_copy as the portable kernels run them.

    After checking that every tensor shares the input's dim-order family (and, for unbind, that
    the input is contiguous), op_cat.cpp / op_split*_copy.cpp / op_unbind_copy.cpp walk the data
    with getLeadingDims/getTrailingDims of the *sizes*: the raw bytes are treated as the
    row-major layout of the sizes whatever the dim_order. So a channels-last cat along C
    concatenates whole NHWC buffers (measured on the host portable runtime), not channels.
    """
    faults = list(_missing_kernel(key))
    inputs = [t for _, t in _tensor_args(schema, args)]
    for argument, value in zip(schema.arguments, args):
        if not _is_out(argument) and _is_tensor_list(value):
            inputs += value
    outs = _outs(schema, args)
    tensors = inputs + _out_tensors(outs)
    if not _same_dim_order_family(tensors):
        orders = ", ".join(str(tuple(t.dim_order)) for t in tensors)
        faults.append(device_fault("dim-order-family", key, "tensors_have_same_dim_order",
                                   orders=orders))
    if key.startswith("aten::unbind_copy") and inputs and \
            tuple(inputs[0].dim_order) != tuple(range(len(inputs[0].dim_order))):
        faults.append(device_fault("default-dim-order", key, "tensor_is_default_dim_order",
                                   order=tuple(inputs[0].dim_order)))
    if faults and any(f.check != "kernel registered" for f in faults):
        # The device stops here; computing the op by dim_order keeps the rest comparable.
        result = _by_dim_order(key, opov, schema, args, "torch by dim_order (device kernel faults)")
        return KernelResult(result.semantics, tuple(faults), ())
    _call(opov, schema, args, read_row_major, write_row_major)
    return KernelResult("portable getLeadingDims walk (raw bytes as row-major of the sizes)",
                        tuple(faults), ())


def _sizes_walk(key: str, opov, schema, args) -> KernelResult:
    """A SIZES_WALK_KERNELS op as the portable kernel runs it: every tensor's bytes as the
    row-major layout of its sizes, after the dim-order check the kernel makes (if any)."""
    faults = list(_missing_kernel(key))
    tensors = [t for _, t in _tensor_args(schema, args)] + _out_tensors(_outs(schema, args))
    checks_family = key.split(".")[0] in ("aten::flip", "aten::roll", "aten::permute_copy",
                                           "aten::index_put", "aten::scatter_add")
    if checks_family and not _same_dim_order_family(tensors):
        orders = ", ".join(str(tuple(t.dim_order)) for t in tensors)
        faults.append(device_fault("dim-order-family", key, "tensors_have_same_dim_order",
                                   orders=orders))
    if any(f.check != "kernel registered" for f in faults):
        result = _by_dim_order(key, opov, schema, args, "torch by dim_order (device kernel faults)")
        return KernelResult(result.semantics, tuple(faults), ())
    reads = tuple(LayoutRead(a.name, t.dim_order, "row-major of the sizes", "read")
                  for a, t in _tensor_args(schema, args)
                  if layouts_differ(t.sizes, t.dim_order, tuple(range(len(t.sizes)))))
    _call(opov, schema, args, read_row_major, write_row_major)
    return KernelResult("portable coordinateToIndex walk (raw bytes as row-major of the sizes)",
                        tuple(faults), reads)


def out_positions(name: str, overload: str) -> tuple[int, ...]:
    """Positions of the op's out arguments in a KernelCall's argument list."""
    schema = op_overload(name, overload)._schema
    return tuple(i for i, a in enumerate(schema.arguments) if _is_out(a))


def execute(name: str, overload: str, args: list, tier: str | None = None) -> KernelResult:
    """Run one KernelCall; `args` follow the op's schema (tensors as RawTensor, outs included).

    `tier` (scalar | dsp | mve) selects the kernel path where the device's paths compute
    differently (see _DEVICE_SEMANTICS); None keeps upstream's Python reference."""
    key = f"{name}.{overload or 'default'}"
    opov = op_overload(name, overload)
    schema = opov._schema
    if len(args) < len(schema.arguments):
        raise KernelError(f"{key} expects {len(schema.arguments)} arguments, got {len(args)}")
    args = list(args[:len(schema.arguments)])
    if name.startswith("cortex_m::"):
        return _cmsis(name, key, schema, args, tier)
    if name.startswith("orchestrate::"):
        # kernels/s16: each checks its layout (NHWC) and dtypes itself; the values by dim_order
        # are what it reads once its checks pass.
        _call(opov, schema, args, _logical, write_by_dim_order)
        return KernelResult("CMSIS-NN s16 integer arithmetic (kernels/s16)", (), ())
    if name in _ELEMENTWISE:
        return _elementwise(name, key, opov, schema, args)
    if name == "aten::view_copy":
        return _view_copy(key, schema, args)
    if name == "aten::copy_":
        return _copy_in_place(name, args)
    if name in _DIM_ORDER_COPIES:
        return _by_dim_order(key, opov, schema, args, "portable dim_order copy (layout change)")
    if name in _LEADING_DIMS_KERNELS:
        return _leading_dims(key, opov, schema, args)
    if name in SIZES_WALK_KERNELS:
        return _sizes_walk(key, opov, schema, args)
    if not name.startswith(("aten::", "dim_order_ops::", "quantized_decomposed::")):
        raise KernelError(f"the twin has no host execution for {key}")
    result = _by_dim_order(key, opov, schema, args, "torch, tensors by dim_order")
    if name in _CONTIGUOUS_STRIDE_KERNELS:
        tensors = [t for _, t in _tensor_args(schema, args)] + _out_tensors(_outs(schema, args))
        bad = [tuple(t.dim_order) for t in tensors if tuple(t.dim_order) != tuple(range(len(t.dim_order)))]
        if bad:
            fault = device_fault("contiguous-strides", key, "contiguous strides", order=bad[0])
            return KernelResult(result.semantics, result.faults + (fault,), result.layout_reads)
    return result


def _copy_in_place(name: str, args: list) -> KernelResult:
    """`aten::copy_(self, src)`, the write-back of a program's state after its last
    instruction (ExecuTorch's `insert_write_back_for_buffers_pass`): `src`'s values into
    `self`'s bytes, each by its own dim_order (the portable kernel copies element by element
    through the broadcast index)."""
    target, source = args[0], args[1]
    value = read_by_dim_order(source).to(target.dtype)
    write_by_dim_order(target, value.expand(tuple(target.sizes)).contiguous())
    return KernelResult("portable copy_ (a state written back, by dim_order)",
                        tuple(_missing_kernel(name)), ())  # registered as "aten::copy_"


# Portable kernels that index their tensors as if contiguous, whatever the dim_order.
_CONTIGUOUS_STRIDE_KERNELS = frozenset({"aten::topk"})
