"""The package structure holds: dependencies point down, no import cycles (read from the source)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "partitioners", "cost_models", "kernels", "npu_driver", "platforms",
            "examples")
# Who may import whom: orchestrator sits on top; partitioners use kernels' catalogue; platforms
# use kernels' native-build room (kernels/native/: the runner firmware); the rest are leaves
# (examples: the model zoo, imported by the model loader).
ALLOWED = {
    "orchestrator": set(PACKAGES),
    "partitioners": {"partitioners", "kernels"},
    "cost_models": {"cost_models", "kernels"},
    "kernels": {"kernels"},
    "npu_driver": {"npu_driver"},
    "platforms": {"platforms", "kernels"},
    "examples": {"examples"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path], with_types: bool = False) -> set[str]:
    """Project modules imported anywhere in the file (module level or inside functions); those
    under `if TYPE_CHECKING:` (annotations only, never run) only `with_types`."""
    names = set()
    tree = ast.parse(path.read_text())
    type_only = {id(inner) for node in ast.walk(tree)
                 if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
                 for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in type_only and not with_types:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in names if n in modules}


def test_no_package_imports_a_package_above_it():
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        package = name.split(".")[0]
        for imported in _imports(path, modules):
            if imported.split(".")[0] not in ALLOWED[package]:
                wrong.append(f"{name} imports {imported}")
    assert wrong == []


# Rooms inside orchestrator/ that build on another, never the reverse.
ROOMS_BELOW = {"orchestrator.verification": ("orchestrator.device_runs",)}


def test_no_room_imports_a_room_built_on_it():
    modules = _modules()
    wrong = [f"{name} imports {imported}"
             for name, path in modules.items()
             for room, above in ROOMS_BELOW.items() if name.startswith(room)
             for imported in _imports(path, modules) if imported.startswith(above)]
    assert wrong == []


def test_no_module_imports_a_private_name_of_another():
    """Modules talk through public names (one request path: the CLI and sweep call the API, not
    its helpers); a leading underscore means "this module only"."""
    modules = _modules()
    private = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in modules and node.level == 0:
                private += [f"{name} imports {node.module}.{alias.name}" for alias in node.names
                            if alias.name.startswith("_") and node.module != name]
    assert private == []


def test_only_the_manifest_module_names_the_manifest_file():
    """One reader of manifest.json (orchestrator/artifacts/manifest.py: structure, hashes,
    paths inside the folder); a second reader would skip those checks."""
    naming = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "manifest.json":
                naming.append(name)
    assert naming == ["orchestrator.artifacts.manifest"]


def test_no_import_cycles():
    """No two modules need each other, counting imports inside functions and the annotations'
    imports under `if TYPE_CHECKING:`: a loop closed by a lazy or a type-only import is still
    two files a reader goes back and forth between."""
    modules = _modules()
    graph = {name: {i for i in _imports(path, modules, with_types=True) if i != name}
             for name, path in modules.items()}
    # A package's __init__ re-exporting its own modules is not a cycle of behaviour.
    for name in graph:
        graph[name] = {i for i in graph[name] if not name.startswith(i + ".")}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "active"
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "active":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def _calls(callee: str):
    """(module, call node) of every call of `callee` (a name or an attribute) in the packages."""
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and callee in (getattr(node.func, "id", None),
                                                         getattr(node.func, "attr", None)):
                yield name, node


def test_every_reason_comes_from_the_catalogue():
    """Only partitioners/reasons.py builds a Reason; everything else names a catalogue entry."""
    builders = {name for name, _ in _calls("Reason")}
    assert builders <= {"partitioners.reasons"}


def _message(call: ast.Call, position: int):
    return call.args[position] if len(call.args) > position else next(
        (k.value for k in call.keywords if k.arg == "message"), None)


def _from_catalogue(message) -> bool:
    """`fault_text(...)`, or the `.message` of a KernelFault (whose own text is checked)."""
    return ((isinstance(message, ast.Call) and getattr(message.func, "id", None) == "fault_text")
            or (isinstance(message, ast.Attribute) and message.attr == "message"))


def _free_fault_texts(calls) -> list[str]:
    """The KernelFault / DeviceFault calls whose message is not a catalogue text."""
    free = []
    for name, call in calls:
        callee = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
        if callee == "KernelFault":
            message = _message(call, 2)
            ok = isinstance(message, ast.Call) and getattr(message.func, "id", None) == "fault_text"
        else:  # the twin's DeviceFault(instruction, op, check, message, key)
            ok = _from_catalogue(_message(call, 3))
        if not ok:
            free.append(f"{name}:{call.lineno}")
    return free


def test_every_device_fault_text_comes_from_the_catalogue():
    """A twin kernel's KernelFault carries a catalogue entry's text (`fault_text`), and the twin's
    DeviceFault a `fault_text` or a KernelFault's message, never a literal or f-string of its
    own: the plan, the twin and REASONS.md read one text per rule."""
    calls = [*_calls("KernelFault"), *_calls("DeviceFault")]
    assert any(name == "orchestrator.verification.twin" for name, _ in calls)
    assert _free_fault_texts(calls) == []
    entries = {name for name, _ in _calls("FaultEntry")}
    assert entries <= {"kernels.faults"}


def test_a_free_device_fault_text_is_caught():
    source = """
DeviceFault(1, op, "input type", f"input {slot} is {dtype}")
DeviceFault(1, op, "output copy", "tensor bytes not divisible")
DeviceFault(1, op, "output copy", message=text)
KernelFault(op, "check", "free text")
DeviceFault(1, op, fault.check, fault.message, fault.key)
DeviceFault(1, op, "check", fault_text("transpose-rank", op=op, rank=5, max_rank=4))
KernelFault(op, "check", fault_text("transpose-rank", op=op, rank=5, max_rank=4))
"""
    calls = [("snippet", node) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                 "DeviceFault", "KernelFault")]
    assert _free_fault_texts(calls) == ["snippet:2", "snippet:3", "snippet:4", "snippet:5"]


def test_every_named_entry_is_in_the_catalogue():
    """Each literal key handed to `because`, `fault_text` or `device_fault` is a catalogue entry,
    so a typo fails here and not on the one model that reaches that branch."""
    from partitioners.reasons import CATALOGUE

    unknown = [f"{name}:{call.lineno} {call.args[0].value!r}"
               for callee in ("because", "fault_text", "device_fault")
               for name, call in _calls(callee)
               if call.args and isinstance(call.args[0], ast.Constant)
               and call.args[0].value not in CATALOGUE]
    assert unknown == []


def test_twin_faults_read_their_catalogue_entry():
    """The twin's view_copy fault is the `default-dim-order` entry, filled with the call's values."""
    import torch

    from kernels.reference import RawTensor, execute
    from partitioners.reasons import CATALOGUE

    def raw(sizes, dim_order):
        return RawTensor(torch.int8, sizes, dim_order, memoryview(bytearray(24)))

    result = execute("aten::view_copy", "out", [raw((1, 2, 3, 4), (0, 2, 3, 1)), [1, 24],
                                                raw((1, 24), (0, 1))])
    (fault,) = result.faults
    entry = CATALOGUE[fault.key]
    assert (fault.key, entry.kind, fault.check) == (
        "default-dim-order", "device-fault", "tensor_is_default_dim_order")
    assert fault.message == entry.template.format(op="aten::view_copy.out", order=(0, 2, 3, 1))


def test_the_reasons_document_is_generated_from_the_catalogue():
    from partitioners.reasons import markdown

    assert (ROOT / "partitioners" / "REASONS.md").read_text() == markdown(), (
        "regenerate with: python -m partitioners.reasons > partitioners/REASONS.md")


def test_one_variable_points_every_native_build_at_the_third_party_sources(tmp_path, monkeypatch):
    """$ORCHESTRATE_THIRD_PARTY means one thing to the host runtime and the runner firmware
    (kernels/native/sources.py): both look in the folder it names and say so."""
    import pytest

    from kernels.runtime import RuntimeUnavailable, find_sources
    from kernels.native.errors import ThirdPartySourcesNotFound
    from kernels.native.sources import find_third_party

    empty = tmp_path / "sources"
    empty.mkdir()
    monkeypatch.setenv("ORCHESTRATE_THIRD_PARTY", str(empty))
    for name in ("ORCHESTRATE_EXECUTORCH_SRC", "ORCHESTRATE_CMSIS_NN_SRC"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeUnavailable, match=str(empty / "executorch")):
        find_sources()
    with pytest.raises(ThirdPartySourcesNotFound, match=str(empty)):
        find_third_party()
    monkeypatch.setenv("ORCHESTRATE_EXECUTORCH_SRC", str(tmp_path))
    with pytest.raises(RuntimeUnavailable, match=str(empty / "cmsis-nn")):
        find_sources()  # one tree overridden, the other still from the folder


def test_no_field_is_typed_object():
    """State and results say what they hold (`Program`, `Plan`, `MemoryPolicy | None`), so a
    reader and a type checker know; `object` says nothing."""
    untyped = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and ast.unparse(item.annotation) in (
                            "object", "'object'"):
                        untyped.append(f"{name}.{node.name}.{ast.unparse(item.target)}")
    assert untyped == []


# An import inside a function says why it is not at the module's top, on its first line:
#   `# lazy: heavy (torch)`     pulls in what the module's own top imports do not (torch,
#                               executorch, Vela, TOSA, numpy, or stdlib weight a light command
#                               would pay for), keeping `orchestrate --help` and light callers fast
#   `# lazy: optional (ray)`    an optional dependency, in the one helper that imports it and
#                               raises the one-line UserError when it is missing
#   `# lazy: order (...)`       must run after something else (torch after numerics.pin())
#   `# lazy: cycle (...)`       at the top it would close an import cycle through the named module
LAZY_REASON = re.compile(r"# lazy: (heavy|optional|order|cycle) \([^)]+\)")
# Files other engineers are changing now; their in-function imports get reasons when they land.
LAZY_NOT_YET_STATED: set[str] = set()  # files whose lazy imports are not stated yet: none


def _in_function_imports(tree: ast.AST):
    """Every import statement inside a function or method body."""
    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            yield from walk(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    yield from walk(tree, False)


def test_every_import_inside_a_function_says_why_it_is_not_at_the_top():
    """Imports go at the module's top, where a reader sees what a module depends on; one inside
    a function is there for a reason the line states (LAZY_REASON)."""
    unstated = []
    for path in _modules().values():
        relative = path.relative_to(ROOT).as_posix()
        if relative in LAZY_NOT_YET_STATED:
            continue
        lines = path.read_text().splitlines()
        unstated += [f"{relative}:{node.lineno}: {lines[node.lineno - 1].strip()}"
                     for node in _in_function_imports(ast.parse(path.read_text()))
                     if not LAZY_REASON.search(lines[node.lineno - 1])]
    assert unstated == []


def test_an_import_inside_a_function_without_a_reason_is_caught():
    tree = ast.parse("import os\n\ndef f():\n    import json\n    import torch  # lazy: heavy (torch)\n")
    found = [node.lineno for node in _in_function_imports(tree)]
    assert found == [4, 5]
    assert not LAZY_REASON.search("    import json") and not LAZY_REASON.search("x  # lazy: heavy")


def test_help_imports_no_heavy_package():
    """`orchestrate --help` (and every command's argument errors) stay fast: torch, ExecuTorch,
    Vela, the TOSA tools and numpy load only in the commands that use them."""
    script = ("import sys\nfrom orchestrator.cli import main\n"
              "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
              "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    loaded = set(run.stderr.split())
    assert loaded & {"torch", "torchao", "executorch", "ethosu", "tosa", "numpy", "ray"} == set()


# Generated data, not code a reader walks through.
LONG_FILES_ALLOWED: set[str] = set()


def test_no_module_is_longer_than_800_lines():
    """A module a newcomer reads in one sitting: over 800 lines it holds two rooms' work."""
    long = {str(path.relative_to(ROOT)): n for path in _modules().values()
            if (n := len(path.read_text().splitlines())) > 800
            and str(path.relative_to(ROOT)) not in LONG_FILES_ALLOWED}
    assert long == {}
