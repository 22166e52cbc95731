"""Each distinct FX graph source compiled to bytecode once per process, not once per pass.

torch.fx regenerates a GraphModule's Python source on every `recompile()` and hands it to
`torch.fx.graph_module._exec_with_source`, which calls the builtin `compile()` on it. Upstream's
pass managers recompile after every pass (ExecuTorch's edge passes, the Arm backend's ~100 TOSA
passes, the Cortex-M passes), and most passes leave a given graph as it was, so the same source
is compiled again and again: a 25-step GRU's CPU-only compile makes 188 calls for 39 distinct
sources, 25 MB of Python compiled in 3.7 s; its U55-128 compile about twice that.

`install()` wraps `_exec_with_source` so a source seen recently reuses its code object: the last
16 distinct sources are kept (a pass pipeline recompiles the graph it is working on, so nearly
every repeat is of one of the last few: the GRU's U55-128 compile makes 620 calls, 553 of them
repeats within the last 8 sources and 555 ever), and a long-lived process (a sweep, a precision
search) holds at most those 16, not every graph it ever compiled. Nothing
else changes: torch still registers every source with its own loader (linecache, tracebacks) and
executes the code in the new module's own globals, so the function it defines is bound to that
module exactly as before; a code object is a pure function of its source text (the compile
flags are fixed: `dont_inherit=True`), and a reused one points its tracebacks at an earlier key
whose registered source is the same text. Programs are byte-identical with and without it
(tests/test_fx_code_cache.py; the golden list).

This is a workaround of upstream code, kept visible: if torch renames or changes the function
it wraps, `install()` leaves torch as it is and compiles run at torch's own speed.
"""

from __future__ import annotations

import inspect
import threading
from collections import OrderedDict

import torch.fx.graph_module as _graph_module

_EXPECTED_PARAMETERS = ("src", "globals", "co_fields")
TORCH_EXEC_WITH_SOURCE = getattr(_graph_module, "_exec_with_source", None)  # torch's own
_KEEP = 16  # distinct sources kept, least recently used dropped first
_codes: "OrderedDict[str, object]" = OrderedDict()
_counts = {"compiled": 0, "reused": 0}
_lock = threading.Lock()  # compiles in threads (a sweep's) share the one cache


def _exec_with_source(src, globals, co_fields=None):  # noqa: A002 - torch's own names
    key = _graph_module._loader.cache(src, globals, co_fields)
    with _lock:
        code = _codes.get(src)
        if code is not None:
            _codes.move_to_end(src)
            _counts["reused"] += 1
    if code is None:
        code = compile(src, key, "exec", dont_inherit=True)
        with _lock:
            _codes[src] = code
            _counts["compiled"] += 1
            while len(_codes) > _KEEP:
                _codes.popitem(last=False)
    exec(code, globals)  # noqa: S102 - torch.fx's own generated source, as torch does


def install() -> bool:
    """Wrap torch.fx's source execution once; False (torch untouched) if its shape changed."""
    current = getattr(_graph_module, "_exec_with_source", None)
    if current is _exec_with_source:
        return True
    if current is None or not hasattr(_graph_module, "_loader"):
        return False
    if tuple(inspect.signature(current).parameters) != _EXPECTED_PARAMETERS:
        return False
    _graph_module._exec_with_source = _exec_with_source
    return True


def counts() -> dict[str, int]:
    """Sources compiled and code objects reused in this process."""
    return dict(_counts)
