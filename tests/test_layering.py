"""The package's layering, read from the source with ``ast`` (nothing is imported).

- No module-level import cycle inside draftsmith. Imports inside functions are left out on purpose:
  they are how heavy or optional modules (torch engines, vLLM, transformers) load only when used.
- No private name (``_x``) imported from another package (``draftsmith.<pkg>``): what one package
  takes from another is its public API. Lazy imports count here too: a private name is private
  wherever the import sits.
- No library file over 500 lines: a module a newcomer can read in one sitting.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "draftsmith"
MAX_LINES = 500

def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def package_of(module: str) -> str:
    """``draftsmith.train.loop`` -> ``draftsmith.train``; a top-level module is its own package."""
    return ".".join(module.split(".")[:2])


def imported_from(module: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` statement reads (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not MODULES[module].name == "__init__.py":
        base = base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_level_imports(tree: ast.Module):
    """Import statements that run when the module is imported: the top level and the blocks in it
    (if / try / with), not function or class bodies, not ``if TYPE_CHECKING:``."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and is_type_checking(node):
            todo.extend(node.orelse)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                todo.extend(handler.body)


def targets(module: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(draftsmith module imported, name taken from it or None) for one import statement. ``from pkg
    import sub`` where ``sub`` is a module is an edge to ``pkg.sub``."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names if a.name.split(".")[0] == "draftsmith"]
    source = imported_from(module, node)
    if source.split(".")[0] != "draftsmith":
        return []
    out = []
    for a in node.names:
        sub = f"{source}.{a.name}"
        out.append((sub, None) if sub in MODULES else (source, a.name))
    return out


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for node in module_level_imports(ast.parse(path.read_text(), str(path))):
            for target, _ in targets(module, node):
                if target in MODULES and target != module:
                    edges[module].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(path_within(sorted(component), edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def path_within(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A cycle through the component's first module, for the failure message."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(edges[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return component


def test_the_graph_sees_known_edges():
    # guards the parser: if it stopped finding imports, the cycle check would pass vacuously
    edges = graph()
    assert "draftsmith.train.checkpoint" in edges["draftsmith.train.loop"]
    assert "draftsmith.distributed" in edges["draftsmith.ranked"]


def test_the_cycle_finder_finds_a_cycle():
    # guards the checker itself: a planted cycle is reported as a path back to its first module
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_level_import_cycle():
    found = cycles(graph())
    assert not found, "module-level import cycles (move the shared piece below both, or import it lazily):\n" + \
        "\n".join(" -> ".join(c) for c in found)


def test_no_private_names_imported_across_packages():
    found = set()
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target, name in targets(module, node):
                private = name if name is not None else target.split(".")[-1]
                if private.startswith("_") and not private.startswith("__") and package_of(target) != package_of(module):
                    found.add((module, target, private))
    assert not found, "private names imported from another package (make them public where they are defined, " \
        "or move them to the package that uses them):\n" + "\n".join(f"{m} imports {t}.{n}" for m, t, n in sorted(found))


def test_no_library_file_over_500_lines():
    long = {str(p.relative_to(SRC)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"library files over {MAX_LINES} lines (split them by what they do): {long}"


# Which other draftsmith packages a package may import, lazy imports inside functions included (a lazy
# import is still a dependency: it only moves when it fails). The layers, bottom up: supervision/ (the
# registry of supervision kinds and layer-id rules, the target head, the layer-id convention) imports
# nothing of draftsmith; drafts/ (model math, the family descriptions and the kinds each family brings)
# imports only supervision/; targets/ (the engines) reads supervision/, models/ and its feature cache,
# never drafts/ (the kinds reach it through the registry); remote/ carries targets over the wire; serve/ reads drafts' descriptions and the
# targets' facts, never train/ or eval/ (serve must not pull in the trainer). atomic (whole-or-nothing
# writes, the standard library only) sits below them all, so any layer may write through it.
LAYERS = {
    "draftsmith.atomic": set(),
    "draftsmith.supervision": set(),
    "draftsmith.drafts": {"draftsmith.supervision"},
    "draftsmith.targets": {"draftsmith.cache", "draftsmith.models", "draftsmith.supervision"},
    "draftsmith.remote": {"draftsmith.distributed", "draftsmith.supervision", "draftsmith.targets"},
    "draftsmith.serve": {"draftsmith.atomic", "draftsmith.drafts", "draftsmith.hub", "draftsmith.layout", "draftsmith.models",
                         "draftsmith.supervision", "draftsmith.targets", "draftsmith.weights"},
    "draftsmith.recipe": {"draftsmith.atomic", "draftsmith.config"},
}


def package_edges() -> dict[str, dict[str, set[str]]]:
    """package -> imported package -> the modules of the first that import it (every import statement,
    module level or inside a function)."""
    out: dict[str, dict[str, set[str]]] = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, _ in targets(module, node):
                    a, b = package_of(module), package_of(target)
                    if a != b:
                        out.setdefault(a, {}).setdefault(b, set()).add(module)
    return out


def test_package_edges_count_lazy_imports():
    # guards the counter: targets.vllm imports draftsmith.models only inside functions, and must be seen
    lazy = package_edges()["draftsmith.targets"]["draftsmith.models"]
    assert "draftsmith.targets.vllm" in lazy
    assert not any("draftsmith.models" in graph()[m] for m in ("draftsmith.targets.vllm",))


def test_packages_import_only_the_layers_below():
    edges = package_edges()
    bad = [f"{pkg} imports {other} ({', '.join(sorted(mods))})" for pkg, allowed in LAYERS.items()
           for other, mods in sorted(edges.get(pkg, {}).items()) if other not in allowed]
    assert not bad, "imports across layers (move the shared piece down, or ask the family description):\n" + \
        "\n".join(bad)
