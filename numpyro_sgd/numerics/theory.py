"""Closed-form predictions of the stationary laws of constant-rate SG dynamics.

All in NumPyro's potential units (U a sum over data; see :mod:`numpyro_sgd.numerics.noise`):
P the preconditioner of θ ← θ − P ∇Û_S, A_U = ∇²U at the mode, Q the noise covariance of ∇Û_S.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["lyapunov_covariance", "as_matrix", "iterate_average_covariance", "iasg_covariance", "window_error",
           "averaged_variance_shortfall", "iasg_validity", "ar1_autocorrelation_time",
           "langevin_autocorrelation_time", "exponential_autocorrelation_time"]


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


def iterate_average_covariance(precond, hessian, noise_cov, window, discrete=True):
    """Covariance of the average of ``window`` = T consecutive stationary iterates of
    θ ← θ − P (A_U (θ − θ*) + ξ), ξ ~ N(0, Q) (the samples of :class:`~numpyro_sgd.IASG`).

    With G = P A_U, M = I − G and Σ the stationary covariance of one iterate
    (:func:`lyapunov_covariance`), Cov(θ_t, θ_{t+k}) = Σ (Mᵏ)ᵀ, so

        Cov(θ̄_T) = (K Σ + Σ Kᵀ − T Σ) / T²,

    * ``discrete=True`` (exact for the linear recursion): K = Σ_{k=0}^{T−1} (T − k) Mᵏ
      = (T G − M (I − M^T)) G⁻²;
    * ``discrete=False`` (Mandt et al. App. F, Eq. 66–71, for any P; Eq. 71 is the case P = ε/N):
      the Ornstein–Uhlenbeck limit K = T G⁻¹ − G⁻² (I − e^{−G T}), without the −TΣ term.

    :param precond: P, scalar, (D,) or (D, D).
    :param hessian: A_U, (D, D).
    :param noise_cov: Q (noise covariance of ∇Û_S), (D,) or (D, D).
    :param int window: T ≥ 1.
    :return: (D, D) NumPy array.
    """
    a = np.asarray(hessian, dtype=float)
    d = a.shape[0]
    sigma = lyapunov_covariance(precond, a, noise_cov, discrete=discrete)
    g = as_matrix(precond, d) @ a
    eye = np.eye(d)
    g_inv = np.linalg.inv(g)
    t = int(window)
    if discrete:
        m = eye - g
        k = (t * g - m @ (eye - np.linalg.matrix_power(m, t))) @ g_inv @ g_inv
        cov = (k @ sigma + sigma @ k.T - t * sigma) / t**2
    else:
        k = t * g_inv - g_inv @ g_inv @ (eye - scipy.linalg.expm(-g * t))
        cov = (k @ sigma + sigma @ k.T) / t**2
    return 0.5 * (cov + cov.T)


def iasg_covariance(hessian, num_data, batch_size, step_size, window=None):
    """Mandt et al. Eq. 44 (Eq. 45 for T = N/S): the covariance of IASG samples under
    assumption A5 (Fisher = Hessian, so one SGD iterate has covariance ε/(2S) I, Eq. 43),

        D = 1/(S T) A⁻¹ + 1/(ε S T²) U Λ⁻² (e^{−ε T Λ} − I) Uᵀ,   A = U Λ Uᵀ = A_U / N,

    for θ ← θ − ε ĝ_S, ĝ_S = ∇Û_S / N (no preconditioner). With T = N/S the first term is the
    posterior covariance A_U⁻¹; the second is the finite-window error (:func:`window_error`).

    :param hessian: A_U = ∇²U at the mode, (D, D) (NumPyro's units; divided by N here).
    :param int num_data: N.
    :param int batch_size: S.
    :param float step_size: ε (Mandt's units).
    :param int window: T (default N/S).
    :return: (D, D) NumPy array.
    """
    n, s, eps = float(num_data), float(batch_size), float(step_size)
    t = n / s if window is None else float(window)
    lam, u = np.linalg.eigh(np.asarray(hessian, dtype=float) / n)
    diag = 1.0 / (s * t * lam) + (np.exp(-eps * t * lam) - 1.0) / (eps * s * t**2 * lam**2)
    return (u * diag) @ u.T


def window_error(x):
    """Relative shortfall of the averaged variance along an eigendirection with εTλ = x
    (Mandt et al. Eq. 46 with T = N/S): (1 − e^{−x}) / x. Small iff x is large (Eq. 47)."""
    x = np.asarray(x, dtype=float)
    return -np.expm1(-x) / x


def averaged_variance_shortfall(u, window):
    """Exact discrete-time counterpart of Eq. 46: the relative shortfall 1 − Var(θ̄_T)/posterior
    variance along an eigendirection of HA where one step contracts by 1 − u (u = ε λ), under
    A5 and T = N/S:

        2 (1 − u) (1 − (1 − u)^T) / (T u (2 − u)).

    It tends to (1 − e^{−uT})/(uT) (Eq. 46) as u → 0, vanishes at u = 1 (the iterates are then
    independent draws of variance T × the posterior's, and their mean is exact) and is negative
    (the samples too wide) for 1 < u < 2. Derived from :func:`iterate_average_covariance` with
    Q = (N/S) A_U.
    """
    u = np.asarray(u, dtype=float)
    t = float(window)
    return 2.0 * (1.0 - u) * (1.0 - (1.0 - u) ** t) / (t * u * (2.0 - u))


def iasg_validity(step_size, window, eig_min, eig_max):
    """The validity numbers of Mandt et al. Eq. 46–47 for iterate averaging with a frozen ε, a
    window of T steps and the extreme eigenvalues λ_min, λ_max of HA (A5).

    :return: dict with ``step_size`` ε, ``window`` T, ``eig_min``, ``eig_max``, ``stability``
        ε λ_max (< 2 required, Eq. 47), ``window_product`` x = ε T λ_min, ``window_error_eq46``
        (1 − e^{−x})/x (:func:`window_error`), the exact discrete-time shortfalls of the averaged
        variance (:func:`averaged_variance_shortfall`) along λ_min (``window_error``) and λ_max
        (``stiff_error``, negative: too wide), and ``stiff_spread`` ε T λ_max / 2 (the iterates'
        spread along λ_max in posterior variances, Eq. 43).
    """
    eps, t, lo, hi = step_size, window, eig_min, eig_max
    x = eps * t * lo
    return {"step_size": eps, "window": t, "eig_min": lo, "eig_max": hi, "stability": eps * hi,
            "window_product": x, "window_error_eq46": float(window_error(x)),
            "window_error": float(averaged_variance_shortfall(eps * lo, t)), "stiff_spread": eps * t * hi / 2,
            "stiff_error": float(averaged_variance_shortfall(eps * hi, t))}


def ar1_autocorrelation_time(rate):
    """Integrated autocorrelation time, in steps, of an AR(1) that keeps ρ = 1 − μ of its state per
    step (``rate`` μ): τ = (1 + ρ)/(1 − ρ) = (2 − μ)/μ ≈ 2/μ for a small rate. Near the mode this
    is each eigendirection of the frozen SGD recursion θ ← θ − P ∇Û_S, μ an eigenvalue of P A_U
    (Mandt et al. Sec. 3: the Ornstein–Uhlenbeck process of Eq. 13 in discrete time). Broadcasts;
    ``inf`` where ρ is outside (−1, 1) (no contraction), NaN for a NaN rate."""
    rho = 1.0 - np.asarray(rate, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = (1.0 + rho) / (1.0 - rho)
    return np.where(np.abs(rho) < 1.0, tau, np.where(np.isnan(rho), np.nan, np.inf))


def langevin_autocorrelation_time(step_size, curvature, friction=None, of="theta"):
    """Integrated autocorrelation time, in SG steps, of θ along a direction of curvature a under a
    constant-step Langevin recursion (the linear recursion near the mode, its injected noise only;
    the minibatch noise, a fraction of it at the default steps, is left out):

    * overdamped (SGLD, Welling & Teh Eq. 4): θ' = (1 − ε a/2) θ + √ε ξ, an AR(1) with
      ρ = 1 − ε a/2, so τ = (1 + ρ)/(1 − ρ) (:func:`ar1_autocorrelation_time`);
    * underdamped (SGHMC, EWSG paper Eq. 3, unit mass, ``friction`` γ): x' = M x + w for
      x = (θ, r), M = [[1, h], [−h a, 1 − h γ]], Cov w = diag(0, 2γh). With Σ the stationary
      covariance (Σ = M Σ Mᵀ + Cov w) the autocovariances are Mᵏ Σ, so
      τ = [(I − M)⁻¹ (I + M) Σ]_θθ / Σ_θθ, exact also near critical damping and for oscillating
      modes.

    ``of="square"``: the time of θ² instead, i.e. how long the chain takes to forget its spread.
    For the Gaussian stationary law Corr(θ₀², θ_k²) = ρ_k² (ρ_k the autocorrelation of θ), so
    τ = 2 Σ_{k≥0} ρ_k² − 1, where Σ_k ρ_k² Σ_θθ² = X_θθ with X = M X Mᵀ + (Σ e_θ)(Σ e_θ)ᵀ (a
    discrete Lyapunov equation); overdamped, (1 + ρ²)/(1 − ρ²). It exceeds θ's time for an
    underdamped direction (γ² < 4a): there the oscillations cancel in θ's sum (τ ≈ 2γ/(h a),
    small for a small γ) while the amplitude forgets itself only at the rate of the friction
    (τ ≈ 1/(γ h)), so θ's time alone would promise a chain that never forgets its spread.

    Broadcasts over arrays (e.g. one step size per chain). ``inf`` where the recursion does not
    contract, NaN for a NaN step.
    """
    eps, a = np.asarray(step_size, float), np.asarray(curvature, float)
    if friction is None:
        rho = 1.0 - eps * a / 2.0
        return ar1_autocorrelation_time(1.0 - rho**2 if of == "square" else 1.0 - rho)
    h, a, gamma = np.broadcast_arrays(eps, a, np.asarray(friction, float))
    out = np.empty(h.shape)
    for index in np.ndindex(h.shape):
        m = np.array([[1.0, h[index]], [-h[index] * a[index], 1.0 - h[index] * gamma[index]]])
        if not np.all(np.isfinite(m)):
            out[index] = np.nan
        elif np.max(np.abs(np.linalg.eigvals(m))) >= 1.0:
            out[index] = np.inf
        else:
            sigma = scipy.linalg.solve_discrete_lyapunov(m, np.diag([0.0, 2.0 * gamma[index] * h[index]]))
            if of == "square":
                column = sigma[:, :1]
                x = scipy.linalg.solve_discrete_lyapunov(m, column @ column.T)
                out[index] = 2.0 * x[0, 0] / sigma[0, 0] ** 2 - 1.0
            else:
                out[index] = np.linalg.solve(np.eye(2) - m, (np.eye(2) + m) @ sigma)[0, 0] / sigma[0, 0]
    return out if out.shape else float(out)


def exponential_autocorrelation_time(step_size, curvature, nonlinearity=0.0):
    """Integrated autocorrelation time, in SG steps, of the slowest direction under
    :func:`~numpyro_sgd.numerics.diffusions.exponential_overdamped_langevin` at step ε with exact precision
    c (``curvature``), along a direction of curvature (1 − δ) c (δ = ``nonlinearity``): the AR(1)
    ψ' = a ψ + noise with a = e + (1 − e) δ, e = exp(−c ε/2) (:func:`ar1_autocorrelation_time` at
    the rate 1 − a). For δ = 0, τ = (1 + e)/(1 − e): one step is one effective sample from c ε/2 ≈ 2.
    Broadcasts; NaN for a NaN step."""
    e = np.exp(-0.5 * np.asarray(curvature, float) * np.asarray(step_size, float))
    a = e + (1.0 - e) * np.minimum(np.asarray(nonlinearity, float), 0.95)
    return ar1_autocorrelation_time(1.0 - a)
