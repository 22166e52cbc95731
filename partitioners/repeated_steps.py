"""Repeated steps: an unrolled recurrence lowered to the NPU once per distinct step, not once per step.

torch.export unrolls a GRU, LSTM or RNN of N steps (or any Python loop over a layer that reuses
its weights) into N copies of its step, and the Arm backend's TOSA pipeline then works through
all of them: about 150 passes, some 30 of which re-trace the whole partition (a 25-step GRU
keyword spotter on the U55-128: 1,600-2,100 nodes, 22-26 s of its compile). The steps compute
the same thing with the same weights; once their activations share one quantization (done at
quantization time, orchestrator/compilation/recurrent_steps.py) their graphs are equal, and one
compiled step serves every step.

This module finds the steps and cuts the partition there:

- `find_steps` looks, in a partition's operators in graph order, for the longest run of equal
  blocks: each operator is compared by its target, the constants it reads (by content), the
  kinds of its other arguments and its output's shape and dtype. A step must read a weight (a
  constant of two or more dimensions: a chain of identical elementwise ops is no recurrence),
  repeat at least `MIN_STEPS` times and hold at least `MIN_STEP_OPS` operators. An operator
  whose literal arguments change from step to step (the `select(x, 1, t)` that takes step t's
  frame) is not part of the step; it stays with the operators around it.
- `split_by_steps` re-tags one Ethos-U partition: each step its own partition (its operators
  with the quantize after and the dequantizes before them), the rest of the partition grouped
  by the last step it depends on (the frames before the first step, the head after the last),
  so every group can be extracted without a cycle. Upstream's own extraction check
  (partitioners/upstream_ethos_u.py) confirms each group; any doubt and the partition is left
  whole.
- `partition_digest` names a partition's compiled form by content (graph, argument values,
  constant bytes, compile specs), so the backend's preprocess runs once per distinct step
  (partitioners/upstream_ethos_u.py: `preprocess_failures_recorded`), and ExecuTorch's emitter,
  which stores equal delegate payloads once, writes the step's command stream and weights once.

What it costs on the device: one NPU invocation per step instead of one for the recurrence
(each step's inputs and outputs copied into and out of the scratch by ExecuTorch's
EthosUBackend), which the plan shows as invocations.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from partitioners.records import is_qdq

MIN_STEPS = 4
MIN_STEP_OPS = 4
# The period search compares every operator with the one `period` later, for every period up
# to this: quadratic in a partition's operators, bounded here (a GRU step is ~20 operators).
MAX_STEP_OPS = 200

def _base_name(node: torch.fx.Node) -> str:
    """`quantize_per_tensor` for quantized_decomposed::quantize_per_tensor.default."""
    return _target_name(node).split("::")[-1].split(".")[0]


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    name = getattr(target, "name", None)
    if callable(name):
        return str(name())
    return str(getattr(target, "__name__", None) or target)


@dataclass(frozen=True)
class Steps:
    """The repeated steps of a sequence of operators."""

    # per step: its operators at the positions where every step's literal arguments agree
    nodes: tuple[tuple[torch.fx.Node, ...], ...]

    @property
    def count(self) -> int:
        return len(self.nodes)


def _digest_tensor(value: torch.Tensor) -> str:
    if type(value) not in (torch.Tensor, torch.nn.Parameter):  # a fake tensor holds no data
        return f"unknown:{id(value)}"
    data = value.detach().contiguous().cpu()
    raw = data.view(torch.uint8) if data.dtype != torch.bool else data.to(torch.uint8)
    return hashlib.sha256(
        f"{data.dtype}{tuple(data.shape)}".encode() + raw.numpy().tobytes()).hexdigest()[:16]


def _out(node: torch.fx.Node) -> tuple:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), str(value.dtype))
    if isinstance(value, (tuple, list)):
        return tuple((tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else repr(v)
                     for v in value)
    return (repr(value),)


def find_steps(ops: list[torch.fx.Node], describe: Callable[[torch.fx.Node], tuple[str, bool]]
               ) -> Steps | None:
    """The longest run of at least MIN_STEPS equal blocks in `ops` (operators in graph order).

    `describe(arg)` says what an operator reads (a constant by its content, or an activation by
    its quantization) and whether it is a weight; operators are equal when their targets,
    what they read and their outputs' shapes and dtypes are."""
    described: dict[torch.fx.Node, tuple[str, bool]] = {}
    coarse, fine, weighted = [], [], []
    for op in ops:
        kinds, literals, reads_weight = [], [], False
        for arg in _flat(op.args, op.kwargs):
            if isinstance(arg, torch.fx.Node):
                if arg not in described:
                    described[arg] = describe(arg)
                kinds.append(described[arg][0])
                reads_weight |= described[arg][1]
            else:
                kinds.append("lit")
                literals.append(repr(arg))
        coarse.append((_target_name(op), tuple(kinds), _out(op)))
        fine.append(tuple(literals))
        weighted.append(reads_weight)

    best = None  # (covered ops, -period, start, period, count)
    n = len(coarse)
    for period in range(MIN_STEP_OPS, min(MAX_STEP_OPS, n // MIN_STEPS) + 1):
        run_start = 0
        for i in range(n - period + 1):
            if i < n - period and coarse[i] == coarse[i + period]:
                continue
            count = (i - run_start) // period + 1  # i - run_start ops equal the op a period on
            if count >= MIN_STEPS and any(weighted[run_start:run_start + period]):
                candidate = (count * period, -period, run_start, period, count)
                best = max(best, candidate) if best else candidate
            run_start = i + 1
    if best is None:
        return None
    _, _, start, period, count = best
    shared = [k for k in range(period)
              if len({fine[start + s * period + k] for s in range(count)}) == 1]
    if len(shared) < MIN_STEP_OPS:
        return None
    return Steps(tuple(tuple(ops[start + s * period + k] for k in shared) for s in range(count)))


def constant_described(tensor: torch.Tensor) -> tuple[str, bool]:
    """A constant an operator reads, by content; a weight when it has two or more dimensions."""
    return _digest_tensor(tensor), tensor.dim() >= 2


def _flat(args, kwargs) -> Iterable:
    stack = [*args, *kwargs.values()]
    while stack:
        item = stack.pop(0)
        if isinstance(item, (list, tuple)):
            stack[:0] = list(item)
        else:
            yield item


@dataclass(frozen=True)
class StepSplit:
    """One Ethos-U partition cut at its repeated steps."""

    partition_nodes: int
    steps: int
    step_ops: int  # operators in each step's partition
    groups: int  # partitions it became


def split_by_steps(nodes: list[torch.fx.Node], program, extractable: Callable[[set], bool]
                   ) -> tuple[list[list[torch.fx.Node]], StepSplit] | None:
    """`nodes` (one partition, graph order) as groups that are each one partition: every
    repeated step its own group, the rest by the last step it depends on. None when the
    partition has no repeated steps or a group could not be extracted on its own."""
    members = set(nodes)
    ops = [n for n in nodes if n.op == "call_function" and not is_qdq(n)]
    steps = find_steps(ops, _edge_described(program))
    if steps is None:
        return None
    # A step keeps what the next step depends on; the rest of it (a GRU's copy of its state
    # for the sequence output) goes with what reads it, so the last step, whose state nothing
    # reads on, is the same partition as the others.
    carried = _carried(steps, members)
    step_of = {node: index for index, step in enumerate(steps.nodes)
               for k, node in enumerate(step) if k in carried}
    level = _levels(nodes, step_of)
    rest = {node: level[node] for node in ops if node not in step_of}
    idle_levels = {lvl for lvl in set(rest.values())
                   if not _computes([n for n, at in rest.items() if at == lvl])}
    for node in reversed(ops):  # consumers first: a group that computes nothing moves later
        if node in rest and rest[node] in idle_levels:
            rest[node] = max(rest[node], min(
                (step_of[c] - 1 if c in step_of else rest.get(c, steps.count - 1)
                 for c in _consumers(node, members)), default=steps.count - 1))
    group: dict[torch.fx.Node, tuple[int, int]] = {  # (level, 1 if a step's own)
        **{node: (index, 1) for node, index in step_of.items()},
        **{node: (at, 0) for node, at in rest.items()}}
    # A quantize goes with its producer; a dequantize with its consumers (the partition's
    # inputs and outputs stay quantized tensors, as upstream's partitions are).
    for node in nodes:
        if is_qdq(node) and "dequantize" not in _target_name(node):
            producer = node.all_input_nodes[0] if node.all_input_nodes else None
            if producer in group:
                group[node] = group[producer]
    for node in reversed(nodes):
        if is_qdq(node) and node not in group:
            owners = {group.get(user) for user in node.users if user in members}
            if len(owners) == 1 and None not in owners:
                group[node] = owners.pop()
    for node in nodes:  # a quantize or dequantize no operator claimed: with its input's group
        if node not in group:
            producer = next((x for x in node.all_input_nodes if x in group), None)
            group[node] = group[producer] if producer is not None else (level[node], 0)
    ordered: dict[tuple[int, int], list[torch.fx.Node]] = {}
    for node in nodes:
        ordered.setdefault(group[node], []).append(node)
    groups = [ordered[key] for key in sorted(ordered, key=lambda k: (k[0], -k[1]))]
    if any(not _computes(g) or not extractable(set(g)) for g in groups):
        return None
    return groups, StepSplit(len(nodes), steps.count, len(carried), len(groups))


def _levels(nodes: list[torch.fx.Node], step_of: dict) -> dict[torch.fx.Node, int]:
    """The last step each node depends on (-1: none), in one pass over the graph order."""
    level: dict[torch.fx.Node, int] = {}
    for node in nodes:
        level[node] = step_of[node] if node in step_of else max(
            (level[x] for x in node.all_input_nodes if x in level), default=-1)
    return level


def _carried(steps: Steps, members: set) -> set[int]:
    """Positions of a step whose operator the next step depends on (all of them when the
    steps are independent of each other)."""
    ancestors: set = set()
    stack = [n for n in steps.nodes[1]]
    while stack:
        node = stack.pop()
        for x in node.all_input_nodes:
            if x in members and x not in ancestors:
                ancestors.add(x)
                stack.append(x)
    carried = {k for k, node in enumerate(steps.nodes[0]) if node in ancestors}
    return carried or set(range(len(steps.nodes[0])))


def _consumers(node: torch.fx.Node, members: set) -> list[torch.fx.Node]:
    """The operators in `members` that read `node`, through quantize and dequantize nodes."""
    found, stack = [], list(node.users)
    while stack:
        user = stack.pop()
        if user not in members:
            continue
        if is_qdq(user):
            stack.extend(user.users)
        else:
            found.append(user)
    return found


_NO_COMPUTE = ("view_copy", "view", "unsqueeze_copy", "squeeze_copy", "clone", "alias_copy",
               "_to_dim_order_copy", "_clone_dim_order", "detach_copy", "expand_copy")


def _computes(nodes: list[torch.fx.Node]) -> bool:
    """Upstream rejects a partition of only quantize, dequantize and no-op copies (it lowers
    to nothing); such a group must not be cut out."""
    return any(n.op == "call_function" and not is_qdq(n)
               and _base_name(n) not in _NO_COMPUTE
               for n in nodes)


def _through_qdq(node: torch.fx.Node) -> torch.fx.Node:
    while is_qdq(node) and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _edge_described(program) -> Callable[[torch.fx.Node], tuple[str, bool]]:
    """What an operator of the partitioner's program reads. The partitioner sees the program's
    parameters as fake tensors (ExecuTorch's get_fake_program), so a constant is told by its
    shape, dtype and quantization, an activation by its quantization (the dequantize's
    scale and zero point): a recurrence whose steps were tied to one quantization
    (orchestrator/compilation/recurrent_steps.py) repeats; a stack of layers, each with its own
    scales, does not. Equal partitions are then confirmed by content (`partition_digest`)."""
    constant = _edge_constant(program)

    def described(arg: torch.fx.Node) -> tuple[str, bool]:
        quantization = repr(tuple(repr(a) if not isinstance(a, torch.fx.Node) else _out(a)
                                  for a in arg.args[1:])) if is_qdq(arg) else ""
        origin = _through_qdq(arg)
        value = constant(origin)
        if value is None:
            return f"act{quantization}", False
        return f"const{tuple(value.shape)}{value.dtype}{quantization}", value.dim() >= 2

    return described


def _edge_constant(program) -> Callable[[torch.fx.Node], torch.Tensor | None]:
    signature = program.graph_signature
    names = {**signature.inputs_to_parameters, **signature.inputs_to_buffers,
             **signature.inputs_to_lifted_tensor_constants}

    def constant_of(node: torch.fx.Node) -> torch.Tensor | None:
        if node.op != "placeholder" or node.name not in names:
            return None
        name = names[node.name]
        value = program.state_dict.get(name)
        if value is None:
            value = program.constants.get(name)
        return value if isinstance(value, torch.Tensor) else None

    return constant_of


def partition_digest(program, compile_specs) -> str:
    """A partition's program by what it computes: each operator by its target, its argument
    values, what it reads (recursively) and its output's shape and dtype; each user input by
    its position; each constant by its bytes; the outputs in order; and the compile specs.

    Node names and the order of the graph's nodes are left out: two steps' partitions differ
    there (ExecuTorch re-sorts the whole graph after cutting out each partition, so the first
    steps of a recurrence come out with their operators in other orders). Two partitions with
    one digest compute the same outputs, in the same order, from the same inputs in the same
    order, with the same constants: one compiled command stream serves both."""
    signature = program.graph_signature
    user_inputs = [spec.arg.name for spec in signature.input_specs
                   if spec.kind.name == "USER_INPUT" and hasattr(spec.arg, "name")]
    constant = _edge_constant(program)
    digests: dict[torch.fx.Node, str] = {}

    def mapped(value):
        if isinstance(value, torch.fx.Node):
            return digests[value]
        if isinstance(value, (list, tuple)):
            return tuple(mapped(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((k, mapped(v)) for k, v in value.items()))
        return repr(value)

    for node in program.graph_module.graph.nodes:  # producers first
        if node.op == "placeholder":
            tensor = constant(node)
            key = (("constant", _digest_tensor(tensor)) if tensor is not None else
                   ("input", user_inputs.index(node.name), _out(node))
                   if node.name in user_inputs else ("placeholder", node.name))
        elif node.op == "output":
            key = ("output", mapped(node.args))
        else:
            key = (node.op, _target_name(node) if node.op == "call_function" else str(node.target),
                   mapped(node.args), mapped(node.kwargs), _out(node))
        digests[node] = hashlib.sha256(repr(key).encode()).hexdigest()
        if node.op == "output":
            result = hashlib.sha256(digests[node].encode())
            for spec in compile_specs:
                result.update(repr((spec.key, bytes(spec.value))).encode())
            return result.hexdigest()
    raise ValueError("a partition program without an output node")
