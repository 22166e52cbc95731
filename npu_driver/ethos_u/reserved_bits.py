"""Reserved bits of every Ethos-U command, as data from Arm's interface definitions.

`ethosu55_interface.h`, `ethosu65_interface.h` and `ethosu85_interface.h` (ethos-u-core-driver)
declare each command as a `struct npu_set_*_t` / `npu_op_*_t` of bit fields: the opcode (10 bits),
`reserved0` (4), the control field (2), the parameter's fields and, for a cmd1, the payload word's.
Fields named `reserved*` must be zero. `reserved_bits.json` holds, per product and command, the
mask of those bits above the first 16 (bits 10-13 are checked by the decoder, `stream.py`), bit
32 and up being the payload word's; `masks_from_header` regenerates it and
tests/test_stream_checker.py checks the file against the headers when they are present.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

_DATA = Path(__file__).with_name("reserved_bits.json")
_STRUCT = re.compile(r"struct (npu_(?:set|op)_\w+)_t\s*\{(.*?)#ifdef __cplusplus\s*public:", re.S)
_FIELD = re.compile(r"uint32_t\s+(\w+)\s*:\s*(\d+);")
HEADERS = {"ethos-u55": "ethosu55_interface.h", "ethos-u65": "ethosu65_interface.h",
           "ethos-u85": "ethosu85_interface.h"}


def masks_from_header(text: str) -> dict[str, int]:
    """Command name (e.g. NPU_SET_KERNEL_STRIDE) -> mask of its reserved bits at bit 16 and up."""
    masks = {}
    for match in _STRUCT.finditer(text):
        bit = mask = 0
        for name, width in _FIELD.findall(match.group(2)):
            if name.startswith("reserved") and bit >= 16:
                mask |= ((1 << int(width)) - 1) << bit
            bit += int(width)
        masks[match.group(1).upper()] = mask
    return masks


@lru_cache(maxsize=4)
def reserved_masks(product: str) -> dict[str, int]:
    """The masks of `product` ("ethos-u55", "ethos-u65", "ethos-u85")."""
    return json.loads(_DATA.read_text())[product]
