"""Per zoo model, CPU-only Cortex-M55: .pte bytes and ExecuTorch planned arena bytes
(`non_const_buffer_sizes`), with float and int8 I/O. Prints a table; sizes are measured on the
serialized program (deterministic for a given toolchain)."""

from __future__ import annotations

import warnings

from tabulate import tabulate

from examples.zoo import zoo_names
from orchestrator.compilation.pipeline import compile_model
from orchestrator.sources.loader import load_calibration, load_model
from orchestrator.target import resolve_target


def main() -> None:
    warnings.filterwarnings("ignore")
    rows = []
    for name in zoo_names():
        model = load_model(name)
        calibration = load_calibration(None, model.example_inputs)
        figures = []
        for io in ("float", "int8"):
            compiled = compile_model(model, calibration, resolve_target("corstone300", npu="none",
                                                                        cpu="cortex-m55", io=io))
            figures += [len(compiled.pte_bytes), compiled.arena_bytes]
        rows.append([name, *(f"{v:,}" for v in figures),
                     f"{figures[1] / figures[3]:.2f}" if figures[3] else "-"])
    print(tabulate(rows, ["model", ".pte B (float io)", "arena B (float io)", ".pte B (int8 io)",
                          "arena B (int8 io)", "arena ratio float/int8"], tablefmt="github",
                   disable_numparse=True))


if __name__ == "__main__":
    main()
