"""Where the quantized reference rounds activations to int8, and how much of them it clips.

A quantization point is one `quantize_per_tensor` of an activation in the quantized reference
(convert_pt2e's graph: the model input, each layer's output), with the scale and zero point the
calibration chose, and the int8 weights of the ops that compute it since the points before it
(a convolution's weights go with the ReLU after it). Its clipping rate on some samples is the
share of the float model's values at that node that fall outside the int8 range of its scale
and zero point: `round(x / scale) + zero_point` below `quant_min` or above `quant_max`.

The plan reports each point's scale and clipping rate on the calibration samples (the values
the observers saw); `verify --per-layer-error` on the samples it is given
(orchestrator/verification/layer_error.py). Both count with `clipped_values`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from orchestrator import numerics

QUANTIZE = "quantized_decomposed.quantize_per_tensor"
DEQUANTIZE = ("quantized_decomposed.dequantize_per_tensor",
              "quantized_decomposed.dequantize_per_channel")


def target_name(node) -> str:
    return str(node.target).removesuffix(".default")


@dataclass(frozen=True)
class Point:
    node: str  # the float node whose output is rounded
    scale: float
    zero_point: int
    quant_min: int
    quant_max: int
    weights: dict  # float node name -> {argument position: dequantized int8 weight}


def points(quantized: torch.fx.GraphModule) -> list[Point]:
    """Each activation quantization point of the quantized reference, in graph order, with the
    int8 weights of the ops between it and the points before it."""
    values = {}  # the dequantized int8 constants, evaluated once

    def constant(node) -> torch.Tensor | None:
        """A dequantize of a constant (an int8 weight or bias), evaluated; else None."""
        if node.op != "call_function" or target_name(node) not in DEQUANTIZE:
            return None
        source = node.args[0]
        if not (isinstance(source, torch.fx.Node) and source.op == "get_attr"):
            return None
        if node.name not in values:
            args = [getattr(quantized, a.target) if isinstance(a, torch.fx.Node) and
                    a.op == "get_attr" else a for a in node.args]
            values[node.name] = node.target(*args, **node.kwargs)
        return values[node.name]

    found = []
    for node in quantized.graph.nodes:
        if node.op != "call_function" or target_name(node) != QUANTIZE:
            continue
        source = node.args[0]
        if not isinstance(source, torch.fx.Node):
            continue
        weights: dict = {}
        stack, seen = [source], set()
        while stack:  # back to the previous activation points
            current = stack.pop()
            if current in seen or current.op != "call_function":
                continue
            seen.add(current)
            if target_name(current) in DEQUANTIZE:
                continue
            for position, arg in enumerate(current.args):
                if isinstance(arg, torch.fx.Node):
                    value = constant(arg)
                    if value is not None:
                        weights.setdefault(current.name, {})[position] = value
                    else:
                        stack.append(arg)
        found.append(Point(source.name, float(node.args[1]), int(node.args[2]),
                           int(node.args[3]), int(node.args[4]), weights))
    return found


def clipped_values(value: torch.Tensor, point: Point) -> int:
    """How many of `value`'s elements the point's scale and zero point put outside its range."""
    codes = torch.round(value / point.scale) + point.zero_point
    return int(((codes < point.quant_min) | (codes > point.quant_max)).sum())


def where(float_module: torch.fx.GraphModule, point: Point) -> str:
    """The point's module path and the ops it covers, e.g. 'features.1 (conv2d + relu)'."""
    node = next((n for n in float_module.graph.nodes if n.name == point.node), None)
    stack = node.meta.get("nn_module_stack") if node is not None else None
    path = list(stack.values())[-1][0] if stack else ""
    ops = list(dict.fromkeys([*point.weights, point.node]))
    return f"{path} ({' + '.join(ops)})" if path else " + ".join(ops)


def modules(float_module: torch.fx.GraphModule, point: Point) -> tuple[str, ...]:
    """The innermost source module (nn_module_stack path) of each op the point covers, as the
    plan's rows name them (`module`); ops of the model's own forward have none."""
    nodes = {n.name: n for n in float_module.graph.nodes}
    found = []
    for name in dict.fromkeys([*point.weights, point.node]):
        stack = nodes[name].meta.get("nn_module_stack") if name in nodes else None
        path = str(list(stack.values())[-1][0]) if stack else ""
        if path and path not in found:
            found.append(path)
    return tuple(found)


class Recorder(torch.fx.Interpreter):
    """Runs a graph and keeps every tensor value by node name (`seen`)."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self.seen: dict[str, torch.Tensor] = {}

    def run_node(self, node):
        result = super().run_node(node)
        if isinstance(result, torch.Tensor):
            self.seen[node.name] = result
        return result


@dataclass(frozen=True)
class ActivationRange:
    """One quantization point on a set of samples: its scale, zero point and clipping rate."""

    node: str
    where: str
    scale: float
    zero_point: int
    quant_min: int
    quant_max: int
    clipped: int  # float values outside the int8 range
    values: int  # float values seen at the point (0: the float model has no such node)
    low: float | None  # the smallest and largest float value seen
    high: float | None

    @property
    def clipping_rate(self) -> float | None:
        return self.clipped / self.values if self.values else None

    @property
    def range(self) -> tuple[float, float]:
        """The float interval int8 covers here: (quant_min - zp) * scale .. (quant_max - zp) * scale."""
        return ((self.quant_min - self.zero_point) * self.scale,
                (self.quant_max - self.zero_point) * self.scale)

    def to_json(self) -> dict:
        low, high = self.range
        return {"node": self.node, "where": self.where, "scale": self.scale,
                "zero_point": self.zero_point, "int8_range": [low, high],
                "clipped": self.clipped, "values": self.values,
                "clipping_rate": self.clipping_rate, "min": self.low, "max": self.high}


@dataclass(frozen=True)
class ActivationRanges:
    """Every quantization point of a program on `samples` samples (`source`, `method`)."""

    samples: int
    source: str  # where the samples came from
    method: str  # the calibration method that chose the scales
    points: tuple[ActivationRange, ...]  # in graph order

    def to_json(self) -> dict:
        return {"samples": self.samples, "source": self.source, "method": self.method,
                "points": [p.to_json() for p in self.points]}


def activation_ranges(float_module: torch.fx.GraphModule, quantized: torch.fx.GraphModule,
                      samples, source: str, method: str) -> ActivationRanges:
    """Each quantization point of `quantized` with its clipping rate on `samples` (model inputs),
    counted on the float model's values at the same node."""
    found = points(quantized)
    counts = [[0, 0, None, None] for _ in found]  # clipped, values, min, max
    with torch.no_grad(), numerics.single_threaded():
        for sample in samples:
            recorder = Recorder(float_module)
            recorder.run(*sample)
            for point, count in zip(found, counts):
                value = recorder.seen.get(point.node)
                if value is None or not value.is_floating_point() or not value.numel():
                    continue
                count[0] += clipped_values(value, point)
                count[1] += value.numel()
                low, high = float(value.min()), float(value.max())
                count[2] = low if count[2] is None else min(count[2], low)
                count[3] = high if count[3] is None else max(count[3], high)
    return ActivationRanges(len(samples), source, method, tuple(
        ActivationRange(p.node, where(float_module, p), p.scale, p.zero_point, p.quant_min,
                        p.quant_max, *count) for p, count in zip(found, counts)))
