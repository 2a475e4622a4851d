"""The packages' import graph: no import circles, and no module reaching into another's private names.

Every module of ``perfutils`` and ``kernels`` is read as source (its AST; nothing is imported), and
every import it makes counts, wherever it stands: at the top, inside a function, relative or absolute.
A module imports another when it names it (``import a.b``, ``from a import b`` where ``b`` is a module)
or names a symbol of it (``from a.b import c``: an edge to ``a.b``). Two rules:

* no cycle among the packages' modules (a lazy import inside a function is still an edge: a cycle that
  only works because one side imports late is still a circle a reader has to untangle);
* no module uses a private name of another project module: neither ``from x import _name`` nor
  ``x._name`` on a module it imported. Dunder names (``__version__``, ``__file__``) are public; the
  tests, which may poke at internals, are not covered.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("perfutils", "kernels")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the packages (packages under their own name)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            modules[_module_name(path)] = path
    return modules


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Imports(ast.NodeVisitor):
    """Collects a module's imports (edges) and its uses of other modules' private names."""

    def __init__(self, name: str, is_package: bool, modules: dict[str, Path]) -> None:
        self.name = name
        self.package = name if is_package else name.rpartition(".")[0]
        self.modules = modules
        self.edges: set[str] = set()
        self.private: list[str] = []
        self.aliases: dict[str, str] = {}  # local name -> project module it is bound to

    def _absolute(self, module: str | None, level: int) -> str:
        if level == 0:
            return module or ""
        base = self.package.split(".")
        base = base[: len(base) - (level - 1)] if level > 1 else base
        return ".".join(base + ([module] if module else []))

    def _target(self, dotted: str) -> str | None:
        """The project module ``dotted`` names, or the nearest enclosing one (None: not ours)."""
        while dotted:
            if dotted in self.modules:
                return dotted
            dotted = dotted.rpartition(".")[0]
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            target = self._target(alias.name)
            if target is None:
                continue
            self.edges.add(target)
            if alias.asname:
                self.aliases[alias.asname] = target
            else:  # `import a.b.c` binds `a`; attribute chains are resolved in visit_Attribute
                top = alias.name.split(".")[0]
                if top in self.modules:
                    self.aliases[top] = top
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = self._absolute(node.module, node.level)
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            if submodule in self.modules:  # `from package import module`
                self.edges.add(submodule)
                self.aliases[alias.asname or alias.name] = submodule
                continue
            target = self._target(source)
            if target is None:
                continue
            self.edges.add(target)
            if _is_private(alias.name) and target != self.name:
                self.private.append(f"line {node.lineno}: from {source} import {alias.name}")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain, base = [node.attr], node.value
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id in self.aliases:
            dotted = self.aliases[base.id]
            for part in reversed(chain[1:]):  # walk down through submodules: perfutils.data.records._x
                if f"{dotted}.{part}" not in self.modules:
                    break
                dotted = f"{dotted}.{part}"
            else:
                if _is_private(node.attr) and dotted != self.name:
                    self.private.append(f"line {node.lineno}: {dotted}.{node.attr}")
        self.generic_visit(node)


def import_graph() -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """(module -> the project modules it imports, module -> its uses of other modules' private names)."""
    modules = project_modules()
    graph, private = {}, {}
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py", modules)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        graph[name] = visitor.edges - {name}
        if visitor.private:
            private[name] = visitor.private
    return graph, private


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_walk_sees_every_module_and_its_imports():
    graph, _ = import_graph()
    assert {"perfutils", "kernels", "perfutils.cli", "kernels.api"} <= set(graph)
    assert "kernels.problem" in graph["kernels.api"]  # a relative import is an edge


def test_no_import_cycles():
    graph, _ = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import circles (modules that import each other, directly or through others):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles)


def test_the_product_imports_nothing_of_the_lab():
    """kernels/ is the product: users take it alone, so no module of it may import perfutils (the lab depends on the
    product, never the reverse)."""
    graph, _ = import_graph()
    arrows = sorted(f"{module} -> {target}" for module, targets in graph.items() if module.split(".")[0] == "kernels"
                    for target in targets if target.split(".")[0] == "perfutils")
    assert not arrows, "the product imports the lab:\n" + "\n".join(arrows)


def test_the_product_holds_no_lab_kernels():
    """Teaching kernels, the #497 ablation family and micro-benchmarks live in perfutils.lab_kernels."""
    graph, _ = import_graph()
    lab = sorted(name for name in graph if name.split(".")[:2] in (["kernels", "teaching"], ["kernels", "case_study"],
                                                                   ["kernels", "microbench"]))
    assert not lab, f"lab kernels inside the product package: {lab}"
    assert {"perfutils.lab_kernels.teaching", "perfutils.lab_kernels.case_study",
            "perfutils.lab_kernels.microbench"} <= set(graph)


def test_figures_neither_compile_nor_import_kernels():
    """perfutils.plots draws DataFrames: no import of the product, the lab's kernels or the offline compiler."""
    graph, _ = import_graph()
    compiling = ("kernels", "perfutils.lab_kernels", "perfutils.model.offline_compile", "perfutils.model.offline_counts",
                 "perfutils.model.triton_compile", "perfutils.model.compile_worker")
    arrows = sorted(f"{module} -> {target}" for module, targets in graph.items()
                    if module.startswith("perfutils.plots") for target in targets
                    if any(target == root or target.startswith(root + ".") for root in compiling))
    assert not arrows, "figures that compile or import kernels:\n" + "\n".join(arrows)


def _arrows(graph: dict[str, set[str]], source: str, targets: tuple[str, ...]) -> list[str]:
    """Every import from a module of ``source`` (a room, by dotted prefix) into one of ``targets``."""
    inside = lambda module, root: module == root or module.startswith(root + ".")  # noqa: E731
    return sorted(f"{module} -> {target}" for module, imports in graph.items() if inside(module, source)
                  for target in imports if any(inside(target, root) for root in targets))


def test_measurement_draws_nothing():
    """perfutils.measure records data; figures and tables of it are perfutils.plots' (which may read measure's data
    files), never the reverse."""
    graph, _ = import_graph()
    arrows = sorted(f"{module} -> {target}" for module, targets in graph.items()
                    if module.startswith("perfutils.measure") for target in targets
                    if target.startswith("perfutils.plots"))
    assert not arrows, "measurement modules importing figures:\n" + "\n".join(arrows)


def test_figures_read_only_the_data_room():
    """perfutils.plots reads recorded files through perfutils.data: never the harness, the studies or the peers
    (a figure must draw on a laptop from data/, whatever the GPU side needs)."""
    arrows = _arrows(import_graph()[0], "perfutils.plots",
                     ("kernels", "perfutils.measure", "perfutils.studies", "perfutils.peers", "perfutils.lab_kernels"))
    assert not arrows, "figures importing more than the data room:\n" + "\n".join(arrows)


def test_no_room_imports_the_rooms_built_on_it():
    """The data room is under everything (the model included); the peers under the harness (measure), which runs them
    as variants; the harness under the studies; the studies under the pages: none of them imports a room built on
    it."""
    graph, _ = import_graph()
    above = {"perfutils.data": ("perfutils.measure", "perfutils.model", "perfutils.studies", "perfutils.peers",
                                "perfutils.plots", "perfutils.lab_kernels"),
             "perfutils.measure": ("perfutils.studies", "perfutils.plots"),
             "perfutils.peers": ("perfutils.measure", "perfutils.studies", "perfutils.plots"),
             "perfutils.studies": ("perfutils.plots",),
             "perfutils.model": ("perfutils.measure", "perfutils.studies", "perfutils.peers", "perfutils.plots")}
    arrows = [arrow for room, rooms in above.items() for arrow in _arrows(graph, room, rooms)]
    assert not arrows, "a room importing one above it:\n" + "\n".join(arrows)
    assert {"perfutils.data.schema", "perfutils.measure.timing", "perfutils.studies.case_497",
            "perfutils.peers.fast_llm"} <= set(graph)


def _room(module: str) -> str:
    """A module's room: ``perfutils.<room>`` for the lab's folders and top-level modules, ``kernels`` for the
    product."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "perfutils" and len(parts) > 1 else parts[0]


def test_no_circles_between_rooms():
    """Rooms as a whole import one way: two modules may avoid a circle while their rooms still import each other
    (data <-> model, measure <-> peers once did), and then neither room can be read without the other."""
    graph, _ = import_graph()
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(_room(module), set()).update(_room(target) for target in targets)
    rooms = {room: targets - {room} for room, targets in rooms.items()}
    cycles = find_cycles(rooms)
    assert not cycles, "rooms that import each other:\n" + "\n".join(" <-> ".join(cycle) for cycle in cycles)


def test_the_data_room_takes_from_the_product_only_the_gpu_folder_name():
    """The data room may import one thing of the product: ``kernels.device_names.gpu_slug``, the name of a GPU's
    folder. The product keys its tuning table and first-call cache by it and the lab its data files, so the two must
    agree; the product cannot import the lab, hence the lab takes the one definition from the product. That module
    imports nothing of the project, so the data room stays under everything else."""
    graph, _ = import_graph()
    arrows = _arrows(graph, "perfutils.data", ("kernels",))
    assert arrows == ["perfutils.data.schema -> kernels.device_names"], arrows
    assert graph["kernels.device_names"] == set()


def test_the_product_imports_and_runs_without_the_lab(tmp_path):
    """``import kernels`` and a call, in a process where perfutils cannot be imported at all."""
    import subprocess
    import sys

    code = ("import sys\n"
            "sys.modules['perfutils'] = None  # any import of perfutils now raises ImportError\n"
            "import torch, kernels\n"
            "loss, grad = kernels.entropy_loss_forward_backward(torch.randn(3, 17), torch.tensor([1, 5, 16]))\n"
            "x = torch.randn(3, 17, requires_grad=True)\n"
            "kernels.entropy_loss(x, torch.randn(3, 17), loss='reverse_kl', target_format='logits').backward()\n"
            "assert x.grad.shape == (3, 17) and grad.shape == (3, 17)\n"
            "print('ok', sorted(name for name in sys.modules if name.startswith('perfutils')))\n")
    env = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "ok ['perfutils']", result.stdout


def test_no_module_uses_another_modules_private_names():
    _, private = import_graph()
    assert not private, "private names used outside their module (give the shared piece a public name):\n" + "\n".join(
        f"{module}: {use}" for module, uses in sorted(private.items()) for use in uses)


def test_the_walk_sees_lazy_relative_and_private_uses():
    modules = {"pkg": Path("pkg/__init__.py"), "pkg.a": Path("pkg/a.py"), "pkg.b": Path("pkg/b.py"),
               "pkg.sub": Path("pkg/sub/__init__.py"), "pkg.sub.c": Path("pkg/sub/c.py")}
    source = (
        "from .b import _hidden, public\n"
        "import pkg.b as alias\n"
        "alias._state\n"
        "from . import b\n"
        "b._helper()\n"
        "import pkg.sub.c\n"
        "pkg.sub.c._x\n"
        "b.__name__\n"
        "def f():\n"
        "    from .sub.c import value\n"
    )
    visitor = _Imports("pkg.a", False, modules)
    visitor.visit(ast.parse(source))
    assert visitor.edges == {"pkg.b", "pkg.sub.c"}
    assert [use.split(": ", 1)[1] for use in visitor.private] == [
        "from pkg.b import _hidden", "pkg.b._state", "pkg.b._helper", "pkg.sub.c._x"]


@pytest.mark.parametrize("source, expected", [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_find_cycles_on_small_graphs(source, expected):
    assert find_cycles(source) == expected
