"""CPU routing: ExecuTorch's CortexMPassManager on what the NPU did not take, with its reasons kept.

`AtenToCortexMPass` decides, per node, through one substitution function per aten op: the function
returns a CMSIS-NN-backed `cortex_m::` node, or `None` when one of its conditions fails, and the
node then stays on a portable kernel. Upstream records no reason. We run the unchanged functions
and, when one returns `None`, note the line of the `return None` it took and the condition just
above it: the reason is the source of the check that decided, not a guess made afterwards. Of a
condition `a or b`, the reason names the operands that held in the function's own frame; when
the operand is a flag a quantizer-time check left on the node (a ceil_mode max-pool keeps its
qparams but is tagged `skip_quantized_max_pool2d`), that check is replayed on the node and its
own condition named.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import linecache
import math
import re
import sys
from dataclasses import dataclass
from typing import Iterator

import torch

from partitioners.records import ORIGIN_KEY, Workaround, stamp_origins  # noqa: F401 - re-exported


@dataclass(frozen=True)
class CpuDecision:
    """Why a CPU node did (kernel) or did not (reason) become a CMSIS-NN-backed cortex_m op."""

    origin: str
    aten_op: str
    category: str  # lowered | no-kernel | not-quantized | layout | shape-limit | dtype | condition
    message: str
    check: str  # where the decision was made: "file.py:line" of upstream code


_CATEGORY_PATTERNS = (
    ("not-quantized", re.compile(r"qparams|quantiz", re.I)),
    ("layout", re.compile(r"dim_order|channels_last|memory_format|nhwc|layout", re.I)),
    ("dtype", re.compile(r"dtype|int8|int16|float", re.I)),
    ("shape-limit", re.compile(r"stride|dilation|kernel|padding|groups|shape|size|rank|dim|ceil|divisor", re.I)),
)

_READABLE = {
    "not-quantized": "not quantized: the node carries no input/output qparams, so no int8 kernel applies",
    "layout": "layout condition of the CMSIS-NN kernel not met",
    "dtype": "dtype not supported by the CMSIS-NN kernel",
    "shape-limit": "shape/geometry outside what the CMSIS-NN kernel supports",
    "condition": "a condition of the Cortex-M lowering failed",
}


def _condition_before(filename: str, return_line: int) -> str:
    """The `if ...:` guarding a `return None`, read from upstream's source."""
    return _guarding_condition(filename, return_line)[1]


def _guarding_condition(filename: str, return_line: int) -> tuple[int, str]:
    """(line, text) of the `if ...:` guarding a statement, read from upstream's source."""
    for line_no in range(return_line - 1, max(return_line - 12, 0), -1):
        text = linecache.getline(filename, line_no).strip()
        if text.startswith(("if ", "elif ")) or text.startswith("or ") or text.startswith("and "):
            # Conditions can span lines: collect up to the colon that ends the `if`.
            parts = [text]
            nxt = line_no + 1
            while not parts[-1].endswith(":") and nxt < return_line:
                parts.append(linecache.getline(filename, nxt).strip())
                nxt += 1
            return line_no, " ".join(parts).rstrip(":")
    return return_line, linecache.getline(filename, return_line).strip()


def _held_parts(condition: str, f_globals: dict, f_locals: dict) -> list[str]:
    """The operands of a top-level `or` in `condition` that are true in the frame that took the
    `return None`: `a or b` fails for one reason, not both. The whole condition when it is no
    disjunction or an operand cannot be re-evaluated."""
    expression = re.sub(r"^(if|elif|or|and)\s+", "", condition.strip())
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return [condition]
    if not (isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.Or)):
        return [condition]
    held = []
    for part in tree.values:
        try:
            value = eval(compile(ast.Expression(part), "<upstream condition>", "eval"),  # noqa: S307
                         f_globals, dict(f_locals))
        except Exception:  # noqa: BLE001 - upstream's names, not ours: keep the whole condition
            return [condition]
        if value:
            held.append(ast.unparse(part))
    return held or [condition]


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


# Flags a quantizer-time check leaves in `node.meta` for AtenToCortexMPass to read. When a
# substitution declines because of one, the reason is the check that set it: it is replayed on
# the node to find which of its conditions held. (ExecuTorch 1.5.1: CortexMMaxPool2DCheck tags
# a ceil_mode or dilated max-pool, which keeps its qparams, so `input_qparams is None or
# <flag>` would otherwise read as "not quantized".)
_FLAG_SETTERS = {
    "skip_quantized_max_pool2d": ("executorch.backends.cortex_m.quantizer.pattern_checkers",
                                  "CortexMMaxPool2DCheck"),
}


def _flag_setter(flag: str, node) -> tuple[list[str], str, str, str] | None:
    """(held conditions, their values, the check's class, "file.py:line") of the quantizer check
    that set `flag` on `node`, found by replaying its `check_pattern` under a line tracer."""
    import importlib

    module_name, class_name = _FLAG_SETTERS[flag]
    checker = getattr(importlib.import_module(module_name), class_name)
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
    return held, _values_of(held, f_locals), class_name, f"{filename.rsplit('/', 1)[-1]}:{line}"


def _explain(condition: str, frame, node) -> tuple[str, str, str | None]:
    """(category, reason text, file:line of a quantizer check behind it) for a substitution's
    `return None`: the operands of its condition that held, with the node's values, or the
    quantizer check behind a flag it read. Line numbers stay out of the text (plan.json must
    not change with unrelated upstream edits)."""
    if frame is None:
        return _categorize(condition), f"`{condition}`", None
    f_globals, f_locals = frame
    held = _held_parts(condition, f_globals, f_locals)
    for flag in _FLAG_SETTERS:
        if any(flag in part for part in held):
            setter = _flag_setter(flag, node)
            if setter is not None:
                setter_held, values, check_class, where = setter
                text = " or ".join(setter_held)
                detail = f" ({values})" if values else ""
                return (_categorize(text), f"`{text}`{detail}: the quantizer's {check_class} "
                        f"marks the node `{flag}`", where)
    text = " or ".join(held)
    values = _values_of(held, f_locals)
    return _categorize(text), f"`{text}`" + (f" ({values})" if values else ""), None


def _categorize(condition: str) -> str:
    for category, pattern in _CATEGORY_PATTERNS:
        if pattern.search(condition):
            return category
    return "condition"


def _op_name(target) -> str:
    name = str(getattr(target, "__name__", target))
    return name


@contextlib.contextmanager
def cmsis_decisions_recorded() -> Iterator[dict[str, CpuDecision]]:
    """Record every AtenToCortexMPass substitution decision, keyed by the node's origin name."""
    from executorch.backends.cortex_m.passes.aten_to_cortex_m_pass import AtenToCortexMPass

    decisions: dict[str, CpuDecision] = {}
    upstream = dict(AtenToCortexMPass._DIALECT_SUBSTITUTIONS)

    def wrap(substitution):
        code = substitution.__code__
        filename = inspect.getsourcefile(substitution) or code.co_filename

        def recording_substitution(node, dialect_pass):
            origin = node.meta.get(ORIGIN_KEY, node.name)
            returned_at: list[tuple[int, tuple[dict, dict]]] = []

            def profiler(frame, event, arg):
                if event == "return" and frame.f_code is code:
                    returned_at.append((frame.f_lineno, (frame.f_globals, dict(frame.f_locals))))

            previous = sys.getprofile()
            sys.setprofile(profiler)
            try:
                spec = substitution(node, dialect_pass)
            finally:
                sys.setprofile(previous)
            short_file = filename.rsplit("/", 1)[-1]
            if spec is None:
                line, frame = returned_at[-1] if returned_at else (code.co_firstlineno, None)
                condition = _condition_before(filename, line)
                category, text, setter = _explain(condition, frame, node)
                decisions[origin] = CpuDecision(
                    origin, _op_name(node.target), category, f"{_READABLE[category]} ({text})",
                    f"{short_file}:{line}" + (f" after {setter}" if setter else ""))
            else:
                decisions[origin] = CpuDecision(
                    origin, _op_name(node.target), "lowered",
                    f"lowered to {_op_name(spec.op)}", f"{short_file}:{code.co_firstlineno}")
            return spec

        return recording_substitution

    for target, substitution in upstream.items():
        AtenToCortexMPass._DIALECT_SUBSTITUTIONS[target] = wrap(substitution)
    try:
        yield decisions
    finally:
        AtenToCortexMPass._DIALECT_SUBSTITUTIONS.clear()
        AtenToCortexMPass._DIALECT_SUBSTITUTIONS.update(upstream)


def has_cmsis_substitution(target) -> bool:
    from executorch.backends.cortex_m.passes.aten_to_cortex_m_pass import AtenToCortexMPass

    return target in AtenToCortexMPass._DIALECT_SUBSTITUTIONS


_COMPARISONS = {"gt": math.floor, "le": math.floor, "ge": math.ceil, "lt": math.ceil}


def requantize_comparison_scalars(program) -> list[Workaround]:
    """Put the scalar of an int8 comparison in the int8 domain.

    Upstream defect (ExecuTorch 1.5.1): FoldAndAnnotateQParamsPass folds the dequantize in front
    of `gt(x, 0.0)` into the node's `input_qparams`, so the portable `gt.Scalar` kernel compares
    the int8 values, but the scalar stays in the float domain. With a zero point of -8 every
    int8 value in (-8, 0] lands on the wrong side (measured on the `mixed` model, CPU-only:
    9 int8 steps off after the following `where`). For x_q integer and t = s / scale + zp,
    x > s  <=>  x_q > floor(t), x >= s <=> x_q >= ceil(t), and likewise for lt/le.
    """
    fixes = []
    for node in program.graph_module.graph.nodes:
        name = str(getattr(node.target, "__name__", node.target))
        parts = name.split(".")
        if node.op != "call_function" or len(parts) < 3 or parts[0] != "aten" \
                or parts[1] not in _COMPARISONS or parts[2] != "Scalar":
            continue
        qparams = node.meta.get("input_qparams", {}).get(0)
        source = node.args[0]
        val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if qparams is None or val is None or val.dtype not in (torch.int8, torch.int16):
            continue
        scalar = float(node.args[1])
        threshold = _COMPARISONS[parts[1]](scalar / float(qparams.scale) + int(qparams.zp))
        node.args = (source, int(threshold))
        fixes.append(Workaround(
            node.meta.get(ORIGIN_KEY, node.name), "FoldAndAnnotateQParamsPass (ExecuTorch 1.5.1)",
            f"{parts[1]}.Scalar compares int8 values (scale {float(qparams.scale):.6g}, zero point "
            f"{int(qparams.zp)}) with the float scalar {scalar:g}; threshold requantized to "
            f"{int(threshold)}"))
    if fixes:
        program.graph_module.recompile()
    return fixes


def route_to_cpu(edge_manager, cpu: str, legalize: bool = True):
    """Run CortexMPassManager for `cpu` on the edge program (the manager is left as it was).

    Returns the transformed ExportedProgram, the per-node CMSIS-NN decisions and the upstream
    defects worked around on the way.
    """
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.backends.cortex_m.target_config import CortexMTargetConfig

    program = edge_manager.exported_program()
    stamp_origins(program.graph_module)
    with cmsis_decisions_recorded() as decisions:
        transformed = CortexMPassManager(
            program, target_config=CortexMTargetConfig.from_target_string(cpu)
        ).transform()
    # `aot_arm_compiler.py` swaps only the Q/DQ nodes in its NPU path; the full pass manager is
    # what turns a rejected conv into a CMSIS-NN kernel instead of a float aten op.
    from partitioners.legalize import legalize_for_device

    # Order matters: requantize first, so legalization's new int8 `.Scalar` nodes are not
    # requantized twice.
    workarounds = requantize_comparison_scalars(transformed)
    if legalize:
        workarounds += legalize_for_device(transformed)
    return transformed, dict(decisions), tuple(workarounds)
