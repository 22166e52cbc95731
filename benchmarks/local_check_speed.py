"""The twin's local check on a recurrence: seconds per sample, against a baseline run here that
checks as the twin did before (every candidate reference node scored even after an exact match,
whose value may cost recomputing everything after the last forced value, and every rounding
stage and bound counted afresh after each forced value).

A GRU keyword spotter (49 frames of 10 features, 32 hidden units, a linear head) compiled
CPU-only for the Cortex-M4 (`orchestrate compile`, kept in --work), its program run once in the
twin, then `check_locally` timed on the same written values both ways; the verdicts must agree.

    python benchmarks/local_check_speed.py [--work DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FRAMES, HIDDEN = 49, 32


def factory():
    """The model (`benchmarks/local_check_speed.py:factory` for `orchestrate compile`)."""
    import torch
    from torch import nn

    class GruKws(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(10, HIDDEN, batch_first=True)
            self.head = nn.Linear(HIDDEN, 12)

        def forward(self, x):
            out, _ = self.gru(x)
            return self.head(out[:, -1])

    torch.manual_seed(0)
    return GruKws().eval(), (torch.randn(1, FRAMES, 10),)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/orchestrate-local-check-speed")
    args = parser.parse_args(argv)

    import torch

    from orchestrator import compile as compile_program
    from orchestrator.device_runs.combined import load_program
    from orchestrator.verification.local_check import ForcedReference, check_locally
    from orchestrator.verification.twin_verify import (device_inputs, program_qparams,
                                                       sample_inputs, written_values)

    class Recounting(ForcedReference):
        """The baseline: every count dropped at each forced value."""

        def force(self, node, tensor):
            super().force(node, tensor)
            self._stages.clear()
            self._bounds.clear()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    pte = work / f"gru_{FRAMES}x{HIDDEN}.pte"
    if not pte.is_file():
        compile_program(f"{Path(__file__).resolve()}:factory", pte, npu="none",
                        cpu="cortex-m4")
    twin = load_program(pte)
    float_program, _ = twin.reference("float.pt2")
    _, quantized = twin.reference("quantized.pt2")
    (sample,), _ = sample_inputs(float_program, 1, None)
    run = twin.run(device_inputs(twin, sample), keep_intermediates=True)
    written = list(written_values(run, twin.view, twin))
    qparams = program_qparams(twin)
    timings, verdicts = {}, {}
    for name, kind, exhaustive in (("baseline (every candidate, recounted)", Recounting, True),
                                   ("first exact match, kept counts", ForcedReference, False)):
        began = time.perf_counter()
        with torch.no_grad():
            checks = check_locally(kind(quantized, sample), written, qparams, 1.0, exhaustive)
        timings[name] = time.perf_counter() - began
        verdicts[name] = tuple((c.reference_node, c.passed, c.max_steps) for c in checks)
    baseline, kept = timings.values()
    same = len(set(verdicts.values())) == 1
    print(f"GRU {FRAMES} frames x {HIDDEN} hidden, CPU-only Cortex-M4: {len(written)} values "
          "written, the local check of one sample (measured, wall clock)")
    for name, seconds in timings.items():
        print(f"  {name:44} {seconds:8.2f} s")
    print(f"  ratio now / baseline: {kept / baseline:.3f}; the same verdict on every value: "
          f"{'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
