"""Adapter: every touch of the Cortex-M backend's private names and internals, in one place, with
a version guard.

- `AtenToCortexMPass._DIALECT_SUBSTITUTIONS` (aten op -> substitution function that returns a
  CMSIS-NN-backed node or None) is the only record of which aten ops have a CMSIS-NN kernel and
  of the conditions each substitution checks; it has no public accessor.
- Upstream records no reason when a substitution returns None. `substitutions_observed` runs
  the unchanged functions under a profiler and, when one returns None, reads the `return None`
  it took and the `if` just above it from upstream's source (linecache); of a condition
  `a or b` it keeps the operands that held in the function's own frame. The reason is the
  source of the check that decided, not a guess made afterwards.
- When that operand is a flag a quantizer-time check left in `node.meta` (ExecuTorch 1.5.1:
  `CortexMMaxPool2DCheck` tags a ceil_mode or dilated max-pool `skip_quantized_max_pool2d` and
  keeps its qparams, so `input_qparams is None or <flag>` would otherwise read as "not
  quantized"), the check's `check_pattern` is replayed on the node under a line tracer and its
  own condition is named.
- `_get_linear_replacement` reads the weight's zero point and scale as one number each
  (ExecuTorch 1.5.1, aten_to_cortex_m_pass.py:398 `if weight_zp != 0: raise
  NotImplementedError`, :405 one multiplier from `input_scale * weight_scale`), and its kernel
  requantizes with `requantize_multipliers[0]` only (ops/operators.py:585,
  op_quantized_linear.cpp:54). The Ethos-U quantizer quantizes a linear's weight per channel:
  symmetric, so its zero points are a list of zeros, which the `!= 0` test refuses.
  `per_channel_weights_legalized` gives upstream the scalar form where that is exact (zero
  points all 0 and one scale for every channel) and otherwise refuses with the real reason (one
  multiplier cannot honour several scales); a non-zero zero point reaches upstream's refusal.
  The convolution substitutions read per-channel scales as a list and no weight zero point.
- `_get_convolution_replacement` takes `in_channels == groups` as depthwise (ExecuTorch 1.5.1,
  aten_to_cortex_m_pass.py:528), so an ordinary convolution with one input channel (groups 1,
  the first layer of an audio or greyscale model) runs as CMSIS-NN's depthwise kernel with a
  depth multiplier of its output channels, where TFLM runs CMSIS-NN's convolution (keyword
  spotting's first layer on the M4: 1,917,760 instructions against 1,111,480; upstream's TODO
  #16347 there expects it). `single_channel_convolutions_as_conv2d` gives such a node the
  convolution kernel upstream's own other branch builds: the same arguments but the depth
  multiplier, and the weight in OHWI order in place of IHWO (for one input channel, the same
  values transposed).

This leans on upstream's source layout: every `return None` of a substitution sits under an
`if` a few lines above it, and the checker sets its flag under an `if`. `contract()` reports
both, and tests/test_upstream_adapters.py checks them without compiling.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import linecache
import re
import sys
from dataclasses import dataclass
from typing import Callable, Iterator

from partitioners.upstream_version import UpstreamVersionError, require  # noqa: F401

SUPPORTED_EXECUTORCH = ("1.5.1",)

# Flags a quantizer-time check leaves in `node.meta` for AtenToCortexMPass to read, and the check
# that sets each: (module, class). Its `check_pattern(pattern)` sets the flag under a condition.
FLAG_SETTERS = {
    "skip_quantized_max_pool2d": ("executorch.backends.cortex_m.quantizer.pattern_checkers",
                                  "CortexMMaxPool2DCheck"),
}
# Substitutions that read a weight's scale and zero point as one number each.
SCALAR_WEIGHT_QPARAMS = ("_get_linear_replacement",)
# The substitution that sends a one-input-channel convolution to the depthwise kernel, and the
# kernels of its two branches: (plain, explicit NHWC).
CONVOLUTION_SUBSTITUTION = "_get_convolution_replacement"
_DEPTHWISE_TO_CONV = {"quantized_depthwise_conv2d": "quantized_conv2d",
                      "quantized_depthwise_conv2d_nhwc": "quantized_conv2d_nhwc"}
# How far above a `return None` its guarding `if` may start (the longest upstream condition
# spans a few lines).
_GUARD_SEARCH_LINES = 12


def check_version() -> str:
    return require("executorch", SUPPORTED_EXECUTORCH, "partitioners/upstream_cortex_m.py")


def _table() -> dict:
    check_version()
    from executorch.backends.cortex_m.passes.aten_to_cortex_m_pass import AtenToCortexMPass  # lazy: heavy (executorch)

    return AtenToCortexMPass._DIALECT_SUBSTITUTIONS


def substitutions() -> dict:
    """A copy of aten op -> upstream substitution function."""
    return dict(_table())


def has_substitution(target) -> bool:
    return target in _table()


def substituted_op_names() -> frozenset[str]:
    """Base names ("convolution", "add", ...) of the aten ops that have a CMSIS-NN substitution."""
    names = set()
    for target in _table():
        name = str(getattr(target, "__name__", target))
        parts = name.split(".")
        names.add(parts[1] if parts[0] in ("aten", "edge") and len(parts) > 1 else parts[0])
    return frozenset(names)


@contextlib.contextmanager
def substitutions_wrapped(wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """Replace every substitution `f` by `wrap(f)` meanwhile."""
    table = _table()
    upstream = dict(table)
    for target, substitution in upstream.items():
        table[target] = wrap(substitution)
    try:
        yield
    finally:
        table.clear()
        table.update(upstream)


@dataclass(frozen=True)
class Lowered:
    """A substitution returned a CMSIS-NN-backed node."""

    op: str  # the cortex_m op it returned, e.g. "cortex_m.quantized_add.default"
    where: str  # "file.py:line" of the substitution function


@dataclass(frozen=True)
class QuantizerFlag:
    """The quantizer-time check behind a flag a substitution read."""

    flag: str  # the `node.meta` flag, e.g. "skip_quantized_max_pool2d"
    check: str  # the class of the check that set it, e.g. "CortexMMaxPool2DCheck"
    held: tuple[str, ...]  # the operands of the check's condition that held (upstream source)
    values: str  # "name=value, ..." of the plain locals they read
    where: str  # "file.py:line" of that condition


@dataclass(frozen=True)
class Declined:
    """A substitution returned None: which of its conditions held."""

    held: tuple[str, ...]  # operands of the condition guarding the `return None` (upstream source)
    values: str  # "name=value, ..." of the plain locals they read
    where: str  # "file.py:line" of the `return None` taken
    flag: QuantizerFlag | None = None  # when an operand that held is a quantizer check's flag


class SubstitutionFailed(RuntimeError):
    """An AtenToCortexMPass substitution raised (e.g. `quantized_linear` refusing per-channel
    weight zero points); the message ends like torch.fx's "While executing %node" so the CPU
    routing can keep that node in float."""

    def __init__(self, node_name: str, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error} While executing %{node_name}")
        self.node_name = node_name


class PerChannelWeightScales(NotImplementedError):
    """A per-channel weight reached a substitution that takes one scale (see the module
    docstring): the message says what upstream lacks."""


@contextlib.contextmanager
def per_channel_weights_legalized(record: Callable[[object, int, float], None]) -> Iterator[None]:
    """Meanwhile, before a SCALAR_WEIGHT_QPARAMS substitution runs on a node whose weight is
    quantized per channel with zero points all 0: when every channel has the same scale, put
    the scalar form in `node.meta["input_qparams"][1]` (the same int8 arithmetic) and call
    `record(node, channels, scale)`; when the scales differ, raise SubstitutionFailed for the
    node with a PerChannelWeightScales. Enter it after `substitutions_observed`, so the observer
    still profiles upstream's own code."""
    with substitutions_wrapped(_legalizing(record)):
        yield


def _legalizing(record):
    def wrap(substitution):
        if inspect.unwrap(substitution).__name__ not in SCALAR_WEIGHT_QPARAMS:
            return substitution

        @functools.wraps(substitution)
        def legalized_substitution(node, dialect_pass):
            qparams = node.meta.get("input_qparams") or {}
            weight = qparams.get(1)
            zero_points = getattr(weight, "zp", 0)
            if isinstance(zero_points, (list, tuple)) and all(int(z) == 0 for z in zero_points):
                scales = (list(weight.scale) if isinstance(weight.scale, (list, tuple))
                          else [weight.scale] * len(zero_points))
                if len({float(s) for s in scales}) > 1:
                    refusal = PerChannelWeightScales(
                        f"cortex_m::quantized_linear requantizes all {len(scales)} output "
                        f"channels with one multiplier (ExecuTorch 1.5.1), but the weight is "
                        f"quantized per channel with {len({float(s) for s in scales})} "
                        f"different scales ({min(scales):.4g} to {max(scales):.4g}; zero points "
                        "all 0): one scale would change the int8 results")
                    raise SubstitutionFailed(node.name, refusal) from refusal
                qparams[1] = weight._replace(scale=float(scales[0]), zp=0, per_channel=False)
                record(node, len(zero_points), float(scales[0]))
            return substitution(node, dialect_pass)

        return legalized_substitution

    return wrap


@contextlib.contextmanager
def single_channel_convolutions_as_conv2d(record: Callable[[object], None]) -> Iterator[None]:
    """Meanwhile, a convolution with groups 1 and one input channel that upstream's substitution
    returns as `quantized_depthwise_conv2d[_nhwc]` becomes `quantized_conv2d[_nhwc]` (module
    docstring), and `record(node)` is called. Enter it before `substitutions_observed`, so the
    observer records the kernel the node gets."""
    with substitutions_wrapped(_as_conv2d(record)):
        yield


def _as_conv2d(record):
    def wrap(substitution):
        if inspect.unwrap(substitution).__name__ != CONVOLUTION_SUBSTITUTION:
            return substitution

        @functools.wraps(substitution)
        def conv2d_substitution(node, dialect_pass):
            spec = substitution(node, dialect_pass)
            kernel = _name(getattr(spec, "op", "")).split(".")
            if (spec is None or len(kernel) < 2 or kernel[1] not in _DEPTHWISE_TO_CONV
                    or node.args[8] != 1):
                return spec
            return _conv2d_spec(node, spec, dialect_pass.exported_program,
                                _DEPTHWISE_TO_CONV[kernel[1]], record)

        return conv2d_substitution

    return wrap


def _conv2d_spec(node, spec, exported_program, kernel: str, record):
    """The convolution kernel's spec for a depthwise `spec` of one input channel. The weight
    placeholder upstream made for this node (IHWO, [1, H, W, O]) takes the OHWI values in place:
    upstream's pass manager works on a copy of the program that shares the signature's input
    list, so adding and deleting placeholders here would leave the two out of step."""
    from executorch.backends.transforms.aten_to_dialect_pass import DialectNodeSpec  # lazy: heavy (executorch)
    from executorch.exir.dialects._ops import ops as exir_ops  # lazy: heavy (executorch)
    import torch  # lazy: heavy (torch)

    args = list(spec.args)
    placeholder = args[1]
    target = exported_program.graph_signature.inputs_to_parameters.get(placeholder.name)
    weight = exported_program.state_dict.get(target) if target is not None else None
    fake = placeholder.meta.get("val")
    if (weight is None or weight.dim() != 4 or int(weight.shape[0]) != 1
            or getattr(fake, "fake_mode", None) is None):
        return spec
    ohwi = weight.detach().permute(3, 1, 2, 0).contiguous()
    exported_program.state_dict[target] = (torch.nn.Parameter(ohwi, requires_grad=False)
                                           if isinstance(weight, torch.nn.Parameter) else ohwi)
    placeholder.meta["val"] = fake.fake_mode.from_tensor(ohwi, static_shapes=True)
    del args[6]  # the depth multiplier: the convolution kernel's arguments are the rest
    record(node)
    return DialectNodeSpec(getattr(exir_ops.edge.cortex_m, kernel).default, tuple(args),
                           spec.kwargs)


@contextlib.contextmanager
def substitutions_observed(observe: Callable[[object, Lowered | Declined], None]) -> Iterator[None]:
    """Call `observe(node, outcome)` after every substitution AtenToCortexMPass runs meanwhile.

    Not reentrant: an observed substitution observed again would profile the outer wrapper."""
    with substitutions_wrapped(_observing(observe)):
        yield


def _observing(observe):
    def wrap(substitution):
        upstream = inspect.unwrap(substitution)  # its source, under any of our wrappers
        code = upstream.__code__
        filename = inspect.getsourcefile(upstream) or code.co_filename
        short_file = filename.rsplit("/", 1)[-1]

        @functools.wraps(substitution)  # keeps the upstream name for per_channel_weights_legalized
        def observed_substitution(node, dialect_pass):
            returned_at: list[tuple[int, tuple[dict, dict]]] = []

            def profiler(frame, event, arg):
                if event == "return" and frame.f_code is code:
                    returned_at.append((frame.f_lineno, (frame.f_globals, dict(frame.f_locals))))

            previous = sys.getprofile()
            sys.setprofile(profiler)
            try:
                spec = substitution(node, dialect_pass)
            except Exception as error:  # noqa: BLE001 - name the node the substitution failed on
                raise SubstitutionFailed(node.name, error) from error
            finally:
                _restore_profile(previous)
            if spec is None:
                line, frame = returned_at[-1] if returned_at else (code.co_firstlineno, None)
                observe(node, _declined(filename, line, frame, node))
            else:
                observe(node, Lowered(_name(spec.op), f"{short_file}:{code.co_firstlineno}"))
            return spec

        return observed_substitution

    return wrap


def _restore_profile(previous) -> None:
    """Put back the profile function that was active: a Python callable through setprofile;
    cProfile's C profiler (getprofile() returns its Profile object, which setprofile refuses)
    by enabling it again, so `python -m cProfile orchestrate ...` keeps profiling."""
    if previous is None or callable(previous):
        sys.setprofile(previous)
    elif hasattr(previous, "enable"):
        sys.setprofile(None)
        previous.enable()
    else:
        sys.setprofile(None)


def _name(target) -> str:
    return str(getattr(target, "__name__", target))


def _declined(filename: str, line: int, frame, node) -> Declined:
    where = f"{filename.rsplit('/', 1)[-1]}:{line}"
    condition = _guarding_condition(filename, line)[1]
    if frame is None:
        return Declined((_expression(condition),), "", where)
    f_globals, f_locals = frame
    held = _held_parts(condition, f_globals, f_locals)
    values = _values_of(held, f_locals)
    for flag in FLAG_SETTERS:
        if any(flag in part for part in held):
            setter = _flag_setter(flag, node)
            if setter is not None:
                return Declined(tuple(held), values, where, setter)
    return Declined(tuple(held), values, where)


def _guarding_condition(filename: str, return_line: int) -> tuple[int, str]:
    """(line, text) of the `if ...:` guarding a statement, read from upstream's source; the
    statement itself when no `if` is found above it."""
    for line_no in range(return_line - 1, max(return_line - _GUARD_SEARCH_LINES, 0), -1):
        text = linecache.getline(filename, line_no).strip()
        if text.startswith(("if ", "elif ", "or ", "and ")):
            # Conditions can span lines: collect up to the colon that ends the `if`.
            parts = [text]
            nxt = line_no + 1
            while not parts[-1].endswith(":") and nxt < return_line:
                parts.append(linecache.getline(filename, nxt).strip())
                nxt += 1
            return line_no, " ".join(parts).rstrip(":")
    return return_line, linecache.getline(filename, return_line).strip()


def _expression(condition: str) -> str:
    """The condition without its `if`/`elif` (or the `or`/`and` of a continuation line)."""
    return re.sub(r"^(if|elif|or|and)\s+", "", condition.strip())


def _held_parts(condition: str, f_globals: dict, f_locals: dict) -> list[str]:
    """The operands of a top-level `or` in `condition` that are true in the frame that took the
    `return None`: `a or b` fails for one reason, not both. The whole condition when it is no
    disjunction or an operand cannot be re-evaluated."""
    expression = _expression(condition)
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return [expression]
    if not (isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.Or)):
        return [expression]
    held = []
    for part in tree.values:
        try:
            value = eval(compile(ast.Expression(part), "<upstream condition>", "eval"),  # noqa: S307
                         f_globals, dict(f_locals))
        except Exception:  # noqa: BLE001 - upstream's names, not ours: keep the whole condition
            return [expression]
        if value:
            held.append(ast.unparse(part))
    return held or [expression]


def _values_of(parts: list[str], f_locals: dict) -> str:
    """`name=value` for the plain local names a condition reads (the node's kernel, stride ...)."""
    names = []
    for part in parts:
        try:
            tree = ast.parse(part, mode="eval")
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in f_locals and node.id not in names:
                value = f_locals[node.id]
                if isinstance(value, (bool, int, float, str, tuple, list)) or value is None:
                    names.append(node.id)
    return ", ".join(f"{n}={f_locals[n]!r}" for n in names)


def _flag_checker(flag: str):
    module_name, class_name = FLAG_SETTERS[flag]
    return getattr(importlib.import_module(module_name), class_name)


def _flag_setter(flag: str, node) -> QuantizerFlag | None:
    """The quantizer check that set `flag` on `node`, found by replaying its `check_pattern`
    under a line tracer: the first line that names the flag, and the `if` guarding it."""
    checker = _flag_checker(flag)
    code = checker.check_pattern.__func__.__code__
    filename = inspect.getsourcefile(checker.check_pattern) or code.co_filename
    found: list = []

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None
        if event == "line" and not found and flag in linecache.getline(filename, frame.f_lineno):
            found.append((frame.f_lineno, dict(frame.f_globals), dict(frame.f_locals)))
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        checker.check_pattern([node])  # sets a flag the node already carries: idempotent
    except Exception:  # noqa: BLE001 - the replay explains; it must never break the compile
        return None
    finally:
        sys.settrace(previous)
    if not found:
        return None
    line, f_globals, f_locals = found[0]
    line, condition = _guarding_condition(filename, line)
    held = _held_parts(condition, f_globals, f_locals)
    return QuantizerFlag(flag, checker.__name__, tuple(held), _values_of(held, f_locals),
                         f"{filename.rsplit('/', 1)[-1]}:{line}")


def _guards_of_return_none(function) -> list[tuple[str, str]]:
    """("file.py:line", guarding condition or "") for every `return None` in `function`'s source."""
    filename = inspect.getsourcefile(function)
    lines, first = inspect.getsourcelines(function)
    guards = []
    for offset, text in enumerate(lines):
        if text.strip() == "return None":
            line = first + offset
            guard_line, condition = _guarding_condition(filename, line)
            guards.append((f"{filename.rsplit('/', 1)[-1]}:{line}",
                           _expression(condition) if guard_line != line else ""))
    return guards


def contract() -> dict[str, object]:
    """The upstream names, signatures and source lines this adapter relies on (for the contract
    test)."""
    from executorch.backends.cortex_m.passes.aten_to_cortex_m_pass import AtenToCortexMPass  # lazy: heavy (executorch)

    table = AtenToCortexMPass._DIALECT_SUBSTITUTIONS
    functions = {f.__name__: f for f in table.values()}
    first = next(iter(table.values()))
    returns = {name: _guards_of_return_none(f) for name, f in sorted(functions.items())
               if inspect.isfunction(f)}
    setters = {}
    for flag in FLAG_SETTERS:
        checker = _flag_checker(flag)
        source_lines, start = inspect.getsourcelines(checker.check_pattern)
        filename = inspect.getsourcefile(checker.check_pattern)
        setting = [start + i for i, text in enumerate(source_lines) if flag in text]
        setters[flag] = {
            "check": checker.__name__,
            "check_pattern": list(inspect.signature(checker.check_pattern).parameters),
            "sets it under": (_expression(_guarding_condition(filename, setting[0])[1])
                              if setting else None),
            "read by": sorted(name for name, f in functions.items()
                              if inspect.isfunction(f) and flag in inspect.getsource(f)),
        }
    return {
        "_DIALECT_SUBSTITUTIONS": isinstance(table, dict) and len(table) > 0,
        "substitution signature": list(inspect.signature(first).parameters),
        "plain functions": all(inspect.isfunction(f) for f in table.values()),
        "return None guards": returns,
        "flag setters": setters,
        # per_channel_weights_legalized: the substitutions it wraps, and the check each makes
        "scalar weight qparams": {
            name: "if weight_zp != 0:" in inspect.getsource(functions[name])
            if name in functions else None for name in SCALAR_WEIGHT_QPARAMS},
        # single_channel_convolutions_as_conv2d: upstream's depthwise test
        "depthwise test": ("is_depthwise = (in_channels == groups)" in inspect.getsource(
            functions[CONVOLUTION_SUBSTITUTION]) if CONVOLUTION_SUBSTITUTION in functions
            else None),
    }
