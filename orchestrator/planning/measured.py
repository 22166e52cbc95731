"""A profile beside the plan: each instruction's measured figure on the plan rows it runs.

`measure(view, plan_json, profile, program_sha256)` checks that the profile is of this program
(the SHA-256 it names, when it names one; then every run's instructions and their kernels
against the program's: a profile of another program is refused, one line) and maps each
instruction to the plan rows it runs (orchestrator/planning/instructions.py): a kernel call to
its CPU row, a delegate call to every row of its NPU partition. The figure of an instruction is
the median over the profile's runs, in the profile's clock: instructions retired under QEMU,
cycles on a device that says so. The plan's figures are its cost models' (CPU cycles at the
plan's clock, Vela's estimate for NPU rows): another unit, shown beside the measured one and
compared only as a ratio, never as the same quantity.
"""

from __future__ import annotations

from collections.abc import Mapping

from kernels.program_view import DelegateCall, KernelCall, ProgramView
from orchestrator.artifacts.profile import DELEGATE_CALL, OPERATOR_CALL, Profile
from orchestrator.errors import OrchestrateError, UserError
from orchestrator.planning.instructions import InstructionMapError, instruction_positions
from orchestrator.reports.measured import MeasuredCall, MeasuredPlan


def kernel_name(operator) -> str:
    """The name the generated kernel registration gives an operator's profiling scope
    (`native_call_<name>`): the operator without its namespace, with its overload."""
    bare = operator.name.split("::")[-1]
    return f"{bare}.{operator.overload}" if operator.overload else bare


def measure(view: ProgramView, plan_json: Mapping, profile: Profile,
            program_sha256: str) -> MeasuredPlan:
    """The profile's figures on the plan of the program `view` reads; UserError (one line)
    when the profile is of another program."""
    name = profile.path
    if profile.program_sha256 and profile.program_sha256 != program_sha256:
        raise UserError(f"profile '{name}' is of another program (SHA-256 "
                        f"{profile.program_sha256[:12]}..., this program's is "
                        f"{program_sha256[:12]}...); profile this one with `orchestrate verify "
                        "PROGRAM.pte --qemu --profile`")
    expected = {(0, call.index): call for call in view.instructions
                if isinstance(call, (KernelCall, DelegateCall))}
    for run_index, run in enumerate(profile.runs):
        _check_run(name, run_index, run, expected, view)
    try:
        positions = instruction_positions(
            view, [(str(op["placement"]), op.get("partition")) for op in plan_json["ops"]])
    except InstructionMapError as error:
        raise OrchestrateError(f"the plan's rows do not line up with the program's "
                               f"instructions: {error}") from None
    figures = {(call.chain, call.instruction): call for call in profile.medians()}
    calls = []
    for key, instruction in sorted(expected.items()):
        is_kernel = isinstance(instruction, KernelCall)
        calls.append(MeasuredCall(
            key[1], OPERATOR_CALL if is_kernel else DELEGATE_CALL,
            instruction.operator.qualified_name if is_kernel
            else view.delegates[instruction.delegate_index].backend,
            tuple(positions.get(key[1], ())),
            None if is_kernel else instruction.delegate_index,
            figures[key].duration, figures[key].kernel_duration))
    return MeasuredPlan(plan_json, profile, program_sha256, tuple(calls), profile.total())


def _check_run(name: str, run_index: int, run, expected: dict, view: ProgramView) -> None:
    """Every kernel and delegate call of the program, each once, with its kernel's name."""
    where = f"profile '{name}' is not of this program"
    fix = ("; profile this program with `orchestrate verify PROGRAM.pte --qemu --profile`, or "
           "compare the profile with the program it was recorded from")
    seen = set()
    for call in run.calls:
        key = (call.chain, call.instruction)
        instruction = expected.get(key)
        if instruction is None:
            raise UserError(f"{where}: its run {run_index} has {call.kind} at chain {call.chain} "
                            f"instruction {call.instruction}, which in this program is "
                            f"{_describe(view, call.chain, call.instruction)}{fix}")
        wanted = OPERATOR_CALL if isinstance(instruction, KernelCall) else DELEGATE_CALL
        if call.kind != wanted:
            raise UserError(f"{where}: instruction {call.instruction} is {call.kind} in the "
                            f"profile and a {wanted} in this program{fix}")
        if wanted == OPERATOR_CALL and call.kernel and call.kernel != kernel_name(
                instruction.operator):
            raise UserError(f"{where}: instruction {call.instruction} ran {call.kernel} in the "
                            f"profile; this program calls {instruction.operator.qualified_name} "
                            f"there{fix}")
        seen.add(key)
    missing = sorted(set(expected) - seen)
    if missing:
        chain, index = missing[0]
        raise UserError(f"{where}: its run {run_index} has no event for instruction {index} "
                        f"({_describe(view, chain, index)}) of {len(expected)} calls, "
                        f"{len(missing)} missing{fix}")


def _describe(view: ProgramView, chain: int, index: int) -> str:
    if chain >= len(view.chains) or not 0 <= index < len(view.chains[chain]):
        return "not an instruction"
    instruction = view.chains[chain][index]
    if isinstance(instruction, KernelCall):
        return f"a call of {instruction.operator.qualified_name}"
    if isinstance(instruction, DelegateCall):
        return f"a call of delegate {instruction.delegate_index}"
    return f"a {type(instruction).__name__}"
