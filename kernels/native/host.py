"""Build the host device runtime: ExecuTorch's Cortex-M kernels, CMSIS-NN and the Ethos-U backend
compiled for this machine as one shared library that registers into the wheel's runtime.

Upstream sources are compiled from where they lie (an ExecuTorch source tree and a CMSIS-NN
tree, e.g. ../shared/third_party); nothing is copied into the project. The library links against
the wheel's `executorch/lib/libexecutorch.so`, which holds the kernel and backend registries that
`executorch.extension.pybindings` uses, and is compiled with the wheel's headers and the
definitions its CMake package declares (`executorch-config.cmake`:
C10_USING_CUSTOM_GENERATED_MACROS, ET_EVENT_TRACER_ENABLED, C++17), so a kernel it registers is one
the Python runtime finds.

What goes in, mirroring the upstream CMake:
- `backends/cortex_m/ops/op_*.cpp` and the Kernel table ExecuTorch's codegen (`codegen/gen.py` of
  the same tree) generates from `backends/cortex_m/ops/operators.yaml`;
- the portable kernel utilities those ops call (`kernels/portable/cpu/util/*.cpp`);
- CMSIS-NN's `Source/**.c` without the float kernels (ARM_NN_ENABLE_F32/F16 off, as upstream);
  on x86-64 no `ARM_MATH_DSP`/`ARM_MATH_MVEI` is defined, so these are CMSIS-NN's pure-C paths;
- `backends/arm/runtime/{EthosUBackend,EthosUBackend_Cortex_M,EthosUBackend_IoMemcpy,VelaBinStream}.cpp`
  unchanged, over a host stand-in for the Ethos-U core driver (`csrc/host_ethosu_driver.cpp`);
- our entry points (`csrc/orchestrate_host.cpp`).

The result is cached under `<cache>/host_runtime/<key>/`, the key a SHA-256 of every input file,
the flags, the compiler versions and the wheel's runtime library, so an unchanged build is a
lookup. Everything is compiled with hidden visibility: only the `orchestrate_host_*` entry points
and the runtime symbols resolved from libexecutorch.so cross the library's boundary.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kernels.native.cache import build_cache
from kernels.native.errors import HostRuntimeUnavailable
from kernels.native.operators import ETHOS_U_BACKEND_SOURCES, S16_OPERATORS_YAML
from kernels.native.toolchains import HostToolchain, build_jobs, find_host_toolchain, torchgen_yaml_dir

LIBRARY_NAME = "liborchestrate_host_runtime.so"
# Our entry points and the host stand-in for the Ethos-U core driver, beside the runtime's
# session and worker.
CSRC = Path(__file__).resolve().parent.parent / "host_runtime" / "csrc"
# The four translation units of the Ethos-U backend's Cortex-M flavour (backends/arm/CMakeLists.txt
# builds the same set for bare metal; the Cortex-A flavour drives a Linux kernel driver instead),
# as the runner compiles them.
ETHOS_U_SOURCES = ETHOS_U_BACKEND_SOURCES
# The portable utilities whose symbols the Cortex-M ops use and libexecutorch.so lacks: the ops
# call get_broadcast_target_size (broadcast_util.cpp), which calls repeat_tensor
# (repeat_util.cpp); the rest of cortex_m_ops_common.h's utilities are header-only. The link's
# --no-undefined proves the set sufficient.
PORTABLE_UTIL_SOURCES = ("broadcast_util.cpp", "repeat_util.cpp")
# ARM_NN_ENABLE_F32/F16 off: CMSIS-NN's CMake leaves every float kernel out.
_CMSIS_FLOAT_MARKERS = ("_f32", "_f16", "_flt")
DEFINES = ("C10_USING_CUSTOM_GENERATED_MACROS", "ET_EVENT_TRACER_ENABLED")
CXX_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-fvisibility-inlines-hidden",
             "-Wno-deprecated-declarations")
C_FLAGS = ("-std=c11", "-O2", "-fPIC", "-fvisibility=hidden")
CMSIS_DEFINES = ("ARM_NN_ENABLE_F32=0", "ARM_NN_ENABLE_F16=0")
# EthosUBackend_Internal.h's EXECUTORCH_PROF_* macros call the method's EventTracer without a
# null check, so a backend compiled with ET_EVENT_TRACER_ENABLED dereferences nullptr in
# init() whenever the method runs without a tracer (measured: SIGSEGV in EthosUBackend::init on
# the first forward() of ds-cnn for U55). Compiled as a firmware without ETDump compiles it;
# the classes whose layout the switch changes (event_tracer_hooks.h's profiling scopes) are
# not used by these translation units, and BackendInitContext keeps its layout either way.
ETHOS_U_UNDEFINED = ("ET_EVENT_TRACER_ENABLED",)


@dataclass(frozen=True)
class Wheel:
    """The installed executorch wheel's C++ runtime: headers and the shared library."""

    package_dir: Path
    include_dirs: tuple[Path, ...]
    library: Path


@dataclass(frozen=True)
class BuildPlan:
    executorch_src: Path
    cmsis_nn_src: Path
    wheel: Wheel
    toolchain: HostToolchain
    cortex_m_ops: tuple[Path, ...]
    portable_util: tuple[Path, ...]
    ethos_u: tuple[Path, ...]
    cmsis_nn: tuple[Path, ...]
    glue: tuple[Path, ...]
    operators_yaml: Path
    key: str = field(default="")


@dataclass(frozen=True)
class BuiltLibrary:
    path: Path
    key: str
    cached: bool  # True when the library came from the cache
    seconds: float  # time spent building (0 when cached)


def default_cache_dir() -> Path:
    return build_cache("host_runtime").parent


def find_wheel() -> Wheel:
    """The executorch package's runtime library and headers (`executorch-config.cmake` layout)."""
    spec = importlib.util.find_spec("executorch")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        package = Path(location)
        library = package / "lib" / "libexecutorch.so"
        include = package / "include"
        c10 = include / "executorch" / "runtime" / "core" / "portable_type" / "c10"
        if library.is_file() and c10.is_dir():
            return Wheel(package, (include, c10), library)
    raise HostRuntimeUnavailable(
        "the installed executorch package ships no C++ runtime (lib/libexecutorch.so and "
        "include/executorch) to build the host kernels against")


def _require(path: Path, what: str, option: str) -> Path:
    if not path.exists():
        raise HostRuntimeUnavailable(f"{what} not found at {path} (set {option})")
    return path


def plan_build(executorch_src: Path, cmsis_nn_src: Path) -> BuildPlan:
    """Every input of the build, checked to exist, and the cache key over all of them."""
    et = Path(executorch_src).resolve()
    cmsis = Path(cmsis_nn_src).resolve()
    option_et = "--executorch-src or ORCHESTRATE_EXECUTORCH_SRC"
    option_nn = "--cmsis-nn-src or ORCHESTRATE_CMSIS_NN_SRC"
    _require(et, "ExecuTorch source tree", option_et)
    _require(cmsis / "Include" / "arm_nnfunctions.h", "CMSIS-NN source tree", option_nn)
    ops_dir = _require(et / "backends" / "cortex_m" / "ops", "ExecuTorch Cortex-M ops", option_et)
    operators_yaml = _require(ops_dir / "operators.yaml", "Cortex-M operators.yaml", option_et)
    _require(et / "codegen" / "gen.py", "ExecuTorch codegen", option_et)
    cortex_m_ops = tuple(sorted(ops_dir.glob("op_*.cpp")))
    if not cortex_m_ops:
        raise HostRuntimeUnavailable(f"no op_*.cpp in {ops_dir}")
    util_dir = et / "kernels" / "portable" / "cpu" / "util"
    portable_util = tuple(_require(util_dir / name, "portable kernel utility", option_et)
                          for name in PORTABLE_UTIL_SOURCES)
    arm_runtime = et / "backends" / "arm" / "runtime"
    ethos_u = tuple(_require(arm_runtime / name, "Ethos-U backend source", option_et)
                    for name in ETHOS_U_SOURCES)
    cmsis_nn = tuple(sorted(p for p in (cmsis / "Source").rglob("*.c")
                            if "Bindings" not in p.parts
                            and not any(m in p.name for m in _CMSIS_FLOAT_MARKERS)))
    if not cmsis_nn:
        raise HostRuntimeUnavailable(f"no CMSIS-NN sources under {cmsis / 'Source'}")
    # Our own operators (kernels/s16) register beside upstream's Cortex-M ones.
    glue = tuple(sorted(CSRC.glob("*.cpp"))) + tuple(sorted(S16_OPERATORS_YAML.parent.glob("op_*.cpp")))
    plan = BuildPlan(et, cmsis, find_wheel(), find_host_toolchain(), cortex_m_ops, portable_util,
                     ethos_u, cmsis_nn, glue, operators_yaml)
    return BuildPlan(**{**plan.__dict__, "key": _cache_key(plan)})


def _hashed_files(plan: BuildPlan) -> list[tuple[str, Path]]:
    """Every file whose content can change the library, as (role/relative path, path): the
    sources, the headers they can reach, the codegen that writes the registration, and the
    wheel's headers and runtime. Keyed by relative paths, so the same sources in another
    checkout share the cache."""
    et = plan.executorch_src
    trees = [
        ("cortex_m", et / "backends" / "cortex_m" / "ops", ("*.cpp", "*.h", "*.yaml")),
        ("arm_runtime", et / "backends" / "arm" / "runtime", ("*.cpp", "*.h")),
        ("portable_util", et / "kernels" / "portable" / "cpu" / "util", ("*.cpp", "*.h")),
        ("codegen", et / "codegen", ("*.py", "*.h", "*.cpp", "*.ini")),
        ("cmsis_include", plan.cmsis_nn_src / "Include", ("*.h",)),
        ("cmsis_source", plan.cmsis_nn_src / "Source", ("*.c", "*.h")),
        ("glue", CSRC, ("*.cpp", "*.h")),
        ("s16", S16_OPERATORS_YAML.parent, ("*.cpp", "*.yaml")),
        ("wheel_include", plan.wheel.include_dirs[0], ("*.h",)),
    ]
    files = {}
    for role, root, patterns in trees:
        for pattern in patterns:
            for path in root.rglob(pattern):
                files[f"{role}/{path.relative_to(root)}"] = path
    files["wheel/libexecutorch.so"] = plan.wheel.library
    files["host.py"] = Path(__file__).resolve()
    return sorted(files.items())


def _cache_key(plan: BuildPlan) -> str:
    digest = hashlib.sha256()
    for part in (CXX_FLAGS, C_FLAGS, DEFINES, CMSIS_DEFINES, ETHOS_U_UNDEFINED,
                 PORTABLE_UTIL_SOURCES, ETHOS_U_SOURCES, (plan.toolchain.versions,),
                 (sys.version.split()[0],)):
        digest.update(repr(part).encode())
    for name, path in _hashed_files(plan):
        digest.update(name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _run(command: list[str], what: str, cwd: Path | None = None, env: dict | None = None) -> None:
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-25:])
        raise HostRuntimeUnavailable(f"host runtime build failed at {what}:\n{tail}")


def _generate_registration(plan: BuildPlan, work: Path) -> Path:
    """Run the source tree's own codegen on operators.yaml (what the Cortex-M CMakeLists does
    through generate_bindings_for_kernels), with --manual-registration."""
    packaged = torchgen_yaml_dir()
    # The codegen imports itself as `executorch.codegen`; a link named `executorch` to the tree
    # puts this tree's codegen first, whatever the installed wheel carries.
    root = work / "src"
    root.mkdir(parents=True, exist_ok=True)
    (root / "executorch").symlink_to(plan.executorch_src, target_is_directory=True)
    out = work / "gen"
    # One registration for upstream's Cortex-M operators and ours (kernels/s16): codegen takes
    # one custom-ops YAML, and two would define register_all_kernels twice.
    merged = work / "operators.yaml"
    merged.write_text(plan.operators_yaml.read_text() + "\n" + S16_OPERATORS_YAML.read_text())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    _run([sys.executable, "-m", "executorch.codegen.gen",
          f"--source-path={plan.executorch_src / 'codegen'}", f"--install-dir={out}",
          f"--tags-path={packaged / 'tags.yaml'}",
          f"--aten-yaml-path={packaged / 'native_functions.yaml'}",
          f"--custom-ops-yaml-path={merged}", "--manual-registration"],
         "codegen of operators.yaml", env=env)
    generated = sorted(out.glob("RegisterKernels_*.cpp"))
    if not generated:
        raise HostRuntimeUnavailable("codegen of operators.yaml wrote no RegisterKernels_*.cpp")
    return out


def _compile_commands(plan: BuildPlan, work: Path, gen: Path) -> list[tuple[list[str], str]]:
    wheel_includes = [f"-I{d}" for d in plan.wheel.include_dirs]
    # The wheel's runtime headers come first so that every runtime type has the layout of the
    # library it links against; the source tree (through the `executorch` link) supplies the
    # headers the wheel does not ship (kernels/portable, backends).
    cxx_includes = wheel_includes + [f"-I{work / 'src'}", f"-I{plan.cmsis_nn_src / 'Include'}",
                                     f"-I{gen}", f"-I{CSRC}"]
    key = f'-DORCHESTRATE_BUILD_KEY="{plan.key[:16]}"'
    objects = work / "obj"
    objects.mkdir(exist_ok=True)
    commands = []
    cxx_sources = (list(plan.cortex_m_ops) + list(plan.portable_util) + list(plan.ethos_u)
                   + list(plan.glue) + sorted(gen.glob("RegisterKernels_*.cpp")))
    for index, source in enumerate(cxx_sources):
        defines = [f"-D{d}" for d in DEFINES
                   if not (source in plan.ethos_u and d in ETHOS_U_UNDEFINED)] + [key]
        obj = objects / f"cxx{index:03d}_{source.stem}.o"
        commands.append(([plan.toolchain.cxx, *CXX_FLAGS, *defines, *cxx_includes, "-c",
                          str(source), "-o", str(obj)], str(source)))
    for index, source in enumerate(plan.cmsis_nn):
        obj = objects / f"c{index:03d}_{source.stem}.o"
        commands.append(([plan.toolchain.cc, *C_FLAGS, *[f"-D{d}" for d in CMSIS_DEFINES],
                          f"-I{plan.cmsis_nn_src / 'Include'}", "-c", str(source), "-o",
                          str(obj)], str(source)))
    return commands


def _compile_all(commands, jobs: int) -> None:
    def one(entry):
        command, source = entry
        _run(command, source)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for _ in pool.map(one, commands):
            pass


def _link(plan: BuildPlan, work: Path, output: Path) -> None:
    objects = sorted(str(p) for p in (work / "obj").glob("*.o"))
    lib_dir = plan.wheel.library.parent
    # --no-undefined: every symbol resolves in our objects or in libexecutorch.so, so a missing
    # source shows here instead of as a dlopen failure.
    _run([plan.toolchain.cxx, "-shared", "-o", str(output), *objects, f"-L{lib_dir}",
          "-l:libexecutorch.so", f"-Wl,-rpath,{lib_dir}", "-Wl,--no-undefined", "-Wl,-Bsymbolic"],
         "link")


def build(executorch_src: Path, cmsis_nn_src: Path, cache_dir: Path | None = None,
          jobs: int | None = None, log=None) -> BuiltLibrary:
    """The host runtime library for these sources: from the cache, or built now (`jobs`
    compilers at once, default kernels.native.toolchains.build_jobs()). Raises
    HostRuntimeUnavailable when it cannot be built."""
    plan = plan_build(executorch_src, cmsis_nn_src)
    jobs = jobs or build_jobs()
    root = Path(cache_dir or default_cache_dir()) / "host_runtime"
    final_dir = root / plan.key[:24]
    library = final_dir / LIBRARY_NAME
    if library.is_file():
        return BuiltLibrary(library, plan.key, True, 0.0)
    root.mkdir(parents=True, exist_ok=True)
    # One builder at a time per cache: a second process waits, then finds the library.
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.is_file():
            return BuiltLibrary(library, plan.key, True, 0.0)
        start = time.perf_counter()
        work = Path(tempfile.mkdtemp(prefix="build-", dir=root))
        try:
            if log:
                log(f"building the host runtime ({len(plan.cmsis_nn)} CMSIS-NN, "
                    f"{len(plan.cortex_m_ops)} Cortex-M op, {len(plan.ethos_u)} Ethos-U sources) "
                    f"into {final_dir}")
            gen = _generate_registration(plan, work)
            _compile_all(_compile_commands(plan, work, gen), jobs)
            _link(plan, work, work / LIBRARY_NAME)
            (work / "build-key.txt").write_text(
                f"{plan.key}\nexecutorch_src={plan.executorch_src}\n"
                f"cmsis_nn_src={plan.cmsis_nn_src}\nwheel={plan.wheel.library}\n"
                f"toolchain={plan.toolchain.versions}\n")
            shutil.rmtree(work / "obj")
            (work / "src" / "executorch").unlink()
            if final_dir.exists():  # a build interrupted after its rename left no library
                shutil.rmtree(final_dir)
            work.rename(final_dir)
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
        return BuiltLibrary(library, plan.key, False, time.perf_counter() - start)
