"""Stochastic gradient Langevin dynamics (Welling & Teh 2011; Mandt et al. Sec. 4.1, Eq. 32) and
its RMSprop-preconditioned variant pSGLD (Li, Chen, Carlson & Carin 2016, Alg. 1).

SGLD's step is :func:`~numpyro_sgd.ewsg.overdamped_ewsg_update` with M = 0 index steps (a uniform
minibatch), so :class:`~numpyro_sgd.OverdampedEWSG` with ``num_index_steps=0`` is SGLD at
temperature 1 by construction.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import random

from .base import SGAlgorithm, SGKernel, StepInfo, is_positive_scalar, renamed_keyword
from .diffusions import overdamped_langevin
from .ewsg import check_step_size, overdamped_ewsg_update
from .schedules import robbins_monro

__all__ = ["SGLD", "SGLDState", "PSGLD", "PSGLDState", "sgld", "psgld", "sgld_step", "psgld_step", "robbins_monro"]


class SGLDState(NamedTuple):
    """Kernel state of :class:`SGLD`."""

    #: constant step size ε (unused when a schedule is given)
    step_size: jnp.ndarray
    #: temperature T (1 samples the posterior)
    temperature: jnp.ndarray
    #: the step size used at the last step (ε_t of the schedule)
    last_step_size: jnp.ndarray


def sgld_step(rng_key, theta, grad, step_size, temperature):
    """SGLD (Welling & Teh Eq. 4): θ ← θ − (ε_t/2) ∇Û_S(θ) + N(0, ε_t T)."""
    return overdamped_langevin(rng_key, theta, grad, step_size, temperature)


def sgld(potential, step_size, temperature=1.0):
    """The SGLD algorithm (:class:`SGLD`) for a traced model.

    :param potential: the :class:`~numpyro_sgd.potential.SubsampledPotential`.
    :param step_size: ε > 0 or a schedule ``count -> ε_t`` (evaluated at the global SG step).
    :param float temperature: T > 0.
    :return: :class:`~numpyro_sgd.base.SGAlgorithm` (no adaptation: warmup is burn-in).
    """
    schedule = step_size if callable(step_size) else None

    def init(rng_key, theta, num_warmup_steps):
        eps = jnp.nan if schedule is not None else step_size
        return SGLDState(jnp.asarray(eps, theta.dtype), jnp.asarray(temperature, theta.dtype),
                         jnp.asarray(0.0, theta.dtype))

    def step(rng_key, i, theta, state, oracle):
        eps = jnp.asarray(schedule(i) if schedule is not None else state.step_size, theta.dtype)   # ε_t
        # Welling & Teh Eq. 4 with a uniform minibatch: overdamped EWSG's step with M = 0
        theta, (pe, _, indices), _ = overdamped_ewsg_update(rng_key, theta, lambda key: oracle.grad(key, theta), eps,
                                                            0, state.temperature)
        return theta, state._replace(last_step_size=eps), StepInfo(pe, oracle.batch_size, indices)

    return SGAlgorithm(init, step, step, describe=lambda state: f"step size {float(state.last_step_size):.3g}")


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
    Welling & Teh: θ ← θ − (ε/2) ∇Û_S + N(0, ε). Warmup steps use the same dynamics (burn-in);
    a schedule is evaluated at the global SG step count (warmup included).

    :param model: NumPyro model with a subsample plate.
    :param step_size: float > 0 or a schedule.
    :param float temperature: T > 0 (default 1, the posterior).
    :param kwargs: see :class:`~numpyro_sgd.base.SGKernel` (``steps_per_sample``, ``subsample``,
        ``warmup_subsample``, ``init_strategy``).

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

    def __init__(self, model, step_size, *, temperature=1.0, **kwargs):
        super().__init__(model, **kwargs)
        if not callable(step_size) and not is_positive_scalar(step_size):
            raise ValueError(
                f"SGLD: step_size must be a positive float or a schedule (count -> step size), got {step_size!r}."
            )
        if not temperature > 0:
            raise ValueError(f"SGLD: temperature must be > 0, got {temperature}.")
        self._step_size = step_size
        self._temperature = temperature

    def _build(self, potential):
        return sgld(potential, self._step_size, self._temperature)


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


def psgld(potential, step_size, decay=0.99, damping=1e-5):
    """The pSGLD algorithm (:class:`PSGLD`) for a traced model.

    :param potential: the :class:`~numpyro_sgd.potential.SubsampledPotential` (N for ḡ = ∇Û_S / N).
    :return: :class:`~numpyro_sgd.base.SGAlgorithm` (V keeps adapting; warmup is burn-in).
    """

    def init(rng_key, theta, num_warmup_steps):
        dt = theta.dtype
        return PSGLDState(jnp.zeros_like(theta), jnp.asarray(step_size, dt), jnp.asarray(decay, dt),
                          jnp.asarray(damping, dt), jnp.array(False))

    def step(rng_key, i, theta, state, oracle):
        k_idx, k_noise = random.split(rng_key)
        pe, grad, indices = oracle.grad(k_idx, theta)
        theta, second = psgld_step(k_noise, theta, grad, state.second_moment, state.step_size, state.decay,
                                   state.damping, potential.num_data, state.started)
        return theta, state._replace(second_moment=second, started=jnp.array(True)), StepInfo(pe, oracle.batch_size,
                                                                                             indices)

    return SGAlgorithm(init, step, step)


class PSGLD(SGKernel):
    """Preconditioned SGLD with an RMSprop preconditioner.

    **References:**

    1. *Preconditioned Stochastic Gradient Langevin Dynamics for Deep Neural Networks*, C. Li,
       C. Chen, D. Carlson, L. Carin, AAAI 2016, Alg. 1 (defaults λ = 1e-5, α = 0.99).

    ========  ====================
    paper     argument
    ========  ====================
    ε_t       ``step_size`` (U units)
    α         ``decay`` (RMSprop decay; ``alpha`` before 0.2)
    λ         ``damping``
    ========  ====================

    .. note:: ḡ includes the prior's gradient divided by N (the paper's ḡ is the likelihood
       part only); the difference is O(1/N). The Γ(θ) correction term is neglected, as in the
       paper; the preconditioner keeps adapting during sampling, so the chain is only
       approximately stationary. Warmup runs the same dynamics (burn-in).

    :param model: NumPyro model with a subsample plate.
    :param float step_size: ε > 0.
    :param float decay: α ∈ (0, 1), the RMSprop decay of V (default 0.99).
    :param float damping: λ > 0 (default 1e-5).
    :param kwargs: see :class:`~numpyro_sgd.base.SGKernel`.
    """

    def __init__(self, model, step_size, *, decay=0.99, damping=1e-5, alpha=None, **kwargs):
        super().__init__(model, **kwargs)
        check_step_size("PSGLD", step_size)
        decay = renamed_keyword("PSGLD", "decay", decay, 0.99, "alpha", alpha)
        if not 0 < decay < 1:
            raise ValueError(f"PSGLD: decay (the RMSprop decay α) must lie in (0, 1), got {decay}.")
        if not damping > 0:
            raise ValueError(f"PSGLD: damping (λ) must be > 0, got {damping}.")
        self._options = dict(step_size=float(step_size), decay=float(decay), damping=float(damping))

    def _build(self, potential):
        return psgld(potential, **self._options)
