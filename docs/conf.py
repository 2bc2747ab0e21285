"""Sphinx configuration of the numpyro_sgd documentation site.

Build (what ``.ci/run`` does, warnings as errors)::

    sphinx-build -W -n --keep-going -b html docs docs/_build/html

The Markdown pages are read by myst-parser; the API reference is generated from the docstrings
(reST field lists, ``:param type name:``), so no napoleon.
"""

import numpyro_sgd

project = "numpyro_sgd"
author = "numpyro_sgd contributors"
copyright = "2026, numpyro_sgd contributors"
release = version = numpyro_sgd.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# the API page's hundreds of objects stay out of the navigation tree (it is rebuilt for every page)
toc_object_entries = False
exclude_patterns = ["_build", "results/benchmark_scaling_data"]

# MyST: $...$ / $$...$$ maths, anchors for "#section" links, tables and definition lists
myst_enable_extensions = ["dollarmath", "amsmath", "deflist", "colon_fence"]
myst_heading_anchors = 3

# autodoc: signatures as written, members in source order, no type hints in signatures
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"members": True}

# nitpicky (-n) resolves every reference inside this package. Types of other libraries that have
# no inventory here (no network in CI: no intersphinx) are listed, and only those.
nitpick_ignore_regex = [
    (r"py:(class|obj|func|meth|attr|mod|data|exc)",
     r"(jax|jnp|numpyro|optax|arviz|az|np|numpy|pandas|pd|scipy|matplotlib|pathlib)(\..*)?"),
    (r"py:(class|obj)", r"(NamedTuple|callable|array|array_like|ndarray|pytree|optional|tuple of .*|dict of .*|"
                        r"list of .*|sequence|Sequence|Mapping|Callable|PRNGKey|key|MCMC|MCMCKernel|"
                        r"InferenceData|DataTree|DataFrame|Mesh|Array|ArrayLike|ScalarOrSchedule|"
                        r"GradientTransformation|Distribution|TransformedDistribution|Reparam|"
                        r"LocScaleReparam|HMCGibbs|NUTS|Path|PathLike|os.PathLike)"),
]

html_theme = "furo"
html_title = f"numpyro_sgd {release}"
html_static_path = []

#: results pages that lived at the top of docs/ before they moved under results/ (issue 47): each
#: old address gets a page that forwards to the new one, so links to the old pages keep working
MOVED_TO_RESULTS = [
    "benchmark_scaling", "benchmark_scaling_1e5", "benchmark_scaling_1e6", "benchmark_scaling_1e7",
    "benchmark_step", "empirical_bayes_results", "empirical_bayes_60k_results",
    "empirical_bayes_diagnostics_results", "empirical_bayes_pool2_results", "empirical_bayes_pool2_60k_results",
    "ewsg_gaussian", "ewsg_logistic_skin", "examples_and_benchmarks", "hierarchical", "iasg_results",
    "loo_large_n", "posteriordb_results", "quickstart_compare", "santa_nonconvex_results", "table1_results",
]

_FORWARD = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Moved: {name}</title>
<link rel="canonical" href="results/{name}.html"><meta http-equiv="refresh" content="0; url=results/{name}.html">
</head><body><p>This page moved to <a href="results/{name}.html">results/{name}</a>.</p></body></html>
"""


def _write_forwards(app, exception):
    """After an HTML build, one forwarding page per old address in :data:`MOVED_TO_RESULTS`."""
    if exception is not None or app.builder.format != "html":
        return
    import os

    for name in MOVED_TO_RESULTS:
        with open(os.path.join(app.outdir, f"{name}.html"), "w", encoding="utf-8") as f:
            f.write(_FORWARD.format(name=name))


def setup(app):
    app.connect("build-finished", _write_forwards)
