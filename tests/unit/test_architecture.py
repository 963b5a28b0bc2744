"""The house rules that keep gpuq readable, checked on the source (docs/ARCHITECTURE.md):
module and class sizes, no import circles, the floors between layers, and module names that
say one thing each."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

GPUQ = Path(__file__).resolve().parents[2] / "gpuq"
MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 500

# what each layer may not import (any import, at module level or inside a function)
FLOORS: dict[str, frozenset[str]] = {
    "domain": frozenset(
        {"scheduler", "store", "coordinator", "agent", "cli", "web", "config", "client"}
    ),
    "scheduler": frozenset({"store", "coordinator", "agent", "cli", "web", "config"}),
    "store": frozenset({"coordinator", "agent", "cli", "web"}),
    "agent": frozenset({"coordinator", "cli", "web"}),
    "coordinator": frozenset({"agent", "cli"}),
    "config": frozenset({"scheduler", "store", "coordinator", "agent", "cli", "web"}),
}


def modules() -> dict[str, Path]:
    """Every module of gpuq by its dotted name, the generated wire code aside."""
    found: dict[str, Path] = {}
    for path in sorted(GPUQ.rglob("*.py")):
        parts = list(path.relative_to(GPUQ.parent).with_suffix("").parts)
        if parts[:2] == ["gpuq", "v1"]:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The gpuq modules `name` imports anywhere in its file (a name imported from a package
    counts as that module when it is one), less its own ancestors (always loaded first)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {m for m in found if m in known and m != name and m not in ancestors}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def classes(tree: ast.Module) -> Iterator[ast.ClassDef]:
    return (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))


def test_no_module_or_class_is_too_long() -> None:
    too_long: list[str] = []
    for name, path in modules().items():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines")
        for cls in classes(ast.parse(text)):
            size = (cls.end_lineno or cls.lineno) - cls.lineno + 1
            if size > MAX_CLASS_LINES:
                too_long.append(f"{name}.{cls.name}: {size} lines")
    assert not too_long, f"over {MAX_MODULE_LINES} (module) or {MAX_CLASS_LINES} (class)"


def test_no_import_circles() -> None:
    assert circles(graph()) == []


def test_layers_import_only_what_is_below_them() -> None:
    broken = [
        f"{module} imports {other}"
        for module, others in sorted(graph().items())
        for other in sorted(others)
        if layer(other) in FLOORS.get(layer(module), frozenset())
    ]
    assert broken == []


def test_the_checks_see_what_they_look_for() -> None:
    """A planted circle and a planted floor violation are found (the checks cannot pass
    vacuously), and the real graph is the whole package."""
    planted = {"gpuq.a.x": {"gpuq.a.y"}, "gpuq.a.y": {"gpuq.a.x"}, "gpuq.a.z": set()}
    assert circles(planted) == [["gpuq.a.x", "gpuq.a.y"]]
    assert "store" in FLOORS[layer("gpuq.scheduler.plan")]  # scheduler -> store is refused
    edges = graph()
    assert len(edges) > 100
    assert "gpuq.coordinator.changes.job_changes" in edges["gpuq.coordinator.server"]
    assert any(layer(m) == "domain" for m in edges["gpuq.scheduler.plan"])


def test_module_names_say_one_thing_each() -> None:
    """No base name twice in gpuq, modules and packages alike (a reader who sees `arrays` or
    `jobs` must know which one)."""
    seen: dict[str, list[str]] = {}
    for name in modules():
        if name != "gpuq":
            seen.setdefault(name.rpartition(".")[2], []).append(name)
    assert {stem: names for stem, names in seen.items() if len(names) > 1} == {}
