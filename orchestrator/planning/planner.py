"""`plan`: the placements of a compile, costed and summarized, and the CI gates on them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from cost_models.cpu import MemoryTimings, calibrated_weight_cycles_per_byte
from cost_models.npu import VelaPartitionEstimate, read_vela_dir
from cost_models.op_shapes import walked_op
from cost_models.plan_costs import attach_costs
from cost_models.profile_calibration import CpuCalibration, calibrate_cost, row_work
from orchestrator.compilation.pipeline import Compiled, Stage, run_stages
from orchestrator.compilation.quantization_points import activation_ranges
from orchestrator.errors import GateFailure, UserError
from orchestrator.planning.placement import OpPlacement, missing_kernel_faults
from orchestrator.planning.plan import Plan
from orchestrator.planning.structure import module_groups, recurrences
from orchestrator.reports.summary import Summary, constant_segment_bytes, summarize
from partitioners.npu import npu_delegates
from partitioners.records import ORIGIN_KEY
from platforms import PlatformError
from platforms.arena_planning import arena_slots
from platforms.memory_placement import Arena, MemoryPlacement, MemoryPolicy, place_program


def vela_estimates(compiled) -> dict[int, VelaPartitionEstimate]:
    if not compiled.target.npu:
        return {}
    return {p.index: read_vela_dir(p.vela_dir / "output") for p in npu_delegates(compiled.final_program, compiled.lowered.vela_runs)}


@dataclass(frozen=True)
class PlanState:
    compiled: Compiled
    runner_ops: frozenset[str] | None
    estimates: dict[int, VelaPartitionEstimate] = field(default_factory=dict)
    rows: tuple[OpPlacement, ...] = ()
    summary: Summary | None = None
    memory_policy: MemoryPolicy | None = None  # None: auto
    memory: MemoryPlacement | None = None
    calibration: CpuCalibration | None = None  # cost_models/profile_calibration.py


def _vela_stage(state: PlanState) -> PlanState:
    """Vela's per-partition estimates (cycles, memory traffic, scratch) from its CSVs."""
    return replace(state, estimates=vela_estimates(state.compiled))


def _device_faults_stage(state: PlanState) -> PlanState:
    """Flag CPU ops with no kernel in the device's operator library."""
    compiled = state.compiled
    return replace(state, rows=missing_kernel_faults(
        compiled.placements, compiled.program_view.operator_names))


def _place_memory(state: PlanState, policy):
    compiled = state.compiled
    # ExecuTorch's EthosUBackend.cpp takes a delegate's scratch from the method's temp allocator
    # on every call, and that allocator is reset between instructions: the temp pool must hold
    # the largest scratch, not their sum.
    scratch = {k: e.scratch_bytes for k, e in state.estimates.items()}
    largest = max(scratch.items(), key=lambda kv: kv[1]) if scratch else None
    try:
        # A program with no planned tensor has no arena record: an empty one where the first
        # would have gone.
        arenas = compiled.arenas or (Arena(1, arena_slots(compiled.target.platform,
                                                          policy)[0].region,
                                           compiled.arena_bytes, 0),)
        return place_program(compiled.target.platform, len(compiled.pte_bytes), arenas,
                             constant_segment_bytes(compiled.program_view), largest,
                             policy, calibrated_weight_cycles_per_byte(compiled.target.cpu),
                             npu_weights_in_sram=(largest is not None and
                                                  compiled.target.memory_mode == "Sram_Only"))
    except PlatformError as error:
        raise UserError(str(error)) from None


def _memory_stage(state: PlanState) -> PlanState:
    """Regions for the image, the arena, the NPU scratch and the CPU weights (constant segment)."""
    return replace(state, memory=_place_memory(state, state.memory_policy or MemoryPolicy()))


def activation_read_costs(compiled, memory) -> dict[str, float]:
    """Row name (the node's origin before the CPU passes) -> cycles per activation byte its
    kernel reads and writes: the read costs of the arenas its planned input and output tensors
    are in, weighted by their bytes (only where the activations are split over several arenas;
    else empty)."""
    rates = {a.mem_id: cost for a, cost, _ in memory.arenas}
    if len(rates) < 2 or None in rates.values():
        return {}
    mem_id_of = compiled.arena_of
    per_row = {}
    for node in compiled.final_program.graph.nodes:
        if node.op != "call_function":
            continue
        weighted = total = 0.0
        for tensor in (*node.all_input_nodes, node):
            value = tensor.meta.get("val")
            mem_id = mem_id_of.get(tensor.name)
            if mem_id in rates and hasattr(value, "element_size"):
                size = value.numel() * value.element_size()
                weighted += size * rates[mem_id]
                total += size
        if total:
            per_row[node.meta.get(ORIGIN_KEY, node.name)] = weighted / total
    return per_row


def _costs_stage(state: PlanState) -> PlanState:
    """Cycles and time per row: Vela for NPU rows, our CPU models for the rest, CPU reads at the
    speed of the regions the memory stage chose (each op's activations at the speed of the
    arenas its tensors are in). Under the auto policy, a weights copy the cost model finds no
    gain in is not made: the weights stay in place."""
    memory = state.memory
    per_row = activation_read_costs(state.compiled, memory)

    def timings(placement):
        def of(row) -> MemoryTimings:
            return MemoryTimings(placement.weights_cycles_per_byte,
                                 per_row.get(row.name, placement.arena_cycles_per_byte))
        return of

    rows = attach_costs(state.rows, state.compiled.target, state.estimates, timings(memory))
    if not memory.weights_copied:
        return replace(state, rows=rows)
    # What the copy buys: the same rows with the weights read in place from the image.
    stay = _place_memory(state, replace(memory.policy, weights="in-place"))
    in_place = attach_costs(state.rows, state.compiled.target, state.estimates, timings(stay))
    gains = [(a.name, b.cost.cycles - a.cost.cycles) for a, b in zip(rows, in_place)
             if a.cost is not None and b.cost is not None and b.cost.cycles > a.cost.cycles]
    if not gains and memory.policy.weights == "auto":
        return replace(state, rows=in_place, memory=stay)
    memory = replace(memory, gain_cycles=sum(g for _, g in gains),
                     hottest=tuple(sorted(gains, key=lambda g: -g[1])[:3]))
    return replace(state, rows=rows, memory=memory)


def _calibration_stage(state: PlanState) -> PlanState:
    """CPU rows' costs under the CPU calibration, when the request names one: cycles from its
    cycles models (their source names it), instructions estimated by its instruction models,
    each from the row's modelled cycles and work (row_work); without one the rows are as the
    cost models made them."""
    calibration = state.calibration
    if calibration is None:
        return state
    target = state.compiled.target
    return replace(state, rows=tuple(
        replace(row, cost=calibrate_cost(row.cost, row.placement, row.kind, row.kernel,
                                         calibration, target.cpu_hz,
                                         row_work(row.macs, row.input_shapes, row.output_shape,
                                                  walked_op(row.op, row.kernel), row.io_bytes)))
        for row in state.rows))


def _summary_stage(state: PlanState) -> PlanState:
    """Coverage, partitions, latency, memory fit and runnability."""
    runner_ops = set(state.runner_ops) if state.runner_ops is not None else None
    return replace(state, summary=summarize(state.compiled, state.rows, state.estimates,
                                            runner_ops, state.memory))


def _structure_stage(state: PlanState) -> PlanState:
    """Rows by source module; unrolled recurrences with their steps and stored weights."""
    return replace(state, summary=replace(
        state.summary, modules=module_groups(state.rows),
        recurrences=recurrences(state.compiled, state.rows, state.estimates)))


def _activation_ranges_stage(state: PlanState) -> PlanState:
    """With calibration data given: each activation quantization point's scale, zero point and
    clipping rate on the calibration samples (generated samples say nothing about the data)."""
    compiled = state.compiled
    calibration = compiled.calibration
    if calibration.generated:
        return state
    ranges = activation_ranges(compiled.captured.program.module(check_guards=False),
                               compiled.quantized.program.module(check_guards=False),
                               calibration.samples, calibration.source, calibration.method)
    return replace(state, summary=replace(state.summary, activation_ranges=ranges))


PLAN_STAGES = (
    Stage("vela_estimates", _vela_stage),
    Stage("device_faults", _device_faults_stage),
    Stage("memory", _memory_stage),
    Stage("costs", _costs_stage),
    Stage("calibration", _calibration_stage),
    Stage("summary", _summary_stage),
    Stage("structure", _structure_stage),
    Stage("activation_ranges", _activation_ranges_stage),
)


def make_plan(compiled, runner_ops: set[str] | None = None, progress=None,
              memory_policy=None, calibration=None) -> Plan:
    """Run PLAN_STAGES on a compile (COMPILE_STAGES ran before). `memory_policy`: a
    platforms.memory_placement.MemoryPolicy (default auto); `calibration`: a
    cost_models.profile_calibration.CpuCalibration of the target's CPU (default none)."""
    state = run_stages(PLAN_STAGES, PlanState(
        compiled, frozenset(runner_ops) if runner_ops is not None else None,
        memory_policy=memory_policy, calibration=calibration), {}, progress)
    return Plan(compiled, state.rows, state.estimates, state.summary, calibration=calibration)


@dataclass(frozen=True)
class Gates:
    min_npu_coverage_pct: float | None = None
    max_partitions: int | None = None
    require_fit: bool = False
    require_runner_ops: bool = False
    require_runnable: bool = False


def check_gates(plan: Plan, gates: Gates) -> None:
    """Raise GateFailure (exit 3) naming every violated gate."""
    s = plan.summary
    failed = []
    if gates.min_npu_coverage_pct is not None and s.npu_mac_coverage_pct < gates.min_npu_coverage_pct:
        failed.append(f"--fail-under-npu-coverage: NPU MAC coverage {s.npu_mac_coverage_pct:.1f}% "
                      f"< {gates.min_npu_coverage_pct:g}%")
    if gates.max_partitions is not None and s.npu_partitions > gates.max_partitions:
        failed.append(f"--max-partitions: {s.npu_partitions} NPU partitions > {gates.max_partitions}")
    if gates.require_fit and not s.fits:
        too_big = [m.item for m in s.memory if not m.fits]
        failed.append(f"--require-fit: does not fit the platform memories ({', '.join(too_big)})")
    if gates.require_runner_ops and s.missing_operators:
        failed.append(f"--runner-ops: runner lacks {', '.join(s.missing_operators)}")
    run = plan.compiled.device_run
    if gates.require_runnable and run is not None and run.refusal:
        failed.append(f"--require-runnable: the real runtime refused the program: {run.refusal}")
    elif gates.require_runnable and s.device_faults:
        failed.append(f"--require-runnable: {len(s.device_faults)} device fault(s), first: "
                      f"{s.device_faults[0]}")
    if failed:
        raise GateFailure("gate failed: " + "; ".join(failed))
