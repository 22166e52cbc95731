"""How far two correct float kernels may differ, and what the twin does with a device's float
values inside that distance.

Float values of two correct kernels differ by their summation order (torch against the portable
C kernel; the Cortex-M build contracts a multiply-add into one rounding): a result summed over R
terms carries up to about R float32 roundings of the largest magnitude involved. Two float
tensors agree when every element is within FLOAT_ULPS_PER_TERM x R ulps of the expected tensor's
largest magnitude, R being the op's reduction length (input elements per output element, at
least 1). Integer and bool tensors must be equal.

Agreeing within the bound is not enough when the float is then quantized: a value on a rounding
boundary (x / scale a hair either side of k + 0.5) goes to one step on one side and the next on
the other, and that step propagates. So where a device's run logged its float values (the host
runtime's traced run), the twin can take them (`TwinProgram.run(device_floats=...)`): at each
instruction whose float output differs from its own within the bound, it carries on from the
device's value, and every integer op after it is still the twin's own computation, so the two
must then agree byte for byte. A float beyond the bound is never taken.
"""

from __future__ import annotations

import torch

FLOAT_ULPS_PER_TERM = 4
FLOAT32_EPS = float(torch.finfo(torch.float32).eps)


def float_bound(expected: torch.Tensor, reduction: int) -> float:
    """The largest difference two correct float kernels may show on `expected`."""
    if not expected.dtype.is_floating_point or not expected.numel():
        return 0.0
    peak = float(expected.detach().abs().double().max())
    return FLOAT_ULPS_PER_TERM * max(1, reduction) * FLOAT32_EPS * peak


def within_float_bound(got: torch.Tensor, expected: torch.Tensor, reduction: int) -> bool:
    """`got` is a float tensor of `expected`'s shape and dtype, every element within the bound
    (no NaN where `expected` has none)."""
    if got.dtype != expected.dtype or not got.dtype.is_floating_point or \
            tuple(got.shape) != tuple(expected.shape):
        return False
    if not got.numel():
        return True
    difference = (got.double() - expected.double()).abs()
    both_nan = torch.isnan(got) & torch.isnan(expected)
    difference = torch.where(both_nan, torch.zeros_like(difference), difference)
    return not bool(torch.isnan(difference).any()) and \
        float(difference.max()) <= float_bound(expected, reduction)


def reduction_length(run, entry) -> int:
    """Input elements per output element of an instruction of a traced twin run (`entry` of
    `run.op_trace`, counted over the values `run.intermediates` holds): its R above."""
    read = sum(run.intermediates[i].numel() for i in entry.inputs if i in run.intermediates)
    written = sum(run.intermediates[i].numel() for i in entry.outputs if i in run.intermediates)
    return max(1, read // max(1, written))
