"""The runner firmware's cross build, from plain data: a core, the board's sources, the memory
regions, the recipe's regions and sizes; never a platform object (platforms/firmware_recipe.py
reads a platform's `runner/firmware.yaml` and YAML into a `RunnerSpec`).

The firmware is the board support in the spec's sources folder (startup, semihosting console,
counters, a main that runs BundleIO's self-check) linked with ExecuTorch's runtime, the portable
and Cortex-M kernels the program's operators need (kernels/native/operators.py), and CMSIS-NN,
all compiled with the core's flags (kernels/native/cores.yaml) from the unmodified third-party
sources (kernels/native/sources.py). The linker script is generated from the regions: code in
the first code region it fits, the harness's mailbox first in the data region, and what each
region leaves free for the runner's allocators and the program image.

One firmware serves every program with the same operators: the harness (platforms/qemu.py)
writes each program's mailbox and image into memory. Builds are cached under the cache root
(kernels/cache_root.py): objects by compiler, flags and source content, firmware by its objects
and linker script, so only a new operator costs a compile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from kernels.cache_root import cache_root
from kernels.native.cache import atomic_write, digest, publish_folder, tree_digest
from kernels.native.cores import Core
from kernels.native.errors import FirmwareBuildError, ThirdPartySourcesNotFound
from kernels.native.linker import (Region, code_sections, data_sections, elf_sizes, elf_symbols,
                                   memory_block, symbol)
from kernels.native.operators import (ETHOS_U_BACKEND_SOURCES, RECIPE_VERSION, KernelLibrary,
                                      OperatorSelection, cmsis_nn_sources, kernel_libraries,
                                      kernel_registration, runtime_sources, schema_headers,
                                      select_operators)
from kernels.native.sources import (ThirdParty, find_third_party, source_tree_digest,
                                    sources_hint)
from kernels.native.toolchains import Toolchain, build_jobs, find_toolchain, nice

# The cache folder of runner builds (objects, generated sources, firmware), under the cache root.
CACHE_FOLDER = "corstone-runner"
# The NPU build's own sources beside the runner (the driver's device layer over semihosting).
NPU_DIR = "npu"


@dataclass(frozen=True)
class RunnerSpec:
    """Everything a runner build reads besides the sources and the operators: plain data."""

    platform: str  # the platform's name, recorded in build.json
    described_by: str  # the files the spec was read from, named in the generated sources
    core: Core
    optimization: str
    cmsis_nn_optimization: str
    cpu_hz: int  # RUNNER_CPU_HZ, for the runner's tick conversion
    sources_dir: Path  # the board support (*.c, *.cpp, board.h; NPU_DIR for the NPU build)
    regions: tuple[Region, ...]  # the RAM the firmware may link into and allocate from
    code_regions: tuple[str, ...]  # code goes to the first it fits in
    boot_region: str  # where the reset vector table must lie
    data_region: str  # the mailbox, .data, .bss, the stack
    heap_region: str
    stack_bytes: int
    heap_bytes: int
    mailbox_bytes: int  # the harness's mailbox, first in the data region
    recipe_text: str  # the recipe file, hashed into the firmware key
    npu_define: str | None = None  # the Ethos-U core driver's define ("ETHOSU55"): the NPU build
    npu_base_address: int = 0  # the NPU's register block (the bridge touches none)


@dataclass(frozen=True)
class Firmware:
    """A built runner: its ELF, where things are, and what the build cost."""

    elf: Path
    key: str
    operators: tuple[str, ...]
    mailbox_address: int
    free_start: Mapping[str, int]  # region name -> first address the firmware image leaves free
    code_region: str
    text_bytes: int
    data_bytes: int
    bss_bytes: int
    build_seconds: float  # spent by this call: the full build, or the cache lookup
    cached: bool  # the ELF came from the cache
    compiled_objects: int  # objects compiled by this call (0 when every object was cached)
    total_objects: int


@dataclass(frozen=True)
class CompileUnit:
    """One compile: a source, its language and flags, and the generated files its key covers."""

    source: Path
    flags: tuple[str, ...]
    extra_inputs: tuple[Path, ...] = ()
    npu: bool = False  # the NPU build's: its key also covers the backend and driver sources

    @property
    def is_cxx(self) -> bool:
        return self.source.suffix in (".cpp", ".cc")


class RunnerBuilder:
    def __init__(self, spec: RunnerSpec, third_party: ThirdParty, toolchain: Toolchain,
                 cache: Path, jobs: int, trace: bool):
        self.spec = spec
        self.trace = trace
        self.tp = third_party
        self.toolchain = toolchain
        self.cache = cache / CACHE_FOLDER
        self.jobs = jobs
        self.compiled = 0
        et = third_party.executorch
        self.tree = source_tree_digest(third_party)
        self.runner_digest = tree_digest(
            sorted(p for folder in (spec.sources_dir, spec.sources_dir / NPU_DIR)
                   if folder.is_dir() for p in folder.iterdir()
                   if p.suffix in (".c", ".cpp", ".h")),
            spec.sources_dir,
        )
        self.npu_tree = tree_digest(
            [et / "backends/arm/runtime", third_party.ethos_u_driver / "include",
             third_party.ethos_u_driver / "src"], third_party.root,
        ) if spec.npu_define else ""

    # -- generated sources ------------------------------------------------------------------

    def schema_headers(self) -> Path:
        return schema_headers(self.tp, self.cache)

    def registration(self, library: KernelLibrary, operators: Sequence[str]) -> Path:
        return kernel_registration(self.tp, self.cache, self.tree, library, operators)

    def regions_source(self) -> str:
        regions = self.spec.regions
        lines = ['/* Generated by kernels/native/runner.py from the platform YAML: do not edit. */',
                 '#include "board.h"', ""]
        for region in regions:
            name = symbol(region.name)
            lines.append(f"extern uint8_t __free_{name}_start[];")
            lines.append(f"extern uint8_t __free_{name}_end[];")
        lines += ["", "const runner_region_t runner_regions[] = {"]
        for region in regions:
            name = symbol(region.name)
            lines.append(f'    {{"{region.name}", __free_{name}_start, __free_{name}_end}},')
        lines += ["};", f"const unsigned runner_region_count = {len(regions)}u;", ""]
        return "\n".join(lines)

    def linker_script(self, code_region: str, irq_vectors: bool = False) -> str:
        """The linker script with code in `code_region`; `irq_vectors` keeps a `.vectors.irq`
        table (external interrupts) right behind the system vectors, as a firmware project's."""
        config = self.spec  # the recipe
        regions = config.regions
        code, data, heap = symbol(code_region), symbol(config.data_region), symbol(config.heap_region)
        boot = symbol(config.boot_region)
        # The core resets from the vector table in the boot region: with the code elsewhere
        # (too large for it), the table gets a section and a segment of its own there.
        vectors_apart = boot != code
        boot_phdr = "  boot PT_LOAD;\n" if vectors_apart else ""
        keep = " KEEP(*(.vectors.irq))" if irq_vectors else ""
        boot_section = (f"  .vectors : {{ KEEP(*(.vectors)){keep} }} > {boot} :boot\n"
                        if vectors_apart else "")
        vectors_in_text = "" if vectors_apart else f"    KEEP(*(.vectors)){keep}\n"
        memory = memory_block(regions)
        free = "\n".join(
            f"  .free_{n} (NOLOAD) : ALIGN(16) {{ __free_{n}_start = .; }} > {n} :none\n"
            f"  __free_{n}_end = ORIGIN({n}) + LENGTH({n});"
            for n in (symbol(r.name) for r in regions)
        )
        return f"""/* Generated by kernels/native/runner.py from {config.described_by}: do not edit. */
MEMORY
{{
{memory}
}}

ENTRY(Reset_Handler)

/* Loaded: code and the initial values of .data. The sections that must not be loaded (the
 * mailbox the harness writes, .bss, stack, heap) sit in no loadable segment: QEMU's ELF loader
 * would otherwise zero-fill them as ROM blobs over the harness's mailbox. */
PHDRS
{{
{boot_phdr}  text PT_LOAD;
  data PT_LOAD;
  none PT_NULL;
}}

SECTIONS
{{
{boot_section}{code_sections(code, vectors_in_text)}
  /* First in its region, so the harness finds it at a fixed address; not loaded, not zeroed:
   * the harness writes it before reset. */
  .mailbox (NOLOAD) : ALIGN(16)
  {{
    __runner_mailbox = .;
    . += {config.mailbox_bytes};
    . = ALIGN(16);
  }} > {data} :none
{data_sections(code, data, config.stack_bytes)}  .heap (NOLOAD) : ALIGN(8)
  {{
    __heap_start = .;
    . += {config.heap_bytes:#x};
    __heap_end = .;
  }} > {heap} :none

  /* What each region leaves free, for the runner's allocators and the program image. */
{free}
}}
"""

    # -- compiling -------------------------------------------------------------------------

    def units(self, selection: OperatorSelection, schema: Path, codegen: Mapping[str, Path],
              regions_c: Path) -> list[CompileUnit]:
        et, tp = self.tp.executorch, self.tp
        includes = (f"-I{tp.root}", f"-I{et / 'runtime/core/portable_type/c10'}", f"-I{schema}",
                    f"-I{tp.flatbuffers / 'include'}", f"-I{tp.cmsis_nn / 'Include'}",
                    f"-I{self.spec.sources_dir}")
        common = (*self.spec.core.flags, "-ffunction-sections", "-fdata-sections",
                  # Paths in __FILE__ (ET_LOG) independent of where the sources and cache lie.
                  f"-ffile-prefix-map={tp.root}=third_party",
                  f"-ffile-prefix-map={self.spec.sources_dir}=runner",
                  f"-ffile-prefix-map={self.cache}=cache",
                  "-DARM_NN_ENABLE_F32=0", "-DARM_NN_ENABLE_F16=0")
        cxx = (*common, self.spec.optimization, "-std=gnu++17", "-fno-exceptions", "-fno-rtti",
               "-fno-unwind-tables", "-fno-asynchronous-unwind-tables", "-fno-threadsafe-statics",
               "-Wno-deprecated-declarations", "-DC10_USING_CUSTOM_GENERATED_MACROS",
               "-DET_LOG_ENABLED=1", "-DET_MIN_LOG_LEVEL=Info", "-DFLATBUFFERS_MAX_ALIGNMENT=1024",
               # The registry's table: selected kernels plus the prim ops, with room to spare.
               "-DMAX_KERNEL_NUM=256",
               # The trace build: per-instruction ticks and output CRCs (runner.cpp).
               *(("-DET_EVENT_TRACER_ENABLED",) if self.trace else ()), *includes)
        c = (*common, self.spec.optimization, "-std=gnu11", *includes)
        cmsis = (*common, self.spec.cmsis_nn_optimization, "-std=gnu11",
                 f"-I{tp.cmsis_nn / 'Include'}")

        units = [CompileUnit(p, cxx) for p in runtime_sources(tp, bundled_program=True)]
        for library, sources in selection.sources.items():
            units += [CompileUnit(p, cxx) for p in sources]
        for library, folder in codegen.items():
            generated = folder / "RegisterCodegenUnboxedKernelsEverything.cpp"
            units.append(CompileUnit(generated, cxx, tuple(sorted(folder.glob("*.h")))))
        cmsis_sources = cmsis_nn_sources(tp)
        units += [CompileUnit(p, cmsis) for p in cmsis_sources]
        runner = self.spec.sources_dir
        units += [CompileUnit(p, c) for p in sorted(runner.glob("*.c"))]
        runner_cxx = (*cxx, f"-DRUNNER_CPU_HZ={self.spec.cpu_hz}")
        units += [CompileUnit(p, runner_cxx) for p in sorted(runner.glob("*.cpp"))]
        units.append(CompileUnit(regions_c, c))
        if self.spec.npu_define:
            units += self.npu_units(cxx, c)
        return units

    def npu_units(self, cxx: tuple[str, ...], c: tuple[str, ...]) -> list[CompileUnit]:
        """ExecuTorch's EthosUBackend and the Ethos-U core driver, from the sources, with the
        runner's device layer (runner/npu/ethosu_bridge.c) in place of the driver's register
        level (ethosu_device_u55_u65.c), which QEMU has no NPU behind."""
        driver = self.tp.ethos_u_driver
        if not (driver / "src" / "ethosu_driver.c").is_file():
            raise ThirdPartySourcesNotFound(
                f"no Ethos-U core driver in {driver}; {sources_hint()}")
        backend = self.tp.executorch / "backends/arm/runtime"
        npu_dir = self.spec.sources_dir / NPU_DIR
        product = self.spec.npu_define
        driver_includes = (f"-I{driver / 'include'}", f"-I{driver / 'src'}", f"-I{npu_dir}",
                           f"-D{product}", "-DETHOSU_LOG_SEVERITY=0",
                           f"-DRUNNER_NPU_BASE_ADDRESS={self.spec.npu_base_address:#x}u",
                           f"-ffile-prefix-map={npu_dir}=runner/npu")
        units = [CompileUnit(backend / name, (*cxx, f"-I{driver / 'include'}"), npu=True)
                 for name in ETHOS_U_BACKEND_SOURCES]
        units.append(CompileUnit(driver / "src" / "ethosu_driver.c", (*c, *driver_includes), npu=True))
        units += [CompileUnit(p, (*c, *driver_includes), npu=True) for p in sorted(npu_dir.glob("*.c"))]
        return units

    def object_key(self, unit: CompileUnit, schema: Path) -> str:
        """Compiler, flags, the source and what it may include: the third-party tree, the schema
        headers (named by their own key) and, for the runner's files, the runner's headers."""
        flags = [flag.replace(str(self.cache), "<cache>") for flag in unit.flags]
        ours = unit.source.parent in (self.spec.sources_dir, self.spec.sources_dir / NPU_DIR,
                                      self.cache / "generated")
        if unit.source.is_relative_to(self.tp.root):
            name = str(unit.source.relative_to(self.tp.root))
        elif unit.source.is_relative_to(self.cache):
            name = str(unit.source.relative_to(self.cache))
        else:
            name = unit.source.name
        return digest(RECIPE_VERSION, self.toolchain.version, "c++" if unit.is_cxx else "c",
                    json.dumps(flags), name, unit.source.read_bytes(), self.tree,
                    self.runner_digest if ours else "", schema.parent.name,
                    *(p.read_bytes() for p in unit.extra_inputs),
                    *((self.npu_tree,) if unit.npu else ()))

    def compile_all(self, units: Sequence[CompileUnit], schema: Path) -> list[Path]:
        objects, pending = [], []
        for unit in units:
            key = self.object_key(unit, schema)
            obj = self.cache / "objects" / key[:2] / f"{key}.o"
            objects.append(obj)
            if not obj.is_file():
                pending.append((unit, obj))
        if pending:
            with ThreadPoolExecutor(max_workers=self.jobs) as pool:
                failures = [f for f in pool.map(lambda job: self._compile(*job), pending) if f]
            if failures:
                raise FirmwareBuildError("compiling the runner failed:\n" + "\n".join(failures)[-6000:])
            self.compiled += len(pending)
        return objects

    def _compile(self, unit: CompileUnit, obj: Path) -> str | None:
        obj.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=obj.parent, suffix=".o.tmp")
        os.close(handle)
        compiler = self.toolchain.gxx if unit.is_cxx else self.toolchain.gcc
        argv = [*nice(), str(compiler), *unit.flags, "-c", str(unit.source), "-o", temporary]
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            # GCC removes its output when it fails.
            Path(temporary).unlink(missing_ok=True)
            return f"{unit.source}:\n{result.stderr}"
        os.replace(temporary, obj)
        return None

    def link(self, objects: Sequence[Path], out: Path,
             release_flags: Sequence[str] | None = None) -> str:
        """Link into `out`, code in the first of the recipe's code regions it fits; the region.
        `release_flags` (a release build's: link-time optimization, newlib-nano) replace the
        runner's printf wrap, and the script keeps the external interrupt vectors."""
        problems = []
        for code_region in self.spec.code_regions:
            script = out.parent / "runner.ld"
            script.write_text(self.linker_script(code_region, release_flags is not None))
            # ExecuTorch logs with %zu, which Debian's newlib lacks (runner/printf_c99.c).
            flags = ["-Wl,--wrap=vsnprintf"] if release_flags is None else list(release_flags)
            argv = [*nice(), str(self.toolchain.gxx), *self.spec.core.flags, "-nostartfiles",
                    f"-T{script}", "-Wl,--gc-sections", f"-Wl,-Map={out.with_suffix('.map')}",
                    *flags, "-o", str(out), *map(str, objects),
                    "-Wl,--start-group", "-lstdc++", "-lm", "-lc", "-lgcc", "-Wl,--end-group"]
            result = subprocess.run(argv, capture_output=True, text=True)
            if result.returncode == 0:
                return code_region
            if "overflowed by" not in result.stderr and "will not fit in region" not in result.stderr:
                raise FirmwareBuildError(f"linking the runner failed:\n{result.stderr[-6000:]}")
            problems.append(f"{code_region}: {result.stderr.strip().splitlines()[-1]}")
        raise FirmwareBuildError("the runner fits in none of its code regions: " + "; ".join(problems))

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _ensure(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        return path



def build_runner(
    operators: Iterable[str],
    spec: RunnerSpec,
    *,
    third_party: str | Path | None = None,
    cache_dir: str | Path | None = None,
    jobs: int | None = None,
    trace: bool = False,
) -> Firmware:
    """Build (or take from the cache) the runner firmware of `spec` that registers `operators`;
    with `trace`, a variant that reports every instruction's ticks and output CRCs; with the
    spec's `npu_define`, one that links ExecuTorch's EthosUBackend and the Ethos-U core driver
    and hands each command stream to the host (the board's npu/ folder).

    Raises QemuUnavailable subclasses when the build cannot happen here (no toolchain, no
    sources, an operator without a kernel) and FirmwareBuildError when it fails."""
    started = time.monotonic()
    toolchain = find_toolchain()
    sources = find_third_party(third_party)
    operators = tuple(sorted(set(operators)))
    selection = select_operators(operators, sources)
    cache = Path(cache_dir).expanduser() if cache_dir else cache_root()
    builder = RunnerBuilder(spec, sources, toolchain, cache, jobs or build_jobs(), trace)

    schema = builder.schema_headers()
    libraries = kernel_libraries(sources)
    codegen = {
        name: builder.registration(libraries[name], ops)
        for name, ops in selection.by_library.items() if ops
    }
    generated = builder.cache / "generated"
    regions_text = builder.regions_source()
    regions_c = generated / f"regions-{digest(regions_text)[:16]}.c"
    if not regions_c.is_file():
        atomic_write(regions_c, regions_text)
    units = builder.units(selection, schema, codegen, regions_c)
    keys = [builder.object_key(unit, schema) for unit in units]
    firmware_key = digest(RECIPE_VERSION, toolchain.version, json.dumps(sorted(keys)),
                          spec.recipe_text, builder.linker_script("<code>"), json.dumps(operators))
    folder = builder.cache / "firmware" / firmware_key
    record_path = folder / "build.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        return firmware_record(folder, record, firmware_key, operators,
                               time.monotonic() - started, True, 0, len(units))

    objects = builder.compile_all(units, schema)
    staging = Path(tempfile.mkdtemp(dir=builder._ensure(builder.cache / "firmware"), prefix=".tmp-"))
    elf = staging / "runner.elf"
    try:
        code_region = builder.link(objects, elf)
    except FirmwareBuildError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return publish_build(builder, toolchain, spec, operators, staging, folder, firmware_key,
                         code_region, len(objects), started, len(units))


def publish_build(builder: RunnerBuilder, toolchain: Toolchain, spec: RunnerSpec,
                  operators: tuple[str, ...], staging: Path, folder: Path, key: str,
                  code_region: str, objects: int, started: float, total: int,
                  extra: Mapping[str, object] | None = None) -> Firmware:
    """Record a linked `staging/runner.elf` (where its mailbox and free memory start, its
    sizes, what the build cost; `extra` fields first) in build.json and publish the folder
    as `folder` (another process may have built the same firmware meanwhile): the Firmware."""
    elf = staging / "runner.elf"
    symbols = elf_symbols(toolchain, elf)
    text_bytes, data_bytes, bss_bytes = elf_sizes(toolchain, elf)
    record = {
        **(extra or {}),
        "operators": list(operators),
        "platform": spec.platform,
        "code_region": code_region,
        "mailbox_address": symbols["__runner_mailbox"],
        "free_start": {r.name: symbols[f"__free_{symbol(r.name)}_start"] for r in spec.regions},
        "text_bytes": text_bytes,
        "data_bytes": data_bytes,
        "bss_bytes": bss_bytes,
        "toolchain": toolchain.version,
        "objects": objects,
        "compiled_objects": builder.compiled,
        "build_seconds": round(time.monotonic() - started, 3),
    }
    (staging / "build.json").write_text(json.dumps(record, indent=1))
    if folder.exists():  # another process built the same firmware meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    else:
        publish_folder(staging, folder)
    record = json.loads((folder / "build.json").read_text())
    return firmware_record(folder, record, key, operators, time.monotonic() - started, False,
                           builder.compiled, total)


def firmware_record(folder: Path, record: dict, key: str, operators: tuple[str, ...],
                    seconds: float, cached: bool, compiled: int, total: int) -> Firmware:
    return Firmware(
        elf=folder / "runner.elf",
        key=key,
        operators=operators,
        mailbox_address=int(record["mailbox_address"]),
        free_start=MappingProxyType({k: int(v) for k, v in record["free_start"].items()}),
        code_region=record["code_region"],
        text_bytes=int(record["text_bytes"]),
        data_bytes=int(record["data_bytes"]),
        bss_bytes=int(record["bss_bytes"]),
        build_seconds=seconds,
        cached=cached,
        compiled_objects=compiled,
        total_objects=total,
    )
