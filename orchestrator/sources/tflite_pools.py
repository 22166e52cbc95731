"""A `.tflite`'s average pools: the element count each window divides by, and the pools that run
on the NPU exactly as TFLM computes them (`RawSumPool`); tflite_module.py builds them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.sources.tflite_file import TfliteGraph, TfliteOperator


def same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TFLite's SAME padding (before, after): the extra row or column goes after."""
    effective = (kernel - 1) * dilation + 1
    out = (size + stride - 1) // stride
    total = max((out - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


@dataclass(frozen=True)
class RawSumPool:
    """An AVERAGE_POOL_2D over one power-of-two element count, computed on the NPU exactly as
    TFLM computes it.

    TFLM sums the window's raw int8 codes (zero point included) and divides, rounding a tie away
    from zero; a TOSA AVG_POOL2D subtracts the zero point first and rounds a tie up, so an even
    count differs on ties (which is why such a pool otherwise runs on CMSIS-NN). Rebuilt as a
    depthwise convolution whose weights are 1/N (the int8 code 8 at scale 1/(8N)) and whose
    bias is scale x zero point (the int32 code 8 x N x zero point), the accumulator is 8 x the
    raw sum; its output read with zero point 0 (the same scale), the requantization by 1/(8N)
    (multiplier 2^30, TFLite rounding) is round-half-away of sum / N: TFLM's codes. Those codes
    then stand for scale x code, the file's value plus scale x zero point, so the layers reading
    them (through reshapes) must be FULLY_CONNECTED layers, whose biases take the file's zero
    point times each row's weights off: the same accumulators as TFLM's."""

    name: str
    count: int
    channels: int
    scale: float
    zero_point: int
    codes: tuple[int, ...]  # the pool's output tensor and the reshapes of it
    consumers: tuple[int, ...]  # the FULLY_CONNECTED operators reading them
    weight: int  # the synthetic tensor indices of the convolution's weight and bias
    bias: int


def raw_sum_pools(graph: TfliteGraph) -> dict[int, RawSumPool]:
    """The file's average pools that RawSumPool computes: int8, one unpadded window count that
    is a power of two of at least 2, no fused activation, the same quantization in and out, and
    read only through RESHAPE/SQUEEZE by FULLY_CONNECTED layers with constant symmetric int8
    weights and an int32 bias (none a graph output)."""
    readers: dict[int, list[TfliteOperator]] = {}
    for op in graph.operators:
        for index in op.inputs:
            readers.setdefault(index, []).append(op)
    found = {}
    for op in graph.operators:
        if op.opcode != "AVERAGE_POOL_2D" or op.options.get("fused_activation_function") \
                not in (None, "None"):
            continue
        x, out = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
        count = op.options["filter_height"] * op.options["filter_width"]
        if x.dtype != np.int8 or len(x.shape) != 4 or count < 2 or count & (count - 1) or \
                pool_window_counts(graph, op) != (count,) or len(x.scales) != 1 or \
                (x.scales, x.zero_points) != (out.scales, out.zero_points):
            continue  # (one count, the whole window: no padding reaches a window)
        codes, frontier, consumers, fits = [], [op.outputs[0]], [], True
        while frontier and fits:
            index = frontier.pop()
            codes.append(index)
            fits = index not in graph.outputs
            for reader in readers.get(index, []):
                if reader.opcode in ("RESHAPE", "SQUEEZE") and reader.inputs[0] == index:
                    frontier.append(reader.outputs[0])
                elif reader.opcode == "FULLY_CONNECTED" and reader.inputs[0] == index and \
                        len(reader.inputs) > 2 and reader.inputs[2] >= 0 and \
                        graph.tensors[reader.inputs[1]].data is not None and \
                        graph.tensors[reader.inputs[1]].dtype == np.int8 and \
                        not any(graph.tensors[reader.inputs[1]].zero_points) and \
                        graph.tensors[reader.inputs[2]].data is not None and \
                        graph.tensors[reader.inputs[2]].dtype == np.int32:
                    consumers.append(reader.index)
                else:
                    fits = False
        if fits and consumers:
            base = -2 * (op.index + 1)  # synthetic tensor indices: no file tensor is negative
            found[op.index] = RawSumPool(out.name, count, x.shape[3], float(x.scales[0]),
                                         int(x.zero_points[0]), tuple(codes), tuple(consumers),
                                         base, base - 1)
    return found


def pool_window_counts(graph: TfliteGraph, op: TfliteOperator) -> tuple[int, ...]:
    """Every element count an average pool divides by (fewer at a SAME-padded edge)."""
    options, x = op.options, graph.tensors[op.inputs[0]]
    out = graph.tensors[op.outputs[0]]
    per_axis = []
    for axis, (kernel, stride) in enumerate(((options["filter_height"], options["stride_h"]),
                                             (options["filter_width"], options["stride_w"]))):
        size, outputs = x.shape[1 + axis], out.shape[1 + axis]
        before = same_padding(size, kernel, stride, 1)[0] \
            if options.get("padding") == "SAME" else 0
        per_axis.append({min(i * stride - before + kernel, size) - max(i * stride - before, 0)
                         for i in range(outputs)})
    return tuple(sorted({rows * columns for rows in per_axis[0] for columns in per_axis[1]}))
