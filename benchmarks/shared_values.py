"""`.pte` bytes as the emitter writes them, with equal values shared
(orchestrator/compilation/share_values.py) and with equal flatbuffer tables shared too
(orchestrator/compilation/share_tables.py), per zoo model and target, and the proof that all
three are the same program: the host twin's outputs are byte-identical on the same inputs; the
runtime's verifier (Program::load with InternalConsistency) accepts each; the real ExecuTorch
runtime (host build of the device kernels; `orchestrate verify --runtime executorch`, which
compares every output with the twin's byte for byte) passes each; and for CPU-only Cortex-M55
programs the Corstone-300 runner on QEMU (`orchestrate verify --qemu`, BundleIO cases
byte-exact against the twin) passes each.

    python benchmarks/shared_values.py [--models ds-cnn,resnet8] [--targets cpu-m55,u55-128]
                                       [--samples 2] [--no-qemu] [--layout]

Columns: `emitter`, `values`, `tables`: the `.pte` bytes of the three (`values` also empties
the pytree specs the runtime never reads); `meta v/t`: its flatbuffer tables and padding
(`orchestrate size`) with shared values, then with shared tables too; `% const`: the latter over
the constants. `--layout` adds, under each row, where the shared-tables `.pte`'s bytes go by
schema type (share_tables.pte_layout: vtables and alignment padding included, the figures add
up to the file). Bytes: counted in the files. Nothing is timed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orchestrator  # noqa: E402,F401 - pins host numerics before torch
from kernels.upstream_runtime import verification_refusal  # noqa: E402
from orchestrator.artifacts.outputs import write_outputs  # noqa: E402
from orchestrator.artifacts.size import analyze  # noqa: E402
from orchestrator.compilation import share_tables, upstream_exir  # noqa: E402
from orchestrator.compilation.pipeline import compile_model  # noqa: E402
from orchestrator.sources.loader import load_calibration, load_model  # noqa: E402
from orchestrator.target import resolve_target  # noqa: E402
from orchestrator.verification.twin import run_twin  # noqa: E402

TARGETS = {"u55-128": ("corstone300", "ethos-u55-128", None),
           "u85-256": ("corstone320", "ethos-u85-256", None),
           "cpu-m55": ("corstone300", "none", "cortex-m55")}
MODELS = ("ds-cnn", "mixed", "resnet8", "deep-autoencoder", "mobilenet-v1-025", "person-detector")
# (name, share_values, share_tables)
VARIANTS = (("emitter", False, False), ("values", True, False), ("tables", True, True))


def _verdict(pte: Path, *flags: str) -> str:
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "verify", str(pte), *flags],
                          cwd=ROOT, capture_output=True, text=True)
    return {0: "pass", 4: "FAIL", 5: "-"}.get(done.returncode, f"exit{done.returncode}")


def _layout_text(pte_bytes: bytes) -> str:
    layout = share_tables.pte_layout(upstream_exir.read_pte(pte_bytes))
    if sum(layout.values()) != len(pte_bytes):  # a writer that is not ours: no split to show
        return "    (layout: not the shared-tables writer's file)"
    parts = [f"{kind} {n:,}" for kind, n in layout.items() if kind != "constants" and n]
    lines, line = [], "   "
    for part in parts:
        if len(line) + len(part) > 96:
            lines.append(line)
            line = "   "
        line += f" {part};"
    return "\n".join(lines + [line])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--no-qemu", action="store_true", help="skip the QEMU runs")
    parser.add_argument("--layout", action="store_true",
                        help="where each shared-tables .pte's bytes go, by schema type")
    args = parser.parse_args()
    print(f"{'model':<17} {'target':<8} {'emitter':>8} {'values':>8} {'tables':>8} "
          f"{'meta v/t':>12} {'% const':>7} {'twin':>5} {'verifier':>8} {'runtime':>14} "
          f"{'qemu':>14}")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="orchestrate-shared-") as temp:
        for model in args.models.split(","):
            loaded = load_model(model)
            calibration = load_calibration(None, loaded.example_inputs)
            inputs = [tuple(sample) for sample in calibration.samples[:args.samples]]
            for target_key in args.targets.split(","):
                platform, npu, cpu = TARGETS[target_key]
                target = resolve_target(platform, npu=npu, cpu=cpu)
                ptes = {}
                for name, values, tables in VARIANTS:
                    compiled = compile_model(loaded, calibration, target, share_values=values,
                                             share_tables=tables)
                    ptes[name] = Path(temp) / f"{model}-{target_key}-{name}.pte"
                    write_outputs(compiled, ptes[name])
                outputs = {name: [run_twin(pte, x).output_bytes for x in inputs]
                           for name, pte in ptes.items()}
                twin_same = len({repr(o) for o in outputs.values()}) == 1
                accepted = all(verification_refusal(pte.read_bytes()) is None
                               for pte in ptes.values())
                runtime = [_verdict(pte, "--runtime", "executorch", "--samples",
                                    str(args.samples)) for pte in ptes.values()]
                qemu = ["-"] * len(ptes)
                if cpu == "cortex-m55" and not args.no_qemu:
                    qemu = [_verdict(pte, "--qemu", "--samples", str(args.samples))
                            for pte in ptes.values()]
                failures += (not twin_same) + (not accepted) + \
                    sum(v == "FAIL" for v in runtime + qemu)
                sizes = {name: pte.stat().st_size for name, pte in ptes.items()}
                meta = {name: analyze(ptes[name]) for name in ("values", "tables")}
                constants = meta["tables"].constant_bytes_live + meta["tables"].constant_bytes_dead
                # an NPU program's weights are in its delegates: no ratio to its few constants
                share = f"{100.0 * meta['tables'].metadata_and_padding_bytes / constants:.1f}%" \
                    if constants and not meta["tables"].delegates else "-"
                print(f"{model:<17} {target_key:<8} {sizes['emitter']:>8,} {sizes['values']:>8,} "
                      f"{sizes['tables']:>8,} "
                      f"{meta['values'].metadata_and_padding_bytes:>5,}/"
                      f"{meta['tables'].metadata_and_padding_bytes:<6,} {share:>7} "
                      f"{'equal' if twin_same else 'DIFF':>5} "
                      f"{'ok' if accepted else 'REFUSED':>8} {'/'.join(runtime):>14} "
                      f"{'/'.join(qemu):>14}", flush=True)
                if args.layout:
                    print(_layout_text(ptes["tables"].read_bytes()), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
