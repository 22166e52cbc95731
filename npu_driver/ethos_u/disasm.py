"""A readable listing of a custom-operator payload: driver actions, then one line per command
(word offset, opcode name, parameter, payload), with the register fields the model decodes."""

from __future__ import annotations

from npu_driver.ethos_u.stream import parse_custom_operator_payload


def disassemble(command_stream: bytes) -> str:
    cop = parse_custom_operator_payload(command_stream)
    lines = []
    for config in cop.optimizer_configs:
        major, minor, patch = config.arch_version
        lines.append(f"{config.offset:6}  OPTIMIZER_CONFIG  product {config.product}, "
                     f"{1 << config.macs_per_cc_log2} MACs/cycle, {config.shram_kib} KiB SHRAM, "
                     f"command stream v{config.cmd_stream_version}, arch {major}.{minor}.{patch}")
    for stream in cop.command_streams:
        for command in stream:
            if command.payload is None:
                value = f"{command.param} ({command.param:#06x})"
                if command.param & 0x8000:
                    value += f" = {command.signed_param}"
            else:
                value = f"{command.payload} ({command.payload:#010x})"
                if command.param:
                    value += f" param {command.param:#06x}"
            lines.append(f"{command.offset:6}  {command.name:<28} {value}")
    return "\n".join(lines)
