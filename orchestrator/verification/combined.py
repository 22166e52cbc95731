"""`verify` by every method this machine has: the device code judges, the twin explains.

Three methods, asked in order, each saying what it exercised or why it could not run:

- **twin**: the `.pte` executed instruction by instruction on the host, each value checked
  against the quantized reference fed the program's own inputs (orchestrator/verification/twin_verify.py).
  It explains a failure (which op, which step) but it is our re-statement of the kernels, so it
  never judges alone.
- **host runtime**: the real ExecuTorch runtime with the portable and Cortex-M kernels and
  EthosUBackend built for the host (orchestrator/verification/runtime_verify.py), compared with the twin.
  It judges the scalar and DSP tiers, the program loading and memory plan, every kernel's own
  argument checks and the NPU glue; for MVE programs it compares the C-path form of the few ops
  whose MVE form differs and names them.
- **QEMU**: the platform's runner firmware (ExecuTorch runtime, portable and CMSIS-NN kernels
  built for the core its runner/firmware.yaml names) on QEMU's mps3-an547, self-checking against
  the twin's outputs (BundleIO, byte-exact). It judges Corstone-300 Cortex-M55 programs and
  Corstone-320 Cortex-M85 programs (their Armv8.1-M + MVE build runs on QEMU's M55; QEMU has no
  M85). QEMU models no Ethos-U, so a hybrid program's NPU invocations are handed over semihosting
  to the host (orchestrator/verification/qemu_npu.py), with the real EthosUBackend and core
  driver in the firmware: the Ethos-U55/U65 functional model executes the command stream, an
  Ethos-U85 partition is computed from its TOSA graph. Other cores are "not run".

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
from dataclasses import dataclass
from pathlib import Path

from orchestrator.artifacts.manifest import Manifest
from orchestrator.verification.npu import NpuModelCannotRun, NpuModelFault

TWIN, RUNTIME, QEMU = "twin", "host runtime", "QEMU Cortex-M55"


@dataclass(frozen=True)
class MethodResult:
    name: str
    outcome: str  # passed | failed | partial | inconclusive | not-run
    detail: str  # the method's own verdict line, or why it did not run
    device_code: bool  # the method executes the device's own runtime and kernels
    text: str = ""  # the method's full report (text)
    report: dict | None = None  # the method's JSON report


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
                "methods": [{"name": r.name, "outcome": r.outcome, "detail": r.detail,
                             "device_code": r.device_code, "report": r.report}
                            for r in self.results]}

    def render_text(self) -> str:
        lines = []
        for result in self.results:
            if result.text:
                lines.append(result.text)
        lines.append(f"verify {self.pte}: {self.outcome.upper()}")
        for result in self.results:
            lines.append(f"  {result.name}: {result.outcome}: {result.detail}")
        lines.append(f"  verdict: {self.verdict}")
        return "\n".join(lines)


def run_twin(pte: Path, samples: int, calibration, per_op: bool, max_steps: int,
             npu_model: str = "auto") -> MethodResult:
    from orchestrator.verification.twin import TwinCannotRun
    from orchestrator.verification.twin_verify import render_text, report_json, verify

    try:
        report = verify(pte, samples=samples, calibration=calibration, per_op=per_op,
                        max_steps=max_steps, npu_model=npu_model)
    except (TwinCannotRun, NpuModelCannotRun) as error:
        return MethodResult(TWIN, "not-run", str(error).removeprefix("not run: "), False)
    except NpuModelFault as error:
        return MethodResult(TWIN, "failed", f"FAILED by the twin: {error}", False)
    outcome = ("inconclusive" if report.inconclusive else
               "passed" if report.passed else "failed")
    return MethodResult(TWIN, outcome, report.verdict, False, render_text(report),
                        report_json(report))


def run_host_runtime(pte: Path, samples: int, calibration, per_op: bool,
                     executorch_src=None, cmsis_nn_src=None,
                     npu_model: str = "auto") -> MethodResult:
    from orchestrator.errors import NotRun
    from orchestrator.verification.runtime_verify import render_text, report_json, verify_runtime

    try:
        report = verify_runtime(pte, samples=samples, calibration=calibration, per_op=per_op,
                                executorch_src=executorch_src, cmsis_nn_src=cmsis_nn_src,
                                npu_model=npu_model)
    except NotRun as error:
        return MethodResult(RUNTIME, "not-run", str(error).removeprefix("not run: "), True)
    outcome = {"passed": "passed", "partial": "partial"}.get(report.outcome, "failed")
    return MethodResult(RUNTIME, outcome, report.verdict, True, render_text(report),
                        report_json(report))


def qemu_unavailable_reason(target: dict, has_npu: bool, platform) -> str | None:
    """Why QEMU cannot judge this program on `platform`'s runner, or None. The platform's
    runner/firmware.yaml says which core the firmware is built for and which NPU families its
    semihosting bridge serves: a hybrid Ethos-U55/U65 program has its NPU invocations executed
    by the functional model, an Ethos-U85 one (Corstone-320) has them computed from the
    partitions' TOSA graphs."""
    from platforms.runner_build import QemuUnavailable, load_firmware_config

    try:
        config = load_firmware_config(platform)
    except QemuUnavailable as error:
        return str(error).removeprefix("not run: ")
    npu = str(target.get("npu") or "")
    if has_npu and config.npu_product(npu) is None:
        served = ", ".join(config.npu_products) or "no NPU"
        return (f"the program delegates to {npu or 'the Ethos-U'}; QEMU's {config.qemu_machine} "
                f"has no Ethos-U, and the {platform.name} runner's NPU bridge serves {served}")
    cpu = target.get("cpu")
    if cpu and cpu != config.cpu:
        return (f"the program is compiled for {cpu}; the {platform.name} runner on QEMU is built "
                f"for the {config.cpu}, whose kernels would not run the program's tier as "
                "compiled")
    return None


def installed_platform(target: dict, override=None):
    """The platform whose programs (runner, QEMU, FVP) run this `.pte`: `override` (the user's
    --platform, a name or a YAML path) or the installed platform the manifest names. A manifest
    is data: a path in it is never loaded, and its platform file is only compared."""
    from orchestrator.errors import UserError
    from platforms.platform import PlatformError, list_platforms, load_platform

    if override:
        try:
            return load_platform(override)
        except PlatformError as error:
            raise UserError(str(error)) from None
    name = str(target.get("platform") or "")
    key = name.strip().lower().replace("-", "").replace("_", "")
    if key not in list_platforms():
        raise UserError(
            f"the program was compiled for platform {name!r}, which is not an installed platform "
            f"({', '.join(list_platforms())}); pass --platform FILE with its YAML (programs to "
            "run are never taken from an artifacts folder)")
    return load_platform(key)


def qemu_on_checked_pte(pte: Path, platform, timeout_s: int = 600, atol: float = 0.0,
                        samples: int = 4, npu_model: str = "auto"):
    """Run a fresh BundleIO of `pte` (the caller has checked it against its manifest: a .bpte
    lying beside it is covered by no hash) on the platform's runner in QEMU."""
    from orchestrator.verification.bundle import write_bundle
    from platforms.qemu import run_bpte_on_qemu

    npu = {}
    twin = None
    target = Manifest.load(pte).target
    if target.get("npu"):
        from orchestrator.verification.qemu_npu import QemuNpuHandler
        from orchestrator.verification.twin import load_twin

        twin = load_twin(pte)
        if twin.partitions:
            npu = {"npu_handler": QemuNpuHandler(twin, target["npu"], npu_model),
                   "npu": target["npu"],
                   "npu_fast_scratch_bytes": fast_scratch_bytes(platform, target["npu"])}
    with tempfile.TemporaryDirectory(prefix="orchestrate-qemu-") as folder:
        # A hybrid program's expectation is the TOSA graphs' (what Vela was given): the NPU
        # half runs on QEMU's side of the bridge, where the stream is checked against them.
        bpte = write_bundle(pte, Path(folder) / "program.bpte", samples=samples,
                            npu_model="tosa" if npu else "auto")
        return run_bpte_on_qemu(bpte, Manifest.load(pte).file("operators.txt"), platform,
                                timeout_s=timeout_s, atol=atol, **npu)


def fast_scratch_bytes(platform, npu: str) -> int:
    """The Ethos-U fast scratch (base address 2) the firmware sets aside: Vela's arena cache in
    the platform's Dedicated_Sram memory mode (Dedicated_Sram_384KB: 384 KiB; Vela's default
    384 KiB without a size), none in Shared_Sram or Sram_Only."""
    import re

    mode = str(platform.vela_config(npu).memory_mode or "")
    if not mode.startswith("Dedicated_Sram"):
        return 0
    size = re.search(r"(\d+)\s*([KM])B", mode)
    if size is None:
        return 384 * 1024
    return int(size[1]) * (1024 if size[2] == "K" else 1024 * 1024)


def qemu_lines(result) -> list[str]:
    """What a QEMU run showed: method, verdict, where the weights and planned buffers went, each
    case and the instruction counts, with what the counts are (not cycles)."""
    core = result.core or "Cortex-M55 + MVE on QEMU mps3-an547"
    if result.npu:
        computed = (f"{result.npu_commands:,} NPU commands executed by the functional model "
                    "over the run" if result.npu.startswith(("ethos-u55", "ethos-u65")) else
                    "each computed from its partition's TOSA graph by the TOSA reference model "
                    "(the command stream is not executed)")
        lines = [f"method: {result.method} ({core}: ExecuTorch runtime, portable and CMSIS-NN "
                 "kernels, EthosUBackend and the Ethos-U core driver built for that core; each "
                 f"NPU invocation handed to the host over semihosting, {result.npu}; no timing)",
                 result.summary(),
                 f"npu: {result.npu_invocations} invocation(s), {computed}"]
        lines += [f"npu error: {line.removeprefix('NPU bridge: ')}" for line in result.errors
                  if line.startswith("NPU bridge: ")][:4]
    else:
        lines = [f"method: {result.method} ({core}: ExecuTorch runtime, portable and CMSIS-NN "
                 "kernels built for that core; no Ethos-U, no timing)",
                 result.summary()]
    if result.core_note:
        lines.append(f"core: {result.core_note}")
    if result.weights_region:
        lines.append(f"weights: constant segment ({result.weights_bytes:,} B) read from "
                     f"{result.weights_region} at {result.weights_address:#x}")
    for mem_id, size, region, address in result.planned_buffers:
        lines.append(f"activations: planned buffer mem_id {mem_id} ({size:,} B) in "
                     f"{region or '-'} at {address:#x}")
    for case in result.cases:
        count = f"{case.instructions:,} instructions" if case.instructions else "no count"
        lines.append(f"  case {case.index}: {'PASS' if case.passed else 'FAIL'}, {count}")
    lines.append("instructions: executed per inference, counted by QEMU -icount; a lower bound "
                 "on cycles, not cycles")
    return lines


def run_qemu(pte: Path, platform_override=None, timeout_s: int = 600,
             samples: int = 4, npu_model: str = "auto") -> MethodResult:
    from orchestrator.errors import NotRun, UserError
    from orchestrator.verification.twin import load_twin
    from platforms.runner_build import QemuUnavailable

    target = Manifest.load(pte).target
    try:
        platform = installed_platform(target, platform_override)
    except UserError as error:
        return MethodResult(QEMU, "not-run", str(error), True)
    reason = qemu_unavailable_reason(target, bool(load_twin(pte).partitions), platform)
    if reason is not None:
        return MethodResult(QEMU, "not-run", reason, True)
    try:
        result = qemu_on_checked_pte(pte, platform, timeout_s, samples=samples,
                                     npu_model=npu_model)
    except (NotRun, QemuUnavailable) as error:
        return MethodResult(QEMU, "not-run", str(error).removeprefix("not run: "), True)
    text = "\n".join([f"verify --qemu {pte}: {'PASS' if result.passed else 'FAIL'}"]
                     + [f"  {line}" for line in qemu_lines(result)])
    if result.passed:
        per = f", {result.instructions:,} instructions per inference (QEMU -icount, not cycles)" \
            if result.instructions else ""
        commands = (f"{result.npu_commands:,} NPU commands in " if result.npu_commands else "")
        npu = (f"; NPU: {result.method}, {commands}{result.npu_invocations} invocation(s)"
               if result.npu else "")
        detail = (f"PASSED on the {result.runner} runner firmware in QEMU ({result.core}): "
                  f"{len(result.cases)} BundleIO case(s) byte-exact against the twin{per}{npu}")
        outcome = "passed"
    else:
        detail = (f"FAILED on the {result.runner} runner firmware in QEMU: "
                  + ("; ".join(result.errors) or "a BundleIO case did not match the twin"))
        outcome = "failed"
    return MethodResult(QEMU, outcome, detail, True, text,
                        {"passed": result.passed, "instructions": result.instructions,
                         "method": result.method, "npu": result.npu,
                         "npu_invocations": result.npu_invocations,
                         "npu_commands": result.npu_commands,
                         "cases": [{"index": c.index, "passed": c.passed,
                                    "instructions": c.instructions} for c in result.cases]})


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
    partial = [r for r in ran if r.outcome == "partial"]
    not_run = [r for r in results if r.outcome == "not-run" and r.device_code]
    names = lambda rs: ", ".join(r.name for r in rs)  # noqa: E731
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
                               + (", with the twin" if any(r.name == TWIN for r in ran) else "")
                               + extra)
    if partial:
        return CombinedVerdict(str(pte), results, "partial",
                               f"PARTIAL: {'; '.join(r.detail for r in partial)}"
                               + (f"; {names(not_run)} not run: "
                                  + "; ".join(r.detail for r in not_run) if not_run else ""))
    if any(r.name == TWIN and r.outcome == "passed" for r in ran):
        return CombinedVerdict(str(pte), results, "twin-only",
                               "PASSED by the twin only; device code not run: "
                               + "; ".join(f"{r.name}: {r.detail}" for r in not_run))
    return CombinedVerdict(str(pte), results, "not-run",
                           "not run: " + "; ".join(f"{r.name}: {r.detail}" for r in results))


def verify_all(pte, samples: int = 16, calibration=None, per_op: bool = False,
               max_steps: int = 1, executorch_src=None, cmsis_nn_src=None,
               platform=None, timeout_s: int = 600, methods=(TWIN, RUNTIME, QEMU),
               npu_model: str = "auto") -> CombinedVerdict:
    """Every method in `methods` that this machine has, and their verdict together; the NPU
    partitions computed as `npu_model` chooses (orchestrator/verification/npu.py)."""
    from orchestrator.verification.twin import load_twin

    pte = Path(pte)
    twin = load_twin(pte)
    choice = twin.npu_executor(npu_model).choice  # a choice that cannot apply is refused first
    results = []
    if TWIN in methods:
        results.append(run_twin(pte, samples, calibration, per_op, max_steps, npu_model))
    if RUNTIME in methods:
        results.append(run_host_runtime(pte, samples, calibration, per_op, executorch_src,
                                        cmsis_nn_src, npu_model))
    if QEMU in methods:
        results.append(run_qemu(pte, platform, timeout_s, npu_model=npu_model))
    return combine(pte, tuple(results), has_npu=bool(twin.partitions),
                   npu_stream=choice != "tosa")
