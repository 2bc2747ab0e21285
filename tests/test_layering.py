"""The package's folders import in one direction, and its modules stay readable.

Every module of ``numpyro_sgd`` is parsed with ``ast``; its imports of other package modules,
including those made inside functions, form a graph that must have no cycle. Each module belongs to
a folder (the top-level modules to the bottom or the top), and the folders are ordered: a module
imports only from its own folder or from lower ones (docs/internals.md, "Layout"). A new module in
an existing folder needs no declaration here.
"""

import ast
import importlib.metadata
import os
import pathlib
import subprocess
import sys

import numpyro_sgd

PACKAGE = pathlib.Path(numpyro_sgd.__file__).parent

#: the folders, lowest first; "" holds the top-level modules below every folder, and
#: "__init__" the package's public names, above them all
FOLDERS = ["", "numerics", "data", "minibatch", "model", "adaptation", "driver", "kernels", "diagnostics",
           "__init__"]
#: top-level modules (folder "") and the package's __init__
TOP = {"protocol", "validation", "datasets"}


def module_name(path):
    """``numerics.noise`` for numpyro_sgd/numerics/noise.py; ``__init__`` for the package's."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts)


def folder_of(module):
    if module == "__init__":
        return "__init__"
    return module.split(".")[0] if "." in module else ""


def modules(package_dir=PACKAGE):
    return {module_name(p): p for p in package_dir.rglob("*.py") if p.name != "__init__.py"} | {
        "__init__": package_dir / "__init__.py"}


def resolve(importer, level, module):
    """The package module an ``ImportFrom`` names (None outside the package)."""
    if level == 0:
        if not module or module.split(".")[0] != "numpyro_sgd":
            return None
        return ".".join(module.split(".")[1:]) or ""
    base = importer.split(".")[:-1] if importer != "__init__" else []
    base = base[: len(base) - (level - 1)]
    return ".".join(base + (module.split(".") if module else []))


def import_graph(package_dir=PACKAGE):
    """``{module: {imported package module: first line}}``, counting imports inside functions."""
    known = modules(package_dir)
    graph = {}
    for name, path in sorted(known.items()):
        deps = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                target = resolve(name, node.level, node.module)
                if target is None:
                    continue
                for alias in node.names:  # from .x import y: y may be a module of package x
                    sub = f"{target}.{alias.name}" if target else alias.name
                    targets.append(sub if sub in known else target)
            elif isinstance(node, ast.Import):
                targets = [".".join(a.name.split(".")[1:]) for a in node.names
                           if a.name.split(".")[0] == "numpyro_sgd" and "." in a.name]
            for t in targets:
                if t in known and t != name:
                    deps.setdefault(t, node.lineno)
        graph[name] = deps
    return graph


def find_cycle(graph):
    """A list of modules forming an import cycle, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in graph.get(m, {}):
            if state.get(d) == "open":
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def folder_violations(graph):
    """``module:line imports module`` for every import into a higher folder."""
    rank = {f: i for i, f in enumerate(FOLDERS)}
    return [f"{m}:{line} imports {d} (folder {folder_of(m)!r} -> {folder_of(d)!r})"
            for m, deps in graph.items() for d, line in deps.items() if rank[folder_of(d)] > rank[folder_of(m)]]


def test_every_module_is_in_a_known_folder():
    """The folders are the ones ordered above, and the top level holds only the named modules."""
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(FOLDERS) - {"", "__init__"}
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert top == TOP


def test_no_import_cycle():
    assert find_cycle(import_graph()) is None


def test_imports_go_down_the_folders():
    assert folder_violations(import_graph()) == []


def test_the_checks_see_a_violation_and_a_cycle():
    """The two checks above can fail: an upward import and a cycle are found."""
    graph = {"numerics.noise": {"kernels.sgld": 3}, "kernels.sgld": {"numerics.noise": 1}}
    assert folder_violations(graph) == ["numerics.noise:3 imports kernels.sgld (folder 'numerics' -> 'kernels')"]
    assert find_cycle(graph) == ["kernels.sgld", "numerics.noise", "kernels.sgld"]


def test_no_folder_is_a_crowd_and_no_module_a_house_of_its_own():
    """At most 12 modules a folder, at most 600 lines a module, the driver's kernel at most 500."""
    crowded = {p.name: n for p in PACKAGE.iterdir() if p.is_dir()
               if (n := len([m for m in p.glob("*.py") if m.name != "__init__.py"])) > 12}
    assert crowded == {}
    sizes = {module_name(p): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")}
    assert sizes["driver.kernel"] <= 500, sizes["driver.kernel"]
    assert {name: n for name, n in sizes.items() if n > 600} == {}


def test_subpackages_re_export_nothing():
    """Inside the package a name is imported from the module that defines it: a folder's
    ``__init__`` holds its docstring only."""
    for init in PACKAGE.glob("*/__init__.py"):
        body = ast.parse(init.read_text(encoding="utf-8")).body
        assert all(isinstance(node, ast.Expr) for node in body), init


def test_import_leaves_arviz_unimported():
    """``import numpyro_sgd`` in a fresh interpreter imports neither ArviZ nor its 1.x statistics
    package: ArviZ is imported on first use (``arviz_compat.arviz``), and the version switch
    ``arviz_compat.ARVIZ_1`` reads the installed distribution's version. Importing ``arviz_stats``
    to detect ArviZ 1.x had cost 1.8 of the 4.0 s of ``import numpyro_sgd`` (Python 3.12, ArviZ 1.3)."""
    code = ("import sys, numpyro_sgd\n"
            "from numpyro_sgd.diagnostics import arviz_compat\n"
            "print(arviz_compat.ARVIZ_1, sorted(m for m in sys.modules if m.split('.')[0] in ('arviz', 'arviz_stats')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    flag, modules = out.stdout.strip().split(" ", 1)
    assert modules == "[]", f"import numpyro_sgd imported {modules}"
    try:
        import arviz_stats  # noqa: F401
        installed_1 = int(importlib.metadata.version("arviz").split(".")[0]) >= 1
    except ImportError:
        installed_1 = False
    assert flag == str(installed_1)


def test_no_underscore_name_crosses_a_module_border():
    """What two modules of the package share is public: no ``from .x import _name``."""
    crossing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            package = isinstance(node, ast.ImportFrom) and (
                node.level >= 1 or (node.module or "").split(".")[0] == "numpyro_sgd")
            if package:
                crossing += [f"{path.name}:{node.lineno} {a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert crossing == []
