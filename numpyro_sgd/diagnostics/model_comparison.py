"""Ranking models by subsampled PSIS-LOO (:func:`compare_loo`), with the differences estimated on
the shared subsample."""

from __future__ import annotations

import math

import numpy as np

from .loo import LooSubsample, srs_difference_estimate

__all__ = ["compare_loo"]


def compare_loo(results):
    """Rank models by subsampled elpd_loo; the differences are estimated on the shared subsample.

    For the best model A and each other model B, the pointwise differences d_j = elpd_A,j −
    elpd_B,j on the common subsample, with the approximations d̃_i = π̃_A,i − π̃_B,i, go through the
    difference estimator (ref [2], Eq. 7–9, ``srs_difference_estimate``; R's
    ``loo_compare`` for subsampled objects): Σ d̃_i comes from the two streamed sums, Σ d̃_i² would
    need the cross term Σ π̃_A,i π̃_B,i over all N, which is not kept (memory independent of N),
    so the population part of the SE uses the unbiased SRS estimate N mean_j d_j² instead. The
    subsampling SE of the difference is exact (Eq. 8 on d_j − d̃_j).

    .. note:: A table, not ``arviz.compare``: ArviZ 0.23's ``compare`` takes the SE of a difference
       from ``loo_i`` of all N observations, which a subsample does not have; feeding it the m
       subsampled terms would give an SE too small by a factor about sqrt(m/N).

    :param dict results: name -> :class:`LooSubsample`, all from the same subsample (same
        ``rng_key``, m and N, or ``observations=`` of one of them).
    :return: ``pandas.DataFrame`` indexed by name, best first, with ``rank``, ``elpd_loo``, ``se``,
        ``subsampling_se``, ``p_loo``, ``elpd_diff`` (≥ 0, best minus this), ``se_diff`` (total),
        ``subsampling_se_diff``, ``max_pareto_k``, ``m``, ``N``.
    """
    import pandas as pd

    if not isinstance(results, dict) or len(results) < 2:
        raise ValueError("compare_loo: pass a dict {name: loo_subsample result} with at least two models.")
    for name, r in results.items():
        if not isinstance(r, LooSubsample):
            raise TypeError(f"compare_loo: results[{name!r}] is a {type(r).__name__}, not a loo_subsample result.")
    names = list(results)
    first = results[names[0]]
    for name in names[1:]:
        r = results[name]
        if r.num_data != first.num_data or not np.array_equal(r.observations, first.observations):
            raise ValueError(
                f"compare_loo: {names[0]!r} and {name!r} used different subsamples (N = {first.num_data} vs "
                f"{r.num_data}, m = {first.num_observations} vs {r.num_observations}); the SE of their "
                "difference needs the same observations: call loo_subsample with the same rng_key and "
                f"num_observations, or pass observations={names[0]}_result.observations."
            )
        a, b = first.observed_values, r.observed_values
        if a is not None and b is not None and (a.shape != b.shape or not np.array_equal(a, b)):
            j = int(np.argmax(a.reshape(-1) != b.reshape(-1))) if a.shape == b.shape else 0
            raise ValueError(
                f"compare_loo: {names[0]!r} and {name!r} were fitted to different data: the observed values of "
                f"'{first.var_name}' at the shared subsample differ"
                + (f" (first at data index {int(first.observations[j])}: {a.reshape(-1)[j]!r} vs {b.reshape(-1)[j]!r})"
                   if a.shape == b.shape else f" (shapes {a.shape} vs {b.shape})")
                + ". elpd_loo of different responses are not comparable; compare models fitted to the same y."
            )
    order = sorted(names, key=lambda k: -results[k].elpd_loo)
    best = results[order[0]]
    rows = {}
    for rank, name in enumerate(order):
        r = results[name]
        if name == order[0]:
            diff, se_diff, sub_diff = 0.0, 0.0, 0.0
        else:
            d = best.elpd_loo_i - r.elpd_loo_i
            d_approx = best.elpd_loo_approx_i - r.elpd_loo_approx_i
            diff, var_sub, var_pop = srs_difference_estimate(best.approx_sum - r.approx_sum, None, d, d_approx,
                                                             r.num_data)
            se_diff, sub_diff = math.sqrt(max(var_pop, 0.0) + var_sub), math.sqrt(var_sub)
        rows[name] = {"rank": rank, "elpd_loo": r.elpd_loo, "se": r.se, "subsampling_se": r.subsampling_se,
                      "p_loo": r.p_loo, "elpd_diff": diff, "se_diff": se_diff, "subsampling_se_diff": sub_diff,
                      "max_pareto_k": float(np.max(r.pareto_k)), "m": r.num_observations, "N": r.num_data}
    return pd.DataFrame.from_dict(rows, orient="index")
