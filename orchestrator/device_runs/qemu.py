"""The QEMU method: the platform's runner firmware (ExecuTorch runtime, portable and CMSIS-NN
kernels built for the core its runner/firmware.yaml names) on QEMU's mps3-an547, or, for a
CPU-only program of another core, the runner built for that core on QEMU's machine for it
(platforms/qemu_machines/: M3, M4, M7, M33 and stand-ins for the M0/M0+/M23/M35P/M85),
self-checking against the twin's outputs (BundleIO, byte-exact). QEMU models no Ethos-U, so a
hybrid program's NPU invocations are handed over semihosting to the host
(orchestrator/device_runs/qemu_npu.py).

Here: which installed platform runs a `.pte` (for QEMU and the FVP), why QEMU cannot judge a
program, the run on a checked `.pte`, its report lines and its `MethodResult` for the verdict
(orchestrator/device_runs/combined.py). The harness itself is platforms/qemu.py.

The programs run are the installed platform's runner and QEMU, never a program the artifacts
folder names: the manifest's platform is looked up by name among the installed platforms.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.artifacts.profile import (DWT_CYCLES, METHOD_EXECUTE, QEMU_ICOUNT, Clock,
                                            Profile, TraceEvent, etdump_bytes)
from orchestrator.errors import NotRun, UserError, VerificationFailure
from orchestrator.verification.methods import QEMU, MethodResult, qemu_label
from platforms.platform import PlatformError, list_platforms, load_platform
from platforms.qemu import run_bpte_on_qemu
from kernels.native.errors import KernelsMissing, QemuUnavailable
from platforms.qemu_machines import qemu_runner
from platforms.runner_protocol import EXECUTE

if TYPE_CHECKING:  # types only: platforms.qemu is imported where a run needs it
    from platforms.qemu import QemuResult


def qemu_unavailable_reason(target: dict, has_npu: bool, platform) -> str | None:
    """Why QEMU cannot judge this program on `platform`'s runner, or None. The platform's
    runner/firmware.yaml says which core the firmware is built for and which NPU families its
    semihosting bridge serves: a hybrid Ethos-U55/U65 program has its NPU invocations executed
    by the functional model, an Ethos-U85 one (Corstone-320) has them computed from the
    partitions' TOSA graphs. A CPU-only program for another core runs on the QEMU machine that
    runs that core's build (platforms/qemu_machines/); a core no machine runs is named."""
    try:
        _, config = qemu_runner(platform, target.get("cpu") or None)
    except QemuUnavailable as error:
        return str(error).removeprefix("not run: ")
    npu = str(target.get("npu") or "")
    if has_npu and config.npu_product(npu) is None:
        served = ", ".join(config.npu_products) or "no NPU"
        runner = (f"the {platform.name} runner's NPU bridge serves {served}" if
                  not config.machine_map else
                  f"the runner built for the {target.get('cpu')} there serves no NPU")
        return (f"the program delegates to {npu or 'the Ethos-U'}; QEMU's {config.qemu_machine} "
                f"has no Ethos-U, and {runner}")
    return None


def installed_platform(target: dict, override=None):
    """The platform whose programs (runner, QEMU, FVP) run this `.pte`: `override` (the user's
    --platform, a name or a YAML path) or the installed platform the manifest names. A manifest
    is data: a path in it is never loaded, and its platform file is only compared."""
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


def qemu_on_checked_pte(program, platform, timeout_s: int = 600, atol: float = 0.0,
                        samples: int = 4, npu_model: str = "auto", trace: bool = False,
                        inputs=None):
    """Run a fresh BundleIO of the program (a loaded TwinProgram, or a `.pte` path, checked
    against its manifest: a .bpte lying beside it is covered by no hash) on the platform's
    runner in QEMU; `trace`: the runner's trace build (per-instruction scopes,
    platforms/qemu.py)."""
    from orchestrator.verification.bundle import write_bundle  # lazy: heavy (torch)
    from orchestrator.verification.twin import as_program  # lazy: heavy (torch)

    npu = {}
    twin = as_program(program)
    manifest = twin.require_manifest()
    target = manifest.target
    if target.get("npu"):
        from orchestrator.device_runs.qemu_npu import QemuNpuHandler  # lazy: heavy (numpy, vela)

        if twin.partitions:
            npu = {"npu_handler": QemuNpuHandler(twin, target["npu"], npu_model),
                   "npu": target["npu"],
                   "npu_fast_scratch_bytes": fast_scratch_bytes(platform, target)}
    with tempfile.TemporaryDirectory(prefix="orchestrate-qemu-") as folder:
        # A hybrid program's expectation is the TOSA graphs' (what Vela was given): the NPU
        # half runs on QEMU's side of the bridge, where the stream is checked against them.
        took: list = []
        bpte = write_bundle(twin, Path(folder) / "program.bpte", samples=samples,
                            npu_model="tosa" if npu else "auto", inputs=inputs, took=took)
        result = run_bpte_on_qemu(bpte, manifest.file("operators.txt"), platform,
                                  timeout_s=timeout_s, atol=atol, trace=trace,
                                  cpu=target.get("cpu") or None, **npu)
    if took:
        cases = "; ".join(f"case {case} ({count} instruction(s)): {origin}"
                          for case, count, origin in took)
        result = replace(result, expectation_note=(
            "the expected outputs carry on from a device's float values where they differ from "
            "the twin's within the summation-order bound (a float on a rounding boundary), "
            f"found by: {cases}"))
    return result


@dataclass(frozen=True)
class QemuProfile:
    """A profiling run: the trace build's run on QEMU and the ETDump made of its trace."""

    result: QemuResult = field(repr=False)
    etdump: bytes = field(repr=False)
    clock: Clock


def qemu_profile(program, platform, timeout_s: int = 600, atol: float = 0.0,
                 samples: int = 4, npu_model: str = "auto") -> QemuProfile:
    """Run the checked program (a loaded TwinProgram, or a `.pte` path) on the runner's trace
    build in QEMU and make the ETDump of its trace (orchestrator/artifacts/profile.py): one run
    per inference, its times in instructions retired (the SysTick ticks calibrated against
    QEMU's -icount) or in DWT cycles where the core counts them. Raises VerificationFailure
    when the traced run does not pass."""
    from orchestrator.verification.twin import as_program  # lazy: heavy (torch)

    pte = as_program(program)
    result = qemu_on_checked_pte(pte, platform, timeout_s, atol=atol, samples=samples,
                                 npu_model=npu_model, trace=True)
    if result.passed is not True:
        raise VerificationFailure(f"the profiling run (trace build) on QEMU did not report "
                                  f"PASS: {result.summary()}; no profile written")
    if result.trace_clock == "DWT cycles":
        clock, per_tick = DWT_CYCLES, 1.0
    elif result.trace_clock == "SysTick ticks" and result.instructions_per_tick:
        clock, per_tick = QEMU_ICOUNT, result.instructions_per_tick
    else:
        raise VerificationFailure("the trace build named no clock it can be read in "
                                  f"({result.trace_clock!r}); no profile written")
    events = [TraceEvent(e.case, e.instruction, METHOD_EXECUTE if e.kind == EXECUTE else e.kind,
                         e.kernel, e.start_ticks, e.ticks, e.kernel_start_ticks, e.kernel_ticks)
              for e in result.trace]
    details = {"runner": f"{result.runner} runner firmware, trace build",
               "core": result.core, "method": result.method,
               "tracer": "its own ticks (output CRCs, bookkeeping) removed from every scope"}
    etdump = etdump_bytes(events, clock, per_tick, hashlib.sha256(pte.pte_bytes).hexdigest(),
                          details)
    return QemuProfile(result, etdump, clock)


def profile_lines(profile: Profile, written: Path, untraced: int | None, pte: Path) -> list[str]:
    """What `verify --qemu --profile` prints: where the profile went and, read back from it,
    each instruction's median figure with its unit."""
    clock = profile.clock.text
    calls = profile.medians()
    lines = [f"profile: wrote {written}: ETDump (ExecuTorch devtools' format), "
             f"{len(profile.runs)} run(s), one per inference, {len(calls)} instruction(s) each; "
             f"times in {clock}"]
    total = profile.total()
    in_calls = sum(call.duration for call in calls)
    if total:
        versus = (f" (the untraced run: {untraced:,}, {total / untraced - 1:+.2%})"
                  if untraced else "")
        lines.append(f"profile: per inference (median): Method::execute {total:,} {clock}"
                     f"{versus}; its kernel and delegate calls {in_calls:,} "
                     f"({in_calls / total:.1%} of it)")
    width = max([len(c.kernel or "-") for c in calls] + [6])
    lines.append(f"  instr  call           {'kernel':<{width}}  {clock}  [kernel alone]")
    for call in calls:
        alone = f"  [{call.kernel_duration:,}]" if call.kernel_duration is not None else ""
        lines.append(f"  {call.instruction:>5}  {call.kind:<13}  {call.kernel or '-':<{width}}  "
                     f"{call.duration:>14,}{alone}")
    lines.append(f"profile: beside the plan's model: orchestrate plan {pte} --measured {written}")
    return lines


def fast_scratch_bytes(platform, target: dict) -> int:
    """The Ethos-U fast scratch (base address 2) the firmware sets aside for a program compiled
    for `target` (its manifest's): Vela's arena cache in a Dedicated_Sram memory mode
    (Dedicated_Sram_384KB: 384 KiB; Vela's default 384 KiB without a size), none in Shared_Sram
    or Sram_Only. The mode is the one the program was compiled with (a placement policy's or
    cost placement's may differ from the platform YAML's), the platform's when the manifest
    predates that field."""
    mode = str(target.get("vela_memory_mode")
                or platform.vela_config(target["npu"]).memory_mode or "")
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
                    f"{result.npu_commands:,} NPU commands executed by the Ethos-U85 model over "
                    "the run (a partition it does not execute completely: its TOSA graph)"
                    if "Ethos-U85 model" in (result.method or "") else
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
    if result.memory_note:
        lines.append(f"memory: {result.memory_note}")
    if result.expectation_note:
        lines.append(f"expectation: {result.expectation_note}")
    if result.weights_region:
        lines.append(f"weights: constant segment ({result.weights_bytes:,} B: the CPU's "
                     "constants; an NPU partition's weights are inside its delegate) read from "
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


def _floats_may_explain(result, twin) -> bool:
    """A QEMU run whose cases ran and some differed, of a program without state: a float on a
    rounding boundary may explain it."""
    return (result.passed is False and any(case.passed is False for case in result.cases)
            and not twin.has_state)


def _bundle_inputs(twin, samples: int) -> list:
    """The model inputs `write_bundle` gives the cases when none are passed (seeded)."""
    from orchestrator.verification.twin_verify import sample_inputs  # lazy: heavy (torch)

    float_program, _ = twin.reference("float.pt2")
    return sample_inputs(float_program, samples, None)[0]


def _runtime_floats(twin, inputs, npu_model: str) -> int:
    """The bundle's inputs through the host runtime, keeping the float values that reconcile
    it with the twin (`runtime_verify.runtime_float_values`); 0 when the runtime is not here."""
    from orchestrator.device_runs.runtime_verify import (  # lazy: heavy (torch, the runtime)
        runtime_float_values)

    try:
        return runtime_float_values(twin, inputs, npu_model)
    except NotRun:
        return 0


def _device_floats(twin, result, inputs, found_now=()) -> int:
    """For each failed case with output digests (but those whose floats the host runtime just
    found, `found_now`: QEMU has not run them), the floats at a rounding boundary whose move
    gives the device's bytes (`boundary_search.flips_matching`), kept in
    `twin.device_floats`; the number of cases explained."""
    from orchestrator.device_runs.runtime_verify import computes_floats  # lazy: heavy (torch)
    from orchestrator.verification.boundary_search import flips_matching  # lazy: heavy (torch)
    from orchestrator.verification.twin import (  # lazy: heavy (torch)
        OUTPUT_DIGESTS, DeviceFloats, input_key)
    from orchestrator.verification.twin_verify import device_inputs  # lazy: heavy (torch)

    if not computes_floats(twin):
        return 0
    choice = "tosa" if twin.partitions else "auto"  # as the bundle's expectation is computed
    explained = 0
    for case in result.cases:
        if case.passed is not False or case.index >= len(inputs):
            continue
        program_inputs = device_inputs(twin, inputs[case.index])
        if input_key(program_inputs) in found_now:
            continue
        found = flips_matching(twin, program_inputs, case.digests,
                               lambda: twin.npu_executor(choice))
        if found is not None:
            twin.device_floats[input_key(program_inputs)] = DeviceFloats(OUTPUT_DIGESTS, found)
            explained += 1
    return explained


def run_qemu(program, platform_override=None, timeout_s: int = 600,
             samples: int = 4, npu_model: str = "auto", atol: float = 0.0) -> MethodResult:
    """The QEMU method on the program (a loaded TwinProgram, or a `.pte` path)."""
    from orchestrator.verification.twin import as_program  # lazy: heavy (torch)

    twin = as_program(program)
    pte = twin.pte_path
    target = twin.require_manifest().target
    label = qemu_label(str(target.get("cpu") or ""))
    try:
        platform = installed_platform(target, platform_override)
    except UserError as error:
        return MethodResult(QEMU, "not-run", str(error), True, label=label)
    reason = qemu_unavailable_reason(target, bool(twin.partitions), platform)
    if reason is not None:
        return MethodResult(QEMU, "not-run", reason, True, label=label)
    try:
        result = qemu_on_checked_pte(twin, platform, timeout_s, atol=atol, samples=samples,
                                     npu_model=npu_model)
        if atol == 0 and _floats_may_explain(result, twin):
            # a float on a rounding boundary (verification/floats.py): the expectation carries
            # on from the host runtime's float values (where verify's host runtime method has
            # not found them already), or from the floats whose move across their boundary
            # gives the device's output digests (boundary_search.py); QEMU runs again and must
            # match that byte for byte
            before = dict(twin.device_floats)
            inputs = _bundle_inputs(twin, samples)
            found = 0 if before else _runtime_floats(twin, inputs, npu_model)
            found_now = {key for key in twin.device_floats if key not in before}
            found += _device_floats(twin, result, inputs, found_now)
            if found:
                result = qemu_on_checked_pte(twin, platform, timeout_s, atol=atol,
                                             samples=samples, npu_model=npu_model)
    except KernelsMissing as error:
        # a finding about the program, not this machine: the device runtime cannot load it
        # (the host runtime's library may have the kernel, so the other methods pass)
        detail = (f"FAILED: the program cannot load on the device runtime: "
                  f"{str(error).removeprefix('not run: ')}; no kernel "
                  "library the device firmware links provides it (found building the runner "
                  "firmware, so nothing ran in QEMU; register a kernel in the firmware, or "
                  "keep that op out of the model)")
        return MethodResult(QEMU, "failed", detail, True, f"method: {label}\n{detail}",
                            label=label)
    except (NotRun, QemuUnavailable) as error:
        return MethodResult(QEMU, "not-run", str(error).removeprefix("not run: "), True,
                            label=label)
    label = qemu_label(result.core) if result.core else label
    text = "\n".join([f"verify --qemu {pte}: {'PASS' if result.passed else 'FAIL'}",
                      *qemu_lines(result)])
    if result.passed:
        per = f", {result.instructions:,} instructions per inference (QEMU -icount, not cycles)" \
            if result.instructions else ""
        commands = (f"{result.npu_commands:,} NPU commands in " if result.npu_commands else "")
        npu = (f"; NPU: {result.method}, {commands}{result.npu_invocations} invocation(s)"
               if result.npu else "")
        detail = (f"PASSED on the {result.runner} runner firmware in QEMU ({result.core}): "
                  f"{len(result.cases)} BundleIO case(s) byte-exact against the twin{per}{npu}"
                  + (f"; {result.expectation_note}" if result.expectation_note else ""))
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
                                    "instructions": c.instructions} for c in result.cases]},
                        label=label)
