"""Adapter: every touch of the Cortex-M backend's private names, in one place, with a version guard.

`AtenToCortexMPass._DIALECT_SUBSTITUTIONS` (aten op -> substitution function that returns a
CMSIS-NN-backed node or None) is the only record of which aten ops have a CMSIS-NN kernel and of
the conditions each substitution checks; it has no public accessor.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable, Iterator

from partitioners.upstream_version import UpstreamVersionError, require  # noqa: F401

SUPPORTED_EXECUTORCH = ("1.5.1",)


def check_version() -> str:
    return require("executorch", SUPPORTED_EXECUTORCH, "partitioners/upstream_cortex_m.py")


def _table() -> dict:
    check_version()
    from executorch.backends.cortex_m.passes.aten_to_cortex_m_pass import AtenToCortexMPass

    return AtenToCortexMPass._DIALECT_SUBSTITUTIONS


def substitutions() -> dict:
    """A copy of aten op -> upstream substitution function."""
    return dict(_table())


def has_substitution(target) -> bool:
    return target in _table()


def substituted_op_names() -> frozenset[str]:
    """Base names ("convolution", "add", ...) of the aten ops that have a CMSIS-NN substitution."""
    names = set()
    for target in _table():
        name = str(getattr(target, "__name__", target))
        parts = name.split(".")
        names.add(parts[1] if parts[0] in ("aten", "edge") and len(parts) > 1 else parts[0])
    return frozenset(names)


@contextlib.contextmanager
def substitutions_wrapped(wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """Replace every substitution `f` by `wrap(f)` meanwhile (how decisions are recorded)."""
    table = _table()
    upstream = dict(table)
    for target, substitution in upstream.items():
        table[target] = wrap(substitution)
    try:
        yield
    finally:
        table.clear()
        table.update(upstream)


def contract() -> dict[str, object]:
    from executorch.backends.cortex_m.passes.aten_to_cortex_m_pass import AtenToCortexMPass

    table = AtenToCortexMPass._DIALECT_SUBSTITUTIONS
    first = next(iter(table.values()))
    return {
        "_DIALECT_SUBSTITUTIONS": isinstance(table, dict) and len(table) > 0,
        "substitution signature": list(inspect.signature(first).parameters),
    }
