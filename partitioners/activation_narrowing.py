"""Fuse the activations ExecuTorch 1.5.1's ActivationFusionPass declines on a range check.

Upstream defect: `ActivationFusionPass` fuses `conv/linear/add -> relu/hardtanh/clamp` by giving
the producer the activation's output qparams, but declines when the activation's quantized
bounds are narrower than its quantization range ("Cannot fuse activation ... as qmin is out of
range": quantize(0) > qmin, e.g. a ReLU whose output scale is shared with a consumer that saw
negative values). The producer is then left as an `aten` op with int8 inputs (its dequantize
folded) and no output qparams, so it runs on the portable float kernel over raw int8 values:
measured 211 int8 steps off on a conv -> ReLU whose output also fed an `index_select`. The
fusion is exact for any bounds: the producer's output is requantized to the activation's scale
and zero point and clamped to [quantize(min), quantize(max)], which is what the activation
computes. This pass does that for the cases upstream declined, right after it.
"""

from __future__ import annotations

from executorch.backends.arm._passes.quant_args import QuantArgs
from executorch.backends.cortex_m.passes.activation_fusion_pass import ActivationFusionPass
from executorch.backends.cortex_m.passes.passes_utils import get_activation_bounds, quantize_val
from executorch.exir.pass_base import ExportPass
from torch.fx import GraphModule
from torch.fx.passes.infra.pass_manager import PassResult

from partitioners.records import ORIGIN_KEY

# Meta key on the producer: (activation name, qmin, qmax) that this pass fused, for the plan.
NARROWED_KEY = "orchestrate_narrowed_activation"


class NarrowedActivationFusionPass(ExportPass):
    """Fuse an activation into its producer with bounds narrower than its quantization range."""

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for node in list(graph_module.graph.nodes):
            if node.op != "call_function" or node.target not in ActivationFusionPass.TARGETS:
                continue
            producer = node.args[0]
            if (getattr(producer, "op", None) != "call_function"
                    or producer.target not in ActivationFusionPass.FUSE_OPS
                    or producer.target in ActivationFusionPass.MAX_POOL_OPS
                    or len(producer.users) != 1
                    or "input_qparams" not in producer.meta
                    or producer.meta.get("output_qparams")  # upstream fused it, or no need
                    or not node.meta.get("output_qparams")):
                continue
            if "hardsigmoid" in str(node.target):
                continue  # upstream rescales for hardsigmoid; its declines stay declined
            qparams = node.meta["output_qparams"][0]
            if not isinstance(qparams.scale, float) or not isinstance(qparams.zp, int):
                continue
            bounds = get_activation_bounds(node)
            if bounds is None:
                continue
            low, high = bounds
            qmin = int(quantize_val(low, qparams.scale, qparams.zp, qparams.qmin, qparams.qmax)
                       if low is not None else qparams.qmin)
            qmax = int(quantize_val(high, qparams.scale, qparams.zp, qparams.qmin, qparams.qmax)
                       if high is not None else qparams.qmax)
            fused = qparams._asdict()
            fused.update(qmin=max(qparams.qmin, qmin), qmax=min(qparams.qmax, qmax))
            producer.meta["output_qparams"] = {0: QuantArgs(**fused)}
            producer.meta[NARROWED_KEY] = (node.meta.get(ORIGIN_KEY, node.name), fused["qmin"],
                                           fused["qmax"])
            node.replace_all_uses_with(producer)
            graph_module.graph.erase_node(node)
            modified = True
        if modified:
            graph_module.recompile()
        return PassResult(graph_module, modified)


def with_narrowed_fusion(passes: list) -> list:
    """Upstream's pass list with NarrowedActivationFusionPass right after ActivationFusionPass."""
    passes = list(passes)
    if ActivationFusionPass in passes:
        passes.insert(passes.index(ActivationFusionPass) + 1, NarrowedActivationFusionPass)
    return passes
