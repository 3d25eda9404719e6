"""The package's layering: no module imports (directly or through others) a module that imports it.

Every import in ``flexsn_dsl/**/*.py`` counts (a subpackage's modules are nodes of their own),
also those inside functions: a late import still makes the two modules depend on each other."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flexsn_dsl"
INIT = "__init__"


def import_graph(folder: Path) -> dict[str, set[str]]:
    """Module name -> the package modules it imports, subpackages included: a module of a
    subpackage is ``sub.name``, the subpackage itself (its ``__init__``) ``sub``, the package
    itself ``__init__``. ``from . import name`` of a name that is not a module, and
    ``import flexsn_dsl``, import the package (or subpackage) itself."""
    paths = sorted(folder.rglob("*.py"))

    def node(path: Path) -> str:
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == INIT:
            parts = parts[:-1]
        return ".".join(parts) or INIT

    modules = {node(p) for p in paths}

    def known(dotted: str) -> str:
        """The longest module or subpackage that ``dotted`` (relative to the package) names."""
        parts = dotted.split(".") if dotted else []
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or INIT

    graph: dict[str, set[str]] = {}
    for path in paths:
        here = node(path)
        package = here.split(".")[:-1] if path.stem != INIT else ([] if here == INIT else here.split("."))
        edges: set[str] = set()
        for tree_node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(tree_node, ast.ImportFrom):
                if tree_node.level:
                    if tree_node.level - 1 > len(package):
                        continue  # above the package
                    base = package[:len(package) - (tree_node.level - 1)]
                elif tree_node.module and (tree_node.module == folder.name or
                                           tree_node.module.startswith(folder.name + ".")):
                    base, tree_node_module = [], tree_node.module[len(folder.name) + 1:]
                    edges |= _targets(known, base, tree_node_module, tree_node.names)
                    continue
                else:
                    continue
                edges |= _targets(known, base, tree_node.module or "", tree_node.names)
            elif isinstance(tree_node, ast.Import):
                for alias in tree_node.names:
                    if alias.name == folder.name or alias.name.startswith(folder.name + "."):
                        edges.add(known(alias.name[len(folder.name) + 1:]))
        graph[here] = edges - {here}
    return graph


def _targets(known, base: list[str], module: str, names) -> set[str]:
    """What ``from <base>.<module> import names`` imports: the module, or each name that is a module."""
    prefix = ".".join([*base, *([module] if module else [])])
    if module:
        return {known(prefix)}
    out = set()
    for alias in names:
        dotted = ".".join([*base, alias.name])
        found = known(dotted)
        out.add(found if found == dotted else known(prefix))
    return out


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
    assert {"triton_settings", "triton_plan", "triton_autograd", "triton_operators"} <= graph["triton_runtime"]
    assert "triton_launch" in graph["triton_plan"] and {"triton_plan", "triton_autograd"} <= graph["triton_recurrent"]
    assert {"nir.read", "nir.write", "nir.match", "nir.kinds"} <= graph["nir"] and "runtime" in graph["nir.read"]
    assert "nir.read" in graph["nir.write"] and "nir" in graph["cli"]
    assert {"model.build", "model.language", "model.neuron", "model.values"} <= graph["model"]
    assert {"model.context", "model.declarations", "model.equations", "model.steps"} <= graph["model.build"]
    assert "model.context" in graph["model.equations"] and "model" in graph["compiler"] and "model" in graph["nir.kinds"]
    assert "delays" in graph[INIT] and "delay_kernels" in graph["delay_passes"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# the Triton backend's modules in the order a call goes through them: each imports only modules before it
TRITON_LAYERS = ("triton_settings", "triton_launch", "triton_plan", "triton_autograd", "triton_operators",
                 "triton_runtime")


def test_the_triton_modules_import_only_the_stages_before_them():
    """Settings, launch, plan, eager passes, operators for torch.compile, entry: each module imports only those
    before it; the recurrent kernels' module (beside the operators) imports neither the operators nor the entry."""
    graph = import_graph(PACKAGE)
    for k, module in enumerate(TRITON_LAYERS):
        later = set(TRITON_LAYERS[k + 1:]) | {"triton_recurrent"}
        assert not graph[module] & later, f"{module} imports {sorted(graph[module] & later)}"
    assert not graph["triton_recurrent"] & {"triton_operators", "triton_runtime"}


# the delay layers, a stage beside the neurons': each imports only the package modules named here (the modules
# above their passes, which the compiled operators call too, above the kernels)
DELAY_LAYERS = {"delays": {"delay_operators", "delay_passes"}, "delay_operators": {"delay_passes"},
                "delay_passes": {"delay_kernels"}, "delay_kernels": {"triton_settings"}}


def test_the_delay_modules_import_only_their_kernels_and_the_settings():
    """The modules of DelayLinear and Delay do not go through the neurons' runtime or Triton plans."""
    graph = import_graph(PACKAGE)
    for module, allowed in DELAY_LAYERS.items():
        assert graph[module] <= allowed, f"{module} imports {sorted(graph[module] - allowed)}"


# the synapse specs, a stage beside the neurons': each imports only the package modules named here (the spec's
# model below the expressions and the printer; the module above them; none of them the neurons' runtime)
SYNAPSE_LAYERS = {"synapse": {"errors", "expressions", "model.context", "model.numbers", "source", "symbolic"},
                  "synapse_torch": {"literals", "printer", "symbolic", "synapse"},
                  "plastic_kernels": {"compiler", "interpreter", "literals", "printer", "symbolic", "synapse", "templates"},
                  "plastic": {"compiler", "errors", "plastic_kernels", "source", "synapse", "synapse_torch",
                              "triton_autograd", "triton_settings"}}


def test_the_synapse_modules_import_only_the_stages_below_them():
    graph = import_graph(PACKAGE)
    assert {"synapse"} <= graph["runtime"] and "plastic" in graph[INIT]
    for module, allowed in SYNAPSE_LAYERS.items():
        assert graph[module] <= allowed, f"{module} imports {sorted(graph[module] - allowed)}"


def test_the_cycle_finder_finds_cycles_of_every_kind(tmp_path):
    """Late imports, ``from . import``, the package itself: each closes a cycle the test reports."""
    variants = {
        "late import": {"a.py": "def f():\n    from .b import g\n", "b.py": "from .a import f\n"},
        "from-dot-import": {"a.py": "from . import b\n", "b.py": "from .c import x\n", "c.py": "import pkg.a\n"},
        "through the package": {INIT + ".py": "from .a import f\n", "a.py": "from . import __version__\n"},
        "absolute": {"a.py": "from pkg.b import g\n", "b.py": "import pkg\n", INIT + ".py": "from .a import f\n"},
        "through a subpackage": {"sub/__init__.py": "", "sub/a.py": "from .b import x\n",
                                 "sub/b.py": "from ..c import y\n", "c.py": "from .sub.a import z\n"},
        "a subpackage's own import": {"sub/__init__.py": "from .a import x\n", "sub/a.py": "from . import b\n",
                                      "sub/b.py": "from pkg.sub import x\n"},
    }
    for name, files in variants.items():
        folder = tmp_path / name.replace(" ", "_") / "pkg"
        folder.mkdir(parents=True)
        for file, text in files.items():
            (folder / file).parent.mkdir(parents=True, exist_ok=True)
            (folder / file).write_text(text)
        cycle = find_cycle(import_graph(folder))
        assert cycle is not None and cycle[0] == cycle[-1], name
    acyclic = tmp_path / "ok" / "pkg"
    acyclic.mkdir(parents=True)
    (acyclic / "a.py").write_text("from .b import g\nimport os\nfrom .. import up\n")
    (acyclic / "b.py").write_text("from .c import h\n")
    (acyclic / "c.py").write_text("import json\n")
    assert find_cycle(import_graph(acyclic)) is None
