"""``docs/arguments.md`` against the constructors: every keyword of every kernel has one row, and
every row names kernels that take it.

The page's tables have three columns: the argument(s) in backquotes, its meaning, and the kernels
that take it ("all (driver)" for the driver's options, "warmup" for the noise warmup's).
"""

import inspect
import pathlib
import re

import pytest
from kernel_registry import WRAPPERS, kernel_classes

from numpyro_sgd import SGKernel
from numpyro_sgd.adaptation.noise_warmup import WARMUP_DEFAULTS

PAGE = pathlib.Path(__file__).parents[1] / "docs" / "arguments.md"
KERNELS = kernel_classes() + list(WRAPPERS)
#: the kernels whose default steps come from the noise warmup: all but EWSGVR, whose steps are given
WARMED = [k for k in KERNELS if k not in WRAPPERS and k.__name__ != "EWSGVR"]


def _keywords(cls):
    return [p.name for p in inspect.signature(cls.__init__).parameters.values()
            if p.kind is p.KEYWORD_ONLY]


def _rows():
    """``{argument: kernels cell}`` of every table row whose first cell names arguments."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`(\w+)`", cells[0]):
            assert name not in rows, f"{name} has two rows in {PAGE.name}: one name, one meaning"
            rows[name] = cells[2]
    return rows


ROWS = _rows()


def _takes(cls, cell):
    if cell.startswith("all"):
        return "EWSG" not in cls.__name__ or "but the EWSG kernels" not in cell
    if cell == "warmup":
        return cls in WARMED
    return re.search(rf"\b{cls.__name__}\b", cell) is not None


@pytest.mark.parametrize("cls", KERNELS, ids=lambda c: c.__name__)
def test_every_keyword_has_a_row_naming_the_kernel(cls):
    missing = [k for k in _keywords(cls) if k not in ROWS or not _takes(cls, ROWS[k])]
    assert missing == [], f"{cls.__name__}: {missing} have no row of {PAGE.name} that names it"


def test_every_row_is_an_argument_of_the_kernels_it_names():
    driver = set(_keywords(SGKernel))
    wrong = []
    for name, cell in ROWS.items():
        if cell.startswith("all"):
            ok = name in driver
        elif cell == "warmup":
            ok = name in WARMUP_DEFAULTS
        else:
            named = [k for k in KERNELS if _takes(k, cell)]
            ok = bool(named) and all(name in _keywords(k) for k in named)
        if not ok:
            wrong.append(name)
    assert wrong == []


def test_the_warmup_options_are_taken_by_every_kernel_that_warms_up():
    """They are keyword arguments of the kernels with a noise warmup, given by the same name to
    each (popped from ``**kwargs``), and refused with a given step size."""
    assert set(WARMUP_DEFAULTS) == {k for k, v in ROWS.items() if v == "warmup"}
