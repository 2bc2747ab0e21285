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

from .linalg import cho_solve, cholesky, eigh, eigvalsh

__all__ = [
    "exponential_step_size",
    "NOISE_ESTIMATORS",
    "NoiseState",
    "NoiseEstimator",
    "cluster_rows",
    "noise_estimator",
    "discrete_time_correction",
    "kl_optimal_preconditioner",
    "kl_optimal_shape",
    "kl_optimal_step_size",
    "effective_curvature",
    "fisher_curvature",
    "apply_preconditioner",
    "PRECONDITIONERS",
    "AUTO_FULL_MAX_DIM",
    "resolve_preconditioner",
    "sgfs_preconditioner",
    "sgfs_direction",
    "regularized_cholesky",
    "psd_factor",
    "psd_part",
    "sampling_noise",
    "TARGET_INFLATION",
    "check_target_inflation",
    "sgld_step_size",
    "sghmc_steps",
    "santa_step_size",
    "Spectrum",
    "unknown_spectrum",
    "curvature_spectrum",
    "relaxation_steps",
    "RELAXATION_SLACK",
    "MAX_PASSES_PER_SAMPLE",
]

#: the gradient-noise estimators ``noise_estimator`` accepts (see :func:`noise_estimator`)
NOISE_ESTIMATORS = ("minibatch", "eq25", "pooled")
PRECONDITIONERS = ("scalar", "diag", "full", "sqrt")
#: ``preconditioner="auto"`` (the default of ConstantSGD, SGFS and IASG) is ``"full"`` up to this
#: dimension D and ``"diag"`` above it: the full matrix costs O(D²) memory per chain and an O(D³)
#: factorisation when warmup ends, and it is the KL-optimal form (Mandt Thm. 2; the diagonal one
#: mixes slowly and has the wrong correlations on correlated posteriors)
AUTO_FULL_MAX_DIM = 1000


def resolve_preconditioner(kind, dim):
    """The preconditioner ``kind`` means for a D-dimensional model (``"auto"``: see :data:`AUTO_FULL_MAX_DIM`)."""
    if kind != "auto":
        return kind
    return "full" if dim <= AUTO_FULL_MAX_DIM else "diag"


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
    (:func:`~numpyro_sgd.indices.cluster_indices`) as S/B rows u_k = Σ_{i∈k} g_i / √B.

    Under the cluster law the minibatch gradient is (1/S) Σ_k √B u_k (times N/S's scale), so
    its noise covariance is Cov[u]/S: the covariance of these rows is what the estimators
    average, exactly as they average single rows' under random rows (B = 1 returns the rows)."""
    if cluster_size == 1:
        return per_example_grads
    size, dim = per_example_grads.shape
    return per_example_grads.reshape(size // cluster_size, cluster_size, dim).sum(axis=1) / np.sqrt(cluster_size)


def noise_estimator(method, subsample_sizes, dim, full=False, cluster_sizes=None):
    """Build an estimator of the per-plate gradient noise Q_p (see the module docstring).

    :param str method: one of :data:`~numpyro_sgd.noise.NOISE_ESTIMATORS`.
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


def discrete_time_correction(plate_noise, plates, without_replacement=False):
    """The factor c that replaces 2 in H* so that the *discrete-time* chain is exact.

    For θ ← θ − c Q⁻¹ ∇Û_S on a Gaussian posterior whose Hessian equals its Fisher
    (A_U = (S/N) Q), the stationary covariance is c² f Q⁻¹ / (2c S/N − c² S²/N²), with f the
    minibatch noise factor (1 with replacement, (N − S)/(N − 1) without). It equals the
    posterior A_U⁻¹ iff c = 2 / (f + S/N) (measured: 2N/(N + S) with
    replacement; ≈ 2 without). With several plates, S/N and f are averaged with weights
    Tr(Q_p)/Tr(Q).
    """
    traces = jnp.stack([_trace(q) for q in plate_noise])
    w = traces / jnp.sum(traces)
    ratio = jnp.array([p.subsample_size / p.size for p in plates])
    if without_replacement:
        f = jnp.array([(p.size - p.subsample_size) / max(p.size - 1, 1) for p in plates])
    else:
        f = jnp.ones(len(plates))
    return 2.0 / (jnp.sum(w * f) + jnp.sum(w * ratio))


def regularized_cholesky(matrix):
    """Lower Cholesky factor of a PSD matrix with a *scale-invariant* jitter.

    The jitter is relative to each diagonal entry (M + δ diag(M), i.e. δ on the correlation
    matrix), δ = max(1e-10, 10 ε_dtype): a jitter relative to the mean diagonal would swamp the
    small directions of badly scaled models (posteriordb kidiq: Q's diagonal spans 10⁴ and its
    condition number 10⁷), shrinking the sampled variance there by a factor 3.
    """
    delta = max(1e-10, 10 * float(jnp.finfo(matrix.dtype).eps))
    return cholesky(matrix + delta * jnp.diag(jnp.diagonal(matrix)))


def effective_curvature(summary, plates, without_replacement=False, ratio=None):
    """Q_eff = (f + S/N) Q + Λ: what the exact discrete-time optimum P = 2 Q_eff⁻¹ inverts.

    For θ ← θ − P(A(θ − θ*) + ξ), Cov ξ = f Q, the stationary covariance is A⁻¹ iff
    P = 2 (f Q + A)⁻¹; with the likelihood's Hessian ≈ its Fisher (S/N) Q (A5) and Λ the exact
    Hessian of the prior and Jacobian terms, A ≈ (S/N) Q + Λ. f and S/N come from
    :func:`discrete_time_correction` (c = 2/(f + S/N)).

    :param summary: a :class:`~numpyro_sgd.warmup.WarmupSummary` (per-plate Q_p, Λ).
    :param ratio: f + S/N if already fixed (SGFS keeps the one of the end of warmup while its Q
        moves); None: 2/c from Q's plate weights.
    """
    if ratio is None:
        ratio = 2.0 / discrete_time_correction(summary.plate_noise, plates, without_replacement)
    return ratio * summary.noise + summary.prior_curvature


def fisher_curvature(summary, plates):
    """A_U ≈ Σ_p (S_p/N_p) Q_p + Λ: the Hessian of the full-data potential under A5 (the
    likelihood Hessian of plate p is its Fisher N_p C_p = (S_p/N_p) Q_p) plus the prior's."""
    fisher = sum(q * (p.subsample_size / p.size) for q, p in zip(summary.plate_noise, plates))
    return fisher + summary.prior_curvature


def _floored_diagonal(noise):
    q_diag = jnp.diagonal(noise) if noise.ndim == 2 else noise
    # floor tiny variances (a coordinate with no gradient noise)
    return jnp.maximum(q_diag, jnp.finfo(q_diag.dtype).tiny)


def kl_optimal_shape(kind, noise, num_data, batch_size):
    """B of Mandt's H = ε B, in U units: the preconditioner is P = (ε/N) B.

    With the per-datum noise C = S Q / N²: ``"scalar"`` B = I, ``"diag"`` B = diag(C)⁻¹,
    ``"full"`` B = C⁻¹ (Cholesky solve), ``"sqrt"`` B = diag(C)^(−1/2) (Thm. 1, Cor. 1, Thm. 2,
    App. E Eq. 64). Shape () for scalar, (D,) for diag/sqrt, (D, D) for full.
    """
    n, s = float(num_data), float(batch_size)  # Python floats: N² overflows int32 from N = 46,341
    if kind == "scalar":
        return jnp.ones((), noise.dtype)
    if kind == "diag":
        return n**2 / (s * _floored_diagonal(noise))
    if kind == "sqrt":
        return n / jnp.sqrt(s * _floored_diagonal(noise))
    if kind == "full":
        chol = regularized_cholesky(noise)
        return n**2 / s * cho_solve(chol, jnp.eye(noise.shape[0], dtype=noise.dtype))
    raise ValueError(f"unknown preconditioner {kind!r}; choose one of {PRECONDITIONERS}.")


def kl_optimal_step_size(kind, noise, num_data, batch_size, correction=2.0):
    """Mandt's KL-optimal ε* for H = ε* B (:func:`kl_optimal_shape`), c = ``correction`` in place of 2:

    ``"scalar"`` ε* = c D N / Tr(Q) (Eq. 18: 2 S D / (N Tr C)); ``"diag"`` and ``"full"``
    ε* = c S / N (Cor. 1, Eq. 20); ``"sqrt"`` ε* = c D √S / Σ_k √Q_kk (Eq. 64).
    """
    q_diag = _floored_diagonal(noise)
    dim = q_diag.shape[0]
    if kind == "scalar":
        return correction * dim * num_data / jnp.sum(q_diag)
    if kind == "sqrt":
        return correction * dim * jnp.sqrt(batch_size) / jnp.sum(jnp.sqrt(q_diag))
    if kind in ("diag", "full"):
        return jnp.asarray(correction * batch_size / num_data, noise.dtype)
    raise ValueError(f"unknown preconditioner {kind!r}; choose one of {PRECONDITIONERS}.")


def kl_optimal_preconditioner(kind, noise, correction=2.0, step_size=None, num_data=None, batch_size=None):
    """The KL-optimal constant preconditioner P (θ ← θ − P ∇Û_S) of Mandt et al. Sec. 3,
    P = (ε/N) B with B from :func:`kl_optimal_shape` and ε = ``step_size`` or the optimal ε*
    (:func:`kl_optimal_step_size`). In U units, with c = ``correction`` (2 in continuous time):

    ============  ====================================  ==============================
    ``kind``      P at ε*                               Mandt et al.
    ============  ====================================  ==============================
    ``"scalar"``  c D / Tr(Q) · I                       Thm. 1, Eq. 18: ε* = 2 S D / (N Tr C)
    ``"diag"``    c / diag(Q)                           Cor. 1: H_kk = 2 S / (N C_kk)
    ``"full"``    c Q⁻¹  (Cholesky solve)               Thm. 2, Eq. 20: H = (2 S / N) C⁻¹
    ``"sqrt"``    c D / Σ_k √Q_kk · diag(Q)^(−1/2)       App. E, Eq. 64: H = ε* G⁻¹, G = √diag C
    ============  ====================================  ==============================

    :param noise: Q, shape (D,) (diagonal) or (D, D) (full, needed for ``"full"``).
    :return: ``(P, epsilon)``: P has shape () for scalar, (D,) for diag/sqrt, (D, D) for full;
        ``epsilon`` is the step size in Mandt's units.
    """
    eps = kl_optimal_step_size(kind, noise, num_data, batch_size, correction) if step_size is None else step_size
    return eps / num_data * kl_optimal_shape(kind, noise, num_data, batch_size), eps


def psd_part(matrix):
    """The positive semi-definite part of a symmetric matrix (or of a diagonal given as a vector)."""
    f = psd_factor(matrix)
    return f**2 if matrix.ndim == 1 else f @ f.T


def psd_factor(matrix):
    """F with F Fᵀ = the positive semi-definite part of a symmetric matrix (eigenvalues clipped at
    0; works for singular matrices, unlike a Cholesky factor), or √max(v, 0) for a diagonal v."""
    if matrix.ndim == 1:
        return jnp.sqrt(jnp.maximum(matrix, 0.0))
    w, v = eigh(0.5 * (matrix + matrix.T))
    return v * jnp.sqrt(jnp.maximum(w, 0.0))


def apply_preconditioner(precond, grad):
    """P g for P of shape () (scalar), (D,) (diagonal) or (D, D) (full)."""
    return precond @ grad if jnp.ndim(precond) == 2 else precond * grad


def sgfs_preconditioner(kind, noise, ratio, max_precond=jnp.inf):
    """SGFS preconditioner factor and injected noise (Mandt Thm. 3 / Eq. 36, Cor. 2; Ahn et al.).

    In U units the SGFS step is θ ← θ − 2 M⁻¹ (∇Û_S + ξ), ξ ~ N(0, Ξ), with
    M = a Q + Ξ (a = ``ratio`` = f + S/N, Ahn's γ·S/N: the discrete-time correction; see
    :func:`discrete_time_correction`; :class:`~numpyro_sgd.SGFS` passes a Q that already
    includes the prior's curvature and a = 1). The total gradient noise is fQ + Ξ, so P = 2 M⁻¹ is
    Thm. 3's H* = (2/N)(ε BBᵀ + EEᵀ)⁻¹ with P = ε H / N, Q = N² BBᵀ and Ξ = N² EEᵀ / ε.

    Stability rule (Cor. 2): with a cap ``max_precond`` = p_max on the diagonal of P, inject
    Ξ_kk = 2/p_max − a Q_kk where positive (``"diag"``), so P_kk = min(2/(a Q_kk), p_max); for
    ``"full"`` the injected noise is isotropic, Ξ = δ I with δ = max(0, 2/p_max − a λ_min(Q)),
    which bounds every eigenvalue, hence every diagonal entry, of P by p_max.

    :return: ``(factor, injected)``: ``factor`` is the lower Cholesky factor of M (full) or the
        vector M (diag); ``injected`` the diagonal of Ξ, shape (D,).
    """
    if kind == "diag":
        q = jnp.diagonal(noise) if noise.ndim == 2 else noise
        injected = jnp.maximum(0.0, (0.0 if max_precond is None else 2.0 / max_precond) - ratio * q)
        return ratio * q + injected, injected
    if kind == "full":
        dim = noise.shape[0]
        if max_precond is None:  # no cap, and a PSD ``noise`` (the caller's promise): no O(D³) eigenvalues
            return regularized_cholesky(ratio * noise), jnp.zeros(dim, noise.dtype)
        lam_min = eigvalsh(noise)[0]
        delta = jnp.maximum(0.0, 2.0 / max_precond - ratio * lam_min)
        m = ratio * noise + delta * jnp.eye(dim, dtype=noise.dtype)
        return regularized_cholesky(m), jnp.full(dim, delta, noise.dtype)
    raise ValueError(f"unknown SGFS preconditioner {kind!r}; choose 'full' or 'diag'.")


def sgfs_direction(factor, vector):
    """2 M⁻¹ v with M given by :func:`sgfs_preconditioner` (Cholesky solve, no inverse)."""
    if factor.ndim == 1:
        return 2.0 * vector / factor
    return 2.0 * cho_solve(factor, vector)


# ---------------------------------------------------------------------------- default step sizes
#: default bound on the relative error of the stationary variance along the worst direction
#: (``target_inflation`` of SGLD, pSGLD, SGHMC, EWSG, OverdampedEWSG and Santa)
TARGET_INFLATION = 0.1


def check_target_inflation(name, value):
    """Raise unless ``target_inflation`` is a number in (0, 1); returns it as a float."""
    if not is_real_in_unit_interval(value):
        raise ValueError(
            f"{name}: target_inflation must be a number in (0, 1) (the tolerated relative error of the stationary "
            f"variance, e.g. 0.1), got {value!r}."
        )
    return float(value)


def is_real_in_unit_interval(value):
    """True for a real scalar (not a bool) strictly between 0 and 1."""
    if isinstance(value, (bool, str, bytes)) or callable(value) or np.ndim(value) != 0:
        return False
    try:
        value = float(value)
    except (TypeError, ValueError):
        return False
    return 0.0 < value < 1.0


def sampling_noise(summary, plates, without_replacement=False):
    """f Q = Σ_p f_p Q_p: the covariance of the sampling-phase minibatch gradient, f_p = 1 with
    replacement and (N_p − S_p)/(N_p − 1) without (see :func:`discrete_time_correction`)."""
    if not without_replacement:
        return summary.noise
    return sum(q * ((p.size - p.subsample_size) / max(p.size - 1, 1)) for q, p in zip(summary.plate_noise, plates))


def _scaled(matrix, scale):
    """s^½ M s^½ for M of shape (D,) (diagonal) or (D, D) and a diagonal scale s ((D,), a scalar, or None)."""
    if scale is None:
        return matrix
    if matrix.ndim == 1:
        return matrix * scale
    root = jnp.sqrt(scale) * jnp.ones(matrix.shape[0], matrix.dtype)
    return root[:, None] * matrix * root[None, :]


def _top_eigenvalue(matrix, scale=None):
    """λ_max(s^½ M s^½) for M of shape (D,) (diagonal) or (D, D) and a diagonal scale s (D,) or None."""
    matrix = _scaled(matrix, scale)
    if matrix.ndim == 1:
        return jnp.max(matrix)
    return eigvalsh(0.5 * (matrix + matrix.T))[-1]


class Spectrum(NamedTuple):
    """The extreme eigenvalues of the curvature that frozen steps see (A in the coordinates a
    Langevin kernel's steps run in, G^½ A G^½ with pSGLD's G, P A for ConstantSGD), taken once at
    the end of warmup; the end-of-warmup prediction of the slowest direction's relaxation reads
    it (:func:`curvature_spectrum`). NaN (and coordinate −1) until then."""

    #: smallest eigenvalue
    lowest: jnp.ndarray
    #: largest eigenvalue
    highest: jnp.ndarray
    #: int32 index of the coordinate (of the flat θ, or of the coordinates the steps run in) on
    #: which the eigenvector of ``lowest`` has its largest component
    coordinate: jnp.ndarray


def unknown_spectrum(dtype):
    """The :class:`Spectrum` before warmup has estimated the curvature."""
    nan = jnp.asarray(jnp.nan, dtype)
    return Spectrum(nan, nan, jnp.asarray(-1, jnp.int32))


def curvature_spectrum(matrix, scale=None):
    """The :class:`Spectrum` of s^½ M s^½: M (D,) diagonal or (D, D) symmetric, s a diagonal scale
    ((D,), a scalar, or None). O(D³) once (an eigendecomposition) for a full M."""
    matrix = _scaled(matrix, scale)
    if matrix.ndim == 1:
        return Spectrum(jnp.min(matrix), jnp.max(matrix), jnp.argmin(matrix).astype(jnp.int32))
    values, vectors = eigh(0.5 * (matrix + matrix.T))
    return Spectrum(values[0], values[-1], jnp.argmax(jnp.abs(vectors[:, 0])).astype(jnp.int32))


def _positive_or_nan(x):
    """``x`` where it is finite and > 0, NaN otherwise: a failed estimate must not pass as a step."""
    return jnp.where(jnp.isfinite(x) & (x > 0), x, jnp.nan)


def sgld_step_size(noise, curvature, target_inflation=TARGET_INFLATION, temperature=1.0, preconditioner=None):
    """SGLD's (and pSGLD's) step ε whose stationary variance is at most (1 + τ)× the target's.

    For θ ← θ − (ε/2) G ∇Û_S + N(0, ε T G) (Welling & Teh Eq. 4; pSGLD, Li et al. Alg. 1, with
    a fixed diagonal G) on a Gaussian with Hessian A and minibatch noise Cov ξ = Q, along an
    eigen-direction of G^½ Q G^½ and G^½ A G^½ (values q, a) the stationary variance of the linear
    recursion x' = (1 − εa/2) x − (ε/2) ξ + √(εT) z is

        (εT + ε² q / 4) / (1 − (1 − εa/2)²) = (T/a) · (1 + εq/(4T)) / (1 − εa/4),

    i.e. T/a inflated by the minibatch noise (εq/(4T), Mandt et al. Sec. 4.1, Eq. 32–33) and by
    the Euler discretisation (εa/4). The inflation is ≤ τ in every direction iff
    εq/(4T) + (1 + τ) εa/4 ≤ τ, so

        ε = 4τ / λ_max(G^½ (Q/T + (1 + τ) A) G^½)

    (exact when Q and A commute; G = I for SGLD). Unlike ε = 4τ/λ_max(Q) it stays stable
    (εa < 4) where the gradient noise vanishes (S = N, or prior-dominated directions).

    :param noise: Q (U units), (D,) diagonal or (D, D).
    :param curvature: A_U ≈ Σ_p (S_p/N_p) Q_p + Λ (:func:`fisher_curvature`), same shape.
    :param preconditioner: G (D,) or None (I).
    :return: ε (NaN if the estimate is not positive and finite).
    """
    top = _top_eigenvalue(noise / temperature + (1.0 + target_inflation) * curvature, preconditioner)
    return _positive_or_nan(4.0 * target_inflation / top)


#: the largest exponential step c ε/2 :func:`exponential_step_size` takes: beyond it a step is
#: nearly an independent draw from the Gaussian part, and the residual held over it is all the
#: error there is
MAX_EXPONENTIAL_STEP = 4.0


def _exponential_variance_error(h, relative_curvature, noise):
    """|λ v − 1|: the relative error of the stationary variance of
    :func:`~numpyro_sgd.diffusions.exponential_overdamped_langevin` at c ε/2 = ``h`` along a
    direction whose curvature is λ = ``relative_curvature`` times the c it integrates exactly,
    with a gradient noise of variance ``noise`` × c. In units ψ = √c θ the recursion is
    ψ' = a ψ + √(1 − e²) ξ − (1 − e) ζ/√c with e = exp(−h), a = e − (1 − e)(λ − 1), so
    v = ((1 − e²) + (1 − e)² q/c) / (1 − a²) against the exact 1/λ; inf where |a| ≥ 1."""
    e = jnp.exp(-h)
    a = e - (1.0 - e) * (relative_curvature - 1.0)
    v = ((1.0 - e**2) + (1.0 - e) ** 2 * noise) / (1.0 - a**2)
    return jnp.where(jnp.abs(a) < 1.0, jnp.abs(relative_curvature * v - 1.0), jnp.inf)


def exponential_step_size(noise, curvature, nonlinearity, target_inflation=TARGET_INFLATION,
                          max_step=MAX_EXPONENTIAL_STEP):
    """The step ε of :func:`~numpyro_sgd.diffusions.exponential_overdamped_langevin` (exact for the
    Gaussian of precision c) whose stationary variance is within ``target_inflation`` τ of the
    posterior's along every direction, for a posterior whose curvature, in the coordinates the
    step runs in, lies within c (1 ± δ) over a posterior sd (δ = ``nonlinearity``, measured by
    :func:`~numpyro_sgd.control_variates.control_variate_noise`) and a gradient noise of
    covariance Q (``noise``, U units).

    Along a direction of curvature λ c the recursion is linear (see
    ``_exponential_variance_error``); its variance error grows from 0 at h = c ε/2 → 0 (the
    exact diffusion) to about δ + q/(2c) at h = ∞. The largest h on a grid up to ``max_step`` whose
    error is ≤ τ for λ = 1 ± δ and q = λ_max(Q) is taken; ε = 2h/c. With δ = 0 and no noise every
    h is exact (the Gaussian's own Ornstein–Uhlenbeck transition) and ``max_step`` is taken.

    :param noise: Q, (D, D) or (D,) diagonal, in the coordinates the step runs in.
    :param curvature: c (a scalar, e.g. N in the curvature basis of the warmup).
    :param nonlinearity: δ ≥ 0.
    :return: ε (NaN where the estimate is not finite).
    """
    c = jnp.asarray(curvature, noise.dtype)
    q = _top_eigenvalue(noise) / c
    delta = jnp.asarray(nonlinearity, noise.dtype)
    grid = jnp.geomspace(1e-3, max_step, 256).astype(noise.dtype)
    error = jnp.maximum(_exponential_variance_error(grid, jnp.maximum(1.0 - delta, 0.05), q),
                        _exponential_variance_error(grid, 1.0 + delta, q))
    h = jnp.max(jnp.where(error <= target_inflation, grid, grid[0]))
    return _positive_or_nan(jnp.where(jnp.isfinite(q) & jnp.isfinite(delta), 2.0 * h / c, jnp.nan))


def sghmc_steps(noise, curvature, target_inflation=TARGET_INFLATION, friction=None):
    """SGHMC's (and EWSG's) step h and friction γ (Euler–Maruyama, EWSG paper Eq. 3, unit mass).

    γ: critical damping of the stiffest direction, γ = 2 √λ_max(A) (unless given). h: along an
    eigen-direction (values q of Q, a of A) the stationary variance of the linear recursion
    x' = x + h r, r' = (1 − hγ) r − h (a x + ξ) + √(2γh) z, Var ξ = q, is exactly

        (1/a) · k (2γ + hq) / (γ(2 − hγ) − ha (2 − 3hγ/2 + h²a/2)),   k = 1 − hγ/2 + h²a/2,

    = (1/a)(1 + hq/(2γ) + ha/γ + O(h²)): the minibatch noise adds h²q to the 2γh of injected
    noise per step (Chen et al. 2014, Sec. 3.2: the noise the friction does not balance) and the
    Euler discretisation adds ha/γ. The first-order inflation h (q + 2a)/(2γ) ≤ τ in every
    direction gives

        h = 2τγ / λ_max(Q + 2A)

    (measured on the exact formula: inflation 0.100–0.106 at τ = 0.1 for S/N ≤ 0.1).

    :return: ``(h, γ)`` (NaN where the estimate is not positive and finite).
    """
    if friction is None:
        friction = 2.0 * jnp.sqrt(jnp.maximum(_top_eigenvalue(curvature), 0.0))
    friction = _positive_or_nan(jnp.asarray(friction, noise.dtype))
    top = _top_eigenvalue(noise + 2.0 * curvature)
    return _positive_or_nan(2.0 * target_inflation * friction / top), friction


def santa_step_size(noise, curvature, num_data, target_inflation=TARGET_INFLATION, damping=1e-8, max_omega_h=1.0):
    """Santa's η at β = 1 (Euler scheme, Alg. 6, per-datum units as :class:`~numpyro_sgd.Santa`)
    and the RMSprop moment v and thermostat α near the mode: ``(η, v, α)``.

    Near the mode Santa's moment is v ≈ Q_kk/N² (per-datum gradient noise), so
    g_k = 1/√(λ + √v_k) (Alg. 3). Per SG step the momentum u receives the injected noise
    2 g η^{3/2}/N and the minibatch noise η² G Q G/N²; the thermostat holds u_k² at η/N
    (Alg. 6: α ← α + u² − η/β), so at equilibrium α_k is the friction that balances both on the
    diagonal (fluctuation–dissipation): α_k = g_k h + h² b_k with h = √η, b_k = g_k² Q_kk/(2N).
    In per-datum units the thermostat moves by O(η/N) per step, i.e. it stays where it starts
    (the :class:`~numpyro_sgd.Santa` notes), so this α is also where a sampling run must start.

    Three bounds on h, the smallest wins:

    1. the *off-diagonal* minibatch noise is heat that no per-coordinate friction removes, as all
       of SGHMC's minibatch noise is (:func:`sghmc_steps`: inflation = noise / injected noise).
       Relative to the injected noise it is (h/(2N)) · offdiag(G^½ Q G^½); bound its spectral
       norm by τ: h ≤ 2Nτ / ‖offdiag(G^½ Q G^½)‖₂ (no bound for a diagonal Q);
    2. α_k ≤ 2τ (the Euler factor 1 − α of the momentum stays near 1):
       h_k = 4τ / (g_k + √(g_k² + 8τ b_k));
    3. stability: ωh ≤ ``max_omega_h`` with ω² = λ_max(G A_U G)/N, the top frequency of the
       dynamics in per-datum units (symplectic Euler diverges at ωh ≥ 2).

    Measured with the exact stationary covariance of the linearised recursion (frozen g and α;
    conjugate linear regressions of ``tests/conftest.py``, N = 2000, S = 50, τ = 0.1): bounds 2–3
    alone leave sds 9–14 % (ρ = 0.5) and 21–39 % (ρ = 0.8, D = 6) too small through the
    correlated minibatch noise; with bound 1 the sds are within 0.5–1.9 %, and within 0.2 %
    for uncorrelated noise. The rule is conservative: its error is well below τ.

    :param noise: Q (U units), (D,) or (D, D); ``curvature``: A_U, same shape.
    :return: ``(η, v, α)``: η (NaN if the estimate is not positive and finite), the moment
        v = Q_kk/N² and the thermostat's equilibrium α near the mode, both (D,).
    """
    num_data = float(num_data)  # N² overflows int32 from N = 46,341
    q_diag = jnp.maximum(jnp.diagonal(noise) if noise.ndim == 2 else noise, 0.0)
    g = 1.0 / jnp.sqrt(damping + jnp.sqrt(q_diag) / num_data)
    b = g**2 * q_diag / (2.0 * num_data)
    h = jnp.min(4.0 * target_inflation / (g + jnp.sqrt(g**2 + 8.0 * target_inflation * b)))     # bound 2
    if noise.ndim == 2:                                                                          # bound 1
        root = jnp.sqrt(g)
        scaled = root[:, None] * noise * root[None, :]
        off = scaled - jnp.diag(jnp.diagonal(scaled))
        h = jnp.minimum(h, 2.0 * num_data * target_inflation / jnp.max(jnp.abs(eigvalsh(off))))
    omega = jnp.sqrt(jnp.maximum(_top_eigenvalue(curvature, g**2), 0.0) / num_data)
    h = jnp.minimum(h, max_omega_h / omega)                                                      # bound 3
    return _positive_or_nan(h**2), q_diag / num_data**2, g * h + h**2 * b


#: the steps per returned sample chosen at the end of warmup leave one data pass only when the
#: slowest direction relaxes more than this many times slower than the well-specified case
RELAXATION_SLACK = 1.5
#: and they never exceed this many data passes per returned sample
MAX_PASSES_PER_SAMPLE = 20


def relaxation_steps(preconditioner, hessian, steps_per_pass, slack=RELAXATION_SLACK,
                     max_passes=MAX_PASSES_PER_SAMPLE):
    """SG steps between two returned samples of θ ← θ − P ∇Û_S (full P), from the frozen dynamics.

    Linearised at the mode, θ − θ* is a vector AR(1) with transition I − P A (A = ∇²U); along an
    eigenvector of P A with eigenvalue μ it keeps ρ = 1 − μ per step, so k = 2/μ steps give
    ρᵏ ≈ e⁻² between returned samples (integrated autocorrelation time ≈ 1.3 samples). At the
    KL-optimal P = 2 (f Q + A)⁻¹ (Mandt et al. Thm. 2 with the discrete-time correction),
    Q ≈ (N/S) A when the per-datum gradient covariance equals the per-datum Hessian (the Fisher
    identity of a well-specified model), so every μ ≈ 2S/N and k = N/S: one data pass. When
    the model is misspecified they differ, P A = 2 (f Q + A)⁻¹ A has eigenvalues spread around
    2S/N, and the direction with the smallest μ needs 2/μ_min steps (measured: 4.9 data passes for
    NumPyro's covtype logistic regression on the skin-segmentation data, where the ratio of
    gradient covariance to Hessian ranges over 0.36–4.95).

    :param preconditioner: P, (D, D) symmetric positive definite.
    :param hessian: an estimate of A = ∇²U at the end of warmup (D, D).
    :param int steps_per_pass: ⌈N/S⌉, the well-specified k.
    :return: int32 k: ⌈N/S⌉ unless 2/μ_min > ``slack``·⌈N/S⌉ (then ⌈2/μ_min⌉, at most
        ``max_passes``·⌈N/S⌉); ⌈N/S⌉ also where μ_min is not finite and positive (A estimated
        where it is not positive definite: no trustworthy time scale).
    """
    factor = cholesky(0.5 * (preconditioner + preconditioner.T))
    similar = factor.T @ (0.5 * (hessian + hessian.T)) @ factor          # eigenvalues of P A
    mu_min = eigvalsh(similar)[0]
    wanted = 2.0 / mu_min
    usable = jnp.isfinite(wanted) & (mu_min > 0) & (wanted > slack * steps_per_pass)
    k = jnp.where(usable, jnp.minimum(jnp.ceil(wanted), max_passes * steps_per_pass), steps_per_pass)
    return k.astype(jnp.int32)
