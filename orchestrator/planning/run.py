"""Plan one Request: load its model and calibration, compile for its target, and, with cost
placement, let the cost model choose among trial placements. When the device check refuses work
an NPU partition does (EthosUBackend an output one of its ops computes, or the functional model
the partition's command stream), or Vela refuses a partition the Ethos-U partitioner formed,
those ops are moved to the CPU and the model compiled again; the plan's reason for each says
so. Where the CPU route of the moved ops fails upstream, the refusal stands and names the
attempt.

This is the body of `orchestrator.plan`; a sweep worker calls it for each configuration (it sits
below orchestrator.api so that the sweep room, which the API calls, never imports the API back).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from orchestrator.request import Request, Resolved, resolve

# Refusals answered by moving ops off the NPU, one recompile each.
MAX_DEVICE_MOVES = 4

if TYPE_CHECKING:  # the compile stack imports torch and ExecuTorch (seconds): imported on use
    from orchestrator.planning.plan import Plan
    from orchestrator.sources.loader import Calibration, LoadedModel


def plan_request(request: Request, progress=None) -> "Plan":
    """The Plan of `request` (see orchestrator.api.plan)."""
    from orchestrator.planning.cost_placement import place_by_cost  # lazy: heavy (torch)
    from orchestrator.sources.loader import load_calibration, load_model  # lazy: heavy (torch)

    resolved = resolve(request)
    loaded = load_model(request.model)
    if loaded.quantization is not None and loaded.quantization.kind == "tflite" and \
            resolved.target.io != "int8":
        # A full-integer model file takes and returns its own int8 tensors, as TFLM runs it.
        resolved = replace(resolved, target=replace(resolved.target, io="int8"), io_auto=False)
    if loaded.quantization is not None and resolved.target.npu and \
            loaded.quantization.kept_on_cpu:
        from partitioners.policy import Policy  # lazy: heavy (torch)

        policy = resolved.policy or Policy(source="the model file")
        resolved = replace(resolved, policy=replace(
            policy, kept_on_cpu=policy.kept_on_cpu + loaded.quantization.kept_on_cpu))
    samples = replace(load_calibration(request.calibration, loaded.example_inputs),
                      method=request.calibration_method, precision=resolved.precision)
    if loaded.quantization is not None and samples.generated:
        samples = replace(samples, warning=None, source=(
            "the model file's quantization (ranges inside an operator, if any: 8 samples over "
            "every integer input value)"))
    if resolved.precision:
        from orchestrator.compilation.precision import check_modules  # lazy: heavy (torch)

        check_modules(loaded.module, resolved.precision, loaded.name)
    if resolved.placement == "greedy" or not resolved.target.npu:
        return _plan_under(loaded, samples, resolved, resolved.policy, progress)
    chosen = place_by_cost(lambda p: _plan_under(loaded, samples, resolved, p, progress),
                           resolved.policy)
    return replace(chosen.chosen, cost_placement=chosen)


def _plan_under(loaded: "LoadedModel", samples: "Calibration", resolved: Resolved, policy,
                progress) -> "Plan":
    from orchestrator.compilation.pipeline import (  # lazy: heavy (torch, executorch, vela)
        NpuPartitionRefused, StageError, compile_model)
    from orchestrator.planning.planner import make_plan  # lazy: heavy (torch, executorch, vela)
    from partitioners.policy import Policy  # lazy: heavy (torch)

    target = resolved.target
    if policy is not None and target.npu and policy.memory_mode \
            and policy.memory_mode != target.memory_mode:  # a cost-placement trial
        target = replace(target, memory_mode=policy.memory_mode)
    compiled = refusal = None
    for _ in range(MAX_DEVICE_MOVES + 1):
        try:
            trial = compile_model(loaded, samples, target, policy=policy,
                                  memory_policy=resolved.memory, io_auto=resolved.io_auto,
                                  progress=progress)
        except NpuPartitionRefused as error:
            # Vela refused a partition the Ethos-U checks formed: its ops run on the CPU.
            moved = dict(policy.device_moved if policy else ())
            if all(node in moved for node in error.nodes):
                raise
            refusal = error
            policy = (policy or Policy(source="the device check")).with_device_moved(
                error.nodes, error.why)
            continue
        except StageError as error:
            if compiled is None:
                raise
            # the CPU route of the moved ops fails upstream: the refusal stands, and says so
            run = compiled.device_run
            compiled = replace(compiled, device_run=replace(run, refusal=(
                f"{run.refusal}; moving {len(run.npu_refused[0])} op(s) of it to the CPU was "
                f"tried and failed: {error}")))
            break
        compiled = trial
        refused = compiled.device_run.npu_refused if compiled.device_run else None
        moved = dict(policy.device_moved if policy else ())
        if refused is None or all(node in moved for node in refused[0]):
            break
        # The device refused work an NPU partition does (EthosUBackend cannot hand an int64
        # `full` back from the NPU's int32; Vela's stream for a partition faults the functional
        # model): those ops run on the CPU instead.
        policy = (policy or Policy(source="the device check")).with_device_moved(*refused)
    if compiled is None:  # Vela refused a partition on every attempt
        raise refusal
    return make_plan(compiled, resolved.request.runner_ops, progress, resolved.memory,
                     resolved.costs)
