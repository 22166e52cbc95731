"""Our int16 operators: int16-activation, int8-weight convolution and linear on CMSIS-NN's s16
kernels (arm_convolve_wrapper_s16, arm_fully_connected_s16), which upstream's Cortex-M backend
(ExecuTorch 1.5.1, int8 only) does not offer.

`orchestrate::quantized_conv2d_s16` and `orchestrate::quantized_linear_s16` are defined here for
the graph (schemas, fake tensors) and computed here for the twin with CMSIS-NN's integer
arithmetic; `op_*.cpp` beside this file are the device kernels, registered through
`operators.yaml` by ExecuTorch's codegen into the host runtime, the runner and the release
firmware (kernels/native/operators.py). The compile pass that writes them is
partitioners/s16_operators.py.

The arithmetic both s16 kernels share when the bias is int64 (CMSIS-NN's
arm_nn_mat_mult_nt_t_s16, arm_nn_mat_mult_kernel_s16 and arm_nn_vec_mat_mult_t_s16): the
products summed exactly (int32 for the first 512 columns, which cannot overflow, then int64),
plus the bias; `arm_nn_requantize_s64` with the multiplier reduced to 16 bits
(`REDUCE_MULTIPLIER`); then the activation bounds.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.library import Library, impl, register_fake

FOLDER = Path(__file__).resolve().parent
OPERATORS_YAML = FOLDER / "operators.yaml"
NAMESPACE = "orchestrate"
# The operators as programs name them, and the CMSIS-NN function each calls.
CMSIS_FUNCTIONS = {"quantized_conv2d_s16": "arm_convolve_wrapper_s16",
                   "quantized_linear_s16": "arm_fully_connected_s16"}
INT16_MIN, INT16_MAX = -32768, 32767

_lib = Library(NAMESPACE, "DEF")
_CONV_ARGS = ("Tensor input, Tensor weight, Tensor bias, int[] stride, int[] padding, "
              "int[] dilation, Tensor requantize_multipliers, Tensor requantize_shifts, "
              "int activation_min, int activation_max, Tensor scratch")
_LINEAR_ARGS = ("Tensor input, Tensor weights, Tensor bias, Tensor requantize_multipliers, "
                "Tensor requantize_shifts, int activation_min, int activation_max")
_lib.define(f"quantized_conv2d_s16({_CONV_ARGS}) -> Tensor")
_lib.define(f"quantized_conv2d_s16.out({_CONV_ARGS}, *, Tensor(a!) out) -> Tensor(a!)")
_lib.define(f"quantized_linear_s16({_LINEAR_ARGS}) -> Tensor")
_lib.define(f"quantized_linear_s16.out({_LINEAR_ARGS}, *, Tensor(a!) out) -> Tensor(a!)")


def reduced_multiplier(multiplier: torch.Tensor) -> torch.Tensor:
    """CMSIS-NN's REDUCE_MULTIPLIER: the int32 multiplier rounded to 16 bits (int64 values)."""
    m = multiplier.to(torch.int64)
    return torch.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, torch.full_like(m, 0x7FFF))


def requantize_s64(acc: torch.Tensor, multiplier: torch.Tensor, shift: torch.Tensor,
                   low: int, high: int) -> torch.Tensor:
    """arm_nn_requantize_s64 per channel (the last dimension) and the activation bounds."""
    product = acc.to(torch.int64) * reduced_multiplier(multiplier)
    shifted = product >> (14 - shift.to(torch.int64))
    # `int32_t result = new_val >> (14 - shift)`: the int64 narrows to int32 (wraps).
    wrapped = ((shifted + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
    return ((wrapped + 1) >> 1).clamp(low, high).to(torch.int16)


def _output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


@register_fake(f"{NAMESPACE}::quantized_conv2d_s16")
def _conv_fake(input, weight, bias, stride, padding, dilation, requantize_multipliers,
               requantize_shifts, activation_min, activation_max, scratch):
    n, _, h, w = input.shape
    out_c, kh, kw, _ = weight.shape
    sizes = (n, out_c, _output_size(h, kh, stride[0], padding[0], dilation[0]),
             _output_size(w, kw, stride[1], padding[1], dilation[1]))
    return torch.empty(sizes, dtype=torch.int16, device=input.device).to(
        memory_format=torch.channels_last)


@impl(_lib, "quantized_conv2d_s16", "CompositeExplicitAutograd")
def quantized_conv2d_s16(input, weight, bias, stride, padding, dilation, requantize_multipliers,
                         requantize_shifts, activation_min, activation_max, scratch):
    """The twin's computation: NCHW int16 input, OHWI int8 weight, int64 bias -> NCHW int16."""
    # float64 holds every partial sum exactly: |int16 * int8| < 2**22 summed over fewer than
    # 2**30 products stays below 2**53.
    acc = torch.nn.functional.conv2d(
        input.to(torch.float64), weight.permute(0, 3, 1, 2).to(torch.float64), None,
        tuple(stride), tuple(padding), tuple(dilation)).round().to(torch.int64)
    acc = acc + bias.to(torch.int64).view(1, -1, 1, 1)
    out = requantize_s64(acc.permute(0, 2, 3, 1), requantize_multipliers, requantize_shifts,
                         activation_min, activation_max)
    return out.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)


@impl(_lib, "quantized_conv2d_s16.out", "CompositeExplicitAutograd")
def quantized_conv2d_s16_out(input, weight, bias, stride, padding, dilation,
                             requantize_multipliers, requantize_shifts, activation_min,
                             activation_max, scratch, *, out):
    result = quantized_conv2d_s16(input, weight, bias, stride, padding, dilation,
                                  requantize_multipliers, requantize_shifts, activation_min,
                                  activation_max, scratch)
    out.resize_(result.shape)
    out.copy_(result)
    return out


@register_fake(f"{NAMESPACE}::quantized_linear_s16")
def _linear_fake(input, weights, bias, requantize_multipliers, requantize_shifts,
                 activation_min, activation_max):
    return torch.empty((*input.shape[:-1], weights.shape[0]), dtype=torch.int16,
                       device=input.device)


@impl(_lib, "quantized_linear_s16", "CompositeExplicitAutograd")
def quantized_linear_s16(input, weights, bias, requantize_multipliers, requantize_shifts,
                         activation_min, activation_max):
    acc = (input.to(torch.float64) @ weights.to(torch.float64).T).round().to(torch.int64)
    acc = acc + bias.to(torch.int64)
    return requantize_s64(acc, requantize_multipliers, requantize_shifts, activation_min,
                          activation_max)


@impl(_lib, "quantized_linear_s16.out", "CompositeExplicitAutograd")
def quantized_linear_s16_out(input, weights, bias, requantize_multipliers, requantize_shifts,
                             activation_min, activation_max, *, out):
    result = quantized_linear_s16(input, weights, bias, requantize_multipliers,
                                  requantize_shifts, activation_min, activation_max)
    out.resize_(result.shape)
    out.copy_(result)
    return out


def conv_scratch_bytes(in_channels: int, kernel_h: int, kernel_w: int) -> int:
    """The scratch arm_convolve_wrapper_s16 needs on any build: the larger of its C path
    (`2 * c * kw * kh` int16) and its MVE path (four im2col rows padded to 8 int16 lanes),
    from CMSIS-NN's arm_convolve_get_buffer_sizes_s16.c."""
    columns = in_channels * kernel_h * kernel_w
    return max(2 * columns * 2, 4 * ((columns + 7) // 8) * 8 * 2)
