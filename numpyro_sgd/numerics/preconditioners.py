"""The frozen preconditioners of the constant-rate kernels from an estimated gradient-noise
covariance Q: the KL-optimal P of Mandt et al. (Thm. 1–2, Cor. 1, Eq. 18, 20, 64), SGFS's
factor and injected noise (Eq. 36, Cor. 2), and positive-definite parts and factors.
"""

from __future__ import annotations

import jax.numpy as jnp

from .linalg import cho_solve, cholesky, eigh, eigvalsh

__all__ = ["PRECONDITIONERS", "AUTO_FULL_MAX_DIM", "resolve_preconditioner", "regularized_cholesky",
           "kl_optimal_shape", "kl_optimal_step_size", "kl_optimal_preconditioner", "psd_part", "psd_factor",
           "apply_preconditioner", "sgfs_preconditioner", "sgfs_direction"]


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

def regularized_cholesky(matrix):
    """Lower Cholesky factor of a PSD matrix with a *scale-invariant* jitter.

    The jitter is relative to each diagonal entry (M + δ diag(M), i.e. δ on the correlation
    matrix), δ = max(1e-10, 10 ε_dtype): a jitter relative to the mean diagonal would swamp the
    small directions of badly scaled models (posteriordb kidiq: Q's diagonal spans 10⁴ and its
    condition number 10⁷), shrinking the sampled variance there by a factor 3.
    """
    delta = max(1e-10, 10 * float(jnp.finfo(matrix.dtype).eps))
    return cholesky(matrix + delta * jnp.diag(jnp.diagonal(matrix)))

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
    :func:`~numpyro_sgd.numerics.noise.discrete_time_correction`; :class:`~numpyro_sgd.SGFS` passes a Q that already
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
