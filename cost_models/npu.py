"""NPU costs from Vela's own estimates for a partition (its summary and per-layer CSVs).

Vela reports, per partition, total cycles for the accelerator configuration, system config and
memory mode it compiled for; per layer, the cycles and MAC count of each NPU operation it
scheduled (named after its output tensor in the TOSA graph). We use those figures unchanged.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class VelaLayer:
    original_op: str
    npu_op: str
    cycles: int
    macs: int
    name: str  # Vela's name for the layer: the TOSA output tensor


@dataclass(frozen=True)
class VelaPartitionEstimate:
    """One partition as Vela estimated it (source: Vela)."""

    cycles: int  # cycles_total from the summary CSV
    npu_cycles: int
    macs: int  # nn_macs
    inference_seconds: float  # inference_time (at Vela's system-config clock)
    core_clock_hz: float  # the clock of Vela's system config
    sram_bytes: int  # sram_memory_used (KiB in Vela's CSV, converted)
    scratch_bytes: int  # from out_vela.npz: the runtime scratch the delegate needs
    weight_bytes: int  # encoded weights carried in the delegate
    command_bytes: int
    traffic_bytes: dict  # memory -> bytes moved per inference: sram, dram, on_chip_flash, off_chip_flash
    layers: tuple[VelaLayer, ...]
    flash_bytes: int = 0  # on- and off-chip flash used (Vela's summary, KiB converted)
    dram_bytes: int = 0  # DRAM used (Vela's summary, KiB converted)

    def utilisation(self, macs_per_cycle: int) -> float:
        """MACs / (cycles x MACs per cycle): how busy the MAC array was."""
        return self.macs / (self.cycles * macs_per_cycle) if self.cycles else 0.0

    def seconds_at(self, npu_hz: float) -> float:
        return self.cycles / npu_hz


def read_vela_dir(vela_dir: Path, network: str = "out") -> VelaPartitionEstimate:
    """Read Vela's output folder (`partitions/p<k>/vela` or a Vela `output/` folder); `network`
    is the name Vela gave its files (`out` for a partition, a .tflite file's stem)."""
    vela_dir = Path(vela_dir)
    summaries = sorted(vela_dir.glob(f"{network}_summary_*.csv"))
    if not summaries:
        raise FileNotFoundError(f"no Vela summary CSV in {vela_dir}")
    with open(summaries[0], newline="") as handle:
        summary = next(csv.DictReader(handle))
    layers = []
    per_layer = vela_dir / f"{network}_per-layer.csv"
    if per_layer.exists():
        with open(per_layer, newline="") as handle:
            for row in csv.DictReader(handle):
                layers.append(VelaLayer(row["Original Operator"], row["NNG Operator"],
                                        int(float(row["Op Cycles"])), int(float(row["MAC Count"])),
                                        row["Name"]))
    scratch = weights = commands = 0
    npz = vela_dir / f"{network}_vela.npz"
    if npz.exists():
        with np.load(npz, allow_pickle=False) as data:
            scratch = int(data["scratch_shape"][0])
            # Vela stores each stream as one fixed-size bytes scalar (dtype |S<n>): use nbytes.
            weights = int(data["weight_data"].nbytes)
            commands = int(data["cmd_data"].nbytes)
    return VelaPartitionEstimate(
        cycles=int(float(summary["cycles_total"])),
        npu_cycles=int(float(summary["cycles_npu"])),
        macs=int(float(summary["nn_macs"])),
        inference_seconds=float(summary["inference_time"]),
        core_clock_hz=float(summary["core_clock"]),
        sram_bytes=int(round(float(summary["sram_memory_used"]) * 1024)),
        scratch_bytes=scratch, weight_bytes=weights, command_bytes=commands,
        traffic_bytes={memory: int(float(summary.get(f"{memory}_total_bytes", 0) or 0))
                       for memory in ("sram", "dram", "on_chip_flash", "off_chip_flash")},
        layers=tuple(layers),
        flash_bytes=int(round(sum(float(summary.get(f"{m}_flash_memory_used", 0) or 0)
                                  for m in ("on_chip", "off_chip")) * 1024)),
        dram_bytes=int(round(float(summary.get("dram_memory_used", 0) or 0) * 1024)),
    )


# Vela's "Original Operator" for a pooling layer -> the op a plan row names. A pool does no
# multiply: our rows count it 0 MACs while Vela counts one per input element read.
_POOL_LAYERS = {"AvgPool": "avg_pool2d", "MaxPool": "max_pool2d"}


def match_layers_to_ops(estimate: VelaPartitionEstimate, ops: list[tuple[str, int, str]]
                        ) -> tuple[dict[str, int], int]:
    """Give each op of a partition (name, MACs, op) the cycles of the Vela layer that computes it.

    Vela names layers after TOSA tensors, not after our graph nodes, so ops are matched in
    order by MAC count (conv/linear layers have distinctive counts), and pooling layers in order
    to the pooling ops of their kind. An op Vela computes in pieces (a stride-4 convolution on
    the U55: 49 Conv2D layers of 225 MACs, one per output position) is consecutive layers of
    one name, counted together. Layers that match no op (rescales, layout ops Vela inserted,
    elementwise ops fused differently) are returned as the partition's unattributed cycles, so
    per-op cycles plus that remainder equal Vela's total.
    """
    cycles: dict[str, int] = {}
    remaining = list(ops)
    attributed = 0
    for layer in _pieces_joined(estimate.layers):
        pool = _POOL_LAYERS.get(layer.original_op)
        for i, (name, macs, op) in enumerate(remaining):
            if (pool is not None and pool in op and not macs) or \
                    (pool is None and layer.macs > 0 and macs == layer.macs):
                cycles[name] = cycles.get(name, 0) + layer.cycles
                attributed += layer.cycles
                del remaining[i]
                break
    return cycles, estimate.cycles - attributed


def _pieces_joined(layers) -> list[VelaLayer]:
    """Consecutive layers of one name and operator (the pieces of one op) as one layer."""
    joined: list[VelaLayer] = []
    for layer in layers:
        last = joined[-1] if joined else None
        if last is not None and (last.name, last.original_op, last.npu_op) == \
                (layer.name, layer.original_op, layer.npu_op):
            joined[-1] = replace(last, cycles=last.cycles + layer.cycles,
                                 macs=last.macs + layer.macs)
        else:
            joined.append(layer)
    return joined
