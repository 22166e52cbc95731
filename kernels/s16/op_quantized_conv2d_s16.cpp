/*
 * orchestrate::quantized_conv2d_s16.out: an int16-activation, int8-weight convolution on
 * CMSIS-NN's arm_convolve_wrapper_s16. Activations NHWC (channels-last dim_order), weights OHWI,
 * bias int64 and one requantization multiplier/shift per output channel, as the compile pass
 * (partitioners/s16_operators.py) writes them. The checks are those upstream's
 * cortex_m::quantized_conv2d makes, for int16.
 */

#include <executorch/backends/cortex_m/ops/cortex_m_ops_common.h>

namespace orchestrate {
namespace native {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;
using Int64ArrayRef = executorch::aten::ArrayRef<int64_t>;

namespace {

bool refuse(KernelRuntimeContext& context, const char* why) {
  ET_LOG(Error, "quantized_conv2d_s16_out: %s", why);
  context.fail(Error::InvalidArgument);
  return false;
}

bool arguments_valid(KernelRuntimeContext& context, const Tensor& input,
                     const Tensor& weight, const Tensor& bias, const Tensor& out,
                     Int64ArrayRef stride, Int64ArrayRef padding, Int64ArrayRef dilation,
                     const Tensor& multipliers, const Tensor& shifts) {
  if (input.dim() != 4 || weight.dim() != 4 || out.dim() != 4) {
    return refuse(context, "tensors must be 4-D");
  }
  // A one-channel tensor has the same bytes in either dim_order.
  if ((input.size(1) > 1 && !is_channels_last_tensor(input)) ||
      (out.size(1) > 1 && !is_channels_last_tensor(out))) {
    return refuse(context, "input and output must have channels_last dim_order (NHWC)");
  }
  if (input.scalar_type() != ScalarType::Short || out.scalar_type() != ScalarType::Short) {
    return refuse(context, "input and output must be int16");
  }
  if (weight.scalar_type() != ScalarType::Char) {
    return refuse(context, "weight must be int8");
  }
  if (bias.scalar_type() != ScalarType::Long || bias.numel() != out.size(1)) {
    return refuse(context, "bias must be int64, one per output channel");
  }
  if (stride.size() != 2 || padding.size() != 2 || dilation.size() != 2) {
    return refuse(context, "stride, padding and dilation must have length 2");
  }
  if (multipliers.scalar_type() != ScalarType::Int || shifts.scalar_type() != ScalarType::Int ||
      multipliers.numel() != out.size(1) || shifts.numel() != out.size(1)) {
    return refuse(context, "int32 multipliers and shifts, one per output channel");
  }
  if (weight.size(0) != out.size(1) || weight.size(3) != input.size(1)) {
    return refuse(context, "weight must be OHWI for these input and output channels");
  }
  return true;
}

}  // namespace

Tensor& quantized_conv2d_s16_out(KernelRuntimeContext& context, const Tensor& input,
                                 const Tensor& weight, const Tensor& bias,
                                 const Int64ArrayRef stride, const Int64ArrayRef padding,
                                 const Int64ArrayRef dilation, const Tensor& multipliers,
                                 const Tensor& shifts, const int64_t activation_min,
                                 const int64_t activation_max, const Tensor& scratch,
                                 Tensor& out) {
  if (!arguments_valid(context, input, weight, bias, out, stride, padding, dilation,
                       multipliers, shifts)) {
    return out;
  }
  const cmsis_nn_dims input_dims{static_cast<int32_t>(input.size(0)),
                                 static_cast<int32_t>(input.size(2)),
                                 static_cast<int32_t>(input.size(3)),
                                 static_cast<int32_t>(input.size(1))};
  const cmsis_nn_dims filter_dims{static_cast<int32_t>(weight.size(0)),
                                  static_cast<int32_t>(weight.size(1)),
                                  static_cast<int32_t>(weight.size(2)),
                                  static_cast<int32_t>(weight.size(3))};
  const cmsis_nn_dims output_dims{static_cast<int32_t>(out.size(0)),
                                  static_cast<int32_t>(out.size(2)),
                                  static_cast<int32_t>(out.size(3)),
                                  static_cast<int32_t>(out.size(1))};
  const cmsis_nn_dims bias_dims{1, 1, 1, output_dims.c};

  cmsis_nn_conv_params conv_params{};
  conv_params.input_offset = 0;  // int16 activations are symmetric in CMSIS-NN
  conv_params.output_offset = 0;
  conv_params.stride.h = static_cast<int32_t>(stride[0]);
  conv_params.stride.w = static_cast<int32_t>(stride[1]);
  conv_params.padding.h = static_cast<int32_t>(padding[0]);
  conv_params.padding.w = static_cast<int32_t>(padding[1]);
  conv_params.dilation.h = static_cast<int32_t>(dilation[0]);
  conv_params.dilation.w = static_cast<int32_t>(dilation[1]);
  conv_params.activation.min = static_cast<int32_t>(activation_min);
  conv_params.activation.max = static_cast<int32_t>(activation_max);

  cmsis_nn_per_channel_quant_params quant_params;
  quant_params.multiplier = const_cast<int32_t*>(multipliers.const_data_ptr<int32_t>());
  quant_params.shift = const_cast<int32_t*>(shifts.const_data_ptr<int32_t>());

  // The scratch tensor is sized at compile time for the largest of CMSIS-NN's paths (C and
  // MVE); the build's own path must fit in it.
  const int32_t needed = arm_convolve_wrapper_s16_get_buffer_size(&conv_params, &input_dims,
                                                                  &filter_dims, &output_dims);
  if (needed < 0 || scratch.nbytes() < static_cast<size_t>(needed)) {
    ET_LOG(Error, "quantized_conv2d_s16_out: scratch of %d bytes, CMSIS-NN needs %d",
           static_cast<int>(scratch.nbytes()), static_cast<int>(needed));
    context.fail(Error::Internal);
    return out;
  }
  cmsis_nn_context cmsis_context;
  cmsis_context.buf = needed > 0 ? const_cast<void*>(scratch.const_data_ptr()) : nullptr;
  cmsis_context.size = needed;

  cmsis_nn_bias_data bias_data{bias.const_data_ptr<int64_t>(), false};
  const arm_cmsis_nn_status status = arm_convolve_wrapper_s16(
      &cmsis_context, &conv_params, &quant_params, &input_dims,
      input.const_data_ptr<int16_t>(), &filter_dims, weight.const_data_ptr<int8_t>(),
      &bias_dims, &bias_data, &output_dims, out.mutable_data_ptr<int16_t>());
  if (status != ARM_CMSIS_NN_SUCCESS) {
    ET_LOG(Error, "quantized_conv2d_s16_out: arm_convolve_wrapper_s16 returned %d",
           static_cast<int>(status));
    context.fail(Error::Internal);
  }
  return out;
}

}  // namespace native
}  // namespace orchestrate
