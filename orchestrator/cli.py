"""`orchestrate`: a thin shell over the Python API (plan, compile, sweep, verify, size).

Exit codes: 0 ok, 1 internal error, 2 user error (one clear line), 3 gate failed,
4 verification failed, 5 a requested check could not run (e.g. no FVP).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import signal
import sys
import time
from importlib import metadata
from pathlib import Path

from examples.zoo_index import ZOO_MODELS
from kernels.cache_root import cache_root
from kernels.native.sources import (PINNED, SourceFetchError, fetch_sources, fetched_commit,
                                    source_tree, sources_hint)
from orchestrator import api
from orchestrator.artifacts.manifest import Manifest, artifacts_dir_for
from orchestrator.artifacts.files import (atomic_write_bytes, check_output_file, check_outputs,
                                          same_path)
from orchestrator.artifacts.profile import read_profile
from orchestrator.device_runs.qemu import installed_platform, profile_lines, qemu_profile
from orchestrator.errors import (GateFailure, NotRun, OrchestrateError, UserError,
                                 VerificationFailure, as_orchestrate_error)
from orchestrator.logs import quiet_upstream
from orchestrator.reports.html import render_sweep_html
from orchestrator.request import Request, load_policy_arg, memory_policy
from orchestrator.sources.specs import model_spec
from orchestrator.target import resolve_target
from orchestrator.verification.methods import FVP, QEMU, RUNTIME, TWIN, VerifyInputs
from partitioners.reasons import markdown as reasons_markdown
from platforms.platform import CPU_TIERS, PlatformError, list_platforms, load_platform


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad options already; keep its message to one line."""

    def error(self, message: str):
        self.exit(2, f"orchestrate: error: {message}; see `{self.prog} --help`\n")


_CLOCK_UNITS = {"ghz": 1e9, "mhz": 1e6, "khz": 1e3, "hz": 1.0}


def _clock_hz(text: str) -> float:
    """A clock frequency: finite and at least 1 Hz (the target stores whole hertz); a number of
    hertz (`400000000`, `4e8`) or with a unit (`400MHz`, `1.2 GHz`, `32kHz`)."""
    stripped = text.strip().lower().replace(" ", "")
    scale = 1.0
    for unit, factor in _CLOCK_UNITS.items():
        if stripped.endswith(unit):
            stripped, scale = stripped[:-len(unit)], factor
            break
    try:
        value = float(stripped) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a clock frequency; give hertz "
                                         "(400000000, 4e8) or a unit (400MHz)") from None
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a clock frequency; give a finite "
                                         "number of hertz of at least 1, e.g. 400e6")
    return value


def _percent(text: str) -> float:
    value = _number(text, float)
    if not (math.isfinite(value) and 0 <= value <= 100):
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage; give 0 to 100")
    return value


def _count(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative; give 0 or more")
    return value


def _positive(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not positive; give 1 or more")
    return value


def _number(text: str, kind: type):
    try:
        return kind(text)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {expected}") from None


def _add_target_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="zoo name (ds-cnn, mixed, ...), path/file.py:factory, "
                   "a .py defining ModelUnderTest/ModelInputs, or a saved .pt2")
    p.add_argument("--platform", default="corstone300",
                   help="corstone300, corstone320, or a platform YAML of your own SoC "
                        "(default: corstone300)")
    p.add_argument("--npu", help="e.g. ethos-u55-128, ethos-u65-256, ethos-u85-256; 'none' for CPU "
                   "only (default: the platform's: ethos-u55-128 on corstone300, ethos-u85-256 "
                   "on corstone320)")
    p.add_argument("--cpu", help="e.g. cortex-m55, cortex-m33, cortex-m0plus (default: the platform's)")
    p.add_argument("--io", default="float", choices=("float", "int8", "auto"),
                   help="program input/output type; int8 removes the fp32 I/O buffers; auto "
                        "compiles both and keeps int8 when the platform's firmware takes it "
                        "and it makes the arena smaller (the report shows both arenas); default: float")
    p.add_argument("--calibration", help=".pt/.npz of samples or a folder of them (default: 8 "
                   "generated samples, and the report warns that its ranges are not representative)")
    p.add_argument("--cpu-hz", type=_clock_hz, help="override the platform CPU clock: hertz "
                   "(400000000, 4e8) or with a unit (400MHz); default: the platform YAML's")
    p.add_argument("--npu-hz", type=_clock_hz, help="override the platform NPU clock (as "
                   "--cpu-hz); default: the platform YAML's")
    p.add_argument("--policy", help="placement policy YAML (force ops/nodes/modules to the CPU, "
                   "NPU, Vela config, clocks; see docs/tuning.md; default: none, greedy placement by "
                   "operator support)")
    p.add_argument("--memory-policy", default="auto", metavar="auto|in-place|FILE",
                   help="where buffers live: auto (default: activations in the fastest "
                   "region, split over the next when they do not fit; CPU weights copied at boot "
                   "to the fastest region left with room when it pays), in-place (weights read "
                   "from the .pte where it lies), or a YAML with any of weights: REGION, arena: "
                   "REGION or [REGION, ...], keep_free: {REGION: BYTES}")
    p.add_argument("--placement", choices=("greedy", "cost"),
                   help="greedy: every op the NPU accepts goes there (default); cost: move NPU "
                   "islands to the CPU when the cost model says the program gets faster")
    p.add_argument("--calibration-costs", metavar="FILE",
                   help="a CPU calibration written by `orchestrate calibrate` (or a shipped "
                   "one: cortex-m55-qemu): CPU rows get its instruction estimate and/or "
                   "calibrated cycles, each naming it as the source (default: the platform "
                   "YAML's cpu: calibration_costs, else the cost model's own figures)")
    _add_output_options(p)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--verbose", action="store_true",
                   help="show upstream warnings and tracebacks of internal errors")


def _version() -> str:
    try:
        own = metadata.version("orchestrate")
    except metadata.PackageNotFoundError:
        own = "unknown (not installed)"
    upstream = []
    for package in ("executorch", "ethos-u-vela", "torch", "tosa-tools"):
        try:
            upstream.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            upstream.append(f"{package} missing")
    return f"orchestrate {own} ({', '.join(upstream)})"


_PLAN_EXAMPLES = """examples:
  # DS-CNN on the default platform, Corstone-300 (Cortex-M55 + Ethos-U55-128)
  orchestrate plan ds-cnn
  # CPU only, every time at a 400 MHz part
  orchestrate plan ds-cnn --npu none --cpu-hz 400MHz
  # your model (a factory in a .py file) on a U65, as an HTML report
  orchestrate plan my_model.py:build --npu ethos-u65-256 -o plan.html
  # a CI gate: exit 3 under 90% NPU MAC coverage or when it does not fit the memories
  orchestrate plan ds-cnn --fail-under-npu-coverage 90 --require-fit

docs/plan.md explains every line of the report."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="orchestrate", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = sub.add_parser(
        "plan", help="where every op runs and why, with costs and memory",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_PLAN_EXAMPLES)
    _add_target_options(plan)
    plan.add_argument("--format", choices=("table", "json", "markdown", "html", "model-explorer"),
                      help="report format (default: from -o's extension: .json, .md, .html; "
                      "else table); a --format that contradicts -o's extension is refused")
    plan.add_argument("--all-rows", action="store_true",
                      help="table: list every op of an unrolled recurrence (GRU/LSTM/RNN) "
                      "instead of one line per recurrence")
    plan.add_argument("-o", "--output", help="write the report to this file, atomically "
                      "(default: standard output)")
    plan.add_argument("--pte", help="also write the compiled .pte (and its artifacts) here "
                      "(default: not written)")
    plan.add_argument("--runner-ops", help="file listing the operators your runner registers; "
                      "the plan flags every op it lacks (default: no check against a runner)")
    plan.add_argument("--fail-under-npu-coverage", type=_percent, metavar="PCT",
                      help="CI gate: exit 3 when less than PCT%% of the MACs run on the NPU "
                      "(default: no gate)")
    plan.add_argument("--max-partitions", type=_count, metavar="N",
                      help="CI gate: exit 3 when the program has more than N NPU partitions "
                      "(default: no gate)")
    plan.add_argument("--require-fit", action="store_true",
                      help="CI gate: exit 3 when the program, its arenas and the NPU scratch do "
                      "not fit the platform's memories (default: report only)")
    plan.add_argument("--require-runnable", action="store_true",
                      help="fail if an op has no device kernel or breaks a kernel's layout rule")
    plan.add_argument("--measured", metavar="FILE.etdp",
                      help="show a profile's measured figures beside the plan's model, per op "
                      "and in total: an ETDump from `verify --qemu --profile` or ExecuTorch's "
                      "ETDumpGen on a device; MODEL may then be the profiled .pte (its plan is "
                      "read from its artifacts folder); a profile of another program is "
                      "refused; --format table or json (default: no profile)")

    plan.add_argument("--firmware", metavar="DIR",
                      help="show the flash and RAM of a firmware built for this program "
                      "(`orchestrate firmware PROGRAM.pte -o DIR`) beside the plan's estimates, "
                      "from the build's linker map; MODEL may then be that .pte; a build of "
                      "another program is refused (default: none)")

    comp = sub.add_parser("compile", help="compile to one .pte plus an artifacts folder")
    _add_target_options(comp)
    comp.add_argument("-o", "--output", required=True, help="output .pte path (required; the "
                      "artifacts folder goes beside it)")
    comp.add_argument("--bundle", action="store_true",
                      help="also write a BundleIO .bpte with test inputs and expected outputs")

    swp = sub.add_parser("sweep", help="plan one model for several NPU/CPU configurations")
    _add_target_options(swp)
    swp.add_argument("--npus", help="comma-separated NPU names (default: all the platform offers; "
                     "'none' for CPU only)")
    swp.add_argument("--models", help="more models, comma-separated, or @FILE with one per line "
                     "(one row per model x configuration; default: only MODEL)")
    swp.add_argument("--jobs", type=_positive, help="configurations compiled at once, in worker "
                     "processes (default: the machine's cores)")
    swp.add_argument("--executor", default="local", metavar="local|ray|ray:ADDRESS",
                     help="where configurations compile: local worker processes (default), "
                     "ray (a Ray instance started here with --jobs CPUs) or ray:ADDRESS (a "
                     "running Ray cluster, e.g. ray:auto, ray:10.0.0.1:6379; the cache folder "
                     "must be on a filesystem its nodes share); needs pip install "
                     "'orchestrate[ray]'")
    swp.add_argument("--format", choices=("table", "json", "html"),
                     help="table, json, or html (latency, flash and RAM per configuration); "
                     "default: from -o's extension (.json, .html), else table")
    swp.add_argument("-o", "--output", help="write the table to this file (default: standard "
                     "output)")

    cal = sub.add_parser(
        "calibrate", help="fit the CPU cost model's per-op-class factors to measured profiles "
        "and write a calibration file for plan/compile --calibration-costs")
    cal.add_argument("profiles", nargs="+", metavar="PROFILE",
                     help="PROFILE.etdp (from `verify --qemu --profile`: instructions; or a "
                     "device's, in cycles) with its PROFILE.pte beside it, or "
                     "PROGRAM.pte=PROFILE.etdp; the program's SHA-256 must be the profile's")
    cal.add_argument("--cpu", required=True, help="the core the programs were compiled for, "
                     "e.g. cortex-m55")
    cal.add_argument("-o", "--output", required=True, metavar="FILE.yaml",
                     help="the calibration file to write (atomically)")
    cal.add_argument("--validate", nargs="+", default=[], metavar="PROFILE",
                     help="more profiles (same forms), never fitted to: the file records their "
                     "per-class figures before and after (default: none)")
    cal.add_argument("--bound", type=_percent, default=15.0, metavar="PCT",
                     help="--validate: the per-class error called within (default 15)")
    _add_output_options(cal)

    ver = sub.add_parser("verify", help="check the .pte: host twin, real ExecuTorch runtime, QEMU Corstone-300 or an FVP")
    ver.add_argument("pte", help="a .pte written by `orchestrate compile` (artifacts beside it)")
    ver.add_argument("--samples", type=_positive, default=16,
                     help="inputs to verify with (default 16; generated, seed 0, unless "
                     "--calibration)")
    ver.add_argument("--calibration", help="inputs to verify with (.pt/.npz/folder; default: "
                     "--samples generated inputs)")
    ver.add_argument("--per-op", action="store_true", help="localize a divergence op by op")
    ver.add_argument("--max-steps", type=int, default=1,
                     help="allowed int8 steps per rounding stage, each value checked against the reference fed "
                     "the program's own inputs (default: 1)")
    ver.add_argument("--format", default="table", choices=("table", "json"),
                     help="table (default) or json")
    ver.add_argument("--runtime", default="auto", choices=("auto", "twin", "executorch", "both"),
                     help="auto (default): every method this machine has, the device code "
                     "judging: the twin, the real ExecuTorch runtime with the device kernels "
                     "built for the host, and QEMU's Cortex-M55 for CPU-only M55 programs; twin: "
                     "the host twin only; executorch: the real runtime, compared with the "
                     "twin; both: twin and runtime")
    ver.add_argument("--npu-model", default="auto", choices=("auto", "stream", "tosa", "both"),
                     help="how NPU partitions are computed: stream: Vela's command stream from "
                     "the .pte executed by the Ethos-U55/U65 functional model; tosa: the "
                     "partition's TOSA graph in the TOSA reference model; both: the two, "
                     "compared byte for byte; auto (default): both on the U55/U65, tosa on "
                     "the U85 (not modelled)")
    ver.add_argument("--require-device", action="store_true",
                     help="exit 5 unless device code (the host runtime or QEMU) ran and passed; "
                     "by default a twin-only pass exits 0 and says the device code did not run")
    ver.add_argument("--platform", help="the platform whose runner --qemu/--fvp and --runtime "
                     "auto use (a name or a YAML file; default: the installed platform named in "
                     "the manifest, never a file the artifacts folder names)")
    ver.add_argument("--executorch-src", help="ExecuTorch source tree for the host runtime "
                     "(or ORCHESTRATE_EXECUTORCH_SRC; default ../shared/third_party/executorch)")
    ver.add_argument("--cmsis-nn-src", help="CMSIS-NN source tree for the host runtime "
                     "(or ORCHESTRATE_CMSIS_NN_SRC; default ../shared/third_party/cmsis-nn)")
    ver.add_argument("--fvp", action="store_true", help="run the .bpte on a Corstone FVP")
    ver.add_argument("--qemu", action="store_true", help="run the .bpte on QEMU's Corstone-300 "
                     "(mps3-an547, Cortex-M55 + MVE) with the runner firmware built here "
                     "(an Ethos-U55/U65 program's NPU invocations go over semihosting to the "
                     "Ethos-U functional model on the host; not the Ethos-U85)")
    ver.add_argument("--atol", type=float, default=0.0,
                     help="--qemu: BundleIO absolute tolerance (default 0: byte-exact)")
    ver.add_argument("--profile", action="store_true",
                     help="--qemu: also run the runner's trace build and write an ETDump "
                     "profile (.etdp, one run per inference, times in instructions retired "
                     "under QEMU -icount, never cycles); `plan PROGRAM.pte --measured FILE` "
                     "shows it beside the plan (default: off)")
    ver.add_argument("--profile-out", metavar="FILE",
                     help="--profile: where to write the profile (default: PROGRAM.etdp beside "
                     "the .pte)")
    ver.add_argument("--runner-elf", help="ExecuTorch arm_executor_runner ELF for the FVP method "
                     "(--fvp, and the default verify where an FVP is installed; or "
                     "ORCHESTRATE_RUNNER_ELF; default: none, and --fvp says how to build one)")
    ver.add_argument("--timeout", type=_positive, default=600,
                     help="seconds a QEMU or FVP run may take (default 600)")
    _add_output_options(ver)

    size = sub.add_parser("size", help="where every byte of a .pte goes; with --firmware, "
                          "the flash and RAM of a built firmware project")
    size.add_argument("pte", nargs="?", help="a .pte file (or --firmware DIR)")
    size.add_argument("--firmware", metavar="DIR", help="a project `orchestrate firmware` "
                      "wrote and built: flash and RAM per component from its linker map "
                      "(default: none)")
    size.add_argument("--run", action="store_true", help="with --firmware: also run it on "
                      "QEMU to measure the stack's high-water mark (default: off)")
    size.add_argument("--format", default="table", choices=("table", "json"),
                      help="table (default) or json")
    _add_output_options(size)

    firmware = sub.add_parser(
        "firmware", help="write (and build) a firmware project for a compiled .pte: runtime, "
        "the program's kernels only, linker script from the plan, model_io.h, a C API")
    firmware.add_argument("pte", help="a .pte written by `orchestrate compile` (its artifacts "
                          "folder beside it)")
    firmware.add_argument("-o", "--output", required=True, metavar="DIR",
                          help="the project folder to write (new, or one this command wrote)")
    firmware.add_argument("--profile", default="release", choices=("release", "check"),
                          help="release (default): -Os runtime, -O3 kernels, no logs or program "
                          "verifier; check: ExecuTorch's logs and the program verifier")
    firmware.add_argument("--platform", help="an installed platform or a platform YAML "
                          "(default: the one the program was compiled for)")
    firmware.add_argument("--third-party", metavar="DIR", help="the ExecuTorch, CMSIS-NN and "
                          "flatbuffers sources (default: $ORCHESTRATE_THIRD_PARTY, "
                          "../shared/third_party, or what `orchestrate sources fetch` cloned)")
    firmware.add_argument("--no-build", action="store_true",
                          help="write the project only (default: build it with CMake)")
    firmware.add_argument("--run", action="store_true", help="run the built firmware's example "
                          "on QEMU and compare its outputs with the host twin's (default: off)")
    firmware.add_argument("--npu-device", default="hardware", choices=("hardware", "qemu-bridge"),
                          help="for programs with NPU partitions, the Ethos-U driver's device "
                          "layer: hardware (default: the NPU's registers and interrupt, for the "
                          "board or an FVP) or qemu-bridge (the host's functional model over "
                          "semihosting, so --run works on QEMU)")
    firmware.add_argument("--no-lto", action="store_true", help="release without link-time "
                          "optimization: more code, but size --firmware attributes every byte "
                          "to the object it came from (default: LTO in release, off in check)")
    firmware.add_argument("--method-pool-bytes", type=_positive, metavar="N",
                          help="bytes for the runtime's per-method structures (default: an "
                          "estimate from the program's values and instructions)")
    _add_output_options(firmware)

    reasons = sub.add_parser("reasons", help="every placement reason the plan can give")
    _add_output_options(reasons)

    cache = sub.add_parser("cache", help="where the cache is (compiles, host runtime, firmware) "
                           "and how big; --clear empties it")
    cache.add_argument("--clear", action="store_true", help="remove every cache entry")
    _add_output_options(cache)

    listing = sub.add_parser("list", help="the zoo models (with their inputs), platforms, NPU "
                             "configurations and CPUs this installation knows")
    listing.add_argument("--format", default="table", choices=("table", "json"),
                         help="table (default) or json")
    _add_output_options(listing)

    sources = sub.add_parser("sources", help="the third-party source trees the native builds "
                             "(host runtime, runner firmware) use: where each is found; "
                             "`sources fetch` clones the pinned commits into the cache")
    sources.add_argument("action", nargs="?", choices=("show", "fetch"), default="show",
                         help="show (default) or fetch")
    sources.add_argument("--from", dest="mirrors", action="append", default=[],
                         metavar="NAME=URL", help="fetch tree NAME from URL (a mirror or a "
                         "local git repository) instead of upstream; repeatable (default: the upstream URLs)")
    sources.add_argument("--only", help="comma-separated tree names to fetch (default: all)")
    _add_output_options(sources)

    doctor = sub.add_parser("doctor", help="which verification methods and builds this machine "
                            "can run, what each lacks and the command that fixes it; exit 5 "
                            "when a required one is missing")
    doctor.add_argument("--format", default="table", choices=("table", "json"),
                        help="table (default) or json")
    _add_output_options(doctor)
    return parser


class _Progress:
    """Which stage a long command is in and for how long, on stderr: on a terminal one line
    rewritten in place; otherwise (a CI log, a redirect) one line per finished stage with the
    elapsed time, so a compile of minutes shows where it is."""

    def __init__(self, enabled: bool, terminal: bool = True):
        self.enabled, self.terminal = enabled, terminal
        self._clock = time.perf_counter
        self._start = self._clock()

    def __call__(self, stage: str, event: str, seconds: float) -> None:
        if not self.enabled:
            return
        elapsed = self._clock() - self._start
        if not self.terminal:
            if event != "start":
                sys.stderr.write(f"[{elapsed:6.1f}s] {stage} done ({seconds:.1f}s)\n")
                sys.stderr.flush()
            return
        if event == "start":
            sys.stderr.write(f"\r\x1b[K[{elapsed:6.1f}s] {stage} ...")
        else:
            sys.stderr.write(f"\r\x1b[K[{elapsed:6.1f}s] {stage} done ({seconds:.1f}s)")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled and self.terminal:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _progress(args) -> _Progress:
    return _Progress(not getattr(args, "quiet", False), sys.stderr.isatty())


def _request(args, npu: str | None = None, model: str | None = None,
             runner_ops: set[str] | None = None) -> Request:
    """The Request the target options describe (`npu`/`model` override, for a sweep's jobs)."""
    return Request(model or args.model, platform=args.platform, npu=npu or args.npu,
                   cpu=args.cpu, io=args.io, calibration=args.calibration, cpu_hz=args.cpu_hz,
                   npu_hz=args.npu_hz, policy=args.policy,
                   placement=getattr(args, "placement", None),
                   memory_policy=args.memory_policy,
                   runner_ops=frozenset(runner_ops) if runner_ops is not None else None,
                   calibration_costs=args.calibration_costs)


def _plan(args, runner_ops=None):
    """Compile and plan as the options say (policy, placement, progress); the Plan."""
    progress = _progress(args)
    try:
        plan = api.plan(_request(args, runner_ops=runner_ops), progress=progress)
    finally:
        progress.finish()
    calibration = plan.compiled.calibration
    if calibration.warning and args.command == "compile":
        print(f"warning: {calibration.warning}", file=sys.stderr)
    return plan


def _print_cost_placement(plan, stream) -> None:
    if plan.cost_placement is None:
        return
    print("cost placement (--placement cost; every figure an estimate, sources in brackets):",
          file=stream)
    for line in plan.cost_placement.report_lines():
        print(f"  {line}", file=stream)


def _inputs(args) -> list[tuple[str, Path]]:
    """The files and folders a command reads, which no output may overwrite."""
    found = []
    model = getattr(args, "model", None)
    if model:
        file_part, sep, attribute = model.rpartition(":")
        found.append(("the model file", Path(file_part if sep and file_part.endswith(".py")
                                             else model)))
    found += [(what, Path(value)) for what, value in (
        ("the calibration data", getattr(args, "calibration", None)),
        ("the --runner-ops file", getattr(args, "runner_ops", None)),
        ("the --calibration-costs file", getattr(args, "calibration_costs", None)),
        ("the platform YAML", getattr(args, "platform", None))) if value]
    return [(what, path) for what, path in found if path.exists()]


def _check_outputs(args, report: str | None = None, pte: str | None = None,
                   pte_option: str = "-o", bundle: bool = False) -> None:
    """Fail before compiling, not after, when an output cannot be written or would overwrite an
    input, another output or something this tool did not write."""
    outputs: list[tuple[str, Path]] = []
    if report:
        check_output_file(Path(report), "-o")
        outputs.append(("-o", Path(report)))
    if pte:
        check_outputs(Path(pte), pte_option)
        outputs += [(pte_option, Path(pte)), (pte_option, artifacts_dir_for(Path(pte)))]
        if bundle:
            bpte = Path(pte).with_suffix(".bpte")
            check_output_file(bpte, "--bundle")
            outputs.append(("--bundle", bpte))
    inputs = _inputs(args)
    for position, (option, output) in enumerate(outputs):
        for what, path in inputs:
            if same_path(output, path):
                raise UserError(f"{option} '{output}' is {what}; writing there would overwrite "
                                f"it; choose another {option}")
            if _inside(path, output):
                raise UserError(f"{option} '{output}' would replace a folder holding {what} "
                                f"('{path}'); choose another {option}")
        for other_option, other in outputs[position + 1:]:
            if same_path(output, other) or _inside(other, output) or _inside(output, other):
                raise UserError(f"{option} '{output}' and {other_option} '{other}' would "
                                f"overwrite each other; give them different paths")


def _inside(path: Path, folder: Path) -> bool:
    """Whether `path` lies inside `folder` (both resolved; neither need exist)."""
    return Path(os.path.abspath(folder)) in Path(os.path.abspath(path)).parents


def cmd_plan(args) -> int:
    args.format = _plan_format(args.format, args.output)
    if args.measured:
        return _plan_measured(args)
    if args.firmware and args.model.endswith(".pte"):
        return _plan_firmware_of_pte(args)
    if args.model.endswith(".pte"):
        raise UserError(f"'{args.model}' is a compiled program: its plan is in its artifacts "
                        "folder (plan.json, report.html); give the model to plan it again, or "
                        "--measured FILE.etdp to see a profile beside its plan")
    _check_outputs(args, report=args.output, pte=args.pte, pte_option="--pte")
    _request_first(args)
    from orchestrator.artifacts.outputs import write_outputs  # lazy: heavy (torch)
    from orchestrator.planning.planner import (  # lazy: heavy (torch, executorch, vela)
        Gates, check_gates)
    from orchestrator.reports.coverage import (  # lazy: heavy (torch, executorch, vela)
        render_json, render_markdown)
    from orchestrator.reports.summary import read_runner_ops  # lazy: heavy (torch)

    _policy_first(args)
    runner_ops = read_runner_ops(args.runner_ops) if args.runner_ops else None
    if args.firmware:
        if args.format not in ("table", "json"):
            raise UserError(f"--firmware shows a table or JSON, not {args.format}; use --format "
                            "table or json")
        _firmware_of(args.firmware)  # an unreadable build is refused before compiling
    plan = _plan(args, runner_ops)
    compiled = plan.compiled
    firmware = _firmware_of(args.firmware, compiled.pte_bytes) if args.firmware else None
    if args.format == "html":
        text = plan.to_html()
    elif args.format == "model-explorer":
        from orchestrator.reports.explorer import render_node_data  # lazy: heavy (torch)

        text = render_node_data(plan)
    elif args.format == "table":
        text = plan.to_text(all_rows=args.all_rows)
        if firmware is not None:
            text += "\n" + "\n".join(firmware[0])
    else:
        render = {"json": render_json, "markdown": render_markdown}[args.format]
        text = render(compiled, plan.rows, plan.summary)
        if firmware is not None:
            as_json = json.loads(text)
            as_json["summary"]["firmware"] = firmware[1]
            text = json.dumps(as_json, indent=2)
    if args.output:
        atomic_write_bytes(Path(args.output),
                           (text + ("\n" if not text.endswith("\n") else "")).encode())
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    _print_cost_placement(plan, sys.stdout if not args.output and args.format == "table"
                          else sys.stderr)
    if args.pte:
        plan.refuse_miscompiles()  # the same refusals as `compile` (it wrote such programs)
        write_outputs(compiled, Path(args.pte), plan.artifact_files())
    check_gates(plan, Gates(args.fail_under_npu_coverage, args.max_partitions, args.require_fit,
                            runner_ops is not None, args.require_runnable))
    return 0


def _firmware_of(folder: str, pte_bytes: bytes | None = None) -> tuple[list[str], dict]:
    """The plan's firmware section (text lines, JSON) of the build in `folder`; with
    `pte_bytes`, refused unless the build embeds exactly that program."""

    from orchestrator.firmware import load_record  # lazy: heavy (torch)
    from orchestrator.firmware.footprint import (  # lazy: heavy (torch)
        footprint, plan_json, plan_section)

    record = load_record(folder)
    if pte_bytes is not None:
        digest = hashlib.sha256(pte_bytes).hexdigest()
        if record.get("pte_sha256") != digest:
            raise UserError(f"the firmware in {folder} was built from another program (SHA-256 "
                            f"{str(record.get('pte_sha256'))[:12]}..., this plan's program is "
                            f"{digest[:12]}...); build this one with `orchestrate firmware "
                            "PROGRAM.pte -o DIR`")
    measured = footprint(folder)
    return plan_section(folder, record, measured), plan_json(folder, record, measured)


def _plan_firmware_of_pte(args) -> int:
    """`plan PROGRAM.pte --firmware DIR`: the build's figures, checked against that program."""
    pte = Path(args.model)
    if not pte.is_file():
        raise UserError(f"'{args.model}' not found; give a .pte written by `orchestrate compile`")
    lines, as_json = _firmware_of(args.firmware, pte.read_bytes())
    print(json.dumps({"firmware": as_json}, indent=2) if args.format == "json"
          else "\n".join(lines))
    return 0


# Options that describe a compile: with a compiled .pte and --measured, its plan is the one
# compile wrote, so they would change nothing (name: the value that means "not given").
_COMPILE_OPTIONS = {"npu": None, "cpu": None, "calibration": None, "cpu_hz": None,
                    "npu_hz": None, "policy": None, "placement": None, "pte": None,
                    "runner_ops": None, "fail_under_npu_coverage": None, "max_partitions": None,
                    "require_fit": False, "require_runnable": False, "io": "float",
                    "memory_policy": "auto", "platform": "corstone300", "all_rows": False}


def _plan_measured(args) -> int:
    """`plan MODEL_OR_PTE --measured FILE.etdp`: the profile beside the plan, as a table or
    plan.json with `measured` blocks."""
    if args.format not in ("table", "json"):
        raise UserError(f"--measured shows a table or JSON, not {args.format}; use --format "
                        "table or json (or an -o ending in .json)")
    _check_outputs(args, report=args.output)
    if args.output and same_path(Path(args.output), Path(args.measured)):
        raise UserError(f"-o '{args.output}' is the --measured profile; writing there would "
                        "overwrite it; choose another -o")
    if args.model.endswith(".pte"):
        given = [f"--{name.replace('_', '-')}" for name, unset in _COMPILE_OPTIONS.items()
                 if getattr(args, name) != unset]
        if given:
            raise UserError(f"{', '.join(given)} {'describe' if len(given) > 1 else 'describes'}"
                            " a compile; with a compiled .pte the plan is the one `compile` "
                            "wrote: drop them, or give the model")
        measured = api.measure(args.model, args.measured,
                               calibration_costs=args.calibration_costs)
    else:
        read_profile(args.measured)  # an unreadable profile is refused before compiling
        _policy_first(args)
        measured = api.measure(_plan(args), args.measured)
    if args.format == "json":
        text = json.dumps(measured.to_json(), indent=2)
    else:
        text = measured.to_text()
    if args.output:
        atomic_write_bytes(Path(args.output), (text + "\n").encode())
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    return 0


_FORMAT_OF_SUFFIX = {".json": "json", ".md": "markdown", ".markdown": "markdown",
                     ".html": "html", ".htm": "html"}


def _plan_format(given: str | None, output: str | None) -> str:
    return _report_format(given, output, ("table", "json", "markdown", "html", "model-explorer"))


def _report_format(given: str | None, output: str | None, offered: tuple[str, ...]) -> str:
    """The report format: --format, else the one -o's extension names, else the table. A
    --format that contradicts the extension (`-o plan.html --format json`), or an extension
    naming a format the command does not write, is refused."""
    implied = _FORMAT_OF_SUFFIX.get(Path(output).suffix.lower()) if output else None
    if implied and implied not in offered and not given:
        raise UserError(f"-o {output} names a {implied} file, which this command does not "
                        f"write; use {', '.join(offered)} (--format, or a matching extension)")
    if given and implied and given != implied and not (given == "model-explorer"
                                                      and implied == "json"):
        raise UserError(f"-o {output} names a {implied} file but --format is {given}; drop "
                        f"--format or use a matching extension")
    return given or implied or "table"


def _request_first(args, models: list[str] | None = None) -> None:
    """The model spec(s) and the target, checked before anything heavy is imported: a typo in
    a name, a path or --platform/--npu/--cpu is answered at once (orchestrator/sources/specs.py,
    orchestrator/target.py read no torch)."""
    for model in models or [args.model]:
        model_spec(model)
    npus = [args.npu] if not getattr(args, "npus", None) else \
        [npu.strip() for npu in args.npus.split(",") if npu.strip()]
    for npu in npus:
        resolve_target(args.platform, npu=npu, cpu=args.cpu, io=args.io)


def _policy_first(args) -> None:
    """A bad policy file is refused before anything compiles."""
    if getattr(args, "policy", None):
        load_policy_arg(args.policy)


def cmd_compile(args) -> int:
    _check_outputs(args, pte=args.output, bundle=args.bundle)
    _request_first(args)
    _policy_first(args)
    plan = _plan(args)
    plan.refuse_miscompiles()
    compiled = plan.compiled
    from orchestrator.artifacts.outputs import write_outputs  # lazy: heavy (torch)

    art = write_outputs(compiled, Path(args.output), plan.artifact_files())
    s = plan.summary
    print(f"wrote {args.output}: {len(compiled.pte_bytes):,} B, arena {compiled.arena_bytes:,} B "
          f"(executorch plan); NPU partitions {s.npu_partitions}, NPU MAC coverage "
          f"{s.npu_mac_coverage_pct:.1f}%; artifacts in {art}")
    for line in io_quantization_lines(compiled.io_quant):
        print(line)
    _print_cost_placement(plan, sys.stdout)
    for fault in s.device_faults:
        print(f"warning: the device runtime cannot run this program: {fault}", file=sys.stderr)
    if args.bundle:
        from orchestrator.verification.bundle import write_bundle  # lazy: heavy (torch, executorch)

        bpte = Path(args.output).with_suffix(".bpte")
        write_bundle(Path(args.output), bpte)
        print(f"wrote {bpte} (BundleIO: test inputs with the host twin's expected outputs)")
    return 0


def io_quantization_lines(io_quant: dict) -> list[str]:
    """The int8 program I/O's scales and zero points, as the application needs them."""
    lines = []
    for kind in ("input", "output"):
        index = 0
        while f"{kind}{index}_scale" in io_quant:
            scale = io_quant[f"{kind}{index}_scale"]
            zero = io_quant.get(f"{kind}{index}_zp", 0)
            low = io_quant.get(f"{kind}{index}_quant_min", -128)
            high = io_quant.get(f"{kind}{index}_quant_max", 127)
            formula = (f"q = clamp(round(x / scale) + zero_point, {low}, {high})"
                       if kind == "input" else "x = (q - zero_point) * scale")
            lines.append(f"{kind} {index}: int8, scale {scale:.9g}, zero point {zero} ({formula})")
            index += 1
    if lines:
        lines.append("(also in the .pte as config methods input0_scale, input0_zp, ... and in "
                     "the artifacts' manifest.json io_quantization)")
    return lines


def _sweep_models(args) -> list[str]:
    models = [args.model]
    if args.models:
        if args.models.startswith("@"):
            listing = Path(args.models[1:])
            if not listing.is_file():
                raise UserError(f"--models file '{listing}' not found; give @FILE with one model "
                                "per line")
            extra = [line.strip() for line in listing.read_text().splitlines()
                     if line.strip() and not line.startswith("#")]
        else:
            extra = [m.strip() for m in args.models.split(",")]
        if not all(extra):
            raise UserError(f"--models '{args.models}' has an empty name; separate models with "
                            "single commas")
        models += [m for m in extra if m not in models]
    return models


def cmd_sweep(args) -> int:
    from orchestrator.sweeps.local import render_text, to_json  # lazy: heavy (tabulate)

    args.format = _report_format(args.format, args.output, ("table", "json", "html"))
    _check_outputs(args, report=args.output)
    _request_first(args, _sweep_models(args))
    _policy_first(args)
    try:
        platform = load_platform(args.platform)
    except PlatformError as error:
        raise UserError(str(error)) from None
    memory_policy(args.memory_policy, platform)  # named before any worker starts
    chosen = args.npus or args.npu
    # A board without an NPU sweeps its CPU alone.
    npus = ([npu.strip() for npu in chosen.split(",")] if chosen
            else list(platform.npu_options) or ["none"])
    if not all(npus):
        raise UserError(f"--npus '{chosen}' has an empty name; separate NPU names with single "
                        "commas, e.g. ethos-u55-128,none")
    models = _sweep_models(args)
    jobs = [_request(args, npu=npu, model=model) for model in models for npu in npus]
    warning = None if args.calibration else (
        "warning: calibration: no --calibration given; generated samples calibrate the "
        "quantizer, so accuracy figures are not representative")
    progress = _SweepProgress(len(jobs), not args.quiet, warning)
    rows = api.sweep(jobs, args.jobs, progress, executor=args.executor)
    progress.finish()
    if args.format == "html":
        text = render_sweep_html(to_json(rows), f"orchestrate sweep: {', '.join(models)} on "
                                 f"{args.platform}")
    else:
        text = json.dumps(to_json(rows), indent=2) if args.format == "json" else render_text(rows)
    if args.output:
        atomic_write_bytes(Path(args.output), (text + "\n").encode())
        print(f"wrote {args.output} ({args.format})", file=sys.stderr)
    else:
        print(text)
    return 0


class _SweepProgress(_Progress):
    """A line per finished configuration: "[  12.3s] 3/6 ds-cnn on ethos-u55-128"."""

    def __init__(self, total: int, enabled: bool, warning: str | None = None):
        super().__init__(enabled, sys.stderr.isatty())
        self.total, self.done, self.warning = total, 0, warning

    def __call__(self, label: str, event: str, seconds: float) -> None:
        if event == "checked" and self.warning:  # after the checks: a refusal prints alone
            print(self.warning, file=sys.stderr)
        if self.enabled and event == "done":
            self.done += 1
            sys.stderr.write(f"[{self._clock() - self._start:6.1f}s] {self.done}/{self.total} "
                             f"{label}\n")
            sys.stderr.flush()


def cmd_verify(args) -> int:
    pte = Path(args.pte)
    if not pte.is_file():
        raise UserError(f"'{args.pte}' not found; give a .pte written by `orchestrate compile`")
    if (args.profile or args.profile_out) and not args.qemu:
        raise UserError("--profile runs the runner's trace build on QEMU: add --qemu")
    if args.profile_out and not args.profile:
        raise UserError("--profile-out names where --profile writes: add --profile")
    if args.fvp or args.qemu:
        # Asked for by name, a platform the manifest names that is not installed is the user's
        # error (exit 2); inside the default verify it is that method's "not run".
        installed_platform(Manifest.load(pte).target, args.platform)
        profile_path = Path(args.profile_out) if args.profile_out else pte.with_suffix(".etdp")
        if args.profile:  # refused before anything runs
            check_output_file(profile_path, "--profile-out")
            if same_path(profile_path, pte):
                raise UserError(f"--profile-out '{profile_path}' is the program; choose another")

        (result,) = _verify_by((FVP,) if args.fvp else (QEMU,), args, pte)
        if args.profile:
            _profile_on_qemu(args, pte, profile_path, (result.report or {}).get("instructions"))
        return 0
    if args.runtime == "auto":
        from orchestrator.device_runs.combined import verify_all  # lazy: heavy (numpy, vela)

        verdict = verify_all(pte, samples=args.samples, calibration=args.calibration,
                             per_op=args.per_op, max_steps=args.max_steps,
                             executorch_src=args.executorch_src, cmsis_nn_src=args.cmsis_nn_src,
                             platform=args.platform, timeout_s=args.timeout,
                             npu_model=args.npu_model, runner_elf=args.runner_elf)
        _print_report(args, verdict.to_json(), verdict.render_text())
        if verdict.outcome == "failed":
            raise VerificationFailure(verdict.verdict)
        if verdict.exit_code == 5 or (args.require_device and verdict.outcome == "twin-only"):
            raise NotRun({"twin-only": f"--require-device: {verdict.verdict}",
                          "inconclusive": f"not run meaningfully: {verdict.verdict}"}.get(
                              verdict.outcome, verdict.verdict))
        return 0

    _verify_by({"twin": (TWIN,), "executorch": (RUNTIME,), "both": (TWIN, RUNTIME)}[args.runtime],
               args, pte)
    return 0


def _verify_by(names: tuple[str, ...], args, pte: Path) -> list:
    """`verify` by the methods named, each through its Verifier (the same objects the default
    verify runs: orchestrator/device_runs/combined.py), in order; prints each report. Exit
    codes: a method that cannot run here is "not run" (5), as is a partial or inconclusive one
    when nothing has failed; any failure is 4."""
    from orchestrator.device_runs.combined import verifier  # lazy: heavy (numpy, vela)

    inputs = VerifyInputs(samples=args.samples, calibration=args.calibration,
                          per_op=args.per_op, max_steps=args.max_steps,
                          npu_model=args.npu_model, platform=args.platform,
                          timeout_s=args.timeout, executorch_src=args.executorch_src,
                          cmsis_nn_src=args.cmsis_nn_src, runner_elf=args.runner_elf,
                          atol=args.atol)
    results, failures = [], []
    for name in names:
        result = verifier(name).run(pte, inputs)
        results.append(result)
        if result.outcome == "not-run":
            hint = ("; nothing was run (verify without --qemu/--fvp runs every method this "
                    "machine has)" if name in (QEMU, FVP) else "")
            raise NotRun(f"not run: {result.detail}{hint}")
        _print_report(args, result.report or {"method": name, "outcome": result.outcome,
                                               "detail": result.detail}, result.text)
        if result.outcome == "failed":
            failures.append(result.detail)
        elif result.outcome in ("partial", "inconclusive") and not failures:
            raise NotRun(f"not checked in full: {result.detail}" if result.outcome == "partial"
                         else f"not run meaningfully: {result.detail}")
    if failures:
        raise VerificationFailure("; ".join(failures))
    return results


def _print_report(args, as_json: dict, as_text: str) -> None:
    if args.format == "json":
        print(json.dumps(as_json, indent=2))
    else:
        print(as_text)


def _profile_on_qemu(args, pte: Path, path: Path, untraced: int | None) -> None:
    """The trace build's run, written as an ETDump and read back with ExecuTorch's reader."""
    platform = installed_platform(Manifest.load(pte).target, args.platform)

    profiled = qemu_profile(pte, platform, args.timeout, atol=args.atol,
                            npu_model=args.npu_model)
    # Its per-case totals include the tracer's own work (output CRCs): only the profile's
    # figures, which have it removed, are printed.
    print(f"profile: the runner's trace build on QEMU ({profiled.result.method}): PASS "
          f"({len(profiled.result.cases)} cases); the tracer's own work is removed from every "
          "figure below")
    atomic_write_bytes(path, profiled.etdump)
    print("\n".join(profile_lines(read_profile(path), path, untraced, pte)))


def cmd_size(args) -> int:
    from orchestrator.artifacts.size import render_json, render_text  # lazy: heavy (torch)

    if args.firmware:
        return _firmware_size(Path(args.firmware), args.run, args.format)
    if args.pte is None:
        raise UserError("give a .pte file, or --firmware DIR for a firmware project")
    report = api.size(args.pte)
    print(render_json(report) if args.format == "json" else render_text(report))
    return 0


def _firmware_size(folder: Path, run: bool, output_format: str) -> int:
    from orchestrator.firmware import load_record, run_on_qemu  # lazy: heavy (torch)
    from orchestrator.firmware.footprint import (  # lazy: heavy (torch)
        footprint, render_json, render_text)

    record = load_record(folder)
    stack_used = None
    if run:
        result = run_on_qemu(folder)
        if result.exit_code != 0 or result.stack_used_bytes is None:
            raise NotRun(f"the firmware's run on QEMU ended with exit code {result.exit_code} "
                         "before reporting its stack; nothing was measured")
        stack_used = result.stack_used_bytes
    measured = footprint(folder, stack_used)
    print(render_json(measured, record) if output_format == "json"
          else render_text(measured, record))
    return 0


def cmd_firmware(args) -> int:
    from orchestrator.firmware import firmware_run_lines, make_firmware  # lazy: heavy (torch)

    if args.run and args.no_build:
        raise UserError("--run needs the build: drop --no-build, or build the project and run "
                        "it yourself")
    result = make_firmware(args.pte, args.output, profile=args.profile, platform=args.platform,
                           third_party=args.third_party, build=not args.no_build,
                           method_pool=args.method_pool_bytes,
                           lto=False if args.no_lto else None, npu_device=args.npu_device,
                           run=args.run)
    record = result.record
    print(f"wrote {result.folder}: {record['profile']} firmware project for {record['program']} "
          f"on {record['platform']} ({record['cpu']}), {len(record['operators'])} operators "
          f"({', '.join(f'{k} {len(v)}' for k, v in record['kernel_libraries'].items())})")
    if result.elf is None:
        print(f"build it: cmake -S {result.folder} -B {result.folder}/build && cmake --build "
              f"{result.folder}/build")
        return 0
    print(f"built {result.elf}; `orchestrate size --firmware {result.folder}` shows its flash "
          "and RAM")
    if args.run:
        lines, passed = firmware_run_lines(result.folder, Path(args.pte))
        print("\n".join(lines))
        if not passed:
            raise VerificationFailure("the firmware's outputs on QEMU differ from the host twin's")
    return 0


def cmd_calibrate(args) -> int:
    result = api.calibrate(args.profiles, args.cpu, args.output, validate=args.validate,
                           bound=args.bound / 100)
    print(result.to_text())
    print(f"wrote {args.output}: use it with `orchestrate plan MODEL --calibration-costs "
          f"{args.output}` or a platform YAML's cpu: calibration_costs")
    return 0


def cmd_reasons(args) -> int:
    print(reasons_markdown(), end="")
    return 0


def known() -> dict:
    """What `orchestrate list` shows: zoo models with their inputs, platforms with their NPU
    options and default CPU, and every CPU with its ISA tier."""
    models = [{"name": m.name, "description": m.description, "kind": m.kind}
              for m in ZOO_MODELS]
    platforms = []
    for name in list_platforms():
        platform = load_platform(name)
        platforms.append({"name": name, "cpu": platform.cpu_default, "cpu_hz": platform.cpu_hz,
                          "npus": list(platform.npu_options), "npu_default": platform.npu_default,
                          "npu_hz": platform.npu_hz})
    return {"models": models, "platforms": platforms,
            "cpus": [{"name": cpu, "tier": tier} for cpu, tier in CPU_TIERS.items()]}


def cmd_cache(args) -> int:
    from orchestrator.artifacts.cache import cache_dir  # lazy: heavy (torch)

    roots = []
    for root in (cache_root(), cache_dir()):
        if root is not None and root not in roots:
            roots.append(root)
    for root in roots:
        parts = sorted(p for p in root.iterdir()) if root.is_dir() else []
        total = 0
        for part in parts:
            size = sum(f.stat().st_size for f in part.rglob("*") if f.is_file()) \
                if part.is_dir() else part.stat().st_size
            total += size
            print(f"  {part.name:<16} {size:>14,} B")
            if args.clear:
                shutil.rmtree(part, ignore_errors=True) if part.is_dir() else part.unlink()
        print(f"cache {root}: {total:,} B" + (" (cleared)" if args.clear else ""))
    return 0


def cmd_sources(args) -> int:
    if args.action == "fetch":
        mirrors = {}
        for entry in args.mirrors:
            name, sep, url = entry.partition("=")
            if not sep or not name or not url:
                raise UserError(f"--from '{entry}' is not NAME=URL, e.g. "
                                "--from executorch=/srv/mirrors/executorch.git")
            mirrors[name] = url
        names = [n.strip() for n in args.only.split(",")] if args.only else None
        try:
            fetch_sources(mirrors, names=names, log=print)
        except SourceFetchError as error:
            raise UserError(f"sources fetch: {error}") from None
        return 0
    missing = 0
    for source in PINNED:
        folder, origin = source_tree(source.name)
        state = "present" if folder.is_dir() else "missing"
        missing += not folder.is_dir()
        recorded = fetched_commit(folder) if folder.is_dir() else None
        commit = f", fetched at {recorded[:12]}" if recorded else ""
        print(f"  {source.name:<20} {state:<8} {folder} ({origin}{commit}); pinned "
              f"{source.commit[:12]}")
    if missing:
        print(f"{missing} tree(s) missing: {sources_hint()}")
    return 0


def cmd_doctor(args) -> int:
    report = api.doctor()
    print(json.dumps(report.to_json(), indent=2) if args.format == "json" else report.to_text())
    return report.exit_code


def cmd_list(args) -> int:
    data = known()
    if args.format == "json":
        print(json.dumps(data, indent=2))
        return 0
    lines = ["zoo models (orchestrate plan NAME):"]
    lines += [f"  {m['name']:<18} {m['description']}" for m in data["models"]]
    lines.append("platforms (--platform NAME, or a YAML of your own):")
    for p in data["platforms"]:
        npus = (f"NPUs {', '.join(p['npus'])} (default {p['npu_default']}, "
                f"{p['npu_hz'] / 1e6:g} MHz); --npu none for CPU only" if p["npus"] else "no NPU")
        lines.append(f"  {p['name']:<18} CPU {p['cpu']} at {p['cpu_hz'] / 1e6:g} MHz; {npus}")
    lines.append("CPUs (--cpu NAME): " + ", ".join(f"{c['name']} ({c['tier']})"
                                                  for c in data["cpus"]))
    print("\n".join(lines))
    return 0


class Terminated(BaseException):
    """SIGTERM, raised where the process is, so `finally` blocks and context managers remove
    temporary and staging folders as they do for Ctrl-C."""


def _on_sigterm(signum, frame):
    raise Terminated()


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is None:  # the command line, not a test calling main()
        signal.signal(signal.SIGTERM, _on_sigterm)
    if not args.verbose:
        quiet_upstream()
    else:
        os.environ["ORCHESTRATE_DEBUG"] = "1"
    handler = {"plan": cmd_plan, "compile": cmd_compile, "sweep": cmd_sweep,
               "verify": cmd_verify, "size": cmd_size, "firmware": cmd_firmware, "reasons": cmd_reasons,
               "calibrate": cmd_calibrate, "list": cmd_list, "cache": cmd_cache,
               "sources": cmd_sources, "doctor": cmd_doctor}[args.command]
    try:
        try:
            return handler(args)
        except Exception as error:
            translated = as_orchestrate_error(error)
            if translated is None or translated is error:
                raise
            raise translated from error
    except SystemExit as request:
        # argparse has finished by now, so only a user's model code can ask to exit; exiting
        # with its status would report success (or failure) for work never done.
        print(f"orchestrate: error: the model's code called exit({request.code!r}) while "
              f"`{args.command}` ran, so nothing was written; remove the exit() call (guard "
              "script code with `if __name__ == \"__main__\":`)", file=sys.stderr)
        return UserError.exit_code
    except NotRun as error:
        print(f"orchestrate: {error}", file=sys.stderr)
        return error.exit_code
    except OrchestrateError as error:
        if isinstance(error, UserError):
            prefix = "error: "
        elif isinstance(error, (GateFailure, VerificationFailure)):
            prefix = ""  # the message starts with "gate failed" / the verdict
        else:
            prefix = "internal error: "
        print(f"orchestrate: {prefix}{error}", file=sys.stderr)
        if type(error) is OrchestrateError and os.environ.get("ORCHESTRATE_DEBUG"):
            raise
        return error.exit_code
    except KeyboardInterrupt:
        print(f"orchestrate: interrupted; `{args.command}` stopped, its temporary files removed "
              "and earlier outputs left as they were", file=sys.stderr)
        return 130
    except Terminated:
        print(f"orchestrate: terminated (SIGTERM); `{args.command}` stopped, its temporary "
              "files removed and earlier outputs left as they were", file=sys.stderr)
        return 143
    except BrokenPipeError:
        # The reader went away (`orchestrate size x | head -1`): nothing more to say.
        _silence_stdout()
        return 0
    except Exception as error:  # noqa: BLE001 - a bug of ours or upstream's: one line, exit 1
        if os.environ.get("ORCHESTRATE_DEBUG"):
            raise
        message = " ".join(str(error).split())[:300]
        print(f"orchestrate: internal error: {type(error).__name__}: {message} (set "
              "ORCHESTRATE_DEBUG=1 for the traceback)", file=sys.stderr)
        return OrchestrateError.exit_code


if __name__ == "__main__":
    sys.exit(main())
