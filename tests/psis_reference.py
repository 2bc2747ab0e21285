"""Full-data PSIS-LOO in NumPy, vectorised over observations: the tests' reference where the
installed ArviZ is 1.x.

ArviZ 1.x (``arviz_stats``) runs its Pareto smoothing and its pointwise LOO as a Python loop over
observations, about 1 ms each on the CI machine: 2 minutes for the N = 10⁵ reference of
``tests/test_loo.py``. ArviZ 0.23 vectorises the same computation, so there the tests call
``arviz.loo`` directly. This module computes what ArviZ 1.x's ``loo`` computes, with whole-array
operations; ``tests/test_loo.py::test_vectorised_reference_is_the_installed_arviz_loo`` checks it
against the installed ``arviz.loo`` term by term on heavy-tailed data, to 1e-10 relative.

The algorithm (Vehtari, Simpson, Gelman, Yao and Gabry 2024, "Pareto smoothed importance
sampling", Sec. 3 and App. C), for one observation with log importance ratios r_s = −log p(y_i | θ_s),
s = 1..S, and relative efficiency R:

1. M = ⌊3 √(S/R)⌋ tail draws when S·R > 225, else ⌊S/5⌋; the tail is the M largest r_s, the
   threshold u is the next largest.
2. The exceedances e = exp(r − max r) − exp(u − max r) of the tail are fitted with a generalised
   Pareto distribution by Zhang and Stephens' (2009) empirical-Bayes estimate: a grid of
   m = 30 + ⌊√M⌋ values b_j = 1/e_max + (1 − √(m/(j − ½))) / (3 e_(q)), with e_(q) the first
   quartile; profile log-likelihood ℓ_j = M (log(−b_j/k_j) − k_j − 1), k_j = mean log(1 − b_j e);
   b̂ = Σ_j b_j w_j with w ∝ exp ℓ (weights under 10 machine epsilons dropped); k = mean log(1 − b̂ e),
   σ = −k/b̂, and k is shrunk towards ½ by a prior worth 10 draws: k̂ = (M k + 5)/(M + 10).
3. The tail draws are replaced, in rank order, by the fitted quantiles at (t − ½)/M, t = 1..M,
   truncated at the largest raw ratio; the log weights are normalised.
4. elpd_i = log Σ_s w_is p(y_i | θ_s); p_i = log((1/S) Σ_s p(y_i | θ_s)) − elpd_i;
   se = √(N Var(elpd_i)) with the unbiased variance.
"""

from typing import NamedTuple

import numpy as np
from scipy.special import logsumexp


class Loo(NamedTuple):
    """The fields of ``numpyro_sgd.diagnostics.arviz_compat.LooResult``."""

    elpd_loo: float
    se: float
    p_loo: float
    loo_i: np.ndarray
    pareto_k: np.ndarray


def tail_length(num_draws, reff):
    """Step 1: the number of tail draws."""
    if num_draws * reff > 225:
        return int(np.floor(3 * np.sqrt(num_draws / reff)))
    return int(np.floor(num_draws / 5))


def gpd_fit(exceedances):
    """Step 2 for each row of ``exceedances`` (rows, M), sorted ascending: (k̂, σ), NaN where the
    first quartile does not exceed the minimum (no Pareto tail to fit)."""
    e = np.asarray(exceedances, dtype=float)
    rows, m_tail = e.shape
    grid = 30 + int(np.sqrt(m_tail))
    quartile = e[:, int(m_tail / 4 + 0.5) - 1]
    j = np.arange(1, grid + 1, dtype=float)
    with np.errstate(all="ignore"):  # rows without a tail (masked at the end) divide by zero
        b = (1 - np.sqrt(grid / (j - 0.5)))[None, :] / (3 * quartile[:, None]) + 1 / e[:, -1:]
        k_grid = np.log1p(-b[:, :, None] * e[:, None, :]).mean(axis=-1)
        profile = m_tail * (np.log(-b / k_grid) - k_grid - 1)
        w = np.exp(profile - logsumexp(profile, axis=1, keepdims=True))
        w = np.where(w >= 10 * np.finfo(float).eps, w, 0.0)
        w /= w.sum(axis=1, keepdims=True)
        b_hat = (b * w).sum(axis=1)
        k = np.log1p(-b_hat[:, None] * e).mean(axis=1)
        sigma = -k / b_hat
    k = (m_tail * k + 10 * 0.5) / (m_tail + 10)
    k = np.where(np.isnan(k), np.inf, k)
    no_tail = quartile <= e[:, 0]
    return np.where(no_tail, np.nan, k), np.where(no_tail, np.nan, sigma)


def psis(log_ratios, reff):
    """Steps 1–3 along the last axis of ``log_ratios`` (N, S): normalised log weights and k̂ (N,)."""
    r = np.asarray(log_ratios, dtype=float)
    n_obs, n_draws = r.shape
    m_tail = tail_length(n_draws, reff)
    r = r - r.max(axis=1, keepdims=True)
    order = np.argsort(r, axis=1)
    tail_idx = order[:, n_draws - m_tail:]
    tail = np.take_along_axis(r, tail_idx, axis=1)
    threshold = np.take_along_axis(r, order[:, n_draws - m_tail - 1:n_draws - m_tail], axis=1)
    k, sigma = gpd_fit(np.exp(tail) - np.exp(threshold))
    p = np.arange(0.5, m_tail) / m_tail
    with np.errstate(all="ignore"):
        ks = np.where(k == 0, 1.0, k)[:, None]
        rise = np.where(k[:, None] == 0, -np.log1p(-p)[None, :], np.expm1(-ks * np.log1p(-p)[None, :]) / ks)
        quantiles = np.exp(threshold) + sigma[:, None] * rise
        quantiles = np.where(sigma[:, None] > 0, quantiles, np.nan)
        smoothed = np.log(quantiles)
    smoothed = np.where(smoothed > tail.max(axis=1, keepdims=True), tail.max(axis=1, keepdims=True), smoothed)
    smooth = np.isfinite(k)[:, None]
    new_tail = np.where(smooth, smoothed, tail)
    out = r.copy()
    np.put_along_axis(out, tail_idx, new_tail, axis=1)
    out -= logsumexp(out, axis=1, keepdims=True)
    return out, k


def loo(log_lik, reff, chunk=5_000):
    """Step 4 from ``log_lik`` (N, S): PSIS-LOO totals and pointwise terms, ``chunk`` observations
    at a time (the fit holds (chunk, m, M) numbers)."""
    log_lik = np.asarray(log_lik, dtype=float)
    n_obs, n_draws = log_lik.shape
    loo_i, k = np.empty(n_obs), np.empty(n_obs)
    for start in range(0, n_obs, chunk):
        ll = log_lik[start:start + chunk]
        lw, k[start:start + chunk] = psis(-ll, reff)
        loo_i[start:start + chunk] = logsumexp(lw + ll, axis=1)
    lppd_i = logsumexp(log_lik, axis=1) - np.log(n_draws)
    se = float(np.sqrt(n_obs * np.var(loo_i, ddof=1)))
    return Loo(float(loo_i.sum()), se, float((lppd_i - loo_i).sum()), loo_i, k)
