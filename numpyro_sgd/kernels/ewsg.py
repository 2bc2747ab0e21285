"""Exponentially weighted stochastic gradients (EWSG): Li, Wang, Zha & Tao, *Improving Sampling
Accuracy of Stochastic Gradient MCMC Methods via Non-uniform Subsampling of Gradients*
(Sec. 4, Alg. 1; minibatches App. D; overdamped Langevin App. E; variance reduction App. F, Alg. 2).

Algorithm 1 with minibatches (App. D), in NumPyro's units (Û_B = N/S-scaled minibatch potential,
prior included; ``n a_B`` of the paper is (√h/σ) ∇Û_B):

    B ← uniform minibatch;  compute ∇Û_B(θ_k)
    repeat M times:
        B' ← uniform minibatch;  compute ∇Û_B'(θ_k)
        B ← B' with probability min(1, exp(½‖x + n a_B'‖² − ½‖x + n a_B‖²))        (Eq. 6)
    θ_{k+1} = θ_k + h r_k
    r_{k+1} = r_k − h (∇Û_B(θ_k) + γ r_k) + σ √h ξ_k,   σ² = 2γ                   (Eq. 3)

with x = √h γ r_k / σ (Sec. 4.4). The Metropolis chain over minibatches targets
p_B ∝ exp(½‖x + n a_B‖²) (Eq. 4 restricted to the terms that depend on B); it lives in
:mod:`numpyro_sgd.numerics.index_chain`.

:func:`ewsg_update` is *the* underdamped step of the package: :class:`~numpyro_sgd.SGHMC` takes
it with M = 0, so EWSG with ``num_index_steps=0`` is SGHMC by construction; likewise
:func:`overdamped_ewsg_update` with M = 0 is the step of :class:`~numpyro_sgd.SGLD`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax, random

from ..adaptation.adapted import AdaptedSteps
from ..adaptation.default_steps import (
    check_coordinates,
    with_default_overdamped_step,
    with_default_underdamped_steps,
)
from ..adaptation.noise_warmup import pop_warmup_options
from ..driver.kernel import SGKernel
from ..minibatch.law import law_of
from ..numerics.diffusions import underdamped_langevin_matrix_friction
from ..numerics.index_chain import (
    X_ESTIMATES,
    count_index_moves,
    describe_index_chain,
)
from ..numerics.row_blocks import FULL_PASS_ROWS, sum_over_row_blocks
from ..numerics.step_rules import TARGET_INFLATION, check_target_inflation
from ..protocol import SGAlgorithm, StepInfo
from ..validation import check_control_variates, check_friction, check_int, check_step_size
from .langevin import ewsg_update, overdamped_ewsg_update, underdamped_minibatch

__all__ = ["EWSG", "EWSGState", "OverdampedEWSG", "OverdampedEWSGState", "EWSGVR", "EWSGVRState", "ewsg", "ewsg_vr",
           "overdamped_ewsg"]


class _IndexChainKernel(SGKernel):
    """What the three EWSG kernels share: validation of h, M, x (and γ for the underdamped ones);
    ``_build`` calls the kernel's ``_builder`` with the validated options. With
    ``default_steps=True`` (EWSG, OverdampedEWSG) a step size or friction of None is set by the
    noise warmup, and ``target_inflation`` and the warmup options are validated and passed on."""

    supports_mesh = False
    supports_clusters = False

    def __init__(self, model, *, step_size, num_index_steps, underdamped, friction=None, x_estimate="zero",
                 default_steps=False, target_inflation=TARGET_INFLATION, coordinates="auto", control_variates=False,
                 integrator=None, **kwargs):
        name = type(self).__name__
        estimated = default_steps and (step_size is None or (underdamped and friction is None))
        warmup_options = pop_warmup_options(name, kwargs, estimated)
        super().__init__(model, **kwargs)
        allowed_x = tuple(X_ESTIMATES) if underdamped else ("zero",)
        if step_size is not None or not default_steps:
            check_step_size(name, step_size)
        num_index_steps = check_int(name, "num_index_steps", num_index_steps, minimum=0, what=(
            "an integer >= 0 (M, the Metropolis steps over minibatches per step; 0 gives the uniform-minibatch "
            "sampler)"))
        if not isinstance(x_estimate, str) or x_estimate not in allowed_x:
            raise ValueError(f"{name}: x_estimate must be one of {allowed_x}, got {x_estimate!r}.")
        if num_index_steps > 0 and law_of(self._driver.warmup_subsample).needs_step:
            raise ValueError(
                f"{name}: warmup_subsample={self._driver.warmup_subsample!r} gives every proposal of the index chain the same minibatch "
                "(the shuffled minibatch depends only on the step); use 'with_replacement' or 'without_replacement'."
            )
        self._options = dict(step_size=None if step_size is None else float(step_size),
                             num_index_steps=int(num_index_steps))
        if underdamped:
            if friction is not None or not default_steps:
                check_friction(name, friction)
            self._options.update(friction=None if friction is None else float(friction), x_estimate=x_estimate)
        if default_steps:
            self.control_variates, _ = check_control_variates(name, control_variates, integrator, step_size,
                                                              coordinates, ("euler",))
            self._options.update(control_variates=self.control_variates)
            self._options.update(target_inflation=check_target_inflation(name, target_inflation), name=name,
                                 subsample=self._driver.subsample, coordinates=check_coordinates(
                                     name, coordinates, step_size is not None),
                                 **warmup_options)
        elif coordinates != "auto":
            raise TypeError(f"{name}: coordinates= applies to the default steps, which this kernel does not set.")
        elif control_variates or integrator is not None:
            raise TypeError(f"{name}: control_variates= and integrator= apply to the default steps, which this kernel "
                            "does not set.")

    @property
    def num_index_steps(self):
        """M, the Metropolis steps over minibatches per step."""
        return self._options["num_index_steps"]

    def _build(self, potential, adapt_steps_per_sample=True):
        return self._builder(potential, **self._options)


# ---------------------------------------------------------------------------- EWSG (Alg. 1)
class EWSGState(NamedTuple):
    """Kernel state of :class:`EWSG` (one chain)."""

    #: momentum r (unit mass); starts from its stationary law N(0, I), as in SGHMC
    momentum: jnp.ndarray
    #: step size h
    step_size: jnp.ndarray
    #: friction γ (σ² = 2γ)
    friction: jnp.ndarray
    #: accepted moves of the index chain so far (warmup included), int32
    num_index_accepted: jnp.ndarray
    #: proposed moves of the index chain so far, M per step (warmup included), int32
    num_index_proposed: jnp.ndarray
    #: what the default steps adapted in warmup (:class:`~numpyro_sgd.adaptation.adapted.AdaptedSteps`:
    #: the noise warmup's state, the coordinates, the curvature spectrum, the control variates' centre)
    adapted: AdaptedSteps = AdaptedSteps()


def _or_nan(value):
    return jnp.nan if value is None else value


def ewsg(potential, *, step_size=None, friction=None, num_index_steps=1, x_estimate="momentum",
         target_inflation=TARGET_INFLATION, subsample="with_replacement", name="EWSG", coordinates="auto",
         control_variates=False, **warmup_options):
    """The EWSG algorithm (:class:`EWSG`) for a traced model.

    :param potential: the :class:`~numpyro_sgd.model.potential.SubsampledPotential`.
    :param step_size: h, or None (set with SGHMC's rule at the end of the noise warmup).
    :param friction: γ, or None (likewise).
    :return: :class:`~numpyro_sgd.SGAlgorithm` (h and γ given: no adaptation, warmup is burn-in).
    """
    m = num_index_steps

    def init(rng_key, theta, num_warmup_steps):
        momentum = random.normal(rng_key, theta.shape, theta.dtype)  # as SGHMC
        zero = jnp.zeros((), jnp.int32)
        return EWSGState(momentum, jnp.asarray(_or_nan(step_size), theta.dtype),
                         jnp.asarray(_or_nan(friction), theta.dtype), zero, zero)

    def step(rng_key, i, theta, state, oracle):
        theta, momentum, (pe, _, indices), accepted = ewsg_update(
            rng_key, theta, state.momentum, lambda key: oracle.grad(key, theta), state.step_size, state.friction, m,
            x_estimate)
        state = count_index_moves(state._replace(momentum=momentum), accepted, m)
        # M = 0 (SGHMC): one uniform minibatch; M > 0: the index chain chose it among M + 1
        return theta, state, StepInfo(pe, (m + 1) * oracle.batch_size, indices, m == 0)

    return with_default_underdamped_steps(SGAlgorithm(init, step, describe=describe_index_chain), potential,
                                          name, step_size, friction, target_inflation, subsample, warmup_options,
                                          coordinates, control_variates)


class EWSG(_IndexChainKernel):
    """Underdamped Langevin (SGHMC/SGULD) with exponentially weighted stochastic gradients.

    Each step draws a minibatch uniformly, runs ``num_index_steps`` Metropolis steps over
    minibatches that target p_B ∝ exp(½‖x + n a_B‖²) and takes the Euler–Maruyama step of
    underdamped Langevin with the accepted minibatch's gradient (see the module docstring).
    With ``num_index_steps=0`` it is :class:`~numpyro_sgd.SGHMC` (same update, same random
    numbers).

    **References:**

    1. *Improving Sampling Accuracy of Stochastic Gradient MCMC Methods via Non-uniform
       Subsampling of Gradients*, R. Li, X. Wang, H. Zha, M. Tao: Eq. 3 (the step), Eq. 4 and 6
       (weights, acceptance), Sec. 4.4 (x, M), Alg. 1, App. D (minibatches).

    =================  ==========================================
    paper              argument / value
    =================  ==========================================
    h                  ``step_size``
    γ                  ``friction``
    σ                  √(2γ) (temperature 1)
    M                  ``num_index_steps`` (paper default 1)
    x                  ``x_estimate`` (default ``"momentum"``: √h γ r_k / σ)
    b                  the plate's ``subsample_size``
    n (1/b) Σ ∇V_i     ∇Û_B, NumPyro's N/S-scaled minibatch gradient
    =================  ==========================================

    ``x_estimate`` chooses among the x of Fig. 1b: ``"momentum"`` (√h γ r_k/σ, recommended),
    ``"zero"`` (x = 0), ``"one"`` (x = (1, …, 1)) and ``"stop"`` ((−1 + hγ) r_k/(σ√h), the x of
    r_{k+1} = 0).

    A step costs (M + 1)·S per-datum gradients, and the data-pass count of the state counts all
    of them. The index chain's acceptance is counted in the kernel state:
    ``kernel_state.num_index_accepted`` / ``kernel_state.num_index_proposed`` (running totals,
    warmup included). They can be recorded per draw with
    ``mcmc.run(..., extra_fields=("kernel_state.num_index_accepted", "kernel_state.num_index_proposed"))``,
    :func:`~numpyro_sgd.numerics.index_chain.index_acceptance_rate` turns ``mcmc.last_state`` into the rate, and the progress bar
    shows it. Warmup is burn-in with the same dynamics.

    .. note:: The extracted paper text is garbled around Eq. 4; re-derived from Eq. 3: with
       x = (r_{k+1} − r_k + hγ r_k)/(σ√h) and a_i = √h ∇V_i(θ_k)/σ, x + Σ_i a_i = ξ_{k+1}, so the
       transition density is ∝ exp(−½‖x + Σ_i a_i‖²) and the weights carry a *plus* sign,
       p_i ∝ exp(½‖x + n a_i‖²). The heuristic x sets r_{k+1} = r_k, hence uses the current
       momentum r_k; all gradients of a step are taken at the current θ_k.

    .. note:: The weights use NumPyro's minibatch potential, prior and Jacobian terms included
       (the paper's V_i = V_prior/n + V_lik,i). These terms are the same for every minibatch, so
       they only shift x + n a_B; they are the gradient the step actually uses, as the
       derivation of Eq. 4 requires.

    .. note:: The paper's Alg. 1 stores the gradient of the *index* chain's current element;
       here the chain carries the minibatch potential and gradient of the current minibatch, so
       no gradient is computed twice, and each of the M proposals costs one minibatch gradient.

    **Coordinates of the default steps**: as :class:`~numpyro_sgd.SGLD` (``coordinates``).

    **Default step size and friction** (``step_size=None``, ``friction=None``): SGHMC's rule (see
    :class:`~numpyro_sgd.SGHMC`), γ = 2 √λ_max(A), h = 2τγ / λ_max(Q + 2A), from the noise warmup
    of :class:`~numpyro_sgd.ConstantSGD` (which then replaces burn-in; its SG steps cost S
    gradients, not (M + 1) S). The rule bounds the variance inflation of *uniform* minibatches by
    τ. The index chain (M ≥ 1) turns that inflation into a deflation: it prefers minibatches
    whose noise opposes the momentum (x from r_k), which adds friction and force in equal measure
    (the temperature stays 1) and shrinks the variance to (1 − hq/(2γ)) of the target's, 1 − τ to
    first order, when it is fully mixed; so EWSG's variance lies between 1 − τ and 1 + τ of the
    target's, not below the uniform bound only. Measured (conjugate regression, N = 16,000,
    D = 5, S = 200, τ = 0.1, 4 chains × 8,000 draws of 40 SG steps, the same h and γ): sd ratios
    0.978 (M = 1) and 0.951 (M = 3), against SGHMC's 1.057 (``tests/test_ewsg.py`` checks both
    ends at τ = 0.5). A friction given alone keeps the coordinates of the default steps, as for
    :class:`~numpyro_sgd.SGHMC`; either may be given alone, the other is then estimated (given
    both: no noise warmup).

    **Units of** ``step_size``. h, the underdamped Langevin time step of :class:`SGHMC` (unit mass, summed
    potential U); ``friction`` γ per unit time. Default: SGHMC's rule.

    :param model: NumPyro model with a subsample plate.
    :param float step_size: h > 0, or None (default: see above).
    :param float friction: γ > 0, or None (default: see above).
    :param int num_index_steps: M ≥ 0 (default 1).
    :param str x_estimate: ``"momentum"`` (default), ``"zero"``, ``"one"`` or ``"stop"``.
    :param float target_inflation: τ ∈ (0, 1) of the default step size (default 0.1).
    :param str coordinates: the coordinates of the default steps, as for :class:`~numpyro_sgd.SGLD`
        (default ``"auto"``: the warmup's curvature; ``"scalar"``: the paper's kernel).
    :param bool control_variates: control-variate gradients about the mode the kernel finds at the end of
        warmup, as for :class:`~numpyro_sgd.SGLD` (default False).
    :param str integrator: ``"euler"`` (the paper's update, the only one; default None: ``"euler"``).
    :param kwargs: see :class:`~numpyro_sgd.driver.kernel.SGKernel` (``steps_per_sample``, ``subsample``,
        ``warmup_subsample``, ``init_strategy``) and, with a default step or friction, the warmup
        options of :class:`~numpyro_sgd.ConstantSGD`.

    .. doctest::

        >>> import jax, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from numpyro_sgd import EWSG
        >>> from numpyro_sgd.numerics.index_chain import index_acceptance_rate
        >>> y = jax.random.normal(jax.random.key(1), (1000,)) + 3.0
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=50) as idx:
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=y[idx])
        >>> kernel = EWSG(model, step_size=1e-3, friction=30.0, num_index_steps=1)
        >>> mcmc = MCMC(kernel, num_warmup=200, num_samples=300, progress_bar=False)
        >>> mcmc.run(jax.random.key(0), y)
        >>> bool(abs(mcmc.get_samples()["mu"].mean() - y.mean()) < 0.1)
        True
        >>> bool(0 < index_acceptance_rate(mcmc.last_state) < 1)
        True
    """

    def __init__(self, model, *, step_size=None, friction=None, num_index_steps=1, x_estimate="momentum",
                 target_inflation=TARGET_INFLATION, coordinates="auto", control_variates=False, integrator=None,
                 **kwargs):
        super().__init__(model, step_size=step_size, num_index_steps=num_index_steps, underdamped=True,
                         friction=friction, x_estimate=x_estimate, default_steps=True,
                         target_inflation=target_inflation, coordinates=coordinates,
                         control_variates=control_variates, integrator=integrator, **kwargs)

    #: the algorithm builder, called with the validated options
    _builder = staticmethod(ewsg)


# ---------------------------------------------------------------------------- overdamped (App. E)
class OverdampedEWSGState(NamedTuple):
    """Kernel state of :class:`OverdampedEWSG` (one chain)."""

    #: step size ε (SGLD's units: θ ← θ − (ε/2) ∇Û + N(0, ε))
    step_size: jnp.ndarray
    #: accepted moves of the index chain so far (warmup included), int32
    num_index_accepted: jnp.ndarray
    #: proposed moves of the index chain so far, M per step (warmup included), int32
    num_index_proposed: jnp.ndarray
    #: what the default steps adapted in warmup (:class:`~numpyro_sgd.adaptation.adapted.AdaptedSteps`:
    #: the noise warmup's state, the coordinates, the curvature spectrum, the control variates' centre)
    adapted: AdaptedSteps = AdaptedSteps()


def overdamped_ewsg(potential, *, step_size=None, num_index_steps=1, target_inflation=TARGET_INFLATION,
                    subsample="with_replacement", name="OverdampedEWSG", coordinates="auto", control_variates=False,
                    **warmup_options):
    """The overdamped EWSG algorithm (:class:`OverdampedEWSG`) for a traced model.

    :param potential: the :class:`~numpyro_sgd.model.potential.SubsampledPotential`.
    :param step_size: ε, or None (set with SGLD's rule at the end of the noise warmup).
    :return: :class:`~numpyro_sgd.SGAlgorithm` (a given ε: no adaptation, warmup is burn-in).
    """
    m = num_index_steps

    def init(rng_key, theta, num_warmup_steps):
        zero = jnp.zeros((), jnp.int32)
        return OverdampedEWSGState(jnp.asarray(_or_nan(step_size), theta.dtype), zero, zero)

    def step(rng_key, i, theta, state, oracle):
        theta, (pe, _, indices), accepted = overdamped_ewsg_update(
            rng_key, theta, lambda key: oracle.grad(key, theta), state.step_size, m,
            jnp.ones((), jnp.result_type(theta)))
        info = StepInfo(pe, (m + 1) * oracle.batch_size, indices, m == 0)  # M = 0 (SGLD): one uniform minibatch
        return theta, count_index_moves(state, accepted, m), info

    return with_default_overdamped_step(SGAlgorithm(init, step, describe=describe_index_chain), potential, name,
                                        step_size, target_inflation, subsample, warmup_options, coordinates,
                                        control_variates=control_variates)


class OverdampedEWSG(_IndexChainKernel):
    """EWSG on overdamped Langevin: SGLD whose minibatch is chosen by the index chain of EWSG.

    **References:**

    1. Li, Wang, Zha, Tao (EWSG paper), App. E (weights), Eq. 6 and Alg. 1 (index chain).
    2. *Bayesian Learning via Stochastic Gradient Langevin Dynamics*, M. Welling, Y. W. Teh
       (2011), Eq. 4 (the units of ``step_size``).

    ==========  =====================================
    paper       argument / value
    ==========  =====================================
    h           ``step_size / 2``  (ε = 2h, SGLD's units)
    M           ``num_index_steps``
    x           0
    ==========  =====================================

    .. note:: ``step_size`` is SGLD's ε (θ ← θ − (ε/2) ∇Û + N(0, ε)), not the h of App. E,
       so that ``num_index_steps=0`` is :class:`~numpyro_sgd.SGLD` (same random numbers).
       App. E leaves x open; x = 0 corresponds to θ_{k+1} = θ_k, the analogue of the
       paper's heuristic for the underdamped version. Temperature 1 only.

    Acceptance counts and data passes are reported as for :class:`EWSG`.

    **Coordinates of the default steps**: as :class:`~numpyro_sgd.SGLD` (``coordinates``).

    **Default step size** (``step_size=None``): SGLD's rule (see :class:`~numpyro_sgd.SGLD`),
    ε = 4τ / λ_max(Q + (1 + τ) A), from the noise warmup of :class:`~numpyro_sgd.ConstantSGD`;
    conservative for M ≥ 1 (the index chain lowers the minibatch noise).

    **Units of** ``step_size``. SGLD's ε (summed potential U, Langevin time step ε/2). Default: SGLD's rule.

    :param model: NumPyro model with a subsample plate.
    :param float step_size: ε > 0, or None (default: see above).
    :param int num_index_steps: M ≥ 0 (default 1).
    :param float target_inflation: τ ∈ (0, 1) of the default step size (default 0.1).
    :param str coordinates: the coordinates of the default steps, as for :class:`~numpyro_sgd.SGLD`
        (default ``"auto"``: the warmup's curvature; ``"scalar"``: the paper's kernel).
    :param bool control_variates: control-variate gradients about the mode the kernel finds at the end of
        warmup, as for :class:`~numpyro_sgd.SGLD` (default False).
    :param str integrator: ``"euler"`` (the paper's update, the only one; default None: ``"euler"``).
    :param kwargs: see :class:`~numpyro_sgd.driver.kernel.SGKernel` and, with the default step size, the
        warmup options of :class:`~numpyro_sgd.ConstantSGD`.
    """

    def __init__(self, model, *, step_size=None, num_index_steps=1, target_inflation=TARGET_INFLATION,
                 coordinates="auto", control_variates=False, integrator=None, **kwargs):
        super().__init__(model, step_size=step_size, num_index_steps=num_index_steps, underdamped=False,
                         default_steps=True, target_inflation=target_inflation, coordinates=coordinates,
                         control_variates=control_variates, integrator=integrator, **kwargs)

    #: the algorithm builder, called with the validated options
    _builder = staticmethod(overdamped_ewsg)


# ---------------------------------------------------------------------------- EWSG-VR (App. F)
class EWSGVRState(NamedTuple):
    """Kernel state of :class:`EWSGVR` (one chain)."""

    #: momentum r (unit mass), starts from N(0, I)
    momentum: jnp.ndarray
    #: step size h
    step_size: jnp.ndarray
    #: friction γ of the noise, σ² = 2γ
    friction: jnp.ndarray
    #: friction matrix Γ_k = (σ² I + h Ĉ/S)/2 (D × D), Γ_0 = γ I (Alg. 2, lines 2 and 19)
    friction_matrix: jnp.ndarray
    #: m1, the running estimate of E_I[n ∇V_I] (D) (Alg. 2, lines 6 and 16)
    mean_grad: jnp.ndarray
    #: m2, the running estimate of E_I[n² ∇V_I ∇V_Iᵀ] (D × D) (lines 6 and 17)
    second_moment: jnp.ndarray
    #: ω, the point of the last full-data calibration (line 7)
    anchor: jnp.ndarray
    #: steps since the last calibration; starts at the period, so the first step calibrates
    steps_since_calibration: jnp.ndarray
    #: calibration period in steps: L ⌈N / ((M + 1) S)⌉ (L data passes of Alg. 2's inner loop)
    calibration_period: jnp.ndarray
    #: accepted moves of the index chain so far, int32
    num_index_accepted: jnp.ndarray
    #: proposed moves of the index chain so far, int32
    num_index_proposed: jnp.ndarray


def ewsg_vr(potential, *, step_size, friction, num_index_steps=1, x_estimate="momentum", calibration_period=1,
            chunk_size=FULL_PASS_ROWS, name="EWSGVR"):
    """The EWSG-VR algorithm (:class:`EWSGVR`, Alg. 2) for a traced model with one subsample plate.

    :param potential: the :class:`~numpyro_sgd.model.potential.SubsampledPotential`.
    :return: :class:`~numpyro_sgd.SGAlgorithm` (no adaptation: warmup is burn-in).
    """
    if len(potential.plates) != 1:
        raise ValueError(
            f"{name}: the model has {len(potential.plates)} subsample plates; EWSG-VR's "
            "full-data calibration supports one. Subsample a single plate (or use EWSG)."
        )
    m, s, n = num_index_steps, potential.batch_size, potential.num_data
    plate = potential.plates[0]

    def full_moments(theta, oracle):
        """m1 = (1/N) Σ_i g_i and m2 = (1/N) Σ_i g_i g_iᵀ with g_i = ∇Û_{i} (= n ∇V_i), all N data."""
        def block(start, size):
            _, _, (rows,) = oracle.per_example_grads(theta, {plate.name: start + jnp.arange(size)})
            return jnp.sum(rows, 0), rows.T @ rows

        s1, s2 = sum_over_row_blocks(block, plate.size, chunk_size)
        return s1 / plate.size, s2 / plate.size

    def init(rng_key, theta, num_warmup_steps):
        dt, d = theta.dtype, theta.shape[0]
        momentum = random.normal(rng_key, theta.shape, dt)
        steps_per_pass = -(-n // ((m + 1) * s))
        period = jnp.asarray(calibration_period * steps_per_pass, jnp.int32)
        zero = jnp.zeros((), jnp.int32)
        return EWSGVRState(
            momentum, jnp.asarray(step_size, dt), jnp.asarray(friction, dt),
            friction * jnp.eye(d, dtype=dt), jnp.zeros(d, dt), jnp.zeros((d, d), dt), theta,
            period, period, zero, zero,
        )

    def step(rng_key, i, theta, state, oracle):
        k_noise = random.split(rng_key)[1]
        sigma = jnp.sqrt(2.0 * state.friction)

        # lines 5–7: every L passes, m1, m2 from all data at ω ← θ_k
        calibrate = state.steps_since_calibration >= state.calibration_period
        m1, m2 = lax.cond(calibrate, lambda: full_moments(theta, oracle),
                          lambda: (state.mean_grad, state.second_moment))
        anchor = jnp.where(calibrate, theta, state.anchor)

        # lines 10–14: the index chain, carrying the per-datum gradients of the current minibatch
        def propose(key):
            idx = oracle.draw(key)
            pe, grad, (rows,) = oracle.per_example_grads(theta, idx)
            return pe, grad, rows, idx

        (pe, grad, rows, idx), accepted = underdamped_minibatch(
            rng_key, propose, m, x_estimate, state.momentum, lambda: state.friction_matrix @ state.momentum,
            state.step_size, sigma)

        # line 15: Euler–Maruyama step (Eq. 3) with friction matrix Γ_k
        new_theta, momentum = underdamped_langevin_matrix_friction(k_noise, theta, state.momentum, grad,
                                                                   state.step_size, state.friction_matrix, sigma)
        # lines 16–19: SVRG-type update of m1, m2 with the anchor's per-datum gradients
        _, _, (rows_w,) = oracle.per_example_grads(anchor, idx)
        m1 = m1 + jnp.sum(rows - rows_w, 0) / n
        m2 = m2 + (rows.T @ rows - rows_w.T @ rows_w) / n
        cov = m2 - jnp.outer(m1, m1)
        d = theta.shape[0]
        gamma = 0.5 * (sigma**2 * jnp.eye(d, dtype=theta.dtype) + state.step_size * cov / s)

        state = count_index_moves(state._replace(
            momentum=momentum, friction_matrix=gamma, mean_grad=m1, second_moment=m2, anchor=anchor,
            steps_since_calibration=jnp.where(calibrate, 1, state.steps_since_calibration + 1),
        ), accepted, m)
        evals = (m + 2) * s + jnp.where(calibrate, n, 0)
        return new_theta, state, StepInfo(pe, evals, idx, False)

    return SGAlgorithm(init, step, describe=describe_index_chain)


class EWSGVR(_IndexChainKernel):
    """EWSG with SVRG-type variance compensation, EWSG-VR (App. F, Alg. 2 of the EWSG paper).

    The step is the one of :class:`EWSG` with a friction *matrix* Γ_k = (σ² I + h Ĉ/S)/2 in
    place of γ (σ² = 2γ stays): the extra diffusion h² Ĉ/S per step that the minibatch gradient
    adds is compensated by dissipation (fluctuation–dissipation, Eq. 13 of App. F). Ĉ estimates
    Cov_I[n ∇V_I], the covariance of single-datum gradients ∇Û_{i}: every L data passes from all
    N data at the anchor ω (Alg. 2, lines 5–7), and after every step by replacing, for the data of
    the accepted minibatch, their anchor terms by their current terms (lines 16–18).

    **References:**

    1. Li, Wang, Zha, Tao (EWSG paper), App. F, Eq. 13, Alg. 2; Alg. 1 and Eq. 6 (index chain).

    ==========  ============================================
    paper       argument / value
    ==========  ============================================
    h, γ, M     ``step_size``, ``friction``, ``num_index_steps``
    L           ``calibration_period`` (data passes, default 1 as in App. F)
    T           1
    Γ_k         ``kernel_state.friction_matrix``
    ==========  ============================================

    .. note:: Departures from Alg. 2 and choices where it is silent:

       * Alg. 2 as printed runs the inner loop only in the passes that do not calibrate
         (``if … else``), which with the paper's L = 1 would never move; here the calibration
         precedes the inner loop of the same pass.
       * Minibatches of size S (Alg. 2 has S = 1): the friction uses Ĉ/S, the covariance of
         the minibatch mean of S draws with replacement; lines 16–17 are applied to each datum
         of the accepted minibatch, with weight 1/N per datum.
       * x = √h Γ_k r_k / σ (the drift of this step, Sec. 4.4's heuristic with Γ_k for γ).
       * Γ_k is not projected onto positive definite matrices; Ĉ can lose definiteness if the
         chain travels far from ω within one period.
       * The anchor gradients ∇Û_i(ω) of line 16–17 are recomputed (SVRG), S per step; data
         passes count them and the calibrations: (M + 2) S per step plus N per calibration
         (Alg. 2 counts (M + 1) S).
       * Under ``chain_method="vectorized"`` JAX evaluates both branches of the calibration
         ``cond``, i.e. a full data pass every step (the data-pass count is still the
         algorithm's): use it for small N, or another chain method.
       * One subsample plate only; Γ_k is a dense D × D matrix (O(D²) per step, O(D³) never).

    .. warning:: The Euler step with friction Γ_k is stable only while h·λ_max(Γ_k) < 2. At the
       paper's Fig. 1 setting (h = 5e-2, S = 1, γ = 10) hΓ ≈ 3.6 and the chains diverge (the
       base rejects the non-finite steps; ``benchmarks/ewsg_gaussian.py`` shows it). Γ_k compensates
       the covariance of *uniform* minibatches (Alg. 2), while with M ≥ 1 the index chain already
       lowers the noise: measured at h = 2e-2 on that example, EWSG-VR with M = 1 over-corrects
       (variance 0.70× the target's), with M = 0 it is within a few % of it.

    **Units of** ``step_size``. h, the underdamped Langevin time step of :class:`SGHMC` (unit mass, summed
    potential U); required, as is ``friction`` γ.

    :param model: NumPyro model with exactly one subsample plate.
    :param float step_size: h > 0.
    :param float friction: γ > 0.
    :param int num_index_steps: M ≥ 0 (default 1).
    :param int calibration_period: L ≥ 1, data passes between full-data calibrations.
    :param str x_estimate: as :class:`EWSG`.
    :param int chunk_size: rows per block of the full-data calibration pass (memory; default
        :data:`~numpyro_sgd.numerics.row_blocks.FULL_PASS_ROWS`).
    :param kwargs: see :class:`~numpyro_sgd.driver.kernel.SGKernel`.
    """

    def __init__(self, model, *, step_size, friction, num_index_steps=1, calibration_period=1,
                 x_estimate="momentum", chunk_size=FULL_PASS_ROWS, **kwargs):
        super().__init__(model, step_size=step_size, num_index_steps=num_index_steps, underdamped=True,
                         friction=friction, x_estimate=x_estimate,
                         **kwargs)
        calibration_period = check_int(type(self).__name__, "calibration_period", calibration_period)
        chunk_size = check_int(type(self).__name__, "chunk_size", chunk_size)
        self._options.update(calibration_period=int(calibration_period), chunk_size=int(chunk_size),
                             name=type(self).__name__)

    #: the algorithm builder, called with the validated options
    _builder = staticmethod(ewsg_vr)
