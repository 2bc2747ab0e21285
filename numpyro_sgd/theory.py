"""Closed-form predictions of the stationary laws of constant-rate SG dynamics.

All in NumPyro's potential units (U a sum over data; see :mod:`numpyro_sgd.noise`):
P the preconditioner of θ ← θ − P ∇Û_S, A_U = ∇²U at the mode, Q the noise covariance of ∇Û_S.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["lyapunov_covariance", "as_matrix"]


def as_matrix(precond, dim):
    """P as a (D, D) matrix from its scalar, diagonal or full form."""
    p = np.asarray(precond, dtype=float)
    if p.ndim == 0:
        return p * np.eye(dim)
    if p.ndim == 1:
        return np.diag(p)
    return p


def lyapunov_covariance(precond, hessian, noise_cov, discrete=False):
    """Stationary covariance Σ of θ ← θ − P (A_U (θ − θ*) + ξ), ξ ~ N(0, Q).

    * continuous time (Mandt et al. Eq. 13 / Eq. 22, H = N P, A = A_U / N, BBᵀ/S = Q / N²):
      P A_U Σ + Σ A_U Pᵀ = P Q Pᵀ;
    * ``discrete=True``: the exact law of the linear recursion,
      Σ = (I − P A_U) Σ (I − P A_U)ᵀ + P Q Pᵀ (the continuous form plus the O(P²) term that the
      discrete-time correction of :class:`~numpyro_sgd.ConstantSGD` accounts for).

    :param precond: P, scalar, (D,) or (D, D).
    :param hessian: A_U, (D, D), the Hessian of the full-data potential at the mode.
    :param noise_cov: Q, (D,) (diagonal) or (D, D).
    :return: Σ as a NumPy (D, D) array.
    """
    a = np.asarray(hessian, dtype=float)
    d = a.shape[0]
    p = as_matrix(precond, d)
    q = np.asarray(noise_cov, dtype=float)
    q = np.diag(q) if q.ndim == 1 else q
    rhs = p @ q @ p.T
    if discrete:
        m = np.eye(d) - p @ a
        return scipy.linalg.solve_discrete_lyapunov(m, rhs)
    pa = p @ a
    # solve_continuous_lyapunov solves X Σ + Σ Xᴴ = Y
    return scipy.linalg.solve_continuous_lyapunov(pa, rhs)
