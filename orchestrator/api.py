"""The Python API: the same verbs as the CLI, which is a thin shell over them.

    import orchestrator
    plan = orchestrator.plan("ds-cnn", platform="corstone300", npu="ethos-u55-128")
    print(plan.summary.npu_mac_coverage_pct, plan.to_json()["summary"])
    compiled = orchestrator.compile("ds-cnn", "out/ds_cnn.pte", npu="ethos-u55-128")
    verdict = orchestrator.verify("out/ds_cnn.pte")
    assert verdict.passed, verdict.verdict

Errors are `orchestrator.errors.OrchestrateError`s (UserError for bad input), as in the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CompileResult:
    """What `compile` wrote and the plan of it."""

    pte: Path
    artifacts: Path
    plan: object  # orchestrator.planner.Plan

    @property
    def compiled(self):
        return self.plan.compiled


def load_policy_arg(policy):
    """A Policy from a path, a Policy, or None (the default greedy policy)."""
    from orchestrator.errors import UserError
    from partitioners.policy import Policy, PolicyError, load_policy

    if policy is None or isinstance(policy, Policy):
        return policy
    try:
        return load_policy(policy)
    except PolicyError as error:
        raise UserError(str(error)) from None


def _target(platform, npu, cpu, io, cpu_hz, npu_hz, policy):
    """Explicit arguments win over the policy file, which wins over the platform's defaults."""
    from dataclasses import replace

    from orchestrator.target import resolve_target

    if policy is not None:
        npu = npu if npu is not None else policy.npu
        cpu_hz = cpu_hz if cpu_hz is not None else policy.cpu_hz
        npu_hz = npu_hz if npu_hz is not None else policy.npu_hz
    target = resolve_target(platform, npu=npu, cpu=cpu, io=io, cpu_hz=cpu_hz, npu_hz=npu_hz)
    if policy is not None and target.npu and (policy.system_config or policy.memory_mode):
        target = replace(target, system_config=policy.system_config or target.system_config,
                         memory_mode=policy.memory_mode or target.memory_mode)
    return target


def _plan_under(loaded, samples, target, policy, runner_ops, progress, memory_policy=None,
                io_auto=False):
    from orchestrator.pipeline import compile_model
    from orchestrator.planner import make_plan

    compiled = compile_model(loaded, samples, target, policy=policy, memory_policy=memory_policy,
                             io_auto=io_auto, progress=progress)
    return make_plan(compiled, runner_ops, progress, memory_policy)


def _memory_policy(text, platform=None):
    """The MemoryPolicy of `--memory-policy` (None: auto), checked against `platform` when
    given; a UserError names what is wrong."""
    from orchestrator.errors import UserError
    from platforms import PlatformError
    from platforms.memory_placement import MemoryPolicy, check_policy, load_memory_policy

    try:
        policy = text if isinstance(text, MemoryPolicy) or text is None else \
            load_memory_policy(str(text))
        if policy is not None and platform is not None:
            check_policy(platform, policy)
    except PlatformError as error:
        raise UserError(str(error)) from None
    return policy


def plan(model: str, platform: str = "corstone300", npu: str | None = None,
         cpu: str | None = None, io: str = "float", calibration: str | None = None,
         cpu_hz: float | None = None, npu_hz: float | None = None,
         runner_ops: set[str] | None = None, policy=None, placement: str | None = None,
         progress=None, memory_policy=None):
    """Compile `model` for the target and return its Plan (nothing is written).

    `policy`: a placement policy YAML path (partitioners/policy.py) or Policy; `placement`:
    "greedy" (default) or "cost" (orchestrator/cost_placement.py), overriding the policy's. With
    "cost", the returned Plan carries the decisions in `plan.cost_placement`."""
    return _planned(model, platform, npu, cpu, io, calibration, cpu_hz, npu_hz, runner_ops,
                    policy, placement, progress, memory_policy)


def _planned(model, platform, npu, cpu, io, calibration, cpu_hz, npu_hz, runner_ops, policy,
             placement, progress, memory_policy=None):
    from dataclasses import replace

    from orchestrator.cost_placement import place_by_cost
    from orchestrator.errors import UserError
    from orchestrator.sources import load_calibration, load_model
    from partitioners.policy import PLACEMENTS

    policy = load_policy_arg(policy)
    mode = placement or (policy.placement if policy is not None else "greedy")
    if mode not in PLACEMENTS:
        raise UserError(f"--placement {mode!r} is not supported; use one of {', '.join(PLACEMENTS)}")
    from orchestrator.target import io_request

    target = _target(platform, npu, cpu, io, cpu_hz, npu_hz, policy)
    io_auto = io_request(io)[1]
    memory = _memory_policy(memory_policy, target.platform)
    loaded = load_model(model)
    samples = load_calibration(calibration, loaded.example_inputs)
    if mode == "greedy" or not target.npu:
        return _plan_under(loaded, samples, target, policy, runner_ops, progress, memory, io_auto)
    chosen = place_by_cost(
        lambda p: _plan_under(loaded, samples, target, p, runner_ops, progress, memory, io_auto),
        policy)
    return replace(chosen.chosen, cost_placement=chosen)


def compile(model: str, output, platform: str = "corstone300", npu: str | None = None,  # noqa: A001
            cpu: str | None = None, io: str = "float", calibration: str | None = None,
            cpu_hz: float | None = None, npu_hz: float | None = None,
            bundle: bool = False, policy=None, placement: str | None = None,
            progress=None, memory_policy=None) -> CompileResult:
    """Compile `model` to `output` (.pte) with everything the CLI writes beside it."""
    from orchestrator.artifacts import check_outputs, write_outputs

    output = Path(output)
    check_outputs(output)
    made = _planned(model, platform, npu, cpu, io, calibration, cpu_hz, npu_hz, None, policy,
                    placement, progress, memory_policy)
    made.refuse_miscompiles()
    artifacts = write_outputs(made.compiled, output, made.artifact_files())
    if bundle:
        from orchestrator.bundle import write_bundle

        write_bundle(output, output.with_suffix(".bpte"))
    return CompileResult(output, artifacts, made)


def verify(pte, samples: int = 16, calibration: str | None = None, per_op: bool = False,
           max_steps: float = 1):
    """Run the `.pte` on the host twin; see orchestrator.verification.VerifyReport."""
    from orchestrator.verification import verify as run_verify

    return run_verify(pte, samples=samples, calibration=calibration, per_op=per_op,
                      max_steps=max_steps)
