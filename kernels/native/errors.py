"""What a native build of device code can fail with.

A check that needs a build it cannot make here (no toolchain, no sources, no QEMU, an operator
without a kernel) is "not run" (exit 5), never a pass: those are `QemuUnavailable`, named for
the method that first needed them and raised alike by `orchestrate firmware`'s build. A build
that starts and fails is `FirmwareBuildError`, a defect to fix. The host runtime's build has its
own `HostRuntimeUnavailable` (kernels/native/host.py).
"""

from __future__ import annotations


class QemuUnavailable(RuntimeError):
    """The QEMU check (or a firmware build) cannot run here; callers report "not run" (exit 5),
    never a pass."""

    def __init__(self, detail: str):
        super().__init__(f"not run: {detail}")


class ToolchainNotFound(QemuUnavailable):
    """No arm-none-eabi GCC (or no flatc matching the flatbuffers sources)."""


class QemuNotFound(QemuUnavailable):
    """No qemu-system-arm."""


class ThirdPartySourcesNotFound(QemuUnavailable):
    """No ExecuTorch / CMSIS-NN / flatbuffers sources to build the firmware from."""


class KernelsMissing(QemuUnavailable):
    """The program needs operators that have no kernel in the third-party sources."""


class FirmwareBuildError(RuntimeError):
    """Compiling or linking the firmware failed: a defect to fix, not a verdict on the model."""


class HostRuntimeUnavailable(RuntimeError):
    """The host runtime cannot be built or loaded here: sources, compiler or the wheel's runtime
    library are missing, or the build failed. A check that needs it did not run."""
