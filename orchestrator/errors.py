"""The exceptions `orchestrate` raises on purpose, each with the process exit code the CLI uses.

The CLI maps an exception to its `exit_code` so that CI can tell a user mistake (2) from a
failed gate (3), a failed verification (4) and a check that could not run (5).
"""

from npu_driver.payload import PayloadError
from platforms.fvp import FvpUnavailable
from platforms.platform import PlatformError
from kernels.native.errors import QemuUnavailable


def one_line(text: str) -> str:
    """Collapse a message that may span lines (e.g. a chained error) into one line."""
    return " ".join(text.split())


def describe_error(exc: BaseException) -> str:
    """An exception as `Type: its message on one line`, for a one-line error to the user."""
    message = one_line(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class OrchestrateError(Exception):
    """Base of every error the tool raises deliberately."""

    exit_code = 1


class UserError(OrchestrateError):
    """A bad model, file, name or option: the message is one line naming the problem and what to do."""

    exit_code = 2


class GateFailure(OrchestrateError):
    """A CI gate (e.g. a minimum NPU share) was not met."""

    exit_code = 3


class VerificationFailure(OrchestrateError):
    """The compiled program did not reproduce the reference outputs."""

    exit_code = 4


class NotRun(OrchestrateError):
    """A requested check could not run here (e.g. no FVP installed)."""

    exit_code = 5


def lower_errors() -> dict[type, type[OrchestrateError]]:
    """The packages below `orchestrator` raise their own exceptions; this is how each one is
    reported: a bad platform or a malformed delegate payload is the user's data (exit 2), a
    missing FVP a check that could not run (exit 5)."""
    from kernels.runtime import RuntimeFailure, RuntimeUnavailable  # lazy: heavy (torch)
    from npu_driver.tosa_twin import TosaTwinError  # lazy: heavy (numpy)
    from cost_models.profile_calibration import CalibrationError  # lazy: heavy (numpy)

    return {PlatformError: UserError, CalibrationError: UserError, PayloadError: UserError,
            TosaTwinError: UserError,
            FvpUnavailable: NotRun, RuntimeUnavailable: NotRun, QemuUnavailable: NotRun,
            RuntimeFailure: VerificationFailure}


def as_orchestrate_error(error: BaseException) -> OrchestrateError | None:
    """`error` as the OrchestrateError the CLI reports, or None if it is not one we classify."""
    if isinstance(error, OrchestrateError):
        return error
    for lower, kind in lower_errors().items():
        if isinstance(error, lower):
            return kind(str(error))
    return None
