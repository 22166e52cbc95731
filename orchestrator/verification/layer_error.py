"""`verify --per-layer-error`: where the quantization error comes from, layer by layer.

Read from the artifacts folder's two references (the float model and the quantized reference,
the same graph with int8 quantize/dequantize pairs and int8 weights), on the same samples:

- a layer is one activation quantization point of the quantized reference (a value it rounds to
  int8: the model input, each layer's output) together with the int8 weights of the ops that
  compute it since the previous point (a convolution's weights belong to the ReLU after it);
- "at its output": the value there in the quantized reference (every layer quantized) against
  the float model's value at the same node (SNR, dB): how much error has piled up by then;
- "clipped": the share of the float model's values at that point outside the int8 range its
  scale and zero point give (clipping, where upstream's reports of silent accuracy loss start);
- "alone": the float model run with only that layer quantized (its output rounded as the
  quantized reference rounds it, its weights replaced by their int8 values), the final output
  against the float model's (SNR, and the share of the whole program's error power it makes):
  the one-layer-at-a-time ranking numerical debuggers give, and the order a mixed-precision
  search raises layers in.

Figures, not a verdict: nothing here runs the program; `verify` checks that the program
computes the quantized reference.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from orchestrator import numerics
from orchestrator.compilation.quantization_points import (DEQUANTIZE, QUANTIZE, Point,
                                                          clipped_values, modules, points,
                                                          target_name, where)
from orchestrator.verification.twin_verify import as_tuple


@dataclass(frozen=True)
class LayerError:
    node: str  # the float graph's node at the quantization point
    where: str  # the module path and op(s) of the layer
    weights: tuple[str, ...]  # the ops whose int8 weights belong to it
    at_output_snr_db: float | None  # quantized reference vs float at this point
    alone_snr_db: float  # the final output with only this layer quantized
    share: float  # of the whole quantized program's output error power (0..1)
    clipped: float  # of the float values at this point, outside the int8 range (0..1)
    scale: float
    zero_point: int
    modules: tuple[str, ...] = ()  # the source modules of its ops (the plan rows' `module`)

    def to_json(self) -> dict:
        return {"node": self.node, "where": self.where, "weights": list(self.weights),
                "modules": list(self.modules),
                "scale": self.scale, "zero_point": self.zero_point, "clipped": self.clipped,
                "at_output_snr_db": _finite(self.at_output_snr_db),
                "alone_snr_db": _finite(self.alone_snr_db), "share_of_error": self.share}


@dataclass(frozen=True)
class LayerErrorReport:
    pte: str
    samples: int
    inputs: str
    program_snr_db: float  # the quantized reference's output vs the float model's
    layers: tuple[LayerError, ...]  # worst first (largest share)

    def to_json(self) -> dict:
        return {"pte": self.pte, "samples": self.samples, "inputs": self.inputs,
                "program_snr_db": _finite(self.program_snr_db),
                "layers": [layer.to_json() for layer in self.layers]}

    def render_text(self) -> str:
        lines = [f"per-layer quantization error of {self.pte}: {self.samples} sample(s) "
                 f"({self.inputs}); whole quantized reference vs float: SNR "
                 f"{_db(self.program_snr_db)} dB (output 0)",
                 f"  {'#':>2}  {'layer':<40} {'clipped':>8} {'at output':>9} {'alone':>9} "
                 f"{'share':>7}"]
        for rank, layer in enumerate(self.layers, 1):
            lines.append(f"  {rank:>2}  {layer.where[:40]:<40} {layer.clipped:>8.2%} "
                         f"{_db(layer.at_output_snr_db):>9} {_db(layer.alone_snr_db):>9} "
                         f"{layer.share:>7.1%}")
        lines.append("  clipped: the float values at the layer's output outside the int8 range "
                     "of its scale and zero point; "
                     "at output: SNR (dB) of the quantized reference against the float model "
                     "at the layer's output; alone: SNR of the final output with only this "
                     "layer quantized (its output and its weights); share: of the whole "
                     "program's output error power (the shares need not add up to 100%)")
        return "\n".join(lines)


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else value


def _db(value: float | None) -> str:
    if value is None:
        return "-"
    return "exact" if math.isinf(value) else f"{value:.1f}"


def _snr(reference: torch.Tensor, value: torch.Tensor) -> float:
    noise = float(((reference - value) ** 2).sum())
    signal = float((reference ** 2).sum())
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


_BATCH_NORMS = ("aten.batch_norm", "aten._native_batch_norm_legit_no_training")


def _folded_batch_norm(module: torch.fx.GraphModule, name: str):
    """The BatchNorm the quantized reference folded into the float graph's convolution or
    linear `name` (its only user), and that BatchNorm's per-channel scale gamma/sqrt(var+eps);
    else None. The folded layer's output is the BatchNorm's."""
    node = next((n for n in module.graph.nodes if n.name == name), None)
    if node is None or len(node.users) != 1:
        return None
    bn = next(iter(node.users))
    if bn.op != "call_function" or target_name(bn) not in _BATCH_NORMS or bn.args[0] is not node:
        return None
    value = [functools.reduce(getattr, a.target.split("."), module)
             if isinstance(a, torch.fx.Node) and a.op == "get_attr" else None
             for a in bn.args[1:5]]
    weight, _, _, variance = value
    plain = target_name(bn) == "aten.batch_norm"
    eps = bn.args[7] if plain else bn.args[6]
    if weight is None or variance is None:
        return None
    output = bn if plain else next(iter(bn.users))
    return output.name, (weight / torch.sqrt(variance + eps)).detach()


class _OneLayer(torch.fx.Interpreter):
    """The float graph with one layer quantized: its weights replaced, its output rounded.

    Where the quantized reference folded a BatchNorm into a convolution or linear, the float
    graph still has both: the layer's int8 weights are unfolded (divided by the BatchNorm's
    per-channel scale, which the BatchNorm then applies again), its folded bias left to the
    BatchNorm, and its output rounded after the BatchNorm."""

    def __init__(self, module: torch.fx.GraphModule, point: Point | None) -> None:
        super().__init__(module)
        self.point = point
        self.seen: dict[str, torch.Tensor] = {}
        self.rounded_at = point.node if point is not None else None
        self.weights = dict(point.weights) if point is not None else {}
        for name in list(self.weights):
            folded = _folded_batch_norm(module, name)
            if folded is None:
                continue
            output, scale = folded
            if name == self.rounded_at:
                self.rounded_at = output
            weight = self.weights[name].get(1)
            self.weights[name] = {} if weight is None else {1: weight / scale.reshape(
                -1, *([1] * (weight.dim() - 1)))}

    def run_node(self, node):
        if node.name in self.weights:
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            args = list(args)
            for position, value in self.weights[node.name].items():
                if position < len(args):  # a bias the float graph's op does not take: folded
                    args[position] = value
            result = getattr(self, node.op)(node.target, tuple(args), kwargs)
        else:
            result = super().run_node(node)
        if self.point is not None and node.name == self.rounded_at and \
                isinstance(result, torch.Tensor) and result.is_floating_point():
            p = self.point
            result = torch.fake_quantize_per_tensor_affine(result, p.scale, p.zero_point,
                                                           p.quant_min, p.quant_max)
        if isinstance(result, torch.Tensor):
            self.seen[node.name] = result
        return result


def layer_errors(pte: str, float_module: torch.fx.GraphModule,
                 quantized_module: torch.fx.GraphModule, samples, inputs: str
                 ) -> LayerErrorReport:
    """The report (see the module docstring) on `samples` (model inputs)."""
    found = points(quantized_module)
    float_outs, quantized_outs, at_output = [], [], {p.node: [] for p in found}
    clipped = {p.node: [0, 0] for p in found}  # values outside the range, values
    # the float graph's node at each point (after a BatchNorm the quantized reference folded)
    at_float = {p.node: _OneLayer(float_module, p).rounded_at for p in found}
    with torch.no_grad(), numerics.single_threaded():
        for sample in samples:
            plain = _OneLayer(float_module, None)
            float_outs.append(as_tuple(plain.run(*sample))[0].float())
            quantized = _OneLayer(quantized_module, None)
            quantized_outs.append(as_tuple(quantized.run(*sample))[0].float())
            for point in found:
                value = plain.seen.get(at_float[point.node])
                if value is not None and value.is_floating_point():
                    clipped[point.node][0] += clipped_values(value, point)
                    clipped[point.node][1] += value.numel()
                user = next((u for u in quantized_module.graph.nodes
                             if u.op == "call_function" and target_name(u) == QUANTIZE
                             and isinstance(u.args[0], torch.fx.Node)
                             and u.args[0].name == point.node), None)
                rounded = next((d for d in (user.users if user is not None else ())
                                if target_name(d) in DEQUANTIZE), None)
                if rounded is not None and at_float[point.node] in plain.seen and \
                        rounded.name in quantized.seen:
                    at_output[point.node].append((plain.seen[at_float[point.node]].float(),
                                                  quantized.seen[rounded.name].float()))
        reference = torch.cat([o.reshape(-1) for o in float_outs])
        whole = torch.cat([o.reshape(-1) for o in quantized_outs])
        whole_noise = float(((reference - whole) ** 2).sum())
        layers = []
        for point in found:
            alone = torch.cat([as_tuple(_OneLayer(float_module, point).run(*s))[0].float()
                               .reshape(-1) for s in samples])
            noise = float(((reference - alone) ** 2).sum())
            pairs = at_output[point.node]
            at = (_snr(torch.cat([a.reshape(-1) for a, _ in pairs]),
                       torch.cat([b.reshape(-1) for _, b in pairs])) if pairs else None)
            out, total = clipped[point.node]
            layers.append(LayerError(point.node, where(float_module, point),
                                     tuple(point.weights), at, _snr(reference, alone),
                                     noise / whole_noise if whole_noise else 0.0,
                                     out / total if total else 0.0, point.scale,
                                     point.zero_point, modules(float_module, point)))
    layers.sort(key=lambda layer: -layer.share)
    return LayerErrorReport(pte, len(samples), inputs, _snr(reference, whole), tuple(layers))
