/*
 * orchestrate::quantized_linear_s16.out: an int16-activation, int8-weight fully connected layer
 * on CMSIS-NN's arm_fully_connected_s16. That function takes one requantization multiplier for
 * all outputs, while the quantizer gives the weights one scale per output channel: each output
 * channel is one call with its own multiplier and shift (a one-row weight matrix). Bias int64,
 * as the s16 kernels take it. The checks are those upstream's cortex_m::quantized_linear makes,
 * for int16.
 */

#include <executorch/backends/cortex_m/ops/cortex_m_ops_common.h>

namespace orchestrate {
namespace native {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;

namespace {

bool refuse(KernelRuntimeContext& context, const char* why) {
  ET_LOG(Error, "quantized_linear_s16_out: %s", why);
  context.fail(Error::InvalidArgument);
  return false;
}

bool arguments_valid(KernelRuntimeContext& context, const Tensor& input, const Tensor& weights,
                     const Tensor& bias, const Tensor& out, const Tensor& multipliers,
                     const Tensor& shifts) {
  if (input.scalar_type() != ScalarType::Short || out.scalar_type() != ScalarType::Short) {
    return refuse(context, "input and output must be int16");
  }
  if (weights.scalar_type() != ScalarType::Char || weights.dim() != 2) {
    return refuse(context, "weights must be a 2-D int8 tensor");
  }
  const int64_t out_features = weights.size(0);
  const int64_t in_features = weights.size(1);
  if (input.dim() < 1 || input.size(input.dim() - 1) != in_features ||
      out.dim() < 1 || out.size(out.dim() - 1) != out_features ||
      input.numel() / in_features != out.numel() / out_features) {
    return refuse(context, "input, weights and output sizes disagree");
  }
  if (bias.scalar_type() != ScalarType::Long || bias.numel() != out_features) {
    return refuse(context, "bias must be int64, one per output feature");
  }
  if (multipliers.scalar_type() != ScalarType::Int || shifts.scalar_type() != ScalarType::Int ||
      multipliers.numel() != out_features || shifts.numel() != out_features) {
    return refuse(context, "int32 multipliers and shifts, one per output feature");
  }
  return true;
}

}  // namespace

Tensor& quantized_linear_s16_out(KernelRuntimeContext& context, const Tensor& input,
                                 const Tensor& weights, const Tensor& bias,
                                 const Tensor& multipliers, const Tensor& shifts,
                                 const int64_t activation_min, const int64_t activation_max,
                                 Tensor& out) {
  if (!arguments_valid(context, input, weights, bias, out, multipliers, shifts)) {
    return out;
  }
  const int32_t out_features = static_cast<int32_t>(weights.size(0));
  const int32_t in_features = static_cast<int32_t>(weights.size(1));
  const int32_t rows = static_cast<int32_t>(input.numel() / in_features);

  cmsis_nn_fc_params fc_params{};
  fc_params.input_offset = 0;  // int16 activations are symmetric in CMSIS-NN
  fc_params.filter_offset = 0;
  fc_params.output_offset = 0;
  fc_params.activation.min = static_cast<int32_t>(activation_min);
  fc_params.activation.max = static_cast<int32_t>(activation_max);
  // arm_fully_connected_s16 needs no buffer (arm_fully_connected_s16_get_buffer_size is 0).
  cmsis_nn_context cmsis_context{nullptr, 0};
  const cmsis_nn_dims input_dims{1, 1, 1, in_features};
  const cmsis_nn_dims filter_dims{in_features, 1, 1, 1};
  const cmsis_nn_dims bias_dims{1, 1, 1, 1};
  const cmsis_nn_dims output_dims{1, 1, 1, 1};

  const int16_t* in = input.const_data_ptr<int16_t>();
  const int8_t* w = weights.const_data_ptr<int8_t>();
  const int64_t* b = bias.const_data_ptr<int64_t>();
  const int32_t* m = multipliers.const_data_ptr<int32_t>();
  const int32_t* s = shifts.const_data_ptr<int32_t>();
  int16_t* dst = out.mutable_data_ptr<int16_t>();
  for (int32_t row = 0; row < rows; ++row) {
    for (int32_t channel = 0; channel < out_features; ++channel) {
      const cmsis_nn_per_tensor_quant_params quant_params{m[channel], s[channel]};
      const arm_cmsis_nn_status status = arm_fully_connected_s16(
          &cmsis_context, &fc_params, &quant_params, &input_dims, in + row * in_features,
          &filter_dims, w + channel * in_features, &bias_dims, b + channel, &output_dims,
          dst + row * out_features + channel);
      if (status != ARM_CMSIS_NN_SUCCESS) {
        ET_LOG(Error, "quantized_linear_s16_out: arm_fully_connected_s16 returned %d",
               static_cast<int>(status));
        context.fail(Error::Internal);
        return out;
      }
    }
  }
  return out;
}

}  // namespace native
}  // namespace orchestrate
