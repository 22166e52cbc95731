"""What every firmware's link shares: the memory regions it links into, the linker script's
code and data sections (one text for the runner and `orchestrate firmware`'s projects), and
reading a linked ELF's symbols and sizes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kernels.native.toolchains import Toolchain, run_text


@dataclass(frozen=True)
class Region:
    """A memory region a firmware links into, as the platform's YAML gives it."""

    name: str
    base_address: int
    size_bytes: int


def symbol(name: str) -> str:
    """A region's name as a linker and C symbol ("qspi-flash" -> "qspi_flash")."""
    return re.sub(r"\W", "_", name)


def memory_block(regions: Sequence[Region]) -> str:
    """The lines of a linker script's MEMORY block, one per region."""
    return "\n".join(
        f"  {symbol(r.name)} (rwx) : ORIGIN = {r.base_address:#010x}, LENGTH = {r.size_bytes:#x}"
        for r in regions)


def code_sections(code: str, vectors_in_text: str) -> str:
    """The linker script's loaded, read-only sections in region `code`: text with the vector
    table (`vectors_in_text`, empty when it lies apart), read-only data, the unwind tables and
    the constructor arrays. One text for the runner and `orchestrate firmware`'s projects."""
    return f"""  .text :
  {{
{vectors_in_text}    *(.text .text.*)
    KEEP(*(.init))
    KEEP(*(.fini))
    *(.rodata .rodata.*)
    . = ALIGN(8);
  }} > {code} :text
  .ARM.extab : {{ *(.ARM.extab* .gnu.linkonce.armextab.*) }} > {code}
  /* Bounds of the unwind index: the NPU build (EthosUBackend) pulls libgcc's unwinder in from
   * libstdc++, and it names them. */
  .ARM.exidx :
  {{
    __exidx_start = .;
    *(.ARM.exidx* .gnu.linkonce.armexidx.*)
    __exidx_end = .;
  }} > {code}
  .preinit_array : ALIGN(4)
  {{
    PROVIDE_HIDDEN(__preinit_array_start = .);
    KEEP(*(.preinit_array))
    PROVIDE_HIDDEN(__preinit_array_end = .);
  }} > {code}
  .init_array : ALIGN(4)
  {{
    PROVIDE_HIDDEN(__init_array_start = .);
    KEEP(*(SORT(.init_array.*)))
    KEEP(*(.init_array))
    PROVIDE_HIDDEN(__init_array_end = .);
  }} > {code}
  .fini_array : ALIGN(4)
  {{
    PROVIDE_HIDDEN(__fini_array_start = .);
    KEEP(*(SORT(.fini_array.*)))
    KEEP(*(.fini_array))
    PROVIDE_HIDDEN(__fini_array_end = .);
  }} > {code}
"""


def data_sections(code: str, data: str, stack_bytes: int) -> str:
    """The linker script's RAM sections in region `data`: .data (its initial values loaded in
    region `code`), .bss and the stack (MSPLIM at its bottom), neither loaded. One text for the
    runner and `orchestrate firmware`'s projects."""
    return f"""  .data : ALIGN(8)
  {{
    __data_start = .;
    *(.data .data.*)
    . = ALIGN(8);
    __data_end = .;
  }} > {data} AT > {code} :data
  __data_load = LOADADDR(.data);
  .bss (NOLOAD) : ALIGN(8)
  {{
    __bss_start = .;
    *(.bss .bss.*)
    *(COMMON)
    . = ALIGN(8);
    __bss_end = .;
  }} > {data} :none
  .stack (NOLOAD) : ALIGN(8)
  {{
    __stack_limit = .;
    . += {stack_bytes:#x};
    . = ALIGN(8);
    __stack_top = .;
  }} > {data} :none
"""



def elf_symbols(toolchain: Toolchain, elf: Path) -> dict[str, int]:
    """Every symbol's address in `elf` (nm)."""
    symbols = {}
    for line in run_text([str(toolchain.nm), str(elf)]).splitlines():
        parts = line.split()
        if len(parts) == 3:
            symbols[parts[2]] = int(parts[0], 16)
    return symbols


def elf_sizes(toolchain: Toolchain, elf: Path) -> tuple[int, int, int]:
    """Bytes of text, data and bss in `elf` (size)."""
    lines = run_text([str(toolchain.size), str(elf)]).splitlines()
    text, data, bss = (int(v) for v in lines[1].split()[:3])
    return text, data, bss
