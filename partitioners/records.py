"""Records shared by CPU routing and device legalization: node origins and upstream workarounds."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Meta key holding a node's name before the Cortex-M passes rewrite it; the passes carry `meta`
# across rewrites, so a CMSIS-NN decision can be joined back to the node the plan shows.
ORIGIN_KEY = "orchestrate_origin"
# Set by a legalization that moves a node off its CMSIS-NN kernel: (kernel, the limit it hit).
MOVED_OFF_CMSIS_KEY = "orchestrate_moved_off_cmsis"


def module_of(node) -> tuple[str, str]:
    """(path, type name) of the innermost module that produced `node`; ("", "") at model level."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, type_name in reversed(list(stack.values())):
        if path:
            return str(path), str(type_name).rsplit(".", 1)[-1].rstrip("'>")
    return "", ""


def stamp_origins(graph_module: torch.fx.GraphModule) -> None:
    """Tag each node with its pre-CPU-pass name."""
    for node in graph_module.graph.nodes:
        node.meta.setdefault(ORIGIN_KEY, node.name)


@dataclass(frozen=True)
class Workaround:
    """An upstream defect corrected in our flow; reported in the plan so nobody is surprised."""

    node: str
    upstream: str  # the component at fault
    message: str


def quantize_scalar(value: float, scale: float, zero_point: int, qmin: int, qmax: int) -> int:
    """A float constant in the int8 domain of (scale, zero point), as quantize_per_tensor
    computes it: round to nearest, shift by the zero point, clamp."""
    return int(min(qmax, max(qmin, round(float(value) / float(scale)) + int(zero_point))))
