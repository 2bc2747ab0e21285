"""The package's only contact with ArviZ's API, for ArviZ 0.23 (Python 3.11) and 1.x (Python >= 3.12).

ArviZ 1.x split into ``arviz_base`` (data), ``arviz_stats`` (statistics) and ``arviz_plots``, and
changed four things this package uses:

* ``from_dict`` takes one dict of groups (0.23: one keyword per group);
* the groups of a ``DataTree`` are a property holding paths (0.23: ``InferenceData.groups()``);
* Pareto smoothing is ``arviz_stats``' ``psislw``, which takes the log-likelihood and negates it
  (0.23: ``arviz.psislw`` takes the log importance ratios);
* ``loo`` returns ``elpd``/``p``/``elpd_i`` (0.23: ``elpd_loo``/``p_loo``/``loo_i``).

The two versions' PSIS are not the same algorithm: 1.x takes ⌊3√(S/r_eff)⌋ tail draws
(⌊S/5⌋ when S·r_eff <= 225) where 0.23 takes ⌈min(S/5, 3√(S/r_eff))⌉, so Pareto k and the
smoothed weights differ in the tail. :func:`psislw` returns what the *installed* ArviZ computes,
so this package's LOO agrees with ``arviz.loo`` of the same environment.
"""

from __future__ import annotations

import importlib.util
import inspect
from importlib import metadata
from typing import NamedTuple

import numpy as np

__all__ = ["ARVIZ_1", "LooResult", "arviz", "ess", "from_dict", "group_names", "loo", "psislw"]


def arviz():
    """The ``arviz`` module, imported on first use (importing it costs about a second)."""
    import arviz as az

    return az


def _is_arviz_1() -> bool:
    """Read from the installed distribution's version, without importing ArviZ: importing
    ``arviz_stats`` to find out cost 1.8 s of every ``import numpyro_sgd`` (Python 3.12, ArviZ 1.3)."""
    try:
        return int(metadata.version("arviz").split(".")[0]) >= 1
    except (metadata.PackageNotFoundError, ValueError):
        return importlib.util.find_spec("arviz_stats") is not None


#: True when the installed ArviZ is 1.x (whose statistics are in ``arviz_stats``).
ARVIZ_1 = _is_arviz_1()


def psislw(log_ratios, reff=1.0):
    """Pareto-smoothed importance sampling along the last axis (Vehtari et al. 2024, Alg. 1).

    :param log_ratios: (..., S) log importance ratios; for LOO, −log p(y_i | θ_s).
    :param float reff: relative efficiency ESS/S of the draws.
    :return: ``(log_weights, k)``: normalised smoothed log weights (..., S) and Pareto k (...).
    """
    log_ratios = np.asarray(log_ratios, dtype=float)
    if ARVIZ_1:
        from arviz_stats.base import array_stats

        lw, k = array_stats.psislw(-log_ratios, r_eff=reff, axis=-1)
    else:
        lw, k = arviz().psislw(log_ratios, reff)
    return np.asarray(lw, dtype=float), np.asarray(k, dtype=float)


def from_dict(groups, attrs=None):
    """ArviZ data from ``{group: {var: array (chain, draw, ...)}}``, with the same ``attrs`` on every
    group: an ``InferenceData`` (0.23) or an ``xarray.DataTree`` (1.x)."""
    az = arviz()
    attrs = dict(attrs or {})
    if "data" in inspect.signature(az.from_dict).parameters:
        return az.from_dict(dict(groups), attrs={g: dict(attrs) for g in groups})
    return az.from_dict(**groups, attrs=attrs)


def group_names(data):
    """The names of the groups of ArviZ data (``["posterior", "log_likelihood", ...]``)."""
    groups = data.groups
    groups = groups() if callable(groups) else groups
    return [g.strip("/") for g in groups if g.strip("/")]


def ess(draws, method="bulk", prob=None):
    """ESS of one scalar quantity's draws (chains, draws), as ``arviz.ess`` computes it."""
    kwargs = {} if prob is None else {"prob": prob}
    return float(arviz().ess(np.asarray(draws, dtype=float), method=method, **kwargs))


class LooResult(NamedTuple):
    """``arviz.loo``'s result in one vocabulary: totals, SE, effective parameters, pointwise terms."""

    elpd_loo: float
    se: float
    p_loo: float
    loo_i: np.ndarray
    pareto_k: np.ndarray


def loo(data, **kwargs):
    """``arviz.loo(data, pointwise=True)`` of the installed ArviZ as a :class:`LooResult`."""
    res = arviz().loo(data, pointwise=True, **kwargs)
    if ARVIZ_1:
        return LooResult(float(res.elpd), float(res.se), float(res.p),
                         np.asarray(res.elpd_i).ravel(), np.asarray(res.pareto_k).ravel())
    return LooResult(float(res.elpd_loo), float(res.se), float(res.p_loo),
                     np.asarray(res.loo_i).ravel(), np.asarray(res.pareto_k).ravel())
