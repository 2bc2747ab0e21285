"""The documentation (issue 28): every link in README.md and docs/ resolves inside the repository,
nothing points at a folder users do not have, the API reference covers every public name, and the
units table covers every kernel. The site itself is built by ``.ci/run`` (``sphinx-build -W -n``)."""

import re
from pathlib import Path

import pytest

import numpyro_sgd

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [p for p in PAGES if "_build" not in p.parts]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _local_links(page):
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # external (http:, https:, mailto:) or an anchor on the same page
        yield target.split("#")[0]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_local_link_resolves_inside_the_repository(page):
    broken = []
    for target in _local_links(page):
        path = (page.parent / target).resolve()
        if not path.exists() or ROOT not in path.parents and path != ROOT:
            broken.append(target)
    assert broken == []


SCRIPTS = sorted((ROOT / "examples").glob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("page", PAGES + SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_or_example_sends_users_to_the_development_data_folder(page):
    assert "../shared" not in page.read_text(encoding="utf-8")


def test_the_api_reference_documents_every_public_name():
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"\.\. auto(?:class|function):: numpyro_sgd\.(\w+)$", api, re.M))
    assert sorted(set(numpyro_sgd.__all__) - documented) == []


def test_every_page_is_in_the_site():
    """A Markdown page under docs/ that no toctree lists is a Sphinx warning (an error in CI); this
    says which, without building."""
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    entries = set(re.findall(r"^([\w/]+)$", index, re.M))
    pages = {str(p.relative_to(ROOT / "docs").with_suffix("")) for p in PAGES if p.parent != ROOT}
    assert sorted(pages - entries - {"index"}) == []


def test_the_units_table_names_every_kernel():
    text = (ROOT / "docs" / "arguments.md").read_text(encoding="utf-8")
    table = text[text.index("## Units of `step_size`"):]
    kernels = ["ConstantSGD", "SGFS", "IASG", "SGLD", "PSGLD", "SGHMC", "EWSG", "OverdampedEWSG", "EWSGVR",
               "Santa", "VariationalEM"]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert [k for k in kernels if not any(re.search(rf"\b{k}\b", row.split("|")[1]) for row in rows)] == []


def test_the_readme_quick_start_runs_as_written(capsys):
    """The README's first code block, executed as written (its own simulated data, N = 10⁵, D = 3,
    σ = 0.8): it runs, ``check_run`` does not warn, it prints each site's mean and sd with digits
    that mean something (the posterior sds are about σ/√N = 0.0025), and its draws of w sit within
    5 posterior sds of the truth."""
    import warnings

    import numpy as np

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        exec(compile(code, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    sds = [float(x) for line in out.splitlines() if " sd " in line
           for x in re.findall(r"\d\.\d+", line.split(" sd ")[1])]
    assert "sigma mean" in out and "w mean" in out and len(sds) == 4 and min(sds) > 0, out
    w = np.asarray(namespace["mcmc"].get_samples()["w"])
    assert w.shape == (2000, 3)
    assert np.all(np.abs(w.mean(0) - np.array([0.5, -1.0, 2.0])) < 5 * w.std(0))


def test_the_package_names_only_pages_and_readme_sections_that_exist():
    """Every ``docs/...md`` (or ``.png``) a module, example or benchmark mentions exists, and every
    README section a module cites (README, "Section" / the README's "Section") is a heading of it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^#+ (.+?)\s*$", readme, re.M))
    sources = [*sorted((ROOT / "numpyro_sgd").rglob("*.py")), *sorted((ROOT / "examples").glob("*.py")),
               *sorted((ROOT / "benchmarks").glob("*.py")), ROOT / "README.md"]
    missing, sections = [], []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        # a command's output path (--doc docs/x.md) and a NAME placeholder are not mentions of a page
        for page in re.findall(r"(?<!--doc )docs/[\w/.-]+?\.(?:md|png)\b", text):
            if "NAME" not in page and not (ROOT / page).exists():
                missing.append(f"{path.name}: {page}")
        for section in re.findall(r"README(?:'s)?,? \"([^\"]+)\"", text):
            if section not in headings:
                sections.append(f"{path.name}: README \"{section}\"")
    assert missing == [] and sections == []


def test_results_live_under_results_and_old_addresses_forward():
    """No results page or image at the top of docs/ (the guide's pages only); every page that moved
    under docs/results/ is there, and the site writes a forwarding page at its old address."""
    import ast

    conf = (ROOT / "docs" / "conf.py").read_text(encoding="utf-8")
    moved = ast.literal_eval(re.search(r"MOVED_TO_RESULTS = (\[.*?\])", conf, re.S).group(1))
    assert [m for m in moved if not (ROOT / "docs" / "results" / f"{m}.md").exists()] == []
    assert [m for m in moved if (ROOT / "docs" / f"{m}.md").exists()] == []
    assert sorted(p.name for p in (ROOT / "docs").glob("*.png")) == []
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    results = index[index.index(":caption: Results"):]
    results = results[:results.index("```")]
    entries = re.findall(r"^([\w/]+)$", results, re.M)
    assert entries and [e for e in entries if not e.startswith("results/")] == []
