"""Decoding of the custom-operator payload (COP1) and of the Ethos-U command stream words.

The payload is what `ethosu_driver.c::ethosu_invoke_v3` walks: a "COP1" fourcc word, then driver
actions, each one word (`struct cop_data_s`: uint8 action, uint8 reserved, uint16 data):
OPTIMIZER_CONFIG (1) followed by the CONFIG and ID register values Vela compiled for, COMMAND_STREAM
(2) whose length in words is `reserved << 16 | data` followed by the command words, and NOP (5).

A command word (ethosu55_interface.h, `struct npu_set_*_t`; Vela `register_command_stream_generator.py
::CommandStreamEmitter`) holds the opcode in bits 0-9, the control field in bits 14-15 (0: cmd0,
one word; 1: cmd1, followed by a 32-bit payload word) and a 16-bit parameter in bits 16-31. Opcode
names come from Vela's register definitions (`ethos_u55_regs.py` cmd0/cmd1), imported, not copied.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ethosu.vela.ethos_u55_regs.ethos_u55_regs import cmd0, cmd1

from npu_driver.ethos_u.errors import CommandStreamError

COP1_FOURCC = 0x31504F43  # "COP1" little endian (ethosu_driver.c ETHOSU_FOURCC)
ACTION_OPTIMIZER_CONFIG = 1
ACTION_COMMAND_STREAM = 2
ACTION_NOP = 5
CMD1_CONTROL = 0x4000
CONTROL_MASK = 0xC000
OPCODE_MASK = 0x03FF

_CMD0 = {e.value: e for e in cmd0}
_CMD1 = {e.value: e for e in cmd1}


@dataclass(frozen=True)
class Command:
    """One decoded command: `opcode` is a Vela `cmd0`/`cmd1` enum member."""

    offset: int  # word offset of the command in the whole payload
    opcode: cmd0 | cmd1  # Vela's enum member
    param: int  # bits 16-31 of the first word
    payload: int | None  # the second word of a cmd1

    @property
    def name(self) -> str:
        return self.opcode.name

    @property
    def address(self) -> int:
        """A cmd1 payload as an address: Ethos-U65 carries address bits 32-39 in the low byte
        of the parameter (Vela `cmd1_with_address`, Linux `ethosu_gem.c::cmd_to_addr`)."""
        return ((self.param & 0xFF) << 32) | self.payload

    @property
    def signed_param(self) -> int:
        return self.param - 0x10000 if self.param & 0x8000 else self.param


@dataclass(frozen=True)
class OptimizerConfig:
    """The OPTIMIZER_CONFIG action: the CONFIG and ID register values Vela compiled for."""

    offset: int
    release: int
    patch: int
    config: int
    id: int

    @property
    def macs_per_cc_log2(self) -> int:  # config_r.macs_per_cc
        return self.config & 0xF

    @property
    def cmd_stream_version(self) -> int:
        return (self.config >> 4) & 0xF

    @property
    def shram_kib(self) -> int:
        return (self.config >> 8) & 0xFF

    @property
    def custom_dma(self) -> int:
        return (self.config >> 27) & 0x1

    @property
    def product(self) -> int:
        return (self.config >> 28) & 0xF

    @property
    def arch_version(self) -> tuple[int, int, int]:  # id_r: arch_major/minor/patch_rev
        return ((self.id >> 28) & 0xF, (self.id >> 20) & 0xFF, (self.id >> 16) & 0xF)


@dataclass(frozen=True)
class CustomOperatorPayload:
    optimizer_configs: tuple[OptimizerConfig, ...]
    command_streams: tuple[tuple[Command, ...], ...]


def _words(data: bytes) -> tuple[int, ...]:
    if len(data) % 4:
        raise CommandStreamError(f"custom operator payload is {len(data)} bytes, not a multiple "
                                 "of 4 (ethosu_invoke_v3 refuses it)")
    return struct.unpack(f"<{len(data) // 4}I", data)


def decode_commands(words, start: int, end: int,
                    opcodes: tuple[dict, dict] | None = None) -> tuple[Command, ...]:
    """Decode words[start:end] into commands; every opcode must be a known cmd0/cmd1 of
    `opcodes` ({value: enum member} for cmd0 and cmd1; None: Vela's Ethos-U55/U65 table)."""
    known_cmd0, known_cmd1 = opcodes or (_CMD0, _CMD1)
    commands = []
    index = start
    while index < end:
        word = words[index]
        code = word & 0xFFFF
        opcode = code & OPCODE_MASK
        control = code & CONTROL_MASK
        param = word >> 16
        if control == 0:
            if code & ~OPCODE_MASK:
                raise CommandStreamError(f"command word {word:#010x} at word {index} has "
                                         "non-zero bits 10-13 (must-be-zero field)")
            if opcode not in known_cmd0:
                raise CommandStreamError(f"unknown cmd0 opcode {opcode:#05x} at word {index} "
                                         f"(word {word:#010x})")
            commands.append(Command(index, known_cmd0[opcode], param, None))
            index += 1
        elif control == CMD1_CONTROL:
            if code & 0x3C00:
                raise CommandStreamError(f"command word {word:#010x} at word {index} has "
                                         "non-zero bits 10-13 (must-be-zero field)")
            if opcode not in known_cmd1:
                raise CommandStreamError(f"unknown cmd1 opcode {opcode:#05x} at word {index} "
                                         f"(word {word:#010x})")
            if index + 1 >= end:
                raise CommandStreamError(f"{known_cmd1[opcode].name} at word {index} is truncated: "
                                         "its payload word is missing")
            commands.append(Command(index, known_cmd1[opcode], param, words[index + 1]))
            index += 2
        else:
            raise CommandStreamError(f"command word {word:#010x} at word {index} has control "
                                     f"field {control >> 14} (only 0 = cmd0 and 1 = cmd1 exist)")
    return tuple(commands)


def parse_custom_operator_payload(data: bytes, opcodes: tuple[dict, dict] | None = None
                                  ) -> CustomOperatorPayload:
    """Walk the payload as ethosu_invoke_v3 does and decode each command stream with `opcodes`
    (None: the Ethos-U55/U65 table; `u85_commands.U85_OPCODES` for an Ethos-U85 stream)."""
    words = _words(bytes(data))
    if not words or words[0] != COP1_FOURCC:
        first = f"{words[0]:#010x}" if words else "nothing"
        raise CommandStreamError(f"custom operator payload starts with {first}, not the COP1 "
                                 "fourcc")
    configs, streams = [], []
    index = 1
    while index < len(words):
        word = words[index]
        action = word & 0xFF
        if action == ACTION_OPTIMIZER_CONFIG:
            if index + 2 >= len(words):
                raise CommandStreamError(f"OPTIMIZER_CONFIG at word {index} is truncated")
            configs.append(OptimizerConfig(index, (word >> 16) & 0xF, (word >> 20) & 0xF,
                                           words[index + 1], words[index + 2]))
            index += 3
        elif action == ACTION_COMMAND_STREAM:
            length = (((word >> 8) & 0xFF) << 16) | (word >> 16)
            if index + 1 + length > len(words):
                raise CommandStreamError(f"COMMAND_STREAM at word {index} claims {length} words "
                                         f"but the payload has {len(words) - index - 1} left")
            streams.append(decode_commands(words, index + 1, index + 1 + length, opcodes))
            index += 1 + length
        elif action == ACTION_NOP:
            index += 1
        else:
            raise CommandStreamError(f"unsupported driver action {action} at word {index} "
                                     f"(word {word:#010x}; ethosu_invoke_v3 refuses it)")
    return CustomOperatorPayload(tuple(configs), tuple(streams))
