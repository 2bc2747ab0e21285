"""Stochastic gradient Langevin dynamics (Welling & Teh 2011; Mandt et al. Sec. 4.1, Eq. 32) and
its RMSprop-preconditioned variant pSGLD (Li, Chen, Carlson & Carin 2016, Alg. 1)."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import random
from numpyro.infer.initialization import init_to_uniform

from .base import SGKernel, is_positive_scalar
from .diffusions import overdamped_langevin

__all__ = ["SGLD", "SGLDState", "PSGLD", "PSGLDState", "sgld_step", "psgld_step", "robbins_monro"]


class SGLDState(NamedTuple):
    """Kernel state of :class:`SGLD`."""

    #: constant step size ε (unused when a schedule is given)
    step_size: jnp.ndarray
    #: temperature T (1 samples the posterior)
    temperature: jnp.ndarray
    #: the step size used at the last step (ε_t of the schedule)
    last_step_size: jnp.ndarray


def robbins_monro(scale, offset=1.0, power=0.55):
    """Robbins–Monro schedule ε_t = a (b + t)^(−γ) (Welling & Teh Sec. 2; Mandt Eq. 32).

    ``scale`` = a, ``offset`` = b > 0, ``power`` = γ ∈ (0.5, 1] (then Σ ε_t = ∞, Σ ε_t² < ∞;
    γ = 0.5 is allowed for the schedule of Mandt et al. Sec. 6.2, ε₀/√(1000 + t)).
    Returns an optax-style schedule ``count -> value``.
    """
    if not scale > 0:
        raise ValueError(f"robbins_monro: scale must be > 0, got {scale}.")
    if not 0 < power <= 1:
        raise ValueError(f"robbins_monro: power must lie in (0, 1], got {power}.")
    if not offset > 0:
        raise ValueError(f"robbins_monro: offset must be > 0, got {offset}.")

    def schedule(count):
        return scale * (offset + jnp.asarray(count, jnp.float32)) ** (-power)

    return schedule


def sgld_step(rng_key, theta, grad, step_size, temperature):
    """SGLD (Welling & Teh Eq. 4): θ ← θ − (ε_t/2) ∇Û_S(θ) + N(0, ε_t T)."""
    return overdamped_langevin(rng_key, theta, grad, step_size, temperature)


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

        >>> import jax, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from numpyro_sgd import SGLD
        >>> y = jax.random.normal(jax.random.key(1), (1000,)) + 3.0
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=50) as idx:
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=y[idx])
        >>> mcmc = MCMC(SGLD(model, step_size=1e-4), num_warmup=500, num_samples=500, progress_bar=False)
        >>> mcmc.run(jax.random.key(0), y)
        >>> bool(abs(mcmc.get_samples()["mu"].mean() - y.mean()) < 0.1)
        True
    """

    def __init__(self, model, step_size, *, temperature=1.0, steps_per_sample=1,
                 subsample="with_replacement", warmup_subsample=None, init_strategy=init_to_uniform):
        super().__init__(model, steps_per_sample=steps_per_sample, subsample=subsample,
                         warmup_subsample=warmup_subsample, init_strategy=init_strategy)
        if not callable(step_size) and not is_positive_scalar(step_size):
            raise ValueError(
                f"SGLD: step_size must be a positive float or a schedule (count -> step size), got {step_size!r}."
            )
        if not temperature > 0:
            raise ValueError(f"SGLD: temperature must be > 0, got {temperature}.")
        self._step_size = step_size
        self._temperature = temperature

    def _init_kernel_state(self, rng_key, theta, potential, num_warmup_steps):
        eps = jnp.nan if callable(self._step_size) else self._step_size
        return SGLDState(jnp.asarray(eps, theta.dtype), jnp.asarray(self._temperature, theta.dtype),
                         jnp.asarray(0.0, theta.dtype))

    def _update(self, rng_key, step, theta, ks, oracle):
        k_idx, k_noise = random.split(rng_key)
        pe, grad = oracle.grad(k_idx, theta)
        eps = self._step_size(step) if callable(self._step_size) else ks.step_size
        eps = jnp.asarray(eps, theta.dtype)
        theta = sgld_step(k_noise, theta, grad, eps, ks.temperature)
        return theta, ks._replace(last_step_size=eps), pe, oracle.batch_size

    _warmup_update = _update
    _sample_update = _update
    _adapts = False

    def _end_warmup(self, ks, theta, oracle):
        return ks

    def _diagnostics(self, ks):
        return f"step size {float(ks.last_step_size):.3g}"


class PSGLDState(NamedTuple):
    """Kernel state of :class:`PSGLD`."""

    #: RMSprop second moment V of the per-datum mean gradient
    second_moment: jnp.ndarray
    #: step size ε (U units)
    step_size: jnp.ndarray
    #: decay α of V
    alpha: jnp.ndarray
    #: damping λ of G = 1 / (λ + √V)
    damping: jnp.ndarray
    #: whether V has been initialised (the first step sets V = ḡ²)
    started: jnp.ndarray


def psgld_step(rng_key, theta, grad, second_moment, step_size, alpha, damping, num_data, started):
    """pSGLD, Li et al. (2016) Alg. 1 (Γ neglected, as in the paper's experiments):

    V ← α V + (1 − α) ḡ ⊙ ḡ,   ḡ = ∇Û_S / N        (per-datum mean gradient)
    G ← 1 ⊘ (λ + √V)
    θ ← θ − (ε/2) G ⊙ ∇Û_S + N(0, ε G)
    """
    g_bar = grad / num_data
    second_moment = jnp.where(started, alpha * second_moment + (1 - alpha) * g_bar**2, g_bar**2)
    precond = 1.0 / (damping + jnp.sqrt(second_moment))
    theta = overdamped_langevin(rng_key, theta, grad, step_size, 1.0, precond)
    return theta, second_moment


class PSGLD(SGKernel):
    """Preconditioned SGLD with an RMSprop preconditioner.

    **References:**

    1. *Preconditioned Stochastic Gradient Langevin Dynamics for Deep Neural Networks*, C. Li,
       C. Chen, D. Carlson, L. Carin, AAAI 2016, Alg. 1 (defaults λ = 1e-5, α = 0.99).

    ========  ====================
    paper     argument
    ========  ====================
    ε_t       ``step_size`` (U units)
    α         ``alpha``
    λ         ``damping``
    ========  ====================

    .. note:: ḡ includes the prior's gradient divided by N (the paper's ḡ is the likelihood
       part only); the difference is O(1/N). The Γ(θ) correction term is neglected, as in the
       paper; the preconditioner keeps adapting during sampling, so the chain is only
       approximately stationary. Warmup runs the same dynamics (burn-in).

    :param model: NumPyro model with a subsample plate.
    :param float step_size: ε > 0.
    :param float alpha: α ∈ (0, 1) (default 0.99).
    :param float damping: λ > 0 (default 1e-5).
    :param kwargs: see :class:`~numpyro_sgd.base.SGKernel`.
    """

    _adapts = False

    def __init__(self, model, step_size, *, alpha=0.99, damping=1e-5, **kwargs):
        super().__init__(model, **kwargs)
        if not is_positive_scalar(step_size):
            raise ValueError(f"PSGLD: step_size must be a positive float, got {step_size!r}.")
        if not 0 < alpha < 1:
            raise ValueError(f"PSGLD: alpha (RMSprop decay) must lie in (0, 1), got {alpha}.")
        if not damping > 0:
            raise ValueError(f"PSGLD: damping (λ) must be > 0, got {damping}.")
        self._step_size, self._alpha, self._damping = float(step_size), float(alpha), float(damping)

    def _init_kernel_state(self, rng_key, theta, potential, num_warmup_steps):
        dt = theta.dtype
        return PSGLDState(jnp.zeros_like(theta), jnp.asarray(self._step_size, dt), jnp.asarray(self._alpha, dt),
                          jnp.asarray(self._damping, dt), jnp.array(False))

    def _sample_update(self, rng_key, step, theta, ks, oracle):
        k_idx, k_noise = random.split(rng_key)
        pe, grad = oracle.grad(k_idx, theta)
        theta, second = psgld_step(k_noise, theta, grad, ks.second_moment, ks.step_size, ks.alpha, ks.damping,
                                   oracle.potential.num_data, ks.started)
        return theta, ks._replace(second_moment=second, started=jnp.array(True)), pe, oracle.batch_size

    _warmup_update = _sample_update

    def _end_warmup(self, ks, theta, oracle):
        return ks
