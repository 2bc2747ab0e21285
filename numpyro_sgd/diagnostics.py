"""Comparing samples with a reference: Gaussian KL divergences and moment errors."""

from __future__ import annotations

import numpy as np

__all__ = ["gaussian_kl", "fit_gaussian"]


def fit_gaussian(x):
    """``(mean, cov)`` from a ``(mean, cov)`` pair or from draws of shape (..., D).

    Leading dimensions of draws (e.g. chains × samples) are flattened; 1-D draws are taken as
    D = 1. The covariance uses the n − 1 denominator.
    """
    if isinstance(x, (tuple, list)) and len(x) == 2:
        mean = np.atleast_1d(np.asarray(x[0], dtype=float))
        cov = np.atleast_2d(np.asarray(x[1], dtype=float))
        if cov.shape != (mean.shape[0], mean.shape[0]):
            raise ValueError(f"gaussian_kl: covariance shape {cov.shape} does not match mean shape {mean.shape}.")
        return mean, cov
    draws = np.asarray(x, dtype=float)
    if draws.ndim == 1:
        draws = draws[:, None]
    draws = draws.reshape(-1, draws.shape[-1])
    if draws.shape[0] < 2:
        raise ValueError("gaussian_kl: need at least 2 draws to fit a Gaussian.")
    return draws.mean(0), np.atleast_2d(np.cov(draws, rowvar=False))


def gaussian_kl(p, q):
    """KL(p ‖ q) between two Gaussians, each a ``(mean, cov)`` pair or draws of shape (..., D).

    KL = ½ [tr(Σ_q⁻¹ Σ_p) + (μ_q − μ_p)ᵀ Σ_q⁻¹ (μ_q − μ_p) − D + ln det Σ_q − ln det Σ_p],
    computed with Cholesky factors. Call it twice for both directions. Fitting a Gaussian to
    n draws biases the KL up by about (D(D+1)/4 + D/2)/n.
    """
    mp, sp = fit_gaussian(p)
    mq, sq = fit_gaussian(q)
    if mp.shape != mq.shape:
        raise ValueError(f"gaussian_kl: dimensions differ ({mp.shape[0]} vs {mq.shape[0]}).")
    d = mp.shape[0]
    lq = np.linalg.cholesky(sq)
    lp = np.linalg.cholesky(sp)
    a = np.linalg.solve(lq, lp)
    diff = np.linalg.solve(lq, mq - mp)
    logdet = 2 * (np.sum(np.log(np.diag(lq))) - np.sum(np.log(np.diag(lp))))
    return 0.5 * (np.sum(a**2) + diff @ diff - d + logdet)
