"""The NPU half of a verification: how each Ethos-U invocation is computed, and what that proves.

`--npu-model` chooses:

- `stream`: the Vela command stream, weight streams and scale records in the `.pte`'s delegate
  payload, executed by the functional model (npu_driver/ethos_u) on the invocation's memory
  regions: the bytes the device reads.
- `tosa`: the partition's TOSA graph (the one Vela was given, from the artifacts folder) in the
  TOSA reference model. What `auto` runs on the Ethos-U85; with `auto`, before a U85 partition first runs its command stream is decoded and
  bounds-checked against the regions its payload declares (npu_driver/ethos_u/u85_checker.py),
  so a stream that would write past its region fails verification naming the command and its
  word offset, and its weight and scale streams are decoded and checked against the TOSA
  graph's constants (npu_driver/ethos_u/u85_weights.py, weight_check.py), so a changed weight
  byte fails whatever the samples. An explicit `tosa` leaves the stream unread.
- `both` (what `auto`, the default, runs on the Ethos-U55 and U65): the stream computes the
  invocation and the TOSA graph checks it byte for byte; any difference fails verification,
  naming the partition and the first differing byte. The stream alone is checked only against
  the quantized reference's rounding bound, which a damaged weight byte that moves an output
  by one step passes; the TOSA graph is the bit-exact statement of what the payload must do.

On the Ethos-U85, `stream` and `both` execute the U85 command stream (u85_machine.py) for each
partition the model executes completely (decided once per partition, by a run on zeroed
inputs); a partition it refuses (a command or mode it does not execute, named with its word
offset) is computed from its TOSA graph instead, and the NPU lines say so by name.

The twin and the host runtime's EthosUBackend callback both compute through `NpuExecutor`, so
the two verifiers run the NPU the same way and say so in the same words.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from npu_driver.ethos_u import (FAST_SCRATCH_REGION, SCRATCH_REGION, NpuModelError,
                                UnmodelledCommand, WeightMismatch, WeightStreamError,
                                check_partition_weights, execute_backend_invocation,
                                run_partition)
from npu_driver.ethos_u.u85_checker import check_u85_stream
from npu_driver.ethos_u.weight_check import check_weights
from npu_driver.tosa_twin import TosaTwinError
from npu_driver.tosa_worker import shared as shared_tosa
from orchestrator.errors import NotRun, UserError, VerificationFailure

if TYPE_CHECKING:
    from npu_driver.ethos_u import Counters
    from orchestrator.verification.program import NpuPartition

NPU_MODELS = ("auto", "stream", "tosa", "both")
STREAM_METHOD = "Vela command stream executed by the Ethos-U55/U65 functional model"
U85_STREAM_METHOD = "Vela command stream executed by the Ethos-U85 functional model"
TOSA_METHOD = "TOSA reference model on the partition's TOSA graph"
# Accelerators the functional model executes (npu_driver.ethos_u.arch.ACCELERATORS).
_MODELLED_PREFIXES = ("ethos-u55-", "ethos-u65-")
_U85_PREFIX = "ethos-u85-"  # auto/both/stream: checked (u85_checker.py, weight_check.py),
# executed by u85_machine.py where it executes the partition completely, else its TOSA graph


class NpuModelFault(VerificationFailure):
    """The command stream makes the NPU fault or read out of bounds, or disagrees with the TOSA
    graph: the program as shipped is wrong (exit 4)."""


class NpuModelCannotRun(NotRun):
    """The functional model does not implement a command the stream uses: not run (exit 5)."""


def choose(npu_model: str, accelerator: str | None) -> str:
    """The NPU model to run for `accelerator` ("stream", "tosa" or "both"), from `--npu-model`;
    a UserError when the choice cannot apply (stream on an Ethos-U85)."""
    if npu_model not in NPU_MODELS:
        raise UserError(f"--npu-model {npu_model!r} is not one of {', '.join(NPU_MODELS)}")
    modelled = bool(accelerator) and accelerator.startswith(_MODELLED_PREFIXES)
    if npu_model == "auto":
        # the U85 too: the zoo's, the user families' and ExecuTorch's peer-slice partitions
        # surveyed run in its model byte for byte as their TOSA graphs (benchmarks/u85_model.py),
        # and a partition the model does not execute completely is computed from its TOSA
        # graph, named in the verdict
        return "both" if modelled or (accelerator or "").startswith(_U85_PREFIX) else "tosa"
    if npu_model in ("stream", "both") and not modelled and not (
            accelerator and accelerator.startswith(_U85_PREFIX)):
        raise UserError(f"--npu-model {npu_model}: the functional model executes the Ethos-U55, "
                        f"U65 and U85; {accelerator or 'this program'}'s partitions run as TOSA "
                        "graphs (use --npu-model tosa or auto)")
    return npu_model


@dataclass
class NpuTally:
    """What the NPU model executed over one verification: per partition, from the commands."""

    invocations: Counter = field(default_factory=Counter)  # delegate name -> invocations
    commands: Counter = field(default_factory=Counter)
    macs: Counter = field(default_factory=Counter)
    dma_bytes: Counter = field(default_factory=Counter)  # delegate name -> bytes moved by DMA
    operations: dict[str, Counter] = field(default_factory=dict)  # delegate name -> kinds
    weights: dict[str, object] = field(default_factory=dict)  # delegate name -> WeightReport
    stream_checks: dict[str, str] = field(default_factory=dict)  # delegate name -> U85 check
    # U85 partitions the model does not execute completely -> why (computed from TOSA)
    not_executed: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, counters: Counters) -> None:
        self.invocations[name] += 1
        self.commands[name] += counters.commands
        self.macs[name] += counters.macs
        self.dma_bytes[name] += sum(counters.dma_bytes.values())
        self.operations.setdefault(name, Counter()).update(counters.operations)

    def to_json(self) -> dict:
        checks = {name: {"stream_check": text, **self._weight_figures(name)}
                  for name, text in self.stream_checks.items()}
        refused = {name: {"stream_not_executed": reason, **self._weight_figures(name)}
                   for name, reason in self.not_executed.items()}
        return {**checks, **refused, **self._executed()}

    def _weight_figures(self, name: str) -> dict:
        if name not in self.weights:
            return {}
        return {"weight_check": self.weights[name].summary(),
                "weight_streams_checked": list(self.weights[name].checked),
                "weight_streams_not_checked": list(self.weights[name].unchecked)}

    def _executed(self) -> dict:
        return {name: {"invocations": self.invocations[name],
                       "commands_per_invocation": self.commands[name] // self.invocations[name],
                       "macs_per_invocation": self.macs[name] // self.invocations[name],
                       "dma_bytes_per_invocation":
                           self.dma_bytes[name] // self.invocations[name],
                       "operations": dict(self.operations[name]),
                       **self._weight_figures(name),
                       **({"stream_check": self.stream_checks[name]}
                          if name in self.stream_checks else {})}
                for name in sorted(self.invocations)}


def with_plan_macs(execution: dict, manifest) -> dict:
    """`execution` with each partition's MACs as compile's plan counted them (plan.json, from
    the graph Vela was given), so the executed figure is checked against it."""
    try:
        plan = json.loads(manifest.read("plan.json"))
        index_of = {p.delegate: p.index for p in manifest.partitions}
        planned = {}
        for op in plan["ops"]:
            if op.get("placement") == "npu" and op.get("kind") == "op":
                planned[op["partition"]] = planned.get(op["partition"], 0) + int(op["macs"])
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return execution  # no plan to compare with: the figures stand alone
    return {name: {**figures, "plan_macs": planned.get(index_of.get(name))}
            for name, figures in execution.items()}


def npu_lines(execution: dict) -> list[str]:
    """`NpuTally.to_json()` as lines: per partition, what one invocation executed, and its MACs
    against the plan's (a difference is a finding: the stream does other work than the graph)."""
    lines = []
    for name, figures in execution.items():
        if "stream_check" in figures:
            lines.append(f"{name} command stream: {figures['stream_check']}")
        if "stream_not_executed" in figures:
            lines.append(f"{name}: command stream not executed ({figures['stream_not_executed']}"
                         "); computed from its TOSA graph by the TOSA reference model")
        if "invocations" not in figures:
            lines.extend(_weight_lines(name, figures))
            continue
        ops = ", ".join(f"{kind} {count // figures['invocations']}"
                        for kind, count in sorted(figures["operations"].items()))
        planned = figures.get("plan_macs")
        macs = figures["macs_per_invocation"]
        check = ("" if planned is None else
                 "; = the plan's MACs" if planned == macs else
                 f"; FINDING: the plan counts {planned:,} MACs for this partition")
        lines.append(f"{name}: {figures['commands_per_invocation']} commands, {macs:,} MACs"
                     f"{check}, {figures['dma_bytes_per_invocation']:,} B by DMA ({ops})")
        lines.extend(_weight_lines(name, figures))
    return lines


def _weight_lines(name: str, figures: dict) -> list[str]:
    if "weight_check" not in figures:
        return []
    return ([f"{name} weights, whatever the inputs: {figures['weight_check']}"]
            + [f"  not checked: {line}" for line in figures["weight_streams_not_checked"]])


class NpuExecutor:
    """Computes one Ethos-U invocation as `--npu-model` chose, for the twin and the runtime."""

    def __init__(self, npu_model: str, accelerator: str | None):
        self.accelerator = accelerator
        self.choice = choose(npu_model, accelerator)
        self.tally = NpuTally()
        self._probed: set[str] = set()  # U85 partitions _executes has run once on zeros
        # `auto` on a U85 checks the stream and its weights before the partition first runs;
        # an explicit `tosa` (the expectation a BundleIO carries, say) leaves the bytes unread
        self.checks_u85 = npu_model == "auto" and bool(accelerator) and accelerator.startswith(
            _U85_PREFIX)

    @property
    def u85_stream(self) -> bool:
        """The Ethos-U85 model executes this program's partitions (stream or both)."""
        return self.choice != "tosa" and bool(self.accelerator) and self.accelerator.startswith(
            _U85_PREFIX)

    @property
    def method(self) -> str:
        if self.u85_stream:
            compared = (f", compared byte for byte with the {TOSA_METHOD}"
                        if self.choice == "both" else "")
            checked = ("; its command stream is decoded and bounds-checked, and its weights "
                       "checked against the TOSA graph, before the first run"
                       if self.checks_u85 else "")
            return (f"NPU: {U85_STREAM_METHOD} ({self.accelerator}){compared}{checked}; a "
                    f"partition the model does not execute completely runs in the "
                    f"{TOSA_METHOD}, named below")
        if self.choice == "stream":
            return f"NPU: {STREAM_METHOD} ({self.accelerator})"
        if self.choice == "both":
            return (f"NPU: {STREAM_METHOD} ({self.accelerator}), compared byte for byte with "
                    f"the {TOSA_METHOD}")
        reason = "" if self.accelerator is None or self.accelerator.startswith(
            _MODELLED_PREFIXES) else (
            "; --npu-model stream or both executes it in the Ethos-U85 model"
            if self.accelerator.startswith(_U85_PREFIX)
            else f"; the {self.accelerator} is not modelled")
        return f"NPU: {TOSA_METHOD} (the command stream is not executed{reason})"

    def check_u85(self, partition: NpuPartition, where: str) -> None:
        """Once per U85 partition, before it first runs: decode its command stream with the
        U85 table, bound every access against the regions its payload declares (weights,
        scratch; the fast scratch sized by use), then decode every weight and scale stream and
        check it against the TOSA graph's constants (weight_check.py), so a changed weight byte
        fails whatever the samples exercise. A refusal fails verification naming the command
        and its word offset; what the checker cannot bound is reported, not hidden."""
        name = partition.delegate_name
        if not self.checks_u85 or name in self.tally.stream_checks:
            return
        payload = partition.payload
        try:
            check = check_u85_stream(payload.cmd_bytes, [len(payload.weight_bytes),
                                                         payload.scratch_bytes, None],
                                     self.accelerator, (FAST_SCRATCH_REGION,), lut_loads=True)
        except UnmodelledCommand as error:
            self.tally.stream_checks[name] = f"not bounds-checked: {error}"
            return
        except NpuModelError as error:
            raise NpuModelFault(f"{where}: the U85 stream checker refuses the command stream: "
                                f"{error}") from None
        extent = check.extent()
        self.tally.stream_checks[name] = (
            f"{check.commands} commands decoded (Ethos-U85 table), {len(check.accesses)} "
            f"accesses bounded: weights {extent.get(0, 0):,} of {len(payload.weight_bytes):,} "
            f"B, scratch {extent.get(SCRATCH_REGION, 0):,} of {payload.scratch_bytes:,} B")
        try:
            self.tally.weights[name] = check_weights(payload.weight_bytes, check,
                                                     partition.tosa_bytes)
        except UnmodelledCommand as error:
            self.tally.stream_checks[name] += f"; weights not checked: {error}"
        except (WeightMismatch, WeightStreamError) as error:
            raise NpuModelFault(f"{where}: the weight data fails its check against the TOSA "
                                f"graph Vela compiled: {error}") from None

    def run(self, partition: NpuPartition, arrays: Sequence[np.ndarray],
            where: str) -> list[np.ndarray]:
        """The partition's outputs (TOSA-shaped arrays) for `arrays`; `where` names the
        instruction in errors."""
        self.check_u85(partition, where)
        streamed = (self._stream(partition, arrays, where)
                    if self.choice != "tosa" and self._executes(partition, where) else None)
        if self.choice == "stream" and streamed is not None:
            return streamed
        graph = self._tosa(partition, arrays, where)
        if streamed is not None:
            self._compare(streamed, graph, where)
        return graph

    @staticmethod
    def _tosa(partition: NpuPartition, arrays, where: str) -> list[np.ndarray]:
        try:  # in a child process: a graph that crashes the reference model is an error here
            return shared_tosa().run(partition.tosa_bytes, partition.io, list(arrays))
        except TosaTwinError as error:
            raise UserError(f"{where}: {error}") from None

    @staticmethod
    def _compare(streamed, graph, where: str) -> None:
        for slot, (ours, theirs) in enumerate(zip(streamed, graph)):
            a = np.ascontiguousarray(ours).view(np.uint8).ravel()
            b = np.ascontiguousarray(theirs).view(np.uint8).ravel()
            if a.shape != b.shape or not np.array_equal(a, b):
                differing = np.flatnonzero(a != b) if a.shape == b.shape else [0]
                first = int(differing[0])
                raise NpuModelFault(
                    f"{where}: output {slot} of the command stream differs from the TOSA "
                    f"graph's in {len(differing)} of {b.size} bytes (first at byte {first}: "
                    f"{int(a[first]) if first < a.size else '-'} vs {int(b[first])}); the "
                    "payload Vela packed does not compute the graph it was given")

    def run_invocation(self, partition: NpuPartition, command_stream: bytes, regions: list,
                       where: str) -> None:
        """One EthosUBackend invocation on the memory the backend set up (`regions`: its base
        addresses, mutated in place): the inputs are already in the scratch at Vela's offsets
        and the outputs are left there, as the NPU leaves them."""
        self.check_u85(partition, where)
        payload = partition.payload
        scratch = regions[SCRATCH_REGION]
        arrays = [np.frombuffer(bytes(scratch[v.offset:v.offset + v.nbytes]),
                                dtype=spec.numpy_type).reshape(spec.shape).copy()
                  for v, spec in zip(payload.inputs, partition.io.inputs)]
        if self.choice == "tosa" or not self._executes(partition, where):
            results = self._tosa(partition, arrays, where)
            for vela, array in zip(payload.outputs, results):
                scratch[vela.offset:vela.offset + vela.nbytes] = np.ascontiguousarray(
                    array).tobytes()
            return
        self._guarded(partition, where, lambda: execute_backend_invocation(
            command_stream, regions, self.accelerator))
        if self.choice == "both":
            streamed = [np.frombuffer(bytes(scratch[v.offset:v.offset + v.nbytes]),
                                      dtype=spec.numpy_type).reshape(spec.shape)
                        for v, spec in zip(payload.outputs, partition.io.outputs)]
            self._compare(streamed, self._tosa(partition, arrays, where), where)

    def _executes(self, partition: NpuPartition, where: str) -> bool:
        """Whether the command stream computes this partition: always on the U55/U65 (what the
        model does not implement is a NotRun there); on the U85 only where the U85 model
        executes the whole stream, found once per partition by a run on zeroed inputs (a
        refusal names the command and its word offset, and the partition is computed from
        its TOSA graph)."""
        if not self.u85_stream:
            return True
        name = partition.delegate_name
        if name in self._probed:
            return name not in self.tally.not_executed
        self._probed.add(name)
        self._check_weights(partition, where)
        payload = partition.payload
        try:
            run_partition(payload, [bytes(v.nbytes) for v in payload.inputs], self.accelerator)
        except UnmodelledCommand as error:
            self.tally.not_executed[name] = str(error)
            return False
        except (NpuModelError, ValueError):
            pass  # the run on the real inputs reports it, naming the instruction
        return True

    def _check_weights(self, partition: NpuPartition, where: str) -> None:
        """Once per partition, before its stream first runs: every weight and scale stream
        against the TOSA graph's constants, so a changed weight byte fails whatever the
        samples exercise."""
        if partition.delegate_name in self.tally.weights or (
                self.u85_stream and partition.delegate_name in self.tally.stream_checks):
            return
        try:
            report = check_partition_weights(partition.payload, partition.tosa_bytes,
                                             self.accelerator)
        except UnmodelledCommand as error:
            if self.u85_stream:
                # the U85 weight check's walk refuses what the model may still execute (a
                # LUT load): said next to the partition, the stream runs all the same
                self.tally.stream_checks[partition.delegate_name] = (
                    f"weights not checked against the TOSA graph: {error}")
                return
            raise NpuModelCannotRun(f"not run: {where}: the Ethos-U functional model does not "
                                    f"implement {error} (--npu-model tosa runs the TOSA graph "
                                    "instead)") from None
        except (WeightMismatch, WeightStreamError) as error:
            raise NpuModelFault(f"{where}: the weight data fails its check against the TOSA "
                                f"graph Vela compiled: {error}") from None
        except NpuModelError as error:
            raise NpuModelFault(f"{where}: the command stream fails on the NPU: {error}") \
                from None
        self.tally.weights[partition.delegate_name] = report

    def _guarded(self, partition: NpuPartition, where: str, run) -> None:
        self._check_weights(partition, where)
        try:
            counters = run()
        except UnmodelledCommand as error:
            raise NpuModelCannotRun(f"not run: {where}: the Ethos-U functional model does not "
                                    f"implement {error} (--npu-model tosa runs the TOSA graph "
                                    "instead)") from None
        except (NpuModelError, ValueError) as error:
            raise NpuModelFault(f"{where}: the command stream fails on the NPU: {error}") \
                from None
        self.tally.add(partition.delegate_name, counters if not isinstance(counters, tuple)
                       else counters[1])
        return counters

    def _stream(self, partition: NpuPartition, arrays, where: str) -> list[np.ndarray]:
        outputs, _ = self._guarded(partition, where, lambda: run_partition(
            partition.payload, list(arrays), self.accelerator))
        return [np.frombuffer(data, dtype=spec.numpy_type).reshape(spec.shape).copy()
                for data, spec in zip(outputs, partition.io.outputs)]
