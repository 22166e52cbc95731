"""Adapter: every touch of ExecuTorch's exir private names, in one place, with a version guard.

- `EdgeProgramManager._config_methods`: the constant methods (`input0_scale`, ...) that
  QuantizeInputs/QuantizeOutputs record; there is no public getter.
- `executorch.exir._serialize._program.deserialize_pte_binary` and `serialize_pte_binary`: a
  `.pte` read back into its PTEFile (the Program with its constants) and written again after
  its Program was rewritten (orchestrator/compilation/share_values.py), with the emitter's
  defaults (no delegate segments, 128-byte segment alignment, default constant alignment);
  orchestrator/compilation/share_tables.py writes the PTEFile itself instead when asked.
- A new EdgeProgramManager around the CPU-routed program (public constructor), instead of
  writing `EdgeProgramManager._edge_programs`, so the manager the lower stage returned stays as
  it was.

`tests/test_upstream_adapters.py` checks these names and signatures without compiling.
"""

from __future__ import annotations

import inspect

from partitioners.upstream_version import require

SUPPORTED_EXECUTORCH = ("1.5.1",)


def check_version() -> str:
    return require("executorch", SUPPORTED_EXECUTORCH, "orchestrator/compilation/upstream_exir.py")


def config_methods(edge_manager) -> dict:
    """The program's constant methods, e.g. {"input0_scale": 0.03, ...}."""
    check_version()
    return dict(edge_manager._config_methods or {})


def with_forward(edge_manager, program):
    """A new EdgeProgramManager whose "forward" is `program`, keeping the constant methods."""
    check_version()
    from executorch.exir import (  # lazy: heavy (torch, executorch)
        EdgeCompileConfig, EdgeProgramManager)

    return EdgeProgramManager(
        {"forward": program}, constant_methods=config_methods(edge_manager) or None,
        # The Cortex-M and quantized graphs do not pass edge IR validation (mixed dtypes,
        # cortex_m ops); upstream's own Arm flow turns it off too.
        compile_config=EdgeCompileConfig(_check_ir_validity=False))


def read_pte(pte_bytes: bytes):
    """The PTEFile of a `.pte`: its Program (constants back in `constant_buffer`, delegate
    payloads inline) and its mutable/named data segments."""
    check_version()
    from executorch.exir._serialize._program import (  # lazy: heavy (torch, executorch)
        deserialize_pte_binary)

    return deserialize_pte_binary(pte_bytes)


def write_pte(pte_file) -> bytes:
    """A PTEFile written by ExecuTorch's serializer as the emitter writes it."""
    check_version()
    from executorch.exir._serialize._program import (  # lazy: heavy (torch, executorch)
        serialize_pte_binary)

    return bytes(serialize_pte_binary(pte_file, extract_delegate_segments=False))


def contract() -> dict[str, object]:
    from executorch.exir import EdgeProgramManager  # lazy: heavy (torch, executorch)
    from executorch.exir._serialize import _program  # lazy: heavy (torch, executorch)

    return {
        "serialize_pte_binary": list(inspect.signature(_program.serialize_pte_binary).parameters),
        "EdgeProgramManager.__init__": list(inspect.signature(EdgeProgramManager.__init__).parameters),
        # set in __init__ as an attribute: it appears among the names the code stores
        "_config_methods": "_config_methods" in EdgeProgramManager.__init__.__code__.co_names,
    }
