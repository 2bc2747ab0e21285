"""Constant-rate SGD as approximate Bayesian inference (Mandt, Hoffman & Blei 2017, Sec. 3).

Algorithm (ALGORITHMS.md, "ConstantSGD"):

    warmup   move to the mode region (Adam, then preconditioned SGD) while estimating the
             gradient-noise covariance C online (Eq. 25 / within-minibatch covariance);
             freeze the KL-optimal preconditioner H (Thm. 1, Cor. 1, Thm. 2, App. E);
    sample   θ_{t+1} = θ_t − H ĝ_S(θ_t)                                  (Eq. 15)
             or, with momentum,  v ← (1 − μ) v − μ H ĝ_S;  θ ← θ + v     (Eq. 27, Sec. 3.3)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import random

from .base import is_positive_scalar
from .noise import (
    PRECONDITIONERS,
    apply_preconditioner,
    discrete_time_correction,
    kl_optimal_preconditioner,
    psd_factor,
)
from .warmup import NoiseAdaptingKernel, WarmupState

__all__ = ["ConstantSGD", "ConstantSGDState", "constant_sgd_step"]


class ConstantSGDState(NamedTuple):
    """Kernel state of :class:`ConstantSGD` (one chain)."""

    #: P = H/N, frozen at the end of warmup: shape () scalar, (D,) diag/sqrt, (D, D) full;
    #: includes the momentum factor μ
    preconditioner: jnp.ndarray
    #: ε in Mandt's units (H = ε B), the KL-optimal ε* unless ``step_size`` was given
    step_size: jnp.ndarray
    #: user override of ε (NaN: use ε*)
    user_step_size: jnp.ndarray
    #: momentum damping μ ∈ (0, 1] (1: plain SGD)
    momentum: jnp.ndarray
    #: velocity v of the momentum update (zeros without momentum)
    velocity: jnp.ndarray
    #: discrete-time factor c replacing 2 in H* (see :func:`~numpyro_sgd.noise.discrete_time_correction`)
    correction: jnp.ndarray
    #: estimated gradient-noise covariance Q of ∇Û_S (diag (D,) or full (D, D)), frozen after warmup
    noise_cov: jnp.ndarray
    #: factor F of the injected gradient noise Ξ = F Fᵀ (``prior_noise=True``; zeros otherwise):
    #: (D, D) for ``"full"``, else (D,) with Ξ = diag(F²)
    injection: jnp.ndarray
    #: warmup state (Adam, uncentred moment, noise estimator; see :mod:`numpyro_sgd.warmup`)
    warmup: WarmupState


def constant_sgd_step(theta, velocity, grad, preconditioner, momentum):
    """One sampling step, Mandt et al. Eq. 15 / Eq. 27 (H = N P, ĝ_S = ∇Û_S / N).

    v ← (1 − μ) v − P ∇Û_S   (at the optimum P carries the factor μ: ε_μ = μ ε*, Eq. 31)
    θ ← θ + v                (μ = 1: θ ← θ − P ∇Û_S, Eq. 15)
    """
    velocity = (1.0 - momentum) * velocity - apply_preconditioner(preconditioner, grad)
    return theta + velocity, velocity


class ConstantSGD(NoiseAdaptingKernel):
    """Constant SGD tuned so its stationary distribution is KL-closest to the posterior.

    **References:**

    1. *Stochastic Gradient Descent as Approximate Bayesian Inference*, S. Mandt, M. D. Hoffman,
       D. M. Blei, JMLR 18 (2017): Eq. 15 (update), Thm. 1 / Eq. 18 (scalar ε*), Cor. 1
       (diagonal), Thm. 2 / Eq. 20 (full), App. E / Eq. 64 (square-root), Sec. 3.3 / Eq. 27–31
       (momentum), Eq. 25 (online noise estimate).

    =====================  ============================================================
    paper                  here
    =====================  ============================================================
    ε, H = ε B             ``step_size`` (default: the KL-optimal ε*), ``preconditioner``
    C = BBᵀ (per datum)    estimated in warmup, ``noise_estimator``; stored as Q = N² C/S
    S, N                   the model's ``numpyro.plate(..., N, subsample_size=S)``
    μ (damping)            ``momentum`` (1 = no momentum)
    =====================  ============================================================

    Warmup (``num_warmup * steps_per_sample`` SG steps; :mod:`numpyro_sgd.warmup`): Adam, then
    constant-SGD steps preconditioned by the uncentred per-example second moment, while the
    noise covariance is averaged over the last part of warmup; H is frozen at the end of warmup.
    Per-example gradients are only computed during warmup; a sampling step costs one minibatch
    gradient.

    .. note:: **Discrete-time correction.** The continuous-time optimum H* = (2S/N) C⁻¹ gives a
       stationary covariance C⁻¹/(N − S) in discrete time with i.i.d. minibatches (10 % too
       wide at S/N = 0.1), and it is unstable where the prior adds curvature that the gradient
       noise does not see (a prior-dominated direction with little noise gets a huge step). For
       θ ← θ − P(A(θ − θ*) + ξ), Cov ξ = fQ, the stationary covariance equals A⁻¹ exactly iff
       2P − PAP = f PQP, i.e. P = 2 (f Q + A)⁻¹ (then every eigenvalue of PA lies in (0, 2)).
       With A ≈ (S/N) Q + ∇²U_prior(θ_warmup) (Fisher for the likelihood, the exact Hessian of
       the prior and Jacobian terms), the frozen preconditioner is the Mandt formula applied to
       Q_eff = (f + S/N) Q + ∇²U_prior (diagonal of it for the non-full variants); f = 1 with
       replacement and (N − S)/(N − 1) without
       (:func:`~numpyro_sgd.noise.discrete_time_correction` gives c = 2/(f + S/N)). Set
       ``discrete_time_correction=False`` for the paper's continuous-time rates 2 Q⁻¹ etc.

    .. note:: **Momentum.** Only ε/μ shapes the stationary law (Eq. 31), so the preconditioner is
       multiplied by μ; the discrete-time correction is the one derived without momentum.

    .. note:: **Prior noise** (``prior_noise=True``). The prior's gradient is exact, so where the
       likelihood is flat (a softmax's shift θ_d· + c, a non-identified combination) the
       gradient noise vanishes, P = 2 Λ⁻¹ (Λ the prior's Hessian) and PA = 2: the chain
       oscillates there without forgetting where it started, and its spread in those directions
       is not the posterior's. With ``prior_noise=True`` Gaussian noise of covariance Ξ = Λ⁺
       (the positive part of the prior's Hessian, re-taken whenever the kernel is frozen) is
       added to every minibatch gradient and P becomes 2 ((f + S/N) Q + Λ + Ξ)⁻¹: Mandt et al.
       Thm. 3 (H* = (2/N)(ε BBᵀ + EEᵀ)⁻¹ with injected noise EEᵀ), for which the stationary
       covariance is again A⁻¹ under A5, and PA = 1 (exact one-step sampling) in the flat
       directions. Costs one Gaussian draw (and a D × D product for ``"full"``) per step.

    .. warning:: The diagonal variant at its optimal rate mixes very slowly when the posterior
       is strongly correlated (ALGORITHMS.md); prefer ``"full"`` there.

    :param model: NumPyro model with a subsample plate.
    :param str preconditioner: ``"scalar"``, ``"diag"``, ``"full"`` or ``"sqrt"`` (default ``"diag"``).
    :param float step_size: ε in Mandt's units overriding ε* (optional).
    :param float momentum: damping μ ∈ (0, 1]; 1 (default) is plain SGD.
    :param bool discrete_time_correction: use c = 2/(f + S/N) instead of 2 (default True).
    :param bool prior_noise: inject gradient noise with the prior's curvature (see the note;
        default False; needs the KL-optimal rate, i.e. no ``step_size``).
    :param kwargs: warmup options of :class:`~numpyro_sgd.warmup.NoiseAdaptingKernel`
        (``noise_estimator``, ``adam_fraction``, ``noise_window``, ``adam_lr``, ``warmup_max_step``)
        and of :class:`~numpyro_sgd.base.SGKernel` (``steps_per_sample``, ``subsample``,
        ``warmup_subsample``, ``init_strategy``).

    .. doctest::

        >>> import jax, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from numpyro_sgd import ConstantSGD
        >>> y = jax.random.normal(jax.random.key(1), (2000,)) + 3.0
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=100) as idx:
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=y[idx])
        >>> mcmc = MCMC(ConstantSGD(model), num_warmup=500, num_samples=2000, progress_bar=False)
        >>> mcmc.run(jax.random.key(0), y)
        >>> sd = float(mcmc.get_samples()["mu"].std())  # posterior sd is 1/sqrt(2000) = 0.022
        >>> bool(0.015 < sd < 0.03)
        True
    """

    def __init__(self, model, preconditioner="diag", *, step_size=None, momentum=1.0,
                 discrete_time_correction=True, prior_noise=False, **kwargs):
        if preconditioner not in PRECONDITIONERS:
            raise ValueError(
                f"ConstantSGD: unknown preconditioner {preconditioner!r}; choose one of {PRECONDITIONERS}."
            )
        super().__init__(model, full_noise=preconditioner == "full", **kwargs)
        if step_size is not None and not is_positive_scalar(step_size):
            raise ValueError(f"ConstantSGD: step_size must be a positive float or None (use ε*), got {step_size!r}.")
        if not 0 < momentum <= 1:
            raise ValueError(
                f"ConstantSGD: momentum (damping μ) must lie in (0, 1], got {momentum}; 1 means no momentum."
            )
        if prior_noise and step_size is not None:
            raise ValueError(
                "ConstantSGD: prior_noise=True sets the rate from the injected noise (Mandt Thm. 3); "
                "drop step_size, or set prior_noise=False to use your step size."
            )
        self._prior_noise = bool(prior_noise)
        self._preconditioner = preconditioner
        self._step_size = step_size
        self._momentum = momentum
        self._correct = discrete_time_correction

    # ------------------------------------------------------------------ setup
    def _init_kernel_state(self, rng_key, theta, potential, num_warmup_steps):
        d, dtype = theta.shape[0], theta.dtype
        shape = {"scalar": (), "diag": (d,), "sqrt": (d,), "full": (d, d)}[self._preconditioner]
        nan = jnp.asarray(jnp.nan, dtype)
        return ConstantSGDState(
            preconditioner=jnp.full(shape, jnp.nan, dtype),
            step_size=nan,
            user_step_size=jnp.asarray(jnp.nan if self._step_size is None else self._step_size, dtype),
            momentum=jnp.asarray(self._momentum, dtype),
            velocity=jnp.zeros(d, dtype),
            correction=nan,
            noise_cov=jnp.zeros((d, d) if self._preconditioner == "full" else (d,), dtype),
            injection=jnp.zeros((d, d) if self._preconditioner == "full" else (d,), dtype),
            warmup=self._init_warmup(theta, potential, num_warmup_steps),
        )

    # ------------------------------------------------------------------ dynamics
    def _end_warmup(self, ks, theta, oracle):
        # called inside the traced step; the potential is the one of the current run
        potential = self.potential
        plate_noise = self._plate_noise(ks)
        noise = sum(plate_noise)
        user = None if self._step_size is None else ks.user_step_size
        if self._correct or self._prior_noise:
            prior_curvature = oracle.prior_hessian(theta, diagonal=noise.ndim == 1)
        if self._correct:
            # exact discrete-time optimum P = 2 (f Q + A)⁻¹ with A ≈ (S/N) Q + ∇²(prior): the
            # factor c = 2/(f + S/N) and the curvature that the gradient noise does not see
            c = discrete_time_correction(plate_noise, potential.plates, self._subsample == "without_replacement")
            effective = (2.0 / c) * noise + prior_curvature
        else:
            c = jnp.asarray(2.0, noise.dtype)
            effective = noise
        injection = ks.injection
        if self._prior_noise:
            # Thm. 3: injected noise Ξ = Λ⁺ enters P like gradient noise
            injection = psd_factor(prior_curvature).astype(noise.dtype)
            effective = effective + (injection @ injection.T if injection.ndim == 2 else injection**2)
        precond, eps = kl_optimal_preconditioner(
            self._preconditioner, noise if user is not None else effective, 2.0, user,
            potential.num_data, potential.batch_size,
        )
        # KL-optimal rate with damping μ is μ ε* (Eq. 31); a user ε is taken as given (Eq. 27)
        factor = ks.momentum if user is None else 1.0
        return ks._replace(
            preconditioner=(precond * factor).astype(noise.dtype),
            step_size=jnp.asarray(eps * factor, noise.dtype),
            correction=jnp.asarray(c, noise.dtype),
            noise_cov=noise,
            injection=injection,
        )

    def _sample_update(self, rng_key, step, theta, ks, oracle):
        pe, grad = oracle.grad(rng_key, theta)
        if self._prior_noise:
            z = random.normal(random.fold_in(rng_key, 1), theta.shape, theta.dtype)
            grad = grad + (ks.injection @ z if ks.injection.ndim == 2 else ks.injection * z)
        theta, velocity = constant_sgd_step(theta, ks.velocity, grad, ks.preconditioner, ks.momentum)
        return theta, ks._replace(velocity=velocity), pe, oracle.batch_size

    def predicted_covariance(self, state, *model_args, at=None, chain=0, discrete=True, **model_kwargs):
        """Stationary covariance of the frozen chain predicted by the Lyapunov equation.

        Σ solves P A Σ + Σ A P = P Q P (Mandt Eq. 13/22; ``discrete=True``: the exact law of
        the linear recursion, see :func:`~numpyro_sgd.theory.lyapunov_covariance`), with P and Q
        the frozen preconditioner and noise estimate of ``state`` and A the Hessian of the
        full-data potential at ``at`` (default: the chain's current point; pass the posterior
        mode or the sample mean, e.g. ``potential.view.ravel`` of the mean of
        ``mcmc.get_samples()`` mapped to the unconstrained scale). Compare it with the covariance
        of the unconstrained draws (``extra_fields=("z",)``) as in the paper's Fig. 2.

        :return: Σ, a (D, D) NumPy array in the order of ``self.potential.view.names``.
        """
        import numpy as np

        from .theory import lyapunov_covariance

        if self._momentum != 1.0:
            raise ValueError("ConstantSGD.predicted_covariance: the Lyapunov prediction assumes momentum=1 (Eq. 13).")
        pick = (lambda x: x[chain]) if jnp.ndim(state.i) > 0 else (lambda x: x)
        ks = jax.tree.map(pick, state.kernel_state)
        potential = self.potential
        theta = potential.view.ravel(jax.tree.map(pick, state.z)) if at is None else jnp.asarray(at)
        hessian = jax.hessian(potential.full_potential)(theta, model_args, model_kwargs)
        noise = np.asarray(ks.noise_cov)
        if self._prior_noise:  # the injected noise adds to the gradient noise
            f = np.asarray(ks.injection)
            noise = (np.diag(noise) if noise.ndim == 1 else noise) + (f @ f.T if f.ndim == 2 else np.diag(f**2))
        return lyapunov_covariance(np.asarray(ks.preconditioner), np.asarray(hessian), noise, discrete=discrete)

    def _diagnostics(self, ks):
        return f"ε {float(ks.step_size):.3g}"

