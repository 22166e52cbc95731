"""One constant per value in the quantized graph: the weights a recurrence shares, once.

PT2E quantizes a weight once per use: a GRU unrolled over 25 steps uses its hidden-to-hidden
weight 25 times, so `convert_pt2e` leaves 25 equal int8 copies of it, 25 of its bias, and of
every per-channel scale and zero-point vector (a 25-step GRU keyword spotter on the U55: 312
constants, 24 distinct values). Every stage after it (the re-export, three decompositions, the
edge passes, the first half of the Arm backend's TOSA pipeline until its own
FuseEqualPlaceholdersPass) re-traces them all. `merge_equal_constants` keeps one `get_attr`
per value (dtype, shape, strides and bytes equal) and points every use at it.

Only values nothing writes are merged: a constant any of whose users has a mutable schema
(an in-place op, a copy into it) keeps its own node. The compile merges for CPU-only targets
only: on the Ethos-U path one merged constant that feeds two partitions makes the Arm backend's
FuseEqualPlaceholdersPass raise (orchestrator/compilation/pipeline.py says where).
"""

from __future__ import annotations

import hashlib

import torch

from partitioners.records import attribute_at


def merge_equal_constants(module: torch.fx.GraphModule) -> int:
    """Point every use of an equal constant at its first `get_attr`; remove the rest and their
    attributes. Returns how many constants were removed."""
    first: dict[tuple, list[tuple[torch.fx.Node, torch.Tensor]]] = {}
    removed = []
    for node in list(module.graph.nodes):
        if node.op != "get_attr":
            continue
        value = attribute_at(module, node.target)
        if not isinstance(value, torch.Tensor) or _written(node):
            continue
        value = value.detach()
        key = (value.dtype, tuple(value.shape), tuple(value.stride()), value.device.type,
               _digest(value))
        for kept, kept_value in first.get(key, ()):
            if torch.equal(kept_value, value):
                node.replace_all_uses_with(kept)
                module.graph.erase_node(node)
                removed.append(node.target)
                break
        else:
            first.setdefault(key, []).append((node, value))
    if removed:
        for target in removed:
            if not _still_used(module, target):
                _delete_attribute(module, target)
        module.graph.lint()
        module.recompile()
    return len(removed)


def _written(node: torch.fx.Node) -> bool:
    for user in node.users:
        schema = getattr(user.target, "_schema", None)
        if user.op != "call_function" or schema is None or schema.is_mutable:
            return True
    return False


def _digest(value: torch.Tensor) -> str:
    data = value.contiguous()
    if data.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        data = data.view(torch.uint8) if data.dim() else data.reshape(1).view(torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


def _still_used(module: torch.fx.GraphModule, target: str) -> bool:
    return any(node.op == "get_attr" and node.target == target for node in module.graph.nodes)


def _delete_attribute(module: torch.nn.Module, target: str) -> None:
    *path, name = target.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part)
    delattr(owner, name)
