"""Compile and verify every model of `examples/user_models.py` on U55-128, U65-256, U85-256 and
CPU-only M55: one line per (model, target).

Each line says whether the compile succeeded (with its wall time, measured here) or the
one-line error it raised (`orchestrator.errors`: UserError exit 2, OrchestrateError exit 1),
then the verify verdict (method: the host twin; local check per value, end-to-end max int8
steps vs the quantized reference as a figure) or the error that stopped verify. Anything else
(a raw exception) is printed as "UNCLASSIFIED" with its type and first line: a defect.

    python benchmarks/user_models.py [--samples 4] [--models a,b] [--targets u55,cpu]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orchestrator  # noqa: E402,F401 - pins host numerics before torch does anything

from examples.user_models import USER_MODELS, model_spec  # noqa: E402
from orchestrator.errors import as_orchestrate_error  # noqa: E402
from orchestrator.verification import verify  # noqa: E402

TARGETS = {"u55": ("corstone300", "ethos-u55-128", None),
           "u65": ("corstone300", "ethos-u65-256", None),
           "u85": ("corstone320", "ethos-u85-256", None),
           "cpu": ("corstone300", "none", "cortex-m55")}


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else ""


def _error(error: BaseException) -> str:
    classified = as_orchestrate_error(error)
    if classified is not None:
        return f"{type(error).__name__} (exit {classified.exit_code}): {_one_line(classified)}"
    return f"UNCLASSIFIED {type(error).__name__}: {_one_line(error)}"


def _verdict(report) -> str:
    worst = max((o.max_steps for o in report.outputs), default=0.0)
    verdict = ("PASSED" if report.passed else
               "INCONCLUSIVE" if report.inconclusive else "FAILED")
    text = f"{verdict}, end-to-end max {worst:g} steps, {report.checked_values} values checked"
    if not report.passed:
        text += f"; {report.verdict.split(': ', 1)[-1]}"
    return text


def run_case(name: str, target_key: str, out_dir: Path, samples: int, spec=None) -> str:
    """One line: compile as `orchestrate compile` does (refusing what it refuses), then verify.
    `spec(name)` gives the model spec (default: examples/user_models.py)."""
    import orchestrator

    platform, npu, cpu = TARGETS[target_key]
    label = f"{name:<26} {npu if npu != 'none' else cpu:<14}"
    start = time.perf_counter()
    try:
        pte = out_dir / f"{name}-{target_key}.pte"
        orchestrator.compile((spec or model_spec)(name), pte, platform=platform, npu=npu,
                             cpu=cpu)
    except Exception as error:  # noqa: BLE001 - every outcome is a line of the table
        return f"{label} compile: {_error(error)}"
    compile_s = time.perf_counter() - start
    try:
        verdict = _verdict(verify(pte, samples=samples))
    except Exception as error:  # noqa: BLE001
        verdict = _error(error)
    return f"{label} compile ok {compile_s:5.1f} s | verify: {verdict}"


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--models", default=",".join(USER_MODELS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    args = parser.parse_args()
    out_dir = Path(tempfile.mkdtemp(prefix="user-models-"))
    print(f"user models x targets; verify: host twin, {args.samples} generated samples; "
          f"compile seconds measured here; .pte files in {out_dir}", flush=True)
    for name in args.models.split(","):
        for target_key in args.targets.split(","):
            print(run_case(name, target_key, out_dir, args.samples), flush=True)


if __name__ == "__main__":
    main()
