"""The model's structure in the plan: rows grouped by source module, unrolled recurrences flagged.

torch.export unrolls a recurrent layer (GRU, LSTM, RNN) over its sequence: a keyword spotter's
GRU over 49 frames becomes hundreds of plan rows, and inside an NPU partition Vela encodes each
step's copy of the weights. A user reading the plan needs the cause in one line, so:

- every row carries the innermost `nn_module_stack` entry of its node (the module that wrote
  it: `gru`, `features.3.conv`), and `module_groups` sums rows, MACs, estimated time and
  placements per module;
- `recurrences` finds each recurrent layer in the captured (float) program, where it is still
  one `aten.gru`/`aten.lstm`/`aten.rnn_*` node, and reports its steps, the ops its unrolled form
  became, its parameters, and what the `.pte` stores for them: CPU constants are stored once
  (ExecuTorch's emitter stores identical constant bytes once), an NPU partition's
  encoded weights are measured from Vela's output and compared with the parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from partitioners.npu import npu_delegates, partition_span
from partitioners.records import module_of

_RECURRENT = {"gru": "GRU", "lstm": "LSTM", "rnn_tanh": "RNN (tanh)", "rnn_relu": "RNN (relu)"}



@dataclass(frozen=True)
class ModuleGroup:
    path: str  # "" is the model's own forward (quantize/dequantize, glue)
    type: str
    rows: int
    first_row: int
    last_row: int
    macs: int
    seconds: float
    placements: dict  # placement -> rows


@dataclass(frozen=True)
class Recurrence:
    path: str
    type: str  # GRU, LSTM, RNN (tanh)
    steps: int
    layers: int
    bidirectional: bool
    rows: int  # plan rows the unrolled form became
    first_row: int
    last_row: int
    parameters: int  # elements
    parameter_bytes: int  # as the float model holds them
    stored: str  # what the .pte holds for the weights, with its source

    def line(self) -> str:
        span = f"rows {self.first_row}-{self.last_row}" if self.rows else "no rows"
        return (f"{self.path} ({self.type}) unrolled over {self.steps} step(s)"
                f"{f' x {self.layers} layers' if self.layers > 1 else ''}"
                f"{', bidirectional' if self.bidirectional else ''}: {self.rows} ops ({span}); "
                f"{self.parameters:,} parameters; {self.stored}")


def module_groups(rows) -> tuple[ModuleGroup, ...]:
    """Rows grouped by their module, in order of first appearance."""
    groups: dict[str, dict] = {}
    for index, row in enumerate(rows):
        g = groups.setdefault(row.module, {"type": row.module_type, "rows": 0, "first": index,
                                           "last": index, "macs": 0, "seconds": 0.0,
                                           "placements": {}})
        g["rows"] += 1
        g["last"] = index
        g["macs"] += row.macs
        g["seconds"] += row.cost.seconds if row.cost is not None else 0.0
        g["placements"][row.placement] = g["placements"].get(row.placement, 0) + 1
    return tuple(ModuleGroup(path, g["type"], g["rows"], g["first"], g["last"], g["macs"],
                             g["seconds"], dict(g["placements"])) for path, g in groups.items())


def _in_module(row_module: str, path: str) -> bool:
    return row_module == path or row_module.startswith(path + ".")


def recurrences(compiled, rows, estimates) -> tuple[Recurrence, ...]:
    """Every recurrent layer of the captured program, with what its unrolled form costs."""
    found = []
    for node in compiled.captured.program.graph.nodes:
        if node.op != "call_function":
            continue
        name = str(getattr(node.target, "__name__", node.target)).split(".")[0]
        if name not in _RECURRENT:
            continue
        path, _ = module_of(node)
        x = node.args[0].meta.get("val")
        params = [p for p in node.args[2] if isinstance(p, torch.fx.Node)]
        layers, bidirectional, batch_first = int(node.args[4]), bool(node.args[7]), bool(node.args[8])
        steps = int(x.shape[1 if batch_first and x.dim() == 3 else 0]) if x is not None else 0
        tensors = [p.meta["val"] for p in params if isinstance(p.meta.get("val"), torch.Tensor)]
        count = sum(t.numel() for t in tensors)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        indices = [i for i, r in enumerate(rows) if _in_module(r.module, path)]
        found.append(Recurrence(
            path, _RECURRENT[name], steps, layers, bidirectional, len(indices),
            indices[0] if indices else 0, indices[-1] if indices else 0, count, nbytes,
            _stored(compiled, [rows[i] for i in indices], estimates, count, steps)))
    return tuple(found)


def _stored(compiled, rows, estimates, parameters: int, steps: int) -> str:
    partitions = sorted({r.partition for r in rows if r.placement == "npu"})
    parts = []
    if any(r.placement != "npu" for r in rows):
        parts.append("its CPU weights are stored once in the .pte (ExecuTorch's emitter keeps "
                     "one copy of identical constant bytes)")
    # Partitions that carry one payload (the steps of a recurrence cut into one partition per
    # step, partitioners/repeated_steps.py) are one stream in the .pte: said once.
    payload = {p.index: p.payload_sha256 for p in npu_delegates(
        compiled.final_program, compiled.lowered.vela_runs)} if partitions else {}
    equal: dict[str, list[int]] = {}
    for index in partitions:
        equal.setdefault(payload.get(index, str(index)), []).append(index)
    for indices in equal.values():
        estimate = estimates.get(indices[0])
        if estimate is None:
            continue
        ratio = estimate.weight_bytes / parameters if parameters else 0.0
        who = (f"NPU partition p{indices[0]} carries" if len(indices) == 1 else
               f"NPU partitions {partition_span(indices)} ({len(indices)} equal partitions: one command "
               "stream and weights stored once in the .pte) each carry")
        text = (f"{who} {estimate.weight_bytes:,} B of encoded weights (vela), {ratio:.1f}x "
                f"its {parameters:,} int8 parameters")
        # A partition of one step (the recurrence cut per step) carries one copy, whatever
        # Vela's encoding adds; only one holding several steps carries a copy per step.
        held = sum(r.partition == indices[0] for r in rows) * steps / max(len(rows), 1)
        if ratio >= 1.5 and held > 1.5:
            text += (": Vela encodes each op's weights, so every unrolled step carries its own "
                     "copy; a shorter sequence or running the layer on the CPU stores them once")
        parts.append(text)
    return "; ".join(parts) or "no weights"
