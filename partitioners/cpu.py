"""CPU routing: ExecuTorch's CortexMPassManager on what the NPU did not take, with its reasons kept.

`AtenToCortexMPass` decides, per node, through one substitution function per aten op: the function
returns a CMSIS-NN-backed `cortex_m::` node, or `None` when one of its conditions fails, and the
node then stays on a portable kernel. Upstream records no reason. We run the unchanged functions
and, when one returns `None`, note the line of the `return None` it took and the condition just
above it: the reason is the source of the check that decided, not a guess made afterwards.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import math
import re
import sys
from dataclasses import dataclass
from typing import Iterator

import torch

ORIGIN_KEY = "orchestrate_origin"


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
    for line_no in range(return_line - 1, max(return_line - 12, 0), -1):
        text = linecache.getline(filename, line_no).strip()
        if text.startswith(("if ", "elif ")) or text.startswith("or ") or text.startswith("and "):
            # Conditions can span lines: collect up to the colon that ends the `if`.
            parts = [text]
            nxt = line_no + 1
            while not parts[-1].endswith(":") and nxt < return_line:
                parts.append(linecache.getline(filename, nxt).strip())
                nxt += 1
            return " ".join(parts).rstrip(":")
    return linecache.getline(filename, return_line).strip()


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
            returned_at: list[int] = []

            def profiler(frame, event, arg):
                if event == "return" and frame.f_code is code:
                    returned_at.append(frame.f_lineno)

            previous = sys.getprofile()
            sys.setprofile(profiler)
            try:
                spec = substitution(node, dialect_pass)
            finally:
                sys.setprofile(previous)
            short_file = filename.rsplit("/", 1)[-1]
            if spec is None:
                line = returned_at[-1] if returned_at else code.co_firstlineno
                condition = _condition_before(filename, line)
                category = _categorize(condition)
                decisions[origin] = CpuDecision(
                    origin, _op_name(node.target), category,
                    f"{_READABLE[category]} (`{condition}`)", f"{short_file}:{line}")
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


def stamp_origins(graph_module: torch.fx.GraphModule) -> None:
    """Tag each node with its pre-CPU-pass name; the passes carry `meta` across rewrites."""
    for node in graph_module.graph.nodes:
        node.meta.setdefault(ORIGIN_KEY, node.name)


_COMPARISONS = {"gt": math.floor, "le": math.floor, "ge": math.ceil, "lt": math.ceil}


@dataclass(frozen=True)
class Workaround:
    """An upstream defect corrected in our flow; reported in the plan so nobody is surprised."""

    node: str
    upstream: str  # the component at fault
    message: str


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
