"""What a user asks for: one frozen Request, validated once into a Resolved request.

Every verb that compiles a model (`plan`, `compile`, `sweep`, the CLI and each sweep worker)
builds a Request and hands it to `orchestrator.api`; nothing else resolves targets, policies or
memory policies, so a check made for one verb is made for all.

    from orchestrator.request import Request
    request = Request("ds-cnn", npu="ethos-u55-128", cpu_hz=400e6)
    plan = orchestrator.plan(request)

Precedence: explicit request fields win over the placement policy file, which wins over the
platform YAML's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.compilation import precision
from orchestrator.errors import UserError
from orchestrator.target import Target, io_request, resolve_target
from platforms import PlatformError
from platforms.memory_placement import MemoryPolicy, check_policy, load_memory_policy

# How calibration sets each activation's range (orchestrator/compilation/observers.py): the
# default is upstream's own observer, so a program compiled without the option is upstream's.
CALIBRATION_METHODS = ("histogram", "minmax", "moving-average")
DEFAULT_CALIBRATION_METHOD = "histogram"

if TYPE_CHECKING:  # partitioners.policy imports torch (a second): imported where a policy is read
    from cost_models.profile_calibration import CpuCalibration
    from partitioners.policy import Policy


@dataclass(frozen=True)
class Request:
    """A model and the target it is compiled for, as the user gave them."""

    model: str  # zoo name, path/file.py:factory, a .py with ModelUnderTest, or a .pt2
    platform: str = "corstone300"  # a shipped platform name or a platform YAML path
    npu: str | None = None  # e.g. "ethos-u55-128"; "none" for CPU only; None: the platform's
    cpu: str | None = None  # e.g. "cortex-m55"; None: the platform's
    io: str = "float"  # float | int8 | auto
    calibration: str | None = None  # a .pt/.npz file or a folder of them
    calibration_method: str = DEFAULT_CALIBRATION_METHOD  # one of CALIBRATION_METHODS
    # Modules quantized otherwise than int8: "features.2=a16w8,classifier=a16w8" or a mapping
    # {module: "a16w8"} (orchestrator/compilation/precision.py); wins over the policy's map
    precision: "str | dict | None" = None
    cpu_hz: float | None = None
    npu_hz: float | None = None
    policy: "str | Policy | None" = None  # a placement policy YAML path or a Policy
    placement: str | None = None  # greedy | cost; None: the policy's, else greedy
    memory_policy: str | MemoryPolicy | None = None  # auto | in-place | a YAML path
    runner_ops: frozenset[str] | None = None  # operators the runner firmware registers
    # A CPU calibration file (`orchestrate calibrate`) or a shipped one's name; None: the
    # platform YAML's `cpu: calibration_costs:`, else the cost model's own figures.
    calibration_costs: str | None = None

    def with_npu(self, npu: str | None) -> "Request":
        return replace(self, npu=npu)


@dataclass(frozen=True)
class Resolved:
    """A Request checked against the platform: every field it implies, typed."""

    request: Request
    target: Target
    policy: "Policy | None"
    placement: str  # greedy | cost
    io_auto: bool  # `--io auto`: compile float first and keep int8 when it pays
    memory: MemoryPolicy | None  # None: auto
    costs: "CpuCalibration | None" = None  # the CPU calibration the plan's costs use
    precision: tuple[tuple[str, str], ...] = ()  # (module, precision): policy's, then request's


def load_policy_arg(policy: "str | Policy | None") -> "Policy | None":
    """A Policy from a path, a Policy, or None (the default greedy policy)."""
    from partitioners.policy import Policy, PolicyError, load_policy  # lazy: heavy (torch)

    if policy is None or isinstance(policy, Policy):
        return policy
    try:
        return load_policy(policy)
    except PolicyError as error:
        raise UserError(str(error)) from None


def memory_policy(text: str | MemoryPolicy | None, platform=None) -> MemoryPolicy | None:
    """The MemoryPolicy of `--memory-policy` (None: auto), checked against `platform` when
    given; a UserError names what is wrong."""
    try:
        policy = text if isinstance(text, MemoryPolicy) or text is None else \
            load_memory_policy(str(text))
        if policy is not None and platform is not None:
            check_policy(platform, policy)
    except PlatformError as error:
        raise UserError(str(error)) from None
    return policy


def resolve(request: Request) -> Resolved:
    """Validate `request` once: the policy file, the placement mode, the target and the memory
    policy; the first problem is a UserError naming it and what to do."""
    from partitioners.policy import PLACEMENTS  # lazy: heavy (torch)

    policy = load_policy_arg(request.policy)
    mode = request.placement or (policy.placement if policy is not None else "greedy")
    if mode not in PLACEMENTS:
        raise UserError(f"--placement {mode!r} is not supported; use one of "
                        f"{', '.join(PLACEMENTS)}")
    if request.calibration_method not in CALIBRATION_METHODS:
        raise UserError(f"--calibration-method {request.calibration_method!r} is not offered; "
                        f"use one of {', '.join(CALIBRATION_METHODS)}")
    npu, cpu_hz, npu_hz = request.npu, request.cpu_hz, request.npu_hz
    if policy is not None:
        npu = npu if npu is not None else policy.npu
        cpu_hz = cpu_hz if cpu_hz is not None else policy.cpu_hz
        npu_hz = npu_hz if npu_hz is not None else policy.npu_hz
    target = resolve_target(request.platform, npu=npu, cpu=request.cpu, io=request.io,
                            cpu_hz=cpu_hz, npu_hz=npu_hz)
    if policy is not None and target.npu and (policy.system_config or policy.memory_mode):
        target = replace(target, system_config=policy.system_config or target.system_config,
                         memory_mode=policy.memory_mode or target.memory_mode)
    return Resolved(request, target, policy, mode, io_request(request.io)[1],
                    memory_policy(request.memory_policy, target.platform),
                    cpu_calibration(request.calibration_costs, target),
                    _precisions(request, policy))


def _precisions(request: Request, policy) -> tuple[tuple[str, str], ...]:
    """The modules' precisions: the policy's `precision:` map, then --precision's entries."""
    given = request.precision
    pairs = precision.from_mapping(given, "--precision") if isinstance(given, dict) else \
        precision.parse(given)
    ruled = precision.checked(policy.precision, f"policy {policy.source}: precision") \
        if policy is not None else ()
    pairs = precision.merged(ruled, pairs)
    return pairs


def cpu_calibration(given: str | None, target: Target) -> "CpuCalibration | None":
    """The CPU calibration a plan for `target` uses: `given` (a file or a shipped name; one of
    another core is refused), else the platform YAML's when it is of the target's core (a
    platform calibrates its default core), else, for `--cpu` another core than the platform
    names, the shipped QEMU calibration of that core if there is one."""
    from cost_models.profile_calibration import (  # lazy: heavy (numpy)
        CalibrationError, check_core, load_calibration, shipped_for_core)

    try:
        if given is not None:
            calibration = load_calibration(given)
            check_core(calibration, target.cpu)
            return calibration
        named = target.platform.cpu_calibration
        if named is not None:
            calibration = load_calibration(named, shipped_only=not Path(named).is_absolute())
            if calibration.core == target.cpu:
                return calibration
        own = shipped_for_core(target.cpu)
        if named is None or own is None or target.cpu == target.platform.cpu_default:
            return None
        return load_calibration(own, shipped_only=True)
    except CalibrationError as error:
        raise UserError(str(error)) from None
