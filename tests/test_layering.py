"""The package's modules import in one direction (issue 29, item 2).

Every module of ``numpyro_sgd`` is parsed with ``ast``; its imports of other package modules,
including those made inside functions, form a graph that must have no cycle and must follow the
layer order declared below (docs/internals.md, "Module layering"): a module imports only from
strictly lower layers.
"""

import ast
import importlib.metadata
import os
import pathlib
import subprocess
import sys

import numpyro_sgd

PACKAGE = pathlib.Path(numpyro_sgd.__file__).parent

#: the layers, lowest first; a module may import package modules of lower layers only
LAYERS = [
    # dense linear algebra that never runs batched (no package imports)
    {"linalg"},
    # leaves: no package imports but linalg
    {"validation", "noise", "theory", "schedules", "diffusions", "index_chain", "arviz_compat", "datasets",
     "protocol", "native", "replay", "programs", "progress"},
    # data read in place (uses the native row reader)
    {"streaming"},
    # the model's arguments as the kernels see them (array leaves, streamed rows, tracers)
    {"model_args", "basis"},
    # how minibatch rows are drawn: index draws and the minibatch-law policy
    {"indices"},
    # from a model to its sites and plates: the discovery trace, the plate handlers, the checks
    {"discovery"},
    # what a step may ask of the model: the minibatch oracle
    {"oracle"},
    # the subsampled potential (evaluation)
    {"potential"},
    # control-variate gradients about a centre (an oracle over the potential's oracle)
    {"control_variates"},
    # what the driver and the algorithms build on: sharded oracle, structure detection, the
    # pointwise log-likelihood, the warmup adapter
    {"sharding", "structure", "likelihood", "warmup"},
    # the driver's init-time checks; the Langevin steps shared by SGLD, SGHMC and EWSG
    {"checks", "langevin", "loop"},
    # the driver
    {"base"},
    # a kernel that runs another kernel's algorithm inside its own
    {"wrapper"},
    # the kernels and wrappers (none imports another)
    {"constant_sgd", "sgfs", "iasg", "santa", "sgld", "sghmc", "ewsg", "gibbs", "vem"},
    # reading runs: a run's draws and arguments; the end-of-run checks; comparison, ArviZ, plots
    {"export"},
    {"run_checks"},
    {"diagnostics"},
    {"loo"},
    {"__init__"},
]


def import_graph(package_dir):
    """``{module: {imported package module: first line}}``, counting imports inside functions."""
    modules = {p.stem for p in package_dir.glob("*.py")}
    graph = {}
    for path in sorted(package_dir.glob("*.py")):
        deps = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:  # from .x import y / from . import x
                    names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                elif node.level == 0 and node.module and node.module.split(".")[0] == "numpyro_sgd":
                    parts = node.module.split(".")
                    names = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1] for a in node.names
                         if a.name.startswith("numpyro_sgd.") and len(a.name.split(".")) > 1]
            for name in names:
                if name in modules and name != path.stem:
                    deps.setdefault(name, node.lineno)
        graph[path.stem] = deps
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


def layer_violations(graph):
    """``module:line imports module`` for every import that is not strictly downward."""
    layer = {m: i for i, group in enumerate(LAYERS) for m in group}
    return [f"{m}:{line} imports {d} (layer {layer[m]} -> {layer[d]})"
            for m, deps in graph.items() for d, line in deps.items() if layer[d] >= layer[m]]


def test_every_module_has_a_layer():
    declared = set().union(*LAYERS)
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules - declared == set(), "declare the new modules' layer in LAYERS and docs/internals.md"
    assert declared - modules == set()


def test_no_import_cycle():
    assert find_cycle(import_graph(PACKAGE)) is None


def test_imports_go_down_the_layers():
    assert layer_violations(import_graph(PACKAGE)) == []


def test_import_leaves_arviz_unimported():
    """``import numpyro_sgd`` in a fresh interpreter imports neither ArviZ nor its 1.x statistics
    package: ArviZ is imported on first use (``arviz_compat.arviz``), and the version switch
    ``arviz_compat.ARVIZ_1`` reads the installed distribution's version. Importing ``arviz_stats``
    to detect ArviZ 1.x had cost 1.8 of the 4.0 s of ``import numpyro_sgd`` (Python 3.12, ArviZ 1.3)."""
    code = ("import sys, numpyro_sgd\n"
            "from numpyro_sgd import arviz_compat\n"
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
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            package = isinstance(node, ast.ImportFrom) and (
                node.level == 1 or (node.module or "").split(".")[0] == "numpyro_sgd")
            if package:
                crossing += [f"{path.name}:{node.lineno} {a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert crossing == []


def test_no_module_is_a_house_of_its_own():
    """The driver stays thin and no module grows past what a reader takes in (issue 47)."""
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.glob("*.py")}
    assert sizes["base.py"] <= 500, sizes["base.py"]
    assert {name: n for name, n in sizes.items() if n > 700} == {}
