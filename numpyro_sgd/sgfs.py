"""Stochastic gradient Fisher scoring (Ahn, Korattikara & Welling 2012), in the form analysed by
Mandt, Hoffman & Blei (2017), Sec. 4.2, Thm. 3, Cor. 2.

Algorithm (U units, see :func:`~numpyro_sgd.noise.sgfs_preconditioner`):

    warmup   reach the mode, estimate the gradient-noise covariance Q (shared warmup);
    sample   Q ← running mean of the per-example gradient covariance (κ_t = 1/t, online Fisher)
             every ``refresh_every`` steps: M = a Q + ∇²U_prior + Ξ, Ξ from the step cap, Cholesky
             ξ ~ N(0, Ξ)                                   (injected noise, 4B/ε in Ahn et al.)
             θ ← θ − 2 M⁻¹ (∇Û_S(θ) + ξ)                   (Eq. 35 with H = H* of Eq. 36)
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax, random

from .base import is_positive_scalar
from .noise import discrete_time_correction, sgfs_direction, sgfs_preconditioner
from .warmup import NoiseAdaptingKernel, WarmupState

__all__ = ["SGFS", "SGFSState", "sgfs_step"]


class SGFSState(NamedTuple):
    """Kernel state of :class:`SGFS` (one chain)."""

    #: Q, the gradient-noise covariance of ∇Û_S (online mean; diag (D,) or full (D, D))
    noise_cov: jnp.ndarray
    #: Cholesky factor of M = a Q + Ξ (full) or the vector M (diag), refreshed every few steps
    factor: jnp.ndarray
    #: diagonal of the injected noise covariance Ξ (gradient units)
    injected: jnp.ndarray
    #: a = f + S/N (Ahn's γ S/N; 1 + S/N with replacement)
    ratio: jnp.ndarray
    #: Hessian of the prior and Jacobian terms at the end of warmup (diag (D,) or full (D, D))
    prior_curvature: jnp.ndarray
    #: cap p_max = ε h_max / N on the diagonal of P = 2 M⁻¹ (inf: no cap)
    max_precond: jnp.ndarray
    #: refresh period of the factorisation, in SG steps
    refresh_every: jnp.ndarray
    #: warmup state, whose noise estimator keeps averaging during sampling (online Fisher)
    warmup: WarmupState


def sgfs_step(rng_key, theta, grad, factor, injected):
    """θ ← θ − 2 M⁻¹ (∇Û_S + ξ), ξ ~ N(0, diag(Ξ))  (Mandt Eq. 35–36; Ahn et al. Eq. 14)."""
    xi = jnp.sqrt(injected) * random.normal(rng_key, theta.shape, theta.dtype)
    return theta - sgfs_direction(factor, grad + xi)


class SGFS(NoiseAdaptingKernel):
    """Stochastic gradient Fisher scoring with the KL-optimal preconditioner and a step cap.

    **References:**

    1. *Bayesian Posterior Sampling via Stochastic Gradient Fisher Scoring*, S. Ahn,
       A. Korattikara, M. Welling, ICML 2012 (Alg. 1, Eq. 14).
    2. *Stochastic Gradient Descent as Approximate Bayesian Inference*, S. Mandt, M. D. Hoffman,
       D. M. Blei, JMLR 2017: Eq. 35 (update), Thm. 3 / Eq. 36 (H*), Cor. 2 (diagonal truncation,
       stability rule).

    ==============================  ==========================================================
    paper                           here (U units: P = ε H / N, Q = N² C / S)
    ==============================  ==========================================================
    ε (Mandt Eq. 35)                ``step_size`` (default 1; only scales the cap ε h_max)
    h_max (Mandt Cor. 2)            ``max_step``: every H_kk ≤ h_max
    BBᵀ = C/S                       Q, estimated in warmup and online (Ahn's empirical Fisher)
    EEᵀ                             Ξ ε / N², chosen by the stability rule
    Ahn: γ = (S + N)/S              the factor a = f + S/N in M = a Q + Ξ (γ N Î = (1 + S/N) Q)
    Ahn: injected noise N(0, 4B/ε)  ξ ~ N(0, Ξ) added to the gradient, Ξ ↔ 4B/ε
    Ahn: (γ N Î + 4B/ε)⁻¹ · 2       P = 2 M⁻¹ = 2 (a Q + Ξ)⁻¹
    ==============================  ==========================================================

    Without ``max_step`` no noise is injected (Ξ = 0) and SGFS-f is constant SGD with the full
    preconditioner 2 ((1 + S/N) Q + ∇²U_prior)⁻¹ whose Q keeps being averaged (online Fisher);
    the prior's curvature (computed once at the end of warmup) keeps prior-dominated directions
    stable, as for :class:`~numpyro_sgd.ConstantSGD`. The diagonal
    variant (``preconditioner="diag"``, Cor. 2) costs O(S·D) per step; its stationary law is
    biased on correlated posteriors (marginal variances too small), as the Lyapunov equation
    with the truncated preconditioner predicts.

    .. note:: For ``"full"`` the cap is met with isotropic injected noise δ I (bounding the
       largest eigenvalue of H, hence every H_kk); the per-coordinate rule of Cor. 2 is used for
       ``"diag"``. Full-matrix work is a Cholesky factorisation every ``refresh_every`` steps
       and two triangular solves per step; no matrix is inverted.

    :param model: NumPyro model with a subsample plate.
    :param str preconditioner: ``"full"`` (default) or ``"diag"``.
    :param float step_size: Mandt's ε > 0 (default 1).
    :param float max_step: h_max > 0 (default: no cap).
    :param int refresh_every: SG steps between refactorisations of M (default 1 for diag, 10 for full).
    :param bool online: keep averaging Q during sampling (Ahn et al.; default True). Costs the
        per-example gradients every step; with False Q is frozen after warmup.
    :param kwargs: warmup options of :class:`~numpyro_sgd.warmup.NoiseAdaptingKernel` and
        :class:`~numpyro_sgd.base.SGKernel` options.

    .. doctest::

        >>> import jax, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from numpyro_sgd import SGFS
        >>> y = jax.random.normal(jax.random.key(1), (2000,)) + 3.0
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=100) as idx:
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=y[idx])
        >>> mcmc = MCMC(SGFS(model, max_step=0.05), num_warmup=500, num_samples=2000, progress_bar=False)
        >>> mcmc.run(jax.random.key(0), y)
        >>> sd = float(mcmc.get_samples()["mu"].std())  # posterior sd is 1/sqrt(2000) = 0.022
        >>> bool(0.015 < sd < 0.03)
        True
    """

    def __init__(self, model, preconditioner="full", *, step_size=None, max_step=None, refresh_every=None,
                 online=True, **kwargs):
        if preconditioner not in ("full", "diag"):
            raise ValueError(f"SGFS: unknown preconditioner {preconditioner!r}; choose 'full' or 'diag'.")
        if step_size is not None and not is_positive_scalar(step_size):
            raise ValueError(f"SGFS: step_size must be a positive float (Mandt's ε), got {step_size!r}.")
        if max_step is not None and not is_positive_scalar(max_step):
            raise ValueError(f"SGFS: max_step (h_max) must be a positive float or None (no cap), got {max_step!r}.")
        refresh_every = (1 if preconditioner == "diag" else 10) if refresh_every is None else refresh_every
        if not isinstance(refresh_every, int) or refresh_every < 1:
            raise ValueError(f"SGFS: refresh_every must be an integer >= 1, got {refresh_every!r}.")
        super().__init__(model, full_noise=preconditioner == "full", **kwargs)
        self._preconditioner = preconditioner
        self._step_size = 1.0 if step_size is None else float(step_size)
        self._max_step = max_step
        self._refresh_every = refresh_every
        self._online = online

    def _init_kernel_state(self, rng_key, theta, potential, num_warmup_steps):
        d, dtype = theta.shape[0], theta.dtype
        full = self._preconditioner == "full"
        cap = jnp.inf if self._max_step is None else self._step_size * self._max_step / potential.num_data
        return SGFSState(
            noise_cov=jnp.zeros((d, d) if full else (d,), dtype),
            factor=jnp.full((d, d) if full else (d,), jnp.nan, dtype),
            injected=jnp.zeros(d, dtype),
            ratio=jnp.asarray(jnp.nan, dtype),
            prior_curvature=jnp.zeros((d, d) if full else (d,), dtype),
            max_precond=jnp.asarray(cap, dtype),
            refresh_every=jnp.asarray(self._refresh_every, jnp.int32),
            warmup=self._init_warmup(theta, potential, num_warmup_steps),
        )

    def _refresh(self, ks):
        noise = sum(self._plate_noise(ks))
        # M = a Q + ∇²U_prior + Ξ: the exact discrete-time optimum 2 (total noise + A)⁻¹ with
        # A ≈ (S/N) Q + ∇²U_prior (see ConstantSGD's note on the discrete-time correction)
        base = ks.ratio * noise + ks.prior_curvature
        factor, injected = sgfs_preconditioner(self._preconditioner, base, 1.0, ks.max_precond)
        return ks._replace(noise_cov=noise, factor=factor, injected=injected)

    def _end_warmup(self, ks, theta, oracle):
        potential = self.potential
        # a = 2 / c with c the discrete-time correction of ConstantSGD: Ahn's γ S/N = 1 + S/N
        c = discrete_time_correction(self._plate_noise(ks), potential.plates, self._subsample == "without_replacement")
        prior = oracle.prior_hessian(theta, diagonal=self._preconditioner == "diag")
        return self._refresh(ks._replace(ratio=jnp.asarray(2.0 / c, ks.ratio.dtype), prior_curvature=prior))

    def _sample_update(self, rng_key, step, theta, ks, oracle):
        k_idx, k_noise = random.split(rng_key)
        idx = oracle.draw(k_idx)
        if self._online:
            pe, grad, per_example = oracle.per_example_grads(theta, idx)
            noise_state = self._estimator().update(ks.warmup.noise_state, per_example)
            ks = ks._replace(warmup=ks.warmup._replace(noise_state=noise_state))
            refresh = (step - ks.warmup.window_start) % ks.refresh_every == 0
            ks = lax.cond(refresh, self._refresh, lambda k: k, ks)
        else:
            pe, grad = oracle.potential_and_grad(theta, idx)
        theta = sgfs_step(k_noise, theta, grad, ks.factor, ks.injected)
        return theta, ks, pe, oracle.batch_size

    def effective_preconditioner(self, state, chain=0):
        """Mandt's H (the matrix multiplying ε ĝ), as a dense (D, D) NumPy array: N P / ε."""
        import numpy as np

        pick = (lambda x: x[chain]) if jnp.ndim(state.i) > 0 else (lambda x: x)
        factor = np.asarray(pick(state.kernel_state.factor))
        d = factor.shape[0]
        p = np.asarray(sgfs_direction(jnp.asarray(factor), jnp.eye(d, dtype=factor.dtype)))
        return p * self.potential.num_data / self._step_size

    def _diagnostics(self, ks):
        return f"injected noise {float(jnp.mean(ks.injected)):.3g}"
