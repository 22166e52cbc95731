"""The Python API: the same verbs as the CLI, which is a thin shell over them.

Every `orchestrate` command is a function here (`help(orchestrator)` lists them); each returns
a value (a Plan, a report, a dataclass of orchestrator/results.py) and prints nothing.

    import orchestrator
    plan = orchestrator.plan("ds-cnn", platform="corstone300", npu="ethos-u55-128")
    print(plan.summary.npu_mac_coverage_pct, plan.to_json()["summary"])
    compiled = orchestrator.compile("ds-cnn", "out/ds_cnn.pte", npu="ethos-u55-128")
    verdict = orchestrator.verify("out/ds_cnn.pte")
    assert verdict.passed, verdict.verdict

`plan` and `compile` take a model spec with keyword options, or one `Request`
(orchestrator/request.py), and `sweep` a list of them — the CLI builds Requests and calls these
functions, so every path resolves and checks a request the same way. Errors are
`orchestrator.errors.OrchestrateError`s (UserError for bad input), as in the CLI.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from examples.zoo_index import ZOO_MODELS
from kernels.cache_root import cache_root
from kernels.native.sources import (PINNED, SourceFetchError, fetched_commit, source_tree,
                                    sources_hint)
from kernels.native.sources import fetch_sources as fetch_pinned_sources
from kernels.safe_files import DataFileError, load_json
from orchestrator.artifacts.files import (atomic_write_bytes, check_output_file, check_outputs,
                                          same_path)
from orchestrator.artifacts.manifest import Manifest
from orchestrator.artifacts.profile import read_profile
from orchestrator.errors import NotRun, UserError
from orchestrator.machine import MachineReport, check_machine
from orchestrator.reports.html import render_plan_html
from orchestrator.request import Request, resolve
from orchestrator.results import (VERIFY_METHODS, CacheEntry, CacheFolder, CpuInfo,
                                  FirmwareProject, FirmwareSize, Known, PlatformInfo, ProfileRun,
                                  SourceTree, Sources, Verification, ZooModel)
from orchestrator.verification.methods import (FVP, QEMU, RUNTIME, TFLM, TWIN, MethodResult,
                                               VerifyInputs)
from partitioners.reasons import markdown as reasons_markdown
from platforms import PlatformError, normalize_cpu
from platforms.platform import CPU_TIERS, list_platforms, load_platform

if TYPE_CHECKING:  # the compile stack imports torch and ExecuTorch (seconds): imported on use
    from orchestrator.comparison.compare import Comparison
    from orchestrator.reports.measured import MeasuredPlan
    from orchestrator.planning.plan import Plan
    from orchestrator.planning.precision_search import PrecisionSearch
    from orchestrator.verification.twin import TwinProgram


@dataclass(frozen=True)
class CompileResult:
    """What `compile` wrote and the plan of it."""

    pte: Path
    artifacts: Path
    plan: "Plan"

    @property
    def compiled(self):
        return self.plan.compiled


def as_request(model: str | Request, **options) -> Request:
    """`model` when it is a Request (then no options), else a Request of `model` and `options`."""
    if isinstance(model, Request):
        if options:
            raise TypeError(f"give a Request or options, not both ({', '.join(options)})")
        return model
    return Request(model, **options)


def plan(model: str | Request, progress=None, **options) -> "Plan":
    """Compile the request's model for its target and return its Plan (nothing is written).

    Options are Request's fields: platform, npu, cpu, io, calibration, calibration_method
    ("histogram", upstream's, "minmax" or "moving-average": the activation observer,
    orchestrator/compilation/observers.py), precision ("features.2=a16w8,..." or
    {module: "a16w8"}: int16 activations for those modules on NPU targets,
    orchestrator/compilation/precision.py), cpu_hz, npu_hz, policy (a
    placement policy YAML path or Policy), placement ("greedy" or "cost"; with "cost" the Plan
    carries the decisions in `plan.cost_placement`), memory_policy, runner_ops,
    calibration_costs (a file from `calibrate`: CPU rows' figures scaled by it, its name in
    their sources).
    `progress(stage, event, seconds)` hears each stage start and finish."""
    from orchestrator.planning.run import plan_request  # lazy: heavy (torch)

    return plan_request(as_request(model, **options), progress)


def precision_auto(model: str | Request, dataset, labels: str | None = "labels",
                   min_snr_db: float | None = None, max_accuracy_drop: float | None = None,
                   progress=None, announce=None, **options) -> "PrecisionSearch":
    """`--precision auto`: starting from int8, raise to a16w8 the fewest modules, in the order
    of the int8 program's per-layer error ranking, until output 0's SNR against the float model
    reaches `min_snr_db` and/or top-1 drops at most `max_accuracy_drop` points (labels needed)
    on `dataset`, measured by the quantized reference. A PrecisionSearch: every step's figures
    (`.render_text()`, `.to_json()`) and the chosen program's Plan (`.plan`; `write_program`
    writes it); VerificationFailure (exit 4) when every raise misses the budget
    (orchestrator/planning/precision_search.py)."""
    from orchestrator.planning.precision_search import search  # lazy: heavy (torch)

    if dataset is None:
        raise UserError("--precision auto needs a validation set: --dataset FILE|DIR (inputs "
                        "as --calibration takes them; labels for --max-accuracy-drop)")
    return search(as_request(model, **options), str(dataset), labels, min_snr_db,
                  max_accuracy_drop, progress, announce)


def compile(model: str | Request, output, bundle: bool = False, progress=None,  # noqa: A001
            **options) -> CompileResult:
    """Compile the request's model to `output` (.pte) with everything the CLI writes beside it;
    `bundle` also writes the BundleIO `.bpte`."""
    output = Path(output)
    check_outputs(output)
    return write_program(plan(as_request(model, **options), progress=progress), output, bundle)


def write_program(made: "Plan", output, bundle: bool = False) -> CompileResult:
    """Write a planned program as `compile` does: the `.pte` and its artifacts folder (a
    program the device would compute wrongly is refused first); `bundle` adds the `.bpte`."""
    from orchestrator.artifacts.outputs import write_outputs  # lazy: heavy (torch)

    output = Path(output)
    made.refuse_miscompiles()
    artifacts = write_outputs(made.compiled, output, made.artifact_files())
    if bundle:
        from orchestrator.verification.bundle import write_bundle  # lazy: heavy (torch, executorch)

        write_bundle(output, output.with_suffix(".bpte"))
    return CompileResult(output, artifacts, made)


def check_gates(made: "Plan", min_npu_coverage_pct: float | None = None,
                max_partitions: int | None = None, require_fit: bool = False,
                require_runner_ops: bool = False, require_runnable: bool = False) -> None:
    """Raise GateFailure (exit 3) naming every CI gate the plan fails (`plan`'s --fail-under-npu-
    coverage, --max-partitions, --require-fit, --runner-ops, --require-runnable)."""
    from orchestrator.planning.planner import Gates  # lazy: heavy (torch, executorch, vela)
    from orchestrator.planning.planner import check_gates as check  # lazy: heavy (torch)

    check(made, Gates(min_npu_coverage_pct, max_partitions, require_fit, require_runner_ops,
                      require_runnable))


def sweep(requests, workers: int | None = None, progress=None, executor: str = "local"):
    """Plan every request (a Request, or a model spec planned with the defaults), `workers` at a
    time, and return one orchestrator.sweeps.local.SweepRow each, in order.

    Every request is resolved and every model loaded before anything compiles, so a bad target
    or model spec is one UserError, not a failure part-way. `executor`: `local`, `ray` or
    `ray:ADDRESS` (orchestrator/sweeps/ray_executor.py); `progress(label, event, seconds)`
    hears "checked" once every request is resolved and loaded, then "done" per configuration.
    A sweep plans greedily (cost placement is `plan`'s)."""
    from orchestrator.sources.loader import load_model  # lazy: heavy (torch)
    from orchestrator.sweeps.local import Executor, sweep_jobs  # lazy: heavy (multiprocessing)
    from orchestrator.sweeps.ray_executor import import_ray  # lazy: optional (ray)

    jobs = [as_request(r) for r in requests]
    if Executor.parse(executor).kind == "ray":  # a missing Ray is named before any compile
        import_ray()
    for job in jobs:
        if resolve(job).placement == "cost":
            raise UserError("sweep plans greedily; run `orchestrate plan --placement cost` for "
                            "one configuration")
    for model in dict.fromkeys(job.model for job in jobs):
        load_model(model)
    if progress:
        progress("sweep", "checked", 0.0)  # every request is good: compiling starts
    return sweep_jobs(jobs, workers, progress, executor=executor)


def doctor() -> MachineReport:
    """What this machine can verify and build (orchestrator/machine.py: every method with what
    it needs, where it looked and the fix; `exit_code` 0 when every required method is here,
    else 5). Imports nothing heavy and builds nothing."""
    return check_machine()


def size(pte):
    """Where the bytes of a `.pte` go (orchestrator/artifacts/size.py: SizeReport; render it
    with its render_text / render_json). A file that is not an ExecuTorch program is a
    UserError."""
    from orchestrator.artifacts.size import analyze  # lazy: heavy (torch)

    pte = Path(pte)
    if not pte.is_file():
        raise UserError(f"'{pte}' not found; give a .pte file")
    try:
        return analyze(pte)
    except Exception as error:  # noqa: BLE001 - not a program the schema can read
        raise UserError(f"'{pte}' is not an ExecuTorch program ({type(error).__name__}); "
                        "give a .pte written by `orchestrate compile`") from None


def verify(pte, samples: int = 16, calibration: str | None = None, per_op: bool = False,
           max_steps: float = 1, npu_model: str = "auto"):
    """Run the `.pte` on the host twin, its NPU partitions computed as `npu_model` says
    (orchestrator/verification/npu.py); see orchestrator.verification.twin_verify.VerifyReport."""
    from orchestrator.verification.twin_verify import verify as run_verify  # lazy: heavy (torch)

    return run_verify(pte, samples=samples, calibration=calibration, per_op=per_op,
                      max_steps=max_steps, npu_model=npu_model)


def calibrate(profiles, cpu: str, output=None, validate=(), bound: float = 0.15):
    """Fit the CPU cost model's per-op-class factors of `cpu` to measured profiles and return
    an orchestrator.planning.calibrate.Calibrated (`.calibration`, `.to_text()`); with `output`,
    write the calibration file (atomically) that a platform YAML (`cpu: calibration_costs:`) or
    `calibration_costs=` names.

    `profiles`: `X.etdp` (its program X.pte beside it) or `PROGRAM.pte=PROFILE.etdp`, each
    refused in one line (UserError) when missing or of another program or core; `validate`:
    more profiles, never fitted to, whose per-class figures the file records (within `bound`:
    |estimate / measured - 1|)."""
    from cost_models.profile_calibration import check_name, to_yaml  # lazy: heavy (numpy)
    from orchestrator.planning.calibrate import calibrate as fit_profiles  # lazy: heavy (numpy)
    from orchestrator.planning.calibrate import checked_pair, pair, profiled  # lazy: heavy (numpy)

    try:
        cpu = normalize_cpu(cpu)
    except PlatformError as error:
        raise UserError(str(error)) from None
    name = Path(output).name if output else f"{cpu}-calibration.yaml"
    check_name(name)  # the name every calibrated cost source will cite: refused before reading
    if output:
        check_output_file(Path(output), "-o")
        for argument in (*profiles, *validate):
            if any(same_path(Path(output), path) for path in pair(argument)):
                raise UserError(f"-o '{output}' is an input ({argument}); writing there would "
                                "overwrite it; choose another -o")

    def read(arguments):
        programs = []
        for argument in arguments:
            program, profile = checked_pair(argument)
            programs.append(profiled(measure(program, profile), program, profile, cpu))
        return programs

    result = fit_profiles(read(profiles), read(validate), cpu, name, bound)
    if output:
        atomic_write_bytes(Path(output), to_yaml(result.calibration, bound).encode())
    return result


def measure(program: "Plan | str | Path", profile: str | Path,
            calibration_costs: str | None = None) -> "MeasuredPlan":
    """A profile (`.etdp`: `orchestrate verify --qemu --profile`, or ExecuTorch's ETDumpGen on
    any device) beside the plan of the program it profiled: each instruction's measured figure
    on the plan rows it runs (`.to_text()`, `.to_json()`: plan.json with `measured` blocks).

    `program` is a Plan (`plan(...)`) or a `.pte` written by `compile`, whose plan is read from
    its checked artifacts folder; `calibration_costs` (a file from `calibrate`) calibrates
    that stored plan's CPU rows as a plan made with it would be (a Plan brings its own). Raises
    UserError when the profile is missing, unreadable, has no operator events or is of another
    program."""
    from orchestrator.planning.measured import measure as measure_plan  # lazy: heavy (torch)

    if isinstance(program, (str, Path)):
        from kernels.program_view import ProgramView  # lazy: heavy (torch)

        manifest = Manifest.load(program, action="compare a profile with its plan")
        pte = manifest.pte_path.read_bytes()
        try:
            plan_json = load_json(manifest.file("plan.json"))
        except (DataFileError, ValueError) as error:
            raise UserError(f"{manifest.folder}/plan.json is unreadable ({error}); re-run "
                            "`orchestrate compile`") from None
        view = ProgramView.read(pte)
        if calibration_costs is not None:
            from cost_models.profile_calibration import (  # lazy: heavy (numpy)
                calibrate_plan_json, load_calibration)

            plan_json = calibrate_plan_json(plan_json, load_calibration(calibration_costs))
    else:
        if calibration_costs is not None:
            raise TypeError("a Plan carries its own calibration: plan it with "
                            "calibration_costs=")
        plan_json, view, pte = program.to_json(), program.compiled.program_view, \
            program.compiled.pte_bytes
    return measure_plan(view, plan_json, read_profile(profile), hashlib.sha256(pte).hexdigest())


def verify_all(pte, method: str = "auto", samples: int = 16, calibration=None,
               per_op: bool = False, max_steps: float = 1, npu_model: str = "auto",
               platform=None, timeout_s: int = 600, executorch_src=None, cmsis_nn_src=None,
               runner_elf=None, atol: float = 0.0, profile: bool = False, profile_out=None,
               on_result: Callable[[MethodResult], None] | None = None,
               progress=None, qemu_samples: int | None = None) -> Verification:
    """Verify a `.pte` as `orchestrate verify` does: by every method this machine has, or the
    ones `method` names; a Verification (`.passed`, `.verdict`, `.error()`).

    `method`: auto (every method, one combined verdict; orchestrator/device_runs/combined.py),
    twin, executorch (the host runtime), both (twin, then runtime), qemu or fvp (the runner on
    the installed platform). Named methods run in order and stop at the first that cannot run
    or cannot check in full; `on_result(result)` hears each one that ran as it finishes;
    `progress(stage, event, seconds)` hears the twin's samples as it checks them.
    `qemu_samples`: the cases QEMU runs (default 4; `--frames N` runs all N there: a program
    with state runs every method's samples as frames, in order, from its initial state).
    `profile` (qemu only): also run the runner's trace build and write its ETDump to
    `profile_out` (default: PROGRAM.etdp). A missing program, a platform that is not installed
    (qemu, fvp) or a profile that cannot be written is a UserError before anything runs."""
    from orchestrator.device_runs.combined import (  # lazy: heavy (numpy, vela)
        TflmMethod, does_not_fit, load_program, verifier, verify_all as combined_verdict)
    from orchestrator.device_runs.qemu import installed_platform  # lazy: heavy (numpy, vela)

    pte = Path(pte)
    if method not in VERIFY_METHODS:
        raise UserError(f"unknown verify method {method!r}; choose {', '.join(VERIFY_METHODS)}")
    if not pte.is_file():
        raise UserError(f"'{pte}' not found; give a .pte written by `orchestrate compile`")
    if (profile or profile_out) and method != "qemu":
        raise UserError("--profile runs the runner's trace build on QEMU: add --qemu")
    if profile_out and not profile:
        raise UserError("--profile-out names where --profile writes: add --profile")
    if method == "auto":
        verdict = combined_verdict(pte, samples=samples, calibration=calibration, per_op=per_op,
                                   max_steps=max_steps, executorch_src=executorch_src,
                                   cmsis_nn_src=cmsis_nn_src, platform=platform,
                                   timeout_s=timeout_s, npu_model=npu_model,
                                   runner_elf=runner_elf, progress=progress,
                                   qemu_samples=qemu_samples or 4)
        return Verification(pte, method, verdict.results, verdict)
    program = load_program(pte)  # the one read of the program and its artifacts
    profile_path = Path(profile_out) if profile_out else pte.with_suffix(".etdp")
    if method in ("qemu", "fvp"):
        # Asked for by name, a platform the manifest names that is not installed is the user's
        # error (exit 2); inside the default verify it is that method's "not run".
        installed_platform(program.require_manifest().target, platform)
        if profile:  # refused before anything runs
            check_output_file(profile_path, "--profile-out")
            if same_path(profile_path, pte):
                raise UserError(f"--profile-out '{profile_path}' is the program; choose another")
    inputs = VerifyInputs(samples=samples, calibration=calibration, per_op=per_op,
                          max_steps=max_steps, npu_model=npu_model, platform=platform,
                          timeout_s=timeout_s, executorch_src=executorch_src,
                          cmsis_nn_src=cmsis_nn_src, runner_elf=runner_elf, atol=atol,
                          progress=progress, qemu_samples=qemu_samples or 4)
    names = {"twin": (TWIN,), "executorch": (RUNTIME,), "both": (TWIN, RUNTIME),
             "qemu": (QEMU,), "fvp": (FVP,)}[method]
    if TflmMethod.applies(program):  # a program from a .tflite is also held against the file
        names += (TFLM,)
    results: list[MethodResult] = []
    for name in names:
        result = verifier(name).run(program, inputs)
        results.append(result)
        if result.outcome == "not-run":
            break
        if on_result:
            on_result(result)
        if result.outcome in ("partial", "inconclusive") and all(
                r.outcome != "failed" for r in results):
            break
    results += [r for r in [does_not_fit(program)] if r is not None]
    verification = Verification(pte, method, tuple(results))
    if not profile or verification.error() is not None:
        return verification
    untraced = (results[0].report or {}).get("instructions")
    return Verification(pte, method, tuple(results),
                        profile=_profile_on_qemu(program, profile_path, platform, timeout_s,
                                                 atol, npu_model, untraced))


def _profile_on_qemu(program: "TwinProgram", path: Path, platform, timeout_s: int, atol: float,
                     npu_model: str, untraced: int | None) -> ProfileRun:
    """The trace build's run, written as an ETDump and read back with ExecuTorch's reader."""
    from orchestrator.device_runs.qemu import (  # lazy: heavy (numpy, vela)
        installed_platform, profile_lines, qemu_profile)

    target = program.require_manifest().target
    profiled = qemu_profile(program, installed_platform(target, platform), timeout_s, atol=atol,
                            npu_model=npu_model)
    # Its per-case totals include the tracer's own work (output CRCs): only the profile's
    # figures, which have it removed, are shown.
    head = (f"profile: the runner's trace build on QEMU ({profiled.result.method}): PASS "
            f"({len(profiled.result.cases)} cases); the tracer's own work is removed from every "
            "figure below")
    atomic_write_bytes(path, profiled.etdump)
    return ProfileRun(path, (head, *profile_lines(read_profile(path), path, untraced,
                                                  program.pte_path)))


EVALUATE_METHODS = {"auto": ("twin", "host runtime", "QEMU Cortex-M55"), "twin": ("twin",),
                    "executorch": ("host runtime",), "both": ("twin", "host runtime"),
                    "qemu": ("QEMU Cortex-M55",)}


def evaluate(pte, dataset, labels: str | None = "labels", samples: int | None = None,
             method: str = "auto", qemu_samples: int = 4, min_accuracy: float | None = None,
             max_accuracy_drop: float | None = None, executorch_src=None, cmsis_nn_src=None,
             platform=None, timeout_s: int = 600, npu_model: str = "auto"):
    """`verify --dataset`: the program's accuracy on a labelled set (a .pt/.npz file or a folder
    of them: inputs as --calibration takes them, `labels` the array of integer classes or a
    file of them, None for none) by the float model, the quantized reference, the twin, the
    host runtime (every sample, byte-compared with the twin) and QEMU (the first
    `qemu_samples`, BundleIO byte-exact against the twin); `samples`: the first N (default
    all). An AccuracyReport (`.verdict`, `.error()`): `min_accuracy` (percent) and
    `max_accuracy_drop` (points below the float model) fail it (exit 4)
    (orchestrator/device_runs/accuracy.py)."""
    from orchestrator.device_runs.accuracy import evaluate as run  # lazy: heavy (torch)
    from orchestrator.device_runs.combined import load_program  # lazy: heavy (torch)

    if method not in EVALUATE_METHODS:
        raise UserError(f"unknown verify method {method!r} with --dataset; choose "
                        f"{', '.join(EVALUATE_METHODS)}")
    if not Path(pte).is_file():
        raise UserError(f"'{pte}' not found; give a .pte written by `orchestrate compile`")
    return run(load_program(pte), str(dataset), labels, samples, EVALUATE_METHODS[method],
               qemu_samples, min_accuracy, max_accuracy_drop, executorch_src, cmsis_nn_src,
               platform, timeout_s, npu_model)


def layer_errors(pte, samples: int | None = None, calibration=None, dataset=None):
    """`verify --per-layer-error`: for every activation quantization point of the program's
    quantized reference (with the int8 weights that compute it), the error at its output and
    the final output's error with only it quantized, worst first: a LayerErrorReport
    (orchestrator/verification/layer_error.py). Inputs: the first `samples` of `dataset` (default
    all), else of `calibration`, else `samples` generated ones (default 16)."""
    from orchestrator.device_runs.combined import load_program  # lazy: heavy (torch)
    from orchestrator.sources.loader import load_dataset  # lazy: heavy (torch)
    from orchestrator.verification.layer_error import layer_errors as report  # lazy: heavy (torch)
    from orchestrator.verification.twin_verify import (  # lazy: heavy (torch)
        model_example_inputs, sample_inputs)

    if not Path(pte).is_file():
        raise UserError(f"'{pte}' not found; give a .pte written by `orchestrate compile`")
    program = load_program(pte)
    float_program, float_module = program.reference("float.pt2")
    _, quantized_module = program.reference("quantized.pt2")
    if dataset is not None:
        data = load_dataset(str(dataset), model_example_inputs(float_program), None)
        chosen = data.samples[:samples] if samples else data.samples
        inputs = f"{data.source}, {len(chosen)} sample(s)"
    else:
        chosen, inputs = sample_inputs(float_program, samples or 16, calibration)
    return report(str(pte), float_module, quantized_module, tuple(chosen), inputs)


def _stored_plan(pte) -> tuple[Manifest, dict]:
    """The manifest of a compiled `.pte` and the plan.json its artifacts folder holds (checked)."""
    manifest = Manifest.load(pte, action="colour its plan by the per-layer error")
    try:
        return manifest, load_json(manifest.file("plan.json"))
    except (DataFileError, ValueError) as error:
        raise UserError(f"{manifest.folder}/plan.json is unreadable ({error}); re-run "
                        "`orchestrate compile`") from None


def layer_error_html(pte, report) -> str:
    """The plan page of a compiled `.pte` (its report.html, from the artifacts' plan.json) with
    every op coloured by the SNR of its layer in `report` (a LayerErrorReport of `layer_errors`),
    the layer table, and a legend naming the measurement."""
    _, plan_json = _stored_plan(pte)
    regions = {}
    for item in plan_json["summary"]["memory"]["items"]:
        if item.get("region"):
            regions.setdefault(item["region"], {"name": item["region"], "kind": "",
                                                "size_bytes": item.get("region_bytes") or 0})
    return render_plan_html(plan_json, list(regions.values()),
                            f"orchestrate plan with per-layer error: {plan_json['model']['name']}",
                            layer_error=report.to_json())


def layer_error_overlay(pte, report) -> dict:
    """Model Explorer node data for a compiled `.pte`: each instruction's value the worst SNR
    (dB) of the layers in `report` its plan rows belong to, coloured by its band
    (orchestrator/reports/explorer.py). UserError when the plan and the program do not line up."""
    from kernels.program_view import ProgramView  # lazy: heavy (torch)
    from orchestrator.reports.explorer import (  # lazy: heavy (torch)
        OverlayError, layer_error_node_data)

    manifest, plan_json = _stored_plan(pte)
    try:
        return layer_error_node_data(ProgramView.read(manifest.pte_path.read_bytes()),
                                     plan_json["ops"], report.to_json())
    except OverlayError as error:
        raise UserError(f"no Model Explorer overlay for {pte}: {error}") from None


def firmware_project(pte, output, profile: str = "release", platform=None, third_party=None,
             build: bool = True, method_pool_bytes: int | None = None, lto: bool | None = None,
             npu_device: str = "hardware", run: bool = False,
             on_written: Callable[[FirmwareProject], None] | None = None,
             frames: int | None = None, inputs: str | None = None) -> FirmwareProject:
    """Write (and `build`) the firmware project of a compiled `.pte` into `output`
    (orchestrator/firmware/: runtime, the program's kernels, linker script from its plan,
    model_io.h); its example main runs `frames` inputs in turn (from `inputs`, a .pt/.npz file
    or folder of samples, or generated; the frames of one stream for a program with state);
    `run` also runs the built example on QEMU and compares each frame's outputs with the host
    twin's (`run_passed`). `on_written(project)` hears the project once it is written and
    built, before the run."""
    from orchestrator.firmware import firmware_run_lines, make_firmware  # lazy: heavy (torch)

    if run and not build:
        raise UserError("--run needs the build: drop --no-build, or build the project and run "
                        "it yourself")
    made = make_firmware(pte, output, profile=profile, platform=platform,
                         third_party=third_party, build=build, method_pool=method_pool_bytes,
                         lto=lto, npu_device=npu_device, run=run, frames=frames,
                         inputs_file=inputs)
    project = FirmwareProject(made.folder, made.record, made.elf)
    if on_written:
        on_written(project)
    if not run or made.elf is None:
        return project
    lines, passed = firmware_run_lines(made.folder, Path(pte))
    return FirmwareProject(made.folder, made.record, made.elf, tuple(lines), passed)


def firmware_size(folder, run: bool = False, pte_bytes: bytes | None = None) -> FirmwareSize:
    """The flash and RAM of a project `firmware` built, per component from its linker map;
    `run` measures the stack's high-water mark on QEMU; with `pte_bytes`, a build of another
    program is a UserError."""
    from orchestrator.firmware import load_record, run_on_qemu  # lazy: heavy (torch)
    from orchestrator.firmware.footprint import footprint  # lazy: heavy (torch)

    record = load_record(folder)
    if pte_bytes is not None:
        digest = hashlib.sha256(pte_bytes).hexdigest()
        if record.get("pte_sha256") != digest:
            raise UserError(f"the firmware in {folder} was built from another program (SHA-256 "
                            f"{str(record.get('pte_sha256'))[:12]}..., this plan's program is "
                            f"{digest[:12]}...); build this one with `orchestrate firmware "
                            "PROGRAM.pte -o DIR`")
    stack_used = None
    if run:
        result = run_on_qemu(folder)
        if result.exit_code != 0 or result.stack_used_bytes is None:
            raise NotRun(f"the firmware's run on QEMU ended with exit code {result.exit_code} "
                         "before reporting its stack; nothing was measured")
        stack_used = result.stack_used_bytes
    return FirmwareSize(Path(folder), record, footprint(folder, stack_used))


def compare(tflite, platform: str = "corstone300", npu: str | None = None,
            cpu: str | None = None, samples: int = 4, work_dir=None, per_op: bool = False,
            firmware: bool = False, progress=None) -> "Comparison":
    """`orchestrate compare`: the .tflite compiled by orchestrate and by the incumbent (vela +
    TensorFlow Lite Micro), both run on the same QEMU machine: a Comparison (figures with their
    sources, the outputs compared; .text(), .to_json(), .html()); `firmware` adds both release
    images' flash and RAM from their linker maps."""
    from orchestrator.comparison.compare import compare as compare_both  # lazy: heavy (torch)

    return compare_both(tflite, compile, platform=platform, npu=npu, cpu=cpu, samples=samples,
                        work_dir=work_dir, per_op=per_op, firmware=firmware, progress=progress)


def source_trees() -> Sources:
    """The third-party source trees the native builds use: where each is found, whether it is
    there, the commit fetched and the one pinned. Reads no tree."""
    trees = []
    for source in PINNED:
        folder, origin = source_tree(source.name)
        present = folder.is_dir()
        trees.append(SourceTree(source.name, folder, origin, present,
                                fetched_commit(folder) if present else None, source.commit))
    found = Sources(tuple(trees), "")
    return Sources(found.trees, sources_hint()) if found.missing else found


def fetch_sources(mirrors: dict[str, str] | None = None, names: list[str] | None = None,
                  log: Callable[[str], None] | None = None) -> Path:
    """Clone the pinned commits of the source trees (`names`, default all) into the cache,
    each from `mirrors[name]` when given; the folder they are in. `log` hears a line a tree."""
    try:
        return fetch_pinned_sources(mirrors or {}, names=names, log=log)
    except SourceFetchError as error:
        raise UserError(f"sources fetch: {error}") from None


def cache(clear: bool = False) -> tuple[CacheFolder, ...]:
    """Where the caches are (compiles, host runtime, firmware) and each entry's size; `clear`
    removes every entry."""
    from orchestrator.artifacts.cache import cache_dir  # lazy: heavy (torch)

    roots = []
    for root in (cache_root(), cache_dir()):
        if root is not None and root not in roots:
            roots.append(root)
    folders = []
    for root in roots:
        entries = []
        for part in (sorted(root.iterdir()) if root.is_dir() else []):
            size = sum(f.stat().st_size for f in part.rglob("*") if f.is_file()) \
                if part.is_dir() else part.stat().st_size
            entries.append(CacheEntry(part.name, size))
            if clear:
                shutil.rmtree(part, ignore_errors=True) if part.is_dir() else part.unlink()
        folders.append(CacheFolder(root, tuple(entries), clear))
    return tuple(folders)


def known() -> Known:
    """What this installation knows (`orchestrate list`): zoo models with their inputs,
    platforms with their NPU options and default CPU, every CPU with its ISA tier."""
    platforms = []
    for name in list_platforms():
        platform = load_platform(name)
        platforms.append(PlatformInfo(name, platform.cpu_default, platform.cpu_hz,
                                      tuple(platform.npu_options), platform.npu_default,
                                      platform.npu_hz))
    return Known(tuple(ZooModel(m.name, m.description, m.kind) for m in ZOO_MODELS),
                 tuple(platforms), tuple(CpuInfo(cpu, tier) for cpu, tier in CPU_TIERS.items()))


def reasons() -> str:
    """Every placement reason a plan can give, as Markdown (partitioners/REASONS.md)."""
    return reasons_markdown()
