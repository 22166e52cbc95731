"""The device code decides: `compile` runs the serialized program once in the real ExecuTorch
runtime before it ships it.

The runtime is the wheel's `libexecutorch.so` with the portable kernels, the Cortex-M kernels
over CMSIS-NN and ExecuTorch's EthosUBackend built for the host from the upstream sources
(kernels/runtime.py); it runs in a child process, so a kernel that aborts ends the child, not
the compile. Every kernel checks its arguments there as it does on the device (dim orders,
dtypes, ranks, sizes), so a program the device would refuse is refused here, by the kernel's
own check, not by a re-statement of it.

A refusal on a dim-order check (`tensors_have_same_dim_order`, `all_contiguous ||
all_channels_last`, `tensor_is_default_dim_order`, ...) is legalized: the refused node gets its
operands contiguous and its output copied back (partitioners/legalize.py,
`contiguous_operands`), the program is serialized again and run again. Any other refusal stops
the compile with one line naming the operator, the instruction and the kernel's check.

On the Ethos-U55, U65 and U85 each NPU invocation runs Vela's command stream in the functional
model (npu_driver/ethos_u) on the regions the backend set up, and its outputs are compared byte
for byte with the TOSA reference model on the partition's TOSA graph, as `verify` does by
default: a stream that would fault the NPU (an access outside its scratch, a weight stream that
does not decode) or that computes other bytes than the graph Vela was given is refused, naming
the partition, and the planner moves that partition's ops to the CPU (planning/run.py), so a
compile never writes a program its own NPU check rejects. For the CPU kernels the run checks
that each accepts what it is given, not the numbers (that is `verify`'s job). The input is
calibration sample 0.

When the sources or a host compiler are missing the check is "not run", with the reason, and
the plan says so (the static rules of kernels/layout_checks.py and kernels/reference.py remain).
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import os
import re
from dataclasses import dataclass

import torch

from kernels.runtime import (METHOD as RUNTIME_METHOD, HostRuntime, KernelRefusal,
                             RuntimeFailure, RuntimeUnavailable, missing_operators)
from kernels.device_ops import device_operator_names
from kernels.host_scratch import scratch_shortfalls
from kernels.program_view import ProgramView
from npu_driver.ethos_u import NpuModelError, UnmodelledCommand, execute_backend_invocation
from npu_driver.payload import PayloadError, parse_payload
from npu_driver.tosa_twin import TosaTwinError, graph_io
from orchestrator.errors import NotRun, UserError
from orchestrator.verification.npu import NpuExecutor, NpuModelFault
from orchestrator.verification.program import NpuPartition
from partitioners.legalize import contiguous_operands, runtime_node, size1_copy_orders
from partitioners.records import ORIGIN_KEY, Workaround

ENV_DEVICE_CHECK = "ORCHESTRATE_DEVICE_CHECK"  # "0": skip the run (the plan says "not run")
MAX_LEGALIZATIONS = 8
METHOD = ("one run in the ExecuTorch runtime with the portable and Cortex-M kernels and "
          "EthosUBackend built for the host (calibration sample 0; NPU partitions not computed)")
STREAM_METHOD = ("one run in the ExecuTorch runtime with the portable and Cortex-M kernels and "
                 "EthosUBackend built for the host, each NPU invocation executed by the Ethos-U "
                 "functional model on Vela's command stream (calibration sample 0)")
COMPARED_METHOD = (STREAM_METHOD[:-1] + ", its outputs compared byte for byte with the TOSA "
                   "reference model on the partition's TOSA graph)")
_MODELLED = ("ethos-u55-", "ethos-u65-", "ethos-u85-")
_U85 = "ethos-u85-"


class _NpuRun:
    """The NPU of the device check: each invocation's command stream executed by the functional
    model on the regions the backend set up and, where the partition's TOSA graph is known,
    compared byte for byte with the TOSA reference model on the same inputs, as `verify`'s
    default NPU model does (orchestrator/verification/npu.py; on the U85 its stream and weight
    checks first, and a partition the U85 model does not execute completely is computed from its
    graph); the first fault or difference is remembered with the partition it happened in."""

    def __init__(self, accelerator: str | None, view: ProgramView,
                 tosa_graphs: dict[str, bytes] | None = None):
        self.modelled = bool(accelerator) and accelerator.startswith(_MODELLED)
        self.accelerator = accelerator
        self.fault: str | None = None
        self.fault_delegate: int | None = None  # the delegate (in graph order) that faulted
        self.fault_error = ""
        self.names = {}
        self.partitions: dict[bytes, NpuPartition] = {}
        self.executor = NpuExecutor("auto", accelerator) if self.modelled else None
        for delegate in view.delegates:
            try:
                payload = parse_payload(delegate.payload)
            except PayloadError:
                continue
            self.names[payload.cmd_bytes] = delegate.index
            tosa = (tosa_graphs or {}).get(hashlib.sha256(delegate.payload).hexdigest())
            if tosa is not None:
                try:
                    io = graph_io(tosa)
                except TosaTwinError:
                    continue
                self.partitions[payload.cmd_bytes] = NpuPartition(
                    delegate.index, f"partition {delegate.index}", "", payload, tosa, io)

    @property
    def compared(self) -> bool:
        return bool(self.partitions)

    def __call__(self, invocation) -> None:
        if not self.modelled:
            return  # the scratch is left as the runtime handed it over
        stream = bytes(invocation.command_stream)
        index = self.names.get(stream)
        where = f"Ethos-U partition {index}" if index is not None else "an Ethos-U partition"
        partition = self.partitions.get(stream)
        try:
            if partition is not None:
                self.executor.run_invocation(partition, stream, list(invocation.regions), where)
            elif not self.accelerator.startswith(_U85):
                execute_backend_invocation(invocation.command_stream, list(invocation.regions),
                                           self.accelerator)
        except (UnmodelledCommand, NotRun):
            return  # the model cannot judge this stream
        except (NpuModelError, NpuModelFault, UserError) as error:
            detail = str(error).removeprefix(f"{where}: ").removeprefix(
                "the command stream fails on the NPU: ")
            self.fault = (f"Vela's command stream for {where} fails on the "
                          f"{self.accelerator} (functional model): {detail}"
                          if not isinstance(error, UserError) else
                          f"{where}'s command stream cannot be checked: the TOSA reference "
                          f"model did not run its graph ({detail})")
            self.fault_delegate = index
            self.fault_error = detail
            raise


@dataclass(frozen=True)
class DeviceRun:
    """What the device-code run found: whether it ran, what ran it, and the refusals it turned
    into legalizations (each also a Workaround in the plan)."""

    ran: bool
    method: str
    detail: str  # "every kernel accepted its arguments" or why it did not run
    legalized: tuple[str, ...] = ()
    refusal: str | None = None  # what the runtime refused and no legalization satisfied
    # (nodes, why) when the NPU side refused what ops inside a partition compute: EthosUBackend
    # an output one op computes (that op), or the partition's command stream faulting the
    # functional model (every op of the partition); the CPU can run them instead
    # (planning/run.py moves them)
    npu_refused: tuple[tuple[str, ...], str] | None = None

    def line(self) -> str:
        if not self.ran:
            return f"runs on the device: real runtime not run ({self.detail})"
        if self.refusal:
            return (f"runs on the device: NO, the real runtime refused it: {self.refusal} "
                    f"(method: {self.method})")
        fixed = (f"; {len(self.legalized)} refusal(s) legalized with layout copies"
                 if self.legalized else "")
        return f"runs on the device: yes, {self.detail}{fixed} (method: {self.method})"

    def to_json(self) -> dict:
        return {"ran": self.ran, "method": self.method, "detail": self.detail,
                "legalized": list(self.legalized), "refusal": self.refusal}


# The layout kernels, whose output's dim order differs from their input's by design.
_LAYOUT_KERNELS = ("_to_dim_order_copy", "_clone_dim_order")


def _dim_orders_settled(program) -> list[Workaround]:
    """Every portable kernel whose tensors are neither all contiguous nor all channels-last (the
    dim-order check most portable kernels make, `tensors_have_same_dim_order`) given contiguous
    operands, as the run would have asked one refusal at a time."""
    fixes = []
    for node in list(program.graph_module.graph.nodes):
        # an edge op prints as "<EdgeOpOverload: aten.squeeze_copy.dims>: schema = ..."
        target = str(node.target)
        if node.op != "call_function" or not re.search(r"(^|\W)aten\.", target) \
                or any(name in target for name in _LAYOUT_KERNELS):
            continue
        tensors = [v for v in (*(i.meta.get("val") for i in node.all_input_nodes),
                               node.meta.get("val"))
                   if isinstance(v, torch.Tensor) and v.dim() >= 2]
        orders = {tuple(int(d) for d in v.dim_order()) for v in tensors}
        if all(o == tuple(range(len(o))) for o in orders) or orders == {(0, 2, 3, 1)}:
            continue
        fix = contiguous_operands(program, node, f"{node.target}'s dim-order check (its tensors "
                                  "neither all contiguous nor all channels-last), settled "
                                  "without the host run")
        if fix is not None:
            fixes.append(fix)
    return fixes


class DeviceRefusal(UserError):
    """The real runtime refused the program on a check no legalization satisfies (exit 2)."""


_RUNTIME: HostRuntime | None = None
_UNAVAILABLE: str | None = None


def enabled() -> bool:
    return os.environ.get(ENV_DEVICE_CHECK, "1") != "0"


def shared_runtime() -> HostRuntime:
    """One host runtime child process per tool process, reused by every compile in it."""
    global _RUNTIME, _UNAVAILABLE
    if _UNAVAILABLE is not None:
        raise RuntimeUnavailable(_UNAVAILABLE)
    if _RUNTIME is None:
        try:
            _RUNTIME = HostRuntime()
        except RuntimeUnavailable as error:
            _UNAVAILABLE = str(error)
            raise
        atexit.register(_RUNTIME.close)
    return _RUNTIME


def prestart() -> None:
    """Start the runtime's process early, so it has imported the runtime when the program is
    ready (no effect when the check is off or cannot run)."""
    if not enabled():
        return
    try:
        shared_runtime().prestart()
    except RuntimeUnavailable:
        pass


def _inputs(sample, dtypes, config: dict) -> tuple[torch.Tensor, ...]:
    """Sample 0 as the program takes it: int8 inputs quantized with the program's own
    input scale and zero point (config methods of --io int8)."""
    values = []
    for position, (value, dtype) in enumerate(zip(sample, dtypes)):
        if not isinstance(value, torch.Tensor) or dtype is None or dtype == value.dtype:
            values.append(value)
            continue
        prefix = f"input{position}_"
        if prefix + "scale" in config and value.is_floating_point():
            q = torch.round(value / float(config[prefix + "scale"])) + int(config[prefix + "zp"])
            values.append(q.clamp(int(config[prefix + "quant_min"]),
                                  int(config[prefix + "quant_max"])).to(dtype))
        else:
            values.append(value.to(dtype))
    return tuple(values)


def _ordinal(view: ProgramView, refusal: KernelRefusal) -> int:
    """How many calls of the refused operator come before the refused instruction."""
    base = refusal.operator.split(".")[0]
    return sum(1 for call in view.kernel_calls(refusal.chain, refusal.instruction)
               if call.operator.name == base)


def check_on_device(final_program, serialize, sample, config: dict, legalize: bool = True,
                    accelerator: str | None = None, tosa_graphs: dict[str, bytes] | None = None):
    """Serialize a copy of `final_program`, run it once; legalize dim-order refusals (in
    `final_program`, in place) and retry (unless `legalize` is off: upstream's flow reproduced).

    `serialize(program) -> (pte_bytes, executorch_program, ...)` (a schema Program, read through
    its ProgramView). `tosa_graphs` (payload SHA-256 -> the TOSA graph Vela compiled into it)
    lets each NPU invocation be compared with its graph. Returns the DeviceRun, the
    serialized result of the last copy (None when the run did not happen), the program that
    copy was serialized from (as serialization left it) and the workarounds applied. A refusal
    no legalization satisfies is in `DeviceRun.refusal`: `compile` refuses to write such a
    program (DeviceRefusal), `plan` reports it."""
    if not enabled():
        return DeviceRun(False, RUNTIME_METHOD, f"{ENV_DEVICE_CHECK}=0"), None, final_program, ()
    try:
        runtime = shared_runtime()
    except RuntimeUnavailable as error:
        return DeviceRun(False, RUNTIME_METHOD, str(error)), None, final_program, ()
    workarounds: list[Workaround] = []
    legalized: list[str] = []
    program = final_program
    for _ in range(MAX_LEGALIZATIONS + 1):
        trial = copy.deepcopy(program)
        serialized = serialize(trial)
        pte_bytes, view = serialized[0], ProgramView.of(serialized[1])

        npu = _NpuRun(accelerator, view, tosa_graphs)
        method = COMPARED_METHOD if npu.compared else STREAM_METHOD if npu.modelled else METHOD

        def refused(text: str, npu_refused: tuple[tuple[str, ...], str] | None = None):
            return (DeviceRun(True, method, "refused", tuple(legalized), text, npu_refused),
                    serialized, trial, tuple(workarounds))

        try:
            inputs = _inputs(sample, [v.dtype for v in view.input_values], config)
            runtime.run(pte_bytes, inputs, npu=npu)
        except RuntimeUnavailable as error:
            return DeviceRun(False, RUNTIME_METHOD, str(error)), None, program, tuple(workarounds)
        except RuntimeFailure as failure:
            if npu.fault:
                nodes = _delegate_nodes(trial, npu.fault_delegate)
                return refused(npu.fault, (nodes, f"its command stream fails on the "
                                                  f"{npu.accelerator} (functional model): "
                                                  f"{npu.fault_error}") if nodes else None)
            missing = missing_operators(str(failure))
            if missing:
                on_device = [op for op in missing if op not in device_operator_names()]
                if on_device:
                    return refused(f"the program needs {', '.join(on_device)}, which no kernel "
                                   "library of the device runtime provides (Missing operator "
                                   "when loading it)")
                return (DeviceRun(False, RUNTIME_METHOD,
                                  "the host runtime build lacks " + ", ".join(missing)),
                        None, program, tuple(workarounds))
            refusal = failure.refusal
            node = (runtime_node(program, refusal.operator, _ordinal(view, refusal))
                    if refusal is not None else None)
            fix = (contiguous_operands(program, node, refusal.text())
                   if legalize and node is not None and refusal.on_dim_order else None)
            short = scratch_shortfalls(view)
            if fix is None and short:
                # a host kernel writes past its planned scratch (kernels/host_scratch.py), which
                # may corrupt anything in the host process: what the host runtime refused or
                # where it crashed says nothing about the program on its device. The dim-order
                # checks the run can no longer be trusted with are satisfied without it.
                what = (refusal.text() if refusal is not None
                        else _first_line(str(failure)))
                for settled in _dim_orders_settled(program) if legalize else ():
                    workarounds.append(settled)
                    workarounds.extend(size1_copy_orders(program))
                    legalized.append(settled.message)
                return (DeviceRun(False, RUNTIME_METHOD,
                                  f"the host build cannot judge it: at instruction "
                                  f"{short[0].instruction} {short[0].operator} "
                                  f"{short[0].reason()} (then: {what}); `verify --qemu` runs "
                                  "it on its own core's CMSIS-NN path", tuple(legalized)),
                        None, program, tuple(workarounds))
            if refusal is None:
                text, moved = _delegate_refusal(str(failure), trial, view)
                return refused(text or _first_line(str(failure)), moved)
            if fix is None:
                origin = node.meta.get(ORIGIN_KEY, node.name) if node is not None else None
                where = "" if origin is None else f" (node {origin}" + (
                    ", which the compile inserted)" if ":" in origin else ")")
                return refused(refusal.text() + where)
            workarounds.append(fix)
            workarounds.extend(size1_copy_orders(program))  # the copies it inserted
            legalized.append(refusal.text())
            # the same check fails the same way wherever a kernel's tensors mix dim orders (a
            # 1-D ResNet's every squeeze after a channels-last convolution): one run, not one
            # per kernel
            for settled in _dim_orders_settled(program):
                workarounds.append(settled)
                workarounds.extend(size1_copy_orders(program))
                legalized.append(settled.message)
            continue
        return (DeviceRun(True, method, "every kernel accepted its arguments" +
                          (" and the NPU ran every command stream" if npu.modelled else "") +
                          (", each with its TOSA graph's outputs" if npu.compared else ""),
                          tuple(legalized)), serialized, trial, tuple(workarounds))
    return (DeviceRun(True, METHOD, "refused", tuple(legalized),
                      f"still refused after {MAX_LEGALIZATIONS} legalizations: {legalized[-1]}"),
            serialized, trial, tuple(workarounds))


def refuse(run: DeviceRun | None, npu: str | None = None) -> None:
    """Raise DeviceRefusal when the real runtime refused the program (compile writes nothing).
    The advice names what the user can change: the model, a policy where an NPU can take the
    op, and a report where the refused op is one the compile inserted."""
    if run is not None and run.refusal:
        advice = ("keep that op out of the model, or force it elsewhere with --policy" if npu
                  else "keep that op out of the model (a CPU-only target has nowhere else to "
                  "put it)")
        if "which the compile inserted" in run.refusal:
            advice = ("the refused op is one the compile inserted, not one of the model's: a "
                      "defect of orchestrate; please report it with the model")
        raise DeviceRefusal(
            f"not writing a program the device refuses: the ExecuTorch runtime (host build of "
            f"the device kernels) refused it: {run.refusal}; `orchestrate plan` shows where; "
            + advice)


_DELEGATE_FAILED = re.compile(r"CALL_DELEGATE execute failed at instruction (\d+): (0x[0-9a-fA-F]+)")
_BACKEND_LINE = re.compile(r"\[(EthosUBackend\.cpp:\d+)\] (.+)$")


# EthosUBackend says "Input 0 expected ..." and "output 1 ...": either case.
_DELEGATE_IO = re.compile(r"\b([Ii]nput|[Oo]utput) (\d+)\b")


def _delegate_refusal(log: str, program=None, view: ProgramView | None = None
                      ) -> tuple[str | None, tuple[tuple[str, ...], str] | None]:
    """What EthosUBackend logged when it refused a delegate call (its own words), or None; with
    the program, the op behind the input or output it names (e.g. an int64 `full` whose int32
    NPU output the backend cannot widen), and, for an output, ((that op,), why): an op the CPU
    can compute instead."""
    call = _DELEGATE_FAILED.search(log)
    if call is None:
        return None, None
    reasons = [f"{m.group(1)}: {m.group(2).strip()}" for m in map(_BACKEND_LINE.search,
                                                                     log.splitlines())
               if m and not m.group(2).startswith("data:")]
    text = (f"EthosUBackend refused the Ethos-U delegate at instruction {call.group(1)} "
            f"(error {call.group(2)}): " + ("; ".join(reasons) or "no reason logged"))
    named, said = next(((m, r) for r in reasons for m in [_DELEGATE_IO.search(r)] if m),
                       (None, None))
    moved = None
    if named is not None and program is not None and view is not None:
        side = named.group(1).lower()
        node = _delegate_io_node(program, view, int(call.group(1)), side, int(named.group(2)))
        if node is not None:
            val = node.meta.get("val")
            dtype = f", {str(val.dtype).replace('torch.', '')}" if hasattr(val, "dtype") else ""
            text += (f" ({side} {named.group(2)} of the partition is "
                     f"{node.name}: {getattr(node.target, '__name__', node.target)}{dtype}"
                     f"{_float_source(node) if side == 'input' else ''})")
            if side == "output" and node.op == "call_function":
                moved = ((node.name,), f"EthosUBackend refused the partition output it computes: "
                                       f"{said.split(': ', 1)[-1]}; {node.name} is "
                                       f"{getattr(node.target, '__name__', node.target)}{dtype}")
    return text, moved


def _float_source(node) -> str:
    """For a float input of an NPU partition: the op upstream of it that made it float, when
    one is complex-valued (an FFT: no int8 form, so the quantizer leaves it and what follows
    float), as ", computed from NAME: TARGET, complex64, which has no int8 form"; else ""."""
    seen, frontier = set(), [node]
    while frontier:
        current = frontier.pop(0)
        if id(current) in seen or getattr(current, "op", None) != "call_function":
            continue
        seen.add(id(current))
        val = current.meta.get("val")
        if getattr(val, "dtype", None) is not None and val.dtype.is_complex:
            return (f", computed from {current.name}: "
                    f"{getattr(current.target, '__name__', current.target)}, "
                    f"{str(val.dtype).replace('torch.', '')}, which has no int8 form, so it and "
                    "what follows stay float and the NPU takes integers only")
        frontier += [a for a in current.all_input_nodes]
        if len(seen) > 16:
            break
    return ""


def _delegate_nodes(program, delegate: int | None) -> tuple[str, ...]:
    """The ops inside the `delegate`-th NPU partition (graph order), by name; () when unknown."""
    if delegate is None:
        return ()
    try:
        calls = [n for n in program.graph_module.graph.nodes if n.op == "call_function"
                 and "executorch_call_delegate" in str(n.target)]
        lowered = getattr(program.graph_module, calls[delegate].args[0].target)
        # the compute ops: quantize/dequantize and getitem nodes follow the ops they serve
        return tuple(n.name for n in lowered.original_module.graph.nodes
                     if n.op == "call_function" and not any(
                         part in str(n.target) for part in ("quantize_per", "getitem")))
    except (IndexError, AttributeError):
        return ()


def _delegate_io_node(program, view: ProgramView, instruction: int, side: str, position: int):
    """The graph node behind input or output `position` of the delegate call at `instruction`
    (delegates are numbered in the graph's order), or None where the program does not say."""
    try:
        (delegate,) = [c.delegate_index for c in view.delegate_calls() if c.index == instruction]
        calls = [n for n in program.graph_module.graph.nodes if n.op == "call_function"
                 and "executorch_call_delegate" in str(n.target)]
        node = calls[delegate]
        if side == "input":
            return node.args[1 + position]
        lowered = getattr(program.graph_module, node.args[0].target)
        (output,) = [n for n in lowered.original_module.graph.nodes if n.op == "output"]
        return output.args[0][position]
    except (ValueError, IndexError, AttributeError, TypeError):
        return None


def _first_line(text: str) -> str:
    """The failure's first line; when the runtime process died, with the kernel check that
    aborted it from the log ("... assert failed (input.scalar_type() == dtype) ...")."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    check = next((line for line in reversed(lines[1:])
                  if "assert failed" in line or "Check failed" in line), None)
    return f"{lines[0].removesuffix(':')} {check}" if check else lines[0]
