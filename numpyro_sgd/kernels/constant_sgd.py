"""Constant-rate SGD as approximate Bayesian inference (Mandt, Hoffman & Blei 2017, Sec. 3).

Algorithm (Mandt, Hoffman & Blei 2017, Sec. 3-4):

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
import numpy as np
from jax import random

from ..adaptation.noise_warmup import WarmupState, noise_warmup, pop_warmup_options, warmup_step_of
from ..adaptation.relaxation import predicted_relaxation
from ..driver.kernel import SGKernel
from ..minibatch.law import law_of
from ..numerics.noise import discrete_time_correction as correction_factor
from ..numerics.noise import effective_curvature, fisher_curvature
from ..numerics.preconditioners import (
    PRECONDITIONERS,
    apply_preconditioner,
    kl_optimal_preconditioner,
    psd_factor,
    psd_part,
    resolve_preconditioner,
)
from ..numerics.step_rules import curvature_spectrum, relaxation_steps, unknown_spectrum
from ..numerics.theory import ar1_autocorrelation_time
from ..protocol import SampleBlock, SGAlgorithm, StepInfo, pick_chain
from ..validation import check_choice, check_number, check_positive

__all__ = ["ConstantSGD", "ConstantSGDState", "constant_sgd", "constant_sgd_step"]


class ConstantSGDState(NamedTuple):
    """State of the :func:`constant_sgd` algorithm (one chain)."""

    #: P = (ε/N) B, frozen at the end of warmup: shape () scalar, (D,) diag/sqrt, (D, D) full;
    #: includes the momentum factor μ
    preconditioner: jnp.ndarray
    #: ε in Mandt's units (H = ε B), the KL-optimal ε* unless ``step_size`` was given
    step_size: jnp.ndarray
    #: momentum μ ∈ (0, 1] of Eq. 27 (1: plain SGD)
    momentum: jnp.ndarray
    #: velocity v of the momentum update (zeros without momentum)
    velocity: jnp.ndarray
    #: discrete-time factor c replacing 2 in H* (see :func:`~numpyro_sgd.numerics.noise.discrete_time_correction`)
    correction: jnp.ndarray
    #: estimated gradient-noise covariance Q of ∇Û_S (diag (D,) or full (D, D)), frozen after warmup
    noise_cov: jnp.ndarray
    #: factor F of the injected gradient noise Ξ = F Fᵀ (``prior_noise=True``; zeros otherwise):
    #: (D, D) for ``"full"``, else (D,) with Ξ = diag(F²)
    injection: jnp.ndarray
    #: warmup state (Adam, uncentred moment, noise estimator; see :mod:`numpyro_sgd.adaptation.noise_warmup`)
    warmup: WarmupState
    #: SG steps per returned sample when the kernel chooses them: ⌈N/S⌉, raised at the end of
    #: warmup to the frozen dynamics' relaxation time (:func:`~numpyro_sgd.numerics.step_rules.relaxation_steps`)
    steps_per_sample: jnp.ndarray
    #: the rates of the frozen recursion's directions, eigenvalues of P A from the diagonal of the
    #: curvature A ≈ (S/N) Q + Λ⁺ (:class:`~numpyro_sgd.numerics.step_rules.Spectrum`, set at the end of warmup;
    #: the prediction of the slowest direction's relaxation reads it); empty for ``"full"``, whose
    #: steps per sample are its relaxation time
    spectrum: tuple = ()


#: the fix the warning names for a direction the scalar or square-root preconditioner leaves frozen
_FROZEN_FIX = ("Use preconditioner='full' (or 'auto', full up to D = 1000): its steps relax every direction alike, or "
               "rescale the model's variables (e.g. standardise the predictors) to comparable posterior sds.")


def constant_sgd_step(theta, velocity, grad, preconditioner, momentum):
    """One sampling step, Mandt et al. Eq. 15 / Eq. 27 (H = N P, ĝ_S = ∇Û_S / N).

    v ← (1 − μ) v − P ∇Û_S   (at the optimum P carries the factor μ: ε_μ = μ ε*, Eq. 31)
    θ ← θ + v                (μ = 1: θ ← θ − P ∇Û_S, Eq. 15)
    """
    velocity = (1.0 - momentum) * velocity - apply_preconditioner(preconditioner, grad)
    return theta + velocity, velocity


def _describe(state):
    """Progress-bar text: the frozen ε, or that warmup is still estimating it."""
    eps = float(state.step_size)
    return f"ε {eps:.3g}" if np.isfinite(eps) else "warmup: estimating ε"


def constant_sgd(potential, *, preconditioner="auto", step_size=None, momentum=1.0, discrete_time_correction=True,
                 prior_noise=False, subsample="with_replacement", name="ConstantSGD", measure_relaxation=True,
                 **warmup_options):
    """The constant-SGD algorithm (:class:`ConstantSGD`) for a traced model.

    :param potential: the :class:`~numpyro_sgd.model.potential.SubsampledPotential` (plates, N, S, D).
    :param bool measure_relaxation: with the full preconditioner at the KL-optimal rate, measure the
        relaxation time at the end of warmup and return it as the steps per sample (False: the
        user fixed ``steps_per_sample``; no Hessian is taken).
    :return: :class:`~numpyro_sgd.SGAlgorithm`.
    """
    preconditioner = resolve_preconditioner(preconditioner, potential.dim)
    full = preconditioner == "full"
    noise_factor = law_of(subsample).noise_factor  # f of Cov ξ = f Q (minibatch.law)
    # the KL-optimal chain forgets its start in about one data pass when the model is well
    # specified; with the full P its own relaxation time is measured at the end of warmup, from
    # the Hessian the warmup's Newton check took (or, without that check, one taken there)
    adapts_steps = measure_relaxation and full and step_size is None and momentum == 1.0
    warmup = noise_warmup(potential, full, name, **warmup_options, keep_hessian=adapts_steps)

    def init(rng_key, theta, num_warmup_steps):
        d, dtype = theta.shape[0], theta.dtype
        nan = jnp.asarray(jnp.nan, dtype)
        shape = {"scalar": (), "diag": (d,), "sqrt": (d,), "full": (d, d)}[preconditioner]
        return ConstantSGDState(
            preconditioner=jnp.full(shape, jnp.nan, dtype), step_size=nan, momentum=jnp.asarray(momentum, dtype),
            velocity=jnp.zeros(d, dtype), correction=nan, noise_cov=jnp.zeros((d, d) if full else (d,), dtype),
            injection=jnp.zeros((d, d) if full else (d,), dtype),
            warmup=warmup.init(theta, num_warmup_steps),
            steps_per_sample=jnp.asarray(potential.steps_per_pass, jnp.int32),
            spectrum=() if full else unknown_spectrum(dtype),
        )

    warmup_step = warmup_step_of(warmup)

    def end_warmup(theta, state, oracle):
        summary = warmup.final(state.warmup, theta, oracle)
        noise = summary.noise
        # exact discrete-time optimum P = 2 (f Q + A)⁻¹ (see the class notes) or Mandt's 2 Q⁻¹
        if discrete_time_correction:
            c = correction_factor(summary.plate_noise, potential.plates, noise_factor)
            effective = effective_curvature(summary, potential.plates, noise_factor)
        else:
            c, effective = jnp.asarray(2.0, noise.dtype), noise
        injection = state.injection
        if prior_noise:  # Thm. 3: injected noise Ξ = Λ⁺ enters P like gradient noise
            injection = psd_factor(summary.prior_curvature).astype(noise.dtype)
            effective = effective + (injection @ injection.T if full else injection**2)
        # a user ε is the same path with ε given (H = ε B; Eq. 27 takes it as is); the
        # KL-optimal rate with momentum μ is μ ε* (Eq. 31)
        precond, eps = kl_optimal_preconditioner(preconditioner, effective if step_size is None else noise, 2.0,
                                                 step_size, potential.num_data, potential.batch_size)
        factor = state.momentum if step_size is None else 1.0
        if adapts_steps:  # the slowest direction of P A sets the steps per returned sample
            hessian = state.warmup.hessian
            if jnp.ndim(hessian) != 2:  # no Newton check in this warmup (warmup_newton=False, D > 1000)
                hessian = oracle.hessian_estimate(theta)
            steps = relaxation_steps(precond, hessian, potential.steps_per_pass)
            state = state._replace(steps_per_sample=steps)
        if not full:  # the diagonal of P A: rates P_k A_kk (Mandt Eq. 13's OU process, one per coordinate)
            curvature = fisher_curvature(summary._replace(prior_curvature=psd_part(summary.prior_curvature)),
                                         potential.plates)
            state = state._replace(spectrum=curvature_spectrum(curvature, precond * factor))
        return state._replace(preconditioner=(precond * factor).astype(noise.dtype),
                              step_size=jnp.asarray(eps * factor, noise.dtype), correction=jnp.asarray(c, noise.dtype),
                              noise_cov=noise, injection=injection)

    def sample_step(rng_key, step, theta, state, oracle):
        pe, grad, indices = oracle.grad(rng_key, theta)                      # ĝ_S(θ_t)
        if prior_noise:                                                      # + ξ ~ N(0, Ξ) (Thm. 3)
            z = random.normal(random.fold_in(rng_key, 1), theta.shape, theta.dtype)
            grad = grad + apply_preconditioner(state.injection, z)
        if momentum == 1.0:  # Eq. 15: θ ← θ − P ∇Û_S (Eq. 27 at μ = 1; the velocity is not carried)
            theta, _ = constant_sgd_step(theta, state.velocity, grad, state.preconditioner, 1.0)
            return theta, state, StepInfo(pe, oracle.batch_size, indices, True)
        theta, velocity = constant_sgd_step(theta, state.velocity, grad, state.preconditioner, state.momentum)
        return theta, state._replace(velocity=velocity), StepInfo(pe, oracle.batch_size, indices, True)

    def relaxation(state):
        """The slowest direction of the frozen recursion θ ← θ − P ∇Û_S near the mode, an AR(1) with
        ρ = 1 − μ_min (:func:`~numpyro_sgd.numerics.theory.ar1_autocorrelation_time`), μ_min the smallest rate
        P_k A_kk. From the diagonal of A, so a lower bound on the time (λ_min(P^½ A P^½) ≤ min_k
        P_k A_kk): it finds what a scalar or square-root P leaves frozen on badly scaled
        coordinates, not the slowness of correlations that ``"diag"`` leaves (whose rates spread
        only between data- and prior-dominated coordinates, a spread not named as frozen). With
        momentum μ the slow directions are overdamped and relax at the rate μ_min / μ (P includes
        the factor μ)."""
        spectrum = jax.tree.map(np.asarray, state.spectrum)
        steps = ar1_autocorrelation_time(spectrum.lowest / float(momentum))
        return predicted_relaxation(steps, spectrum, f"of the model's coordinates (preconditioner={preconditioner!r})",
                                    None if preconditioner == "diag" else _FROZEN_FIX, potential.view)

    # the KL-optimal chain forgets its start in about one data pass: P ≈ 2 (Q + A)⁻¹ with
    # Q ≈ (N/S) A gives P A ≈ (2S/N) I, an AR(1) with ρ = 1 − 2S/N whose integrated
    # autocorrelation time (1 + ρ)/(1 − ρ) is ≈ N/S steps (a user ε sets its own time scale);
    # with the full P the end of warmup measures it (misspecified models: several passes)
    block = SampleBlock(steps=potential.steps_per_pass if step_size is None else None,
                        chosen=(lambda state: state.steps_per_sample) if adapts_steps else None,
                        relaxation=None if full else relaxation)
    return SGAlgorithm(init, sample_step, warmup_step=warmup_step, end_warmup=end_warmup, block=block,
                       describe=_describe)


class ConstantSGD(SGKernel):
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
    μ (Eq. 27)             ``momentum`` (1 = no momentum)
    =====================  ============================================================

    Warmup (``num_warmup * steps_per_sample`` SG steps; :mod:`numpyro_sgd.adaptation.noise_warmup`): Adam, then
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
       (:func:`~numpyro_sgd.numerics.noise.discrete_time_correction` gives c = 2/(f + S/N)). Set
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
       is strongly correlated (measured); prefer ``"full"`` there.

    .. note:: **Frozen directions.** The scalar and square-root P contract a coordinate at the rate
       P_k A_kk per SG step, so on badly scaled coordinates one relaxes far slower than another
       (predictors in units 10⁻³ and 10³: rates 10¹⁰ (scalar) and 10⁴ (sqrt) apart, sds 0.19× and
       0.16× the posterior's along the slow one). For every non-full P the end of warmup predicts
       the slowest coordinate's autocorrelation time, (2 − μ)/μ SG steps at the smallest
       μ = P_k A_kk (momentum: μ/μ_momentum), and warns during ``mcmc.run`` when the run is under
       20 of it, naming the coordinate when the rates span more than 100×. From the diagonal of
       A, it is a lower bound: correlations (the diagonal variant's weakness) are not seen.

    **Units of** ``step_size``. Mandt et al.'s ε, a learning rate on the average loss L = U/N: a step is θ ← θ
    − ε B ∇L̂ = θ − (ε/N) B ∇Û_S (Eq. 15), so ε does not grow or shrink with N. Default: the KL-optimal ε* of
    the warmup noise estimate.

    :param model: NumPyro model with a subsample plate.
    :param str preconditioner: ``"scalar"``, ``"diag"``, ``"full"``, ``"sqrt"`` or ``"auto"`` (default:
        ``"full"`` up to D = 1000, ``"diag"`` above; :data:`~numpyro_sgd.numerics.preconditioners.AUTO_FULL_MAX_DIM`).
    :param float step_size: ε in Mandt's units overriding ε* (optional).
    :param float momentum: μ ∈ (0, 1] of Eq. 27 (v ← (1 − μ) v − P ∇Û_S): the velocity keeps 1 − μ of
        itself per step, so 1 (default) is plain SGD and a smaller μ is more momentum (μ = 1 − β for
        the heavy-ball β that optax calls ``momentum``); the paper's name is kept.
    :param bool discrete_time_correction: use c = 2/(f + S/N) instead of 2 (default True).
    :param bool prior_noise: inject gradient noise with the prior's curvature (see the note;
        default False; needs the KL-optimal rate, i.e. no ``step_size``).
    :param kwargs: warmup options of :func:`~numpyro_sgd.adaptation.noise_warmup.noise_warmup`
        (``noise_estimator``, ``adam_fraction``, ``noise_window``, ``adam_lr``, ``warmup_max_step``,
        ``warmup_newton``)
        and of :class:`~numpyro_sgd.driver.kernel.SGKernel` (``steps_per_sample``, ``subsample``,
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

    def __init__(self, model, *, preconditioner="auto", step_size=None, momentum=1.0,
                 discrete_time_correction=True, prior_noise=False,
                 **kwargs):
        check_choice("ConstantSGD", "preconditioner", preconditioner, ("auto",) + PRECONDITIONERS)
        self._warmup_options = pop_warmup_options("ConstantSGD", kwargs, True)
        super().__init__(model, **kwargs)
        step_size = check_positive("ConstantSGD", "step_size", step_size, "a positive float or None (use ε*)",
                                   allow_none=True)
        if not 0 < check_number("ConstantSGD", "momentum", momentum) <= 1:
            raise ValueError(
                f"ConstantSGD: momentum (μ of Mandt Eq. 27) must lie in (0, 1], got {momentum}; 1 means no momentum."
            )
        if prior_noise and step_size is not None:
            raise ValueError(
                "ConstantSGD: prior_noise=True sets the rate from the injected noise (Mandt Thm. 3); "
                "drop step_size, or set prior_noise=False to use your step size."
            )
        self._options = dict(preconditioner=preconditioner, step_size=None if step_size is None else float(step_size),
                             momentum=float(momentum), discrete_time_correction=bool(discrete_time_correction),
                             prior_noise=bool(prior_noise))

    def _build(self, potential, adapt_steps_per_sample=True):
        # the relaxation time is measured only where the algorithm chooses the steps per sample
        # (not for a user's steps_per_sample, nor inside a wrapper: see SGKernel.build)
        return constant_sgd(potential, **self._options, subsample=self._driver.subsample,
                            measure_relaxation=adapt_steps_per_sample, **self._warmup_options)

    def predicted_covariance(self, state, *model_args, at=None, chain=0, discrete=True, **model_kwargs):
        """Stationary covariance of the frozen chain predicted by the Lyapunov equation.

        Σ solves P A Σ + Σ A P = P Q P (Mandt Eq. 13/22; ``discrete=True``: the exact law of
        the linear recursion, see :func:`~numpyro_sgd.numerics.theory.lyapunov_covariance`), with P and Q
        the frozen preconditioner and noise estimate of ``state`` (plus the injected noise of
        ``prior_noise=True``) and A the Hessian of the full-data potential at ``at`` (default:
        the chain's current point). Compare it with the covariance of the unconstrained draws
        (``extra_fields=("z",)``) as in the paper's Fig. 2.

        :return: Σ, a (D, D) NumPy array in the order of ``self.potential.view.names``.
        """
        import numpy as np

        from ..numerics.theory import lyapunov_covariance

        if self._options["momentum"] != 1.0:
            raise ValueError("ConstantSGD.predicted_covariance: the Lyapunov prediction assumes momentum=1 (Eq. 13).")
        one = pick_chain(state, chain)
        ks = one.kernel_state
        hessian = self.potential.full_hessian(one.z if at is None else at, model_args, model_kwargs)
        noise = np.asarray(ks.noise_cov)
        f = np.asarray(ks.injection)  # the injected noise adds to the gradient noise (zero without it)
        noise = (np.diag(noise) if noise.ndim == 1 else noise) + (f @ f.T if f.ndim == 2 else np.diag(f**2))
        return lyapunov_covariance(np.asarray(ks.preconditioner), hessian, noise, discrete=discrete)
