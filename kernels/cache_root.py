"""The one folder every build and compile cache of orchestrate lives under.

`$ORCHESTRATE_CACHE_DIR` when set, else `$XDG_CACHE_HOME/orchestrate`, else
`~/.cache/orchestrate`. Every native build (kernels/native/: the host-runtime library, the
runner firmware, the fetched sources) and the capture/quantization cache
(orchestrator/artifacts/cache.py) each keep a subfolder of it.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "ORCHESTRATE_CACHE_DIR"


def cache_root() -> Path:
    if named := os.environ.get(CACHE_ENV):
        return Path(named).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "orchestrate"
