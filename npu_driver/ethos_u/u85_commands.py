"""The Ethos-U85 command set, as data from Arm's interface definitions.

Vela 5.1's Python package names only the Ethos-U55/U65 commands (`ethos_u55_regs.py`); the U85
stream comes from its C++ back end (regor), whose register definitions ship compiled. The same
definitions are public in `ethos-u-core-driver/src/ethosu85_interface.h`: the `cmd0_opcode` and
`cmd1_opcode` enums, one `struct npu_set_*_t` / `npu_op_*_t` of bit fields per command (opcode
in bits 0-9, `reserved0` 10-13, control 14-15, then the parameter's fields and, for a cmd1, the
payload word's from bit 32), and the enums those fields take (the constructors' parameter types).

`u85_commands.json` holds that, read from the header at development time by `table_from_header`
(python -m npu_driver.ethos_u.u85_commands HEADER regenerates it); tests/test_u85_stream.py
checks the file against the header when it is present. At run time only the JSON is read:

- `cmd0`, `cmd1`: IntEnums of the opcodes, for `stream.decode_commands` (`U85_OPCODES`);
- `fields(command)`: a decoded command's named fields (bit 16 and up; reserved fields left out);
- `describe(command)`: the same as text, enum-typed fields by their enum member's name.
"""

from __future__ import annotations

import json
import re
import sys
from enum import IntEnum
from functools import lru_cache
from pathlib import Path

_DATA = Path(__file__).with_name("u85_commands.json")
_ENUM = re.compile(r"enum class (\w+) : uint\d+_t\s*\{(.*?)\};", re.S)
_MEMBER = re.compile(r"(\w+) = (\d+)")
_STRUCT = re.compile(r"struct npu_(?:set|op)_\w+_t\s*\{(.*?)\n\};", re.S)
_FIELD = re.compile(r"uint32_t\s+(\w+)\s*:\s*(\d+);")
_OPCODE = re.compile(r"NPU_NAMESPACE::(cmd[01])_opcode::(\w+)")
_TYPED = re.compile(r"NPU_NAMESPACE::(\w+)\s+_(\w+)")


def table_from_header(text: str) -> dict:
    """The command table of `ethosu85_interface.h`'s text: {"cmd0": {name: opcode}, "cmd1":
    {...}, "fields": {name: [[field, lowest bit, width, enum or None], ...]}, "enums": {enum:
    {member: value}} (only the enums a command field takes)}."""
    enums = {name: {m: int(v) for m, v in _MEMBER.findall(body)}
             for name, body in _ENUM.findall(text)}
    fields: dict[str, list] = {}
    for match in _STRUCT.finditer(text):
        body = match.group(1)
        private, _, public = body.partition("public:")
        opcode = _OPCODE.search(public)
        if opcode is None:
            continue
        types = {field: enum for enum, field in _TYPED.findall(public)}
        bit, named = 0, []
        for field, width in _FIELD.findall(private):
            if bit >= 16 and not field.startswith("reserved"):
                named.append([field, bit, int(width), types.get(field)])
            bit += int(width)
        fields[opcode.group(2)] = named
    used = sorted({f[3] for entries in fields.values() for f in entries if f[3]})
    return {"source": "ethos-u-core-driver/src/ethosu85_interface.h",
            "cmd0": enums["cmd0_opcode"], "cmd1": enums["cmd1_opcode"],
            "fields": dict(sorted(fields.items())),
            "enums": {name: enums[name] for name in used}}


@lru_cache(maxsize=1)
def table() -> dict:
    return json.loads(_DATA.read_text())


def enum_names(enum: str) -> dict[int, str]:
    """One enum of the table as value -> member name (e.g. "pooling_mode": {0: "MAX", ...})."""
    return {value: name for name, value in table()["enums"][enum].items()}


cmd0 = IntEnum("cmd0", table()["cmd0"])
cmd1 = IntEnum("cmd1", table()["cmd1"])
U85_OPCODES = ({e.value: e for e in cmd0}, {e.value: e for e in cmd1})


def fields(command) -> dict[str, int]:
    """The named fields of a decoded command (`stream.Command` with a U85 opcode)."""
    word = (command.param << 16) | ((command.payload or 0) << 32)
    return {name: (word >> bit) & ((1 << width) - 1)
            for name, bit, width, _ in table()["fields"].get(command.name, ())}


def describe(command) -> str:
    """`fields(command)` as "name=value" pairs, an enum-typed value by its member's name."""
    enums = table()["enums"]
    parts = []
    for name, bit, width, enum in table()["fields"].get(command.name, ()):
        value = fields(command)[name]
        if enum:
            members = {v: m for m, v in enums[enum].items()}
            parts.append(f"{name}={members.get(value, f'{value} (reserved)')}")
        else:
            parts.append(f"{name}={value}")
    return " ".join(parts)


if __name__ == "__main__":
    _DATA.write_text(json.dumps(table_from_header(Path(sys.argv[1]).read_text()), indent=1)
                     + "\n")
