"""The MLPerf Tiny models, CPU-only, on every ISA tier's own QEMU machine: per model and core,
the `.pte` size, the BundleIO verdict against the host twin (byte-exact), the instructions per
inference QEMU counted, and each core's count over the Cortex-M55's (the MVE tier's).

Each (model, core) is compiled with `orchestrator.compile(model, npu="none", cpu=core,
bundle=True)` on the Corstone-300 platform and its `.bpte` run by the runner built for that core
on the QEMU machine that runs it (platforms/qemu_machines/): M3 on mps2-an385, M4 on mps2-an386,
M7 on mps2-an500, M33 on mps2-an505, M55 on the Corstone-300 runner's mps3-an547. Instructions
come from QEMU's `-icount shift=0` read through SysTick (platforms/qemu.py): executed
instructions, a lower bound on cycles and not cycles, median of the bundled cases.

    python benchmarks/tiers_qemu.py [--models ds-cnn,resnet8] [--cores cortex-m4,cortex-m55]
                                    [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

from tabulate import tabulate

MODELS = ("ds-cnn", "resnet8", "mobilenet-v1-025", "deep-autoencoder")
CORES = ("cortex-m3", "cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55")
MVE_CORE = "cortex-m55"


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--cores", default=",".join(CORES))
    parser.add_argument("--out", type=Path, default=None, help="where the .pte/.bpte go")
    args = parser.parse_args()

    import orchestrator
    from kernels.native.cores import core as core_entry
    from kernels.native.errors import QemuUnavailable
    from platforms.qemu import run_bpte_on_qemu

    out = args.out or Path(tempfile.mkdtemp(prefix="tiers-qemu-"))
    out.mkdir(parents=True, exist_ok=True)
    cores = args.cores.split(",")
    measured: dict[tuple[str, str], dict] = {}
    for model in args.models.split(","):
        for cpu in cores:
            started = time.monotonic()
            compiled = orchestrator.compile(model, out / f"{model}-{cpu}.pte", npu="none",
                                            cpu=cpu, bundle=True)
            compile_s = time.monotonic() - started
            row = {"pte_bytes": compiled.pte.stat().st_size, "compile_s": compile_s}
            try:
                result = run_bpte_on_qemu(compiled.pte.with_suffix(".bpte"),
                                          compiled.artifacts / "operators.txt", "corstone300",
                                          cpu=cpu)
            except QemuUnavailable as unavailable:
                row.update(verdict=f"not run: {unavailable}", machine="-", instructions=None)
            else:
                verdict = {True: "PASS", False: "FAIL", None: "no verdict"}[result.passed]
                row.update(verdict=f"{verdict} ({len(result.cases)} cases)",
                           machine=result.core, instructions=result.instructions,
                           run_s=result.run_seconds, build_s=result.build_seconds)
                if result.passed is not True:
                    row["errors"] = result.errors[:3]
            measured[model, cpu] = row
            print(f"{model} {cpu}: {row['verdict']}, {row.get('instructions')} instructions",
                  flush=True)

    rows, notes = [], []
    for (model, cpu), row in measured.items():
        mve = measured.get((model, MVE_CORE), {}).get("instructions")
        count = row["instructions"]
        rows.append([
            model, cpu, core_entry(cpu).tier, row["machine"], f"{row['pte_bytes']:,}",
            row["verdict"], f"{count:,}" if count else "-",
            f"{count / mve:.2f}" if count and mve else "-",
        ])
        notes += [f"{model} {cpu}: {line}" for line in row.get("errors", ())]
    print()
    print(tabulate(rows, ["model", "core", "tier", "ran on", ".pte B", "QEMU BundleIO (exact)",
                          "instructions/inference (icount)", "÷ M55 (MVE)"],
                   tablefmt="github", disable_numparse=True))
    print("\ninstructions: QEMU -icount shift=0 via SysTick, per Method::execute(), median of the "
          "bundled cases; a lower bound on cycles, not cycles. ÷ M55: this core's count over the "
          "Cortex-M55's for the same model (scalar or DSP path against the MVE path).")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
