"""Stochastic gradient Hamiltonian Monte Carlo without noise estimation (SGULD).

Chen, Fox & Guestrin (2014) with B̂ = 0, in the Euler–Maruyama form of Li, Wang, Zha & Tao
(EWSG paper, Eq. 3), the baseline that EWSG improves on:

    θ_{k+1} = θ_k + h r_k
    r_{k+1} = r_k − h (∇Û_S(θ_k) + γ r_k) + √(2γh) ξ_k

The step is :func:`~numpyro_sgd.kernels.langevin.ewsg_update` with M = 0 index steps (a uniform minibatch), so
:class:`~numpyro_sgd.EWSG` with ``num_index_steps=0`` is this sampler by construction.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import random

from ..adaptation.adapted import AdaptedSteps
from ..adaptation.default_steps import check_coordinates, with_default_underdamped_steps
from ..adaptation.noise_warmup import pop_warmup_options
from ..driver.kernel import SGKernel
from ..numerics.step_rules import TARGET_INFLATION, check_target_inflation
from ..protocol import SGAlgorithm, StepInfo
from ..validation import check_control_variates, check_friction, check_step_size
from .langevin import ewsg_update

__all__ = ["SGHMC", "SGHMCState", "sghmc"]


class SGHMCState(NamedTuple):
    """Kernel state of :class:`SGHMC`."""

    #: momentum r (unit mass); starts from its stationary law N(0, I)
    momentum: jnp.ndarray
    #: step size h
    step_size: jnp.ndarray
    #: friction γ (σ² = 2γ)
    friction: jnp.ndarray
    #: what the default steps adapted in warmup (:class:`~numpyro_sgd.adaptation.adapted.AdaptedSteps`:
    #: the noise warmup's state, the coordinates, the curvature spectrum, the control variates' centre)
    adapted: AdaptedSteps = AdaptedSteps()


def sghmc(potential, *, step_size=None, friction=None, target_inflation=TARGET_INFLATION, subsample="with_replacement",
          name="SGHMC", coordinates="auto", control_variates=False, **warmup_options):
    """The SGHMC algorithm (:class:`SGHMC`) for a traced model.

    :param potential: the :class:`~numpyro_sgd.model.potential.SubsampledPotential`.
    :param step_size: h, or None: set at the end of the noise warmup (see :class:`SGHMC`).
    :param friction: γ, or None (likewise).
    :return: :class:`~numpyro_sgd.SGAlgorithm` (h and γ given: no adaptation, warmup is burn-in).
    """

    def init(rng_key, theta, num_warmup_steps):
        momentum = random.normal(rng_key, theta.shape, theta.dtype)  # r_0 ~ N(0, I)
        return SGHMCState(momentum, jnp.asarray(jnp.nan if step_size is None else step_size, theta.dtype),
                          jnp.asarray(jnp.nan if friction is None else friction, theta.dtype))

    def step(rng_key, i, theta, state, oracle):
        # Eq. 3 with a uniform minibatch: EWSG's step with M = 0
        theta, momentum, (pe, _, indices), _ = ewsg_update(rng_key, theta, state.momentum,
                                                           lambda key: oracle.grad(key, theta), state.step_size,
                                                           state.friction, num_index_steps=0)
        return theta, state._replace(momentum=momentum), StepInfo(pe, oracle.batch_size, indices, True)

    return with_default_underdamped_steps(SGAlgorithm(init, step), potential, name, step_size, friction,
                                          target_inflation, subsample, warmup_options, coordinates,
                                          control_variates)


class SGHMC(SGKernel):
    """Stochastic gradient HMC / underdamped Langevin with minibatch gradients (SGULD).

    **References:**

    1. *Stochastic Gradient Hamiltonian Monte Carlo*, T. Chen, E. B. Fox, C. Guestrin, ICML 2014
       (Eq. 15 with B̂ = 0, i.e. no estimate of the gradient noise is subtracted).
    2. *Improving Sampling Accuracy of Stochastic Gradient MCMC Methods via Non-uniform
       Subsampling of Gradients*, R. Li, X. Wang, H. Zha, M. Tao (EWSG), Eq. 3.

    =========  ==============
    paper      argument
    =========  ==============
    h          ``step_size``
    γ          ``friction``
    σ² = 2γ    (temperature 1)
    =========  ==============

    The step size is in the units of NumPyro's potential U (a sum over data); the friction must
    dominate the minibatch noise h·Q/2 for the stationary law to be close to the posterior.
    With a given step size and friction warmup runs the same dynamics (burn-in).

    **Coordinates of the default steps**: as :class:`~numpyro_sgd.SGLD` (``coordinates``),
    when h is the kernel's; the momentum lives in φ. A ``friction`` given alone is a rate in those
    coordinates, where every direction has the frequency √N (the curvature of U is N I), so
    critical damping is γ = 2√N there whatever the model's units (N = 10⁴: 200), and h is the
    rule's at the given γ. A ``step_size`` given alone is a step in the model's coordinates (the
    friction is then estimated there). A friction far below critical damping leaves the chain
    oscillating: its spread forgets itself only at the rate γ, in about 1/(γh) SG steps, and the
    end of warmup says so when the run is too short for it.

    **Default step size and friction** (``step_size=None``, ``friction=None``). Warmup
    (``num_warmup × steps_per_sample`` SG steps) is the noise warmup of
    :class:`~numpyro_sgd.ConstantSGD` (:mod:`numpyro_sgd.adaptation.noise_warmup`: Adam towards the mode, then
    preconditioned SGD while the minibatch gradient-noise covariance Q is averaged). At its end,
    with A ≈ (S/N) Q + Λ⁺ (Fisher plus the positive part of the prior's Hessian) and
    τ = ``target_inflation`` (:func:`~numpyro_sgd.numerics.step_rules.sghmc_steps`):

        γ = 2 √λ_max(A)              critical damping of the stiffest direction
        h = 2τγ / λ_max(Q + 2A)      stationary variance ≤ (1 + τ)× the target's

    The inflation of the Euler–Maruyama recursion along an eigen-direction is hq/(2γ) (the
    minibatch noise h²q per step against the injected 2γh, Chen et al. 2014 Sec. 3.2) plus the
    discretisation's ha/γ, to first order in h. Either of h, γ may be given alone (the other is
    estimated); the chosen values are ``kernel_state.step_size`` and ``kernel_state.friction``.

    .. note:: The rule used before (``examples/quickstart.py``), h = 2τγ/λ_max(Q) with
       γ = 2 √((S/N) λ_max(Q)), omits the discretisation term (inflation 0.106 instead of 0.1
       at S/N = 0.025) and the prior's curvature.

    **Units of** ``step_size``. h, the time step of underdamped Langevin dynamics with unit mass on the summed
    potential U (θ' = θ + h r, r' = r − h (∇Û_S + γ r) + √(2γh) ξ); ``friction`` γ is a rate per unit of that
    time. Default: h and γ from the ``target_inflation`` rule.

    :param model: NumPyro model with a subsample plate.
    :param float step_size: h > 0, or None (default: see above).
    :param float friction: γ > 0, or None (default: see above).
    :param float target_inflation: τ ∈ (0, 1) of the default step size (default 0.1).
    :param str coordinates: the coordinates of the default steps, as for :class:`~numpyro_sgd.SGLD`
        (default ``"auto"``: the warmup's curvature; ``"scalar"``: the paper's kernel).
    :param bool control_variates: control-variate gradients about the mode the kernel finds at the end of
        warmup, as for :class:`~numpyro_sgd.SGLD` (default False).
    :param str integrator: ``"euler"`` (the paper's update, the only one; default None: ``"euler"``).
    :param kwargs: see :class:`~numpyro_sgd.driver.kernel.SGKernel` and, with a default step or friction,
        the warmup options of :class:`~numpyro_sgd.ConstantSGD`.
    """

    def __init__(self, model, *, step_size=None, friction=None, target_inflation=TARGET_INFLATION,
                 coordinates="auto", control_variates=False, integrator=None, **kwargs):
        name = type(self).__name__
        warmup_options = pop_warmup_options(name, kwargs, step_size is None or friction is None)
        super().__init__(model, **kwargs)
        self.control_variates, _ = check_control_variates(name, control_variates, integrator, step_size, coordinates,
                                                          ("euler",))
        if step_size is not None:
            check_step_size(name, step_size)
        if friction is not None:
            check_friction(name, friction)
        self._options = dict(step_size=None if step_size is None else float(step_size),
                             friction=None if friction is None else float(friction),
                             target_inflation=check_target_inflation(name, target_inflation), name=name,
                             coordinates=check_coordinates(name, coordinates, step_size is not None),
                             control_variates=self.control_variates, **warmup_options)

    def _build(self, potential, adapt_steps_per_sample=True):
        return sghmc(potential, **self._options, subsample=self._driver.subsample)
