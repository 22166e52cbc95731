"""Which kernels a program's operators need and the generated sources that register them: the
kernel libraries of the ExecuTorch sources (portable, cortex_m) read from their YAML, the
selection of a program's operators (selective build), ExecuTorch's codegen for them, flatc's
schema headers, and the runtime and CMSIS-NN sources every firmware compiles. Used by the runner
(kernels/native/runner.py) and `orchestrate firmware`'s projects alike.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import yaml

from kernels.native.cache import digest, publish_folder
from kernels.native.errors import FirmwareBuildError, KernelsMissing
from kernels.native.sources import ThirdParty
from kernels.native.toolchains import find_flatc, run_text, torchgen_yaml_dir

S16_OPERATORS_YAML = Path(__file__).resolve().parent.parent / "s16" / "operators.yaml"
# Bump when a recipe below changes in a way the hashed inputs do not show.
RECIPE_VERSION = "1"
# The Ethos-U backend's Cortex-M translation units (backends/arm/runtime), which every build with
# an NPU compiles.
ETHOS_U_BACKEND_SOURCES = ("EthosUBackend.cpp", "EthosUBackend_Cortex_M.cpp",
                           "EthosUBackend_IoMemcpy.cpp", "VelaBinStream.cpp")


@dataclass(frozen=True)
class KernelLibrary:
    name: str  # "portable" or "cortex_m"
    yaml_path: Path
    yaml_flag: str  # how codegen takes the yaml: --functions-yaml-path or --custom-ops-yaml-path
    source_dir: Path
    kernels: Mapping[str, tuple[str, ...]]  # operator -> kernel function names


def _kernel_libraries(third_party: ThirdParty) -> tuple[KernelLibrary, ...]:
    et = third_party.executorch
    return (
        _read_kernel_yaml("portable", et / "kernels/portable/functions.yaml", "--functions-yaml-path",
                          et / "kernels/portable/cpu"),
        _read_kernel_yaml("cortex_m", et / "backends/cortex_m/ops/operators.yaml",
                          "--custom-ops-yaml-path", et / "backends/cortex_m/ops"),
        # Our own operators (int16 on CMSIS-NN's s16 kernels), beside upstream's.
        _read_kernel_yaml("orchestrate", S16_OPERATORS_YAML, "--custom-ops-yaml-path",
                          S16_OPERATORS_YAML.parent),
    )


def _read_kernel_yaml(name: str, path: Path, flag: str, source_dir: Path) -> KernelLibrary:
    kernels = {}
    for entry in yaml.safe_load(path.read_text()):
        operator = f"aten::{entry['op']}" if "op" in entry else entry["func"].split("(")[0].strip()
        if "::" not in operator:
            operator = f"aten::{operator}"
        kernels[operator] = tuple(k["kernel_name"].split("::")[-1] for k in entry.get("kernels", ()))
    return KernelLibrary(name, path, flag, source_dir, MappingProxyType(kernels))


def _prim_operators(third_party: ThirdParty) -> frozenset[str]:
    """Operators kernels/prim_ops/register_prim_ops.cpp registers (always linked)."""
    text = (third_party.executorch / "kernels/prim_ops/register_prim_ops.cpp").read_text()
    return frozenset(re.findall(r'"([a-z_]+::[A-Za-z_0-9]+\.[A-Za-z_0-9]+)"', text))


def read_operators(operators_txt: str | Path) -> tuple[str, ...]:
    """The operators a program needs, one per line (what `compile` writes as operators.txt)."""
    lines = Path(operators_txt).read_text().splitlines()
    return tuple(sorted({line.strip() for line in lines if line.strip() and not line.startswith("#")}))


def _kernel_source(library: KernelLibrary, operator: str, function: str) -> Path:
    """The op_*.cpp that defines `function`: op_<name>.cpp by ExecuTorch's naming, else the file
    whose definition (a KernelRuntimeContext& first parameter, or a DEFINE_* macro) names it."""
    base = operator.split("::")[-1].split(".")[0]
    definition = re.compile(
        rf"\b{re.escape(function)}\s*\(\s*(?://[^\n]*\n\s*)*(?:[\w:]*::)?KernelRuntimeContext\s*&"
        rf"|\bDEFINE_\w+\(\s*{re.escape(function)}\b"
    )
    named = library.source_dir / f"op_{base}.cpp"
    if named.is_file() and function in named.read_text():
        return named
    for candidate in sorted(library.source_dir.glob("op_*.cpp")):
        if definition.search(candidate.read_text()):
            return candidate
    raise FirmwareBuildError(f"no source in {library.source_dir} defines {function} for {operator}")


@dataclass(frozen=True)
class OperatorSelection:
    """Which library registers each operator, and the kernel sources they need."""

    by_library: Mapping[str, tuple[str, ...]]
    sources: Mapping[str, tuple[Path, ...]]
    prim: tuple[str, ...]


def select_operators(operators: Iterable[str], third_party: ThirdParty) -> OperatorSelection:
    """Map each operator to its kernel library; raise KernelsMissing for any without a kernel
    (e.g. the wheel's `cortex_m::*_nhwc.out` variants, which this source snapshot lacks)."""
    libraries = _kernel_libraries(third_party)
    prim = _prim_operators(third_party)
    by_library: dict[str, list[str]] = {library.name: [] for library in libraries}
    sources: dict[str, set[Path]] = {library.name: set() for library in libraries}
    prim_used, missing = [], []
    for operator in sorted(set(operators)):
        for library in libraries:
            if operator in library.kernels:
                by_library[library.name].append(operator)
                for function in library.kernels[operator]:
                    sources[library.name].add(_kernel_source(library, operator, function))
                break
        else:
            if operator in prim:
                prim_used.append(operator)
            else:
                missing.append(operator)
    if missing:
        raise KernelsMissing(
            f"no kernel in the sources for {', '.join(missing)} (third_party executorch snapshot)"
        )
    return OperatorSelection(
        MappingProxyType({name: tuple(ops) for name, ops in by_library.items()}),
        MappingProxyType({name: tuple(sorted(paths)) for name, paths in sources.items()}),
        tuple(prim_used),
    )



def runtime_sources(third_party: ThirdParty, *, bundled_program: bool) -> list[Path]:
    """The runtime core, prim ops and the portable kernels' shared utilities; with
    `bundled_program`, BundleIO's self-check too."""
    et = third_party.executorch
    found = []
    for path in sorted((et / "runtime").rglob("*.cpp")):
        relative = str(path.relative_to(et))
        # *_aten.cpp are the ATen-mode variants (tensor_parser_exec_aten.cpp is shared);
        # platform/default/ is replaced by the firmware's own platform layer (pal).
        aten_mode = relative.endswith("_aten.cpp") and not relative.endswith("exec_aten.cpp")
        if ("/test/" in relative or "testing_util" in relative or aten_mode
                or "/platform/default/" in relative):
            continue
        found.append(path)
    found.append(et / "schema/extended_header.cpp")
    if bundled_program:
        found.append(et / "devtools/bundled_program/bundled_program.cpp")
    found += sorted((et / "kernels/prim_ops").glob("*.cpp"))
    found += sorted((et / "kernels/portable/cpu/util").glob("*.cpp"))
    found += sorted((et / "kernels/portable/cpu/pattern").glob("*.cpp"))
    return found


def cmsis_nn_sources(third_party: ThirdParty) -> list[Path]:
    """CMSIS-NN's integer kernels: its float ones need ARM_NN_ENABLE_F32/F16, off by default in
    its CMake as here."""
    return sorted(
        p for p in (third_party.cmsis_nn / "Source").rglob("*.c")
        if "Bindings" not in p.parts and not re.search(r"_f(16|32)\.c$", p.name)
    )


def kernel_libraries(third_party: ThirdParty) -> dict[str, KernelLibrary]:
    return {library.name: library for library in _kernel_libraries(third_party)}

def schema_headers(third_party: ThirdParty, cache: Path) -> Path:
    """flatc's headers for the program and bundled-program schemas, cached under `cache` by
    their inputs; the folder to put on the include path."""
    flatc = find_flatc(third_party)
    et = third_party.executorch
    groups = {
        "executorch/schema": [et / "schema/program.fbs", et / "schema/scalar_type.fbs"],
        "executorch/devtools/bundled_program/schema": [
            et / "devtools/bundled_program/schema/bundled_program_schema.fbs",
            et / "devtools/bundled_program/schema/scalar_type.fbs",
        ],
    }
    key = digest(RECIPE_VERSION, run_text([str(flatc), "--version"]),
                 *(p.read_bytes() for files in groups.values() for p in files))
    out = cache / "schema" / key
    if not (out / "done").is_file():
        (cache / "schema").mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache / "schema", prefix=".tmp-"))
        for folder, files in groups.items():
            subprocess.run(
                [str(flatc), "--cpp", "--cpp-std", "c++11", "--gen-mutable", "--scoped-enums",
                 "-o", str(staging / "include" / folder), *map(str, files)],
                check=True, capture_output=True, text=True,
            )
        (staging / "done").write_text(key)
        publish_folder(staging, out)
    return out / "include"


def kernel_registration(third_party: ThirdParty, cache: Path, tree: str, library: KernelLibrary,
                        operators: Sequence[str]) -> Path:
    """ExecuTorch's codegen (codegen/gen.py of the sources) for the selected operators: the
    unboxing wrappers and the static registration of their kernels (a folder, cached by its
    inputs)."""
    native = torchgen_yaml_dir()
    selection = {
        "build_features": [],
        "custom_classes": [],
        "et_kernel_metadata": {op: ["default"] for op in operators},
        "include_all_non_op_selectives": False,
        "include_all_operators": False,
        "kernel_metadata": {},
        "operators": {
            op: {"debug_info": ["operators.txt"], "include_all_overloads": False,
                 "is_root_operator": True, "is_used_for_training": True}
            for op in operators
        },
    }
    selection_text = yaml.safe_dump(selection, sort_keys=True)
    key = digest(RECIPE_VERSION, library.name, selection_text, library.yaml_path.read_bytes(),
                 tree, (native / "native_functions.yaml").read_bytes(),
                 (native / "tags.yaml").read_bytes())
    out = cache / "codegen" / key
    if not (out / "done").is_file():
        (cache / "codegen").mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache / "codegen", prefix=".tmp-"))
        (staging / "selected_operators.yaml").write_text(selection_text)
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        result = subprocess.run(
            [sys.executable, "-m", "codegen.gen",
             f"--source-path={third_party.executorch / 'codegen'}", f"--install-dir={staging}",
             f"--tags-path={native / 'tags.yaml'}",
             f"--aten-yaml-path={native / 'native_functions.yaml'}",
             f"--op-selection-yaml-path={staging / 'selected_operators.yaml'}",
             f"{library.yaml_flag}={library.yaml_path}"],
            cwd=third_party.executorch, env=env, capture_output=True, text=True,
        )
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise FirmwareBuildError(
                f"ExecuTorch codegen failed for {library.name}:\n{result.stderr[-4000:]}")
        (staging / "done").write_text(key)
        publish_folder(staging, out)
    return out
