"""Start-up time of the commands that must answer at once, against `python -c pass`.

Each command runs as a user runs it (`python -m orchestrator.cli ...` from a scratch folder),
REPEAT times, interleaved with the baseline; the median wall time and its ratio to the
baseline's median are printed. Nothing is asserted: this is the measurement the issue's
"under a second" is read from.

    python benchmarks/startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = (
    ("--help", ["--help"]),
    ("--version", ["--version"]),
    ("list", ["list"]),
    ("reasons", ["reasons"]),
    ("doctor", ["doctor"]),
    ("plan ds-cnn --platform corstone30", ["plan", "ds-cnn", "--platform", "corstone30"]),
    ("plan ds-cnx", ["plan", "ds-cnx"]),
    ("plan ds-cnn --cpu cortex-m99", ["plan", "ds-cnn", "--cpu", "cortex-m99"]),
    ("compile ds-cnn -o model.txt", ["compile", "ds-cnn", "-o", "model.txt"]),
    ("plan ds-cnn -o /proc/plan.html", ["plan", "ds-cnn", "-o", "/proc/plan.html"]),
)


def _seconds(argv: list[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, capture_output=True, env=None)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        baseline_runs, runs = [], {label: [] for label, _ in COMMANDS}
        for _ in range(args.repeat):
            for label, argv in COMMANDS:
                baseline_runs.append(_seconds([sys.executable, "-c", "pass"], scratch))
                runs[label].append(_seconds([sys.executable, "-m", "orchestrator.cli", *argv],
                                            scratch))
        baseline = statistics.median(baseline_runs)
        print(f"wall seconds, median of {args.repeat} (measured); baseline `python -c pass` "
              f"{baseline:.3f} s")
        print(f"{'command':<38} {'median s':>9} {'x baseline':>11}")
        for label, _ in COMMANDS:
            median = statistics.median(runs[label])
            print(f"{label:<38} {median:9.3f} {median / baseline:10.1f}x")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
