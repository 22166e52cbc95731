"""The Python API: the same verbs as the CLI, which is a thin shell over them.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kernels.safe_files import DataFileError, load_json
from orchestrator.artifacts.files import (atomic_write_bytes, check_output_file, check_outputs,
                                          same_path)
from orchestrator.artifacts.manifest import Manifest
from orchestrator.artifacts.profile import read_profile
from orchestrator.errors import UserError
from orchestrator.machine import MachineReport, check_machine
from orchestrator.request import Request, resolve
from platforms import PlatformError, normalize_cpu

if TYPE_CHECKING:  # the compile stack imports torch and ExecuTorch (seconds): imported on use
    from orchestrator.planning.measured import MeasuredPlan
    from orchestrator.planning.planner import Plan


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

    Options are Request's fields: platform, npu, cpu, io, calibration, cpu_hz, npu_hz, policy (a
    placement policy YAML path or Policy), placement ("greedy" or "cost"; with "cost" the Plan
    carries the decisions in `plan.cost_placement`), memory_policy, runner_ops,
    calibration_costs (a file from `calibrate`: CPU rows' figures scaled by it, its name in
    their sources).
    `progress(stage, event, seconds)` hears each stage start and finish."""
    from orchestrator.planning.run import plan_request  # lazy: heavy (torch)

    return plan_request(as_request(model, **options), progress)


def compile(model: str | Request, output, bundle: bool = False, progress=None,  # noqa: A001
            **options) -> CompileResult:
    """Compile the request's model to `output` (.pte) with everything the CLI writes beside it;
    `bundle` also writes the BundleIO `.bpte`."""
    from orchestrator.artifacts.outputs import write_outputs  # lazy: heavy (torch)

    output = Path(output)
    check_outputs(output)
    made = plan(as_request(model, **options), progress=progress)
    made.refuse_miscompiles()
    artifacts = write_outputs(made.compiled, output, made.artifact_files())
    if bundle:
        from orchestrator.verification.bundle import write_bundle  # lazy: heavy (torch, executorch)

        write_bundle(output, output.with_suffix(".bpte"))
    return CompileResult(output, artifacts, made)


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
