"""Placement policies: a vendor's or a product team's rules, applied as partitioner checks.

A policy file is YAML; every key is checked and an unknown one is refused by name:

    placement: greedy          # or cost: move NPU islands to the CPU when the model says faster
    force_cpu:                 # never on the NPU (the op still gets the CPU's best kernel)
      ops: [aten.where.self]   # op types, as the edge graph's original aten op
      nodes: [aten_convolution_default_1]   # node names, as the plan shows them
      modules: [downsample]    # module paths (nn_module_stack) or class names
    keep_npu:                  # with placement: cost, never moved off the NPU
      nodes: [aten_linear_default]
    npu: ethos-u55-128         # NPU configuration (else the platform default / --npu)
    vela: {system_config: Ethos_U55_High_End_Embedded, memory_mode: Shared_Sram}
    clocks: {cpu_hz: 400000000, npu_hz: 500000000}
    precision: {features.2: a16w8}   # modules with int16 activations (NPU targets; --precision)
    recurrences: per-step      # or whole: an unrolled GRU/LSTM in one NPU partition

Forcing goes through the Ethos-U partitioner's own mechanism (an extra operator-support check
handed to `EthosUPartitioner(additional_checks=...)`), so the `.pte` really changes; each node
the policy rejects is recorded with the rule, and the plan names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch.fx.passes.operator_support import OperatorSupportBase

from kernels.safe_files import DataFileError, load_yaml

PLACEMENTS = ("greedy", "cost")
_TOP_KEYS = {"placement", "force_cpu", "keep_npu", "npu", "vela", "clocks", "precision",
             "recurrences"}
# How an unrolled recurrence goes to the NPU (partitioners/repeated_steps.py): one partition per
# step, each distinct one compiled once (the default: compiles in a fraction of the time), or the
# recurrence whole in one partition (one NPU invocation; every step lowered and compiled).
RECURRENCES = ("per-step", "whole")
_SELECTOR_KEYS = {"ops", "nodes", "modules"}
_VELA_KEYS = {"system_config", "memory_mode"}
_CLOCK_KEYS = {"cpu_hz", "npu_hz"}


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Selector:
    """Which nodes a rule applies to."""

    ops: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()

    def match(self, node: torch.fx.Node) -> str | None:
        """The rule that matches `node` (e.g. "force_cpu.ops: aten.where.self"), or None."""
        names = {str(node.target), str(node.meta.get("original_aten", ""))}
        for op in self.ops:
            if any(name == op or name.startswith(op + ".") or name.endswith("." + op)
                   or name.split(".")[-2:-1] == [op] for name in names if name):
                return f"ops: {op}"
        if node.name in self.nodes:
            return f"nodes: {node.name}"
        stack = node.meta.get("nn_module_stack") or {}
        for module in self.modules:
            for path, kind in stack.values():
                class_name = getattr(kind, "__name__", str(kind)).rsplit(".", 1)[-1]
                if path == module or path.endswith("." + module) or class_name == module:
                    return f"modules: {module}"
        return None

    def __bool__(self) -> bool:
        return bool(self.ops or self.nodes or self.modules)


@dataclass(frozen=True)
class Policy:
    source: str = "default"
    placement: str = "greedy"
    force_cpu: Selector = field(default_factory=Selector)
    keep_npu: Selector = field(default_factory=Selector)
    npu: str | None = None
    system_config: str | None = None
    memory_mode: str | None = None
    cpu_hz: float | None = None
    npu_hz: float | None = None
    cost_moved: tuple[str, ...] = ()  # nodes --placement cost moved to the CPU
    # (node, why): nodes whose NPU work the device refused (its runtime or the functional model)
    device_moved: tuple[tuple[str, str], ...] = ()
    # --placement cost: average pools whose one window leaves rows unread computed over that
    # window, so the Ethos-U55 check takes them (partitioners/legalize.py,
    # avg_pools_over_their_window)
    pool_windows: bool = False
    # (module, precision) pairs of the `precision:` map, checked where the request is resolved
    # (orchestrator/compilation/precision.py); --precision entries win per module
    precision: tuple[tuple[str, str], ...] = ()
    recurrences: str = "per-step"  # RECURRENCES
    # (module path, why): modules kept on the CPU by what the model file needs (a softmax whose
    # quantization a TFLite file fixes: orchestrator/compilation/file_quantization.py)
    kept_on_cpu: tuple[tuple[str, str], ...] = ()

    def with_forced_nodes(self, nodes: tuple[str, ...]) -> "Policy":
        """This policy plus `nodes` moved to the CPU by cost placement."""
        return replace(self, cost_moved=tuple(dict.fromkeys(self.cost_moved + tuple(nodes))))

    def with_device_moved(self, nodes: tuple[str, ...], why: str) -> "Policy":
        """This policy plus `nodes` moved to the CPU because the device refused them on the
        NPU."""
        return replace(self, device_moved=self.device_moved + tuple((n, why) for n in nodes))

    def forces_cpu(self) -> bool:
        return bool(self.force_cpu) or bool(self.cost_moved) or bool(self.device_moved) or \
            bool(self.kept_on_cpu)


def _strings(value, where: str, source: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise PolicyError(f"{source}: {where} must be a list of names")
    return tuple(value)


def _selector(raw, where: str, source: str) -> Selector:
    raw = _section(raw, where, _SELECTOR_KEYS, source)
    return Selector(*(_strings(raw.get(k, []), f"{where}.{k}", source)
                      for k in ("ops", "nodes", "modules")))


def _section(raw, name: str, keys: set[str], source: str) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise PolicyError(f"{source}: {name} must be a mapping with keys "
                          f"{', '.join(sorted(keys))}")
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise PolicyError(f"{source}: unknown key '{name}.{unknown[0]}'; use "
                          f"{', '.join(sorted(keys))}")
    return raw


def _clock(value, where: str, source: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise PolicyError(f"{source}: {where} must be a positive number of Hz, got {value!r}")
    return float(value)


def parse_policy(raw, source: str = "policy") -> Policy:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise PolicyError(f"{source}: a policy is a mapping of {', '.join(sorted(_TOP_KEYS))}")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise PolicyError(f"{source}: unknown key '{unknown[0]}'; a policy may have "
                          f"{', '.join(sorted(_TOP_KEYS))}")
    placement = raw.get("placement", "greedy")
    if placement not in PLACEMENTS:
        raise PolicyError(f"{source}: placement must be one of {', '.join(PLACEMENTS)}, got "
                          f"{placement!r}")
    vela = _section(raw.get("vela"), "vela", _VELA_KEYS, source)
    clocks = _section(raw.get("clocks"), "clocks", _CLOCK_KEYS, source)
    npu = raw.get("npu")
    if npu is not None and not isinstance(npu, str):
        raise PolicyError(f"{source}: npu must be a name such as ethos-u55-128 or none")
    precision = raw.get("precision") or {}
    if not isinstance(precision, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in precision.items()):
        raise PolicyError(f"{source}: precision must map module names to a precision, e.g. "
                          "precision: {features.2: a16w8}")
    recurrences = raw.get("recurrences", "per-step")
    if recurrences not in RECURRENCES:
        raise PolicyError(f"{source}: recurrences must be one of {', '.join(RECURRENCES)}, got "
                          f"{recurrences!r}")
    return Policy(source, placement, _selector(raw.get("force_cpu"), "force_cpu", source),
                  _selector(raw.get("keep_npu"), "keep_npu", source), npu,
                  vela.get("system_config"), vela.get("memory_mode"),
                  _clock(clocks.get("cpu_hz"), "clocks.cpu_hz", source),
                  _clock(clocks.get("npu_hz"), "clocks.npu_hz", source),
                  precision=tuple(precision.items()), recurrences=recurrences)


def load_policy(path) -> Policy:
    """Read a policy YAML (safe loader: no tags, no code)."""
    path = Path(path)
    if not path.exists():
        raise PolicyError(f"policy file not found: {path}; check the --policy path")
    if not path.is_file():
        raise PolicyError(f"policy {path} is not a regular file (a directory or a device); "
                          "give a policy YAML")

    try:
        raw = load_yaml(path)
    except DataFileError as error:
        raise PolicyError(f"policy {error}") from None
    return parse_policy(raw, str(path))


def unmatched_force_cpu(policy: Policy, rules_used) -> tuple[str, ...]:
    """The policy's force_cpu entries that matched no node of the program (a misspelt node
    name, an op type the edge graph does not have because upstream decomposed it), as notes."""
    used = set(rules_used)
    notes = []
    for key in ("ops", "nodes", "modules"):
        for entry in getattr(policy.force_cpu, key):
            if f"force_cpu.{key}: {entry} in {policy.source}" not in used:
                notes.append(
                    f"policy {policy.source}: force_cpu.{key}: {entry} matched no node, so it "
                    "changed nothing (ops are the edge graph's original aten ops after "
                    "upstream's decompositions, e.g. a softmax is amax, sub, exp, sum, "
                    "reciprocal and mul on the NPU path; nodes and modules are named as in "
                    "the plan's node and module columns)")
    return tuple(notes)


class ForceCpuCheck(OperatorSupportBase):
    """An Ethos-U operator-support check: nodes the policy forces to the CPU are unsupported.

    Records, per node name, the rule that matched (the partitioner's reporter is not reachable
    from an additional check, so the plan reads this record)."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.forced: dict[str, str] = {}
        self.device_refused: dict[str, str] = {}  # node -> why the device refused it there

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return True
        rule = self.policy.force_cpu.match(node)
        if rule is not None:
            self.forced[node.name] = f"force_cpu.{rule} in {self.policy.source}"
            return False
        why = dict(self.policy.device_moved).get(node.name)
        if why is not None:
            self.device_refused[node.name] = why
            return False
        if self.policy.kept_on_cpu:
            paths = {str(path) for path, _ in (node.meta.get("nn_module_stack") or {}).values()}
            for module, why in self.policy.kept_on_cpu:
                if module in paths:
                    self.forced[node.name] = why
                    return False
        if node.name in self.policy.cost_moved:
            self.forced[node.name] = ("--placement cost: the cost model estimates this NPU island "
                                      "slower than the CPU")
            return False
        return True
