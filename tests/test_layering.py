"""The package's layering: no module imports (directly or through others) a module that imports it.

Every import in ``flexsn_dsl/*.py`` counts, also those inside functions: a late import still
makes the two modules depend on each other."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flexsn_dsl"
INIT = "__init__"


def import_graph(folder: Path) -> dict[str, set[str]]:
    """Module name -> the package modules it imports. ``from . import name`` of a name that is not a
    module, and ``import flexsn_dsl``, import the package itself (``__init__``)."""
    modules = {p.stem for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {}

    def target(dotted: str) -> str:
        return dotted.split(".", 1)[0] if dotted else INIT

    for path in sorted(folder.glob("*.py")):
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level > 1:
                    continue  # above the package
                if node.level == 1:
                    module = node.module or ""
                elif node.module and (node.module == folder.name or node.module.startswith(folder.name + ".")):
                    module = node.module[len(folder.name) + 1:]
                else:
                    continue
                if module:
                    edges.add(target(module))
                else:
                    edges |= {a.name if a.name in modules else INIT for a in node.names}
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == folder.name or alias.name.startswith(folder.name + "."):
                        edges.add(target(alias.name[len(folder.name) + 1:]))
        graph[path.stem] = edges - {path.stem}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_the_package_has_no_import_cycles():
    graph = import_graph(PACKAGE)
    # the graph is read, not empty: edges that must be there
    assert {"bench", "console"} <= graph["cli"]
    assert {"compiler", "errors"} <= graph["runtime"]
    assert "runtime" in graph[INIT] and "compiler" in graph["triton_runtime"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles_of_every_kind(tmp_path):
    """Late imports, ``from . import``, the package itself: each closes a cycle the test reports."""
    variants = {
        "late import": {"a.py": "def f():\n    from .b import g\n", "b.py": "from .a import f\n"},
        "from-dot-import": {"a.py": "from . import b\n", "b.py": "from .c import x\n", "c.py": "import pkg.a\n"},
        "through the package": {INIT + ".py": "from .a import f\n", "a.py": "from . import __version__\n"},
        "absolute": {"a.py": "from pkg.b import g\n", "b.py": "import pkg\n", INIT + ".py": "from .a import f\n"},
    }
    for name, files in variants.items():
        folder = tmp_path / name.replace(" ", "_") / "pkg"
        folder.mkdir(parents=True)
        for file, text in files.items():
            (folder / file).write_text(text)
        cycle = find_cycle(import_graph(folder))
        assert cycle is not None and cycle[0] == cycle[-1], name
    acyclic = tmp_path / "ok" / "pkg"
    acyclic.mkdir(parents=True)
    (acyclic / "a.py").write_text("from .b import g\nimport os\nfrom .. import up\n")
    (acyclic / "b.py").write_text("from .c import h\n")
    (acyclic / "c.py").write_text("import json\n")
    assert find_cycle(import_graph(acyclic)) is None
