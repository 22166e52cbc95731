"""The compile pipeline, one stage per function, each taking the previous stage's value.

    capture -> quantize -> lower (EthosUPartitioner + Vela | Cortex-M edge) -> quantize_io
            -> route_cpu (CortexMPassManager) -> check_boundaries -> serialize

`compile_model` runs them in that order; `plan` and `compile` share it.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from orchestrator import numerics
from orchestrator.errors import OrchestrateError, UserError
from orchestrator.sources import Calibration, LoadedModel
from orchestrator.target import Target
from orchestrator.placement import place, snapshot_pre_cpu
from partitioners.boundary import (BoundaryLayoutError, BoundaryTensor, boundary_tensors,
                                   check_boundaries)
from partitioners.cpu import CpuDecision, route_to_cpu
from partitioners.npu import NpuRejection, VelaRun, lower_to_npu


@dataclass(frozen=True)
class Captured:
    program: torch.export.ExportedProgram
    example_inputs: tuple[torch.Tensor, ...]
    channels_last: bool


@dataclass(frozen=True)
class Quantized:
    program: torch.export.ExportedProgram
    reference: torch.fx.GraphModule  # convert_pt2e output: the quantized PyTorch reference
    example_inputs: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Lowered:
    edge: object  # EdgeProgramManager
    npu_rejections: dict[str, NpuRejection]
    vela_runs: tuple[VelaRun, ...]


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
    placements: tuple  # orchestrator.placement.OpPlacement, in execution order
    pte_bytes: bytes
    executorch_program: object  # exir schema Program (execution plans, delegates)
    io_quant: dict  # config-method name -> value, for --io int8
    workarounds: tuple = ()  # partitioners.cpu.Workaround: upstream defects corrected
    stage_seconds: dict[str, float] = field(default_factory=dict)
    work_dir: Path | None = None

    @property
    def arena_bytes(self) -> int:
        """ExecuTorch's planned arena (sum of non-constant buffers; index 0 is reserved)."""
        return int(sum(self.executorch_program.execution_plan[0].non_const_buffer_sizes))


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


def capture(model: LoadedModel, channels_last: bool = True) -> Captured:
    """torch.export in channels_last, so every CPU/NPU boundary is NHWC on both sides."""
    module = model.module.eval()
    inputs = tuple(model.example_inputs)
    if channels_last:
        module = module.to(memory_format=torch.channels_last)  # parameters; inputs below
        inputs = tuple(_to_channels_last(x) for x in inputs)
    try:
        program = torch.export.export(module, inputs, strict=True)
    except Exception as error:  # noqa: BLE001 - the user's model failed to trace
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise UserError(
            f"torch.export could not capture model '{model.name}': {type(error).__name__}: "
            f"{first_line[:200]}; make the model exportable with torch.export(strict=True)"
        ) from None
    return Captured(program, inputs, channels_last)


def _quantizer(target: Target):
    if target.npu:
        from executorch.backends.arm.quantizer import (
            EthosUQuantizer,
            get_symmetric_quantization_config,
        )

        quantizer = EthosUQuantizer(compile_spec(target))
        quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
        return quantizer
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

    return CortexMQuantizer()


def compile_spec(target: Target):
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    return EthosUCompileSpec(target.npu, system_config=target.system_config,
                             memory_mode=target.memory_mode)


def quantize(captured: Captured, calibration: Calibration, target: Target) -> Quantized:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    # torch 2.13 puts a `_guards_fn` call_module in `.module()`; both quantizers reject it
    # ("call_module is not supported"), so guards are dropped here.
    prepared = prepare_pt2e(captured.program.module(check_guards=False), _quantizer(target))
    with torch.no_grad(), numerics.single_threaded():
        for sample in calibration.samples:
            prepared(*(_to_channels_last(x) if captured.channels_last else x for x in sample))
    reference = convert_pt2e(prepared)
    program = torch.export.export(reference, captured.example_inputs, strict=True)
    return Quantized(program, reference, captured.example_inputs)


def lower(quantized: Quantized, target: Target, work_dir: Path) -> Lowered:
    if target.npu:
        edge, rejections, runs = lower_to_npu(quantized.program, compile_spec(target), work_dir)
    else:
        from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
        from executorch.exir import to_edge_transform_and_lower

        edge = to_edge_transform_and_lower(quantized.program,
                                           compile_config=cortex_m_edge_compile_config())
        rejections, runs = {}, []
    return Lowered(edge, rejections, tuple(runs))


def quantize_io(lowered: Lowered, target: Target) -> tuple[Lowered, dict]:
    """`--io int8`: the program takes and returns int8, so no fp32 I/O buffer sits in the arena.

    Upstream's QuantizeInputs/QuantizeOutputs remove the first quantize and the last dequantize
    and record each scale/zero point as config methods (e.g. `input0_scale`) in the .pte, which a
    firmware reads to quantize its input.
    """
    if target.io != "int8":
        return lowered, {}
    from executorch.exir.passes.quantize_io_pass import QuantizeInputs, QuantizeOutputs

    edge = lowered.edge
    program = edge.exported_program()
    n_inputs = len(program.graph_signature.user_inputs)
    n_outputs = len(program.graph_signature.user_outputs)
    try:
        edge = edge.transform([QuantizeInputs(edge, list(range(n_inputs))),
                               QuantizeOutputs(edge, list(range(n_outputs)))])
    except ValueError as error:
        raise UserError(f"--io int8 is not possible for this model: {error}") from None
    return replace(lowered, edge=edge), dict(edge._config_methods or {})


def serialize(edge) -> tuple[bytes, object]:
    from executorch.exir import ExecutorchBackendConfig

    program = edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=False))
    return bytes(program.buffer), program.executorch_program


def compile_model(model: LoadedModel, calibration: Calibration, target: Target, *,
                  work_dir: Path | None = None, channels_last: bool = True,
                  check_boundary_layouts: bool = True, legalize: bool = True) -> Compiled:
    """Run every stage; `channels_last`/`check_boundary_layouts` off reproduce upstream's NCHW
    flow, `legalize` off keeps the ops the device's portable kernels cannot run as upstream
    leaves them (partitioners/legalize.py)."""
    if work_dir is None:
        # Vela's per-partition outputs live here until `write_outputs` copies them; a plan
        # that writes no .pte must not leave them behind.
        work_dir = Path(tempfile.mkdtemp(prefix="orchestrate-"))
        atexit.register(shutil.rmtree, work_dir, ignore_errors=True)
    work_dir = Path(work_dir)
    seconds: dict[str, float] = {}

    def timed(stage, fn, *args):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = fn(*args)
        seconds[stage] = time.perf_counter() - start
        return result

    captured = timed("capture", capture, model, channels_last)
    quantized = timed("quantize", quantize, captured, calibration, target)
    try:
        lowered = timed("lower", lower, quantized, target, work_dir)
    except UserError:
        raise
    except Exception as error:  # noqa: BLE001
        raise OrchestrateError(f"lowering failed in upstream code: {type(error).__name__}: "
                               f"{str(error).splitlines()[0] if str(error) else ''}") from error
    lowered, io_quant = quantize_io(lowered, target)
    pre_cpu = snapshot_pre_cpu(lowered.edge.exported_program())
    final_program, decisions, workarounds = timed("route_cpu", route_to_cpu, lowered.edge,
                                                  target.cpu, legalize)
    if check_boundary_layouts:
        try:
            boundaries = tuple(check_boundaries(final_program))
        except BoundaryLayoutError as error:
            raise OrchestrateError(str(error)) from None
    else:
        boundaries = tuple(boundary_tensors(final_program))
    # Placement reads the graph before serialization, which rewrites it into out-variants.
    placements = timed("place", place, final_program, lowered, decisions, pre_cpu, target)
    pte_bytes, et_program = timed("serialize", serialize, lowered.edge)
    return Compiled(model, target, calibration, captured, quantized, lowered, final_program, decisions,
                    boundaries, placements, pte_bytes, et_program, io_quant, workarounds,
                    seconds, work_dir)
