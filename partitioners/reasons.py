"""The reason catalogue: every check of ours that keeps an op off the NPU or off CMSIS-NN, or
flags a device fault, with the text a user reads.

One entry per check, as Vela's operator-support constraints are one function each: the plan
(orchestrator/planning/placement.py), the device checks and the twin's kernels (kernels/) and the
generated partitioners/REASONS.md all read it, so one rule never has two messages. The
device-fault entries are written in kernels/faults.py, beside their checks, and registered
here. Where an upstream check decided (the Ethos-U partitioner's operator-support checks, a
Cortex-M substitution that returned None), the entry says so and the upstream message is carried
verbatim as `{message}`; where that upstream check lives (file and line) goes to `Reason.debug`,
never into the text, so plan.json does not change with unrelated upstream edits.

`python -m partitioners.reasons` prints the catalogue as Markdown (REASONS.md is that output).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.faults import DEVICE_FAULTS

KINDS = ("not-npu", "not-cmsis-nn", "device-fault")


@dataclass(frozen=True)
class Check:
    key: str
    kind: str  # one of KINDS
    decided_by: str  # the component whose check decided
    template: str  # the user-facing text; {fields} are the node's values


@dataclass(frozen=True)
class Reason:
    """Why an op is not in a better place (or would fail on the device): one catalogue entry."""

    check: str  # the component that decided, e.g. "ethos-u partitioner (WhyNoPartitionReporter)"
    message: str
    value: str = ""  # the node's values the message is about (stride, kernel, dtype, ...)
    key: str = ""  # the catalogue entry
    debug: str = ""  # where upstream decided (file:line); not part of the user-facing text

    def text(self) -> str:
        return f"{self.message} [{self.value}]" if self.value else self.message


CATALOGUE: dict[str, Check] = {}


def _entry(key: str, kind: str, decided_by: str, template: str) -> None:
    assert kind in KINDS and key not in CATALOGUE
    CATALOGUE[key] = Check(key, kind, decided_by, template)


# Why not on the NPU
_entry("no-npu", "not-npu", "target", "no NPU on this target (--npu none)")
_entry("npu-operator-support", "not-npu", "ethos-u partitioner (WhyNoPartitionReporter)",
       "{message}")
_entry("policy-forced-cpu", "not-npu", "placement policy",
       "forced to the CPU by the placement policy: {rule}")
_entry("device-refused-npu", "not-npu", "device runtime (EthosUBackend)",
       "moved off the NPU: the device refused its work there ({why}); no --policy needed")
# How the why of a node Vela refused begins (orchestrator/compilation/pipeline.py).
VELA_REFUSAL = "Vela could not compile"
_entry("vela-refused-npu", "not-npu", "Vela (the Ethos-U compiler)",
       "moved off the NPU: {why}, though the Ethos-U partitioner's checks accepted it; no "
       "--policy needed")
# How the why of a node the Arm backend could not lower begins.
LOWERING_REFUSAL = "the Arm backend could not lower"
_entry("backend-refused-npu", "not-npu", "the Arm backend's TOSA lowering (EthosUBackend)",
       "moved off the NPU: {why}, though the Ethos-U partitioner's checks accepted it; no "
       "--policy needed")
_entry("boundary-quantize", "not-npu", "ethos-u partitioner",
       "boundary quantize: converts a float value (model input or CPU result) to int8 for the "
       "next int8 consumer")
_entry("boundary-dequantize", "not-npu", "ethos-u partitioner",
       "boundary dequantize: converts int8 back to float for the model output or a float CPU "
       "consumer")
_entry("boundary-quantize-int16", "not-npu", "ethos-u partitioner",
       "boundary quantize: converts a float value (model input or CPU result) to int16 for the "
       "next int16 consumer (a module given a16w8 by --precision)")
_entry("boundary-dequantize-int16", "not-npu", "ethos-u partitioner",
       "boundary dequantize: converts int16 (a module given a16w8 by --precision) back to float "
       "for the model output or a float CPU consumer")
_entry("requantize", "not-npu", "quantizer (--precision)",
       "requantize {source} -> {target}: an {source} value meets an {target} consumer (modules "
       "of two precisions, --precision); on the CPU a dequantize and a quantize compute it")
_entry("inserted-by-legalization", "not-npu", "device legalization",
       "inserted by orchestrate's device legalization (partitioners/legalize.py; see the "
       "workarounds in the summary)")
_entry("inserted-by-cortex-m-passes", "not-npu", "cortex-m passes",
       "inserted by the Cortex-M passes after NPU partitioning (not part of any partition)")
_entry("emitter-dim-order-copy", "not-npu", "ExecuTorch to_executorch (LegalizePortableDimOrderPass)",
       "inserted when the program is serialized: the portable {op} kernel wants its first input "
       "contiguous and it arrives in dim order {order}")
_entry("left-out-of-partitions", "not-npu", "ethos-u partitioner",
       "supported, but left out of every partition (a partition must be a connected, quantized "
       "region)")
# Why not on CMSIS-NN
_entry("cmsis-condition", "not-cmsis-nn", "AtenToCortexMPass", "{message}")
_entry("cmsis-substitution-not-applied", "not-cmsis-nn", "AtenToCortexMPass",
       "{op} has a CMSIS-NN substitution, but it was not applied")
_entry("cmsis-kernel-limit", "not-cmsis-nn", "device legalization",
       "{op} was routed to {kernel} by the Cortex-M passes, but that kernel refuses it on the "
       "device ({limit}); the compile runs it on the portable kernel instead")
_entry("no-s16-operator", "not-cmsis-nn", "partitioners/cpu.py (int16_activations)",
       "int16 activations (a16w8): no CMSIS-NN s16 operator in this build (ExecuTorch 1.5.1's "
       "Cortex-M backend is int8 only), so it runs in float on the portable kernel between its "
       "int16 dequantize and quantize")
_entry("no-cmsis-kernel", "not-cmsis-nn", "AtenToCortexMPass",
       "no CMSIS-NN kernel for {op}: ExecuTorch's Cortex-M backend registers no substitution "
       "for it, so the portable kernel runs")
# Faults the device runtime would hit: worded beside their checks in kernels/faults.py (kernels/
# sits below partitioners/, and the twin's kernels word their faults with the same entries).
for _fault in DEVICE_FAULTS:
    _entry(_fault.key, "device-fault", _fault.decided_by, _fault.template)


def because(key: str, value: str = "", debug: str = "", **fields) -> Reason:
    """The Reason of catalogue entry `key`, its template filled with `fields`."""
    check = CATALOGUE[key]
    return Reason(check.decided_by, check.template.format(**fields), value, key, debug)


def markdown() -> str:
    titles = {"not-npu": "Why an op is not on the NPU",
              "not-cmsis-nn": "Why a CPU op is not on CMSIS-NN",
              "device-fault": "Why the device runtime would fail"}
    lines = ["# Placement reasons", "",
             "Generated by `python -m partitioners.reasons` from partitioners/reasons.py; every "
             "reason a plan shows is one of these entries. `{message}` is the upstream check's "
             "own text, carried verbatim.", ""]
    for kind in KINDS:
        lines += [f"## {titles[kind]}", "", "| key | decided by | text |", "|---|---|---|"]
        lines += [f"| `{c.key}` | {c.decided_by} | {c.template} |"
                  for c in CATALOGUE.values() if c.kind == kind]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
