"""Stochastic gradient Fisher scoring (Ahn, Korattikara & Welling 2012), in the form analysed by
Mandt, Hoffman & Blei (2017), Sec. 4.2, Thm. 3, Cor. 2.

Algorithm (U units, see :func:`~numpyro_sgd.numerics.preconditioners.sgfs_preconditioner`):

    warmup   reach the mode, estimate the gradient-noise covariance Q (shared warmup,
             :mod:`numpyro_sgd.adaptation.noise_warmup`); freeze a = 2/c (c the discrete-time correction) and
             the prior's curvature ∇²U_prior; M = a Q + ∇²U_prior + Ξ, Ξ from the step cap
    sample   Q ← running mean of the per-example gradient covariance (κ_t = 1/t, online Fisher)
             every ``refresh_every`` steps: M = a Q + ∇²U_prior + Ξ, Cholesky
             ξ ~ N(0, Ξ)                                   (injected noise, 4B/ε in Ahn et al.)
             θ ← θ − 2 M⁻¹ (∇Û_S(θ) + ξ)                   (Eq. 35 with H = H* of Eq. 36)
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax, random

from ..adaptation.noise_warmup import (
    WarmupState,
    WarmupSummary,
    noise_warmup,
    pop_warmup_options,
    warmup_step_of,
)
from ..driver.kernel import SGKernel
from ..minibatch.law import law_of
from ..numerics.noise import NoiseState, discrete_time_correction, effective_curvature
from ..numerics.preconditioners import psd_part, resolve_preconditioner, sgfs_direction, sgfs_preconditioner
from ..protocol import SampleBlock, SGAlgorithm, StepInfo, pick_chain
from ..validation import check_choice, check_int, check_positive

__all__ = ["SGFS", "SGFSState", "sgfs", "sgfs_step"]


class SGFSState(NamedTuple):
    """State of the :func:`sgfs` algorithm (one chain)."""

    #: Q, the gradient-noise covariance of ∇Û_S (online mean; diag (D,) or full (D, D))
    noise_cov: jnp.ndarray
    #: Cholesky factor of M = a Q + ∇²U_prior + Ξ (full) or the vector M (diag), refreshed every
    #: ``refresh_every`` steps
    factor: jnp.ndarray
    #: diagonal of the injected noise covariance Ξ (gradient units)
    injected: jnp.ndarray
    #: a = f + S/N (Ahn's γ S/N; 1 + S/N with replacement), frozen at the end of warmup
    ratio: jnp.ndarray
    #: Hessian of the prior and Jacobian terms at the end of warmup (diag (D,) or full (D, D))
    prior_curvature: jnp.ndarray
    #: cap p_max = ε h_max / N on the diagonal of P = 2 M⁻¹ (inf: no cap)
    max_precond: jnp.ndarray
    #: running state of the noise estimator of Q: warmup's average, which sampling keeps
    #: updating (online Fisher); sampling reads and writes this field, never ``warmup``
    noise_state: NoiseState
    #: warmup state (Adam, uncentred moment, noise estimator; see :mod:`numpyro_sgd.adaptation.noise_warmup`)
    warmup: WarmupState


def sgfs_step(rng_key, theta, grad, factor, injected):
    """θ ← θ − 2 M⁻¹ (∇Û_S + ξ), ξ ~ N(0, diag(Ξ))  (Mandt Eq. 35–36; Ahn et al. Eq. 14)."""
    xi = jnp.sqrt(injected) * random.normal(rng_key, theta.shape, theta.dtype)
    return theta - sgfs_direction(factor, grad + xi)


def sgfs(potential, *, preconditioner="auto", step_size=1.0, max_step=None, refresh_every=None, online=True,
         subsample="with_replacement", name="SGFS", **warmup_options):
    """The SGFS algorithm (:class:`SGFS`) for a traced model.

    :param potential: the :class:`~numpyro_sgd.model.potential.SubsampledPotential` (plates, N, S, D).
    :param str preconditioner: ``"full"``, ``"diag"`` or ``"auto"`` (:func:`~numpyro_sgd.numerics.preconditioners.resolve_preconditioner`).
    :param float step_size: Mandt's ε (only scales the cap ε h_max).
    :param float max_step: h_max (None: no cap, no injected noise).
    :param int refresh_every: SG steps between refactorisations of M (None: 1 for diag, 10 for full).
    :param bool online: keep averaging Q while sampling.
    :param kwargs: the warmup options of :func:`~numpyro_sgd.adaptation.noise_warmup.noise_warmup`.
    :return: :class:`~numpyro_sgd.SGAlgorithm`.
    """
    preconditioner = resolve_preconditioner(preconditioner, potential.dim)
    full = preconditioner == "full"
    refresh_every = (10 if full else 1) if refresh_every is None else refresh_every
    warmup = noise_warmup(potential, full, name, **warmup_options)
    noise_factor = law_of(subsample).noise_factor  # f of Cov ξ = f Q (minibatch.law)
    cap = jnp.inf if max_step is None else step_size * max_step / potential.num_data

    def init(rng_key, theta, num_warmup_steps):
        d, dtype = theta.shape[0], theta.dtype
        shape = (d, d) if full else (d,)
        ws = warmup.init(theta, num_warmup_steps)
        return SGFSState(
            noise_cov=jnp.zeros(shape, dtype), factor=jnp.full(shape, jnp.nan, dtype), injected=jnp.zeros(d, dtype),
            ratio=jnp.asarray(jnp.nan, dtype), prior_curvature=jnp.zeros(shape, dtype),
            max_precond=jnp.asarray(cap, dtype),
            noise_state=ws.noise_state, warmup=ws,
        )

    def factorize(state, noise, curvature):
        """M = ``curvature`` + Ξ (Cholesky or diagonal) and Ξ, with Q = ``noise`` stored."""
        # without a cap (and with the PSD curvature below) no eigenvalue is needed: Ξ = 0
        factor, injected = sgfs_preconditioner(preconditioner, curvature, 1.0,
                                               None if max_step is None else state.max_precond)
        return noise, factor, injected

    # the noise estimate sampling continues from (the same values as warmup's)
    warmup_step = warmup_step_of(warmup, also=lambda ws: {"noise_state": ws.noise_state})

    def end_warmup(theta, state, oracle):
        # Q from the noise estimate the chain continues (after warmup: warmup's own)
        summary = warmup.final(state.warmup._replace(noise_state=state.noise_state), theta, oracle)
        # the prior's curvature enters M as its PSD part (as in warmup): M = a Q + Λ⁺ is PSD
        summary = summary._replace(prior_curvature=psd_part(summary.prior_curvature))
        # a = 2 / c with c the discrete-time correction of ConstantSGD: Ahn's γ S/N = 1 + S/N;
        # M = a Q + ∇²U_prior + Ξ: the exact discrete-time optimum 2 (total noise + A)⁻¹ with
        # A ≈ (S/N) Q + ∇²U_prior (see ConstantSGD's note on the discrete-time correction)
        c = discrete_time_correction(summary.plate_noise, potential.plates, noise_factor)
        curvature = effective_curvature(summary, potential.plates, noise_factor)
        noise, factor, injected = factorize(state, summary.noise, curvature)
        return state._replace(noise_cov=noise, factor=factor, injected=injected,
                              ratio=jnp.asarray(2.0 / c, state.ratio.dtype), prior_curvature=summary.prior_curvature)

    def refresh(state, noise_state):
        summary = WarmupSummary(warmup.estimator.final(noise_state), state.prior_curvature)
        # the frozen a and ∇²U_prior with the current online Q (c is not re-weighted)
        return factorize(state, summary.noise, effective_curvature(summary, potential.plates, ratio=state.ratio))

    def sample_step(rng_key, step, theta, state, oracle):
        k_idx, k_noise = random.split(rng_key)
        indices = oracle.draw(k_idx)
        if online:
            pe, grad, per_example = oracle.per_example_grads(theta, indices)
            noise_state = warmup.estimator.update(state.noise_state, per_example)  # κ_t = 1/t (Ahn et al.)
            # at multiples of refresh_every: the step count is shared by all chains, so under
            # vmap this is a branch, not a refactorisation at every step
            due = step % refresh_every == 0
            noise, factor, injected = lax.cond(due, lambda ns: refresh(state, ns),
                                               lambda ns: (state.noise_cov, state.factor, state.injected), noise_state)
            state = state._replace(noise_state=noise_state, noise_cov=noise, factor=factor, injected=injected)
        else:
            pe, grad = oracle.potential_and_grad(theta, indices)
        theta = sgfs_step(k_noise, theta, grad, state.factor, state.injected)  # θ − 2 M⁻¹ (∇Û_S + ξ)
        return theta, state, StepInfo(pe, oracle.batch_size, indices, True)

    # 2 M⁻¹ A ≈ (2S/N) I as for ConstantSGD's optimum: an autocorrelation time of about one
    # data pass (longer where a step cap binds)
    return SGAlgorithm(init, sample_step, warmup_step=warmup_step, end_warmup=end_warmup,
                       block=SampleBlock(steps=potential.steps_per_pass),
                       describe=lambda state: f"injected noise {float(jnp.mean(state.injected)):.3g}")


class SGFS(SGKernel):
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
    ε (Mandt Eq. 35)                ``step_size`` (default 1; only scales the cap ε h_max, so it
                                    is refused without ``max_step``)
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
       and two triangular solves per step; no matrix is inverted. Without a cap no eigenvalue
       is computed: the prior's Hessian Λ (taken at the end of warmup) enters M as its positive
       semi-definite part Λ⁺, so M = a Q + Λ⁺ is PSD (an indefinite Λ used to be shifted by
       δ = −λ_min(a Q + Λ) instead; equal where Λ is PSD, as for every model of the tests).

    **Units of** ``step_size``. Mandt et al.'s ε (per-datum, as for :class:`ConstantSGD`); with the KL-optimal
    preconditioner the step ε H* does not depend on ε (Eq. 36), so ε only scales the step cap ε·h_max and is
    accepted only with ``max_step``.

    :param model: NumPyro model with a subsample plate.
    :param str preconditioner: ``"full"``, ``"diag"`` or ``"auto"`` (default: ``"full"`` up to D = 1000,
        ``"diag"`` above; :data:`~numpyro_sgd.numerics.preconditioners.AUTO_FULL_MAX_DIM`).
    :param float step_size: Mandt's ε > 0 (default 1); only with ``max_step``, since ε H* does not
        depend on ε (Eq. 36) and ε only scales the cap ε·h_max (a ``ValueError`` otherwise).
    :param float max_step: h_max > 0 (default: no cap).
    :param int refresh_every: SG steps between refactorisations of M (default 1 for diag, 10 for full).
    :param bool online: keep averaging Q during sampling (Ahn et al.; default True). Costs the
        per-example gradients every step; with False Q is frozen after warmup.
    :param kwargs: the warmup options ``noise_estimator``, ``adam_fraction``, ``noise_window``,
        ``adam_lr`` and ``warmup_max_step`` (see :func:`~numpyro_sgd.adaptation.noise_warmup.noise_warmup`) and the
        driver's options (:class:`~numpyro_sgd.driver.kernel.SGKernel`).

    .. doctest::

        >>> import jax, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from numpyro_sgd import SGFS
        >>> counts = jax.random.poisson(jax.random.key(1), 4.0, (2000,))
        >>> def poisson_model(counts):
        ...     rate = numpyro.sample("rate", dist.Gamma(1.0, 0.1))
        ...     with numpyro.plate("data", len(counts), subsample_size=100) as idx:
        ...         numpyro.sample("counts", dist.Poisson(rate), obs=counts[idx])
        >>> kernel = SGFS(poisson_model, max_step=0.05)  # a step cap: noise is injected where it binds
        >>> mcmc = MCMC(kernel, num_warmup=500, num_samples=2000, progress_bar=False)
        >>> mcmc.run(jax.random.key(0), counts)
        >>> sd = float(mcmc.get_samples()["rate"].std())  # Gamma posterior: sd = √(1 + Σy) / 2000.1 ≈ 0.045
        >>> bool(0.035 < sd < 0.055)
        True
    """

    def __init__(self, model, *, preconditioner="auto", step_size=None, max_step=None, refresh_every=None,
                 online=True,
                 **kwargs):
        check_choice("SGFS", "preconditioner", preconditioner, ("auto", "full", "diag"))
        step_size = check_positive("SGFS", "step_size", step_size, "a positive float (Mandt's ε)", allow_none=True)
        max_step = check_positive("SGFS", "max_step", max_step, "a positive float (h_max) or None (no cap)",
                                  allow_none=True)
        if step_size is not None and max_step is None:
            # with E = 0, ε H* = (2/N)(BBᵀ)⁻¹ (Eq. 36): ε cancels; it enters only the cap ε·h_max
            raise ValueError(
                f"SGFS: step_size={step_size!r} has no effect without max_step: the KL-optimal preconditioner "
                "H* = (2/N)(ε BBᵀ + EEᵀ)⁻¹ (Mandt Eq. 36) makes the step ε H* independent of ε, which only scales "
                "the step cap ε·h_max. Pass max_step=h_max as well to cap the step (Cor. 2), or leave step_size out.")
        refresh_every = check_int("SGFS", "refresh_every", refresh_every, allow_none=True)
        self._warmup_options = pop_warmup_options("SGFS", kwargs, True)
        super().__init__(model, **kwargs)
        self._options = dict(preconditioner=preconditioner, step_size=1.0 if step_size is None else float(step_size),
                             max_step=max_step, refresh_every=refresh_every, online=bool(online))

    def _build(self, potential, adapt_steps_per_sample=True):
        return sgfs(potential, **self._options, subsample=self._driver.subsample, **self._warmup_options)

    def effective_preconditioner(self, state, chain=0):
        """Mandt's H (the matrix multiplying ε ĝ), as a dense (D, D) NumPy array: N P / ε."""
        import numpy as np

        factor = pick_chain(state, chain).kernel_state.factor
        p = np.asarray(sgfs_direction(factor, jnp.eye(factor.shape[0], dtype=factor.dtype)))
        return p * self.potential.num_data / self._options["step_size"]
