"""The Python rules: import circles in the SDK, file size, module docstrings.

* No import circles between the modules of the `python/kvtier` package,
  subpackages included (`kvtier.vllm.worker` is a module; a package is its
  `__init__`). Every import statement counts wherever it stands, inside
  functions too: a lazy import that dodges a circle at load time is still a
  circle in the design. Counted forms: `import kvtier.x`, `from kvtier.x
  import y`, `from . import x`, `from .x import y`, `from .. import x`, and
  `importlib.import_module` with a literal name (relative names with
  `__name__` or `__package__` as the package). An import names the deepest
  module it reaches: `from kvtier import keys` is `kvtier.keys`, `from kvtier
  import Client` is `kvtier` (its `__init__`). Importing a submodule does not
  count as importing its parent packages.
  **Exempt**: imports under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`).
  They never run, so they cannot make a module see another half-initialised
  or hide a load-order dependency; they exist so an annotation can name a
  type, and mypy still checks them. Computed names (an f-string passed to
  `import_module`) cannot be followed and do not count.
* No Python file over MAX_LINES lines (the whole file) in python/ (the SDK and
  its tests), scripts/, perf/ and tests/.
* Every `python/kvtier` module opens with a docstring.

Generated code (`_gen/`), caches and hidden directories are skipped.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from architecture import MAX_LINES
from architecture.graph import cycles

#: Where the size rule looks, relative to the repository root.
SIZED_DIRS = ("python", "scripts", "perf", "tests")
#: The package whose modules must not import each other in a circle.
PACKAGE = Path("python") / "kvtier"
#: Directories never looked into: generated stubs, caches, build output.
SKIP_DIRS = {"_gen", "__pycache__", "build", "dist", "node_modules"}


def py_files(top: Path) -> Iterator[Path]:
    for path in sorted(top.rglob("*.py")):
        rel = path.relative_to(top).parts[:-1]
        if not any(p in SKIP_DIRS or p.startswith(".") or p.endswith(".egg-info") for p in rel):
            yield path


def module_name(package_dir: Path, path: Path) -> tuple[str, bool]:
    """(dotted name, whether it is a package's `__init__`) of a file in the package."""
    parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name the module imports (`a.b` for `from a import b`),
    relative imports made absolute, TYPE_CHECKING blocks left out."""
    package = module if is_package else module.rpartition(".")[0]

    def absolute(name: str, level: int) -> str:
        if level == 0:
            return name
        base = package
        for _ in range(level - 1):
            base = base.rpartition(".")[0]
        return f"{base}.{name}" if name else base

    def walk(node: ast.AST) -> Iterator[str]:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for stmt in node.orelse:
                yield from walk(stmt)
            return
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = absolute(node.module or "", node.level)
            yield from (f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call):
            found = literal_import(node)
            if found is not None:
                name, relative = found
                level = len(name) - len(name.lstrip("."))
                yield absolute(name.lstrip("."), level) if relative else name
        for child in ast.iter_child_nodes(node):
            yield from walk(child)

    yield from walk(tree)


def literal_import(call: ast.Call) -> tuple[str, bool] | None:
    """`import_module("a.b")` → ("a.b", False); `import_module(".b", __name__)`
    → (".b", True); None for anything else."""
    f = call.func
    named = (isinstance(f, ast.Name) and f.id == "import_module") or (
        isinstance(f, ast.Attribute) and f.attr == "import_module")
    if not named or not call.args or not isinstance(call.args[0], ast.Constant):
        return None
    name = call.args[0].value
    if not isinstance(name, str):
        return None
    if not name.startswith("."):
        return name, False
    anchor = call.args[1] if len(call.args) > 1 else None
    if isinstance(anchor, ast.Name) and anchor.id in ("__name__", "__package__"):
        return name, True
    return None


def resolve(name: str, modules: set[str]) -> str | None:
    """The deepest module of the package that a dotted name reaches (`a.b.C` → `a.b`)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def extension_modules(package_dir: Path) -> set[str]:
    """Modules with no Python source (`_native.abi3.so`, or its `_native.pyi`
    stub on a checkout where it is not built yet): leaves of the graph, so that
    `from . import _native` names them and not the package."""
    names = set()
    for pattern in ("*.pyi", "*.so", "*.pyd"):
        for path in package_dir.rglob(pattern):
            if not SKIP_DIRS.intersection(path.relative_to(package_dir).parts):
                stem = path.with_name(path.name.split(".", 1)[0] + ".py")
                names.add(module_name(package_dir, stem)[0])
    return names


def parse(package_dir: Path) -> tuple[dict[Path, ast.Module], dict[Path, str]]:
    """Every module of the package parsed, and why each that does not parse does not."""
    trees: dict[Path, ast.Module] = {}
    errors: dict[Path, str] = {}
    for path in py_files(package_dir):
        try:
            trees[path] = ast.parse(path.read_text(), str(path))
        except SyntaxError as e:
            errors[path] = f"{e.msg}, line {e.lineno}"
    return trees, errors


def import_graph(package_dir: Path, trees: dict[Path, ast.Module]) -> dict[str, set[str]]:
    named = {module_name(package_dir, path): tree for path, tree in trees.items()}
    modules = {name for name, _ in named} | extension_modules(package_dir)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for (name, is_package), tree in named.items():
        deps = {resolve(n, modules) for n in imported_names(tree, name, is_package)}
        graph[name] = {d for d in deps if d is not None and d != name}
    return graph


def check(root: Path) -> list[str]:
    problems = []
    package_dir = root / PACKAGE
    if package_dir.is_dir():
        trees, errors = parse(package_dir)
        problems += [f"{path.relative_to(root)}: does not parse ({why})" for path, why in errors.items()]
        for comp in cycles(import_graph(package_dir, trees)):
            problems.append(f"{PACKAGE}: modules import each other in a circle: {' -> '.join(comp)}")
        for path, tree in trees.items():
            if ast.get_docstring(tree) is None:
                problems.append(f"{path.relative_to(root)}: does not open with a docstring")
    for top in SIZED_DIRS:
        for path in py_files(root / top):
            n = path.read_text().count("\n")
            if n > MAX_LINES:
                problems.append(f"{path.relative_to(root)}: {n} lines (limit {MAX_LINES})")
    return problems
