"""Stochastic gradient Hamiltonian Monte Carlo without noise estimation (SGULD).

Chen, Fox & Guestrin (2014) with B̂ = 0, in the Euler–Maruyama form of Li, Wang, Zha & Tao
(EWSG paper, Eq. 3), the baseline that EWSG improves on:

    θ_{k+1} = θ_k + h r_k
    r_{k+1} = r_k − h (∇Û_S(θ_k) + γ r_k) + √(2γh) ξ_k

The step is :func:`~numpyro_sgd.ewsg.ewsg_update` with M = 0 index steps (a uniform minibatch), so
:class:`~numpyro_sgd.EWSG` with ``num_index_steps=0`` is this sampler by construction.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import random

from .base import SGAlgorithm, SGKernel, StepInfo
from .ewsg import check_friction, check_step_size, ewsg_update

__all__ = ["SGHMC", "SGHMCState", "sghmc"]


class SGHMCState(NamedTuple):
    """Kernel state of :class:`SGHMC`."""

    #: momentum r (unit mass); starts from its stationary law N(0, I)
    momentum: jnp.ndarray
    #: step size h
    step_size: jnp.ndarray
    #: friction γ (σ² = 2γ)
    friction: jnp.ndarray


def sghmc(potential, step_size, friction):
    """The SGHMC algorithm (:class:`SGHMC`) for a traced model.

    :param potential: the :class:`~numpyro_sgd.potential.SubsampledPotential`.
    :return: :class:`~numpyro_sgd.base.SGAlgorithm` (no adaptation: warmup is burn-in).
    """

    def init(rng_key, theta, num_warmup_steps):
        momentum = random.normal(rng_key, theta.shape, theta.dtype)  # r_0 ~ N(0, I)
        return SGHMCState(momentum, jnp.asarray(step_size, theta.dtype), jnp.asarray(friction, theta.dtype))

    def step(rng_key, i, theta, state, oracle):
        # Eq. 3 with a uniform minibatch: EWSG's step with M = 0
        theta, momentum, (pe, _, indices), _ = ewsg_update(rng_key, theta, state.momentum,
                                                           lambda key: oracle.grad(key, theta), state.step_size,
                                                           state.friction, num_index_steps=0)
        return theta, state._replace(momentum=momentum), StepInfo(pe, oracle.batch_size, indices)

    return SGAlgorithm(init, step, step)


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
    Warmup runs the same dynamics (burn-in).

    :param model: NumPyro model with a subsample plate.
    :param float step_size: h > 0.
    :param float friction: γ > 0.
    :param kwargs: see :class:`~numpyro_sgd.base.SGKernel`.
    """

    def __init__(self, model, step_size, friction, **kwargs):
        super().__init__(model, **kwargs)
        name = type(self).__name__
        check_step_size(name, step_size)
        check_friction(name, friction)
        self._options = dict(step_size=float(step_size), friction=float(friction))

    def _build(self, potential):
        return sghmc(potential, **self._options)
