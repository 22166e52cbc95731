"""The MLPerf Tiny zoo models and `mixed`, CPU-only on cortex-m55, through the runner firmware on
QEMU's Corstone-300 (mps3-an547): BundleIO verdict against the host twin (byte-exact), executed
instructions per inference next to the cost model's cycle estimate, firmware build time (cold:
an empty cache; cached: the same operator set again) and QEMU run time.

Instructions come from QEMU's `-icount shift=0` read through SysTick (platforms/qemu.py): a
measured count of executed instructions, a lower bound on cycles and not cycles. The cost model's
figure is `Plan.summary.latency_cycles_cpu` of the compile that produced the .bpte (the plan
`orchestrator.plan(model, npu="none", cpu="cortex-m55")` returns).

    python benchmarks/qemu_zoo.py [--models ds-cnn,resnet8] [--no-cold] [--trace] [--per-op]
                                  [--out DIR]

--trace: for each model that fails, rebuild the runner with per-instruction tracing and name the
first instruction whose output bytes (CRC-32) differ from the host twin's.
--per-op: per model, each instruction's measured instructions next to the cost model's cycles for
the plan row at the same position (when the plan has one row per kernel call).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
import zlib
from pathlib import Path

from tabulate import tabulate

MODELS = ("ds-cnn", "mobilenet-v1-025", "resnet8", "deep-autoencoder", "mixed")


def _compile(model: str, out: Path):
    import orchestrator

    started = time.monotonic()
    result = orchestrator.compile(model, out / f"{model}.pte", npu="none", cpu="cortex-m55",
                                  bundle=True)
    return result, time.monotonic() - started


def _logical(bundled_tensor):
    """A bundled tensor's bytes (laid out by its dim_order) as the logical torch tensor."""
    import torch
    from executorch.exir.tensor import get_scalar_type

    sizes, order = list(bundled_tensor.sizes), list(bundled_tensor.dim_order)
    raw = torch.frombuffer(bytearray(bytes(bundled_tensor.data)),
                           dtype=get_scalar_type(bundled_tensor.scalar_type))
    raw = raw.reshape([sizes[d] for d in order])
    return raw.permute([order.index(i) for i in range(len(order))]).contiguous()


def first_divergence(pte: Path, bpte: Path, trace) -> list[str]:
    """Per failing case, the first instruction whose outputs' CRC-32 differ between the device
    trace and the host twin run on the same bundled inputs."""
    from executorch.devtools.bundled_program.serialize import (
        deserialize_from_flatbuffer_to_bundled_program,
    )

    from orchestrator.verification.twin import load_twin

    twin = load_twin(pte)
    values = twin.view.values
    bundle = deserialize_from_flatbuffer_to_bundled_program(bpte.read_bytes())
    lines = []
    for case_index, case in enumerate(bundle.method_test_suites[0].test_cases):
        run = twin.run(tuple(_logical(v.val) for v in case.inputs), keep_intermediates=True)
        device = {entry.instruction: entry for entry in trace if entry.case == case_index}
        for step in run.op_trace:
            if step.kind != "kernel" or step.instruction not in device:
                continue
            twin_tensors = []
            for index in step.outputs:
                order = list(values[index].dim_order)
                raw = run.intermediates[index].permute(order).contiguous().numpy().tobytes()
                twin_tensors.append((len(raw), zlib.crc32(raw)))
            if list(device[step.instruction].tensors) != twin_tensors:
                lines.append(f"case {case_index}: instruction {step.instruction} {step.op} "
                             f"(EValue {', '.join(map(str, step.outputs))}) differs from the twin")
                break
    return lines


def _per_op_rows(plan, trace) -> list[list[str]]:
    """Device instructions per kernel call beside the plan row at the same position; the plan
    rows are paired with kernel calls only when there are as many of each."""
    calls = [entry for entry in trace if entry.case == 0 and entry.kernel]
    plan_rows = [row for row in plan.to_json()["ops"]]
    paired = len(plan_rows) == len(calls)
    rows = []
    for position, entry in enumerate(calls):
        row = plan_rows[position] if paired else None
        cycles = row["cost"]["cycles"] if row and row.get("cost") else None
        rows.append([
            str(entry.instruction), entry.kernel, f"{entry.instructions:,}",
            f"{entry.kernel_instructions:,}",
            f"{row['op']} ({row['placement']})" if row else "-",
            f"{cycles:,} ({row['cost']['source']})" if cycles else "-",
            f"{cycles / entry.instructions:.2f}" if cycles and entry.instructions else "-",
        ])
    return rows


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--no-cold", action="store_true", help="skip the cold (empty cache) builds")
    parser.add_argument("--trace", action="store_true", help="localise failures against the twin")
    parser.add_argument("--per-op", action="store_true", help="measured instructions per operator")
    parser.add_argument("--out", type=Path, default=None, help="where the .pte/.bpte go")
    args = parser.parse_args()

    from platforms.qemu import run_bpte_on_qemu
    from kernels.native.errors import QemuUnavailable
    from kernels.native.operators import read_operators
    from platforms.firmware_recipe import build_firmware

    out = args.out or Path(tempfile.mkdtemp(prefix="qemu-zoo-"))
    out.mkdir(parents=True, exist_ok=True)
    rows, notes, per_op = [], [], []
    for model in args.models.split(","):
        compiled, compile_s = _compile(model, out)
        pte = compiled.pte
        bpte, operators_txt = pte.with_suffix(".bpte"), compiled.artifacts / "operators.txt"
        operators = read_operators(operators_txt)
        model_cycles = compiled.plan.summary.latency_cycles_cpu
        try:
            cold_s = None
            if not args.no_cold:
                with tempfile.TemporaryDirectory(prefix="orchestrate-cold-") as empty_cache:
                    cold = build_firmware(operators, "corstone300", cache_dir=empty_cache)
                    cold_s = cold.build_seconds
            build_firmware(operators, "corstone300")  # into the shared cache, if not there yet
            cached = build_firmware(operators, "corstone300")
            result = run_bpte_on_qemu(bpte, operators_txt, "corstone300")
        except QemuUnavailable as unavailable:
            rows.append([model, str(unavailable)] + ["-"] * 8)
            continue
        verdict = {True: "PASS", False: "FAIL", None: "no verdict"}[result.passed]
        failed_cases = [case.index for case in result.cases if case.passed is False]
        if failed_cases:
            verdict += f" (case {','.join(map(str, failed_cases))} of {len(result.cases)})"
            notes += [f"{model}: {line}" for line in result.errors
                      if "differ" in line or "element" in line]
            if args.trace:
                traced = run_bpte_on_qemu(bpte, operators_txt, "corstone300", trace=True)
                notes += [f"{model}: {line}" for line in first_divergence(pte, bpte, traced.trace)]
        if args.per_op:
            traced = run_bpte_on_qemu(bpte, operators_txt, "corstone300", trace=True)
            per_op.append((model, _per_op_rows(compiled.plan, traced.trace)))
        ratio = (f"{model_cycles / result.instructions:.2f}"
                 if model_cycles and result.instructions else "-")
        rows.append([
            model, verdict,
            f"{result.instructions:,}" if result.instructions else "-",
            f"{model_cycles:,}" if model_cycles else "-",
            ratio,
            f"{cold_s:.1f}" if cold_s is not None else "-",
            f"{cached.build_seconds:.2f}",
            f"{result.run_seconds:.2f}",
            f"{result.firmware.text_bytes:,}",
            f"{compile_s:.0f}",
        ])
    print(tabulate(rows, ["model", "QEMU BundleIO (exact)", "instructions/inference (icount)",
                          "cost model cycles", "cycles/instructions", "build cold s",
                          "build cached s", "QEMU run s", "firmware .text B", "compile s"],
                   tablefmt="github", disable_numparse=True))
    print("\ninstructions: QEMU -icount shift=0 via SysTick, per Method::execute(), median of the "
          "4 bundled cases; a lower bound on cycles, not cycles. cost model: "
          "Plan.summary.latency_cycles_cpu (cortex-m55, MVE tier).")
    for note in notes:
        print(note)
    for model, op_rows in per_op:
        print(f"\n{model}: per instruction, case 0 (trace build; kernel = the kernel call alone)")
        print(tabulate(op_rows, ["#", "kernel", "instructions", "kernel instructions",
                                 "plan row", "plan cycles (source)", "cycles/instructions"],
                       tablefmt="github", disable_numparse=True))


if __name__ == "__main__":
    main()
