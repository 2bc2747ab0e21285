"""Euler steps of the Langevin diffusions shared by the SG-MCMC kernels.

They see a position, a gradient of the potential U (a sum over data, NumPyro's convention:
temperature 1 targets exp(−U), the posterior) and step sizes; never the model or the data.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import random

__all__ = ["overdamped_langevin", "exponential_overdamped_langevin", "underdamped_langevin",
           "underdamped_langevin_matrix_friction"]


def overdamped_langevin(rng_key, position, grad, step_size, temperature=1.0, preconditioner=None):
    """One Euler–Maruyama step of dθ = −G ∇U dt + √(2T G) dW with dt = ε/2 (Welling & Teh Eq. 4).

    θ ← θ − (ε/2) G ∇Û + √(ε T G) ξ,  ξ ~ N(0, I);  G diagonal (``preconditioner``, default I).
    The correction term Γ(θ) of pSGLD (Li et al. 2016) is neglected, as in that paper.
    """
    noise = random.normal(rng_key, jnp.shape(position), jnp.result_type(position))
    g = 1.0 if preconditioner is None else preconditioner
    return position - 0.5 * step_size * g * grad + jnp.sqrt(step_size * temperature * g) * noise


def exponential_overdamped_langevin(rng_key, position, grad, step_size, curvature, temperature=1.0):
    """One step of dθ = −∇U dt + √(2T) dW over dt = ε/2 that is exact when ∇U(θ) = c θ + b (a
    Gaussian of precision c/T, any mean): the linear part c θ is integrated exactly and the rest,
    r = ∇U(θ) − c θ, is held at its value at the start of the step (the exponential Euler scheme;
    Hochbruck & Ostermann 2010, Acta Numerica, Sec. 2.2):

        θ' = e θ − ((1 − e)/c) r + √(T (1 − e²)/c) ξ,   e = exp(−c ε/2),  ξ ~ N(0, I).

    As c ε → 0 it is :func:`overdamped_langevin`'s Euler step. In coordinates where the posterior
    is close to N(m, I/c) (the curvature basis of the warmup at the mode), r is small and nearly
    constant, so steps with c ε/2 of order one keep the stationary law close to the posterior.

    :param grad: ∇Û at ``position``.
    :param step_size: ε (SGLD's units: dt = ε/2).
    :param curvature: c > 0, the precision of the Gaussian part (a scalar).
    """
    noise = random.normal(rng_key, jnp.shape(position), jnp.result_type(position))
    decay = jnp.exp(-0.5 * curvature * step_size)
    rest = grad - curvature * position
    return (decay * position - (1.0 - decay) / curvature * rest
            + jnp.sqrt(temperature * (1.0 - decay**2) / curvature) * noise)


def underdamped_langevin(rng_key, position, momentum, grad, step_size, friction):
    """One Euler–Maruyama step of underdamped Langevin dynamics with unit mass and temperature:

    θ' = θ + h r,   r' = r − h (∇Û(θ) + γ r) + σ √h ξ,   σ² = 2γ   (EWSG paper Eq. 3;
    SGHMC of Chen et al. 2014 with B̂ = 0). ``grad`` is ∇Û at the current θ.
    """
    noise = random.normal(rng_key, jnp.shape(momentum), jnp.result_type(momentum))
    new_position = position + step_size * momentum
    new_momentum = momentum - step_size * (grad + friction * momentum) + jnp.sqrt(2.0 * friction * step_size) * noise
    return new_position, new_momentum


def underdamped_langevin_matrix_friction(rng_key, position, momentum, grad, step_size, friction, noise_scale):
    """:func:`underdamped_langevin` with a friction matrix Γ (D × D) and noise amplitude σ given apart:

    θ' = θ + h r,   r' = r − h (∇Û(θ) + Γ r) + σ √h ξ.

    With Γ = (σ² I + h Q)/2 the extra minibatch noise of covariance h² Q per step is compensated
    by dissipation (fluctuation–dissipation at temperature 1; EWSG paper App. F).
    """
    noise = random.normal(rng_key, jnp.shape(momentum), jnp.result_type(momentum))
    new_position = position + step_size * momentum
    new_momentum = momentum - step_size * (grad + friction @ momentum) + noise_scale * jnp.sqrt(step_size) * noise
    return new_position, new_momentum
