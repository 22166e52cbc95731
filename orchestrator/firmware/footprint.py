"""`orchestrate size --firmware DIR`: the flash and RAM a built firmware project takes, per
component, read from the linker's map (every input section with its size and the object or
archive member it came from), and the stack's high-water mark measured by running it on QEMU.

Components are named by where an object came from: the project's CMake targets (runtime core,
prim ops, each kernel library, CMSIS-NN, the model, the board), the toolchain's libraries (libc,
libgcc, libstdc++), and the program image (`.model_pte`). Flash is what is loaded and read-only
(code, read-only data, the initial values of .data, the .pte); RAM is .data, .bss, the stack
and the buffers placed by the plan (arenas, the weights copy, the method and temp pools).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import UserError
from kernels.native.errors import QemuUnavailable
from kernels.native.toolchains import find_toolchain
from orchestrator.firmware.spec import BUILD_DIR, MAP_NAME

# Output sections by what they take.
_FLASH_CODE = (".vectors", ".text", ".ARM.extab", ".ARM.exidx", ".preinit_array", ".init_array",
               ".fini_array")
_RAM_ZEROED = (".bss",)
_RAM_DATA = (".data",)
_IMAGE = ".model_pte"

# An object's component, by the CMake target or library it came from (first match wins).
_COMPONENTS = (
    ("program (.pte)", re.compile(r"model_pte\.S\.obj")),
    ("model API", re.compile(r"model\.dir/model/")),
    ("kernel registration", re.compile(r"model\.dir/generated/")),
    ("runtime core", re.compile(r"libexecutorch_core\.a|executorch_core\.dir")),
    ("prim ops", re.compile(r"libprim_ops\.a")),
    ("portable kernels", re.compile(r"libportable_(kernels|util)\.a")),
    ("cortex_m kernels", re.compile(r"libcortex_m_kernels\.a")),
    ("CMSIS-NN", re.compile(r"libcmsis_nn\.a")),
    ("Ethos-U backend + driver", re.compile(r"ethos_u\.dir/")),
    ("board + main", re.compile(r"firmware\.elf\.dir/")),
    ("libc (newlib)", re.compile(r"lib(c|c_nano|m|nosys|g|g_nano)\.a")),
    ("libgcc", re.compile(r"libgcc\.a")),
    ("libstdc++", re.compile(r"libstdc\+\+(_nano)?\.a|libsupc\+\+")),
)

# Objects the link-time optimizer wrote (release builds use -flto): their input sections are
# attributed by the symbol each is named after (-ffunction-sections at link time), looked up in
# the project's own objects and libraries.
_LTRANS = re.compile(r"ltrans\d*\.ltrans\.o|\.ltrans\d+\.o")
# What the optimizer appends to a function it clones or localizes.
_CLONE_SUFFIX = re.compile(r"\.(constprop|isra|part|lto_priv|cold|localalias)\b.*$")
LTO_UNATTRIBUTED = "other (link-time optimized)"
# A link-time-optimization object's section per symbol it defines.
_LTO_SECTION = re.compile(r"\s\.gnu\.lto_(?!\.)(\S+?)\.\d+\.[0-9a-f]+\s")
# Functions the optimizer made local (lambdas, anonymous namespaces) are named after what
# encloses them: the namespace in their mangled name says whose they are.
_NAME_HINTS = (("kernel registration", "kernels_to_register"),
               ("portable kernels", "torch8executor6native"),
               ("portable kernels", "torch8executor"),
               ("cortex_m kernels", "cortex_m6native"),
               ("runtime core", "executorch7runtime"),
               ("runtime core", "21executorch_flatbuffer"),
               ("model API", "ImageLoader"),
               ("Ethos-U backend + driver", "EthosUBackend"),
               ("Ethos-U backend + driver", "ethosu_"),
               ("Ethos-U backend + driver", "ethos_u"),
               ("Ethos-U backend + driver", "arm_ethos"))

_SECTION = re.compile(r"^(\.\S+)\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)")
_INPUT = re.compile(r"^ (?:\*fill\*|(\S+))?\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s*(\S.*)?$")
_INPUT_NAME_ONLY = re.compile(r"^ (\.\S+)$")


@dataclass(frozen=True)
class Footprint:
    map_path: Path
    # component -> kind ("code", "data init", "bss", ".pte") -> bytes
    components: dict[str, dict[str, int]]
    regions: dict[str, int] = field(default_factory=dict)  # buffers placed by the plan
    stack_bytes: int = 0
    stack_used_bytes: int | None = None  # measured on QEMU (stack painting)

    def code_bytes(self, exclude: tuple[str, ...] = ("program (.pte)",
                                                     "example input (example_io.c)")) -> int:
        return sum(kinds.get("code", 0) + kinds.get("data init", 0)
                   for name, kinds in self.components.items() if name not in exclude)

    @property
    def pte_bytes(self) -> int:
        return sum(kinds.get(".pte", 0) for kinds in self.components.values())

    @property
    def flash_bytes(self) -> int:
        """Everything loaded: code, read-only data, .data's initial values, the .pte."""
        return self.code_bytes(exclude=("program (.pte)",)) + self.pte_bytes

    @property
    def ram_bytes(self) -> int:
        return (sum(kinds.get("data init", 0) + kinds.get("bss", 0)
                    for kinds in self.components.values())
                + sum(self.regions.values()) + self.stack_bytes)


def component_of(origin: str) -> str:
    for name, pattern in _COMPONENTS:
        if pattern.search(origin):
            return name
    return "other"


def symbol_owners(build_dir: Path) -> dict[str, str]:
    """The component defining each symbol of the project's libraries and objects, read with the
    toolchain's gcc-nm (which reads link-time-optimization objects too)."""
    inputs = sorted(build_dir.glob("*.a")) + sorted(build_dir.glob("CMakeFiles/*/**/*.obj"))
    return nm_owners((path, component_of(str(path.relative_to(build_dir)))) for path in inputs)


def nm_owners(inputs) -> dict[str, str]:
    """Symbol -> component for each (object or archive, its component) of `inputs`, the first
    definition winning: the symbols gcc-nm lists (link-time-optimization objects' global ones)
    and every function and variable a link-time-optimization object holds, local ones included
    (its `.gnu.lto_NAME.N.HASH` sections, listed by objdump). Empty without the toolchain."""
    try:
        bin_dir = find_toolchain().gcc.parent
    except QemuUnavailable:
        return {}
    nm, objdump = bin_dir / "arm-none-eabi-gcc-nm", bin_dir / "arm-none-eabi-objdump"
    if not nm.is_file():
        return {}
    owners: dict[str, str] = {}
    for path, component in inputs:
        result = subprocess.run([str(nm), "--defined-only", str(path)], capture_output=True,
                                text=True)
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TtDdBbRrWwVv":
                owners.setdefault(parts[2], component)
        if objdump.is_file():
            listed = subprocess.run([str(objdump), "-h", str(path)], capture_output=True,
                                    text=True)
            for name in _LTO_SECTION.findall(listed.stdout):
                owners.setdefault(name, component)
    return owners


def _owner(section: str, owners: dict[str, str]) -> str:
    for prefix in (".text.startup.", ".text.", ".rodata.", ".data.", ".bss."):
        if section.startswith(prefix):
            symbol = section[len(prefix):]
            found = owners.get(symbol) or owners.get(_CLONE_SUFFIX.sub("", symbol))
            if found:
                return found
            return next((name for name, hint in _NAME_HINTS if hint in symbol),
                        LTO_UNATTRIBUTED)
    return LTO_UNATTRIBUTED


def read_map(map_path: Path, owners: dict[str, str] | None = None,
             origin_component=component_of, image_section: str | None = None) -> tuple[
        dict[str, dict[str, int]], dict[str, int], int]:
    """Bytes per component and kind, the NOLOAD buffers per output section, the stack.
    `origin_component` names the component of an input file the optimizer did not rewrite;
    an input section called `image_section` is the model's image (kind ".pte") wherever the
    script placed it."""
    components: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    buffers: dict[str, int] = {}
    stack = 0
    lines = map_path.read_text(errors="replace").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("Linker script and memory map"))
    except StopIteration:
        raise UserError(f"{map_path} is not a GNU ld map (no 'Linker script and memory map')") \
            from None
    output = None
    pending_name = None
    for line in lines[start:]:
        section = _SECTION.match(line)
        if section:
            output = section.group(1)
            size = int(section.group(3), 16)
            if output.startswith(".noinit_"):
                buffers[output.removeprefix(".noinit_")] = size
            elif output == ".stack":
                stack = size
            continue
        if line.startswith(".") and len(line.split()) == 1:
            output = line.strip()  # a long output name; its address and size follow
            continue
        name_only = _INPUT_NAME_ONLY.match(line)
        if name_only:
            pending_name = name_only.group(1)
            continue
        entry = _INPUT.match(line)
        if not entry or output is None or entry.group(4) is None:
            pending_name = None
            continue
        name = entry.group(1) or pending_name
        pending_name = None
        size = int(entry.group(3), 16)
        origin = entry.group(4).strip()
        if size == 0 or name is None or not name.startswith("."):
            continue
        if output == _IMAGE or (image_section is not None and name == image_section):
            kind = ".pte"
        elif output in _FLASH_CODE or output.startswith(".text"):
            kind = "code"
        elif output in _RAM_DATA:
            kind = "data init"
        elif output in _RAM_ZEROED:
            kind = "bss"
        else:
            continue
        if name.startswith(".rodata.example_input"):
            component = "example input (example_io.c)"
        elif _LTRANS.search(origin):
            component = _owner(name, owners or {})
        else:
            component = origin_component(origin)
        components[component][kind] += size
    return ({name: dict(kinds) for name, kinds in components.items()}, buffers, stack)


def footprint(folder: str | Path, stack_used_bytes: int | None = None) -> Footprint:
    folder = Path(folder)
    map_path = folder / BUILD_DIR / MAP_NAME
    if not map_path.is_file():
        raise UserError(f"{map_path} is missing: build the project first (cmake -S {folder} -B "
                        f"{folder / BUILD_DIR} && cmake --build {folder / BUILD_DIR}), or run "
                        "`orchestrate firmware` without --no-build")
    owners = symbol_owners(folder / BUILD_DIR)
    components, buffers, stack = read_map(map_path, owners)
    return Footprint(map_path, components, buffers, stack, stack_used_bytes)


def render_text(fp: Footprint, record: dict) -> str:
    order = [name for name, _ in _COMPONENTS] + ["example input (example_io.c)", LTO_UNATTRIBUTED,
                                                  "other"]
    rows = [(name, fp.components[name]) for name in order if name in fp.components]
    width = max(len(name) for name, _ in rows) if rows else 10
    lto_note = ("; link-time optimized: functions attributed by name after inlining (a kernel's "
                "inlined CMSIS-NN code counts as the kernel's)" if record.get("lto") else "")
    lines = [f"firmware {record.get('program')} ({record.get('profile')} profile, "
             f"{record.get('platform')}, {record.get('cpu')}): bytes from the linker map "
             f"{fp.map_path}{lto_note}",
             f"{'component':<{width}}  {'code+rodata':>11}  {'.data':>7}  {'.bss':>7}  {'.pte':>8}"]
    for name, kinds in rows:
        lines.append(f"{name:<{width}}  {kinds.get('code', 0):>11,}  "
                     f"{kinds.get('data init', 0):>7,}  {kinds.get('bss', 0):>7,}  "
                     f"{kinds.get('.pte', 0):>8,}")
    lines += ["", *_totals(fp)]
    memory = record.get("memory", {})
    if memory:
        arenas = ", ".join(f"mem_id {p['mem_id']} {p['bytes']:,} B in {p['region']}"
                           for p in memory.get("planned", ()))
        lines.append(f"       of which arenas {arenas or 'none'}; weights copy "
                     f"{memory.get('weights_bytes', 0):,} B in {memory.get('weights_region') or '-'}"
                     f"; method pool {memory.get('method_pool_bytes', 0):,} B; temp pool "
                     f"{memory.get('temp_pool_bytes', 0):,} B (firmware.json, from the plan)")
    if fp.stack_used_bytes is not None:
        lines.append(f"stack high-water: {fp.stack_used_bytes:,} B of {fp.stack_bytes:,} B "
                     "(measured on QEMU, stack painting)")
    return "\n".join(lines)


def _totals(fp: Footprint) -> list[str]:
    """The flash and RAM lines: what `size --firmware` ends with and `plan --firmware` shows."""
    runtime = fp.components.get("runtime core", {})
    example = fp.components.get("example input (example_io.c)", {}).get("code", 0)
    return [
        f"flash: {fp.flash_bytes:,} B = code {fp.code_bytes():,} B (runtime core "
        f"{runtime.get('code', 0) + runtime.get('data init', 0):,} B, kernels, libraries, board)"
        + (f" + the example's input {example:,} B" if example else "")
        + f" + the .pte {fp.pte_bytes:,} B (map)",
        "RAM:   " + ", ".join(
            [f"{name.replace('_', ' ')} {size:,} B" for name, size in sorted(fp.regions.items())]
            + [f".data+.bss {sum(k.get('data init', 0) + k.get('bss', 0) for k in fp.components.values()):,} B",
               f"stack {fp.stack_bytes:,} B reserved"]) + " (map)",
    ]


def plan_section(folder: str | Path, record: dict, fp: Footprint) -> list[str]:
    """The firmware figures a plan shows beside its own estimates: the build's flash and RAM
    from its linker map."""
    return ([f"firmware {folder} ({record.get('profile')} profile, {record.get('platform')}, "
             f"{record.get('cpu')}; bytes from the linker map {fp.map_path}; `orchestrate size "
             f"--firmware {folder}` has every component, --run the measured stack):"]
            + [f"  {line}" for line in _totals(fp)])


def plan_json(folder: str | Path, record: dict, fp: Footprint) -> dict:
    """The same figures for plan.json's summary (`firmware`)."""
    return {"folder": str(folder), "profile": record.get("profile"),
            "source": f"linker map {fp.map_path.name}", "code_bytes": fp.code_bytes(),
            "pte_bytes": fp.pte_bytes, "flash_bytes": fp.flash_bytes, "ram_bytes": fp.ram_bytes,
            "stack_bytes": fp.stack_bytes, "components": fp.components}


def render_json(fp: Footprint, record: dict) -> str:
    return json.dumps({
        "program": record.get("program"), "profile": record.get("profile"),
        "platform": record.get("platform"), "source": f"linker map {fp.map_path.name}",
        "lto": bool(record.get("lto")),
        "components": fp.components, "code_bytes": fp.code_bytes(), "pte_bytes": fp.pte_bytes,
        "flash_bytes": fp.flash_bytes, "ram_bytes": fp.ram_bytes, "buffers": fp.regions,
        "stack_bytes": fp.stack_bytes,
        "stack_used_bytes": fp.stack_used_bytes,
        "stack_used_source": "measured on QEMU (stack painting)" if fp.stack_used_bytes else None,
    }, indent=1)
