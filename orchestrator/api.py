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


def _compile(model, platform, npu, cpu, io, calibration, cpu_hz, npu_hz, progress):
    from orchestrator.pipeline import compile_model
    from orchestrator.sources import load_calibration, load_model
    from orchestrator.target import resolve_target

    target = resolve_target(platform, npu=npu, cpu=cpu, io=io, cpu_hz=cpu_hz, npu_hz=npu_hz)
    loaded = load_model(model)
    samples = load_calibration(calibration, loaded.example_inputs)
    return compile_model(loaded, samples, target, progress=progress)


def plan(model: str, platform: str = "corstone300", npu: str | None = None,
         cpu: str | None = None, io: str = "float", calibration: str | None = None,
         cpu_hz: float | None = None, npu_hz: float | None = None,
         runner_ops: set[str] | None = None, progress=None):
    """Compile `model` for the target and return its Plan (nothing is written)."""
    from orchestrator.planner import make_plan

    compiled = _compile(model, platform, npu, cpu, io, calibration, cpu_hz, npu_hz, progress)
    return make_plan(compiled, runner_ops, progress)


def compile(model: str, output, platform: str = "corstone300", npu: str | None = None,  # noqa: A001
            cpu: str | None = None, io: str = "float", calibration: str | None = None,
            cpu_hz: float | None = None, npu_hz: float | None = None,
            bundle: bool = False, progress=None) -> CompileResult:
    """Compile `model` to `output` (.pte) with everything the CLI writes beside it."""
    from orchestrator.artifacts import write_outputs
    from orchestrator.errors import UserError
    from orchestrator.planner import make_plan

    output = Path(output)
    if output.suffix != ".pte":
        raise UserError(f"output '{output}' must end in .pte; pass e.g. model.pte")
    compiled = _compile(model, platform, npu, cpu, io, calibration, cpu_hz, npu_hz, progress)
    made = make_plan(compiled, None, progress)
    artifacts = write_outputs(compiled, output, made.artifact_files())
    if bundle:
        from orchestrator.bundle import write_bundle

        write_bundle(output, output.with_suffix(".bpte"))
    return CompileResult(output, artifacts, made)


def verify(pte, samples: int = 16, calibration: str | None = None, per_op: bool = False,
           max_steps: float = 1):
    """Run the `.pte` on the host twin; see orchestrator.verify.VerifyReport."""
    from orchestrator.verify import verify as run_verify

    return run_verify(pte, samples=samples, calibration=calibration, per_op=per_op,
                      max_steps=max_steps)
