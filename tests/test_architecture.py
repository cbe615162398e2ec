"""The package's layers (docs/architecture.md): every import points down, none forms a cycle.

Imports are read from the source with `ast`, those inside functions and under
``TYPE_CHECKING`` included, so an import can't dodge a check by hiding. Nothing is imported.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Optional or slow-to-load libraries: `import dagtune` loads none of them, and a module that
#: loads one may be imported inside a function (docs/architecture.md, "Imports inside functions").
#: torch is one: training needs it, reading a store (`dagtune status`, `open_results`) does not.
HEAVY = frozenset(
    {"IPython", "bokeh", "dask", "dask_jobqueue", "distributed", "optuna", "ray", "tornado", "torch", "zarr"}
)


@dataclass(frozen=True)
class Import:
    """One import statement's tie to a module of the tree."""

    source: str  # the importing module (dotted)
    target: str  # the imported module (dotted)
    names: tuple[str, ...]  # the names taken from it (empty for ``import x``)
    line: int
    in_function: bool
    type_only: bool  # under ``if TYPE_CHECKING:``
    commented: bool  # a comment on its line, or on the line above


@dataclass
class Module:
    name: str
    path: Path
    imports: list[Import]
    heavy: set[str]  # HEAVY libraries it imports itself, at module level
    lazy: bool  # a lazy face (PEP 562): its names' modules load on first use, not with it


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class _Reader(ast.NodeVisitor):
    def __init__(self, name: str, is_package: bool, known: set[str], lines: list[str], top: str):
        self.name, self.is_package, self.known, self.lines, self.top = name, is_package, known, lines, top
        self.functions = self.type_checking = 0
        self.imports: list[Import] = []
        self.heavy: set[str] = set()
        self.lazy = False

    def _in_function(self, node: ast.AST) -> None:
        self.functions += 1
        self.generic_visit(node)
        self.functions -= 1

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.lazy = self.lazy or (node.name == "__getattr__" and not self.functions)
        self._in_function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._in_function(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._in_function(node)

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            self.type_checking += 1
            for statement in node.body:
                self.visit(statement)
            self.type_checking -= 1
            for statement in node.orelse:
                self.visit(statement)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._found(node, alias.name, ())

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.name.split(".") if self.is_package else self.name.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            module = ".".join([*base, node.module] if node.module else base)
        else:
            module = node.module or ""
        names = tuple(alias.name for alias in node.names)
        submodules = [name for name in names if f"{module}.{name}" in self.known]
        if len(submodules) < len(names):  # names defined by the module itself
            self._found(node, module, names)
        for name in submodules:  # ``from package import submodule`` imports the submodule
            self._found(node, f"{module}.{name}", ())

    def _found(self, node: ast.stmt, module: str, names: tuple[str, ...]) -> None:
        lazy = self.functions > 0
        if module.split(".")[0] != self.top:
            if module.split(".")[0] in HEAVY and not lazy and not self.type_checking:
                self.heavy.add(module.split(".")[0])
            return
        around = self.lines[node.lineno - 1] + (self.lines[node.lineno - 2] if node.lineno > 1 else "")
        self.imports.append(
            Import(self.name, module, names, node.lineno, lazy, self.type_checking > 0, "#" in around)
        )


def read_tree(top: str) -> dict[str, Module]:
    """Every module of the package `top` (a folder of the repository) and what it imports."""
    root = ROOT
    paths = sorted((root / top).rglob("*.py"))
    known = {module_name(p, root) for p in paths}
    modules = {}
    for path in paths:
        name = module_name(path, root)
        text = path.read_text()
        reader = _Reader(name, path.name == "__init__.py", known, text.splitlines(), top)
        reader.visit(ast.parse(text, str(path)))
        modules[name] = Module(name, path, reader.imports, reader.heavy, reader.lazy)
    return modules


def defining(i: Import, modules: dict[str, Module]) -> list[str]:
    """The modules import `i` loads: the one it names, or, for names taken from a lazy face,
    the modules the face's ``TYPE_CHECKING`` imports take those names from."""
    face = modules.get(i.target)
    if face is None or not face.lazy or not i.names:
        return [i.target]
    return sorted({t.target for t in face.imports if t.type_only and set(t.names) & set(i.names)})


def loads(modules: dict[str, Module]) -> dict[str, set[str]]:
    """The HEAVY libraries importing each module loads: its own, its packages' and those of
    every module it imports at module level (through a lazy face: the modules of the names
    taken from it)."""
    loaded = {name: set(module.heavy) for name, module in modules.items()}
    changed = True
    while changed:
        changed = False
        for name, module in modules.items():
            before = len(loaded[name])
            parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
            for other in [
                *parents,
                *(
                    t
                    for i in module.imports
                    if not i.in_function and not i.type_only
                    for t in defining(i, modules)
                ),
            ]:
                loaded[name] |= loaded.get(other, set())
            changed = changed or len(loaded[name]) != before
    return loaded


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module, or a module
    importing itself), each as a list of modules."""
    edges = {
        name: sorted({i.target for i in m.imports if i.target in modules}) for name, m in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(name: str) -> None:  # Tarjan's algorithm
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in edges[name]:
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == name:
                    break
            if len(component) > 1 or name in edges[name]:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(modules)))
    try:
        for name in sorted(edges):
            if name not in index:
                visit(name)
    finally:
        sys.setrecursionlimit(limit)
    return found


def declared_layers() -> list[tuple[str, list[str]]]:
    """The layers of docs/architecture.md, bottom first: ``(name, [module or package, ...])``."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    layers = []
    for line in block.group(1).splitlines():
        if line.strip():
            name, *members = line.split()
            layers.append((name, members))
    return layers


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The index of the layer `module` (dotted, under dagtune) belongs to."""
    key = "__init__" if module == "dagtune" else module.split(".")[1]
    return next((i for i, (_, members) in enumerate(layers) if key in members), None)


def where(i: Import, modules: dict[str, Module]) -> str:
    return f"{modules[i.source].path.relative_to(ROOT)}:{i.line}"


def internal_imports(modules: dict[str, Module]) -> Iterator[Import]:
    for module in modules.values():
        yield from (i for i in module.imports if i.target in modules)


# --------------------------------------------------------------------------- the tests


def test_every_module_is_in_exactly_one_layer():
    layers = declared_layers()
    members = [m for _, names in layers for m in names]
    assert len(members) == len(set(members)), "a name is in two layers"
    unplaced = sorted(name for name in read_tree("dagtune") if layer_of(name, layers) is None)
    assert not unplaced, f"modules in no layer of docs/architecture.md: {unplaced}"


def test_no_import_points_up_the_layers():
    layers = declared_layers()
    modules = read_tree("dagtune")
    upward = [
        f"{where(i, modules)}: {i.source} ({layers[a][0]}) imports {i.target} ({layers[b][0]})"
        for i in internal_imports(modules)
        if (a := layer_of(i.source, layers)) is not None
        and (b := layer_of(i.target, layers)) is not None
        and b > a
    ]
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


def test_no_import_cycle_in_the_package():
    found = cycles(read_tree("dagtune"))
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_no_import_cycle_in_the_benchmarks():
    found = cycles(read_tree("perf"))
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_no_private_name_and_no_private_module_is_imported_across_modules():
    modules = read_tree("dagtune")
    wrong = []
    for i in internal_imports(modules):
        private = [n for n in i.names if n.startswith("_") and not n.startswith("__")]
        if private:
            wrong.append(f"{where(i, modules)}: {i.source} imports {private} from {i.target}")
        parts = i.target.split(".")
        hidden = next((k for k, part in enumerate(parts) if part.startswith("_")), None)
        if hidden is not None:
            package = ".".join(parts[:hidden])
            if i.source != package and not i.source.startswith(package + "."):
                wrong.append(f"{where(i, modules)}: {i.source} imports {i.target}, private to {package}")
    assert not wrong, "\n".join(wrong)


def test_an_import_inside_a_function_loads_a_heavy_library_and_says_so():
    """Inside a function, a dagtune import is one of a module that loads a HEAVY library the
    importing module does not load already, with a comment; anything else belongs at the top
    of the module (where the layer and cycle checks see it, as they see this one)."""
    modules = read_tree("dagtune")
    loaded = loads(modules)
    wrong = []
    for i in internal_imports(modules):
        if not i.in_function:
            continue
        gained = set().union(*(loaded[t] for t in defining(i, modules))) - loaded[i.source]
        if not gained:
            wrong.append(
                f"{where(i, modules)}: {i.target} loads nothing heavy {i.source} lacks: import it at the top"
            )
        elif not i.commented:
            wrong.append(f"{where(i, modules)}: say why {i.target} is imported here ({sorted(gained)})")
    assert not wrong, "\n".join(wrong)


def test_importing_dagtune_loads_no_heavy_library():
    loaded = loads(read_tree("dagtune"))["dagtune"]
    assert not loaded, f"import dagtune loads {sorted(loaded)}"


def test_the_modules_that_read_a_store_load_no_torch():
    """The command line (status, tree, gc, the page), `open_results` and the study index read
    storage without training: torch loads only where a model is trained or restored
    (tests/test_lazy_imports.py checks the same in a fresh interpreter)."""
    loaded = loads(read_tree("dagtune"))
    readers = [
        "dagtune.cli",
        "dagtune.results",
        "dagtune.study_index",
        "dagtune.catalog",
        "dagtune.dashboard",
    ]
    wrong = [name for name in readers if "torch" in loaded[name]]
    assert not wrong, f"these load torch: {wrong}"


def test_the_readme_layout_lists_the_layers_and_their_modules():
    """README's Layout names the layers in order, each with its modules as they are in the
    tree (a name reserved in the layer list but not in the tree yet is left out)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1]
    block = section.split("```", 2)[1]
    shown: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if re.match(r"^  \S", line):
            shown.append((line.strip(), []))
        elif re.match(r"^    \S+(\.py|/)(\s|$)", line) and shown:
            shown[-1][1].append(line.split()[0].removesuffix(".py").removesuffix("/"))
    present = {p.stem if p.suffix else p.name for p in (ROOT / "dagtune").iterdir()}
    expected = [(name, [m for m in members if m in present]) for name, members in declared_layers()]
    assert shown == expected


#: the most methods a class of the package may define (properties and dunders count): a class
#: with more holds several jobs (issue 23: the coordinator had 37 before it was split)
MAX_METHODS = 25


def methods_per_class() -> dict[str, int]:
    """``module.Class`` -> how many functions its body defines, for every class of dagtune/."""
    counts = {}
    for name, module in read_tree("dagtune").items():
        for node in ast.walk(ast.parse(module.path.read_text())):
            if isinstance(node, ast.ClassDef):
                defined = [f for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
                counts[f"{name}.{node.name}"] = len(defined)
    return counts


def test_no_class_has_more_than_25_methods():
    counts = methods_per_class()
    assert counts, "no class found: the count reads nothing"
    over = {name: n for name, n in counts.items() if n > MAX_METHODS}
    assert not over, f"classes over {MAX_METHODS} methods (split them): {over}"
    assert counts["dagtune.coordinator._coordinator.Coordinator"] <= MAX_METHODS


def test_every_document_the_package_cites_exists():
    """A ``*.md`` path named in dagtune's code or docstrings (``docs/DESIGN.md``,
    ``docs/fusion.md``, ...) is a file of the repository, from its root."""
    cited = {
        (path.relative_to(ROOT), name)
        for path in sorted((ROOT / "dagtune").rglob("*.py"))
        for name in re.findall(r"[\w./-]+\.md\b", path.read_text())
    }
    assert cited, "no document cited: the pattern no longer finds citations"
    missing = sorted(f"{where}: {name}" for where, name in cited if not (ROOT / name).is_file())
    assert not missing, "cited documents that are not in the repository:\n" + "\n".join(missing)


# --------------------------------------------------------------------------- private attributes

#: the builtins that name an attribute by a string: ``getattr(x, "_name")`` is ``x._name``
_BY_NAME = frozenset({"getattr", "hasattr", "setattr", "delattr"})


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own(node: ast.expr) -> bool:
    """`self` or `cls`: a class reaching its own attributes."""
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _string(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


@dataclass(frozen=True)
class Access:
    """``x._name`` (or ``getattr(x, "_name")``) in a module, with `x` not self or cls."""

    module: str
    name: str
    line: int
    text: str


def private_attributes(path: Path, module: str) -> tuple[set[str], list[Access]]:
    """The private names `module` defines (functions, classes, names it assigns, attributes
    it sets on self or cls) and its accesses to private attributes of other objects."""
    defined: set[str] = set()
    accesses: list[Access] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            if _own(node.value):
                if isinstance(node.ctx, ast.Store):
                    defined.add(node.attr)
            else:
                accesses.append(Access(module, node.attr, node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            function = ast.unparse(node.func)
            name = _string(node.args[1])
            if name is None or not _private(name):
                continue
            if function in _BY_NAME or function == "object.__setattr__":
                if _own(node.args[0]):
                    if function in ("setattr", "object.__setattr__"):
                        defined.add(name)
                else:
                    accesses.append(Access(module, name, node.lineno, ast.unparse(node)))
    return {name for name in defined if _private(name)}, accesses


def privacy_scope(module: str) -> str:
    """What a private name is private to: its package for a module inside a package of
    dagtune (``dagtune.fusion._state`` -> ``dagtune.fusion``), else its module."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_private_attribute_is_read_across_modules():
    """A private attribute (``_name``) one module defines is read or written only where it
    is private to: its module, or the package its module is in, as a private module is.
    Another module uses what the class shows in public (`Study.view()` for the views: the
    study's trials, report, running spans and critical path as a frozen read model).

    The check reads names, not types: an access ``x._name`` (``x`` not self or cls) fails
    when ``_name`` is defined by a module of another scope and by none of the accessing
    one's. Private attributes of other libraries (``sys._getframe``) are not dagtune's."""
    modules = read_tree("dagtune")
    defined: dict[str, set[str]] = {}  # private name -> the scopes that define it
    accesses: list[Access] = []
    for name, module in modules.items():
        names, found = private_attributes(module.path, name)
        for private in names:
            defined.setdefault(private, set()).add(privacy_scope(name))
        accesses += found
    assert accesses and "dagtune.study" in defined["_lock"], "the check reads nothing"
    wrong = [
        f"{modules[a.module].path.relative_to(ROOT)}:{a.line}: {a.text} (private to {sorted(defined[a.name])})"
        for a in accesses
        if a.name in defined and privacy_scope(a.module) not in defined[a.name]
    ]
    assert not wrong, "private attributes read across modules:\n" + "\n".join(wrong)


def test_the_private_attribute_check_finds_a_read_across_modules(tmp_path):
    """The check above fails on the kind of read the views used to make."""
    owner = tmp_path / "owner.py"
    owner.write_text("class Study:\n    def __init__(self):\n        self._lock = None\n")
    reader = tmp_path / "reader.py"
    reader.write_text(
        "def show(study):\n    with study._lock:\n        return getattr(study, '_closed', False)\n"
    )
    owned, _ = private_attributes(owner, "dagtune.owner")
    _, read = private_attributes(reader, "dagtune.reader")
    assert "_lock" in owned
    assert [(a.name, a.line) for a in read] == [("_lock", 2), ("_closed", 3)]
    assert privacy_scope("dagtune.owner") != privacy_scope("dagtune.reader")
    assert privacy_scope("dagtune.fusion._state") == privacy_scope("dagtune.fusion._group")
