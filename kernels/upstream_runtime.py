"""Adapter: every touch of the ExecuTorch runtime's private Python names from kernels/, in one
place, with a version guard.

- `executorch.extension.pybindings.portable_lib._get_operator_names()`: the kernels the host
  runtime registered ("aten::add.out", ...), the only way to ask it; no public accessor.
- `portable_lib._get_registered_backend_names()`: the delegate backends registered in the
  process (the host runtime checks its EthosUBackend arrived).
- `portable_lib._load_for_executorch_from_buffer(buffer, ...)`: the pybindings' loader of a
  `.pte` held in memory.
- these three are read from `executorch.extension.pybindings._C`, the extension module that
  `portable_lib` re-exports, after `import torch` (which loads the libtorch it links to, as
  `portable_lib` does first): `portable_lib` itself imports `executorch.exir` for a warning
  class, 4.2 s of the device check's child process at every compile.
- `executorch.runtime.Runtime.load_program(..., verification=Verification.InternalConsistency)`
  (public, marked experimental): the runtime's flatbuffer verifier and program validation on a
  `.pte`. `_load_for_executorch_from_buffer` takes a `program_verification` argument too, but a
  program whose value table is 400 KB longer than the file loads through it (measured on
  executorch 1.5.1), while `load_program` refuses it ("Verification failed").
- `executorch.exir._serialize._program.deserialize_pte_binary`: the only reader of a `.pte` into
  the schema's Program in Python, and of its mutable/named data segments (`PTEFile`); every
  reader of a program goes through kernels/program_view.py's `ProgramView.read`, built on
  `deserialize_pte` here.

`tests/test_upstream_adapters.py` checks these names and signatures without compiling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import inspect
from dataclasses import dataclass

from kernels.upstream_version import UpstreamVersionError, require  # noqa: F401

if TYPE_CHECKING:  # types only: importing exir takes seconds
    from executorch.exir._serialize._named_data_store import NamedDataStoreOutput
    from executorch.exir.schema import Buffer, Program

SUPPORTED_EXECUTORCH = ("1.5.1",)


def check_version() -> str:
    return require("executorch", SUPPORTED_EXECUTORCH, "kernels/upstream_runtime.py")


def _portable_lib():
    check_version()
    import torch  # noqa: F401  # lazy: order (libtorch before the extension that links to it)
    from executorch.extension.pybindings import _C  # lazy: heavy (executorch runtime)

    return _C


def load_runtime() -> None:
    """Import the pybindings (after the version check), which loads the wheel's
    `libexecutorch.so`: the kernel and backend registries a library opened afterwards with
    RTLD_GLOBAL binds to (kernels/host_runtime/session.py)."""
    _portable_lib()


def operator_names() -> frozenset[str]:
    """`ns::name.overload` of every kernel registered in the host runtime (portable library,
    plus whatever else the process loaded)."""
    return frozenset(_portable_lib()._get_operator_names())


def registered_backend_names() -> frozenset[str]:
    """The delegate backends registered in the host runtime, e.g. {"EthosUBackend", ...}."""
    return frozenset(_portable_lib()._get_registered_backend_names())


def load_from_buffer(buffer: bytes, **options):
    """The pybindings module of a `.pte` in memory; it reads `buffer` in place: keep it alive.
    `options`: enable_etdump, debug_buffer_size, ... as `_load_for_executorch_from_buffer` takes."""
    return _portable_lib()._load_for_executorch_from_buffer(buffer, **options)


def verification_refusal(pte_bytes: bytes) -> str | None:
    """Why the runtime's verifier refuses the `.pte` (Program::load with InternalConsistency:
    the flatbuffer verifier and the program's validation), or None when it accepts it. Program
    loading only: no method is loaded, no kernel is needed."""
    check_version()
    from executorch.runtime import Runtime, Verification  # lazy: heavy (executorch runtime)

    try:
        Runtime.get().load_program(bytes(pte_bytes),
                                   verification=Verification.InternalConsistency)
    except RuntimeError as error:
        return str(error)
    return None


@dataclass(frozen=True)
class PteContents:
    """A `.pte` as upstream's reader returns it: the schema Program and the data segments kept
    outside it (falsy when the program has none)."""

    program: Program
    mutable_data: list[Buffer] | None
    named_data: NamedDataStoreOutput | None


def deserialize_pte(pte_bytes: bytes) -> PteContents:
    """The Program and the mutable/named data segments of a `.pte` (upstream's exceptions pass
    through: anything it cannot parse raises)."""
    check_version()
    from executorch.exir._serialize._program import (  # lazy: heavy (executorch)
        deserialize_pte_binary)

    pte = deserialize_pte_binary(pte_bytes)
    return PteContents(pte.program, pte.mutable_data, pte.named_data)


def _pybind_parameters(function) -> list[str]:
    """Parameter names from a pybind11 docstring: `name(a: int, b: bytes = None) -> list`."""
    first = (function.__doc__ or "").strip().splitlines()[0] if function.__doc__ else ""
    inside = first[first.find("(") + 1:first.rfind(")")] if "(" in first else ""
    names, depth, current = [], 0, ""
    for char in inside:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            names.append(current)
            current = ""
        else:
            current += char
    names.append(current)
    return [n.split(":")[0].split("=")[0].strip() for n in names if n.strip()]


def contract() -> dict[str, object]:
    """The upstream names and signatures this adapter relies on (for the contract test)."""
    from executorch.exir._serialize import _program  # lazy: heavy (executorch)
    from executorch.extension.pybindings import portable_lib  # lazy: heavy (executorch runtime)
    from executorch.runtime import Runtime  # lazy: heavy (executorch runtime)

    names = portable_lib._get_operator_names()
    return {
        "_get_operator_names": _pybind_parameters(portable_lib._get_operator_names),
        "operator name form": isinstance(names, list) and all(
            isinstance(n, str) and "::" in n for n in names),
        "_get_registered_backend_names": _pybind_parameters(
            portable_lib._get_registered_backend_names),
        "_load_for_executorch_from_buffer": _pybind_parameters(
            portable_lib._load_for_executorch_from_buffer),
        "deserialize_pte_binary": list(inspect.signature(_program.deserialize_pte_binary).parameters),
        "Runtime.load_program": list(inspect.signature(Runtime.load_program).parameters),
        "PTEFile.program": "program" in getattr(_program.PTEFile, "__dataclass_fields__", {}),
        "PTEFile fields": list(getattr(_program.PTEFile, "__dataclass_fields__", {})),
        # _portable_lib() reads the extension module portable_lib re-exports
        "portable_lib re-exports _C": all(
            getattr(portable_lib, name) is getattr(_portable_lib(), name)
            for name in ("_get_operator_names", "_get_registered_backend_names",
                         "_load_for_executorch_from_buffer")),
    }
