"""The package structure holds: dependencies point down, no import cycles (read from the source)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "partitioners", "cost_models", "kernels", "npu_driver", "platforms",
            "examples")
# Who may import whom: orchestrator sits on top; partitioners use kernels' catalogue; the rest
# are leaves (examples: the model zoo, imported by the model loader).
ALLOWED = {
    "orchestrator": set(PACKAGES),
    "partitioners": {"partitioners", "kernels"},
    "cost_models": {"cost_models", "kernels"},
    "kernels": {"kernels"},
    "npu_driver": {"npu_driver"},
    "platforms": {"platforms"},
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


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules imported anywhere in the file (module level or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


def test_no_import_cycles():
    modules = _modules()
    graph = {name: {i for i in _imports(path, modules) if i != name}
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


def test_every_reason_comes_from_the_catalogue():
    """Only partitioners/reasons.py builds a Reason; everything else names a catalogue entry."""
    modules = _modules()
    builders = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Reason":
                builders.append(name)
    assert set(builders) <= {"partitioners.reasons"}


def test_the_reasons_document_is_generated_from_the_catalogue():
    from partitioners.reasons import markdown

    assert (ROOT / "partitioners" / "REASONS.md").read_text() == markdown(), (
        "regenerate with: python -m partitioners.reasons > partitioners/REASONS.md")
