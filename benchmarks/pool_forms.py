"""Vela's cycles for forms of an 8x8 average pool (ResNet-8's, over 64 channels), per target.

ResNet-8's pool is the one layer where our program costs Vela more than the incumbent's
(docs/benchmarks.md, "Against the incumbent on the NPU"). Each form below is one NPU partition
of the same small network: a 1x1 convolution (32 -> 64 channels, ReLU) on 8x8, the pool, a
10-way classifier. It is compiled by `orchestrate compile` for each target, and the pool's
own rows of Vela's per-layer CSV are summed. Every figure is Vela's estimate; nothing here ran
on a device, and the weights are random (the forms' costs, not their values, are compared).

    python benchmarks/pool_forms.py [--targets u55-128,u65-256,u85-256] [--work DIR]

Forms:
- depthwise: one 8x8 depthwise convolution (how a `.tflite` file's even-count pool runs on the
  NPU with TFLM's codes: orchestrator/sources/tflite_pools.py);
- two-stage: an 8x1 then a 1x8 depthwise convolution, int8 between them (cost only: TFLM's
  exact sum would need the partial sums in int16);
- reduce-sum: `sum` over height and width (TOSA REDUCE_SUM), then the 1/64.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGETS = {"u55-128": ("corstone300", "ethos-u55-128"),
           "u65-256": ("corstone300", "ethos-u65-256"),
           "u85-256": ("corstone320", "ethos-u85-256")}
FORMS = ("depthwise", "two-stage", "reduce-sum")

MODEL_SOURCE = '''
import torch
from torch import nn


class PoolForm(nn.Module):
    def __init__(self, form):
        super().__init__()
        torch.manual_seed(0)
        self.form = form
        self.conv = nn.Conv2d(32, 64, 1)
        self.fc = nn.Linear(64, 10)
        self.whole = nn.Conv2d(64, 64, 8, groups=64, bias=False)
        self.rows = nn.Conv2d(64, 64, (8, 1), groups=64, bias=False)
        self.columns = nn.Conv2d(64, 64, (1, 8), groups=64, bias=False)
        with torch.no_grad():
            self.whole.weight.fill_(1 / 64)
            self.rows.weight.fill_(1 / 8)
            self.columns.weight.fill_(1 / 8)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        if self.form == "depthwise":
            y = self.whole(y)
        elif self.form == "two-stage":
            y = self.columns(self.rows(y))
        else:
            y = y.sum(dim=(2, 3), keepdim=True) / 64
        return self.fc(y.flatten(1))


def form(name):
    return PoolForm(name), (torch.randn(1, 32, 8, 8),)
''' + "".join(f"\n\ndef {name.replace('-', '_')}():\n    return form({name!r})\n"
              for name in FORMS)

# The per-layer CSV names each row after the TOSA operator it came from; the pool's rows are
# those that are neither the 1x1 convolution (the first row) nor the classifier (the last).


def pool_cycles(artifacts: Path) -> int:
    (table,) = artifacts.glob("partitions/*/vela/*per-layer.csv")
    rows = list(csv.DictReader(table.open()))
    return sum(int(float(row["Op Cycles"])) for row in rows[1:-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--work", default=None)
    args = parser.parse_args(argv)

    import orchestrator

    work = Path(args.work or tempfile.mkdtemp(prefix="orchestrate-pool-forms-"))
    work.mkdir(parents=True, exist_ok=True)
    model_file = work / "pool_forms_model.py"
    model_file.write_text(MODEL_SOURCE)
    targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        print(f"pool_forms: unknown target {unknown[0]!r}; known: {', '.join(TARGETS)}",
              file=sys.stderr)
        return 2
    print("source: Vela estimates (per-layer CSV of each compile), the pool's rows summed")
    print(f"{'form':<12}" + "".join(f"{t:>12}" for t in targets))
    for form in FORMS:
        cells = []
        for target in targets:
            platform, npu = TARGETS[target]
            out = work / f"{form}_{target}.pte"
            result = orchestrator.compile(f"{model_file}:{form.replace('-', '_')}", out,
                                          platform=platform, npu=npu)
            partitions = result.plan.summary.npu_partitions
            cycles = pool_cycles(result.artifacts)
            cells.append(f"{cycles:,}" + ("" if partitions == 1 else f" ({partitions} p)"))
        print(f"{form:<12}" + "".join(f"{c:>12}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
