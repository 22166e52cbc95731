"""`--placement cost`: move an NPU island to the CPU when the cost model says the program gets faster.

Greedy placement puts every op the Ethos-U checks accept on the NPU. A small island pays an
invocation (driver, cache maintenance over its scratch) that its
few MACs never earn back. Starting from the greedy plan, for each NPU partition:

    on the NPU  = the partition's rows: Vela's cycles (vela) + the invocation (model:transition)
    on the CPU  = the same ops by our CPU cost model: CMSIS-NN where the Cortex-M backend has a
                  substitution for the op, else the portable model

A partition whose CPU figure is lower is a candidate. So are the ops at either end of a
partition of several ops (its first or last costed op with the activations fused into it):
moving them saves no invocation, so they are priced by their own rows only (NPU: Vela's cycles;
CPU: our model), and are a candidate only where the CPU is the faster of the two. Before any
move, the memory regions: the program planned under Vela's Sram_Only beside the platform's
Shared_Sram (see place_by_cost); then, where the Ethos-U55 check refused an average pool only
for the input rows its one window leaves unread, the program with that pool cut to its window
(_pool_windows). Candidates are forced to the CPU through
the placement policy (an Ethos-U operator-support check), the model recompiled and re-planned,
and the result kept only if its whole-program estimate is lower than greedy's: never worse than
greedy by the model. Boundary quantize/dequantize rows do not change when an int8 island moves
(CMSIS-NN kernels take the same int8 tensors), so they are not part of the comparison.
Every figure here is an estimate; its sources are named in each decision.
"""

from __future__ import annotations

from dataclasses import replace

from cost_models.plan_costs import PORTABLE_COPIES, cpu_op_cost
from cost_models.profile_calibration import calibrate_cost, row_work
from orchestrator.errors import OrchestrateError
from orchestrator.planning.plan import (WITH_ITS_PARTITION, CostPlacement, Decision,
                                        MemoryDecision, WindowDecision)
from partitioners.policy import Policy
from partitioners.upstream_cortex_m import substituted_op_names


_FUSED_ACTIVATIONS = ("relu", "clamp", "hardtanh")


# The CMSIS-NN function an op of this kind runs on the CPU, for the calibration's lookup: the
# function itself where the kind has one, else its family's prefix, which names no kernel of a
# calibration file, so its class's model applies (the wrappers pick by geometry).
_CMSIS_FUNCTION_OF_KIND = {
    "add": "arm_elementwise_add_s8", "mul": "arm_elementwise_mul_s8",
    "avg_pool": "arm_avgpool_s8", "max_pool": "arm_max_pool_s8", "softmax": "arm_softmax_s8",
    "conv": "arm_convolve", "depthwise_conv": "arm_depthwise_conv",
    "fully_connected": "arm_fully_connected", "batch_matmul": "arm_batch_matmul"}


def _cpu_seconds(row, target, island_has_macs: bool, calibration=None) -> tuple[float, str]:
    """The row's op on the CPU: as the Cortex-M passes would lower it, by our CPU models, under
    the plan's CPU calibration as the plan prices its CPU rows (cycles at least the instructions
    the kernel retires)."""
    if row.info is None:
        return 0.0, ""
    parts = row.op.split(".")
    base = parts[1] if parts[0] in ("aten", "dim_order_ops") and len(parts) > 1 else parts[0]
    shape = row.info.op_shape
    if shape.kind in _FUSED_ACTIVATIONS and island_has_macs:
        return 0.0, ""  # folded into the conv/linear kernel's output clamp
    if base == "full":
        return 0.0, ""  # a constant: folded at compile time
    engine = ("portable-copy" if base in PORTABLE_COPIES else "layout") if row.kind == "layout" \
        else "cmsis-nn" if base in substituted_op_names() else "portable"
    cost = cpu_op_cost(engine, shape, target)
    if calibration is not None:
        placement = "cmsis-nn" if engine in ("cmsis-nn", "layout") else "portable"
        kernel = _CMSIS_FUNCTION_OF_KIND.get(shape.kind) if placement == "cmsis-nn" else base
        cost = calibrate_cost(cost, placement, row.kind, kernel, calibration, target.cpu_hz,
                              row_work(row.macs, row.input_shapes, row.output_shape, row.op))
    return cost.seconds, cost.source


def island_decisions(plan, policy) -> list[Decision]:
    """Per NPU partition of `plan`: its NPU and CPU estimates and whether it should move."""
    target = plan.compiled.target
    decisions, ends = [], []
    for index in sorted({r.partition for r in plan.rows if r.placement == "npu"}):
        rows = [r for r in plan.rows if r.partition == index and r.placement == "npu"]
        ops = [r for r in rows if r.kind != "npu-invocation"]
        # The whole island: its NPU figure includes the invocation moving it saves.
        decisions.append(_decision(index, ops, rows, target, policy, "island", plan.calibration))
        if len(ops) > 1:
            ends.extend(_boundary_decisions(index, ops, target, policy, plan.calibration))
    return decisions + ends


def _costed(row) -> bool:
    return bool(row.macs) or (row.cost is not None and row.cost.seconds > 0)


def _boundary_decisions(index: int, ops: list, target, policy, calibration) -> list[Decision]:
    """The partition's first and last costed op, each with the uncosted rows (fused
    activations, layout copies Vela removed) between it and the partition's edge."""
    out = []
    costed = [i for i, r in enumerate(ops) if _costed(r)]
    if len(costed) < 2:  # one costed op: moving it is moving the island
        return out
    for part, rows in (("first ops", ops[:costed[0] + 1]), ("last ops", ops[costed[-1]:])):
        out.append(_decision(index, rows, rows, target, policy, part, calibration))
    return out


def _decision(index: int, ops: list, npu_rows: list, target, policy, part: str,
              calibration=None) -> Decision:
    """`ops` moved to the CPU, priced by our CPU models, against `npu_rows`' figures (Vela's,
    and the invocation's when the whole island moves); a candidate when the CPU is faster and
    no keep_npu rule names one of `ops`."""
    npu = sum(r.cost.seconds for r in npu_rows if r.cost is not None)
    has_macs = any(r.macs for r in ops)
    cpu, sources, tags = 0.0, [], []
    for row in ops:
        seconds, source = _cpu_seconds(row, target, has_macs, calibration)
        cpu += seconds
        for piece in source.split("+") if source else ():
            base, _, tag = piece.partition(" (")
            for name, found in ((base, sources), (tag.rstrip(")"), tags)):
                if name and name not in found:
                    found.append(name)
    keep = next((f"keep_npu rule matches {r.name}" for r in ops
                 if policy is not None and r.name in policy.keep_npu.nodes), "")
    return Decision(index, tuple(r.name for r in ops), sum(r.macs for r in ops), npu, cpu,
                    "+".join(sources) + (f" ({'; '.join(tags)})" if tags else "") or "-",
                    cpu < npu and not keep, keep if cpu < npu else "",
                    part=part)


def place_by_cost(plan_fn, policy) -> CostPlacement:
    """`plan_fn(policy) -> Plan` compiles and plans under a policy (greedy first).

    First the memory regions: where the policy fixes no Vela memory mode and the platform's
    leaves the NPU weights in flash (Shared_Sram), the program is planned under Sram_Only too
    (the image in SRAM; the memory stage places it there or finds it does not fit) and that
    becomes the baseline when it fits and is faster. Then the candidates are tried one at a
    time, largest predicted saving first, each on top of the moves already kept; a move is kept
    only when the recompiled program compiles and its whole-program estimate drops. So the
    result is never worse than greedy by the model."""
    policy = policy or Policy()
    greedy = plan_fn(policy)
    best, best_seconds = greedy, greedy.summary.latency_seconds or 0.0
    greedy_seconds = best_seconds
    memory, policy, best, best_seconds = _memory_mode(plan_fn, policy, greedy)
    windows, policy, best, best_seconds = _pool_windows(plan_fn, policy, best, best_seconds)
    decisions = island_decisions(best, policy)
    kept_nodes: tuple[str, ...] = ()
    final = {d.key: d for d in decisions}
    for decision in sorted((d for d in decisions if d.moved), key=lambda d: d.delta_seconds):
        if set(decision.nodes) <= set(kept_nodes):  # its whole island moved already
            final[decision.key] = replace(decision, moved=False,
                                          kept_reason=WITH_ITS_PARTITION)
            continue
        try:
            trial = plan_fn(policy.with_forced_nodes(kept_nodes + decision.nodes))
        except OrchestrateError as error:
            # The CPU route can fail where the NPU did not (an upstream Cortex-M lowering
            # limit): the island stays, and the decision says why.
            final[decision.key] = replace(decision, moved=False,
                                          kept_reason=f"moving failed: {error}")
            continue
        seconds = trial.summary.latency_seconds or 0.0
        if seconds < best_seconds:
            best, best_seconds = trial, seconds
            kept_nodes += decision.nodes
        else:
            final[decision.key] = replace(
                decision, moved=False, kept_reason="moving was not faster for the whole program "
                f"({seconds * 1e3:.3f} ms vs {best_seconds * 1e3:.3f} ms)")
    moved_islands = {d.partition for d in final.values() if d.part == "island" and d.moved}
    for key, decision in final.items():  # an end of a partition that moved whole moved with it
        if decision.part != "island" and decision.partition in moved_islands:
            final[key] = replace(decision, moved=False, kept_reason=WITH_ITS_PARTITION)
    return CostPlacement(greedy, best, tuple(final[d.key] for d in decisions),
                         greedy_seconds, best_seconds, memory, windows)


def _window_candidates(plan) -> tuple[str, ...]:
    """The CPU rows of `plan` that avg_pools_over_their_window cuts: an `nn.AvgPool2d` whose one
    window (a 1x1 output) the Ethos-U55 check refused for the rows it leaves unread, and whose
    module computes no other row (a module called on two input sizes is left as it is; so is a
    functional avg_pool2d, which has no module of its own)."""
    from partitioners.npu import UNREAD_ROWS_NOTE  # lazy: heavy (executorch)

    pools = [r for r in plan.rows if "avg_pool" in r.op and r.module_type == "AvgPool2d"]
    shared = {r.module for r in pools if sum(p.module == r.module for p in pools) > 1}
    return tuple(r.name for r in pools if r.placement != "npu" and r.module not in shared
                 and tuple(r.output_shape[2:]) == (1, 1)
                 and any(UNREAD_ROWS_NOTE in f"{reason.message} {reason.value}"
                         for reason in r.reasons))


def _pool_windows(plan_fn, policy, best, best_seconds):
    """(WindowDecision or None, the policy to go on with, its plan, its seconds): where the
    NPU's check refused an average pool only for the rows its one window leaves unread, the
    program is also planned with such pools cut to their window (Policy.pool_windows) and kept
    when its estimate is lower."""
    pools = _window_candidates(best)
    if not pools or policy.pool_windows:
        return None, policy, best, best_seconds
    trial_policy = replace(policy, pool_windows=True)
    try:
        trial = plan_fn(trial_policy)
    except OrchestrateError as error:
        return (WindowDecision(pools, best_seconds, None, False, f"planning it failed: {error}"),
                policy, best, best_seconds)
    seconds = trial.summary.latency_seconds or 0.0
    if set(_window_candidates(trial)) >= set(pools):  # not one of them reached the NPU
        return (WindowDecision(pools, best_seconds, seconds, False,
                               "the NPU still refused them over their window"),
                policy, best, best_seconds)
    if seconds >= best_seconds:
        return (WindowDecision(pools, best_seconds, seconds, False, "it is not faster"),
                policy, best, best_seconds)
    return (WindowDecision(pools, best_seconds, seconds, True, "Vela's estimate for the pool "
                           "beats the CPU's (with one CPU/NPU hand-over pair fewer)"),
            trial_policy, trial, seconds)


# The Vela memory mode cost placement also tries, from the platform's: weights in flash -> all
# in SRAM (Ethos-U55/U65; Vela's vela.ini names both).
MEMORY_ALTERNATIVES = {"Shared_Sram": "Sram_Only"}


def _memory_mode(plan_fn, policy, greedy):
    """(MemoryDecision or None, the policy to go on with, its plan, its seconds)."""
    target = greedy.compiled.target
    seconds = greedy.summary.latency_seconds or 0.0
    alternative = MEMORY_ALTERNATIVES.get(target.memory_mode or "")
    if policy.memory_mode or alternative is None or not greedy.summary.npu_partitions:
        return None, policy, greedy, seconds
    trial_policy = replace(policy, memory_mode=alternative)
    try:
        trial = plan_fn(trial_policy)
    except OrchestrateError as error:
        return (MemoryDecision(target.memory_mode, alternative, seconds, None, False,
                               f"planning under it failed: {error}"), policy, greedy, seconds)
    trial_seconds = trial.summary.latency_seconds or 0.0
    if not trial.summary.fits:
        too_big = ", ".join(m.item for m in trial.summary.memory if not m.fits)
        return (MemoryDecision(target.memory_mode, alternative, seconds, trial_seconds, False,
                               f"it does not fit the platform's memories ({too_big})"),
                policy, greedy, seconds)
    if trial_seconds >= seconds:
        return (MemoryDecision(target.memory_mode, alternative, seconds, trial_seconds, False,
                               "it is not faster"), policy, greedy, seconds)
    image = next((m for m in trial.summary.memory if m.item.startswith(".pte")), None)
    where = f"; the .pte in {image.region}" if image is not None else ""
    return (MemoryDecision(target.memory_mode, alternative, seconds, trial_seconds, True,
                           f"the NPU reads its weights from SRAM{where}"),
            trial_policy, trial, trial_seconds)
