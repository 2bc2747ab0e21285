"""Gradient-noise covariance estimators and the KL-optimal preconditioners built from them.

Units. Everything here is in the units of NumPyro's potential U (a sum over data). For one
subsample plate with N data and minibatch S, the minibatch gradient ∇Û_S has noise covariance

    Q = N² C / S,        C = Cov_n[∇ℓ_n(θ)]  (Mandt et al. Eq. 3–5, per-datum loss ℓ_n),

and with several plates Q = Σ_p Q_p, Q_p = Cov_n[∇Û_{p,[n]}] / S_p (the per-example gradients
of :meth:`~numpyro_sgd.SubsampledPotential.per_example_grads`). An update θ ← θ − P ∇Û_S is Mandt's
θ ← θ − H ĝ_S with H = N P.

Estimators (``init, update, final``), all averaged over a window with κ_t = 1/t (Eq. 25's
decreasing rate, here the running mean, the lowest-variance choice for a frozen estimate):

* ``"minibatch"``: the unbiased within-minibatch sample covariance of the S_p per-example
  gradients (needs S_p ≥ 2). Default.
* ``"eq25"``: Mandt Eq. 25, (ĝ_1 − ĝ_S)(ĝ_1 − ĝ_S)ᵀ with ĝ_1 the first example of the
  minibatch, rescaled by S/(S − 1) since E[(ĝ_1 − ĝ_S)(ĝ_1 − ĝ_S)ᵀ] = (S − 1)/S · C.
  One example per step: S−1 times fewer draws than ``"minibatch"``, hence noisier.
* ``"pooled"``: Welford mean and covariance of all per-example gradients of the window,
  centred on the window mean (works for S = 1; biased up by O(1/N) through the drift of θ).

With ``full=False`` only the diagonal is kept, at O(S·D) per step.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax.numpy as jnp
import numpy as np

__all__ = ["NOISE_ESTIMATORS", "NoiseState", "NoiseEstimator", "cluster_rows", "noise_estimator",
           "discrete_time_correction", "effective_curvature", "fisher_curvature", "sampling_noise"]

#: the gradient-noise estimators ``noise_estimator`` accepts (see :func:`noise_estimator`)
NOISE_ESTIMATORS = ("minibatch", "eq25", "pooled")


class NoiseState(NamedTuple):
    """Running state of a noise estimator."""

    #: number of steps averaged so far
    count: jnp.ndarray
    #: per plate: running mean of the per-example gradients (used by ``"pooled"`` only)
    mean: tuple
    #: per plate: running mean of the per-step estimate of Cov_n (``"minibatch"``/``"eq25"``)
    #: or the Welford sum of squares (``"pooled"``); (D,) if diagonal, (D, D) if full
    second: tuple


class NoiseEstimator(NamedTuple):
    init: Callable
    update: Callable
    final: Callable


def _outer(a, b, full):
    return a.T @ b if full else jnp.sum(a * b, axis=0)


def cluster_rows(per_example_grads, cluster_size):
    """The S × D per-example gradients of a minibatch of S/B clusters of B consecutive rows
    (:func:`~numpyro_sgd.minibatch.with_replacement.cluster_indices`) as S/B rows u_k = Σ_{i∈k} g_i / √B.

    Under the cluster law the minibatch gradient is (1/S) Σ_k √B u_k (times N/S's scale), so
    its noise covariance is Cov[u]/S: the covariance of these rows is what the estimators
    average, exactly as they average single rows' under random rows (B = 1 returns the rows)."""
    if cluster_size == 1:
        return per_example_grads
    size, dim = per_example_grads.shape
    return per_example_grads.reshape(size // cluster_size, cluster_size, dim).sum(axis=1) / np.sqrt(cluster_size)


def noise_estimator(method, subsample_sizes, dim, full=False, cluster_sizes=None):
    """Build an estimator of the per-plate gradient noise Q_p (see the module docstring).

    :param str method: one of :data:`~numpyro_sgd.numerics.noise.NOISE_ESTIMATORS`.
    :param tuple subsample_sizes: S_p for every subsample plate.
    :param int dim: D.
    :param bool full: keep the full D × D matrix (else the diagonal only).
    :param tuple cluster_sizes: B_p for every plate whose minibatches are clusters of B_p
        consecutive rows (None: all 1, random rows). The estimators then average the S_p/B_p
        cluster rows of :func:`cluster_rows`, whose covariance over S_p is the law's noise.
    :return: :class:`NoiseEstimator` ``(init(dtype) -> NoiseState,
        update(state, per_example_grads, active) -> NoiseState, final(state) -> tuple of Q_p)``.
    """
    if method not in NOISE_ESTIMATORS:
        raise ValueError(
            f"unknown noise estimator {method!r}; choose one of {NOISE_ESTIMATORS}."
        )
    shape = (dim, dim) if full else (dim,)
    clusters = (1,) * len(subsample_sizes) if cluster_sizes is None else tuple(cluster_sizes)

    def init(dtype=jnp.float32):
        zeros = tuple(jnp.zeros(dim, dtype) for _ in subsample_sizes)
        second = tuple(jnp.zeros(shape, dtype) for _ in subsample_sizes)
        return NoiseState(jnp.zeros((), jnp.int32), zeros, second)

    def update(state, per_example_grads, active=True):
        t = state.count + 1
        new_mean, new_second = [], []
        for m, s2, g, b in zip(state.mean, state.second, per_example_grads, clusters):
            g = cluster_rows(g, b)
            size = g.shape[0]
            if method == "pooled":
                # Welford with a batch of S rows (Chan et al. parallel update)
                n_old = state.count * float(size)  # float: count·S overflows int32 in long warmups
                batch_mean = jnp.mean(g, axis=0)
                dev = g - batch_mean
                delta = batch_mean - m
                n_new = n_old + size
                m_new = m + delta * size / n_new
                cross = _outer(delta[None], delta[None], full) * n_old * size / n_new
                s2_new = s2 + _outer(dev, dev, full) + cross
            else:
                if method == "minibatch":
                    dev = g - jnp.mean(g, axis=0)
                    cov = _outer(dev, dev, full) / (size - 1)
                else:  # eq25
                    d = g[:1] - jnp.mean(g, axis=0)
                    cov = _outer(d, d, full) * size / (size - 1)
                m_new = m
                s2_new = s2 + (cov - s2) / t
            new_mean.append(jnp.where(active, m_new, m))
            new_second.append(jnp.where(active, s2_new, s2))
        count = jnp.where(active, t, state.count)
        return NoiseState(count, tuple(new_mean), tuple(new_second))

    def final(state):
        out = []
        for s2, size, b in zip(state.second, subsample_sizes, clusters):
            if method == "pooled":
                rows = float(size // b)  # rows per update (cluster rows under the cluster law)
                cov = s2 / jnp.maximum(state.count * rows - 1.0, 1.0)  # float: no int32 overflow
            else:
                cov = s2
            out.append(cov / size)  # Q_p = Cov_n / S_p
        return tuple(out)

    return NoiseEstimator(init, update, final)


def _trace(q):
    return jnp.trace(q) if q.ndim == 2 else jnp.sum(q)


def discrete_time_correction(plate_noise, plates, noise_factor=None):
    """The factor c that replaces 2 in H* so that the *discrete-time* chain is exact.

    For θ ← θ − c Q⁻¹ ∇Û_S on a Gaussian posterior whose Hessian equals its Fisher
    (A_U = (S/N) Q), the stationary covariance is c² f Q⁻¹ / (2c S/N − c² S²/N²), with f the
    minibatch noise factor of the minibatch law, ``noise_factor(N, S)`` (1 with replacement, the
    default None; (N − S)/(N − 1) without, :mod:`numpyro_sgd.minibatch.law`). It equals the
    posterior A_U⁻¹ iff c = 2 / (f + S/N) (measured: 2N/(N + S) with
    replacement; ≈ 2 without). With several plates, S/N and f are averaged with weights
    Tr(Q_p)/Tr(Q).
    """
    traces = jnp.stack([_trace(q) for q in plate_noise])
    w = traces / jnp.sum(traces)
    ratio = jnp.array([p.subsample_size / p.size for p in plates])
    f = jnp.array([1.0 if noise_factor is None else noise_factor(p.size, p.subsample_size) for p in plates])
    return 2.0 / (jnp.sum(w * f) + jnp.sum(w * ratio))


def effective_curvature(summary, plates, noise_factor=None, ratio=None):
    """Q_eff = (f + S/N) Q + Λ: what the exact discrete-time optimum P = 2 Q_eff⁻¹ inverts.

    For θ ← θ − P(A(θ − θ*) + ξ), Cov ξ = f Q, the stationary covariance is A⁻¹ iff
    P = 2 (f Q + A)⁻¹; with the likelihood's Hessian ≈ its Fisher (S/N) Q (A5) and Λ the exact
    Hessian of the prior and Jacobian terms, A ≈ (S/N) Q + Λ. f and S/N come from
    :func:`discrete_time_correction` (c = 2/(f + S/N)).

    :param summary: a :class:`~numpyro_sgd.adaptation.noise_warmup.WarmupSummary` (per-plate Q_p, Λ).
    :param ratio: f + S/N if already fixed (SGFS keeps the one of the end of warmup while its Q
        moves); None: 2/c from Q's plate weights.
    """
    if ratio is None:
        ratio = 2.0 / discrete_time_correction(summary.plate_noise, plates, noise_factor)
    return ratio * summary.noise + summary.prior_curvature


def fisher_curvature(summary, plates):
    """A_U ≈ Σ_p (S_p/N_p) Q_p + Λ: the Hessian of the full-data potential under A5 (the
    likelihood Hessian of plate p is its Fisher N_p C_p = (S_p/N_p) Q_p) plus the prior's."""
    fisher = sum(q * (p.subsample_size / p.size) for q, p in zip(summary.plate_noise, plates))
    return fisher + summary.prior_curvature


def sampling_noise(summary, plates, noise_factor=None):
    """f Q = Σ_p f_p Q_p: the covariance of the sampling-phase minibatch gradient, f_p =
    ``noise_factor(N_p, S_p)`` of the minibatch law (None: 1, see :func:`discrete_time_correction`)."""
    if noise_factor is None:
        return summary.noise
    return sum(q * noise_factor(p.size, p.subsample_size) for q, p in zip(summary.plate_noise, plates))


