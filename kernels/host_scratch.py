"""Where the host's CMSIS-NN needs more scratch than a program planned.

A convolution's or pool's scratch tensor is sized when the program is compiled, for the target's
tier (ExecuTorch's Cortex-M passes call CMSIS-NN's buffer-size functions for MVE or DSP). The
host build of the device kernels runs CMSIS-NN's C path, which for some shapes needs more (an
im2col buffer the MVE path does without: a 1x7 stride-2 convolution on the M55), and upstream
checks the size only under CORTEX_M_ENABLE_RUNTIME_CHECKS, off as on the device. There the host
kernel writes past the planned scratch: what the host runtime then does (a refused argument
check, a crash) says nothing about the program on its device. The compile's device check and
verify's host-runtime method both ask this module first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernels.program_view import ProgramView

# Kernel -> (kind, argument index of its scratch tensor).
_SCRATCH_KERNELS = {
    "cortex_m::quantized_conv2d": ("conv", 12), "cortex_m::quantized_conv2d_nhwc": ("conv", 12),
    "cortex_m::quantized_depthwise_conv2d": ("dw", 13),
    "cortex_m::quantized_depthwise_conv2d_nhwc": ("dw", 13),
    "cortex_m::quantized_avg_pool2d": ("pool", 8),
    "cortex_m::quantized_avg_pool2d_nhwc": ("pool", 8)}


@dataclass(frozen=True)
class ScratchShortfall:
    """One kernel call whose scratch is smaller than the host's C path needs."""

    instruction: int
    operator: str  # "cortex_m::quantized_conv2d.out"
    needed_bytes: int
    planned_bytes: int

    def reason(self) -> str:
        return (f"the host's CMSIS-NN C path needs {self.needed_bytes} B of scratch; the program "
                f"planned {self.planned_bytes} B for its tier, so the host kernel writes past it")


def scratch_shortfalls(view: ProgramView) -> tuple[ScratchShortfall, ...]:
    """Every kernel call of `view` whose planned scratch the host's C path overruns."""
    found = []
    for call in view.kernel_calls():
        sizes = c_path_scratch_bytes(view, call.operator.name, call.args)
        if sizes is not None and sizes[0] > sizes[1]:
            found.append(ScratchShortfall(call.index,
                                          f"{call.operator.name}.{call.operator.overload}",
                                          *sizes))
    return tuple(found)


def c_path_scratch_bytes(view: ProgramView, op: str, args) -> tuple[int, int] | None:
    """(bytes the C path needs, bytes the program planned) for a kernel with a scratch tensor,
    by the same CMSIS-NN size functions the AOT pass calls (executorch's cmsis_nn bindings)."""
    if op not in _SCRATCH_KERNELS:
        return None
    try:
        from executorch.backends.cortex_m.library import (  # lazy: optional (cortex_m library: None without it)
            cmsis_nn)
    except ImportError:
        return None
    kind, scratch_at = _SCRATCH_KERNELS[op]
    values = view.values

    def sizes(at):
        return list(values[args[at]].sizes)

    def ints(at):
        value = values[args[at]]
        if value.kind == "IntList":
            return [int(values[i].scalar) for i in value.items]
        return int(value.scalar)

    nhwc = op.endswith("_nhwc")
    planned = math.prod(sizes(scratch_at))
    source, out = sizes(0), sizes(len(args) - 1)
    if not nhwc:
        source = [source[0], source[2], source[3], source[1]]
        out = [out[0], out[2], out[3], out[1]]
    scalar, a8w8 = cmsis_nn.Backend.SCALAR, cmsis_nn.DataType.A8W8
    if kind == "pool":
        needed = cmsis_nn.avgpool_buffer_size(scalar, a8w8, dim_dst_width=out[2], ch_src=source[3])
        return int(needed), planned
    weight = sizes(1)
    common = dict(input_nhwc=source, output_nhwc=out, stride_hw=ints(3), padding_hw=ints(4),
                  dilation_hw=ints(5))
    if kind == "conv":
        needed = cmsis_nn.convolve_wrapper_buffer_size(
            scalar, a8w8, filter_nhwc=weight, input_offset=ints(6), output_offset=ints(7),
            activation_min=ints(10), activation_max=ints(11), **common)
    else:
        _, kernel_h, kernel_w, c_out = weight
        needed = cmsis_nn.depthwise_conv_wrapper_buffer_size(
            scalar, a8w8, filter_nhwc=[c_out, kernel_h, kernel_w, 1], ch_mult=ints(6),
            input_offset=ints(7), output_offset=ints(8), activation_min=ints(11),
            activation_max=ints(12), **common)
    return int(needed), planned
