"""Element types as the runtime numbers them and the bytes each element takes: one table for
the plan's sizes, the cost model's layout copies and the host runtime's per-op values."""

from __future__ import annotations

# ExecuTorch's ScalarType numbering (runtime/core/portable_type/scalar_type.h), as the schema
# and ETDump write it.
SCALAR_TYPE_NAMES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16",
                     6: "float32", 7: "float64", 11: "bool", 15: "bfloat16"}
ELEMENT_BYTES = {"uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "float16": 2,
                 "float32": 4, "float64": 8, "bool": 1, "bfloat16": 2}


def element_bytes(dtype: int | str, default: int) -> int:
    """Bytes per element of a ScalarType number or a dtype name; `default` for others."""
    name = SCALAR_TYPE_NAMES.get(dtype) if isinstance(dtype, int) else dtype
    return ELEMENT_BYTES.get(name, default)
