"""The exceptions `orchestrate` raises on purpose, each with the process exit code the CLI uses.

The CLI maps an exception to its `exit_code` so that CI can tell a user mistake (2) from a
failed gate (3), a failed verification (4) and a check that could not run (5).
"""


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
