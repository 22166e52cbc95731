"""The compile pipeline: an ordered tuple of small stages that one loop runs.

    COMPILE_STAGES = capture -> quantize -> lower -> quantize_io -> route_cpu
                     -> check_boundaries -> place -> prune_constants -> run_on_device
                     -> serialize -> choose_io

Each stage takes the `CompileState` so far and returns a new one with its own result added; no
stage hands a result on by changing another's value or upstream private state. `run_stages`
times each stage, reports progress, and re-raises an unexpected upstream exception as one
error naming the stage. `plan` and `compile` share this pipeline (orchestrator/planning/planner.py adds
PLAN_STAGES after it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import atexit
import contextlib
import io
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Callable

import torch
from executorch.backends.arm.quantizer import EthosUQuantizer
from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
from executorch.exir import ExecutorchBackendConfig, to_edge
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.passes import MemoryPlanningPass
from executorch.exir.passes.quantize_io_pass import QuantizeInputs, QuantizeOutputs
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

from kernels.program_view import ProgramView
from orchestrator.artifacts import cache
from orchestrator import numerics
from orchestrator.compilation import file_quantization as pinning
from orchestrator.compilation import observers, precision, upstream_exir
from orchestrator.compilation.recurrent_steps import tie_step_observers
from orchestrator.compilation.shared_constants import merge_equal_constants
from orchestrator.compilation import device_check, fx_code_cache, program_state
from orchestrator.compilation.device_check import DeviceRun
from orchestrator.errors import OrchestrateError, UserError
from orchestrator.sources.loader import Calibration, LoadedModel
from orchestrator.target import Target, compile_spec
from orchestrator.planning.placement import OpPlacement, place, snapshot_pre_cpu
from orchestrator.compilation.prune import PrunedConstant, prune_unused_constants
from orchestrator.compilation import share_tables as tables
from orchestrator.compilation import share_values as sharing
from partitioners.boundary import (BoundaryLayoutError, BoundaryTensor, boundary_tensors,
                                   check_boundaries)
from partitioners.cpu import CpuDecision, route_to_cpu
from partitioners import quantizable
from partitioners.legalize import DIM_ORDER_COPIES, same_bytes_order
from partitioners.module_forms import (avg_pools_over_their_window, conv1d_as_conv2d,
                                       conv_inputs_channels_last, mve_1xn_padding_explicit)
from partitioners.npu import (NpuRejection, VelaRefusal, VelaRun, lower_to_npu,
                              vela_workarounds)
from partitioners.reasons import LOWERING_REFUSAL, VELA_REFUSAL
from partitioners.policy import Policy, unmatched_force_cpu
from partitioners.records import Workaround
from platforms.arena_planning import ArenaRecord, arena_slots, planning_algorithm
from platforms.memory_placement import Arena, MemoryPolicy

if TYPE_CHECKING:  # types only; the modules import heavy upstream packages
    from executorch.exir import EdgeProgramManager
    from executorch.exir.schema import Program


@dataclass(frozen=True)
class Captured:
    program: torch.export.ExportedProgram
    example_inputs: tuple[torch.Tensor, ...]
    channels_last: bool


@dataclass(frozen=True)
class Quantized:
    program: torch.export.ExportedProgram
    reference: torch.fx.GraphModule | None  # convert_pt2e output (None when read from the cache)
    example_inputs: tuple[torch.Tensor, ...]
    workarounds: tuple[Workaround, ...] = ()  # pre-quantization rewrites (quantizable.py)


@dataclass(frozen=True)
class Lowered:
    edge: EdgeProgramManager
    npu_rejections: dict[str, NpuRejection]
    vela_runs: tuple[VelaRun, ...]
    policy_unmatched: tuple[str, ...] = ()  # force_cpu entries that matched no node (notes)
    workarounds: tuple[Workaround, ...] = ()  # upstream defects corrected while lowering


@dataclass(frozen=True)
class Compiled:
    """Everything the report, the artifacts and the twin need from one compile."""

    model: LoadedModel
    target: Target
    calibration: Calibration
    captured: Captured
    quantized: Quantized
    lowered: Lowered
    final_program: torch.export.ExportedProgram  # edge program after CPU routing
    cpu_decisions: dict[str, CpuDecision]
    boundaries: tuple[BoundaryTensor, ...]
    placements: tuple[OpPlacement, ...]  # in execution order
    pte_bytes: bytes
    executorch_program: Program  # exir schema Program (execution plans, delegates)
    io_quant: dict[str, float | int]  # config-method name -> value, for --io int8
    workarounds: tuple[Workaround, ...] = ()  # upstream defects corrected
    stage_seconds: dict[str, float] = field(default_factory=dict)
    work_dir: Path | None = None
    pruned_constants: tuple[PrunedConstant, ...] = ()
    cache_hit: bool = False  # capture + quantization came from orchestrator/artifacts/cache.py
    # ExecuTorch's planned buffers, each in its region (platforms/arena_planning.py), and the
    # buffer (mem_id) of each node's output, by node name.
    arenas: tuple[Arena, ...] = ()
    arena_of: dict[str, int] = field(default_factory=dict)
    io_choice: IoChoice | None = None  # when compiled with --io auto
    device_run: DeviceRun | None = None  # the program's run in the real runtime

    @cached_property
    def program_view(self) -> ProgramView:
        """The serialized program as every reader names it (kernels/program_view.py)."""
        return ProgramView.of(self.executorch_program)

    @property
    def arena_bytes(self) -> int:
        """ExecuTorch's planned arena (sum of non-constant buffers; index 0 is reserved)."""
        return self.program_view.arena_bytes


def _to_channels_last(value):
    # Explicit NHWC strides: `contiguous(memory_format=channels_last)` and `.contiguous()` of a
    # permuted view return a C=1 tensor unchanged (size-1 dims count as contiguous either way),
    # and export then records NCHW for the model input.
    if isinstance(value, torch.Tensor) and value.dim() == 4:
        n, c, h, w = value.shape
        nhwc = torch.empty_strided(value.shape, (h * w * c, 1, w * c, c), dtype=value.dtype)
        nhwc.copy_(value)
        return nhwc
    return value


def _parameters_channels_last(module: torch.nn.Module) -> None:
    """Every 4-D parameter and buffer in NHWC strides, in place. (`module.to(memory_format=
    torch.channels_last)` raises "required rank 4 tensor" on a Conv3d's 5-D weight, which
    ended such a model in an internal error instead of the one-line refusal below.)"""
    with torch.no_grad():
        for sub in module.modules():
            for tensor in [*sub.parameters(recurse=False), *sub.buffers(recurse=False)]:
                if tensor.dim() == 4:
                    tensor.data = tensor.data.contiguous(memory_format=torch.channels_last)


def capture(model: LoadedModel, channels_last: bool = True) -> Captured:
    """torch.export in channels_last, so every CPU/NPU boundary is NHWC on both sides."""
    module = model.module.eval()
    inputs = tuple(model.example_inputs)
    if channels_last:
        _parameters_channels_last(module)  # inputs below
        inputs = tuple(_to_channels_last(x) for x in inputs)
    # Dynamo prints the partial graph of a failed trace on stderr; the one-line error below
    # says what failed (ORCHESTRATE_DEBUG=1 / --verbose shows the dump).
    quiet = not os.environ.get("ORCHESTRATE_DEBUG")
    try:
        with contextlib.ExitStack() as stack:
            if quiet:
                stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
                stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
            program = torch.export.export(module, inputs, strict=True)
    except Exception as error:  # noqa: BLE001 - the user's model failed to trace
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise UserError(
            f"torch.export could not capture model '{model.name}': {type(error).__name__}: "
            f"{first_line[:200]}; make the model exportable with torch.export(strict=True)"
        ) from None
    _refuse_data_dependent_shapes(program, model.name)
    return Captured(program, inputs, channels_last)


class UnsupportedModel(UserError):
    """The model uses a construct the device flow cannot compile: the message names the
    construct, the node and what to do instead (exit 2)."""


def _refuse_data_dependent_shapes(program, name: str) -> None:
    """A microcontroller program plans every buffer ahead: an op whose output shape depends on
    the data (nonzero, masked_select, unique) cannot be planned."""
    for node in program.graph.nodes:
        val = node.meta.get("val")
        values = val if isinstance(val, (tuple, list)) else (val,)
        for value in values:
            if isinstance(value, torch.Tensor) and any(
                    not isinstance(d, int) and not str(d).isdigit() for d in value.shape):
                op = str(getattr(node.target, "__name__", node.target))
                raise UnsupportedModel(
                    f"model '{name}': node {node.name} ({op}) has a data-dependent output shape "
                    f"{list(value.shape)}; ExecuTorch plans every buffer ahead of time on the "
                    "device, so use a fixed-size form (e.g. a mask multiply instead of nonzero)")


def _quantizer(target: Target, method: str, precisions=(), cmsis_nn_modules=()):
    """Upstream's quantizer for the target, its activations observed by the calibration method
    (orchestrator/compilation/observers.py; the default is upstream's observer), the modules
    given A16W8 by `precisions` with int16 activations (orchestrator/compilation/precision.py)."""
    if target.npu:
        quantizer = EthosUQuantizer(compile_spec(target))
        quantizer.set_global(observers.ethos_u_config(method))
        precision.configure(quantizer, precisions,
                            lambda config: observers.with_activation_observer(config, method))
        return pinning.softmax_on_cmsis_nn(quantizer, tuple(cmsis_nn_modules))

    quantizer = observers.cortex_m_quantizer(method)
    precision.configure_cortex_m(quantizer, precisions,
                                 lambda config: observers.with_activation_observer(config, method))
    return quantizer


def quantize(captured: Captured, calibration: Calibration, target: Target,
             legalize: bool = True, per_step: bool = True,
             file_quantization=None) -> Quantized:
    program, fixes = captured.program, []
    if legalize and not target.npu:
        program, fixes = quantizable.decompose_recurrences(program)
    # torch 2.13 puts a `_guards_fn` call_module in `.module()`; both quantizers reject it
    # ("call_module is not supported"), so guards are dropped here.
    module = program.module(check_guards=False)
    states = program_state.States(program, module)  # initial values, before anything runs it
    if legalize:
        fixes += quantizable.legalized(module, target.npu, precision.raised(calibration.precision))
    prepared = prepare_pt2e(module, _quantizer(target, calibration.method, calibration.precision,
        file_quantization.cmsis_nn_modules if file_quantization is not None else ()))
    if legalize and target.npu and per_step:  # one quantization for a recurrence's steps,
        tied = tie_step_observers(prepared)  # so the NPU lowering compiles one for all of them
        fixes += [tied.workaround()] if tied else []
    # A file's model: the ranges the file does not give (inside an operator) see every input value
    samples = pinning.calibration_samples(file_quantization, captured.example_inputs) \
        if file_quantization is not None and calibration.generated else calibration.samples
    with torch.no_grad(), numerics.single_threaded(), states.calibrating():  # frames, in order
        for sample in samples:
            prepared(*(_to_channels_last(x) if captured.channels_last else x for x in sample))
    if file_quantization is not None:
        fixes += [pinning.pin(prepared, file_quantization).workaround()]
    reference = program_state.converted(prepared, states)  # a state is no constant
    # PT2E quantizes a weight once per use (a 25-step GRU: 62 constants, 16 values). Not for the
    # NPU: FuseEqualPlaceholdersPass raises (KeyError) on one constant feeding two partitions
    if not target.npu:  # (tests/npu_edge_models all_edges on U55-64: per-channel zero points)
        merge_equal_constants(reference)
    # Non-strict export (no Dynamo) of the converted FX graph: the same program in half the time
    program = torch.export.export(reference, captured.example_inputs, strict=False)
    return Quantized(program, reference, captured.example_inputs, tuple(fixes))


def lower(quantized: Quantized, target: Target, work_dir: Path, policy=None) -> Lowered:
    if target.npu:
        vela_flags, chaining = vela_workarounds(quantized.program, target.npu)
        # The last of to_edge_transform_and_lower's three re-traces decomposes nothing in a
        # quantized program; it is skipped by upstream's own test (upstream_exir; the golden
        # list's bytes; a 25-step GRU on the U55-128: lower 41.6 -> 39.4 s).
        with upstream_exir.idle_decompositions_skipped():
            edge, rejections, runs, fixes = lower_to_npu(  # steps cut where they were tied
                quantized.program, compile_spec(target, vela_flags), work_dir, policy,
                cut_steps=any(w.node == "(recurrence)" for w in quantized.workarounds),
                tflite_rounding=any(w.node == pinning.WORKAROUND_NODE for w in quantized.workarounds))
        fixes = (*fixes, *chaining)
    else:
        # No partitioner: `to_edge` decomposes once, where to_edge_transform_and_lower without
        # partitioners functionalizes first and decomposes after, re-tracing the graph twice
        # (the same program: the golden list; a 25-step GRU's 1,841 nodes: 5 s less).
        edge = to_edge(quantized.program, compile_config=cortex_m_edge_compile_config())
        rejections, runs, fixes = {}, [], ()
    unmatched = ()
    if target.npu and policy is not None and policy.forces_cpu():
        unmatched = unmatched_force_cpu(policy, (r.policy_rule for r in rejections.values()))
    return Lowered(edge, rejections, tuple(runs), unmatched, fixes)


def quantize_io(lowered: Lowered, target: Target) -> tuple[Lowered, dict]:
    """`--io int8`: the program takes and returns int8, so no fp32 I/O buffer sits in the arena.
    Upstream's QuantizeInputs/QuantizeOutputs remove the first quantize and the last dequantize
    and record each scale/zero point as config methods (e.g. `input0_scale`) in the .pte, which a
    firmware reads to quantize its input. Not with state: upstream numbers the outputs with the
    state's write-backs among them (the user's output 0 would be `output4_scale`)."""
    program_state.for_the_device(lowered.edge.exported_program())  # int8, in its buffer order
    if target.io != "int8":
        return lowered, {}
    edge = lowered.edge
    if edge.exported_program().graph_signature.buffers_to_mutate:
        raise UserError("--io int8 is not possible for a program with state yet (upstream "
                        "numbers its outputs with the state's write-backs); use --io float")
    inputs, outputs = quantized_io_indices(edge.exported_program())
    if not inputs and not outputs:
        raise UserError("--io int8 is not possible for this model: none of its inputs is "
                        "quantized first and none of its outputs is dequantized last; use "
                        "--io float (or --io auto)")
    try:
        edge = edge.transform([QuantizeInputs(edge, inputs), QuantizeOutputs(edge, outputs)])
    except ValueError as error:
        raise UserError(f"--io int8 is not possible for this model: {error}") from None
    return replace(lowered, edge=edge), upstream_exir.config_methods(edge)


def quantized_io_indices(program) -> tuple[list[int], list[int]]:
    """The inputs whose one use is a quantize and the outputs a dequantize makes: the I/O
    `--io int8` hands over as int8. Upstream's QuantizeInputs/QuantizeOutputs refuse the whole
    program when any other is asked for; an output that is no quantized value (argmax or topk
    indices, int64) stays as the model returns it, beside the int8 ones."""
    quantize = (exir_ops.edge.quantized_decomposed.quantize_per_tensor.default,
                torch.ops.quantized_decomposed.quantize_per_tensor.default)
    dequantize = (exir_ops.edge.quantized_decomposed.dequantize_per_tensor.default,
                  torch.ops.quantized_decomposed.dequantize_per_tensor.default)
    graph = program.graph_module.graph
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    inputs = []
    for index, name in enumerate(program.graph_signature.user_inputs):
        users = list(placeholders[name].users) if name in placeholders else []
        if len(users) == 1 and users[0].target in quantize:
            inputs.append(index)
    outputs = [index for index, node in enumerate(graph.output_node().args[0])
               if isinstance(node, torch.fx.Node) and node.target in dequantize]
    return inputs, outputs


def serialize(edge, slots=None, share: bool = True,
              share_tables: bool = True) -> tuple[bytes, object, tuple]:
    """ExecuTorch's memory planning and emitter. `slots` (platforms.arena_planning.ArenaSlot):
    the regions the activations may use, fastest first; each becomes one planned buffer. Returns
    the .pte bytes, the schema Program and the ArenaRecord of the planning. With `share`, equal
    read-only scalar and list values are emitted once (orchestrator/compilation/share_values.py);
    with `share_tables`, equal flatbuffer tables, vectors and strings are written once
    (orchestrator/compilation/share_tables.py)."""
    record = ArenaRecord()
    config = ExecutorchBackendConfig(extract_delegate_segments=False)
    program_state.initialized(edge.exported_program())  # state starts from its initial value
    if slots:
        config = ExecutorchBackendConfig(
            extract_delegate_segments=False,
            memory_planning_pass=MemoryPlanningPass(planning_algorithm(slots, record)))
    program = edge.to_executorch(config)
    if not share and not share_tables:
        return bytes(program.buffer), program.executorch_program, record
    pte = upstream_exir.read_pte(bytes(program.buffer))
    pte = replace(pte, program=copy_outputs_in_asked_order(pte.program))
    if share:
        pte = replace(pte, program=sharing.share_values(pte.program)[0])
    pte_bytes = tables.write_pte(pte) if share_tables else upstream_exir.write_pte(pte)
    return pte_bytes, pte.program, record


_DIM_ORDER_COPY_OPS = tuple("::".join(parts) for parts in DIM_ORDER_COPIES)


def copy_outputs_in_asked_order(program):
    """`program` with each dim-order copy's output tensor written in the dim order the copy
    asks for, where upstream's stride-derived order differs from it only in a size-1
    dimension's place (partitioners/legalize.py: size1_copy_orders): the same bytes, and the
    copy kernel's literal check (`out_dim_order[i] == dim_order_ref[i]`) passes."""
    from executorch.exir import schema  # lazy: heavy (executorch)

    plan = program.execution_plan[0]
    values = list(plan.values)
    changed = False
    for chain in plan.chains:
        for instruction in chain.instructions:
            call = instruction.instr_args
            if not isinstance(call, schema.KernelCall) or \
                    plan.operators[call.op_index].name not in _DIM_ORDER_COPY_OPS:
                continue
            # (self, non_blocking, dim_order, out, out): the out variant's arguments
            order, out = values[call.args[2]].val, values[call.args[3]].val
            if not isinstance(order, schema.IntList) or not isinstance(out, schema.Tensor):
                continue
            asked = [values[i].val.int_val for i in order.items]
            written = list(out.dim_order)
            if asked != written and same_bytes_order(list(out.sizes), asked, written):
                values[call.args[3]] = schema.EValue(replace(out, dim_order=asked))
                changed = True
    if not changed:
        return program
    return replace(program, execution_plan=[replace(plan, values=values),
                                            *program.execution_plan[1:]])


@dataclass(frozen=True)
class CompileOptions:
    """`channels_last`/`check_boundary_layouts` off reproduce upstream's NCHW flow; `legalize`
    off keeps the ops the device's portable kernels cannot run as upstream leaves them;
    `prune_constants` off keeps the dead constants upstream serializes; `share_values` off keeps
    one value per argument as the emitter writes them; `share_tables` off writes the `.pte` with
    ExecuTorch's serializer (one flatbuffer object per schema object, 128-byte segment
    alignment)."""

    channels_last: bool = True
    check_boundary_layouts: bool = True
    legalize: bool = True
    prune_constants: bool = True
    policy: Policy | None = None  # nodes forced to the CPU
    memory_policy: MemoryPolicy | None = None  # None: auto
    io_auto: bool = False  # --io auto: compile both I/O types, keep the smaller arena (choose_io)
    share_values: bool = True
    share_tables: bool = True


@dataclass(frozen=True)
class CompileState:
    """What the stages have produced so far; each stage returns a copy with its fields set."""

    model: LoadedModel
    calibration: Calibration
    target: Target
    options: CompileOptions
    work_dir: Path
    cache_key: str | None = None  # orchestrator/artifacts/cache.py: capture + quantization by content
    cache_hit: bool = False
    captured: Captured | None = None
    quantized: Quantized | None = None
    lowered: Lowered | None = None  # after quantize_io: the program handed to the CPU passes
    lowered_float_io: Lowered | None = None  # before quantize_io (choose_io starts from it)
    io_quant: dict[str, float | int] = field(default_factory=dict)
    pre_cpu: dict[str, tuple] = field(default_factory=dict)  # nodes before the CPU passes
    routed_edge: EdgeProgramManager | None = None  # holding the CPU-routed program
    final_program: torch.export.ExportedProgram | None = None
    cpu_decisions: dict[str, CpuDecision] = field(default_factory=dict)
    workarounds: tuple[Workaround, ...] = ()
    model_workarounds: tuple[Workaround, ...] = ()  # capture's legalizations (Conv1d as Conv2d)
    boundaries: tuple[BoundaryTensor, ...] = ()
    placements: tuple[OpPlacement, ...] = ()
    pruned_constants: tuple[PrunedConstant, ...] = ()  # dead bytes not shipped
    pte_bytes: bytes = b""
    executorch_program: Program | None = None
    arena_record: ArenaRecord | None = None
    io_choice: IoChoice | None = None  # choose_io
    device_run: DeviceRun | None = None  # run_on_device


def _capture_stage(state: CompileState) -> CompileState:
    """torch.export in channels_last, so every CPU/NPU boundary is NHWC on both sides (or the
    cached capture and quantization of the same content, orchestrator/artifacts/cache.py)."""
    channels_last = state.options.channels_last
    device_check.prestart()
    workarounds = ()
    if state.options.legalize:
        module, fixes = conv1d_as_conv2d(state.model.module, pools_only=bool(state.target.npu))
        if not state.target.npu and state.target.tier == "mve":
            module, explicit = mve_1xn_padding_explicit(module, state.model.example_inputs)
            fixes += explicit
        if not state.target.npu and channels_last:
            module, relaid = conv_inputs_channels_last(
                module, state.model.example_inputs, precision.raised(state.calibration.precision))
            fixes += relaid
        policy = state.options.policy
        if state.target.npu and policy is not None and policy.pool_windows:
            module, windows = avg_pools_over_their_window(module, state.model.example_inputs)
            fixes += windows
        if fixes:
            state = replace(state, model=replace(state.model, module=module))
            workarounds = tuple(fixes)
    state = replace(state, model_workarounds=workarounds)
    # The key reads every submodule's source and hashes every weight: only worth it when the
    # cache is on (ORCHESTRATE_CACHE=off).
    key = cache.quantized_key(state.model, state.calibration, state.target, channels_last,
                              state.options.legalize, _per_step(state)) \
        if cache.cache_dir() else None
    hit = cache.load(key) if key else None
    if hit is not None:
        inputs = tuple(_to_channels_last(x) if channels_last else x
                       for x in state.model.example_inputs)
        return replace(state, cache_key=key, cache_hit=True,
                       captured=Captured(hit[0], inputs, channels_last),
                       quantized=Quantized(hit[1], None, inputs, hit[2]))
    return replace(state, cache_key=key, captured=capture(state.model, channels_last))


def _quantize_stage(state: CompileState) -> CompileState:
    """EthosUQuantizer (NPU targets) or CortexMQuantizer (CPU-only), calibrated on the samples."""
    if state.cache_hit:
        return replace(state, model_workarounds=state.model_workarounds
                       + state.quantized.workarounds)
    quantized = quantize(state.captured, state.calibration, state.target,
                         state.options.legalize, _per_step(state), state.model.quantization)
    if state.cache_key:
        cache.store(state.cache_key, state.captured.program, quantized.program,
                    quantized.workarounds)
    return replace(state, quantized=quantized,
                   model_workarounds=state.model_workarounds + quantized.workarounds)


def _per_step(state: CompileState) -> bool:  # partitioners/policy.py RECURRENCES
    return state.options.policy is None or state.options.policy.recurrences == "per-step"


def _lower_stage(state: CompileState) -> CompileState:
    """to_edge + EthosUPartitioner + Vela per partition (or the Cortex-M edge config)."""
    try:
        return replace(state, lowered=lower(state.quantized, state.target, state.work_dir,
                                            state.options.policy))
    except VelaRefusal as error:
        who = VELA_REFUSAL if error.by_vela else LOWERING_REFUSAL
        raise NpuPartitionRefused(
            f"stage lower failed in upstream code: {error} ({state.target.npu}; the planner "
            "moves the partition's ops to the CPU and compiles again)", error.nodes,
            f"{who} the NPU partition it was in for {state.target.npu} "
            f"({error.message})") from error


def _quantize_io_stage(state: CompileState) -> CompileState:
    """--io int8: the program takes and returns int8 (config methods carry the parameters)."""
    lowered, io_quant = quantize_io(state.lowered, state.target)
    return replace(state, lowered=lowered, io_quant=io_quant, lowered_float_io=state.lowered,
                   pre_cpu=snapshot_pre_cpu(lowered.edge.exported_program()))


def _refuse_transpose_conv_cmsis_nn_misreads(edge_program, npu: str) -> None:
    """A quantized transposed convolution left on the CPU of an NPU target that CMSIS-NN would
    compute wrong: upstream's Cortex-M pass makes it `cortex_m::quantized_transpose_conv2d`
    without its groups (a groups=2 layer of 8 output channels computed 4, and verify ended in
    an internal error), or with a dilation CMSIS-NN's transposed convolution ignores
    (arm_transpose_conv_s8 has none; dilation 2: 570 of 576 outputs wrong on the host runtime
    and QEMU, the twin right); no float path takes its per-channel weights. Refused in one
    line; CPU-only, the compile splits a grouped one per group (partitioners/quantizable.py)
    and leaves a dilated one to the portable kernel."""
    for node in edge_program.graph.nodes:
        if node.op != "call_function" or "convolution" not in str(node.target):
            continue
        args = list(node.args) + [None] * 9
        if not args[6]:
            continue
        if args[8] and int(args[8]) > 1:
            raise UnsupportedModel(
                f"a transposed convolution of {int(args[8])} groups ({node.name}) stays on the "
                f"CPU for {npu}, where ExecuTorch's Cortex-M passes drop its groups (CMSIS-NN's "
                "transposed convolution has none) and no float kernel takes its per-channel "
                "weights; compile it CPU-only (--npu none: one CMSIS-NN transposed convolution "
                "per group), or use groups=1")
        if args[5] and any(int(d) != 1 for d in args[5]):
            raise UnsupportedModel(
                f"a transposed convolution of dilation {tuple(int(d) for d in args[5])} "
                f"({node.name}) stays on the CPU for {npu}, where ExecuTorch's Cortex-M passes "
                "hand it to CMSIS-NN's arm_transpose_conv_s8, which has no dilation and "
                "computes other values, and no float kernel takes its per-channel weights; "
                "compile it CPU-only (--npu none: the portable kernel runs it), or use "
                "dilation=1")


def _route_cpu_stage(state: CompileState) -> CompileState:
    """CortexMPassManager for the core's ISA tier, then the device legalizations."""
    if state.target.npu:
        _refuse_transpose_conv_cmsis_nn_misreads(state.lowered.edge.exported_program(),
                                                 state.target.npu)
    forced = [name for name, r in state.lowered.npu_rejections.items()
              if r.policy_rule or r.device_refusal]
    program, decisions, workarounds = route_to_cpu(state.lowered.edge, state.target.cpu,
                                                   state.options.legalize, forced)
    return replace(state, final_program=program, cpu_decisions=decisions, workarounds=(
                   *state.model_workarounds, *state.lowered.workarounds, *workarounds),
                   routed_edge=upstream_exir.with_forward(state.lowered.edge, program))


def _check_boundaries_stage(state: CompileState) -> CompileState:
    """Every tensor crossing a CPU/NPU boundary is written and read in the same dim_order."""
    if not state.options.check_boundary_layouts:
        return replace(state, boundaries=tuple(boundary_tensors(state.final_program)))
    try:
        return replace(state, boundaries=tuple(check_boundaries(state.final_program)))
    except BoundaryLayoutError as error:
        raise OrchestrateError(str(error)) from None


def _place_stage(state: CompileState) -> CompileState:
    """One OpPlacement per op; reads the graph before serialization rewrites it to out-variants."""
    return replace(state, placements=place(state.final_program, state.lowered,
                                           state.cpu_decisions, state.pre_cpu, state.target))


def _prune_constants_stage(state: CompileState) -> CompileState:
    """Drop constants no instruction reads (upstream keeps them; orchestrator/compilation/prune.py)."""
    program, removed = (prune_unused_constants(state.final_program)
                        if state.options.prune_constants else (None, ()))
    if not removed:
        return state
    return replace(state, final_program=program, pruned_constants=removed,
                   routed_edge=upstream_exir.with_forward(state.lowered.edge, program))


def _arena_slots(state: CompileState):
    return arena_slots(state.target.platform, state.options.memory_policy or MemoryPolicy())


def _run_on_device_stage(state: CompileState) -> CompileState:
    """Run the serialized program once in the real ExecuTorch runtime (host build of the device
    kernels); a kernel's dim-order refusal becomes a layout copy, any other refusal stops the
    compile (orchestrator/compilation/device_check.py)."""
    slots = _arena_slots(state)

    def serialize_copy(program):
        return serialize(upstream_exir.with_forward(state.lowered.edge, program), slots,
                         state.options.share_values, state.options.share_tables)

    sample = state.calibration.samples[0] if state.calibration.samples else \
        tuple(state.model.example_inputs)
    run, serialized, program, fixes = device_check.check_on_device(
        state.final_program, serialize_copy, sample, state.io_quant, state.options.legalize,
        state.target.npu, {r.payload_sha256: r.tosa_bytes for r in state.lowered.vela_runs})
    legalized = bool(fixes)
    # A legalization the device check repeats (a size-1 copy's order, each copy) is told once.
    fixes = tuple(dict.fromkeys(fix for fix in fixes if fix not in state.workarounds))
    if serialized is None:
        return replace(state, device_run=run, workarounds=state.workarounds + fixes)
    if legalized:  # even when every fix repeats one already reported: the graph changed
        # The legalized graph gets its placement rows again (the layout copies are CPU work).
        state = replace(state, placements=place(state.final_program, state.lowered,
                                                state.cpu_decisions, state.pre_cpu,
                                                state.target))
    pte_bytes, executorch_program, record = serialized
    return replace(state, device_run=run, workarounds=state.workarounds + fixes,
                   final_program=program, pte_bytes=pte_bytes,
                   executorch_program=executorch_program, arena_record=record)


def _serialize_stage(state: CompileState) -> CompileState:
    """ExecuTorch's memory planning (activations split over the regions the memory policy
    allows, platforms/arena_planning.py) and emitter: the .pte bytes (already made by
    run_on_device when the real runtime ran it)."""
    if state.pte_bytes:
        return state
    pte_bytes, program, record = serialize(state.routed_edge, _arena_slots(state),
                                           state.options.share_values,
                                           state.options.share_tables)
    return replace(state, pte_bytes=pte_bytes, executorch_program=program, arena_record=record)


@dataclass(frozen=True)
class IoChoice:
    """What `--io auto` measured and chose: each I/O type's arena and .pte bytes (ExecuTorch's
    memory plan of the program compiled that way), or why one could not be compiled."""

    chosen: str
    reason: str
    arena_bytes: dict  # io -> bytes (measured: ExecuTorch memory plan)
    pte_bytes: dict  # io -> bytes
    refused: dict = field(default_factory=dict)  # io -> why it was not possible

    def to_json(self) -> dict:
        return {"chosen": self.chosen, "reason": self.reason, "arena_bytes": self.arena_bytes,
                "pte_bytes": self.pte_bytes, "refused": self.refused,
                "source": "measured: ExecuTorch memory plan of each compiled program"}


def _choose_io_stage(state: CompileState) -> CompileState:
    """--io auto: compile the CPU side again with the other I/O type and keep the smaller arena
    among the types the platform's firmware accepts (`firmware_io` in its YAML)."""
    if not state.options.io_auto:
        return state
    platform = state.target.platform
    other_io = "int8" if state.target.io == "float" else "float"
    # From the lowered program on, nothing of the first compile is carried over.
    start = CompileState(state.model, state.calibration, replace(state.target, io=other_io),
                         replace(state.options, io_auto=False), state.work_dir, state.cache_key,
                         state.cache_hit, state.captured, state.quantized,
                         lowered=state.lowered_float_io,
                         model_workarounds=state.model_workarounds)
    arena = {state.target.io: ProgramView.of(state.executorch_program).arena_bytes}
    pte = {state.target.io: len(state.pte_bytes)}
    refused, other = {}, None
    if other_io not in platform.firmware_io:
        refused[other_io] = (f"{platform.name}'s firmware does not take {other_io} I/O "
                             f"({platform.firmware_io_source})")
    else:
        try:
            other = run_stages(COMPILE_STAGES[COMPILE_STAGES.index(_STAGE_QUANTIZE_IO):-1],
                               start, {})
            arena[other_io] = ProgramView.of(other.executorch_program).arena_bytes
            pte[other_io] = len(other.pte_bytes)
        except OrchestrateError as error:  # the model refuses it, or upstream fails on it
            refused[other_io] = str(error)
    int8_state = other if other_io == "int8" else state
    float_state = state if other_io == "int8" else other
    if int8_state is not None and float_state is not None and \
            arena["int8"] < arena["float"]:
        chosen = int8_state
        reason = (f"int8 I/O: the arena is {arena['float'] - arena['int8']:,} B smaller "
                  "(the float input/output buffers and their quantize/dequantize go)")
    elif int8_state is None or float_state is None:
        chosen = state
        reason = f"{state.target.io} I/O: {other_io} is not possible: {refused[other_io]}"
    else:
        chosen = float_state
        reason = "float I/O: int8 I/O would not make the arena smaller"
    return replace(chosen, io_choice=IoChoice(chosen.target.io, reason, arena, pte, refused))


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable

    @property
    def doc(self) -> str:
        return (self.run.__doc__ or "").strip().splitlines()[0]


_STAGE_QUANTIZE_IO = Stage("quantize_io", _quantize_io_stage)
COMPILE_STAGES = (
    Stage("capture", _capture_stage),
    Stage("quantize", _quantize_stage),
    Stage("lower", _lower_stage),
    _STAGE_QUANTIZE_IO,
    Stage("route_cpu", _route_cpu_stage),
    Stage("check_boundaries", _check_boundaries_stage),
    Stage("place", _place_stage),
    Stage("prune_constants", _prune_constants_stage),
    Stage("run_on_device", _run_on_device_stage),
    Stage("serialize", _serialize_stage),
    Stage("choose_io", _choose_io_stage),
)


class StageError(OrchestrateError):
    """An upstream component raised inside a stage; the message names the stage."""


class NpuPartitionRefused(StageError):
    """Vela could not compile an NPU partition: its nodes, and why (for the plan's reason)."""

    def __init__(self, message: str, nodes: tuple[str, ...], why: str):
        super().__init__(message)
        self.nodes, self.why = nodes, why


def _root_cause(error: BaseException) -> BaseException:
    """The innermost exception of a chain: upstream pass managers wrap the one that says why
    ("An error occurred when running the 'AtenToCortexMPass' pass") around the real message."""
    seen = set()
    while (error.__cause__ or error.__context__) is not None and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return error


def run_stages(stages, state, seconds: dict[str, float],
               progress: Callable[[str, str, float], None] | None = None):
    """Run `stages` in order on `state`, timing each; `progress(stage, event, seconds)` hears
    "start" and "done"."""
    for stage in stages:
        if progress:
            progress(stage.name, "start", 0.0)
        start = time.perf_counter()
        try:
            with warnings.catch_warnings(), upstream_exir.upstream_shortcuts():
                warnings.simplefilter("ignore")
                state = stage.run(state)
        except OrchestrateError:
            raise
        except Exception as error:  # noqa: BLE001 - upstream code: name the stage, keep the cause
            root = _root_cause(error)
            # torch.fx appends the failing node and a traceback to the message: keep the node.
            text = " ".join(str(root).split("Original traceback:")[0].split())
            raise StageError(f"stage {stage.name} failed in upstream code: "
                             f"{type(root).__name__}: {text[:400]} (an upstream limit for this "
                             "model or target; --verbose shows the traceback)") from error
        seconds[stage.name] = time.perf_counter() - start
        if progress:
            progress(stage.name, "done", seconds[stage.name])
    return state


def compile_model(model: LoadedModel, calibration: Calibration, target: Target, *,
                  work_dir: Path | None = None, channels_last: bool = True,
                  check_boundary_layouts: bool = True, legalize: bool = True,
                  prune_constants: bool = True, policy=None, memory_policy=None,
                  io_auto: bool = False, share_values: bool = True, share_tables: bool = True,
                  progress: Callable[[str, str, float], None] | None = None) -> Compiled:
    """Run COMPILE_STAGES (see CompileOptions for the switches)."""
    fx_code_cache.install()
    if work_dir is None:
        # Vela's per-partition outputs live here until `write_outputs` copies them; a plan
        # that writes no .pte must not leave them behind.
        work_dir = Path(tempfile.mkdtemp(prefix="orchestrate-"))
        atexit.register(shutil.rmtree, work_dir, ignore_errors=True)
    seconds: dict[str, float] = {}
    state = run_stages(COMPILE_STAGES, CompileState(
        model, calibration, target,
        CompileOptions(channels_last, check_boundary_layouts, legalize, prune_constants, policy,
                       memory_policy, io_auto, share_values, share_tables),
        Path(work_dir)),
        seconds, progress)
    return Compiled(model, state.target, calibration, state.captured, state.quantized, state.lowered,
                    state.final_program, state.cpu_decisions, state.boundaries, state.placements,
                    state.pte_bytes, state.executorch_program, state.io_quant, state.workarounds,
                    seconds, Path(work_dir), state.pruned_constants, state.cache_hit,
                    state.arena_record.arenas, dict(state.arena_record.mem_id_of or {}),
                    state.io_choice, state.device_run)
