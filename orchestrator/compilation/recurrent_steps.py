"""One quantization for every step of an unrolled recurrence, so its steps compile as one.

PT2E observes each node on its own: a 25-step GRU gets 25 ranges for each gate, and its steps
come out of `convert_pt2e` as 25 different quantized graphs (a 25-step GRU keyword spotter:
76 distinct scales over its 100 additions). TFLite's sequence operators keep one set of scales
for all steps; so does this: before calibration, the observers at the same place of every step
(`partitioners/repeated_steps.find_steps`: an operator's output, and each tensor an operator
reads) become one observer, which then sees every step's values. The steps' quantized graphs
are then equal, and the NPU lowering compiles one of them for all (partitioners/npu.py).

What changes for the model: each shared range is the union of the steps' ranges, as TFLite's
are; a step whose values stay small (the first, from a zero state) is quantized on the wider
range of all steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from partitioners.records import Workaround, attribute_at, set_attribute_at
from partitioners.repeated_steps import Steps, constant_described, find_steps


@dataclass(frozen=True)
class TiedSteps:
    """What `tie_step_observers` did to one prepared model."""

    steps: int
    step_ops: int  # operators per step
    observers_before: int  # distinct observers at the steps' places before tying
    observers_after: int

    def workaround(self) -> Workaround:
        return Workaround(
            "(recurrence)", "torch.export (a recurrence unrolled into one copy per step)",
            f"{self.steps} repeated steps of {self.step_ops} operators share one quantization "
            f"({self.observers_before} observers became {self.observers_after}, each range the "
            "union of the steps' ranges), so the NPU lowering can compile one step for all")


def _is_observer(module) -> bool:
    return hasattr(module, "calculate_qparams") and hasattr(module, "dtype")


_CONFIG = ("dtype", "qscheme", "quant_min", "quant_max", "ch_axis", "is_dynamic", "eps")


def _config(module) -> tuple:
    return (type(module),) + tuple(repr(getattr(module, name, None)) for name in _CONFIG)


def tie_step_observers(prepared: torch.fx.GraphModule) -> TiedSteps | None:
    """Make the observers at the same place of every repeated step one observer (in place)."""
    # Every name: PT2E shares an observer by binding one instance under several names.
    modules = dict(prepared.named_modules(remove_duplicate=False))

    def observer_node(node) -> bool:
        return (isinstance(node, torch.fx.Node) and node.op == "call_module"
                and _is_observer(modules.get(node.target)))

    def source(node: torch.fx.Node) -> torch.fx.Node:
        while observer_node(node) and node.args and isinstance(node.args[0], torch.fx.Node):
            node = node.args[0]
        return node

    def describe(arg: torch.fx.Node) -> tuple[str, bool]:
        origin = source(arg)
        value = attribute_at(prepared, str(origin.target)) if origin.op == "get_attr" else None
        return constant_described(value) if isinstance(value, torch.Tensor) else ("act", False)

    ops = [n for n in prepared.graph.nodes if n.op == "call_function"]
    steps = find_steps(ops, describe)
    if steps is None:
        return None
    places = _observer_places(steps, observer_node)
    # Union-find over observer instances: PT2E shares an observer between nodes by instance
    # (a concatenation's inputs), so a place joins whole groups, not single nodes.
    parent: dict[int, int] = {}
    instance: dict[int, torch.nn.Module] = {}

    def find(key: int) -> int:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for names in places.values():
        found = [modules[name] for name in names]
        if len({_config(m) for m in found}) != 1:
            continue  # different kinds of observer at one place: left alone
        for module in found:
            instance[id(module)] = module
            parent.setdefault(id(module), id(module))
        for module in found[1:]:
            parent[find(id(module))] = find(id(found[0]))
    before = len({id(modules[n]) for names in places.values() for n in names})

    def representative(module):
        return instance[find(id(module))] if id(module) in parent else module

    for node in prepared.graph.nodes:
        if observer_node(node) and representative(modules[node.target]) is not \
                modules[node.target]:
            set_attribute_at(prepared, str(node.target), representative(modules[node.target]))
    # A bias's observer derives its scale from the observers of the input and the weight it
    # holds (torchao's DerivedObserverOrFakeQuantize): those are now the shared ones.
    for module in {id(m): m for m in modules.values()}.values():
        if isinstance(getattr(module, "obs_or_fqs", None), list):
            module.obs_or_fqs = [representative(m) for m in module.obs_or_fqs]
    modules = dict(prepared.named_modules(remove_duplicate=False))
    after = len({id(modules[n]) for names in places.values() for n in names})
    return TiedSteps(steps.count, len(steps.nodes[0]), before, after)


def _observer_places(steps: Steps, observer_node) -> dict[tuple, list[str]]:
    """place -> the observer (module name) there in each step: an operator's outputs, and each
    observed tensor an operator reads (the first step's state comes from outside the steps)."""
    places: dict[tuple, list[str]] = {}
    for step in steps.nodes:
        for k, node in enumerate(step):
            outputs = [u for u in node.users if observer_node(u) and u.args[0] is node]
            for j, user in enumerate(outputs):
                places.setdefault(("out", k, j), []).append(str(user.target))
            for j, arg in enumerate(node.all_input_nodes):
                if observer_node(arg):
                    places.setdefault(("in", k, j), []).append(str(arg.target))
    return {place: names for place, names in places.items() if len(names) == steps.count}
