"""SGLD with control variates for group latents: the inner kernel of
``SGWithinGibbs(SGLD(model, control_variates=True))`` on a random-effects model.

θ = (β, a_1, …, a_G) are the data-dependent latents (global β, group a_g, :mod:`~numpyro_sgd.model.groups`),
φ the hyperparameters the Gibbs wrapper draws given a (no data). G may be 0: a regression whose
coefficients every row reads (a horseshoe's β, :func:`~numpyro_sgd.model.groups.plates_read_whole`)
has only global coordinates, and φ its shrinkage scales. U(θ) = L(θ) + U₀(θ; φ), L the
likelihood, U₀ the prior. One chain, at the wrapper's current φ::

    first step        θ̂ ← Newton steps from θ₀ on all rows (group_newton); θ ← θ̂
    every step        B ~ the minibatch law (S rows),  d = θ − θ̂
                      ĝ = ∇U₀(θ; φ) + ∇L(θ̂) + ∇²L(θ̂) d
                          + (N/S) Σ_{i∈B} [∇ℓ_i(θ) − ∇ℓ_i(θ̂) − ∇²ℓ_i(θ̂) d]             (1)
                      H = ∇²L(θ̂) + ∇²U₀(θ; φ) = L Lᵀ      (block-arrowhead, numerics.arrowhead)
                      θ ← θ − (1 − e^{−h}) H⁻¹ ĝ + √(1 − e^{−2h}) L⁻ᵀ ξ,  ξ ~ N(0, I)      (2)
    last warmup step  θ̂ ← Newton steps from θ (φ is then near its posterior; none without warmup)

With no group coordinates and more than 64 global ones (a shrinkage regression's p coefficients),
the searches' Newton directions read ∇²L from 32 rows per coordinate
(:func:`~numpyro_sgd.adaptation.group_centre.direction_rows`): the warmup's centre keeps that
estimate (its draws are burn-in), and the last warmup step's search (the first step's, without
warmup) ends with ∇²L(θ̂) from every row, as (1) needs to be unbiased.

(1) is the control-variate gradient of Baker, Fearnhead, Fox & Nemeth (2019, Eq. 5) with the
second-order term of the Taylor expansion about θ̂ added and subtracted: E_B[(N/S) Σ_B ∇²ℓ_i(θ̂)]
= ∇²L(θ̂), so ĝ stays unbiased, and its noise is (N²/S) Cov_i[∇ℓ_i(θ) − ∇ℓ_i(θ̂) − ∇²ℓ_i(θ̂) d]
= O(N²/S · ‖d‖⁴ · ∇³ℓ): nil for a linear-Gaussian likelihood. A group with no row in B moves by
∇U₀ + ∇L(θ̂) + ∇²L(θ̂) d alone, which is its exact full-data gradient to second order: the
first-order estimate's noise in a group's coordinates is N/(S n_g) times its curvature (n_g its
rows), of order one when a minibatch holds about one row of each group, and the second-order
term removes it. (2) is the exponential integrator of the Langevin diffusion preconditioned by
H⁻¹ (Hochbruck & Ostermann 2010, Sec. 2.2, as :func:`~numpyro_sgd.numerics.diffusions.exponential_overdamped_langevin`
in the coordinates where H = I): exact, for any h, when U is Gaussian with Hessian H, which it is
given φ for a linear mixed model; h in units of the Langevin time of those coordinates.

**References:**

1. *Control variates for stochastic gradient MCMC*, J. Baker, P. Fearnhead, E. B. Fox,
   C. Nemeth, Statistics and Computing 29 (2019), Eq. 5, Alg. 2.
2. *Exponential integrators*, M. Hochbruck, A. Ostermann, Acta Numerica 19 (2010), Sec. 2.2.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import random

from ..adaptation.group_centre import GroupCentre, group_newton, prior_part, unset_group_centre
from ..numerics.arrowhead import factor
from ..protocol import SampleBlock, SGAlgorithm, StepInfo

__all__ = ["GroupSGLDState", "group_sgld", "GROUP_STEP"]

#: h of (2), in units of the Langevin time where H = I: the draws' lag-one autocorrelation is
#: e^{−h} = 0.37 for a Gaussian posterior (effective samples about 0.46 per step), and the
#: exponential integrator's error on a non-Gaussian one grows with h
GROUP_STEP = 1.0


class GroupSGLDState(NamedTuple):
    """State of :func:`group_sgld` (one chain)."""

    #: the centre θ̂ with ∇L and ∇²L there (:class:`~numpyro_sgd.adaptation.group_centre.GroupCentre`)
    centre: GroupCentre
    #: h of (2)
    step_size: jnp.ndarray
    #: whether the centre has been found at the start of warmup
    centred: jnp.ndarray
    #: whether the centre has been found again at the last warmup step
    recentred: jnp.ndarray
    #: data passes of both centre searches
    passes: jnp.ndarray


def group_sgld(potential, layout, step_size=GROUP_STEP, prior_cross=True):
    """The algorithm of the module docstring on ``potential`` (the data-dependent latents θ; the
    wrapper substitutes φ), with ``layout`` the :class:`~numpyro_sgd.numerics.arrowhead.GroupLayout`
    of θ (:func:`~numpyro_sgd.model.groups.group_layout`). ``prior_cross``: whether the prior
    couples the global and the group coordinates (:func:`~numpyro_sgd.adaptation.group_centre.prior_part`).

    :return: :class:`~numpyro_sgd.SGAlgorithm` with state :class:`GroupSGLDState`; one step per
        returned sample and per warmup iteration.
    """

    def gradient(oracle, theta, centre, indices, prior_grad):
        def likelihood(t):  # (N/S) Σ_B ℓ_i(t): the minibatch potential without its prior
            return oracle.likelihood_energy(t, indices)

        offset = theta - centre.position
        pe, grad_here = jax.value_and_grad(likelihood)(theta)
        grad_centre, curvature = jax.jvp(jax.grad(likelihood), (centre.position,), (offset,))
        grad = (prior_grad + centre.lik_grad + centre.lik_hessian.matvec(layout, offset)
                + grad_here - grad_centre - curvature)
        return pe, grad

    def init(rng_key, theta, num_warmup_steps):
        zero = jnp.zeros((), bool)
        return GroupSGLDState(unset_group_centre(theta, layout), jnp.asarray(step_size, theta.dtype), zero, zero,
                              jnp.zeros((), theta.dtype))

    def advance(rng_key, theta, state, oracle):
        """One step of (1)–(2) from θ with the centre in ``state``."""
        k_batch, k_noise = random.split(rng_key)
        indices = oracle.draw(k_batch)
        prior_grad, prior_hessian = prior_part(oracle, theta, layout, prior_cross)
        pe, grad = gradient(oracle, theta, state.centre, indices, prior_grad)
        pe = pe + oracle.prior_potential(theta)
        chol = factor(state.centre.lik_hessian + prior_hessian)
        decay = jnp.exp(-state.step_size)
        noise = random.normal(k_noise, theta.shape, theta.dtype)
        theta = (theta - (1.0 - decay) * chol.solve(layout, grad)
                 + jnp.sqrt(1.0 - decay**2) * chol.sample(layout, noise))
        return theta, state, StepInfo(pe, 2 * oracle.batch_size, indices, True)

    def step(rng_key, i, theta, state, oracle):
        # the centre at the first step, and again at the last warmup step (the first step when
        # there is no warmup); a loop that stops at once otherwise, so warmup and sampling are one
        # step and NumPyro compiles one program for both
        last = oracle.step + 1 >= oracle.num_warmup_steps
        first = ~state.centred
        active = first | (last & ~state.recentred)
        # state.centre where not active; the first phase's cheap passes from the initial point only
        # (a draw is near the mode already)
        centre = group_newton(oracle, theta, layout, active, state.centre, from_afar=first, final=last)
        theta = jnp.where(first, centre.position, theta)  # from the initial point to the mode; later the chain stays
        state = state._replace(centre=centre, centred=jnp.ones((), bool), recentred=state.recentred | (active & last),
                               passes=state.passes + centre.passes)
        return advance(rng_key, theta, state, oracle)

    def describe(state):
        return (f"h {float(state.step_size):.3g}, centre λ² {float(state.centre.decrement):.2g} "
                f"after {float(state.passes):.0f} passes")

    # one step per returned sample and per warmup iteration (no steps known in advance: a warmup
    # budget in data passes would give a warmup iteration N/S steps, for nothing the centre needs);
    # warmup is burn-in: the same step, which finds the centre when it is due
    return SGAlgorithm(init, step, block=SampleBlock(), describe=describe)
