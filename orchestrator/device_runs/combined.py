"""`verify` by every method this machine has: the device code judges, the twin explains.

Four methods (`VERIFIERS`, each a `Verifier`: orchestrator/verification/methods.py), asked in
order, each saying what it exercised or why it could not run:

- **twin**: the `.pte` executed instruction by instruction on the host, each value checked
  against the quantized reference fed the program's own inputs (orchestrator/verification/twin_verify.py).
  It explains a failure (which op, which step) but it is our re-statement of the kernels, so it
  never judges alone.
- **host runtime**: the real ExecuTorch runtime with the portable and Cortex-M kernels and
  EthosUBackend built for the host (orchestrator/device_runs/runtime_verify.py), compared with the twin.
  It judges CMSIS-NN's C path (the scalar tier's), the program loading and memory plan, every
  kernel's own argument checks and the NPU glue; for MVE programs it compares the C-path form of
  the few ops whose MVE form differs and names them.
- **QEMU**: the platform's runner firmware (ExecuTorch runtime, portable and CMSIS-NN kernels
  built for the core its runner/firmware.yaml names) on QEMU's mps3-an547, self-checking against
  the twin's outputs (BundleIO, byte-exact; orchestrator/device_runs/qemu.py). It judges
  Corstone-300 Cortex-M55 programs and Corstone-320 Cortex-M85 programs (their Armv8.1-M + MVE build runs on QEMU's M55; QEMU has no
  M85), and CPU-only programs of every other core on QEMU's machine for it
  (platforms/qemu_machines/). QEMU models no Ethos-U, so a hybrid program's NPU invocations are
  handed over semihosting to the host (orchestrator/device_runs/qemu_npu.py), with the real EthosUBackend and core
  driver in the firmware: the Ethos-U55/U65 functional model executes the command stream, an
  Ethos-U85 partition is computed from its TOSA graph. Other cores are "not run".
- **FVP**: a Corstone FVP with an arm_executor_runner the user built (`--runner-elf` or
  `ORCHESTRATE_RUNNER_ELF`), BundleIO self-check on the modelled target; "not run" where either
  is missing (no FVP is installed on the machines this project is tested on).

The verdict is theirs together: FAILED when any method that ran found a failure (exit 4);
PASSED when no method failed and a device-code method (host runtime or QEMU) passed for what
it can judge (exit 0); PARTIAL when the device methods that ran could not judge everything and
none covers the rest (exit 5); "PASSED by the twin only" says that no device code ran, and why
(exit 0; add `--require-device` to make that exit 5).

The programs run are the installed platform's runner and QEMU, never a program the artifacts
folder names: the manifest's platform is looked up by name among the installed platforms.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kernels.safe_files import DataFileError, load_json
from orchestrator.device_runs.qemu import installed_platform, run_qemu
from orchestrator.errors import NotRun, UserError
from orchestrator.verification.methods import (FVP, QEMU, RUNTIME, TFLM, TWIN, MethodResult,
                                                Verifier, VerifyInputs)
from orchestrator.verification.npu import NpuModelCannotRun, NpuModelFault
from platforms.fvp import FvpUnavailable, find_fvp, find_runner_elf, run_bpte

if TYPE_CHECKING:  # the twin imports torch (seconds): loaded in verify_all
    from orchestrator.verification.twin import TwinProgram


@dataclass(frozen=True)
class CombinedVerdict:
    pte: str
    results: tuple[MethodResult, ...]
    outcome: str  # passed | failed | partial | inconclusive | twin-only
    verdict: str

    @property
    def exit_code(self) -> int:
        return {"passed": 0, "twin-only": 0, "failed": 4}.get(self.outcome, 5)

    def to_json(self) -> dict:
        return {"pte": self.pte, "outcome": self.outcome, "verdict": self.verdict,
                "methods": [{"name": r.name, "label": r.shown, "outcome": r.outcome,
                             "detail": r.detail, "device_code": r.device_code,
                             "report": r.report}
                            for r in self.results]}

    def render_text(self) -> str:
        lines = []
        for result in self.results:
            if result.text:
                # A method's own report starts with its verdict header ("verify X.pte: PASSED"
                # when run alone); here it is one section, and the run has one verdict: the
                # combined one below.
                head, _, body = result.text.partition("\n")
                if head.startswith("verify "):
                    head = f"{result.shown} ({head.partition(': ')[2] or result.outcome}):"
                lines.append(f"{head}\n{body}" if body else head)
        lines.append(f"verify {self.pte}: {self.outcome.upper()}")
        for result in self.results:
            lines.append(f"  {result.shown}: {result.outcome}: {result.detail}")
        lines.append(f"  verdict: {self.verdict}")
        return "\n".join(lines)


class TwinMethod:
    """The twin: our re-statement of the kernels, with the local check (explains, never judges
    alone)."""

    name, device_code = TWIN, False

    def run(self, program: TwinProgram, inputs: VerifyInputs) -> MethodResult:
        from orchestrator.verification.twin import TwinCannotRun  # lazy: heavy (torch)
        from orchestrator.verification.twin_verify import (  # lazy: heavy (torch)
            render_text, report_json, verify)

        try:
            report = verify(program, samples=inputs.samples, calibration=inputs.calibration,
                            per_op=inputs.per_op, max_steps=inputs.max_steps,
                            npu_model=inputs.npu_model, progress=inputs.progress)
        except (TwinCannotRun, NpuModelCannotRun) as error:
            return MethodResult(TWIN, "not-run", str(error).removeprefix("not run: "), False)
        except NpuModelFault as error:
            return MethodResult(TWIN, "failed", f"FAILED by the twin: {error}", False)
        outcome = ("inconclusive" if report.inconclusive else "partial" if report.partial else
                   "passed" if report.passed else "failed")
        return MethodResult(TWIN, outcome, report.verdict, False, render_text(report),
                            report_json(report), exercised=report.method)


class HostRuntimeMethod:
    """The real ExecuTorch runtime with the device kernels and EthosUBackend built for the host."""

    name, device_code = RUNTIME, True

    def run(self, program: TwinProgram, inputs: VerifyInputs) -> MethodResult:
        from orchestrator.device_runs.runtime_verify import (render_text, report_json,  # lazy: heavy (torch)
                                                             verify_runtime)

        try:
            report = verify_runtime(program, samples=inputs.samples,
                                    calibration=inputs.calibration, per_op=inputs.per_op,
                                    executorch_src=inputs.executorch_src,
                                    cmsis_nn_src=inputs.cmsis_nn_src,
                                    npu_model=inputs.npu_model)
        except NotRun as error:
            return MethodResult(RUNTIME, "not-run", str(error).removeprefix("not run: "), True)
        outcome = {"passed": "passed", "partial": "partial"}.get(report.outcome, "failed")
        return MethodResult(RUNTIME, outcome, report.verdict, True, render_text(report),
                            report_json(report), exercised=report.method)


class QemuMethod:
    """The platform's runner firmware on QEMU (BundleIO, byte-exact against the twin)."""

    name, device_code = QEMU, True

    def run(self, program: TwinProgram, inputs: VerifyInputs) -> MethodResult:
        return run_qemu(program, inputs.platform, inputs.timeout_s, npu_model=inputs.npu_model,
                        atol=inputs.atol, samples=inputs.qemu_samples)


class FvpMethod:
    """A Corstone FVP running a user-built arm_executor_runner (BundleIO self-check on target),
    where the FVP and a runner are installed; "not run" elsewhere."""

    name, device_code = FVP, True

    def run(self, program: TwinProgram, inputs: VerifyInputs) -> MethodResult:
        from orchestrator.verification.bundle import write_bundle  # lazy: heavy (torch)

        target = program.require_manifest().target
        try:
            platform = installed_platform(target, inputs.platform)
        except UserError as error:
            return MethodResult(FVP, "not-run", str(error), True)
        # A CPU-only program runs on the platform's FVP too; its NPU simply stays idle.
        npu = target["npu"] or platform.npu_default
        if not platform.fvp or not npu:
            return MethodResult(FVP, "not-run", f"the {platform.name} platform YAML names no FVP",
                                True)
        try:
            if find_fvp(platform, npu) is None or find_runner_elf(inputs.runner_elf) is None:
                # Said the harness's way (which binary, which variable), before any bundle.
                run_bpte(platform, npu, program.pte_path, runner_elf=inputs.runner_elf,
                         timeout_s=1)
            with tempfile.TemporaryDirectory(prefix="orchestrate-fvp-") as folder:
                bpte = write_bundle(program, Path(folder) / "program.bpte")
                result = run_bpte(platform, npu, bpte, runner_elf=inputs.runner_elf,
                                  timeout_s=inputs.timeout_s)
        except FvpUnavailable as error:
            return MethodResult(FVP, "not-run", str(error).removeprefix("not run: "), True)
        except FileNotFoundError as error:  # a runner the user named is not there
            raise UserError(f"{error}; pass --runner-elf or set ORCHESTRATE_RUNNER_ELF to a "
                            "built arm_executor_runner") from None
        exercised = f"Corstone FVP ({target['platform']}, {npu}), BundleIO self-check on target"
        text = f"method: {exercised}\n{result.summary()}"
        outcome = "passed" if result.passed is True else "failed"
        detail = (f"PASSED on the FVP: {result.summary()}" if result.passed is True else
                  f"FAILED on the FVP: {result.summary()}")
        return MethodResult(FVP, outcome, detail, True, text,
                            {"passed": result.passed, "npu_cycles": result.cycles,
                             "summary": result.summary()}, exercised=exercised)


class TflmMethod:
    """A program compiled from a full-integer `.tflite` against the file run in TFLM's own
    interpreter on the same int8 inputs (orchestrator/verification/tflm.py): a reference, not
    device code, but a difference fails verify."""

    name, device_code = TFLM, False

    @staticmethod
    def applies(program: TwinProgram) -> bool:
        """Whether the program was compiled from a `.tflite` (the only programs TFLM judges)."""
        model = program.require_manifest().data.get("model") or {}
        return str(model.get("source", "")).startswith("tflite:")

    def run(self, program: TwinProgram, inputs: VerifyInputs) -> MethodResult:
        from orchestrator.verification import tflm  # lazy: heavy (torch)

        try:
            comparison = tflm.compare(program, inputs.samples, inputs.per_op, inputs.npu_model)
        except tflm.TflmCannotRun as error:
            return MethodResult(TFLM, "not-run", str(error), False)
        outcome = "passed" if comparison.passed else "failed"
        exercised = tflm.exercised_text()
        detail = f"{'PASSED' if comparison.passed else 'FAILED'}: {comparison.detail()} " \
                 f"({exercised}; the program executed by the twin)"
        return MethodResult(TFLM, outcome, detail, False, f"method: {exercised}\n{detail}",
                            {"samples": comparison.samples, "values": comparison.values,
                             "differing": comparison.differing,
                             "max_steps": comparison.max_steps, "first": comparison.first,
                             "first_operator": comparison.first_operator,
                             "tflite_micro": tflm.tflm_version()}, exercised=exercised)


# Every method `verify` knows, in the order they run and report.
VERIFIERS: tuple[Verifier, ...] = (TwinMethod(), HostRuntimeMethod(), QemuMethod(), FvpMethod(),
                                   TflmMethod())


def verifier(name: str) -> Verifier:
    return next(v for v in VERIFIERS if v.name == name)


NPU_BY_TOSA = ("the NPU partitions ran as their TOSA graphs in the TOSA reference model, not as "
               "Vela's command stream")
NPU_BY_STREAM = ("the NPU partitions ran as Vela's command stream from the .pte in the Ethos-U "
                 "functional model (a model of the hardware, not the silicon)")


def combine(pte: Path, results: tuple[MethodResult, ...], has_npu: bool = False,
            npu_stream: bool = False) -> CombinedVerdict:
    """The verdict of the methods together (see the module docstring). `has_npu`: the program
    has Ethos-U partitions, computed by the functional model on the command stream
    (`npu_stream`) or as TOSA graphs; no method here runs them on an NPU (the verdict says
    so)."""
    npu_note = NPU_BY_STREAM if npu_stream else NPU_BY_TOSA
    ran = [r for r in results if r.outcome != "not-run"]
    failed = [r for r in ran if r.outcome == "failed"]
    device_passed = [r for r in ran if r.device_code and r.outcome == "passed"]
    # a partial twin does not hold back what device code judged: the device methods decide
    partial = [r for r in ran if r.outcome == "partial" and r.device_code]
    not_run = [r for r in results if r.outcome == "not-run" and r.device_code]
    names = lambda rs: ", ".join(r.shown for r in rs)  # noqa: E731
    if failed:
        return CombinedVerdict(str(pte), results, "failed",
                               f"FAILED by {names(failed)}: " + "; ".join(r.detail for r in failed))
    if any(r.outcome == "inconclusive" for r in ran):
        twin = next(r for r in ran if r.outcome == "inconclusive")
        return CombinedVerdict(str(pte), results, "inconclusive", f"INCONCLUSIVE: {twin.detail}")
    qemu_judged = any(r.name == QEMU for r in device_passed)
    # A host run that compared C-path forms, or stopped at a host limit, is completed by QEMU.
    if device_passed and (not partial or qemu_judged):
        extra = (f"; {names(not_run)} not run: " + "; ".join(r.detail for r in not_run)
                 if not_run else "")
        return CombinedVerdict(str(pte), results, "passed",
                               f"PASSED by {names(device_passed)} (device code"
                               + (f" for the CPU side; {npu_note})" if has_npu else ")")
                               + (", with the twin" if any(r.name == TWIN and r.outcome ==
                                                           "passed" for r in ran) else
                                  "; the twin compared part: " + next(
                                      r.detail for r in ran if r.name == TWIN)
                                  if any(r.name == TWIN for r in ran) else "")
                               + extra + _references(ran))
    if partial:
        return CombinedVerdict(str(pte), results, "partial",
                               f"PARTIAL: {'; '.join(r.detail for r in partial)}"
                               + (f"; {names(not_run)} not run: "
                                  + "; ".join(r.detail for r in not_run) if not_run else ""))
    twin_partial = [r for r in ran if r.name == TWIN and r.outcome == "partial"]
    if twin_partial:
        return CombinedVerdict(str(pte), results, "partial",
                               f"PARTIAL: {twin_partial[0].detail}; device code not run: "
                               + "; ".join(f"{r.shown}: {r.detail}" for r in not_run))
    if any(r.name == TWIN and r.outcome == "passed" for r in ran):
        return CombinedVerdict(str(pte), results, "twin-only",
                               "PASSED by the twin only; device code not run: "
                               + "; ".join(f"{r.shown}: {r.detail}" for r in not_run))
    return CombinedVerdict(str(pte), results, "not-run",
                           "not run: " + "; ".join(f"{r.shown}: {r.detail}" for r in results))


def _references(ran) -> str:
    """The references beside the device code that agreed (TFLM on a program from a .tflite)."""
    agreed = [r for r in ran if r.name == TFLM and r.outcome == "passed"]
    return "".join(f"; {r.shown}: {r.detail.removeprefix('PASSED: ')}" for r in agreed)


MEMORY = "platform memory"  # not a method: the plan's fit verdict, a failure when it fails


def does_not_fit(program: TwinProgram) -> MethodResult | None:
    """The plan's memory verdict (platform YAML) as a failed result when the program does not
    fit: the device cannot load it, whatever the host methods computed."""
    try:
        memory = (load_json(program.require_manifest().file("plan.json")).get("summary")
                  or {}).get("memory") or {}
    except (DataFileError, UserError, ValueError, AttributeError):
        return None  # an unreadable plan is not a verdict on the memory
    if memory.get("fits", True) is not False:
        return None
    items = "; ".join(f"{m.get('item')} {m.get('bytes', 0):,} B -> "
                      + (f"{m.get('region')} has {m.get('region_bytes', 0):,} B"
                         if m.get("region") else "no region may hold it")
                      for m in memory.get("items", ()) if m.get("fits") is False)
    detail = (f"FAILED: the program does not fit the platform's memories ({items}; the plan's "
              "memory verdict, platform YAML): the device cannot load it")
    return MethodResult(MEMORY, "failed", detail, False, detail)


def load_program(pte) -> TwinProgram:
    """The `.pte` and its artifacts folder read once, as data (hash-checked manifest, payloads,
    TOSA graphs and their I/O): the value every method of one verify is handed."""
    from orchestrator.verification.twin import load_twin  # lazy: heavy (torch)

    return load_twin(pte)


def verify_all(pte, samples: int = 16, calibration=None, per_op: bool = False,
               max_steps: int = 1, executorch_src=None, cmsis_nn_src=None,
               platform=None, timeout_s: int = 600, methods=(TWIN, RUNTIME, QEMU, FVP, TFLM),
               npu_model: str = "auto", runner_elf=None, progress=None,
               qemu_samples: int = 4) -> CombinedVerdict:
    """Every method in `methods` that this machine has, and their verdict together; the NPU
    partitions computed as `npu_model` chooses (orchestrator/verification/npu.py);
    `progress(stage, event, seconds)` hears the twin's samples."""
    pte = Path(pte)
    twin = load_program(pte)  # the one read of the program and its artifacts
    choice = twin.npu_executor(npu_model).choice  # a choice that cannot apply is refused first
    inputs = VerifyInputs(samples, calibration, per_op, max_steps, npu_model, platform,
                          timeout_s, executorch_src, cmsis_nn_src, runner_elf,
                          progress=progress, qemu_samples=qemu_samples)
    results = tuple(method.run(twin, inputs) for method in VERIFIERS if method.name in methods
                    and (method.name != TFLM or TflmMethod.applies(twin)))
    results += tuple(r for r in [does_not_fit(twin)] if r is not None)
    verdict = combine(pte, results, has_npu=bool(twin.partitions), npu_stream=choice != "tosa")
    if twin.has_state:
        verdict = replace(verdict, verdict=verdict.verdict + (
            f"; the samples ran as frames, in order from the initial state, the program "
            f"carrying {twin.view.state_bytes:,} B of state ({samples} on the twin and the host runtime, "
            f"{qemu_samples} on QEMU)"))
    return verdict
