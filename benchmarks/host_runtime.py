"""Every zoo model through the real ExecuTorch runtime (host build of the Cortex-M kernels,
CMSIS-NN and EthosUBackend), compared with the twin and the quantized reference.

One line per (model, target): runtime vs twin (output bytes equal? max steps), runtime vs the
quantized reference (max steps), wall time per inference in the runtime (median of `--repeat`
runs; of which the emulated NPU: TOSA reference model and the parent/child round trip), the
twin's time, and, where runtime and twin part, the first instruction they disagree on with the
host limit that explains it, if any.

Targets: CPU-only Cortex-M55 (CMSIS-NN MVE tier), CPU-only Cortex-M33 (DSP tier, whose code path
the host's C build computes identically), Ethos-U55-128 and Ethos-U85-256.

    python benchmarks/host_runtime.py [--samples 2] [--repeat 5] [--models ds-cnn,mixed]
                                      [--pte-dir DIR]   # reuse/keep <model>_<tag>.pte there
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orchestrator  # noqa: E402,F401 - pins host numerics before torch is imported
from examples.zoo import zoo_names  # noqa: E402
from kernels.runtime import HostRuntime, ensure_library, find_sources  # noqa: E402
from orchestrator.device_runs.runtime_verify import verify_runtime  # noqa: E402

# (tag, platform, npu, cpu)
TARGETS = (("none", "corstone300", "none", "cortex-m55"),
           ("m33", "corstone300", "none", "cortex-m33"),
           ("u55", "corstone300", "ethos-u55-128", None),
           ("u85", "corstone320", "ethos-u85-256", None))
LABELS = {"none": "cortex-m55 (CPU only)", "m33": "cortex-m33 (CPU only)",
          "u55": "ethos-u55-128", "u85": "ethos-u85-256"}


def _pte(model: str, tag: str, platform: str, npu: str, cpu: str | None, folder: Path) -> Path:
    path = folder / f"{model}_{tag}.pte"
    if path.is_file():
        return path
    from orchestrator.artifacts.outputs import write_outputs
    from orchestrator.compilation.pipeline import compile_model
    from orchestrator.sources.loader import load_calibration, load_model
    from orchestrator.target import resolve_target

    loaded = load_model(model)
    target = resolve_target(platform, npu=npu, cpu=cpu)
    write_outputs(compile_model(loaded, load_calibration(None, loaded.example_inputs), target), path)
    return path


def _steps(value: float) -> str:
    return "inf" if value == float("inf") else f"{value:g}"


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--models", default=",".join(zoo_names()))
    parser.add_argument("--targets", default=",".join(t[0] for t in TARGETS))
    parser.add_argument("--pte-dir", type=Path)
    args = parser.parse_args()
    folder = args.pte_dir or Path(tempfile.mkdtemp(prefix="host-runtime-"))
    folder.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    library = ensure_library(find_sources())
    print(f"host runtime library {library.path} ({'cached' if library.cached else 'built'} in "
          f"{time.perf_counter() - began:.1f} s); {args.samples} samples (randn, seed 0); "
          f"runtime time = median of {args.repeat} forward() calls")
    header = (f"{'model':<17} {'target':<22} {'runtime=twin bytes':<26} {'max steps vs twin':>17} "
              f"{'max steps vs quant':>18} {'runtime ms':>10} {'(NPU emu)':>9} {'twin ms':>9}  "
              "where runtime and twin part")
    print(header)
    wanted = set(args.targets.split(","))
    with HostRuntime(library) as runtime:
        for model in args.models.split(","):
            for tag, platform, npu, cpu in TARGETS:
                if tag not in wanted:
                    continue
                pte = _pte(model, tag, platform, npu, cpu, folder)
                report = verify_runtime(pte, samples=args.samples, runtime=runtime,
                                        repeat=args.repeat)
                if report.runtime_error:
                    print(f"{model:<17} {LABELS[tag]:<22} runtime error: "
                          f"{report.runtime_error.splitlines()[0]}", flush=True)
                    continue
                twin_steps = max(o.max_steps_vs_twin for o in report.outputs)
                ref_steps = max(o.max_steps_vs_quantized for o in report.outputs)
                where = "-"
                if report.first_divergence is not None:
                    d = report.first_divergence
                    where = f"#{d.instruction} {d.op} ({_steps(d.max_difference)} max)"
                    limit = next((h for h in report.host_limits
                                  if h.instruction == d.instruction), None)
                    if limit is not None:
                        where += f"; host limit: {limit.reason.split(':')[0]}"
                equal = "yes" if report.bytes_equal else f"NO ({report.outcome})"
                print(f"{model:<17} {LABELS[tag]:<22} {equal:<26} "
                      f"{_steps(twin_steps):>17} {_steps(ref_steps):>18} "
                      f"{report.runtime_seconds_per_sample * 1e3:>10.2f} "
                      f"{report.runtime_npu_seconds_per_sample * 1e3:>9.2f} "
                      f"{report.twin_seconds_per_sample * 1e3:>9.1f}  {where}", flush=True)


if __name__ == "__main__":
    main()
