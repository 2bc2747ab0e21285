"""Stochastic gradient Langevin dynamics (Welling & Teh 2011; Mandt et al. Sec. 4.1, Eq. 32) and
its RMSprop-preconditioned variant pSGLD (Li, Chen, Carlson & Carin 2016, Alg. 1).

SGLD's step is :func:`~numpyro_sgd.kernels.langevin.overdamped_ewsg_update` with M = 0 index steps (a uniform
minibatch), so :class:`~numpyro_sgd.OverdampedEWSG` with ``num_index_steps=0`` is SGLD at
temperature 1 by construction.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import random

from ..adaptation.adapted import AdaptedSteps, with_adapted
from ..adaptation.default_steps import check_coordinates, with_default_overdamped_step, with_default_steps
from ..adaptation.noise_warmup import pop_warmup_options
from ..adaptation.relaxation import with_predicted_relaxation
from ..driver.kernel import SGKernel
from ..model.groups import group_layout
from ..model.structure import classify_sites
from ..numerics.diffusions import exponential_overdamped_langevin, overdamped_langevin
from ..numerics.schedules import check_schedule
from ..numerics.step_rules import TARGET_INFLATION, check_target_inflation, curvature_spectrum, sgld_step_size
from ..numerics.theory import langevin_autocorrelation_time
from ..protocol import SGAlgorithm, StepInfo
from ..validation import check_control_variates, check_number, check_positive, check_step_size
from .group_sgld import group_sgld
from .langevin import overdamped_ewsg_update

__all__ = ["SGLD", "SGLDState", "PSGLD", "PSGLDState", "sgld", "psgld", "psgld_step"]


class SGLDState(NamedTuple):
    """Kernel state of :class:`SGLD`."""

    #: constant step size ε (unused when a schedule is given)
    step_size: jnp.ndarray
    #: temperature T (1 samples the posterior)
    temperature: jnp.ndarray
    #: the step size used at the last step (ε_t of the schedule)
    last_step_size: jnp.ndarray
    #: what the default steps adapted in warmup (:class:`~numpyro_sgd.adaptation.adapted.AdaptedSteps`:
    #: the noise warmup's state, the coordinates, the curvature spectrum, the control variates' centre)
    adapted: AdaptedSteps = AdaptedSteps()


def sgld(potential, *, step_size=None, temperature=1.0, target_inflation=TARGET_INFLATION,
         subsample="with_replacement", name="SGLD", coordinates="auto", control_variates=False,
         integrator="euler", **warmup_options):
    """The SGLD algorithm (:class:`SGLD`) for a traced model.

    :param potential: the :class:`~numpyro_sgd.model.potential.SubsampledPotential`.
    :param step_size: ε > 0, a schedule ``count -> ε_t`` (evaluated at the global SG step) or None:
        the noise warmup estimates Q and A and ``end_warmup`` sets ε =
        :func:`~numpyro_sgd.numerics.step_rules.sgld_step_size` (``target_inflation``).
    :param float temperature: T > 0.
    :param bool control_variates: control-variate gradients about the mode (:mod:`numpyro_sgd.adaptation.control_variates`).
    :param str integrator: ``"euler"`` (Welling & Teh Eq. 4) or ``"exponential"``
        (:func:`~numpyro_sgd.numerics.diffusions.exponential_overdamped_langevin`, exact for the Gaussian of
        the warmup's curvature basis, where the curvature is N).
    :return: :class:`~numpyro_sgd.SGAlgorithm` (a given step: no adaptation, warmup is burn-in).
    """
    schedule = step_size if callable(step_size) else None
    curvature = float(potential.num_data)  # of every direction in the curvature basis: Lᵀ A L = N I

    def init(rng_key, theta, num_warmup_steps):
        eps = jnp.nan if schedule is not None or step_size is None else step_size
        return SGLDState(jnp.asarray(eps, theta.dtype), jnp.asarray(temperature, theta.dtype),
                         jnp.asarray(0.0, theta.dtype))

    def step(rng_key, i, theta, state, oracle):
        eps = jnp.asarray(schedule(i) if schedule is not None else state.step_size, theta.dtype)   # ε_t
        # Welling & Teh Eq. 4 with a uniform minibatch: overdamped EWSG's step with M = 0
        theta, (pe, _, indices), _ = overdamped_ewsg_update(rng_key, theta, lambda key: oracle.grad(key, theta), eps,
                                                            0, state.temperature)
        return theta, state._replace(last_step_size=eps), StepInfo(pe, oracle.batch_size, indices, True)

    def exponential_step(rng_key, i, theta, state, oracle):
        k_batch, k_noise = random.split(rng_key)
        pe, grad, indices = oracle.grad(k_batch, theta)
        theta = exponential_overdamped_langevin(k_noise, theta, grad, state.step_size, curvature, state.temperature)
        return theta, state._replace(last_step_size=state.step_size), StepInfo(pe, oracle.batch_size, indices, True)

    return with_default_overdamped_step(
        SGAlgorithm(init, exponential_step if integrator == "exponential" else step,
                    describe=lambda state: f"step size {float(state.last_step_size):.3g}"),
        potential, name, step_size, target_inflation, subsample, warmup_options, coordinates,
        control_variates=control_variates, integrator=integrator)


def refuse_group_latents(potential, model_args, model_kwargs):
    """Raise when SGLD(control_variates=True) alone meets a random-effects model: group latents
    (:func:`~numpyro_sgd.model.groups.group_layout`) with hyperparameters
    (:func:`~numpyro_sgd.model.structure.classify_sites`). Its curvature and noise are dense in
    every latent, (D_g + G d_l)² floats, and the group scales' funnel is not near-Gaussian."""
    hyper, _ = classify_sites(potential, model_args, model_kwargs)
    if not hyper:
        return
    sites = group_layout(potential.restricted([n for n in potential.view.names if n not in hyper]), model_args,
                         model_kwargs, "SGLD")
    if sites is not None:
        raise ValueError(
            f"SGLD: control_variates=True on a random-effects model (group latents {list(sites.group)} in plate "
            f"'{sites.plate}', {sites.num_groups:,} groups; hyperparameters {hyper}): the flat kernel's curvature is "
            f"dense in all {potential.dim:,} latents and the group scales are not near-Gaussian. Use "
            "SGWithinGibbs(SGLD(model, control_variates=True)): control variates with the model's block-arrowhead "
            "curvature for the group latents, and the hyperparameters drawn exactly given them "
            "(docs/hierarchical_models.md).")


class SGLD(SGKernel):
    """Stochastic gradient Langevin dynamics, with a constant or decreasing step size.

    **References:**

    1. *Bayesian Learning via Stochastic Gradient Langevin Dynamics*, M. Welling, Y. W. Teh (2011), Eq. 4.
    2. *Stochastic Gradient Descent as Approximate Bayesian Inference*, S. Mandt, M. D. Hoffman,
       D. M. Blei (2017), Sec. 4.1, Eq. 32.

    ==========  ======================
    paper       argument
    ==========  ======================
    ε_t         ``step_size`` (float or schedule ``count -> ε``, e.g. :func:`robbins_monro`)
    T           ``temperature``
    N/n scale   NumPyro's subsample plate
    ==========  ======================

    Step sizes are in the units of NumPyro's potential U (a sum over all N data), as in
    Welling & Teh: θ ← θ − (ε/2) ∇Û_S + N(0, ε). With a given step size (or schedule) warmup
    steps use the same dynamics (burn-in); a schedule is evaluated at the global SG step count
    (warmup included).

    **Coordinates of the default steps.** With ``coordinates="auto"`` the sampling steps run
    in coordinates φ with θ = L φ, L Lᵀ = N A⁻¹ (A the curvature warmup estimated): the step
    preconditioned by the constant M = N A⁻¹, exact in the small-step limit like the plain one,
    and the rule below is applied to Lᵀ Q L and Lᵀ A L. The plain kernel needs λ_max/λ_min(A)
    times more steps to forget its start along the least-constrained direction (measured on a
    posterior with correlation −0.99: ESS 5 from 4 chains × 1,000 data passes, against 285 in
    the curvature's coordinates; ``benchmarks/langevin_defaults.py``). In either coordinates the
    end of warmup predicts the slowest direction's autocorrelation time, ≈ 4/(ε λ_min) SG steps
    from the warmup's curvature, and warns during ``mcmc.run`` when ``num_samples ×
    steps_per_sample`` is under 20 of it; with ``"scalar"`` and curvatures more than 100× apart the
    warning names the coordinate left nearly frozen (predictors in units 10⁻³ and 10³: sds
    0.006× the posterior's along it).

    **Default step size** (``step_size=None``). Warmup (``num_warmup × steps_per_sample`` SG
    steps) is the noise warmup of :class:`~numpyro_sgd.ConstantSGD` (:mod:`numpyro_sgd.adaptation.noise_warmup`:
    Adam towards the mode, then preconditioned SGD while the minibatch gradient-noise covariance
    Q is averaged); at its end ε is set, once, so that the stationary variance along the worst
    direction exceeds the target's by at most ``target_inflation`` τ:

        ε = 4τ / λ_max(Q/T + (1 + τ) A),   A ≈ (S/N) Q + Λ⁺

    (:func:`~numpyro_sgd.numerics.step_rules.sgld_step_size`: the minibatch-noise inflation εq/(4T) of Mandt
    et al. Sec. 4.1 / Eq. 32–33 plus the Euler bias εa/4, exact for a Gaussian whose Q and A
    commute; Λ⁺ the positive part of the prior's Hessian; with ``subsample="without_replacement"``
    Q carries the factor (N − S)/(N − 1)). The chosen ε is ``kernel_state.step_size``. Q is
    estimated in full up to D = 1000 (:data:`~numpyro_sgd.numerics.preconditioners.AUTO_FULL_MAX_DIM`), above only its
    diagonal (then λ_max is the largest diagonal entry, exact only for uncorrelated noise).

    .. note:: The rule the examples used before (ε = 4τ/λ_max(Q), ``examples/quickstart.py``)
       omits the Euler term: its inflation is τ(1 + S/N) + O(τ²), and it has no bound where Q
       vanishes (S = N, prior-dominated directions), where ε a ≥ 4 diverges.

    **Control variates and the exponential integrator** (``control_variates=True``; Baker,
    Fearnhead, Fox & Nemeth 2019, Alg. 2; :mod:`numpyro_sgd.adaptation.control_variates`). At the end of
    warmup the kernel takes damped Newton steps from the warmup's last point to the mode θ̂ (one
    streamed data pass each, in blocks of rows, never an N × D temporary), keeps U(θ̂) and
    ∇U(θ̂), estimates the Hessian H at θ̂ on 65,536 fixed rows and runs in the coordinates of H
    (θ = L φ, Lᵀ H L = N I). Every step's gradient is then ∇U(θ̂) + ∇Û_B(θ) − ∇Û_B(θ̂), both
    minibatch terms on the same rows (2S per-datum gradients): unbiased, with a noise that does
    not grow with N near the mode. The chain starts sampling at θ̂. The exponential step
    (:func:`~numpyro_sgd.numerics.diffusions.exponential_overdamped_langevin`) integrates the Gaussian of
    H exactly and holds the rest of the gradient over the step:

        φ' = e φ − ((1 − e)/N)(∇Û(φ) − N φ) + √((1 − e²)/N) ξ,   e = exp(−N ε/2).

    *What it samples*: exactly the posterior when it is the Gaussian of H (any step, any centre);
    otherwise a law whose variance along a direction of curvature λ N (λ = 1 for the Gaussian
    part) is off by abs(λ v − 1), v = ((1 − e²) + (1 − e)² q/N)/(1 − a²), a = e − (1 − e)(λ − 1), q the
    gradient noise's variance (:func:`~numpyro_sgd.numerics.step_rules.exponential_step_size`). *How ε is
    chosen*: at eight points a posterior sd from θ̂ (Laplace) the kernel measures, on 65,536
    fixed rows independent of H's, the control-variate noise Q and how far ∇U is from linear,
    δ = max ‖Lᵀ(∇U(θ) − ∇U(θ̂)) − φ‖/‖φ‖ (:func:`~numpyro_sgd.adaptation.control_variates.control_variate_noise`);
    N ε/2 is the largest step up to 4 whose variance error is ≤ ``target_inflation`` for λ = 1 ± δ
    and q = λ_max(Q). Near-Gaussian posteriors (large N) take N ε/2 = 4, about one effective
    sample per step; far from Gaussian (small N, near-separation, small counts) the step shrinks
    (measured: N ε/2 = 0.4–0.45 at δ = 0.11–0.18, draws within 0.05 posterior sd of NUTS's means
    and 6 % of its sds; ``benchmarks/cv_off_gaussian.py``), and the end-of-warmup prediction of
    the autocorrelation time (:func:`~numpyro_sgd.numerics.theory.exponential_autocorrelation_time`) warns
    when the run is too short for it. *Cost*: the centre takes 2–8 data passes (one centre for
    vectorized chains, from the mean of their warmups' ends), the Hessian and the noise measure
    about D × 65,536 and 16 × 65,536 per-datum gradients, each step 2S. The
    centre's passes are not in ``data_passes`` (which counts SG steps):
    ``kernel_state.adapted.control.passes`` holds them. Needs one subsample plate; refused inside
    :class:`~numpyro_sgd.SGWithinGibbs` and :class:`~numpyro_sgd.VariationalEM`, whose updates
    would move the centre's gradient.

    **Units of** ``step_size``. Welling & Teh's ε on the summed potential U: θ ← θ − (ε/2) ∇Û_S + √ε ξ, i.e.
    ε/2 is the time step of the Langevin diffusion dθ = −∇U dt + √2 dW. It shrinks like 1/N for a fixed
    posterior shape. A float or a schedule ``count -> ε_t``. Default: the ``target_inflation`` rule.

    :param model: NumPyro model with a subsample plate.
    :param step_size: float > 0, a schedule, or None (default: from the noise warmup, see above).
    :param float temperature: T > 0 (default 1, the posterior).
    :param float target_inflation: τ ∈ (0, 1), the tolerated relative excess of the stationary
        variance with the default step size (default 0.1; a given ``step_size`` wins).
    :param str coordinates: the coordinates the default steps run in: ``"auto"`` (default:
        those of the warmup's curvature A, :class:`~numpyro_sgd.adaptation.coordinates.CurvatureBasis`; in full up
        to D = 1000, its diagonal above), ``"full"``, ``"diag"``, or ``"scalar"`` (the model's
        own, the paper's kernel). With a given step size the kernel runs in the model's
        coordinates.
    :param bool control_variates: use control-variate gradients about the mode (default False;
        see below).
    :param str integrator: ``"euler"`` (Welling & Teh Eq. 4) or ``"exponential"`` (exact for the
        Gaussian part; see below). Default: ``"exponential"`` with ``control_variates=True``
        (and ``coordinates`` other than ``"scalar"``), else ``"euler"``.
    :param kwargs: see :class:`~numpyro_sgd.driver.kernel.SGKernel` (``steps_per_sample``, ``subsample``,
        ``warmup_subsample``, ``init_strategy``) and, with the default step size only, the warmup
        options of :class:`~numpyro_sgd.ConstantSGD` (``noise_estimator``, ``adam_fraction``,
        ``noise_window``, ``adam_lr``, ``warmup_max_step``).

    .. doctest::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from numpyro_sgd import SGLD, robbins_monro
        >>> x = jax.random.normal(jax.random.key(1), (1000,))
        >>> y = 2.0 * x + jax.random.normal(jax.random.key(2), (1000,))
        >>> def regression(x, y):
        ...     w = numpyro.sample("w", dist.Normal(0, 10))
        ...     with numpyro.plate("data", x.shape[0], subsample_size=50) as idx:
        ...         numpyro.sample("y", dist.Normal(w * x[idx], 1), obs=y[idx])
        >>> kernel = SGLD(regression, step_size=robbins_monro(1e-2, offset=100.0))  # ε_t = 1e-2 (100 + t)^-0.55
        >>> mcmc = MCMC(kernel, num_warmup=500, num_samples=500, progress_bar=False)
        >>> mcmc.run(jax.random.key(0), x, y)
        >>> w_hat = float(jnp.sum(x * y) / jnp.sum(x * x))  # the posterior mean, up to the prior
        >>> bool(abs(mcmc.get_samples()["w"].mean() - w_hat) < 0.05)
        True
    """

    def __init__(self, model, *, step_size=None, temperature=1.0, target_inflation=TARGET_INFLATION,
                 coordinates="auto", control_variates=False, integrator=None, **kwargs):
        name = type(self).__name__
        warmup_options = pop_warmup_options(name, kwargs, step_size is None)
        super().__init__(model, **kwargs)
        self.control_variates, integrator = check_control_variates(name, control_variates, integrator, step_size,
                                                                   coordinates)
        if not callable(step_size):
            step_size = check_positive(name, "step_size", step_size, allow_none=True, what=(
                "a positive float or a schedule (count -> step size), or None to set it from the gradient noise in "
                "warmup"))
        temperature = check_positive(name, "temperature", temperature, "> 0")
        check_schedule(name, "step_size", step_size)  # a schedule: finite and > 0 at steps 0 … 10⁶
        self._step_size = step_size
        self._temperature = temperature
        self._options = dict(target_inflation=check_target_inflation(name, target_inflation), name=name,
                             coordinates=check_coordinates(name, coordinates, step_size is not None),
                             control_variates=self.control_variates, integrator=integrator, **warmup_options)

    def _setup(self, rng_key, model_args, model_kwargs):
        algorithm = super()._setup(rng_key, model_args, model_kwargs)
        if self.control_variates:
            self._once_per_data("group latents", model_args, model_kwargs, self.potential.plates,
                                lambda: refuse_group_latents(self.potential, model_args, model_kwargs))
        return algorithm

    def group_algorithm(self, wrapper):
        """``(potential, layout) -> SGAlgorithm``: the algorithm with control variates for group latents
        (:func:`~numpyro_sgd.kernels.group_sgld.group_sgld`) that ``wrapper`` (SGWithinGibbs) runs
        in place of this kernel's on a random-effects model; its step and curvature are its own, so
        a given ``step_size`` or ``integrator`` is refused."""
        if self._step_size is not None or self._options["integrator"] != "exponential":
            raise ValueError(
                f"{wrapper}: SGLD(control_variates=True) inside {wrapper} runs the control variates for group latents, "
                "whose step is the exponential integrator in the coordinates of the block-arrowhead Hessian; leave "
                "step_size and integrator to it.")
        return group_sgld

    def _build(self, potential, adapt_steps_per_sample=True):
        return sgld(potential, step_size=self._step_size, temperature=self._temperature, subsample=self._driver.subsample,
                    **self._options)



class PSGLDState(NamedTuple):
    """Kernel state of :class:`PSGLD`."""

    #: RMSprop second moment V of the per-datum mean gradient
    second_moment: jnp.ndarray
    #: step size ε (U units)
    step_size: jnp.ndarray
    #: RMSprop decay α of V (``decay``)
    decay: jnp.ndarray
    #: damping λ of G = 1 / (λ + √V)
    damping: jnp.ndarray
    #: whether V has been initialised (the first step sets V = ḡ²)
    started: jnp.ndarray
    #: what the default steps adapted in warmup (:class:`~numpyro_sgd.adaptation.adapted.AdaptedSteps`:
    #: the noise warmup's state, the coordinates, the curvature spectrum, the control variates' centre)
    adapted: AdaptedSteps = AdaptedSteps()


def psgld_step(rng_key, theta, grad, second_moment, step_size, decay, damping, num_data, started):
    """pSGLD, Li et al. (2016) Alg. 1 (Γ neglected, as in the paper's experiments):

    V ← α V + (1 − α) ḡ ⊙ ḡ,   ḡ = ∇Û_S / N        (per-datum mean gradient)
    G ← 1 ⊘ (λ + √V)
    θ ← θ − (ε/2) G ⊙ ∇Û_S + N(0, ε G)
    """
    g_bar = grad / num_data
    second_moment = jnp.where(started, decay * second_moment + (1 - decay) * g_bar**2, g_bar**2)
    precond = 1.0 / (damping + jnp.sqrt(second_moment))
    theta = overdamped_langevin(rng_key, theta, grad, step_size, 1.0, precond)
    return theta, second_moment


def psgld(potential, *, step_size=None, decay=0.99, damping=1e-5, target_inflation=TARGET_INFLATION,
          subsample="with_replacement", name="PSGLD", coordinates="auto", **warmup_options):
    """The pSGLD algorithm (:class:`PSGLD`) for a traced model.

    :param potential: the :class:`~numpyro_sgd.model.potential.SubsampledPotential` (N for ḡ = ∇Û_S / N).
    :param step_size: ε > 0, or None: set at the end of the noise warmup (see :class:`PSGLD`).
    :return: :class:`~numpyro_sgd.SGAlgorithm` (V keeps adapting; a given step: warmup is burn-in).
    """

    def init(rng_key, theta, num_warmup_steps):
        dt = theta.dtype
        return PSGLDState(jnp.zeros_like(theta), jnp.asarray(jnp.nan if step_size is None else step_size, dt),
                          jnp.asarray(decay, dt), jnp.asarray(damping, dt), jnp.array(False))

    def step(rng_key, i, theta, state, oracle):
        k_idx, k_noise = random.split(rng_key)
        pe, grad, indices = oracle.grad(k_idx, theta)
        theta, second = psgld_step(k_noise, theta, grad, state.second_moment, state.step_size, state.decay,
                                   state.damping, potential.num_data, state.started)
        return theta, state._replace(second_moment=second, started=jnp.array(True)), StepInfo(pe, oracle.batch_size,
                                                                                             indices, True)

    algorithm = SGAlgorithm(init, step)
    if step_size is not None:
        return algorithm

    def set_steps(state, noise, curvature):
        # V at its value near the mode, E[ḡ²] ≈ Q_kk/N², so G ≈ N/√Q_kk from the first step on;
        # ε = 4τ / λ_max(G^½ (Q + (1 + τ) A) G^½)
        q_diag = jnp.diagonal(noise) if noise.ndim == 2 else noise
        second = jnp.maximum(q_diag, 0.0) / float(potential.num_data) ** 2  # a Python float: N² overflows int32
        precond = 1.0 / (state.damping + jnp.sqrt(second))
        eps = sgld_step_size(noise, curvature, target_inflation, preconditioner=precond)
        state = state._replace(second_moment=second.astype(state.second_moment.dtype),
                               step_size=eps.astype(state.step_size.dtype), started=jnp.array(True))
        return with_adapted(state, spectrum=curvature_spectrum(curvature, precond))  # of G^½ A G^½, G as set here

    algorithm = with_default_steps(algorithm, potential, name, set_steps, warmup_options, subsample, coordinates)
    # SGLD's AR(1) in the coordinates of G (G held at its value near the mode)
    return with_predicted_relaxation(algorithm, potential, coordinates,
                                     lambda state, a: langevin_autocorrelation_time(state.step_size, a))


class PSGLD(SGKernel):
    """Preconditioned SGLD with an RMSprop preconditioner.

    **References:**

    1. *Preconditioned Stochastic Gradient Langevin Dynamics for Deep Neural Networks*, C. Li,
       C. Chen, D. Carlson, L. Carin, AAAI 2016, Alg. 1 (defaults λ = 1e-5, α = 0.99).

    ========  ====================
    paper     argument
    ========  ====================
    ε_t       ``step_size`` (U units)
    α         ``decay`` (RMSprop decay)
    λ         ``damping``
    ========  ====================

    .. note:: ḡ includes the prior's gradient divided by N (the paper's ḡ is the likelihood
       part only); the difference is O(1/N). The Γ(θ) correction term is neglected, as in the
       paper; the preconditioner keeps adapting during sampling, so the chain is only
       approximately stationary. With a given step size warmup runs the same dynamics (burn-in).

    **Coordinates of the default steps**: as :class:`SGLD` (``coordinates``); the RMSprop G
    then acts in φ.

    **Default step size** (``step_size=None``). Warmup is the noise warmup of
    :class:`~numpyro_sgd.ConstantSGD` (see :class:`SGLD`); at its end V is set to its value near
    the mode, V_k = Q_kk/N² (so G_k = 1/(λ + √Q_kk/N) ≈ N/√Q_kk), and ε to SGLD's rule in the
    coordinates of G (:func:`~numpyro_sgd.numerics.step_rules.sgld_step_size`, G held fixed):

        ε = 4τ / λ_max(G^½ (Q + (1 + τ) A) G^½),   A ≈ (S/N) Q + Λ⁺.

    .. note:: The rule used before (``examples/quickstart.py``), ε = 4τ/(N √max_k Q_kk), is the
       diagonal of this one without the Euler term: G^½ Q G^½ has diagonal N √Q_kk, but its top
       eigenvalue is larger when the gradient noise is correlated (up to D×), so that rule can
       overshoot τ on correlated posteriors.

    **Units of** ``step_size``. SGLD's ε (summed potential U, Langevin time step ε/2) in the coordinates of
    the RMSprop preconditioner G: θ ← θ − (ε/2) G ∇Û_S + √(ε G) ξ. Default: SGLD's rule in the preconditioned
    coordinates.

    :param model: NumPyro model with a subsample plate.
    :param float step_size: ε > 0, or None (default: from the noise warmup, see above).
    :param float decay: α ∈ (0, 1), the RMSprop decay of V (default 0.99).
    :param float damping: λ > 0 (default 1e-5).
    :param float target_inflation: τ ∈ (0, 1) of the default step size (default 0.1).
    :param str coordinates: the coordinates of the default steps, as for :class:`~numpyro_sgd.SGLD`
        (default ``"auto"``: the warmup's curvature; ``"scalar"``: the paper's kernel).
    :param kwargs: see :class:`~numpyro_sgd.driver.kernel.SGKernel` and, with the default step size, the
        warmup options of :class:`~numpyro_sgd.ConstantSGD`.
    """

    def __init__(self, model, *, step_size=None, decay=0.99, damping=1e-5, target_inflation=TARGET_INFLATION,
                 coordinates="auto", **kwargs):
        warmup_options = pop_warmup_options("PSGLD", kwargs, step_size is None)
        super().__init__(model, **kwargs)
        if step_size is not None:
            check_step_size("PSGLD", step_size)
        decay = check_number("PSGLD", "decay", decay)
        if not 0 < decay < 1:
            raise ValueError(f"PSGLD: decay (the RMSprop decay α) must lie in (0, 1), got {decay}.")
        damping = check_positive("PSGLD", "damping", damping, "> 0 (λ)")
        self._options = dict(step_size=None if step_size is None else float(step_size), decay=float(decay),
                             damping=float(damping), target_inflation=check_target_inflation("PSGLD", target_inflation),
                             coordinates=check_coordinates("PSGLD", coordinates,
                                                                          step_size is not None),
                             **warmup_options)

    def _build(self, potential, adapt_steps_per_sample=True):
        return psgld(potential, **self._options, subsample=self._driver.subsample)
