"""CPU cost of an op on a Cortex-M core: CMSIS-NN (int8), portable kernels (float), and the
hidden work around NPU partitions.

The model lives here, once; every number it uses lives in data/cpu_cost.yaml with its source.

CMSIS-NN, ops with MACs (conv, depthwise_conv, fully_connected, batch_matmul):

    cycles = op_overhead_cycles
           + macs / (conv_macs_per_cycle * kind_efficiency * lane_utilization)
           + im2col_bytes * im2col_cycles_per_byte + im2col_taps * im2col_cycles_per_tap
           + output_elements * per_output_cycles
           + streamed_weight_bytes / weight_bytes_per_cycle

  - kind_efficiency is 1 for conv/fc/bmm and the tier's depthwise_efficiency for depthwise:
    CMSIS-NN's depthwise kernels accumulate in fewer lanes than its matrix-multiply core.
  - lane_utilization is the fraction of SIMD lanes doing work: the reduction depth (k_h*k_w*C_in)
    of a conv/fc padded to the tier's conv_lanes, the channels of a depthwise to depthwise_lanes.
  - im2col_bytes: the C_in slices the kernel gathers per output pixel per tap (not for 1x1
    convs, which CMSIS-NN reads in place (arm_convolve_1x1_s8_fast); not for depthwise on
    tiers whose depthwise kernel reads its input in place); im2col_taps: how many slices, each
    costing a bounds check, an address computation and a copy call whatever its size.
  - per_output_cycles: requantize, clamp, store and the matrix loop's per-output bookkeeping;
    never below the tier's per_output_floor_cycles (saturate + store), which fit() enforces.
  - streamed_weight_bytes: fully-connected weights are used once per inference (batch 1), so
    they stream from wherever they live (flash, usually) at weight_bytes_per_cycle.

CMSIS-NN, data-movement ops (pools, add, mul, relu, softmax, LUT activations, pad, transpose,
copy): op_overhead_cycles + elements * the tier's cycles per element of that kind, elements
being input elements for pools (the window reads dominate) and output elements otherwise.
quantize/dequantize run float math: cycles per element depend on whether the core has an FPU.

Portable (ExecuTorch portable kernels, float): op_overhead_cycles + macs * (conv_mac_cycles or
matmul_mac_cycles) + elements * element_cycles, plus dequantizing the op's int8 inputs and
weights and quantizing its outputs, since a portable op sits between dq/q nodes of the int8
graph. A portable dim-order copy (`_to_dim_order_copy`, `_clone_dim_order`: the layout copies
the compile inserts) moves the int8 elements as they are: op_overhead_cycles + elements *
element_cycles, no dequantize or quantize (portable_copy_cost). It is not a byte permute at
arm_transpose_s8's rate: QEMU counts 52.7 instructions per element for it on the Cortex-M55
(a [1, 8, 12, 12] int8 copy, 62,405 instructions), where the transpose rate gave 1 cycle.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any, Iterator, Mapping

import yaml

from cost_models.cost import Cost
from cost_models.op_shapes import OP_KINDS, OpShape, im2col_bytes, im2col_taps

TIERS = ("scalar", "dsp", "mve")
MAC_KINDS = frozenset({"conv", "depthwise_conv", "fully_connected", "batch_matmul"})
# Kinds charged per input element (a pool reads its whole window); the rest per output element.
_PER_INPUT_KINDS = frozenset({"avg_pool", "max_pool"})
_FLOAT_KINDS = frozenset({"quantize", "dequantize"})
ELEMENT_KINDS = OP_KINDS - MAC_KINDS - _FLOAT_KINDS
TRANSITION_KINDS = ("npu_invocation", "quantize", "dequantize", "layout_copy")


@dataclass(frozen=True)
class CoreFacts:
    """What the core is, from Arm's documentation."""

    tier: str
    has_fpu: bool
    dcache_line_bytes: int  # 0: no data cache, so the NPU driver's cache maintenance is free
    coremark_per_mhz: float


@dataclass(frozen=True)
class CmsisNNRates:
    """Per-core CMSIS-NN figures (calibrated, or derived from a calibrated core)."""

    conv_macs_per_cycle: float
    per_output_cycles: float
    weight_bytes_per_cycle: float
    op_overhead_cycles: float


@dataclass(frozen=True)
class TierKernels:
    """What the CMSIS-NN code path of an ISA tier looks like, from its source."""

    conv_lanes: int
    depthwise_lanes: int
    depthwise_efficiency: float
    depthwise_gathers: bool  # True when the depthwise kernel builds an im2col buffer
    im2col_cycles_per_byte: float
    im2col_cycles_per_tap: float
    # The fewest cycles any int8 kernel of the tier spends per output (saturate + store): a
    # physical lower bound on per_output_cycles that fit() enforces, not a fitted value.
    per_output_floor_cycles: float
    element_cycles: Mapping[str, float]  # per data-movement kind; transpose doubles as layout copy


@dataclass(frozen=True)
class PortableRates:
    conv_mac_cycles: float  # conv / depthwise: op_convolution's index arithmetic per MAC
    matmul_mac_cycles: float  # fully_connected / batch_matmul: vec_ops matmul loop per MAC
    element_cycles: float


@dataclass(frozen=True)
class IndexWalk:
    """Per tensor operand and output element, in units of the core's portable element_cycles:
    the generic path of ExecuTorch's portable elementwise kernels, which walks every tensor by
    index (BroadcastIndexesRange) and loads and stores through dtype-converting function
    pointers; `broadcast` when an input is broadcast."""

    generic_operand_elements: float
    broadcast_operand_elements: float


@dataclass(frozen=True)
class Transitions:
    npu_invocation_cycles: float
    cache_maintenance_cycles_per_line: float
    # The CPU's side of one EthosUBackend::execute in instructions: a fixed part and the copy of
    # the delegate's inputs into the NPU scratch and its outputs back (per byte).
    npu_invocation_instructions: float
    npu_io_copy_instructions_per_byte: float
    quantize_cycles_per_element: Mapping[str, float]  # keyed "fpu" / "soft_float"
    dequantize_cycles_per_element: Mapping[str, float]


@dataclass(frozen=True)
class CalibrationPoint:
    """One public latency we compare the model with."""

    core: str
    board: str
    cpu_hz: int
    software: str
    model: str
    task: str
    latency_s: float
    role: str  # "fit": used to calibrate; "validate": kept aside
    source: str


@dataclass(frozen=True)
class CpuCostData:
    cores: Mapping[str, CoreFacts]
    cmsis_nn: Mapping[str, CmsisNNRates]
    tiers: Mapping[str, TierKernels]
    portable: Mapping[str, PortableRates]
    index_walk: IndexWalk
    transitions: Transitions
    calibration: tuple[CalibrationPoint, ...]
    calibration_split: str


def _value(node: Any, where: str) -> Any:
    if not isinstance(node, dict) or "value" not in node or not str(node.get("source", "")).strip():
        raise ValueError(f"cpu_cost.yaml: {where} must be {{value: ..., source: ...}} with a source")
    return node["value"]


def _load(raw: dict) -> CpuCostData:
    cores = {
        name: CoreFacts(
            tier=_value(core["tier"], f"cores.{name}.tier"),
            has_fpu=bool(_value(core["has_fpu"], f"cores.{name}.has_fpu")),
            dcache_line_bytes=int(_value(core["dcache_line_bytes"], f"cores.{name}.dcache_line_bytes")),
            coremark_per_mhz=float(_value(core["coremark_per_mhz"], f"cores.{name}.coremark_per_mhz")),
        )
        for name, core in raw["cores"].items()
    }
    for name, core in cores.items():
        if core.tier not in TIERS:
            raise ValueError(f"cpu_cost.yaml: cores.{name}.tier {core.tier!r} is not one of {TIERS}")
    cmsis_nn = _cmsis_nn_rates(raw["cmsis_nn"], cores)
    tiers = {}
    for name, tier in raw["tiers"].items():
        fields = {k: _value(v, f"tiers.{name}.{k}") for k, v in tier.items() if k != "element_cycles"}
        element_cycles = {
            kind: float(_value(v, f"tiers.{name}.element_cycles.{kind}"))
            for kind, v in tier["element_cycles"].items()
        }
        missing = ELEMENT_KINDS - element_cycles.keys()
        if missing:
            raise ValueError(f"cpu_cost.yaml: tiers.{name}.element_cycles lacks {sorted(missing)}")
        tiers[name] = TierKernels(element_cycles=MappingProxyType(element_cycles), **fields)
    portable = {
        name: PortableRates(**{k: float(_value(v, f"portable.{name}.{k}")) for k, v in rates.items()})
        for name, rates in raw["portable"].items()
    }
    walk = raw["index_walk"]
    index_walk = IndexWalk(**{k: float(_value(v, f"index_walk.{k}")) for k, v in walk.items()})
    t = raw["transitions"]
    transitions = Transitions(
        npu_invocation_cycles=float(_value(t["npu_invocation_cycles"], "transitions.npu_invocation_cycles")),
        cache_maintenance_cycles_per_line=float(
            _value(t["cache_maintenance_cycles_per_line"], "transitions.cache_maintenance_cycles_per_line")
        ),
        npu_invocation_instructions=float(
            _value(t["npu_invocation_instructions"], "transitions.npu_invocation_instructions")),
        npu_io_copy_instructions_per_byte=float(
            _value(t["npu_io_copy_instructions_per_byte"],
                   "transitions.npu_io_copy_instructions_per_byte")),
        quantize_cycles_per_element=MappingProxyType(
            {k: float(_value(v, f"transitions.quantize_cycles_per_element.{k}"))
             for k, v in t["quantize_cycles_per_element"].items()}
        ),
        dequantize_cycles_per_element=MappingProxyType(
            {k: float(_value(v, f"transitions.dequantize_cycles_per_element.{k}"))
             for k, v in t["dequantize_cycles_per_element"].items()}
        ),
    )
    calibration = tuple(
        CalibrationPoint(latency_s=float(p["latency_ms"]) / 1e3,
                         **{k: v for k, v in p.items() if k != "latency_ms"})
        for p in raw["calibration"]["points"]
    )
    for point in calibration:
        if point.role not in ("fit", "validate"):
            raise ValueError(f"cpu_cost.yaml: calibration point role {point.role!r} is not fit/validate")
    for section, names in (("cmsis_nn", cmsis_nn), ("portable", portable)):
        if names.keys() != cores.keys():
            raise ValueError(f"cpu_cost.yaml: {section} cores {sorted(names)} != cores {sorted(cores)}")
    return CpuCostData(
        cores=MappingProxyType(cores),
        cmsis_nn=MappingProxyType(cmsis_nn),
        tiers=MappingProxyType(tiers),
        portable=MappingProxyType(portable),
        index_walk=index_walk,
        transitions=transitions,
        calibration=calibration,
        calibration_split=str(raw["calibration"]["split"]),
    )


def _cmsis_nn_rates(section: dict, cores: Mapping[str, CoreFacts]) -> dict[str, CmsisNNRates]:
    """Per-core rates: given ones as they are, derived ones from their base core.

    A derived core keeps its base's memory system (weight_bytes_per_cycle), scales the MAC rate
    by its mac_rate_ratio, and scales the scalar work (per-output bookkeeping, op dispatch) by
    the ratio of CoreMark/MHz, the one Arm-published figure of scalar speed per clock.
    """
    given = {
        name: CmsisNNRates(**{k: float(_value(v, f"cmsis_nn.{name}.{k}")) for k, v in rates.items()})
        for name, rates in section.items()
        if "derived_from" not in rates
    }
    derived = {}
    for name, rates in section.items():
        if "derived_from" not in rates:
            continue
        base_name = _value(rates["derived_from"], f"cmsis_nn.{name}.derived_from")
        if base_name not in given:
            raise ValueError(f"cpu_cost.yaml: cmsis_nn.{name} derives from {base_name!r}, which has no given rates")
        base = given[base_name]
        mac_ratio = float(_value(rates["mac_rate_ratio"], f"cmsis_nn.{name}.mac_rate_ratio"))
        scalar_ratio = cores[base_name].coremark_per_mhz / cores[name].coremark_per_mhz
        derived[name] = CmsisNNRates(
            conv_macs_per_cycle=base.conv_macs_per_cycle * mac_ratio,
            per_output_cycles=base.per_output_cycles * scalar_ratio,
            weight_bytes_per_cycle=base.weight_bytes_per_cycle,
            op_overhead_cycles=base.op_overhead_cycles * scalar_ratio,
        )
    return given | derived


def cpu_cost_yaml() -> dict:
    """The raw YAML (with every figure's source), for reports and the source check."""
    text = resources.files("cost_models.data").joinpath("cpu_cost.yaml").read_text()
    return yaml.safe_load(text)


@functools.cache
def load_cpu_cost_data() -> CpuCostData:
    return _load(cpu_cost_yaml())


def iter_figures(node: Any = None, path: str = "") -> Iterator[tuple[str, Any, str]]:
    """Every {value, source} figure of the YAML as (path, value, source)."""
    if node is None:
        node = cpu_cost_yaml()
    if isinstance(node, dict):
        if "value" in node:
            yield path, node["value"], str(node.get("source", ""))
            return
        for key, child in node.items():
            yield from iter_figures(child, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from iter_figures(child, f"{path}[{i}]")


def _core(cpu: str) -> tuple[CpuCostData, CoreFacts]:
    data = load_cpu_cost_data()
    if cpu not in data.cores:
        raise ValueError(f"unknown cpu {cpu!r}; known: {', '.join(sorted(data.cores))}")
    return data, data.cores[cpu]


def _lane_utilization(work: int, lanes: int) -> float:
    if work <= 0 or lanes <= 1:
        return 1.0
    return work / (math.ceil(work / lanes) * lanes)


@dataclass(frozen=True)
class CycleTerms:
    """A CMSIS-NN op's cycles split by the per-core parameter each part scales with.

    cycles = fixed_cycles + mac_work / conv_macs_per_cycle + output_elements * per_output_cycles
             + streamed_weight_bytes / weight_bytes_per_cycle
    The calibration fit solves for those three per-core parameters from these terms.
    """

    fixed_cycles: float
    mac_work: float
    output_elements: int
    streamed_weight_bytes: int

    def cycles(self, rates: CmsisNNRates) -> float:
        return (
            self.fixed_cycles
            + self.mac_work / rates.conv_macs_per_cycle
            + self.output_elements * rates.per_output_cycles
            + self.streamed_weight_bytes / rates.weight_bytes_per_cycle
        )


def _float_mode(core: CoreFacts) -> str:
    return "fpu" if core.has_fpu else "soft_float"


def cmsis_nn_terms(op: OpShape, cpu: str) -> CycleTerms:
    """The CMSIS-NN model of the module docstring, split into CycleTerms."""
    data, core = _core(cpu)
    tier = data.tiers[core.tier]
    overhead = data.cmsis_nn[cpu].op_overhead_cycles
    if op.kind in MAC_KINDS:
        if op.kind == "depthwise_conv":
            efficiency = tier.depthwise_efficiency * _lane_utilization(op.out_channels, tier.depthwise_lanes)
            gathers = tier.depthwise_gathers
        else:
            depth = op.in_channels * op.kernel_hw[0] * op.kernel_hw[1]
            efficiency = _lane_utilization(depth, tier.conv_lanes)
            gathers = True
        gather_cycles = (
            im2col_bytes(op) * tier.im2col_cycles_per_byte + im2col_taps(op) * tier.im2col_cycles_per_tap
            if gathers
            else 0.0
        )
        return CycleTerms(
            fixed_cycles=overhead + gather_cycles,
            mac_work=op.macs / efficiency,
            output_elements=op.elements,
            streamed_weight_bytes=op.weight_bytes if op.kind == "fully_connected" else 0,
        )
    if op.kind in _FLOAT_KINDS:
        per_element = _float_cycles_per_element(data, core, op.kind)
        return CycleTerms(overhead + op.elements * per_element, 0.0, 0, 0)
    elements = op.input_bytes if op.kind in _PER_INPUT_KINDS else op.elements
    return CycleTerms(overhead + elements * tier.element_cycles[op.kind], 0.0, 0, 0)


def _float_cycles_per_element(data: CpuCostData, core: CoreFacts, kind: str) -> float:
    table = (
        data.transitions.quantize_cycles_per_element
        if kind == "quantize"
        else data.transitions.dequantize_cycles_per_element
    )
    return table[_float_mode(core)]


@dataclass(frozen=True)
class MemoryTimings:
    """Where an op's weights and activations live, as CPU cycles per byte read on first touch
    (platforms/memory_placement.py). None: no figure; the calibrated flash streaming rate
    (weights) or nothing (activations) applies."""

    weights_cycles_per_byte: float | None
    arena_cycles_per_byte: float | None


def calibrated_weight_cycles_per_byte(cpu: str) -> float:
    """The calibrated flash streaming rate (cycles per weight byte) of `cpu`'s CMSIS-NN figures:
    what a region without a `cpu_read` figure costs."""
    data, _ = _core(cpu)
    return 1.0 / data.cmsis_nn[cpu].weight_bytes_per_cycle


def memory_cycles(op: OpShape, memory: MemoryTimings) -> float:
    """Cycles to read the op's weights (once per inference) and its activations (in and out)
    at the speed of their regions; 0 when both sit in zero-wait TCM."""
    cycles = 0.0
    if memory.weights_cycles_per_byte is not None and op.kind in MAC_KINDS:
        cycles += op.weight_bytes * memory.weights_cycles_per_byte
    if memory.arena_cycles_per_byte is not None:
        cycles += (op.input_bytes + op.output_bytes) * memory.arena_cycles_per_byte
    return cycles


def _with_memory(cycles: float, streamed: float, op: OpShape, memory: MemoryTimings | None,
                 source: str) -> tuple[float, str]:
    """Swap the calibrated flash streaming term for the placed regions' read costs."""
    if memory is None:
        return cycles, source
    if memory.weights_cycles_per_byte is not None:
        cycles -= streamed
    extra = memory_cycles(op, memory)
    if extra or (memory.weights_cycles_per_byte is not None and streamed):
        source += "+model:memory"
    return cycles + extra, source


def cmsis_nn_cost(op: OpShape, cpu: str, cpu_hz: int, memory: MemoryTimings | None = None) -> Cost:
    """Cost of `op` as a CMSIS-NN (int8) kernel on `cpu` (e.g. "cortex-m55") at cpu_hz; with
    `memory`, weights and activations are read at their regions' speed."""
    data, core = _core(cpu)
    rates = data.cmsis_nn[cpu]
    terms = cmsis_nn_terms(op, cpu)
    cycles, source = _with_memory(terms.cycles(rates), terms.streamed_weight_bytes
                                  / rates.weight_bytes_per_cycle, op, memory, f"model:{core.tier}")
    return Cost.from_cycles(cycles, cpu_hz, source)


def portable_cost(op: OpShape, cpu: str, cpu_hz: int, memory: MemoryTimings | None = None) -> Cost:
    """Cost of `op` as an ExecuTorch portable (float) kernel between dequantize and quantize."""
    data, core = _core(cpu)
    rates = data.portable[cpu]
    elements = op.input_bytes if op.kind in _PER_INPUT_KINDS else op.elements
    if op.walked_operands:
        walk = (data.index_walk.broadcast_operand_elements if op.broadcast
                else data.index_walk.generic_operand_elements)
        elements = op.elements * op.walked_operands * walk
    mac_cycles = rates.conv_mac_cycles if op.kind in ("conv", "depthwise_conv") else rates.matmul_mac_cycles
    # int8 tensors are one byte per element; weights arrive as int8 constants plus a dequantize
    # (bias bytes are counted as elements too: a small overcount, int32 being 4 bytes).
    dequantized = op.input_bytes + op.weight_bytes
    cycles = (
        data.cmsis_nn[cpu].op_overhead_cycles
        + op.macs * mac_cycles
        + elements * rates.element_cycles
        + dequantized * _float_cycles_per_element(data, core, "dequantize")
        + op.output_bytes * _float_cycles_per_element(data, core, "quantize")
    )
    cycles, source = _with_memory(cycles, 0.0, op, memory, "model:portable")
    return Cost.from_cycles(cycles, cpu_hz, source)


def portable_copy_cost(elements: int, cpu: str, cpu_hz: int) -> Cost:
    """Cost of a portable dim-order copy of `elements` elements (see the module docstring)."""
    data, _ = _core(cpu)
    cycles = (data.cmsis_nn[cpu].op_overhead_cycles * (elements > 0)
              + elements * data.portable[cpu].element_cycles)
    return Cost.from_cycles(cycles, cpu_hz, "model:portable")


def npu_io_copy_cost(io_bytes: int, cpu: str, cpu_hz: int) -> Cost:
    """EthosUBackend's copy of a delegate's `io_bytes` of inputs into the NPU scratch and of
    its outputs back (arm_ethos_io_memcpy), at the measured instructions per byte taken as
    cycles."""
    data, _ = _core(cpu)
    return Cost.from_cycles(io_bytes * data.transitions.npu_io_copy_instructions_per_byte,
                            cpu_hz, "model:transition")


def npu_invocation_instructions(io_bytes: int, cpu: str) -> int:
    """Instructions the CPU retires for one NPU invocation that copies `io_bytes` (the
    driver's work and the IO copies), as measured on QEMU (cpu_cost.yaml transitions)."""
    data, _ = _core(cpu)
    t = data.transitions
    return int(round(t.npu_invocation_instructions + io_bytes * t.npu_io_copy_instructions_per_byte))


def transition_cost(kind: str, cpu: str, cpu_hz: int, bytes_: int = 0) -> Cost:
    """Cost of hidden CPU work around an NPU partition or a CPU/NPU layout boundary.

    npu_invocation: one Ethos-U delegate call; bytes_ = bytes the driver cleans before and
        invalidates after the run: the base regions of its cache masks, which ethosu_init sets
        to the scratch alone (it holds the IO). Free on cores without a data cache. The IO
        copies into and out of the scratch are npu_io_copy_cost.
    quantize / dequantize: bytes_ int8 elements converted at a float/int8 boundary.
    layout_copy: bytes_ bytes permuted or copied (NCHW <-> NHWC, IO into/out of NPU scratch).
    """
    if kind not in TRANSITION_KINDS:
        raise ValueError(f"unknown transition kind {kind!r}; known: {', '.join(TRANSITION_KINDS)}")
    if bytes_ < 0:
        raise ValueError(f"transition bytes must be non-negative, got {bytes_}")
    data, core = _core(cpu)
    if kind == "npu_invocation":
        lines = math.ceil(bytes_ / core.dcache_line_bytes) if core.dcache_line_bytes else 0
        cycles = (
            data.transitions.npu_invocation_cycles
            + lines * data.transitions.cache_maintenance_cycles_per_line
        )
    elif kind == "layout_copy":
        # A layout change is a byte permute: the same work as a transpose op, int8 elements.
        cycles = bytes_ * data.tiers[core.tier].element_cycles["transpose"]
    else:
        # A boundary quantize/dequantize is one more op dispatch plus its float math.
        cycles = data.cmsis_nn[cpu].op_overhead_cycles * (bytes_ > 0) + bytes_ * _float_cycles_per_element(
            data, core, kind
        )
    return Cost.from_cycles(cycles, cpu_hz, "model:transition")
