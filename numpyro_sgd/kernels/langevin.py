"""The Langevin steps that SGLD, SGHMC and the EWSG kernels share, their validators and
default-step rules: below the kernels that use them (:mod:`numpyro_sgd.kernels.sgld`,
:mod:`numpyro_sgd.kernels.sghmc`, :mod:`numpyro_sgd.kernels.ewsg`), so that the simple kernels do not depend on
the extension.

* :func:`sgld_step`: the overdamped step (Welling & Teh Eq. 4).
* :func:`overdamped_ewsg_update`: a minibatch (uniform, or chosen by the index chain of EWSG App. E)
  and then :func:`sgld_step`; SGLD runs it with M = 0 index steps.
* :func:`ewsg_update`: a minibatch (uniform, or EWSG Alg. 1, App. D) and then the underdamped
  Euler–Maruyama step (EWSG Eq. 3); SGHMC runs it with M = 0.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import random

from ..numerics.diffusions import overdamped_langevin, underdamped_langevin
from ..numerics.index_chain import X_ESTIMATES, select_minibatch

__all__ = ["sgld_step", "overdamped_ewsg_update", "ewsg_update", "underdamped_minibatch"]


def sgld_step(rng_key, theta, grad, step_size, temperature):
    """SGLD (Welling & Teh Eq. 4): θ ← θ − (ε_t/2) ∇Û_S(θ) + N(0, ε_t T)."""
    return overdamped_langevin(rng_key, theta, grad, step_size, temperature)


def underdamped_minibatch(rng_key, propose, num_index_steps, x_estimate, momentum, drift, step_size, sigma):
    """EWSG Alg. 1's minibatch for an underdamped step: x of Sec. 4.4 from ``drift()`` (γ r_k or Γ_k r_k)
    and n a_B = (√h/σ) ∇Û_B (Eq. 4, App. D)."""
    return select_minibatch(rng_key, propose, num_index_steps,
                            lambda: X_ESTIMATES[x_estimate](momentum, drift(), step_size, sigma),
                            jnp.sqrt(step_size) / sigma)


def ewsg_update(rng_key, theta, momentum, propose, step_size, friction, num_index_steps=1, x_estimate="momentum"):
    """One step of underdamped Langevin with the minibatch of Alg. 1 (App. D), Euler–Maruyama Eq. 3.

    The step of :class:`~numpyro_sgd.EWSG` and, with ``num_index_steps=0``, of :class:`~numpyro_sgd.SGHMC`.

    :param rng_key: key of the step: ``split(rng_key)`` gives the keys of the first minibatch and
        of the Langevin noise; the index chain uses ``fold_in(rng_key, _INDEX_CHAIN_STREAM)``.
    :param theta: θ_k (flat).
    :param momentum: r_k.
    :param propose: ``key -> (Û_B(θ_k), ∇Û_B(θ_k), ...)`` for a uniformly drawn minibatch B (the
        extra entries, e.g. its indices, are carried along).
    :param step_size: h.
    :param friction: γ (scalar).
    :param int num_index_steps: M (static).
    :param str x_estimate: a key of :data:`~numpyro_sgd.numerics.index_chain.X_ESTIMATES`.
    :return: ``(θ_{k+1}, r_{k+1}, the accepted minibatch's tuple, accepted index moves)``.
    """
    k_noise = random.split(rng_key)[1]
    sigma = jnp.sqrt(2.0 * friction)
    current, accepted = underdamped_minibatch(rng_key, propose, num_index_steps, x_estimate, momentum,
                                               lambda: friction * momentum, step_size, sigma)   # Sec. 4.4, Eq. 6
    theta, momentum = underdamped_langevin(k_noise, theta, momentum, current[1], step_size, friction)  # Eq. 3
    return theta, momentum, current, accepted


def overdamped_ewsg_update(rng_key, theta, propose, step_size, num_index_steps, temperature):
    """One overdamped Langevin step (Welling & Teh Eq. 4) with the minibatch of App. E, ε = 2h.

    The step of :class:`~numpyro_sgd.OverdampedEWSG` (temperature 1) and, with ``num_index_steps=0``, of
    :class:`~numpyro_sgd.SGLD`. ``propose`` and the keys are as in :func:`ewsg_update`; the
    index chain's weights (x = 0, n a_B = (√ε/2) ∇Û_B) assume temperature 1.

    :return: ``(θ_{k+1}, the accepted minibatch's tuple, accepted index moves)``.
    """
    k_noise = random.split(rng_key)[1]                                     # SGLD's keys
    current, accepted = select_minibatch(rng_key, propose, num_index_steps, lambda: jnp.zeros_like(theta),
                                         0.5 * jnp.sqrt(step_size))
    theta = sgld_step(k_noise, theta, current[1], step_size, temperature)  # Welling & Teh Eq. 4
    return theta, current, accepted


