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
p_B ∝ exp(½‖x + n a_B‖²) (Eq. 4 restricted to the terms that depend on B).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random

from .base import SGKernel, is_positive_scalar
from .diffusions import overdamped_langevin, underdamped_langevin, underdamped_langevin_matrix_friction

__all__ = [
    "EWSG",
    "EWSGState",
    "OverdampedEWSG",
    "OverdampedEWSGState",
    "EWSGVR",
    "EWSGVRState",
    "X_ESTIMATES",
    "ewsg_step",
    "overdamped_ewsg_step",
    "index_chain",
    "index_acceptance_rate",
]

#: Stream id of the index chain's keys: ``fold_in(rng_key, _INDEX_CHAIN_STREAM)``. It must differ
#: from 0 and 1: with JAX's default ``jax_threefry_partitionable=True``, ``fold_in(key, i)``
#: equals ``split(key)[i]``, the keys of the first minibatch and of the Langevin noise.
_INDEX_CHAIN_STREAM = 0x45575347  # "EWSG"


# ---------------------------------------------------------------------------- the x of Eq. 4
def _x_momentum(momentum, drift, step_size, noise_scale):
    # x = √h γ r_k / σ: the maximiser of the density of r_{k+1} − r_k when it peaks at 0 (Sec. 4.4)
    return jnp.sqrt(step_size) * drift / noise_scale


def _x_zero(momentum, drift, step_size, noise_scale):
    return jnp.zeros_like(momentum)


def _x_one(momentum, drift, step_size, noise_scale):
    return jnp.ones_like(momentum)


def _x_stop(momentum, drift, step_size, noise_scale):
    # x = (−1 + hγ) r_k / (σ √h): the x of r_{k+1} = 0 (Fig. 1b)
    return (step_size * drift - momentum) / (noise_scale * jnp.sqrt(step_size))


#: The choices of x of the paper's Fig. 1b, by name. ``drift`` is γ r_k (Γ r_k for EWSG-VR),
#: ``noise_scale`` is σ. The overdamped variant has no momentum and supports ``"zero"`` only.
X_ESTIMATES = {"momentum": _x_momentum, "zero": _x_zero, "one": _x_one, "stop": _x_stop}


# ---------------------------------------------------------------------------- the index chain
def index_chain(rng_key, current, propose, log_weight, num_steps):
    """``num_steps`` Metropolis steps over minibatches with uniform proposals (Eq. 6, App. D).

    :param rng_key: key of the chain (one key per step is split from it).
    :param current: pytree describing the current minibatch; ``log_weight(current)`` must work.
        Every leaf is carried and replaced as a whole when a proposal is accepted.
    :param propose: ``key -> pytree`` like ``current`` for a uniformly drawn minibatch
        (one minibatch gradient per call).
    :param log_weight: ``pytree -> log p_B`` up to a constant, ½‖x + n a_B‖².
    :param int num_steps: M ≥ 0 (static).
    :return: ``(accepted pytree, number of accepted moves)``.
    """
    if num_steps == 0:
        return current, jnp.zeros((), jnp.int32)

    def step(carry, key):
        cur, cur_lw, accepted = carry
        k_prop, k_acc = random.split(key)
        new = propose(k_prop)                                            # j ← uniform
        new_lw = log_weight(new)
        # accept with probability min(1, exp(log p_j − log p_i)); a NaN weight is never accepted
        u = random.uniform(k_acc, (), jnp.result_type(new_lw))
        accept = jnp.log(u) < new_lw - cur_lw
        cur = jax.tree.map(lambda a, b: jnp.where(accept, a, b), new, cur)
        return (cur, jnp.where(accept, new_lw, cur_lw), accepted + accept.astype(jnp.int32)), None

    (current, _, accepted), _ = lax.scan(
        step, (current, log_weight(current), jnp.zeros((), jnp.int32)), random.split(rng_key, num_steps)
    )
    return current, accepted


def index_acceptance_rate(state):
    """Acceptance rate of the index chain so far: accepted / proposed index moves.

    :param state: an :class:`~numpyro_sgd.base.SGState` (e.g. ``mcmc.last_state``) or the kernel
        state of :class:`EWSG`, :class:`OverdampedEWSG` or :class:`EWSGVR` (any leading chain
        dimensions are kept).
    :return: array of rates (NaN where nothing was proposed, e.g. ``num_index_steps=0``).
    """
    ks = getattr(state, "kernel_state", state)
    proposed = jnp.asarray(ks.num_index_proposed)
    return jnp.where(proposed > 0, ks.num_index_accepted / jnp.maximum(proposed, 1), jnp.nan)


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


def ewsg_step(rng_key, theta, momentum, minibatch_grad, step_size, friction, num_index_steps=1,
              x_estimate="momentum"):
    """One EWSG step: Alg. 1 of [1] with minibatches (App. D), Euler–Maruyama Eq. 3.

    :param rng_key: key of the step. ``split(rng_key)`` gives the keys of the first minibatch
        and of the Langevin noise, exactly as :class:`~numpyro_sgd.SGHMC`; the index chain uses
        ``fold_in(rng_key, _INDEX_CHAIN_STREAM)``. So ``num_index_steps=0`` is SGHMC, number for
        number.
    :param theta: θ_k (flat).
    :param momentum: r_k.
    :param minibatch_grad: ``key -> (Û_B(θ_k), ∇Û_B(θ_k))`` for a uniformly drawn minibatch B.
    :param step_size: h.
    :param friction: γ (scalar).
    :param int num_index_steps: M (static).
    :param str x_estimate: a key of :data:`X_ESTIMATES`.
    :return: ``(θ_{k+1}, r_{k+1}, Û_B(θ_k), accepted index moves)``.
    """
    k_idx, k_noise = random.split(rng_key)
    sigma = jnp.sqrt(2.0 * friction)
    current = minibatch_grad(k_idx)                                       # B ← uniform, ∇Û_B(θ_k)
    if num_index_steps > 0:
        x = X_ESTIMATES[x_estimate](momentum, friction * momentum, step_size, sigma)   # Sec. 4.4
        current, accepted = _index_chain_for(rng_key, current, minibatch_grad, x, jnp.sqrt(step_size) / sigma,
                                             num_index_steps)            # Eq. 6, M times
    else:
        accepted = jnp.zeros((), jnp.int32)
    pe, grad = current
    theta, momentum = underdamped_langevin(k_noise, theta, momentum, grad, step_size, friction)  # Eq. 3
    return theta, momentum, pe, accepted


def _index_chain_for(rng_key, current, propose, x, scale, num_index_steps, grad_of=lambda c: c[1]):
    """The M-step index chain of Alg. 1 with log p_B = ½‖x + scale·∇Û_B‖² (Eq. 4, 6, App. D);
    ``scale`` · ∇Û_B is the paper's n a_B. Its keys come from ``fold_in(rng_key, _INDEX_CHAIN_STREAM)``."""

    def log_weight(c):
        return 0.5 * jnp.sum((x + scale * grad_of(c)) ** 2)

    return index_chain(random.fold_in(rng_key, _INDEX_CHAIN_STREAM), current, propose, log_weight,
                       num_index_steps)


def _check_common(name, step_size, num_index_steps, x_estimate, allowed_x, kwargs):
    if not is_positive_scalar(step_size):
        raise ValueError(f"{name}: step_size must be a positive float, got {step_size!r}.")
    if (isinstance(num_index_steps, bool) or not isinstance(num_index_steps, (int, np.integer))
            or num_index_steps < 0):
        raise ValueError(
            f"{name}: num_index_steps must be an integer >= 0 (M, the Metropolis steps over minibatches per "
            f"step; 0 gives the uniform-minibatch sampler), got {num_index_steps!r}."
        )
    if not isinstance(x_estimate, str) or x_estimate not in allowed_x:
        raise ValueError(f"{name}: x_estimate must be one of {allowed_x}, got {x_estimate!r}.")
    if num_index_steps > 0 and kwargs.get("warmup_subsample") == "shuffle":
        raise ValueError(
            f"{name}: warmup_subsample='shuffle' gives every proposal of the index chain the same minibatch "
            "(the shuffled minibatch depends only on the step); use 'with_replacement' or 'without_replacement'."
        )


def _index_diagnostics(ks):
    rate = float(index_acceptance_rate(ks))
    return "" if np.isnan(rate) else f"index acceptance {rate:.2f}"


class EWSG(SGKernel):
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
    :func:`index_acceptance_rate` turns ``mcmc.last_state`` into the rate, and the progress bar
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

    :param model: NumPyro model with a subsample plate.
    :param float step_size: h > 0.
    :param float friction: γ > 0.
    :param int num_index_steps: M ≥ 0 (default 1).
    :param str x_estimate: ``"momentum"`` (default), ``"zero"``, ``"one"`` or ``"stop"``.
    :param kwargs: see :class:`~numpyro_sgd.base.SGKernel` (``steps_per_sample``, ``subsample``,
        ``warmup_subsample``, ``init_strategy``).

    .. doctest::

        >>> import jax, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from numpyro_sgd import EWSG
        >>> from numpyro_sgd.ewsg import index_acceptance_rate
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

    _adapts = False

    def __init__(self, model, step_size, friction, num_index_steps=1, *, x_estimate="momentum", **kwargs):
        super().__init__(model, **kwargs)
        name = type(self).__name__
        _check_common(name, step_size, num_index_steps, x_estimate, tuple(X_ESTIMATES), kwargs)
        if not is_positive_scalar(friction):
            raise ValueError(f"{name}: friction must be a positive float (γ; σ² = 2γ), got {friction!r}.")
        self._step_size = float(step_size)
        self._friction = float(friction)
        self._num_index_steps = int(num_index_steps)
        self._x_estimate = x_estimate

    @property
    def num_index_steps(self):
        """M, the Metropolis steps over minibatches per step."""
        return self._num_index_steps

    def _init_kernel_state(self, rng_key, theta, potential, num_warmup_steps):
        momentum = random.normal(rng_key, theta.shape, theta.dtype)  # as SGHMC
        zero = jnp.zeros((), jnp.int32)
        return EWSGState(momentum, jnp.asarray(self._step_size, theta.dtype),
                         jnp.asarray(self._friction, theta.dtype), zero, zero)

    def _sample_update(self, rng_key, step, theta, ks, oracle):
        m = self._num_index_steps
        theta, momentum, pe, accepted = ewsg_step(
            rng_key, theta, ks.momentum, lambda key: oracle.grad(key, theta), ks.step_size, ks.friction,
            m, self._x_estimate,
        )
        ks = ks._replace(momentum=momentum, num_index_accepted=ks.num_index_accepted + accepted,
                         num_index_proposed=ks.num_index_proposed + m)
        return theta, ks, pe, (m + 1) * oracle.batch_size

    _warmup_update = _sample_update

    def _end_warmup(self, ks, theta, oracle):
        return ks

    def _diagnostics(self, ks):
        return _index_diagnostics(ks)


# ---------------------------------------------------------------------------- overdamped (App. E)
class OverdampedEWSGState(NamedTuple):
    """Kernel state of :class:`OverdampedEWSG` (one chain)."""

    #: step size ε (SGLD's units: θ ← θ − (ε/2) ∇Û + N(0, ε))
    step_size: jnp.ndarray
    #: accepted moves of the index chain so far (warmup included), int32
    num_index_accepted: jnp.ndarray
    #: proposed moves of the index chain so far, M per step (warmup included), int32
    num_index_proposed: jnp.ndarray


def overdamped_ewsg_step(rng_key, theta, minibatch_grad, step_size, num_index_steps=1):
    """One step of EWSG for overdamped Langevin (App. E of [1]) in SGLD's units, ε = 2h.

    App. E: θ_{k+1} = θ_k − h ∇Ṽ + √(2h) ξ, x = (θ_{k+1} − θ_k)/√(2h), a_i = √h ∇V_i/√2,
    p_B ∝ exp(½‖x + n a_B‖²). With ε = 2h: n a_B = (√ε/2) ∇Û_B and x = 0 (θ_{k+1} = θ_k, the
    analogue of the heuristic r_{k+1} = r_k of Sec. 4.4; App. E gives no x). ``num_index_steps=0``
    is :class:`~numpyro_sgd.SGLD` at temperature 1, number for number.

    :return: ``(θ_{k+1}, Û_B(θ_k), accepted index moves)``.
    """
    k_idx, k_noise = random.split(rng_key)                                 # SGLD's keys
    current = minibatch_grad(k_idx)                                       # B ← uniform
    if num_index_steps > 0:
        current, accepted = _index_chain_for(rng_key, current, minibatch_grad, jnp.zeros_like(theta),
                                             0.5 * jnp.sqrt(step_size), num_index_steps)
    else:
        accepted = jnp.zeros((), jnp.int32)
    pe, grad = current
    theta = overdamped_langevin(k_noise, theta, grad, step_size, jnp.ones((), jnp.result_type(theta)))
    return theta, pe, accepted


class OverdampedEWSG(SGKernel):
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

    :param model: NumPyro model with a subsample plate.
    :param float step_size: ε > 0.
    :param int num_index_steps: M ≥ 0 (default 1).
    :param kwargs: see :class:`~numpyro_sgd.base.SGKernel`.
    """

    _adapts = False

    def __init__(self, model, step_size, num_index_steps=1, **kwargs):
        super().__init__(model, **kwargs)
        _check_common(type(self).__name__, step_size, num_index_steps, "zero", ("zero",), kwargs)
        self._step_size = float(step_size)
        self._num_index_steps = int(num_index_steps)

    @property
    def num_index_steps(self):
        """M, the Metropolis steps over minibatches per step."""
        return self._num_index_steps

    def _init_kernel_state(self, rng_key, theta, potential, num_warmup_steps):
        zero = jnp.zeros((), jnp.int32)
        return OverdampedEWSGState(jnp.asarray(self._step_size, theta.dtype), zero, zero)

    def _sample_update(self, rng_key, step, theta, ks, oracle):
        m = self._num_index_steps
        theta, pe, accepted = overdamped_ewsg_step(rng_key, theta, lambda key: oracle.grad(key, theta),
                                                   ks.step_size, m)
        ks = ks._replace(num_index_accepted=ks.num_index_accepted + accepted,
                         num_index_proposed=ks.num_index_proposed + m)
        return theta, ks, pe, (m + 1) * oracle.batch_size

    _warmup_update = _sample_update

    def _end_warmup(self, ks, theta, oracle):
        return ks

    def _diagnostics(self, ks):
        return _index_diagnostics(ks)


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


class EWSGVR(SGKernel):
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
       base rejects the non-finite steps; ``examples/ewsg_gaussian.py`` shows it). Γ_k compensates
       the covariance of *uniform* minibatches (Alg. 2), while with M ≥ 1 the index chain already
       lowers the noise: measured at h = 2e-2 on that example, EWSG-VR with M = 1 over-corrects
       (variance 0.70× the target's), with M = 0 it is within a few % of it.

    :param model: NumPyro model with exactly one subsample plate.
    :param float step_size: h > 0.
    :param float friction: γ > 0.
    :param int num_index_steps: M ≥ 0 (default 1).
    :param int calibration_period: L ≥ 1, data passes between full-data calibrations.
    :param str x_estimate: as :class:`EWSG`.
    :param int chunk_size: data per vmapped chunk of the full-data calibration (memory).
    :param kwargs: see :class:`~numpyro_sgd.base.SGKernel`.
    """

    _adapts = False

    def __init__(self, model, step_size, friction, num_index_steps=1, *, calibration_period=1,
                 x_estimate="momentum", chunk_size=4096, **kwargs):
        super().__init__(model, **kwargs)
        name = type(self).__name__
        _check_common(name, step_size, num_index_steps, x_estimate, tuple(X_ESTIMATES), kwargs)
        if not is_positive_scalar(friction):
            raise ValueError(f"{name}: friction must be a positive float (γ; σ² = 2γ), got {friction!r}.")
        for arg, value in (("calibration_period", calibration_period), ("chunk_size", chunk_size)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: {arg} must be an integer >= 1, got {value!r}.")
        self._step_size, self._friction = float(step_size), float(friction)
        self._num_index_steps = int(num_index_steps)
        self._calibration_period = int(calibration_period)
        self._x_estimate = x_estimate
        self._chunk_size = int(chunk_size)

    def _check_setup(self, potential, num_warmup_steps):
        if len(potential.plates) != 1:
            raise ValueError(
                f"{type(self).__name__}: the model has {len(potential.plates)} subsample plates; EWSG-VR's "
                "full-data calibration supports one. Subsample a single plate (or use EWSG)."
            )

    def _init_kernel_state(self, rng_key, theta, potential, num_warmup_steps):
        dt, d = theta.dtype, theta.shape[0]
        momentum = random.normal(rng_key, theta.shape, dt)
        steps_per_pass = -(-potential.num_data // ((self._num_index_steps + 1) * potential.batch_size))
        period = jnp.asarray(self._calibration_period * steps_per_pass, jnp.int32)
        zero = jnp.zeros((), jnp.int32)
        return EWSGVRState(
            momentum, jnp.asarray(self._step_size, dt), jnp.asarray(self._friction, dt),
            self._friction * jnp.eye(d, dtype=dt), jnp.zeros(d, dt), jnp.zeros((d, d), dt), theta,
            period, period, zero, zero,
        )

    def _full_moments(self, theta, oracle):
        """m1 = (1/N) Σ_i g_i and m2 = (1/N) Σ_i g_i g_iᵀ with g_i = ∇Û_{i} (= n ∇V_i), all N data."""
        plate = oracle.potential.plates[0]
        n, c = plate.size, min(self._chunk_size, plate.size)
        num_chunks = -(-n // c)
        idx = jnp.arange(num_chunks * c).reshape(num_chunks, c)

        def chunk(ids):
            mask = (ids < n).astype(theta.dtype)
            _, _, (rows,) = oracle.per_example_grads(theta, {plate.name: jnp.minimum(ids, n - 1)})
            rows = rows * mask[:, None]
            return jnp.sum(rows, 0), rows.T @ rows

        s1, s2 = lax.map(chunk, idx)
        return jnp.sum(s1, 0) / n, jnp.sum(s2, 0) / n

    def _sample_update(self, rng_key, step, theta, ks, oracle):
        m, s = self._num_index_steps, oracle.batch_size
        n = oracle.potential.num_data
        k_idx, k_noise = random.split(rng_key)
        sigma = jnp.sqrt(2.0 * ks.friction)

        # lines 5–7: every L passes, m1, m2 from all data at ω ← θ_k
        calibrate = ks.steps_since_calibration >= ks.calibration_period
        m1, m2 = lax.cond(calibrate, lambda: self._full_moments(theta, oracle),
                          lambda: (ks.mean_grad, ks.second_moment))
        anchor = jnp.where(calibrate, theta, ks.anchor)

        # lines 10–14: the index chain, carrying the per-datum gradients of the current minibatch
        def propose(key):
            idx = oracle.draw(key)
            pe, grad, (rows,) = oracle.per_example_grads(theta, idx)
            return pe, grad, rows, idx

        current = propose(k_idx)
        if m > 0:
            gamma_r = ks.friction_matrix @ ks.momentum
            x = X_ESTIMATES[self._x_estimate](ks.momentum, gamma_r, ks.step_size, sigma)
            current, accepted = _index_chain_for(rng_key, current, propose, x, jnp.sqrt(ks.step_size) / sigma, m)
        else:
            accepted = jnp.zeros((), jnp.int32)
        pe, grad, rows, idx = current

        # line 15: Euler–Maruyama step (Eq. 3) with friction matrix Γ_k
        new_theta, momentum = underdamped_langevin_matrix_friction(k_noise, theta, ks.momentum, grad,
                                                                   ks.step_size, ks.friction_matrix, sigma)
        # lines 16–19: SVRG-type update of m1, m2 with the anchor's per-datum gradients
        _, _, (rows_w,) = oracle.per_example_grads(anchor, idx)
        m1 = m1 + jnp.sum(rows - rows_w, 0) / n
        m2 = m2 + (rows.T @ rows - rows_w.T @ rows_w) / n
        cov = m2 - jnp.outer(m1, m1)
        d = theta.shape[0]
        gamma = 0.5 * (sigma**2 * jnp.eye(d, dtype=theta.dtype) + ks.step_size * cov / s)

        ks = ks._replace(
            momentum=momentum, friction_matrix=gamma, mean_grad=m1, second_moment=m2, anchor=anchor,
            steps_since_calibration=jnp.where(calibrate, 1, ks.steps_since_calibration + 1),
            num_index_accepted=ks.num_index_accepted + accepted, num_index_proposed=ks.num_index_proposed + m,
        )
        evals = (m + 2) * s + jnp.where(calibrate, n, 0)
        return new_theta, ks, pe, evals

    _warmup_update = _sample_update

    def _end_warmup(self, ks, theta, oracle):
        return ks

    def _diagnostics(self, ks):
        return _index_diagnostics(ks)
