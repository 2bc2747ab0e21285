"""Stochastic gradient Hamiltonian Monte Carlo without noise estimation (SGULD).

Chen, Fox & Guestrin (2014) with B̂ = 0, in the Euler–Maruyama form of Li, Wang, Zha & Tao
(EWSG paper, Eq. 3), the baseline that EWSG improves on:

    θ_{k+1} = θ_k + h r_k
    r_{k+1} = r_k − h (∇Û_S(θ_k) + γ r_k) + √(2γh) ξ_k
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import random

from .base import SGKernel, is_positive_scalar
from .diffusions import underdamped_langevin

__all__ = ["SGHMC", "SGHMCState"]


class SGHMCState(NamedTuple):
    """Kernel state of :class:`SGHMC`."""

    #: momentum r (unit mass); starts from its stationary law N(0, I)
    momentum: jnp.ndarray
    #: step size h
    step_size: jnp.ndarray
    #: friction γ (σ² = 2γ)
    friction: jnp.ndarray


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

    _adapts = False

    def __init__(self, model, step_size, friction, **kwargs):
        super().__init__(model, **kwargs)
        name = type(self).__name__
        if not is_positive_scalar(step_size):
            raise ValueError(f"{name}: step_size must be a positive float, got {step_size!r}.")
        if not is_positive_scalar(friction):
            raise ValueError(f"{name}: friction must be a positive float (γ; σ² = 2γ), got {friction!r}.")
        self._step_size = float(step_size)
        self._friction = float(friction)

    def _init_kernel_state(self, rng_key, theta, potential, num_warmup_steps):
        momentum = random.normal(rng_key, theta.shape, theta.dtype)
        return SGHMCState(momentum, jnp.asarray(self._step_size, theta.dtype),
                          jnp.asarray(self._friction, theta.dtype))

    def _sample_update(self, rng_key, step, theta, ks, oracle):
        k_idx, k_noise = random.split(rng_key)
        pe, grad = oracle.grad(k_idx, theta)
        theta, momentum = underdamped_langevin(k_noise, theta, ks.momentum, grad, ks.step_size, ks.friction)
        return theta, ks._replace(momentum=momentum), pe, oracle.batch_size

    _warmup_update = _sample_update

    def _end_warmup(self, ks, theta, oracle):
        return ks
