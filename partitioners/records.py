"""Records shared by CPU routing and device legalization: node origins and upstream workarounds."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Meta key holding a node's name before the Cortex-M passes rewrite it; the passes carry `meta`
# across rewrites, so a CMSIS-NN decision can be joined back to the node the plan shows.
ORIGIN_KEY = "orchestrate_origin"
# Set by a legalization that moves a node off its CMSIS-NN kernel: (kernel, the limit it hit).
MOVED_OFF_CMSIS_KEY = "orchestrate_moved_off_cmsis"
# Graph meta set by a legalization that removes copies which change nothing: origin -> why.
REMOVED_COPIES_KEY = "orchestrate_removed_copies"


def module_of(node) -> tuple[str, str]:
    """(path, type name) of the innermost module that produced `node`; ("", "") at model level."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, type_name in reversed(list(stack.values())):
        if path:
            return str(path), str(type_name).rsplit(".", 1)[-1].rstrip("'>")
    return "", ""


def attribute_at(module: torch.nn.Module, dotted: str):
    """`module.a.b.c` for "a.b.c", or None where a part is missing."""
    value = module
    for part in str(dotted).split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def set_attribute_at(module: torch.nn.Module, dotted: str, value) -> None:
    owner, _, name = str(dotted).rpartition(".")
    setattr(attribute_at(module, owner) if owner else module, name, value)


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


_QDQ_NAMES = ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel",
              "dequantize_per_channel")
_BOOKKEEPING = ("alloc", "getitem", "_assert", "sym_size")
_COPIES = ("view_copy", "squeeze_copy", "unsqueeze_copy", "_to_dim_order_copy",
           "_clone_dim_order", "permute_copy", "transpose_copy", "clone")


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    return str(getattr(target, "__name__", None) or target)


def _is_any(node: torch.fx.Node, names: tuple[str, ...]) -> bool:
    text = _target_name(node)
    return any(name in text for name in names)


def is_qdq(node: torch.fx.Node) -> bool:
    """A quantize or dequantize (per tensor or per channel), in any dialect."""
    return node.op == "call_function" and _is_any(node, _QDQ_NAMES)


def reassign_shared_origins(before: torch.fx.GraphModule,
                            after: torch.fx.GraphModule) -> list[tuple[str, str]]:
    """Give each compute node of `after` its own origin; returns the (node, new origin) changes.

    The Cortex-M passes copy a node's `meta` onto the nodes they add beside it: splitting a
    hardswish after a convolution, upstream's new `cortex_m::minimum` carries the
    convolution's meta, so the plan listed the convolution twice (its MACs and cycles counted
    twice). The first compute node keeps the origin; each later one takes the next node of
    `before` that consumed that origin (through its quantize/dequantize) and that no node of
    `after` claims, e.g. the clamp the minimum implements; with none, `origin:<op>`.
    """
    computing = [n for n in after.graph.nodes if n.op == "call_function"
                 and not _is_any(n, _BOOKKEEPING) and ORIGIN_KEY in n.meta]
    claimed = {n.meta[ORIGIN_KEY] for n in computing}
    by_name = {n.name: n for n in before.graph.nodes}
    primary: dict[str, torch.fx.Node] = {}
    for node in computing:  # the first node that is neither a Q/DQ nor a copy keeps the origin
        origin = node.meta[ORIGIN_KEY]
        if origin not in primary and not _is_any(node, _QDQ_NAMES + _COPIES):
            primary[origin] = node
    changes = []
    for node in computing:
        origin = node.meta[ORIGIN_KEY]
        if primary.get(origin, node) is node or _is_any(node, _QDQ_NAMES + _COPIES):
            continue
        source = by_name.get(origin)
        frontier = list(source.users) if source is not None else []
        new = None
        while frontier:
            user = frontier.pop(0)
            if user.op != "call_function":
                continue
            if _is_any(user, _QDQ_NAMES):
                frontier.extend(user.users)
            elif user.name not in claimed:
                new = user.name
                if "nn_module_stack" in user.meta:  # the module the plan names is the user's
                    node.meta["nn_module_stack"] = user.meta["nn_module_stack"]
                break
        parts = _target_name(node).split(".")
        new = new or f"{origin}:{parts[1] if len(parts) > 1 else parts[0]}"  # e.g. ...:minimum
        claimed.add(new)
        node.meta[ORIGIN_KEY] = new
        changes.append((node.name, new))
    return changes
