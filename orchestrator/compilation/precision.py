"""Precision per module: int16 activations (A16W8) where a user asks for them.

`--precision MODULE=a16w8[,MODULE=a16w8...]` (or a policy's `precision:` map) quantizes the named
modules (as `model.named_modules()` names them) with upstream's
`get_symmetric_a16w8_quantization_config` (ExecuTorch 1.5.1, executorch.backends.arm.quantizer:
int16 activations, symmetric, zero point 0; int8 per-channel weights); every other module keeps
the target's int8 config (a8w8). The activation observer is the calibration method's
(orchestrator/compilation/observers.py), as for the int8 config.

- NPU targets: the EthosUQuantizer takes it through its own `set_module_name`.
- CPU-only targets: upstream's CortexMQuantizer has no `set_module_name`, and its pattern checks
  accept int8 only (cortex_m/quantizer/pattern_checkers.py: `is_int8_activations` for conv,
  linear, add, ...). It is a ComposableQuantizer in which the first quantizer to match a node
  wins, so each A16W8 module gets, in front of its int8 quantizers, the quantizer that
  EthosUQuantizer's `set_module_name` builds: upstream's `PatternQuantizer` with the a16w8
  config, a `ModuleNameNodeFinder` and the Arm quantizer's pattern matcher
  (`TOSA_QUANTIZER_SUPPORT_DICT`, which takes int16). The graph is the one an NPU target's
  quantizer makes for those modules: int16 dequantize/quantize around int8 per-channel weights.

Where an int8 value meets an int16 one, upstream's quantizer puts a dequantize and a quantize of
the other dtype: a requantize, which the NPU computes as a TOSA RESCALE inside a partition and
the CPU as a dequantize/quantize pair (cortex_m::dequantize_per_tensor and quantize_per_tensor,
which take int8 and int16). The plan shows each as a `requantize` row, where it runs.

An int16 op on the CPU (CPU-only, or one that leaves the NPU) runs on our CMSIS-NN s16 operators
where one exists (convolution and linear: kernels/s16, partitioners/s16_operators.py), else in
float on its portable kernel between its int16 dequantize and quantize (partitioners/cpu.py,
reason no-s16-operator).
"""

from __future__ import annotations

import difflib
import inspect
import re

from orchestrator.errors import UserError

A8W8, A16W8 = "a8w8", "a16w8"
PRECISIONS = (A8W8, A16W8)  # what a module may be given; a8w8 is every module's default
FLOAT = "float"  # a row computed in float (a portable kernel between a dequantize and quantize)

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


def parse(text: str | None, where: str = "--precision") -> tuple[tuple[str, str], ...]:
    """`MODULE=a16w8,MODULE=a16w8` as ((module, precision), ...); one UserError line on bad
    syntax or an unknown precision."""
    if text is None or not text.strip():
        return ()
    pairs = []
    for item in text.split(","):
        module, sep, precision = item.strip().partition("=")
        if not sep:
            raise UserError(f"{where} {item.strip()!r}: write MODULE=PRECISION (e.g. "
                            f"features.2=a16w8), modules separated by commas")
        pairs.append((module.strip(), precision.strip()))
    return checked(pairs, where)


def from_mapping(raw, where: str) -> tuple[tuple[str, str], ...]:
    """A policy's `precision:` map ({module: precision}) checked like `--precision`."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in raw.items()):
        raise UserError(f"{where}: precision must map module names to one of "
                        f"{', '.join(PRECISIONS)} (e.g. precision: {{features.2: a16w8}})")
    return checked(list(raw.items()), where)


def checked(pairs, where: str) -> tuple[tuple[str, str], ...]:
    seen: dict[str, str] = {}
    for module, precision in pairs:
        if not _MODULE_NAME.match(module):
            raise UserError(f"{where}: {module!r} is not a module name (as model.named_modules() "
                            "names them, e.g. features.2 or classifier)")
        if precision.lower() not in PRECISIONS:
            raise UserError(f"{where}: precision {precision!r} for {module} is not offered; use "
                            f"one of {', '.join(PRECISIONS)}")
        if module in seen and seen[module] != precision.lower():
            raise UserError(f"{where}: module {module} is given two precisions "
                            f"({seen[module]}, {precision.lower()})")
        seen[module] = precision.lower()
    return tuple(seen.items())


def merged(policy_pairs, request_pairs) -> tuple[tuple[str, str], ...]:
    """The policy's map with the command line's entries winning per module."""
    out = dict(policy_pairs)
    out.update(dict(request_pairs))
    return tuple(out.items())


def raised(pairs) -> tuple[str, ...]:
    """The modules given int16 activations."""
    return tuple(module for module, precision in pairs if precision == A16W8)


def check_modules(module, pairs, model_name: str) -> None:
    """Every module named is one of the model's (named_modules()); else one line with the
    closest names."""
    names = [name for name, _ in module.named_modules() if name]
    for name, _ in pairs:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else \
                f"; its modules are {', '.join(names[:12])}{', ...' if len(names) > 12 else ''}"
            raise UserError(f"--precision: model '{model_name}' has no module {name!r} (names "
                            f"as model.named_modules() gives them){hint}")


def configure(quantizer, pairs, observed) -> None:
    """Give each A16W8 module upstream's a16w8 config through the EthosUQuantizer's own
    set_module_name; `observed(config)` gives it the calibration method's activation observer
    (orchestrator/compilation/observers.py)."""
    from executorch.backends.arm.quantizer import (  # lazy: heavy (executorch)
        get_symmetric_a16w8_quantization_config)

    for module in raised(pairs):
        quantizer.set_module_name(module, observed(
            get_symmetric_a16w8_quantization_config(is_per_channel=True)))
    _output_config(quantizer.set_node_finder, pairs, observed)


def configure_cortex_m(quantizer, pairs, observed) -> None:
    """The CPU-only form of `configure` (module docstring): in front of the CortexMQuantizer's
    own quantizers, what EthosUQuantizer's set_module_name and set_node_finder put in front of
    its global one."""
    from executorch.backends.arm.quantizer import (  # lazy: heavy (executorch)
        get_symmetric_a16w8_quantization_config)
    from executorch.backends.arm.quantizer.arm_quantizer_utils import (  # lazy: heavy (executorch)
        PatternQuantizer)
    from executorch.backends.arm.quantizer.quantizer_support import (  # lazy: heavy (executorch)
        TOSA_QUANTIZER_SUPPORT_DICT)
    from executorch.backends.cortex_m.quantizer.node_finders import (  # lazy: heavy (executorch)
        ModuleNameNodeFinder)
    from executorch.backends.cortex_m.quantizer.pattern_matcher import (  # lazy: heavy (executorch)
        PatternMatcher)

    if not raised(pairs):
        return
    matcher = PatternMatcher(TOSA_QUANTIZER_SUPPORT_DICT)

    def in_front(config, finder) -> None:
        quantizer.quantizers.insert(0, PatternQuantizer(config, finder, matcher))

    # Each insertion goes first, as EthosUQuantizer's add_quantizer does: the output node's
    # finder, inserted last, wins over the modules'.
    for module in raised(pairs):
        in_front(observed(get_symmetric_a16w8_quantization_config(is_per_channel=True)),
                 ModuleNameNodeFinder(module))
    _output_config(in_front, pairs, observed)


def _output_config(set_node_finder, pairs, observed) -> None:
    from executorch.backends.arm.quantizer import (  # lazy: heavy (executorch)
        get_symmetric_a16w8_quantization_config)

    if raised(pairs):
        # Upstream's global config covers the graph's output node too, so a raised module that
        # computes the model output had its int16 result requantized to int8 there (the digits
        # CNN's classifier: 98.8% of the error was that int8 output's rounding and clipping).
        # The output node, where every value it returns comes from a raised module, gets the
        # a16w8 config: the program returns int16.
        set_node_finder(observed(get_symmetric_a16w8_quantization_config(is_per_channel=True)),
                        _output_of(raised(pairs)))


def _output_of(modules):
    """A node finder (upstream's NodeFinder) for the graph's output node when every value it
    returns is computed inside one of `modules`."""
    from executorch.backends.arm.quantizer.arm_quantizer_utils import (  # lazy: heavy (executorch)
        NodeFinder)
    from torchao.quantization.pt2e.quantizer.utils import (  # lazy: heavy (torchao)
        get_module_name_filter)

    inside = [get_module_name_filter(module) for module in modules]

    class OutputOfModules(NodeFinder):
        def find_nodes(self, model):
            return (node for node in model.graph.nodes if node.op == "output" and
                    node.all_input_nodes and all(any(f(parent) for f in inside)
                                                 for parent in node.all_input_nodes))

    return OutputOfModules()


def of_dtypes(dtypes: str) -> str:
    """A plan row's precision from its dtypes ("int16,int8,int32 -> int16"): a16w8 where an
    activation is int16, a8w8 where the op computes on int8, float where it computes on float
    (a portable kernel between a dequantize and a quantize), "" for a row without dtypes."""
    if not dtypes:
        return ""
    if "int16" in dtypes:
        return A16W8
    inputs, _, output = dtypes.partition("->")
    if "float" in output and "float" in inputs:
        return FLOAT
    if "int8" in dtypes:
        return A8W8
    return FLOAT if "float" in dtypes else ""


def requantize_dtypes(dtypes: str) -> tuple[str, str] | None:
    """(from, to) when a row converts between the two integer widths (a requantize)."""
    inputs, _, output = dtypes.partition("->")
    ins = {d.strip() for d in inputs.split(",")}
    out = output.strip().split(" ")[0]
    for a, b in (("int8", "int16"), ("int16", "int8")):
        if a in ins and out == b:
            return a, b
    return None


def output_widths(reference) -> tuple[str, ...]:
    """Each model output's width in the quantized program (its exported GraphModule): the
    integer dtype its last dequantize reads (int8, int16), else float."""
    widths = []
    for node in reference.graph.nodes:
        if node.op != "output":
            continue
        for value in node.all_input_nodes:
            name = str(getattr(value.target, "__name__", value.target))
            dtype = value.args[-1] if "dequantize" in name and value.args else None
            widths.append(str(dtype).replace("torch.", "") if dtype is not None else "float")
    return tuple(widths)



def contract() -> dict[str, object]:
    """What configure_cortex_m relies on upstream for (ExecuTorch 1.5.1), each True when it
    holds."""
    import torch  # lazy: heavy (torch)
    from executorch.backends.arm.quantizer.arm_quantizer_utils import (  # lazy: heavy (executorch)
        PatternQuantizer)
    from executorch.backends.arm.quantizer.quantizer_support import (  # lazy: heavy (executorch)
        TOSA_QUANTIZER_SUPPORT_DICT)
    from executorch.backends.cortex_m.quantizer.quantizer import (  # lazy: heavy (executorch)
        CortexMQuantizer)
    from torchao.quantization.pt2e.quantizer import (  # lazy: heavy (torchao)
        ComposableQuantizer)

    quantizer = CortexMQuantizer()
    return {
        "CortexMQuantizer composes a list of quantizers, first match wins":
            isinstance(quantizer, ComposableQuantizer)
            and isinstance(quantizer.quantizers, list),
        "PatternQuantizer(quantization_config, node_finder, pattern_matcher)":
            list(inspect.signature(PatternQuantizer).parameters)[:3]
            == ["quantization_config", "node_finder", "pattern_matcher"],
        "the Arm support dict matches conv2d and linear": all(
            (op,) in TOSA_QUANTIZER_SUPPORT_DICT
            for op in (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)),
    }
