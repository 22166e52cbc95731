"""Dead constants: tensors the final program stores but no instruction reads.

ExecuTorch 1.5.1 serializes every lifted constant of the edge program. Quantization folding
and the Cortex-M layout passes leave behind the ones they replaced (float weight scales and
zero points, weights in their original layout): placeholders of kind BUFFER or CONSTANT_TENSOR
with no user. Upstream's `remove_unused_parameters_pass` (run by `to_edge`) removes unused
PARAMETERs only, so these reach the `.pte` and its value table. Measured on DS-CNN, CPU-only
Cortex-M55: 46 such buffers, 32,816 B declared (tests/test_size.py shows what upstream leaves).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch.export.exported_program import ExportGraphSignature, InputKind

_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


@dataclass(frozen=True)
class PrunedConstant:
    name: str
    kind: str  # PARAMETER | BUFFER | CONSTANT_TENSOR
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


def unused_constants(program) -> list:
    """The input specs of constants whose placeholder has no user (and is not mutated)."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    mutated = set(program.graph_signature.buffers_to_mutate.values())
    return [spec for spec in program.graph_signature.input_specs
            if spec.kind in _CONSTANT_KINDS and spec.target not in mutated
            and spec.arg.name in placeholders and not placeholders[spec.arg.name].users]


def prune_unused_constants(program) -> tuple[object, tuple[PrunedConstant, ...]]:
    """A copy of `program` without its unused constants, and what was removed."""
    dead = {spec.arg.name for spec in unused_constants(program)}
    if not dead:
        return program, ()
    pruned = copy.deepcopy(program)
    placeholders = {n.name: n for n in pruned.graph.nodes if n.op == "placeholder"}
    removed, kept = [], []
    for spec in pruned.graph_signature.input_specs:
        if spec.arg.name not in dead:
            kept.append(spec)
            continue
        store = pruned._state_dict if spec.target in pruned.state_dict else pruned._constants
        tensor = store.pop(spec.target, None)
        # A tensor may back several specs (deduplicated constants): keep it while one remains.
        if tensor is not None and any(s.target == spec.target and s.arg.name not in dead
                                      for s in pruned.graph_signature.input_specs):
            store[spec.target] = tensor
        pruned.graph.erase_node(placeholders[spec.arg.name])
        if isinstance(tensor, torch.Tensor):
            removed.append(PrunedConstant(spec.target, spec.kind.name, tuple(tensor.shape),
                                          str(tensor.dtype).replace("torch.", ""),
                                          tensor.numel() * tensor.element_size()))
        else:
            removed.append(PrunedConstant(spec.target, spec.kind.name, (), "", 0))
    pruned._graph_signature = ExportGraphSignature(kept, list(pruned.graph_signature.output_specs))
    pruned.graph_module.recompile()
    return pruned, tuple(removed)
