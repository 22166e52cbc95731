"""The local check: every value the program writes against the reference fed the program's inputs.

Comparing only the final outputs with the quantized reference mixes two things: the rounding
each op adds, and the rounding earlier ops added and later ops carry and amplify. On `mixed`
for Ethos-U55, the NPU's integer multiply rounds `0.1 * x` one step away from the reference's
float multiply on some elements (legitimately: TOSA rescales in fixed point); the value then
passes a sort and is requantized to a 1.73x finer scale, so the one step becomes two. Whether a
given element lands on one or two steps depends on the calibrated scales, which depend on the
host's float arithmetic: one machine passed a global 1-step allowance, another failed it.

So each value the twin writes is checked locally. The quantized reference (the convert_pt2e
program) is run node by node; when the twin's value for a reference node is known, the
reference continues from the twin's value instead of its own ("teacher forcing"), so every later
reference node is computed from exactly the inputs the program's op saw. The difference that
remains at a value is the rounding of the stretch of reference between the forced values and
this one, which is bounded: one int8 step per rounding stage (each quantize that follows
arithmetic; a requantize across pure data movement with the same scale adds none), and a
stage's steps reach later values multiplied by the gain of a multiply after it (its other
operand's magnitude x the ratio of the scales: Arm's AvgPool2d with a divisor_override is a pool
and a x2 multiply, whose pool step arrives as 2.36 output steps). A
CMSIS-NN op or a CPU float region between a dequantize and a quantize is one stage; an Ethos-U
partition has as many stages as its longest chain of requantizations. A real defect (a layout
mismatch, a wrong weight, a wrong kernel) is named at the op that makes it, because everything
before it was forced to what the program really computed.

Matching a program value to its reference node: same shape and dtype (when no reference node
has its shape, the same shape once size-1 dims are dropped: a linear the compile computes as a
1x1 convolution writes [N, M, 1, 1]), the same scale and zero
point where the program states them, after the previous match in topological order; among
those, the one within its bound with the smallest difference (the outputs of one instruction,
e.g. a delegate's, are each matched after the previous instruction's matches: they come in no
order the reference shares, and an NPU partition's constant output listed first put its other
outputs after the constant's late reference node; a match to a constant, which the program may
compute long before the reference does, moves that order on for nobody). When none after
that order is within its bound, the nodes before it are tried too (two branches may run in the
other order than the reference lists them). When none is within
its bound, the value fails against the earliest (a wrong value matches nothing, and the
earliest unmatched node is the one the program is computing), but it is not forced into the
reference: a value
with no reference counterpart at all (an intermediate of a kernel's decomposition, e.g. the
`minimum` inside a Cortex-M hardswish) would poison every later check. If a later value then
matches that same node within its bound, the earlier one was such an intermediate, and it is
reported as unmatched instead of failed.

A value that a pure data-movement kernel wrote (a view, squeeze, unsqueeze, permute or layout
copy) and that matches no reference node within its bound is compared with the value it was
moved from instead: when it holds exactly that value's elements, it is checked as moved (the
quantized reference often has no quantize node after such an op, so the nearest candidate of its
shape is another layer's value: a DS-TCN's squeezes were failed against the next layer's input).
A selecting kernel's value (slice, split, select, unbind: a GRU's per-step slices of its input
projection, an LSTM's gate split) is checked first as one block of its source, before any
reference node: the program computes all of a GRU's slices at the start where the reference
places each next to its step, so matching them to reference nodes dragged the order constraint
to the last step and every later value was compared with the wrong node. Such a value is not
forced into the reference, so a wrong block still fails at the op that reads it. A minimum or
maximum against a constant with no reference node (the `minimum` inside the Cortex-M hardswish
decomposition) is checked as its source clamped at one bound; the bound's value is judged where
the hardswish output meets its reference.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import torch

# Reference ops that only move or select values (relu selects 0, which is the zero point):
# a quantize after them, with the scale and zero point of the dequantize before them,
# reproduces its input exactly. Clamps to arbitrary bounds and constant pads are not here.
_DATA_MOVEMENT = ("view", "reshape", "flatten", "permute", "transpose", "squeeze", "unsqueeze",
                  "getitem", "sort", "topk", "cat", "concat", "split", "chunk", "slice", "select",
                  "clone", "contiguous", "expand", "max_pool", "relu",
                  "where", "flip", "index", "gather", "pixel_shuffle", "_to_copy",
                  "_to_dim_order_copy", "alias", "detach", "unbind", "stack", "repeat")


def _is_quantize(node) -> bool:
    target = str(node.target)
    return (node.op == "call_function" and "quantize_per_tensor" in target
            and "dequantize" not in target and len(node.args) >= 3)


def _is_dequantize(node) -> bool:
    return node.op == "call_function" and "dequantize_per_tensor" in str(node.target)


def _moves_only(node) -> bool:
    name = str(getattr(node.target, "__name__", node.target)).split(".")[0]
    return any(name == m or name.startswith(m + "_") or name.startswith(m + "2d")
               for m in _DATA_MOVEMENT)


@dataclass(frozen=True)
class LocalCheck:
    """One int8, int16 or bool value the program wrote, against its reference node fed forced inputs."""

    instruction: int
    op: str
    value: int  # EValue index
    dtype: str  # "int8" | "int16" (a module given a16w8) | "bool"
    reference_node: str | None  # None: no reference node of that shape and dtype
    max_steps: float | None  # int8/int16: largest |program - reference| in its own steps
    mismatched: int | None  # elements that differ
    rounding_stages: int | None  # requantizations between the forced inputs and this value
    allowed_steps: float | None  # steps_per_stage per rounding stage x any multiply's gain after
    # it (bool: 0 mismatches)
    passed: bool | None  # None when unmatched
    # elements the reference leaves undefined (a division by a denominator quantized to zero:
    # ±inf or NaN there), not compared
    undefined: int = 0


class ForcedReference:
    """The quantized reference, evaluated lazily, continuing from forced (program) values."""

    def __init__(self, module: torch.fx.GraphModule, sample: tuple[torch.Tensor, ...]):
        self._interpreter = torch.fx.Interpreter(module)
        self.nodes = [n for n in module.graph.nodes if n.op != "output"]
        self.order = {n: i for i, n in enumerate(self.nodes)}
        self._forced: set = set()
        env = self._interpreter.env
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        for node, value in zip(placeholders, sample):
            env[node] = value
        self._stages: dict = {}
        self._bounds: dict = {}
        self._reads_input: dict | None = None

    def reads_an_input(self, node) -> bool:
        """Whether `node`'s value depends on a model input: a constant (a `full`, a
        `zeros_like`, which reads only its argument's shape) does not, and an NPU partition may
        hand it over before values the reference computes much earlier."""
        if self._reads_input is None:
            self._reads_input = {}
            for current in self.nodes:
                name = str(getattr(current.target, "__name__", current.target))
                self._reads_input[current] = current.op == "placeholder" or (
                    current.op == "call_function" and not name.startswith(_SHAPE_ONLY)
                    and any(self._reads_input.get(i, False) for i in current.all_input_nodes))
        return self._reads_input[node]

    def checkpoints(self) -> list:
        """Nodes a program value can be compared with: quantize outputs and bool results."""
        found = []
        for node in self.nodes:
            if _is_quantize(node):
                found.append(node)
            elif node.op == "call_function":
                val = node.meta.get("val")
                if isinstance(val, torch.Tensor) and val.dtype == torch.bool:
                    found.append(node)
        return found

    def value(self, node) -> torch.Tensor:
        env = self._interpreter.env
        if node not in env:
            with torch.no_grad():
                for earlier in self.nodes[: self.order[node] + 1]:
                    if earlier not in env:
                        env[earlier] = self._interpreter.run_node(earlier)
        return env[node]

    def force(self, node, tensor: torch.Tensor) -> None:
        """From now on `node` holds `tensor`; everything computed from it is recomputed."""
        env = self._interpreter.env
        pending = list(node.users)
        while pending:
            user = pending.pop()
            if user in env and user not in self._forced:
                del env[user]
                pending.extend(user.users)
        env[node] = tensor
        self._forced.add(node)
        # what the stages and bounds of `node` and everything after it counted from has moved;
        # a value that is not cached has no cached value after it (each is worked out from its
        # inputs' first), and a forced value counts from itself
        for cache in (self._stages, self._bounds):
            cache.pop(node, None)
            pending = list(node.users)
            while pending:
                user = pending.pop()
                if user in cache and user not in self._forced:
                    del cache[user]
                    pending.extend(user.users)

    def _worked_out(self, node, cache: dict, compute):
        """`cache[node]`, working out first (inputs before users) every value it depends on that
        is not cached: a forced value, an input or a constant is `compute`d as a start."""
        pending = [node]
        while pending:
            current = pending[-1]
            if current in cache:
                pending.pop()
                continue
            start = current in self._forced or current.op in ("placeholder", "get_attr")
            missing = [] if start else [i for i in current.all_input_nodes if i not in cache]
            if missing:
                pending.extend(missing)
                continue
            cache[current] = compute(current, start)
            pending.pop()
        return cache[node]

    def allowed_steps(self, node, steps_per_stage: float) -> float:
        """The bound on |program - reference| at `node`, in its steps: `steps_per_stage` per
        rounding stage on the way from the forced values, where a stage's difference reaches
        `node` multiplied by the gain of any multiply after it. A multiply by 2 (Arm's form of
        an AvgPool2d with divisor_override=2: the pool, its own quantize, then x2) turns the
        pool's one step into two steps of the pool's scale, 2.36 of a 1.18x finer output scale:
        counting stages alone allowed 2 where the lowering legitimately reaches 3. Without such a
        multiply, or one with a gain at most 1, this is `steps_per_stage` x rounding_stages."""
        def bound(current, start: bool) -> float:
            if start:
                return 0.0
            base = max((self._bounds[i] for i in current.all_input_nodes), default=0.0)
            if _is_quantize(current) and not self._exact_requantize(current):
                base = (max(base, self._multiplied(current)) + steps_per_stage
                        + self._hardswish_offset(current))
            return base

        return self._worked_out(node, self._bounds, bound)

    def _multiplied(self, quantize) -> float:
        """The bound (in `quantize`'s steps) a multiply feeding `quantize` carries from its
        dequantized operands: each operand's bound x its scale x the other operand's largest
        magnitude (the reference's own values), plus the product of the two; 0 otherwise."""
        product = quantize.args[0]
        if not (isinstance(product, torch.fx.Node) and product.op == "call_function"
                and str(getattr(product.target, "__name__", product.target)).startswith("mul")):
            return 0.0
        errors, magnitudes = [], []
        for operand in product.args[:2]:
            if isinstance(operand, torch.fx.Node):
                value = self.value(operand)
                magnitudes.append(float(value.abs().max()) if isinstance(value, torch.Tensor)
                                  and value.numel() else 0.0)
                errors.append(self._bounds.get(operand.args[0], 0.0) * float(operand.args[1])
                              if _is_dequantize(operand) and len(operand.args) >= 3 else 0.0)
            elif isinstance(operand, (int, float)):
                magnitudes.append(abs(float(operand)))
                errors.append(0.0)
            else:
                return 0.0
        if len(errors) != 2:
            return 0.0
        error = errors[0] * magnitudes[1] + errors[1] * magnitudes[0] + errors[0] * errors[1]
        return error / abs(float(quantize.args[1]))

    def _hardswish_offset(self, quantize) -> float:
        """The error (in `quantize`'s steps) of the Cortex-M hardswish's "+3", 0 for any other op.
        DecomposeHardswishPass computes x * (min(x, 3) + 3) / 6 as one quantized_mul whose second
        operand adds 3 as a zero-point shift of round(3 / s) input steps and clamps at 3
        quantized to the same round(3 / s) steps, so the program multiplies by up to
        min(x, 3) + 3 + 2e with |e| = |round(3 / s) - 3 / s| x s: that reaches the output as
        max|x| x 2e / 6 on top of the multiply's own rounding, the same bytes on the host runtime
        (a conv feeding the hardswish with outputs near 40 was 4-5 steps off, bound 1)."""
        hardswish = quantize.args[0]
        if not (isinstance(hardswish, torch.fx.Node) and hardswish.op == "call_function"
                and str(getattr(hardswish.target, "__name__", hardswish.target))
                .startswith("hardswish")):
            return 0.0
        source = hardswish.args[0]
        if not (isinstance(source, torch.fx.Node) and _is_dequantize(source)
                and len(source.args) >= 3):
            return 0.0
        scale = abs(float(source.args[1]))
        value = self.value(source)
        if not scale or not isinstance(value, torch.Tensor) or not value.numel():
            return 0.0
        shift_error = abs(round(3 / scale) - 3 / scale) * scale
        return float(value.abs().max()) * 2 * shift_error / 6 / abs(float(quantize.args[1]))

    def rounding_stages(self, node) -> int:
        """Requantizations on the longest path from a forced value (or an input) to `node`."""
        def stages(current, start: bool) -> int:
            if start:
                return 0
            base = max((self._stages[i] for i in current.all_input_nodes), default=0)
            return base + 1 if _is_quantize(current) and not self._exact_requantize(current) \
                else base

        return self._worked_out(node, self._stages, stages)

    def _exact_requantize(self, node) -> bool:
        """A quantize fed, through data movement only, by a dequantize with the same parameters."""
        scale, zero_point = node.args[1], node.args[2]
        current = node.args[0]
        while isinstance(current, torch.fx.Node):
            if _is_dequantize(current):
                return (len(current.args) >= 3 and current.args[1] == scale
                        and current.args[2] == zero_point)
            if current.op != "call_function" or not _moves_only(current):
                return False
            tensor_inputs = [a for a in current.all_input_nodes
                             if isinstance(a.meta.get("val"), torch.Tensor)
                             and a.meta["val"].dtype != torch.bool]
            if len(tensor_inputs) != 1:
                return False
            current = tensor_inputs[0]
        return False


# Ops whose value depends on their argument's shape only.
_SHAPE_ONLY = ("zeros_like", "ones_like", "full_like", "empty_like")


def check_locally(forced: ForcedReference, written, qparams: dict[int, tuple[float, int]],
                  steps_per_stage: float, exhaustive: bool = False) -> tuple[LocalCheck, ...]:
    """Match each (instruction, op, EValue, tensor) the program wrote, in execution order, to a
    reference node and compare it with the forced reference there; a value within its bound is
    then forced into the reference (see the module docstring for one that is not).
    `exhaustive` scores every candidate node even after an exact match (the same choice, slower:
    benchmarks/local_check_speed.py's baseline)."""
    checkpoints = forced.checkpoints()
    checks: list[LocalCheck] = []
    missed: dict = {}  # reference node -> indices of checks that failed against it
    last_order = -1
    # the outputs of one instruction (a delegate's) come in no order the reference shares: each
    # is matched after the previous instruction's matches, not after its siblings'
    current, floor = None, -1
    seen: dict[int, torch.Tensor] = {}  # EValue -> what the program wrote there
    matched: dict[int, int] = {}  # EValue -> reference order of the node it was forced into
    for entry in written:
        instruction, op, value, tensor = entry[:4]
        if instruction != current:
            # after what it reads, where that is known: a partition that hands every step of a
            # recurrence its frame is matched late in the reference (each frame's select sits by
            # its step there), and the first step's output must not be sought after the last's
            read = [matched[s] for s in (entry[4] if len(entry) > 4 else ()) if s in matched]
            current, floor = instruction, max(read) if read else last_order
        # a kernel that writes into the EValue it reads (a transpose over a size-1 dim) is
        # compared with what was there before it, never with its own output
        # an input no instruction wrote (a view the memory plan aliases) comes with the entry
        given = entry[5] if len(entry) > 5 else {}
        known = {source: seen.get(source, given.get(source))
                 for source in (entry[4] if len(entry) > 4 else ())}
        sources = tuple(known)
        seen[value] = tensor
        # an integer value is compared in steps of its own dtype (int8, or int16 where a module
        # was given a16w8), with the same per-stage rule
        kind = str(tensor.dtype).replace("torch.", "")
        if _kernel_name(op) in _SELECTING_KERNELS:
            # a block of a value already checked: exact, and independent of where the
            # reference happens to place its copy (a GRU's per-step slices of the input
            # projection sit next to each step there, all at the start of the program)
            selected = _moved_from(op, tensor, sources, known)
            if selected:
                checks.append(_as_moved(instruction, op, value, kind, selected))
                continue
        candidates = [c for c in checkpoints if _shape_and_dtype(c) == (tuple(tensor.shape),
                                                                           tensor.dtype)]
        if not candidates:
            # the same elements in the same order with size-1 dims added or dropped (a linear
            # computed as a 1x1 convolution writes [N, M, 1, 1] where the reference has [N, M])
            candidates = [c for c in checkpoints
                          if _without_unit_dims(_shape_and_dtype(c)) ==
                          _without_unit_dims((tuple(tensor.shape), tensor.dtype))]
        if value in qparams:
            scale, zero_point = qparams[value]
            candidates = [c for c in candidates if not _is_quantize(c) or (
                int(c.args[2]) == zero_point and abs(float(c.args[1]) - scale) <= 1e-6 * abs(scale))]
        later = [c for c in candidates if forced.order[c] > floor]
        everywhere, candidates = candidates, later or candidates
        if not candidates:
            moved = _moved_from(op, tensor, sources, known)
            source = None if moved else _movement_source(op, sources, known)
            if moved:
                checks.append(_as_moved(instruction, op, value, kind, moved))
            elif source is not None:
                # a data-movement kernel whose output is not its input's elements moved: wrong,
                # whether or not the reference has a node of that shape
                checks.append(LocalCheck(instruction, op, value, kind,
                                         f"not a move of EValue {source}", None, None, 0, 0.0,
                                         False))
            else:
                checks.append(LocalCheck(instruction, op, value, kind, None, None, None, None,
                                         None, None))
            continue
        undefined = entry[6] if len(entry) > 6 else None
        scored = _scored(forced, tensor, kind, candidates, steps_per_stage, undefined,
                         exhaustive)
        close = [s for s in scored if s[0]]
        # A bound that covers the dtype's whole range says nothing: any value is within it. A
        # data-movement kernel's value is then checked as moved, and no such match is forced
        # into the reference (a ViT's transposed right-hand operand, which the reference never
        # forms, was within 1.8e4 steps of layer 2's key and poisoned every check after it).
        vacuous = bool(close) and all(_vacuous(s, kind) for s in close)
        moved_from = None if close and not vacuous else _moved_from(op, tensor, sources, known)
        if moved_from is not None:
            checks.append(_as_moved(instruction, op, value, kind, moved_from))
            continue
        if not close and len(everywhere) > len(candidates):
            # Execution order is a hint, not a rule: two branches may run in the other order
            # than the reference lists them (one AvgPool2d called on a 7x7 and an 8x8 input:
            # the program pooled the 8x8 one first), so a node before the floor may be the one.
            earlier = _scored(forced, tensor, kind,
                              [c for c in everywhere if c not in candidates], steps_per_stage,
                              undefined, exhaustive)
            if any(s[0] for s in earlier):
                scored, close = earlier, [s for s in earlier if s[0]]
        best = (min(close, key=lambda s: (s[1], s[2], s[3])) if close
                else min(scored, key=lambda s: s[3]))
        within, steps, mismatched, order, stages, allowed, node = best
        if stages is None:  # reported with the check; the reference is not forced yet
            stages, allowed = _bound(forced, node, kind, steps_per_stage)
        if within and _vacuous(best, kind):
            pass  # reported within its bound, but neither forced nor an anchor for the order
        elif within:
            if forced.reads_an_input(node):
                last_order = max(last_order, order)
            matched[value] = order
            forced.force(node, tensor.reshape(forced.value(node).shape))
            for index in missed.pop(node, []):
                checks[index] = replace(checks[index], reference_node=None, max_steps=None,
                                        mismatched=None, rounding_stages=None,
                                        allowed_steps=None, passed=None)
        else:
            missed.setdefault(node, []).append(len(checks))
        checks.append(LocalCheck(instruction, op, value, kind, node.name,
                                 steps if kind != "bool" else None, mismatched,
                                 stages, allowed if kind != "bool" else None, within,
                                 int(undefined.sum()) if undefined is not None else 0))
    return tuple(checks)


# Kernels whose output is their input's elements, checked exactly: a view (same row-major
# order, another shape), a layout copy (same logical tensor), a permutation of the dims.
_VIEW_KERNELS = ("view_copy", "squeeze_copy", "unsqueeze_copy", "et_view")
_COPY_KERNELS = ("_to_dim_order_copy", "_clone_dim_order", "clone")
_PERMUTE_KERNELS = ("permute_copy", "transpose")
# Kernels whose output is their input broadcast to a larger shape (each element repeated).
_EXPAND_KERNELS = ("expand_copy",)
_MOVING_KERNELS = _VIEW_KERNELS + _COPY_KERNELS + _PERMUTE_KERNELS + _EXPAND_KERNELS
# Kernels that copy one block of their input: the output is that input narrowed along one dim
# (slice, split) or indexed at one position of it (select, unbind).
_SELECTING_KERNELS = ("slice_copy", "split_with_sizes_copy", "split_copy", "select_copy",
                      "unbind_copy", "narrow_copy")
_BLOCK_SEARCH_MAX = 1 << 20  # elements; a larger source is not searched


def _scored(forced: ForcedReference, tensor: torch.Tensor, kind: str, candidates,
            steps_per_stage: float, undefined: torch.Tensor | None = None,
            exhaustive: bool = False) -> list[tuple]:
    """(within its bound, steps, elements that differ, reference order, rounding stages,
    allowed steps, node) of `tensor` against each candidate reference node, in reference order;
    elements `undefined` marks (the reference has no number there) are not compared.

    The scan stops at the first exact match: no later candidate can beat it (the choice is the
    smallest (steps, elements that differ, order)), and a later candidate's reference value may
    cost the recomputation of everything after the last forced value (a 49-step GRU's check
    took minutes a sample, each value scoring every later step's node)."""
    scored = []
    for candidate in candidates:
        expected = forced.value(candidate)
        diff = (tensor.to(torch.int32) - expected.to(torch.int32).reshape(tensor.shape)).abs()
        if undefined is not None:
            diff = diff.masked_fill(undefined.reshape(diff.shape), 0)
        steps = float(diff.max()) if diff.numel() else 0.0
        mismatched = int((diff > 0).sum())
        stages = allowed = None  # the bound is at least one stage's: worked out when needed
        if kind == "bool":
            within = mismatched == 0
        elif steps <= steps_per_stage:
            within = True
        else:
            stages, allowed = _bound(forced, candidate, kind, steps_per_stage)
            within = steps <= allowed
        scored.append((within, steps, mismatched, forced.order[candidate], stages, allowed,
                       candidate))
        if within and steps == 0 and mismatched == 0 and not exhaustive:
            break
    return scored


# The largest difference a value of each integer dtype can show, in its steps.
_FULL_RANGE = {"int8": 255.0, "int16": 65535.0}


def _vacuous(scored: tuple, kind: str) -> bool:
    """A scored candidate within a bound that covers the dtype's whole range."""
    allowed = scored[5]
    return allowed is not None and kind in _FULL_RANGE and allowed >= _FULL_RANGE[kind]


def _bound(forced: ForcedReference, node, kind: str, steps_per_stage: float) -> tuple[int, float]:
    """The rounding stages from the forced values to `node`, and the steps they allow there."""
    stages = max(forced.rounding_stages(node), 1)
    allowed = max(forced.allowed_steps(node, steps_per_stage),
                  steps_per_stage) if kind != "bool" else 0
    return stages, allowed


def _as_moved(instruction: int, op: str, value: int, kind: str, moved: str) -> LocalCheck:
    return LocalCheck(instruction, op, value, kind, moved, 0.0 if kind != "bool" else None, 0, 0,
                      0.0 if kind != "bool" else None, True)


def _kernel_name(op: str) -> str:
    return op.split("::")[-1].split(".")[0]


def _is_view_of(tensor: torch.Tensor, before: torch.Tensor) -> bool:
    """The same elements in the same row-major order (another shape)."""
    return before.numel() == tensor.numel() and before.dtype == tensor.dtype and \
        torch.equal(before.flatten(), tensor.flatten())


def _is_copy_of(tensor: torch.Tensor, before: torch.Tensor) -> bool:
    return tuple(tensor.shape) == tuple(before.shape) and torch.equal(tensor, before)


def _is_permutation_of(tensor: torch.Tensor, before: torch.Tensor) -> bool:
    """`before` with its dims permuted (any permutation giving `tensor`'s shape): a transpose
    that moved the wrong elements (a kernel reading channels-last bytes as row-major) is none."""
    if before.dim() != tensor.dim() or before.dtype != tensor.dtype or \
            sorted(before.shape) != sorted(tensor.shape):
        return False
    return any(tuple(before.shape[d] for d in order) == tuple(tensor.shape) and
               torch.equal(before.permute(*order), tensor)
               for order in itertools.permutations(range(before.dim())))


def _relation(name: str):
    """(label, test(tensor, source)) of a data-movement kernel's output to its source, or None."""
    if name in _VIEW_KERNELS:
        return "moved", _is_view_of
    if name in _COPY_KERNELS:
        return "moved", _is_copy_of
    if name in _PERMUTE_KERNELS:
        return "moved", _is_permutation_of
    if name in _EXPAND_KERNELS:
        return "moved", _is_expansion_of
    if name in ("minimum", "maximum"):
        return "clamped", lambda tensor, before: _is_clamp_of(tensor, before, name == "minimum")
    if name in _SELECTING_KERNELS:
        return "selected", _is_block_of
    return None


def _moved_from(op: str, tensor: torch.Tensor, sources, seen) -> str | None:
    """How a data-movement kernel's `tensor` comes from one of its sources ("moved from EValue
    N": exactly its elements; "selected from EValue N": one block of it; "clamped from EValue
    N": it clamped at one bound), else None."""
    relation = _relation(_kernel_name(op))
    if relation is None:
        return None
    label, holds = relation
    for source in sources:
        before = seen.get(source)
        if before is not None and holds(tensor, before):
            return f"{label} from EValue {source}"
    return None


def _movement_source(op: str, sources, seen) -> int | None:
    """The source a pure data-movement kernel (view, layout copy, permute) reads, if known."""
    if _kernel_name(op) not in _MOVING_KERNELS:
        return None
    return next((source for source in sources if seen.get(source) is not None), None)


def _is_expansion_of(out: torch.Tensor, source: torch.Tensor) -> bool:
    """`out` is `source` broadcast to `out`'s shape (torch's rules: leading dims added, size-1
    dims repeated)."""
    if out.dtype != source.dtype or source.dim() > out.dim():
        return False
    try:
        return torch.equal(source.expand(out.shape), out)
    except RuntimeError:  # not broadcastable to that shape
        return False


def _is_clamp_of(out: torch.Tensor, source: torch.Tensor, upper: bool) -> bool:
    """`out` is `source` clamped against one constant (from above for a minimum): equal where
    it is not clamped, and one value, on the right side of the source, everywhere it is."""
    if out.shape != source.shape or out.dtype != source.dtype:
        return False
    changed = out != source
    if not bool(changed.any()):
        return True
    bounds = out[changed].unique()
    if bounds.numel() != 1:
        return False
    bound = bounds[0]
    unchanged = source[~changed]
    if upper:
        return bool((source[changed] > bound).all()) and bool((unchanged <= bound).all())
    return bool((source[changed] < bound).all()) and bool((unchanged >= bound).all())


def _is_block_of(part: torch.Tensor, whole: torch.Tensor) -> bool:
    """`part` equals `whole` narrowed along one dim, or `whole` at one index of one dim."""
    if whole.numel() > _BLOCK_SEARCH_MAX or part.dtype != whole.dtype:
        return False
    for dim in range(whole.dim()):
        if part.dim() == whole.dim():
            others = [d for d in range(whole.dim()) if d != dim]
            if any(part.shape[d] != whole.shape[d] for d in others) or \
                    part.shape[dim] > whole.shape[dim]:
                continue
            length = part.shape[dim]
            if any(torch.equal(whole.narrow(dim, start, length), part)
                   for start in range(whole.shape[dim] - length + 1)):
                return True
        elif part.dim() == whole.dim() - 1:
            if tuple(whole.shape[:dim]) + tuple(whole.shape[dim + 1:]) != tuple(part.shape):
                continue
            if any(torch.equal(whole.select(dim, index), part)
                   for index in range(whole.shape[dim])):
                return True
    return False


def _without_unit_dims(shape_and_dtype):
    if shape_and_dtype is None:
        return None
    shape, dtype = shape_and_dtype
    return tuple(d for d in shape if d != 1), dtype


def _shape_and_dtype(node) -> tuple[tuple[int, ...], torch.dtype] | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return tuple(val.shape), val.dtype
    if _is_quantize(node):
        source = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if isinstance(source, torch.Tensor):
            return tuple(source.shape), node.args[5] if len(node.args) > 5 else torch.int8
    return None
