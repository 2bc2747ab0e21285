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
exclude_patterns = ["_build", "benchmark_scaling_data"]

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
