"""The NPU side of a comparison: Vela's own figures for our program and for the incumbent's.

The incumbent compiles the `.tflite` file itself with Vela (`vela FILE.tflite` with the target's
accelerator, system config and memory mode: the flags our own partitions are compiled with).
Our side is the program compiled from the same file. Both sets of figures are Vela's estimates
from its summary CSV (source: "Vela <version> estimate"); nothing here is measured on a device.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from cost_models.npu import read_vela_dir
from orchestrator.errors import UserError

VELA_TIMEOUT_S = 900


@dataclass(frozen=True)
class NpuFigures:
    """One side's NPU figures, all from Vela's summaries (`source` says which compile)."""

    source: str
    cycles_npu: int
    cycles_total: int
    sram_bytes: int  # the largest partition's (partitions run one after another)
    dram_bytes: int  # the largest partition's (memory modes that keep tensors in DRAM)
    flash_bytes: int  # every partition's weights and command stream
    npu_operators: int  # the file's operators that run on the NPU
    cpu_operators: int  # the file's operators left to the CPU
    partitions: int  # NPU invocations per inference (Vela's TFLite output: custom operators)
    macs: int

    def ratio(self, incumbent: "NpuFigures", field: str) -> float | None:
        """ours / incumbent for one figure; None when the incumbent's is 0."""
        theirs = getattr(incumbent, field)
        return getattr(self, field) / theirs if theirs else None


def vela_version() -> str:
    return version("ethos-u-vela")


def incumbent_flags(target) -> list[str]:
    """The Vela flags our partitions are compiled with for `target`, for a .tflite compile
    (Vela's default TFLite output instead of the raw command stream)."""
    from orchestrator.target import compile_spec  # lazy: heavy (executorch)

    flags = [f for f in compile_spec(target).compiler_flags if not f.startswith("--output-format")]
    return [*flags, "--verbose-performance"]


def incumbent_npu(tflite: Path, target, work_dir: Path | None = None) -> NpuFigures:
    """`vela FILE.tflite` for `target`, in a process of its own (a Vela crash is a line, not
    ours): its summary and operator counts."""
    from orchestrator.sources.tflite_file import read_tflite  # lazy: heavy (ethosu.vela)

    tflite = Path(tflite)
    operators = len(read_tflite(tflite).operators)
    with tempfile.TemporaryDirectory(prefix="orchestrate-vela-") as scratch:
        out = Path(work_dir) if work_dir is not None else Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-c", "import sys; from ethosu.vela.vela import main; "
                   "sys.exit(main())", str(tflite), *incumbent_flags(target),
                   f"--output-dir={out}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=VELA_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise UserError(f"{tflite.name}: Vela did not finish in {VELA_TIMEOUT_S} s on the "
                            "incumbent's side; compare a smaller model") from None
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise UserError(f"{tflite.name}: Vela (the incumbent's compile) failed "
                            f"(exit {done.returncode}): {last[0][:200]}")
        estimate = read_vela_dir(out, tflite.stem)
        counts = {kind: int(n) for kind, n in
                  re.findall(r"^(CPU|NPU) operators = (\d+)", done.stdout, re.MULTILINE)}
        vela_file = out / f"{tflite.stem}_vela.tflite"
        partitions = _ethos_u_operators(vela_file) if vela_file.exists() else 0
    return NpuFigures(
        source=f"Vela {vela_version()} estimate, the .tflite compiled by vela",
        cycles_npu=estimate.npu_cycles, cycles_total=estimate.cycles,
        sram_bytes=estimate.sram_bytes, dram_bytes=estimate.dram_bytes,
        flash_bytes=estimate.flash_bytes,
        # Vela counts the operators it made (a softmax is many); in the file's operators:
        npu_operators=operators - counts.get("CPU", 0), cpu_operators=counts.get("CPU", 0),
        partitions=partitions, macs=estimate.macs)


def _ethos_u_operators(vela_tflite: Path) -> int:
    """How many ethos-u custom operators Vela's output file (written by this run) has: the
    incumbent's NPU invocations per inference."""
    from ethosu.vela.tflite.BuiltinOperator import BuiltinOperator  # lazy: heavy (ethosu.vela)
    from ethosu.vela.tflite.Model import Model  # lazy: heavy (ethosu.vela)

    model = Model.GetRootAsModel(vela_tflite.read_bytes(), 0)
    codes = [model.OperatorCodes(i) for i in range(model.OperatorCodesLength())]
    graph = model.Subgraphs(0)
    count = 0
    for i in range(graph.OperatorsLength()):
        code = codes[graph.Operators(i).OpcodeIndex()]
        if max(code.BuiltinCode(), code.DeprecatedBuiltinCode()) == BuiltinOperator.CUSTOM \
                and code.CustomCode() == b"ethos-u":
            count += 1
    return count


def ours_npu(plan) -> NpuFigures:
    """Our program's Vela figures: every partition's summary, and the file's operators by where
    their rows run (an operator with any row on the CPU is a CPU operator, as Vela counts)."""
    estimates = list(plan.estimates.values())
    module = getattr(plan.compiled.model, "module", None) if plan.compiled.model else None
    origin = getattr(module, "origin", None) or {}
    on_cpu = {row.module.split(".")[0] for row in plan.rows
              if row.kind == "op" and row.placement != "npu" and row.module}
    cpu_ops = sum(1 for name in origin if name in on_cpu)
    return NpuFigures(
        source=f"Vela {vela_version()} estimate, our program's partitions",
        cycles_npu=sum(e.npu_cycles for e in estimates),
        cycles_total=sum(e.cycles for e in estimates),
        sram_bytes=max((e.sram_bytes for e in estimates), default=0),
        dram_bytes=max((e.dram_bytes for e in estimates), default=0),
        flash_bytes=sum(e.flash_bytes for e in estimates),
        npu_operators=len(origin) - cpu_ops, cpu_operators=cpu_ops,
        partitions=len(estimates), macs=sum(e.macs for e in estimates))
