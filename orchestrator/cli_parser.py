"""`orchestrate`'s command line as data: every option once, every verb a list of them.

An option shared by verbs (the target options, the output options, `--format table|json`) is
one `Option` value here, attached to each verb that takes it; `build_parser` turns `VERBS` into
argparse parsers, in order, so `orchestrate VERB --help` lists the options as they are listed
here. Nothing here imports torch: `--help` and every argument error answer at once.
"""

from __future__ import annotations

import argparse
import math
import sysconfig
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

DESCRIPTION = ("`orchestrate`: a thin shell over the Python API (plan, compile, sweep, verify, "
               "size).")


class Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad options already; keep its message to one line."""

    def error(self, message: str):
        self.exit(2, f"orchestrate: error: {message}; see `{self.prog} --help`\n")


_CLOCK_UNITS = {"ghz": 1e9, "mhz": 1e6, "khz": 1e3, "hz": 1.0}


def clock_hz(text: str) -> float:
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


def percent(text: str) -> float:
    value = _number(text, float)
    if not (math.isfinite(value) and 0 <= value <= 100):
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage; give 0 to 100")
    return value


def count(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative; give 0 or more")
    return value


def positive(text: str) -> int:
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


@dataclass(frozen=True)
class Option:
    """One argument: its flags (or positional name) and argparse's keywords for it."""

    flags: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)


def option(*flags: str, **settings: Any) -> Option:
    return Option(flags, settings)


@dataclass(frozen=True)
class Verb:
    """One command: its name, its one-line help and its options in the order --help lists them."""

    name: str
    help: str
    options: tuple[Option, ...]
    epilog: str | None = None  # shown verbatim after the options (examples)


MODEL = option("model", help="zoo name (ds-cnn, mixed, ...), path/file.py:factory, "
               "a .py defining ModelUnderTest/ModelInputs, or a saved .pt2")

# What to compile for and how: plan, compile and sweep.
TARGET = (
    MODEL,
    option("--platform", default="corstone300",
           help="corstone300, corstone320, or a platform YAML of your own SoC "
                "(default: corstone300)"),
    option("--npu", help="e.g. ethos-u55-128, ethos-u65-256, ethos-u85-256; 'none' for CPU "
           "only (default: the platform's: ethos-u55-128 on corstone300, ethos-u85-256 "
           "on corstone320)"),
    option("--cpu", help="e.g. cortex-m55, cortex-m33, cortex-m0plus (default: the platform's)"),
    option("--io", default="float", choices=("float", "int8", "auto"),
           help="program input/output type; int8 removes the fp32 I/O buffers; auto "
                "compiles both and keeps int8 when the platform's firmware takes it "
                "and it makes the arena smaller (the report shows both arenas); default: float"),
    option("--calibration", help=".pt/.npz of samples or a folder of them (default: 8 "
           "generated samples, and the report warns that its ranges are not representative)"),
    option("--calibration-method", default="histogram",
           choices=("histogram", "minmax", "moving-average"),
           help="how calibration sets each activation's int8 range: histogram (default: "
           "upstream's observer, the range with the least rounding error, which may clip "
           "a tail), minmax (every calibration value, nothing clipped on them) or "
           "moving-average (the running average of each sample's min and max)"),
    option("--precision", metavar="MODULE=a16w8[,...]|auto",
           help="give the named modules (as model.named_modules() names them) int16 "
           "activations with int8 weights (upstream's a16w8 config; on the CPU int16 conv and "
           "linear run on CMSIS-NN's s16 kernels, other int16 ops in float); "
           "auto (plan, compile): raise the fewest modules, worst per-layer error first, "
           "until --min-snr/--max-accuracy-drop hold on --dataset; "
           "default: every module int8 (a8w8), or as the --policy file's precision: map "
           "says"),
    option("--cpu-hz", type=clock_hz, help="override the platform CPU clock: hertz "
           "(400000000, 4e8) or with a unit (400MHz); default: the platform YAML's"),
    option("--npu-hz", type=clock_hz, help="override the platform NPU clock (as "
           "--cpu-hz); default: the platform YAML's"),
    option("--policy", help="placement policy YAML (force ops/nodes/modules to the CPU, "
           "NPU, Vela config, clocks, an unrolled recurrence per step or whole on the NPU; see "
           "docs/tuning.md; default: none, greedy placement by operator support, recurrences "
           "per step)"),
    option("--memory-policy", default="auto", metavar="auto|in-place|FILE",
           help="where buffers live: auto (default: activations in the fastest "
           "region, split over the next when they do not fit; CPU weights copied at boot "
           "to the fastest region left with room when it pays), in-place (weights read "
           "from the .pte where it lies), or a YAML with any of weights: REGION, arena: "
           "REGION or [REGION, ...], keep_free: {REGION: BYTES}"),
    option("--placement", choices=("greedy", "cost"),
           help="greedy: every op the NPU accepts goes there (default); cost: move NPU "
           "islands to the CPU when the cost model says the program gets faster"),
    option("--calibration-costs", metavar="FILE",
           help="a CPU calibration written by `orchestrate calibrate` (or a shipped "
           "one: cortex-m55-qemu): CPU rows get its instruction estimate and/or "
           "calibrated cycles, each naming it as the source (default: the platform "
           "YAML's cpu: calibration_costs, else the cost model's own figures)"),
)

# `--precision auto`'s validation set and budget: plan and compile.
PRECISION_SEARCH = (
    option("--dataset", metavar="FILE|DIR",
           help="--precision auto: the validation set (.pt/.npz or a folder, inputs as "
           "--calibration takes them; labels for --max-accuracy-drop); default: none, and "
           "--precision auto is refused"),
    option("--labels", default="labels", metavar="KEY|FILE|none",
           help="--dataset: the array holding the labels (default 'labels'), a file of "
           "them, or none (a regression: judged by --min-snr only)"),
    option("--min-snr", type=float, metavar="DB",
           help="--precision auto: the budget: output 0's SNR against the float model, by "
           "the quantized reference on --dataset, at least DB (default: no SNR floor)"),
    option("--max-accuracy-drop", type=float, metavar="POINTS",
           help="--precision auto: the budget: top-1 at most POINTS below the float "
           "model's on --dataset (default: no accuracy budget)"),
)

# How a command talks: every verb takes these.
OUTPUT = (
    option("--quiet", action="store_true", help="no progress lines on stderr"),
    option("--verbose", action="store_true",
           help="show upstream warnings and tracebacks of internal errors"),
)

TABLE_OR_JSON = option("--format", default="table", choices=("table", "json"),
                       help="table (default) or json")
PROGRAM = option("pte", help="a .pte written by `orchestrate compile` (artifacts beside it)")

PLAN_EXAMPLES = """examples:
  # DS-CNN on the default platform, Corstone-300 (Cortex-M55 + Ethos-U55-128)
  orchestrate plan ds-cnn
  # CPU only, every time at a 400 MHz part
  orchestrate plan ds-cnn --npu none --cpu-hz 400MHz
  # your model (a factory in a .py file) on a U65, as an HTML report
  orchestrate plan my_model.py:build --npu ethos-u65-256 -o plan.html
  # a CI gate: exit 3 under 90% NPU MAC coverage or when it does not fit the memories
  orchestrate plan ds-cnn --fail-under-npu-coverage 90 --require-fit

docs/plan.md explains every line of the report."""

PLAN = Verb("plan", "where every op runs and why, with costs and memory",
            TARGET + PRECISION_SEARCH + OUTPUT + (
    option("--format", choices=("table", "json", "markdown", "html", "model-explorer"),
           help="report format (default: from -o's extension: .json, .md, .html; "
           "else table); a --format that contradicts -o's extension is refused"),
    option("--all-rows", action="store_true",
           help="table: list every op of an unrolled recurrence (GRU/LSTM/RNN) "
           "instead of one line per recurrence"),
    option("-o", "--output", help="write the report to this file, atomically "
           "(default: standard output)"),
    option("--pte", help="also write the compiled .pte (and its artifacts) here "
           "(default: not written)"),
    option("--runner-ops", help="file listing the operators your runner registers; "
           "the plan flags every op it lacks (default: no check against a runner)"),
    option("--fail-under-npu-coverage", type=percent, metavar="PCT",
           help="CI gate: exit 3 when less than PCT%% of the MACs run on the NPU "
           "(default: no gate)"),
    option("--max-partitions", type=count, metavar="N",
           help="CI gate: exit 3 when the program has more than N NPU partitions "
           "(default: no gate)"),
    option("--require-fit", action="store_true",
           help="CI gate: exit 3 when the program, its arenas and the NPU scratch do "
           "not fit the platform's memories (default: report only)"),
    option("--require-runnable", action="store_true",
           help="fail if an op has no device kernel or breaks a kernel's layout rule"),
    option("--measured", metavar="FILE.etdp",
           help="show a profile's measured figures beside the plan's model, per op "
           "and in total: an ETDump from `verify --qemu --profile` or ExecuTorch's "
           "ETDumpGen on a device; MODEL may then be the profiled .pte (its plan is "
           "read from its artifacts folder); a profile of another program is "
           "refused; --format table or json (default: no profile)"),
    option("--firmware", metavar="DIR",
           help="show the flash and RAM of a firmware built for this program "
           "(`orchestrate firmware PROGRAM.pte -o DIR`) beside the plan's estimates, "
           "from the build's linker map; MODEL may then be that .pte; a build of "
           "another program is refused (default: none)"),
), epilog=PLAN_EXAMPLES)

COMPILE = Verb("compile", "compile to one .pte plus an artifacts folder",
               TARGET + PRECISION_SEARCH + OUTPUT + (
    option("-o", "--output", required=True, help="output .pte path (required; the "
           "artifacts folder goes beside it)"),
    option("--bundle", action="store_true",
           help="also write a BundleIO .bpte with test inputs and expected outputs"),
    option("--require-fit", action="store_true",
           help="exit 3, writing nothing, when the program, its arenas and the NPU scratch "
           "do not fit the platform's memories (default: write it and warn)"),
))

SWEEP = Verb("sweep", "plan one model for several NPU/CPU configurations", TARGET + OUTPUT + (
    option("--npus", help="comma-separated NPU names (default: all the platform offers; "
           "'none' for CPU only)"),
    option("--models", help="more models, comma-separated, or @FILE with one per line "
           "(one row per model x configuration; default: only MODEL)"),
    option("--jobs", type=positive, help="configurations compiled at once, in worker "
           "processes (default: the machine's cores)"),
    option("--executor", default="local", metavar="local|ray|ray:ADDRESS",
           help="where configurations compile: local worker processes (default), "
           "ray (a Ray instance started here with --jobs CPUs) or ray:ADDRESS (a "
           "running Ray cluster, e.g. ray:auto, ray:10.0.0.1:6379; the cache folder "
           "must be on a filesystem its nodes share); needs pip install "
           "'orchestrate[ray]'"),
    option("--format", choices=("table", "json", "html"),
           help="table, json, or html (latency, flash and RAM per configuration); "
           "default: from -o's extension (.json, .html), else table"),
    option("-o", "--output", help="write the table to this file (default: standard "
           "output)"),
))

CALIBRATE = Verb(
    "calibrate", "fit the CPU cost model's per-op-class factors to measured profiles "
    "and write a calibration file for plan/compile --calibration-costs", (
        option("profiles", nargs="+", metavar="PROFILE",
               help="PROFILE.etdp (from `verify --qemu --profile`: instructions; or a "
               "device's, in cycles) with its PROFILE.pte beside it, or "
               "PROGRAM.pte=PROFILE.etdp; the program's SHA-256 must be the profile's"),
        option("--cpu", required=True, help="the core the programs were compiled for, "
               "e.g. cortex-m55"),
        option("-o", "--output", required=True, metavar="FILE.yaml",
               help="the calibration file to write (atomically)"),
        option("--validate", nargs="+", default=[], metavar="PROFILE",
               help="more profiles (same forms), never fitted to: the file records their "
               "per-class figures before and after (default: none)"),
        option("--bound", type=percent, default=15.0, metavar="PCT",
               help="--validate: the per-class error called within (default 15)"),
    ) + OUTPUT)

VERIFY = Verb("verify", "check the .pte: host twin, real ExecuTorch runtime, QEMU Corstone-300 "
              "or an FVP", (
    PROGRAM,
    option("--samples", type=positive, default=None,
           help="inputs to verify with (default 16; generated, seed 0, unless "
           "--calibration; with --dataset: the first N, default all)"),
    option("--frames", type=positive, default=None, metavar="N",
           help="a program with state (a streaming model): N frames in order from its "
           "initial state, on every method, QEMU included (the inputs as --samples makes "
           "them; each frame's outputs compared); default: --samples frames, 4 on QEMU"),
    option("--dataset", metavar="FILE|DIR",
           help="a labelled set (.pt dict or .npz: inputs as --calibration takes them and "
           "an integer class per sample; or a folder of them): report top-1/top-5 "
           "accuracy, agreement with the float model and per-class accuracy by the float "
           "model, the quantized reference, the twin and the host runtime (every sample) "
           "and QEMU (--qemu-samples, byte-exact against the twin); default: none, verify "
           "by every method on --samples inputs"),
    option("--per-layer-error", action="store_true",
           help="rank the layers by the quantization error each adds: the error at its "
           "output in the quantized reference, and the final output's with only it "
           "quantized (inputs: --dataset, --calibration or --samples generated)"),
    option("--html", metavar="FILE",
           help="--per-layer-error: also write the program's plan page with every op "
           "coloured by its layer's measured SNR, and the layer table (default: not "
           "written)"),
    option("--model-explorer", metavar="FILE",
           help="--per-layer-error: also write Model Explorer node data: each "
           "instruction's worst layer SNR (dB), coloured by band (default: not written)"),
    option("--labels", default="labels", metavar="KEY|FILE|none",
           help="--dataset: the array holding the labels (default 'labels'), a file of "
           "them, or none (a regression: errors against the float model only)"),
    option("--qemu-samples", type=int, default=4, metavar="N",
           help="--dataset: the first N samples also run on QEMU (default 4; 0: none)"),
    option("--min-accuracy", type=percent, metavar="PCT",
           help="--dataset: exit 4 unless the device's top-1 accuracy reaches PCT "
           "(default: no floor)"),
    option("--max-accuracy-drop", type=float, metavar="POINTS",
           help="--dataset: exit 4 when the device's top-1 is more than POINTS below the "
           "float model's (default: no limit)"),
    option("--calibration", help="inputs to verify with (.pt/.npz/folder; default: "
           "--samples generated inputs)"),
    option("--per-op", action="store_true", help="localize a divergence op by op"),
    option("--max-steps", type=int, default=1,
           help="allowed int8 steps per rounding stage, each value checked against the "
           "reference fed the program's own inputs (default: 1)"),
    TABLE_OR_JSON,
    option("--runtime", default="auto", choices=("auto", "twin", "executorch", "both"),
           help="auto (default): every method this machine has, the device code "
           "judging: the twin, the real ExecuTorch runtime with the device kernels "
           "built for the host, and QEMU's Cortex-M55 for CPU-only M55 programs; twin: "
           "the host twin only; executorch: the real runtime, compared with the "
           "twin; both: twin and runtime"),
    option("--npu-model", default="auto", choices=("auto", "stream", "tosa", "both"),
           help="how NPU partitions are computed: stream: Vela's command stream from "
           "the .pte executed by the Ethos-U55/U65 or Ethos-U85 functional model (a U85 "
           "partition the model does not execute completely: its TOSA graph, named); tosa: "
           "the partition's TOSA graph in the TOSA reference model; both: the two, compared "
           "byte for byte; auto (default): both"),
    option("--require-device", action="store_true",
           help="exit 5 unless device code (the host runtime or QEMU) ran and passed; "
           "by default a twin-only pass exits 0 and says the device code did not run"),
    option("--platform", help="the platform whose runner --qemu/--fvp and --runtime "
           "auto use (a name or a YAML file; default: the installed platform named in "
           "the manifest, never a file the artifacts folder names)"),
    option("--executorch-src", help="ExecuTorch source tree for the host runtime "
           "(or ORCHESTRATE_EXECUTORCH_SRC; default ../shared/third_party/executorch)"),
    option("--cmsis-nn-src", help="CMSIS-NN source tree for the host runtime "
           "(or ORCHESTRATE_CMSIS_NN_SRC; default ../shared/third_party/cmsis-nn)"),
    option("--fvp", action="store_true", help="run the .bpte on a Corstone FVP"),
    option("--qemu", action="store_true", help="run the .bpte on QEMU's Corstone-300 "
           "(mps3-an547, Cortex-M55 + MVE) with the runner firmware built here "
           "(an Ethos-U program's NPU invocations go over semihosting to the host, "
           "computed as --npu-model says; a Corstone-320 program runs as its M85 build "
           "on that M55)"),
    option("--atol", type=float, default=0.0,
           help="--qemu: BundleIO absolute tolerance (default 0: byte-exact)"),
    option("--profile", action="store_true",
           help="--qemu: also run the runner's trace build and write an ETDump "
           "profile (.etdp, one run per inference, times in instructions retired "
           "under QEMU -icount, never cycles); `plan PROGRAM.pte --measured FILE` "
           "shows it beside the plan (default: off)"),
    option("--profile-out", metavar="FILE",
           help="--profile: where to write the profile (default: PROGRAM.etdp beside "
           "the .pte)"),
    option("--runner-elf", help="ExecuTorch arm_executor_runner ELF for the FVP method "
           "(--fvp, and the default verify where an FVP is installed; or "
           "ORCHESTRATE_RUNNER_ELF; default: none, and --fvp says how to build one)"),
    option("--timeout", type=positive, default=600,
           help="seconds a QEMU or FVP run may take (default 600)"),
) + OUTPUT)

SIZE = Verb("size", "where every byte of a .pte goes; with --firmware, the flash and RAM of a "
            "built firmware project", (
    option("pte", nargs="?", help="a .pte file (or --firmware DIR)"),
    option("--firmware", metavar="DIR", help="a project `orchestrate firmware` "
           "wrote and built: flash and RAM per component from its linker map "
           "(default: none)"),
    option("--run", action="store_true", help="with --firmware: also run it on "
           "QEMU to measure the stack's high-water mark (default: off)"),
    TABLE_OR_JSON,
) + OUTPUT)

FIRMWARE = Verb(
    "firmware", "write (and build) a firmware project for a compiled .pte: runtime, "
    "the program's kernels only, linker script from the plan, model_io.h, a C API", (
        option("pte", help="a .pte written by `orchestrate compile` (its artifacts "
               "folder beside it)"),
        option("-o", "--output", required=True, metavar="DIR",
               help="the project folder to write (new, or one this command wrote)"),
        option("--profile", default="release", choices=("release", "check"),
               help="release (default): -Os runtime, -O3 kernels, no logs or program "
               "verifier; check: ExecuTorch's logs, the program verifier and each Ethos-U "
               "command stream bounded before it is submitted"),
        option("--platform", help="an installed platform or a platform YAML "
               "(default: the one the program was compiled for)"),
        option("--third-party", metavar="DIR", help="the ExecuTorch, CMSIS-NN and "
               "flatbuffers sources (default: $ORCHESTRATE_THIRD_PARTY, "
               "../shared/third_party, or what `orchestrate sources fetch` cloned)"),
        option("--no-build", action="store_true",
               help="write the project only (default: build it with CMake)"),
        option("--run", action="store_true", help="run the built firmware's example "
               "on QEMU and compare each frame's outputs with the host twin's (default: off)"),
        option("--inputs", metavar="FILE", help="the example inputs, in order (.pt/.npz or a "
               "folder, as --calibration takes them; float samples quantized for int8 I/O): "
               "for a program with state, the frames of one stream (default: generated)"),
        option("--frames", type=positive, metavar="N", help="how many example inputs the "
               "example main runs in turn (default: all of --inputs; else 1, or 4 for a "
               "program with state, which then also runs frame 0 after model_reset())"),
        option("--npu-device", default="hardware", choices=("hardware", "qemu-bridge"),
               help="for programs with NPU partitions, the Ethos-U driver's device "
               "layer: hardware (default: the NPU's registers and interrupt, for the "
               "board or an FVP) or qemu-bridge (the host's functional model over "
               "semihosting, so --run works on QEMU)"),
        option("--no-lto", action="store_true", help="release without link-time "
               "optimization: more code, but size --firmware attributes every byte "
               "to the object it came from (default: LTO in release, off in check)"),
        option("--method-pool-bytes", type=positive, metavar="N",
               help="bytes for the runtime's per-method structures (default: an "
               "estimate from the program's values and instructions)"),
    ) + OUTPUT)

COMPARE = Verb(
    "compare", "a .tflite both ways on the same target and QEMU machine: ours (compiled by "
    "orchestrate) against the incumbent's (vela + TensorFlow Lite Micro): NPU figures, CPU "
    "instructions, arena, file size and outputs, each with its source", (
        option("model", help="a full-integer .tflite file"),
        option("--platform", default="corstone300",
               help="corstone300 or corstone320 (default: corstone300)"),
        option("--npu", help="e.g. ethos-u55-128, ethos-u85-256; 'none' for CPU only "
               "(default: the platform's)"),
        option("--cpu", help="e.g. cortex-m55, cortex-m4 (default: the platform's)"),
        option("--npus", metavar="NAME,...", help="compare on each of these NPUs of the "
               "platform ('none': CPU only) and print one table, a row per target (with "
               "-o .json, every comparison; default: the one --npu)"),
        option("--samples", type=positive, default=4, metavar="N",
               help="random inputs in the file's types both programs run (default: 4)"),
        option("-o", "--output", help="also write the comparison as .json or .html "
               "(default: none)"),
        option("--work", metavar="DIR", help="keep both compiles (our .pte, Vela's output) "
               "in DIR (default: a temporary folder)"),
        option("--per-op", action="store_true", help="also each side's instructions per "
               "TFLite operator kind, from a profiled run of each (our runner's trace build, "
               "TFLM's MicroProfiler; default: off)"),
        option("--firmware", action="store_true", help="also build both release images (our "
               "`firmware --profile release` project; TFLM and the file linked with the same "
               "core flags, LTO and newlib-nano) and compare their flash and RAM from the "
               "linker maps; without an NPU both also run on QEMU for the stack's high-water "
               "mark (default: off)"),
        TABLE_OR_JSON,
    ) + OUTPUT)

REASONS = Verb("reasons", "every placement reason the plan can give", OUTPUT)

CACHE = Verb("cache", "where the cache is (compiles, host runtime, firmware) and how big; "
             "--clear empties it", (
    option("--clear", action="store_true", help="remove every cache entry"),
) + OUTPUT)

LIST = Verb("list", "the zoo models (with their inputs), platforms, NPU configurations and "
            "CPUs this installation knows", (TABLE_OR_JSON,) + OUTPUT)

SOURCES = Verb("sources", "the third-party source trees the native builds (host runtime, "
               "runner firmware) use: where each is found; `sources fetch` clones the pinned "
               "commits into the cache", (
    option("action", nargs="?", choices=("show", "fetch"), default="show",
           help="show (default) or fetch"),
    option("--from", dest="mirrors", action="append", default=[],
           metavar="NAME=URL", help="fetch tree NAME from URL (a mirror or a "
           "local git repository) instead of upstream; repeatable (default: the upstream URLs)"),
    option("--only", help="comma-separated tree names to fetch (default: all)"),
) + OUTPUT)

DOCTOR = Verb("doctor", "which verification methods and builds this machine can run, what "
              "each lacks and the command that fixes it; exit 5 when a required one is "
              "missing", (TABLE_OR_JSON,) + OUTPUT)

# Every command, in the order `orchestrate --help` lists them.
VERBS = (PLAN, COMPILE, SWEEP, CALIBRATE, VERIFY, SIZE, FIRMWARE, COMPARE, REASONS, CACHE, LIST,
         SOURCES, DOCTOR)


def version() -> str:
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


def docs_folder() -> Path:
    """Where the README and docs/ are: the checkout's, else the installed wheel's copy
    (pyproject's data-files: share/doc/orchestrate under the environment's data path)."""
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "docs" / "plan.md").is_file():
        return checkout
    return Path(sysconfig.get_paths()["data"]) / "share" / "doc" / "orchestrate"


def build_parser() -> argparse.ArgumentParser:
    """The `orchestrate` parser: one subparser per verb of VERBS, its options added in order."""
    # raw: argparse's wrapping breaks a long path in two
    parser = Parser(prog="orchestrate", description=DESCRIPTION,
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog=f"Documentation: {docs_folder() / 'README.md'}\n"
                           f"and the pages in {docs_folder() / 'docs'}\n"
                           "(docs/plan.md, docs/verify.md, ... as the help texts name them).")
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for verb in VERBS:
        shown = ({"formatter_class": argparse.RawDescriptionHelpFormatter, "epilog": verb.epilog}
                 if verb.epilog else {})
        command = sub.add_parser(verb.name, help=verb.help, **shown)
        for each in verb.options:
            command.add_argument(*each.flags, **each.settings)
    return parser
