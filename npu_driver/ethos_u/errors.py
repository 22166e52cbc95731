"""What the functional model refuses, each naming the command (opcode name, word offset)."""

from __future__ import annotations


class NpuModelError(RuntimeError):
    """Base class: the model cannot execute this command stream faithfully."""


class CommandStreamError(NpuModelError):
    """The custom-operator payload or the command stream is malformed (the driver or the NPU
    would reject it): bad magic, unknown driver action or opcode, truncated command."""


class UnmodelledCommand(NpuModelError):
    """A command, register value or mode the model does not implement: refused, never skipped."""


class MemoryFault(NpuModelError):
    """An access outside its region (the NPU would raise a bus fault or corrupt memory)."""


class ConfigMismatch(NpuModelError):
    """The stream was compiled for another Ethos-U configuration (the driver's
    ethosu_dev_verify_optimizer_config refuses it)."""


def where(name: str, offset: int) -> str:
    return f"{name} at word {offset}"
