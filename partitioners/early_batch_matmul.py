"""Lower a quantized `bmm` with operands of two fake dtypes before upstream's retrace fails on it.

Upstream defect (ExecuTorch 1.5.1, CPU-only attention): after `FoldAndAnnotateQParamsPass` the
graph still holds `aten` ops over int8 values, and each later pass retraces it with fake tensors.
A folded `aten.linear` retraces to int32 (int8 x int8 + int32 bias promotes), so every value
computed from it (the q, k and v chunks of an attention block's qkv split) is int32 in that
retrace, while a value a real quantize node produced is int8 (the softmax's output requantized to
the second matmul's input scale). The second `bmm` (attention x v) then gets an int8 and an int32
operand, and `ReplaceScalarWithTensorArgPass`'s retrace fails in torch's bmm meta kernel
("expected scalar type torch.int8 but found torch.int32"): the whole pass list stops, and the bmm
was kept in float on the portable kernel (5.6% of the block's MACs). The first `bmm` (q x k^T,
both operands from the split) retraces as int32 x int32 and is lowered normally.

This pass runs upstream's own `bmm` substitution (the function `AtenToCortexMPass` registers,
called as it would call it, so the plan's CMSIS-NN decision is recorded as for any other op) right
after `FoldAndAnnotateQParamsPass`, for exactly those `bmm` nodes whose operands retrace to
different dtypes: `cortex_m.quantized_batch_matmul`'s meta kernel checks shapes only and returns
int8, so the later retraces pass, and `AtenToCortexMPass` then lowers the linear before it as
usual. Every other `bmm` is left to `AtenToCortexMPass`, so programs that compiled before are
unchanged.
"""

from __future__ import annotations

from executorch.backends.arm._passes.fold_qdq_with_annotated_qparams_pass import (
    FoldAndAnnotateQParamsPass,
)
from executorch.backends.cortex_m.passes.aten_to_cortex_m_pass import AtenToCortexMPass
from executorch.backends.transforms.aten_to_dialect_pass import AtenToDialectPass
from executorch.exir.dialects._ops import ops as exir_ops
from torch.fx import GraphModule
from torch.fx.passes.infra.pass_manager import PassResult

# Meta key on the lowered node: its operands' dtypes in upstream's retrace, for the plan.
EARLY_BMM_KEY = "orchestrate_early_batch_matmul"

_BMM = exir_ops.edge.aten.bmm.default


def _retraced_dtypes(node) -> tuple:
    return tuple(getattr(arg.meta.get("val"), "dtype", None) for arg in node.args[:2]
                 if hasattr(arg, "meta"))


class MixedDtypeBatchMatmulPass(AtenToCortexMPass):
    """Upstream's bmm substitution, early, for a quantized bmm whose operands retrace to two
    dtypes (see the module docstring)."""

    def call(self, graph_module: GraphModule) -> PassResult:
        # Looked up when the pass runs, so a wrapper installed around upstream's table (the
        # CMSIS-NN decision recorder) sees this call too.
        substitution = AtenToCortexMPass._DIALECT_SUBSTITUTIONS.get(_BMM)
        mixed = [n for n in graph_module.graph.nodes
                 if n.op == "call_function" and n.target == _BMM
                 and n.meta.get("input_qparams") and n.meta.get("output_qparams")
                 and len(set(_retraced_dtypes(n))) > 1]
        if substitution is None or not mixed:
            return PassResult(graph_module, False)
        for node in mixed:
            node.meta[EARLY_BMM_KEY] = tuple(str(d).replace("torch.", "")
                                             for d in _retraced_dtypes(node))

        def only_mixed(node, dialect_pass):
            return substitution(node, dialect_pass) if node in mixed else None

        self._DIALECT_SUBSTITUTIONS = {_BMM: only_mixed}  # this instance only
        return AtenToDialectPass.call(self, graph_module)


def with_early_batch_matmul(passes: list) -> list:
    """Upstream's pass list with MixedDtypeBatchMatmulPass right after FoldAndAnnotateQParamsPass."""
    passes = list(passes)
    if FoldAndAnnotateQParamsPass in passes:
        passes.insert(passes.index(FoldAndAnnotateQParamsPass) + 1, MixedDtypeBatchMatmulPass)
    return passes
