"""The operators a device runtime can run: the kernel libraries the Arm executor runner links.

Read from the schema files the pinned ExecuTorch wheel ships, the same files its selective
build reads: the portable library (`kernels/portable/functions.yaml`, `custom_ops.yaml`,
`et_copy_ops.yaml`), the quantized library (`kernels/quantized/quantized.yaml`) and the
Cortex-M backend (`backends/cortex_m/ops/operators.yaml`). The host runtime's own registry is
not this list: it also carries kernels no microcontroller build has (e.g. `aten::_fft_r2c.out`,
registered on the host by an optional library, absent from the portable library).
"""

from __future__ import annotations

import functools
from pathlib import Path

import executorch  # a namespace package: no __file__
import yaml

_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

LIBRARIES = (
    "kernels/portable/functions.yaml",
    "kernels/portable/custom_ops.yaml",
    "kernels/portable/et_copy_ops.yaml",
    "kernels/quantized/quantized.yaml",
    "backends/cortex_m/ops/operators.yaml",
)


def _executorch_root() -> Path:
    return Path(list(executorch.__path__)[0]).resolve()


@functools.lru_cache(maxsize=1)
def device_operator_names() -> frozenset[str]:
    """"namespace::name.overload" of every operator with a kernel in the device libraries."""
    names = set()
    root = _executorch_root()
    for relative in LIBRARIES:
        path = root / relative
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the ExecuTorch wheel's kernel schema is missing")
        # libyaml when built in (the same data, ~10x faster on these 1,000-entry files)
        for entry in yaml.load(path.read_text(), Loader=_SAFE_LOADER) or []:
            name = entry.get("op") or str(entry.get("func", "")).split("(")[0]
            if not name:
                continue
            names.add(name if "::" in name else f"aten::{name}")
    return frozenset(names)

