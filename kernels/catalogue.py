"""The CPU kernel catalogue: what each `cortex_m::` op calls in CMSIS-NN, its layout and cost kind.

The `cortex_m::` op set and its arguments are ExecuTorch's (`backends/cortex_m/ops/operators.yaml`);
the CMSIS-NN entry points and the wrappers' dispatch rules are CMSIS-NN's public API
(`Include/arm_nnfunctions.h`): the `*_wrapper_s8` functions pick a specialised kernel from the
geometry, the same way for every ISA tier; the tier (Scalar/DSP/MVE) selects the implementation
compiled into each function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# dim_order of a channels-last (NHWC) 4-D tensor: the layout CMSIS-NN reads and writes.
CHANNELS_LAST = (0, 2, 3, 1)


@dataclass(frozen=True)
class CpuKernel:
    """One CMSIS-NN-backed `cortex_m::` op."""

    op: str  # cortex_m op name without namespace/overload, e.g. "quantized_conv2d"
    cmsis_function: str  # entry point the ExecuTorch kernel calls
    cost_kind: str  # cost_models.op_shapes.OpShape.kind
    reads_nhwc: bool  # 4-D activations are read/written as NHWC whatever the tensor's dim_order


CPU_KERNELS: dict[str, CpuKernel] = {
    k.op: k
    for k in (
        CpuKernel("quantized_conv2d", "arm_convolve_wrapper_s8", "conv", True),
        CpuKernel("quantized_conv2d_nhwc", "arm_convolve_wrapper_s8", "conv", True),
        CpuKernel("quantized_depthwise_conv2d", "arm_depthwise_conv_wrapper_s8", "depthwise_conv", True),
        CpuKernel("quantized_depthwise_conv2d_nhwc", "arm_depthwise_conv_wrapper_s8", "depthwise_conv", True),
        CpuKernel("quantized_transpose_conv2d", "arm_transpose_conv_wrapper_s8", "conv", True),
        CpuKernel("quantized_transpose_conv2d_nhwc", "arm_transpose_conv_wrapper_s8", "conv", True),
        CpuKernel("quantized_avg_pool2d", "arm_avgpool_s8", "avg_pool", True),
        CpuKernel("quantized_avg_pool2d_nhwc", "arm_avgpool_s8", "avg_pool", True),
        CpuKernel("quantized_max_pool2d", "arm_max_pool_s8", "max_pool", True),
        CpuKernel("quantized_max_pool2d_nhwc", "arm_max_pool_s8", "max_pool", True),
        CpuKernel("quantized_linear", "arm_fully_connected_s8", "fully_connected", False),
        CpuKernel("quantized_batch_matmul", "arm_batch_matmul_s8", "batch_matmul", False),
        CpuKernel("quantized_add", "arm_elementwise_add_s8", "add", False),
        CpuKernel("quantized_mul", "arm_elementwise_mul_s8", "mul", False),
        CpuKernel("quantized_div", "executorch cortex_m div (no CMSIS-NN entry)", "mul", False),
        CpuKernel("softmax", "arm_softmax_s8", "softmax", False),
        CpuKernel("quantized_activation", "executorch cortex_m int8 LUT", "lut_activation", False),
        CpuKernel("minimum", "arm_minimum_s8", "add", False),
        CpuKernel("maximum", "arm_maximum_s8", "add", False),
        CpuKernel("transpose", "arm_transpose_s8", "transpose", False),
        CpuKernel("pad", "arm_pad_s8", "pad", False),
        CpuKernel("quantize_per_tensor", "executorch cortex_m quantize (MVE/scalar)", "quantize", False),
        CpuKernel("dequantize_per_tensor", "executorch cortex_m dequantize (MVE/scalar)", "dequantize", False),
    )
}


# CMSIS-NN's arm_transpose_conv_wrapper_s8 computes a transposed convolution as a stride-1
# convolution of the zero-upscaled input ("reverse conv") when both strides are at most 2 and the
# input has more than REVERSE_TCOL_EFFICIENT_THRESHOLD channels (Include/arm_nnsupportfunctions.h),
# else with arm_transpose_conv_s8's rolling row buffer.
REVERSE_TCOL_EFFICIENT_THRESHOLD = 16


def transpose_conv_rows_dropped(input_channels: int, stride: tuple[int, int],
                                padding: tuple[int, int]) -> str | None:
    """Why arm_transpose_conv_s8 computes wrong values for this geometry, or None.

    Its row loop writes the `stride_h` output rows an input row completes only when none of
    them is cropped by the top padding (`if (skip_rows_top == 0)`), so when `padding_h` is not
    a multiple of `stride_h` the first partly-cropped group of rows, which holds real output
    rows, is never written and every later row lands one group early (measured: stride 2,
    padding 1, kernel 3 or 4, 4 input channels: 89 of 98 outputs differ, by up to 164 steps,
    on the host's C path and on QEMU's Cortex-M55 alike). The reverse-conv path does not
    share the loop."""
    stride_h, stride_w = stride
    padding_h = padding[0]
    reverse = stride_h <= 2 and stride_w <= 2 and input_channels > REVERSE_TCOL_EFFICIENT_THRESHOLD
    if reverse or padding_h <= 0 or padding_h % stride_h == 0:
        return None
    return (f"arm_transpose_conv_s8 drops the output rows of its first input row when the "
            f"padding ({padding_h}) is not a multiple of the stride ({stride_h}) "
            f"({input_channels} input channels: not its reverse-conv path)")


def mve_conv_1xn_refusal(input_nchw: tuple[int, ...], weight_ohwi: tuple[int, ...],
                         output_nchw: tuple[int, ...], stride: tuple[int, int],
                         padding: tuple[int, int], dilation: tuple[int, int]) -> dict | None:
    """The fields of the MVE refusal of a cortex_m::quantized_conv2d, or None.

    arm_convolve_wrapper_s8 takes arm_convolve_1_x_n_s8 for an input of height 1 and a filter
    of height 1 with dilation 1 along the width, input channels equal to the filter's and
    stride_w x channels a multiple of 4 (arm_nn_is_convolve_1_x_n; a 1x1 filter without padding
    takes the 1x1 kernel first). Its MVE path requires `pad_w * 2 + total_pad % 2 ==
    total_pad`, total_pad = (out_w - 1) x stride_w + k_w - in_w, and returns
    ARM_CMSIS_NN_FAILURE otherwise (Source/ConvolutionFunctions/arm_convolve_1_x_n_s8.c): a
    PyTorch padding whose last columns the stride never reaches (two stride-2 Conv1d of kernel
    3, padding 1) fails on the Cortex-M55 and passes on the host's C path."""
    _, in_c, in_h, in_w = input_nchw
    _, k_h, k_w, w_c = weight_ohwi
    out_w = output_nchw[3]
    stride_h, stride_w = stride
    pad_h, pad_w = padding
    if k_h == 1 and k_w == 1 and pad_h == 0 and pad_w == 0 and tuple(dilation) == (1, 1):
        return None  # arm_convolve_1x1_s8*
    if not (in_h == 1 and dilation[1] == 1 and k_h == 1 and (stride_w * in_c) % 4 == 0
            and in_c == w_c):
        return None
    total = (out_w - 1) * stride_w + k_w - in_w
    asym = total % 2
    if pad_w * 2 + asym == total:
        return None
    return {"channels": in_c, "stride": stride_w, "padding": pad_w, "asym": asym,
            "total": total}


def dsp_avgpool_scratch_refusal(channels: int, scratch_bytes: int) -> dict | None:
    """The fields of the DSP refusal of a cortex_m::quantized_avg_pool2d, or None.

    The operator hands arm_avgpool_s8 no buffer (ctx->buf NULL) when its scratch tensor is empty
    (op_quantized_avg_pool2d.cpp), and the kernel returns ARM_CMSIS_NN_ARG_ERROR without one when
    arm_avgpool_s8_get_buffer_size is non-zero (Source/PoolingFunctions/arm_avgpool_s8.c), which
    it is on the DSP tier only: 4 bytes per input channel (arm_avgpool_s8_get_buffer_size_dsp;
    0 on the C and MVE paths). The one argument check among the CMSIS-NN functions the Cortex-M
    operators call that the DSP path makes and the host's C path does not
    (benchmarks/cmsis_nn_tier_checks.py). Upstream's Cortex-M pass sizes the scratch with the
    target's backend, so it holds for a program whose scratch was sized for another tier."""
    needed = 4 * channels
    if scratch_bytes > 0 or needed == 0:
        return None
    return {"channels": channels, "needed": needed}


def cortex_m_op_name(target) -> str | None:
    """`quantized_conv2d` for `cortex_m.quantized_conv2d.default`, None for any other op."""
    text = str(getattr(target, "_op", target))
    name = getattr(target, "__name__", "")
    for candidate in (name, text):
        if candidate.startswith("cortex_m."):
            return candidate.split(".")[1]
        if candidate.startswith("cortex_m::"):
            return candidate.split("::")[1].split(".")[0]
    return None


def _tensor(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def specialised_function(op: str, node: torch.fx.Node, tier: str = "mve") -> str:
    """The kernel a CMSIS-NN wrapper dispatches to for this node's geometry.

    Mirrors the documented dispatch of `arm_convolve_wrapper_s8` and `arm_depthwise_conv_wrapper_s8`
    so a reader sees which code path runs (1x1 fast path, 3x3 depthwise, generic).
    """
    kernel = CPU_KERNELS[op]
    if op.startswith("quantized_conv2d"):
        # arm_convolve_wrapper_s8 (CMSIS-NN): 1x1 (no padding, no dilation, ungrouped) -> the
        # 1x1 paths, fast at unit stride; a 1xN kernel over a one-row input whose
        # stride.w x channels is a multiple of 4 -> arm_convolve_1_x_n_s8; else arm_convolve_s8.
        # The Cortex-M pass stores the weight as contiguous OHWI (aten_to_cortex_m_pass.py:
        # `permute(0, 2, 3, 1).contiguous()`), so its kernel H and W are dims 1 and 2.
        weight, inp = _tensor(node.args[1]), _tensor(node.args[0])
        stride, padding, dilation = node.args[3], node.args[4], node.args[5]
        if weight is not None and inp is not None and weight.dim() == 4 and inp.dim() == 4:
            kh, kw, filter_c = int(weight.shape[1]), int(weight.shape[2]), int(weight.shape[3])
            in_h, in_c = ((int(inp.shape[1]), int(inp.shape[3])) if op.endswith("nhwc")
                          else (int(inp.shape[2]), int(inp.shape[1])))
            ungrouped = in_c == filter_c
            if (kh, kw) == (1, 1) and list(padding) == [0, 0] and list(dilation) == [1, 1] \
                    and ungrouped:
                return "arm_convolve_1x1_s8_fast" if list(stride) == [1, 1] else "arm_convolve_1x1_s8"
            if in_h == 1 and kh == 1 and int(dilation[1]) == 1 and ungrouped \
                    and (int(stride[1]) * in_c) % 4 == 0:
                return "arm_convolve_1_x_n_s8"
        return "arm_convolve_s8"
    if op.startswith("quantized_depthwise_conv2d"):
        weight = _tensor(node.args[1])
        padding, dilation = node.args[4], node.args[5]
        inp, out = _tensor(node.args[0]), _tensor(node)
        channel_multiplier_one = (inp is not None and out is not None
                                  and int(inp.shape[1]) == int(out.shape[1]))
        if weight is not None and list(dilation) == [1, 1] and channel_multiplier_one:
            dims = tuple(int(d) for d in weight.shape)
            if dims[-2:] == (3, 3) or dims[1:3] == (3, 3):
                if all(p <= 1 for p in padding) and tier != "mve":
                    # The wrapper's 3x3 fast path is compiled for non-MVE builds only.
                    return "arm_depthwise_conv_3x3_s8"
            return "arm_depthwise_conv_s8_opt"
        return "arm_depthwise_conv_s8"
    return kernel.cmsis_function
