"""Newton steps to the mode region at the hand-over from Adam (the noise warmup's rescue when
warmup is far from the mode in posterior units), and the Newton decrement they measure it by.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..model.oracle import grad_and_hessian
from ..numerics.linalg import eigh

__all__ = ["MODE_REGION_FACTOR", "NEWTON_MAX_STEPS", "NEWTON_MAX_DIM", "newton_decrement", "newton_to_mode"]


#: at the hand-over from Adam, warmup takes Newton steps when the Newton decrement on the fixed
#: minibatches exceeds this many times what minibatch noise alone gives (D · max(1, N/B))
MODE_REGION_FACTOR = 100.0

#: at most this many Newton steps
NEWTON_MAX_STEPS = 30

#: Newton's step is used only up to this dimension (it needs a D × D Hessian)
NEWTON_MAX_DIM = 1000

def newton_decrement(potential_fn, theta):
    """(λ², Δ, H) of the saddle-free Newton step ``Δ = |H|⁻¹ g`` of ``potential_fn`` at θ (g its
    gradient, H its Hessian, ``|H|`` with the eigenvalues of H taken in absolute value and floored at
    10⁻⁷ of the largest; Dauphin et al. 2014): ``λ² = gᵀ|H|⁻¹g`` is the squared distance to the
    minimum in the units of the curvature (posterior sds, for a potential), whatever the units of θ."""
    grad, hessian = grad_and_hessian(potential_fn, theta)
    values, vectors = eigh(0.5 * (hessian + hessian.T))
    values = jnp.abs(values)
    values = jnp.maximum(values, 1e-7 * jnp.max(values))
    delta = vectors @ ((vectors.T @ grad) / values)
    return grad @ delta, delta, hessian

def newton_to_mode(potential_fn, theta, threshold, max_steps=NEWTON_MAX_STEPS):
    """Damped Newton steps on ``potential_fn`` (a deterministic estimate of U) from θ while the
    Newton decrement λ² exceeds ``threshold``: Δ from :func:`newton_decrement`; a step is kept
    when λ² decreases (the decrement as merit function, as Newton's method for the equation
    ∇U = 0 uses the residual), otherwise its length is halved from the last kept point, up to 12
    times. Newton's step is invariant to linear changes of the units of θ, and near the mode it
    converges quadratically. θ is returned unchanged when λ² is already below ``threshold``.
    Every iteration evaluates g and H once (one trace of the model).

    :return: ``(θ, λ² at the start, the Hessian at the last kept point)``.
    """
    def step(carry):
        kept, kept_dec, kept_delta, kept_hessian, trial, length, n, start = carry
        dec, delta, hessian = newton_decrement(potential_fn, trial)
        better = jnp.isfinite(dec) & (dec < kept_dec)
        first = n == 0
        start = jnp.where(first, dec, start)
        accept = first | better
        kept = jnp.where(accept, trial, kept)
        kept_dec = jnp.where(accept, dec, kept_dec)
        kept_delta = jnp.where(accept, delta, kept_delta)
        kept_hessian = jnp.where(accept, hessian, kept_hessian)
        length = jnp.where(accept, 1.0, 0.5 * length)
        return kept, kept_dec, kept_delta, kept_hessian, kept - length * kept_delta, length, n + 1, start

    def keep_going(carry):
        _, kept_dec, _, _, _, length, n, _ = carry
        return (n == 0) | ((kept_dec > threshold) & (length > 2.0**-12) & (n <= max_steps))

    d, dtype = theta.shape[0], theta.dtype
    zero = jnp.zeros((), dtype)
    init = (theta, jnp.asarray(jnp.inf, dtype), jnp.zeros(d, dtype), jnp.zeros((d, d), dtype), theta,
            jnp.ones((), dtype), 0, zero)
    kept, _, _, hessian, _, _, _, start = lax.while_loop(keep_going, step, init)
    return kept, start, hessian
