"""The default steps of the Langevin kernels from the noise Q and curvature A warmup measured:
SGLD's ε, the exponential integrator's ε, SGHMC's (h, γ), Santa's η, each bounding the
stationary variance inflation by ``target_inflation``; the extreme curvatures the frozen steps
see (:class:`Spectrum`); ConstantSGD-full's steps per returned sample.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from .linalg import cholesky, eigh, eigvalsh

__all__ = ["TARGET_INFLATION", "check_target_inflation", "is_real_in_unit_interval", "Spectrum", "unknown_spectrum",
           "curvature_spectrum", "sgld_step_size", "MAX_EXPONENTIAL_STEP", "exponential_step_size", "sghmc_steps",
           "santa_step_size", "RELAXATION_SLACK", "MAX_PASSES_PER_SAMPLE", "relaxation_steps"]


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
    :param curvature: A_U ≈ Σ_p (S_p/N_p) Q_p + Λ (:func:`~numpyro_sgd.numerics.noise.fisher_curvature`), same shape.
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
    :func:`~numpyro_sgd.numerics.diffusions.exponential_overdamped_langevin` at c ε/2 = ``h`` along a
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
    """The step ε of :func:`~numpyro_sgd.numerics.diffusions.exponential_overdamped_langevin` (exact for the
    Gaussian of precision c) whose stationary variance is within ``target_inflation`` τ of the
    posterior's along every direction, for a posterior whose curvature, in the coordinates the
    step runs in, lies within c (1 ± δ) over a posterior sd (δ = ``nonlinearity``, measured by
    :func:`~numpyro_sgd.adaptation.control_variates.control_variate_noise`) and a gradient noise of
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
