"""codegen's import graph runs one way: each module imports only modules of lower layers, at module
level (an import inside a function would hide a circle), and the graph has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CODEGEN = Path(__file__).resolve().parents[2] / "codegen"

# lowest first; a module may import modules of its own or lower layers (never higher)
LAYERS = [
    {"errors", "escape", "names", "targets"},
    {"source"},
    {"formula.syntax", "formula.kinds"},
    {"formula.lang", "formula.expr", "formula.dims"},
    {"formula.graph", "formula.derive"},
    {"model"},
    {"schema"},
    {"api"},
    {"load"},
    {"dest.render"},
    {"dest.function", "dest.registry", "dest.binding", "dest.aot", "dest.stub", "dest.op_table",
     "dest.docs", "dest.module"},
    {"gen"},
    {"__main__", "__init__"},  # the command line and the package's facade
]
RANK = {m: k for k, layer in enumerate(LAYERS) for m in layer}


def _module(path: Path) -> str:
    rel = path.relative_to(CODEGEN).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" and len(rel.parts) > 1 else rel.parts
    return ".".join(parts)


MODULES = {_module(p): p for p in sorted(CODEGEN.rglob("*.py"))}
PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py" and m != "__init__"}


def _imports(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """(codegen module imported, line, at module level) for each import of a codegen module."""
    tree = ast.parse(path.read_text(), str(path))
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    if name == "__init__":
        package = []
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] in ("codegen", "opforge"):
                mod = node.module.removeprefix("opforge.").removeprefix("codegen").lstrip(".")
            else:
                continue
            # `from . import api` and `from .dest import function` name modules too
            for alias in node.names:
                sub = f"{mod}.{alias.name}" if mod else alias.name
                targets.append(sub if sub in MODULES else mod)
        elif isinstance(node, ast.Import):
            targets = [a.name.removeprefix("opforge.").removeprefix("codegen").lstrip(".")
                       for a in node.names if a.name.split(".")[0] in ("codegen",)
                       or a.name.startswith("opforge.codegen")]
        for t in targets:
            out.append((t or "__init__", node.lineno, id(node) in top))
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    assert sorted(set(MODULES) - PACKAGES - set(RANK)) == []
    assert sorted(set(RANK) - set(MODULES)) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_at_module_level_only(name: str) -> None:
    nested = [f"{MODULES[name].name}:{line}: {t}" for t, line, top in GRAPH[name] if not top]
    assert nested == []


@pytest.mark.parametrize("name", sorted(set(MODULES) - PACKAGES))
def test_imports_run_downward(name: str) -> None:
    upward = [f"{t} (line {line})" for t, line, _ in GRAPH[name] if t not in PACKAGES
              and RANK[t] >= RANK[name] and t != name and not RANK[t] == RANK[name] == RANK["errors"]]
    # (within one layer only the leaf modules errors/escape/names may meet: none imports another)
    assert upward == [], f"{name} imports a module of its own or a higher layer"


def test_no_cycle() -> None:
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, "import cycle: " + " -> ".join(stack + [m])
        state[m] = 1
        for t, _, _ in GRAPH.get(m, []):
            visit(t, stack + [m])
        state[m] = 2

    for m in MODULES:
        visit(m, [])


def test_model_does_no_io_and_emits_no_target_language() -> None:
    # the model imports neither the file system, nor jinja, nor the lowering to C++/Python text
    text = MODULES["model"].read_text()
    for banned in ("import os", "pathlib", "jinja2", "from .api", "from .load", "from .dest", "formula.lang",
                   "formula.graph", "open("):
        assert banned not in text, banned
