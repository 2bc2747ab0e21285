"""Warmup of the kernels that freeze a noise-based preconditioner (ConstantSGD, SGFS, IASG), as an
adapter ``(init, update, final)`` in the manner of NumPyro's ``warmup_adapter``.

Warmup must (a) reach the mode region and (b) estimate the gradient-noise covariance Q there
(see the user guide, docs/guide.md). ``update`` moves θ and adapts, in ``num_warmup_steps``
SG steps:

1. the first ``adam_fraction`` of warmup: Adam (β₁ = 0.9, β₂ = 0.9) with a learning rate held at
   ``adam_lr[0]`` for half the phase, then decaying exponentially to ``adam_lr[1]``. The short
   β₂ memory forgets the huge gradients of a poor initial point (with β₂ = 0.99 or 0.999 a
   scale parameter initialised far in the tail stayed frozen for hundreds of steps);
2. then constant-SGD steps preconditioned by an EMA (0.99) of the *uncentred* second moment of
   the per-example gradients (full for kernels with a full preconditioner, else diagonal),
   restarted halfway through phase 1, plus the positive part of the prior's Hessian taken at
   that point (the curvature the gradient noise does not see), each coordinate's step clipped
   to ``max_step`` (the centred covariance as warmup preconditioner can send a log-scale site
   far out in one step);
3. during the last ``noise_window`` fraction, Q is averaged with a
   :func:`~numpyro_sgd.numerics.noise.noise_estimator`.

Adam moves in absolute units (about ``adam_lr`` per step), and phase 2's step limits its own
length far from the mode, so on a posterior whose sds are tiny in absolute units (predictors in
small units) both would stop thousands of sds from the mode with no rejected step. So at the
hand-over from Adam (:func:`~numpyro_sgd.adaptation.newton.newton_to_mode`; ``warmup_newton=True``, the default, up to
D = :data:`~numpyro_sgd.adaptation.newton.NEWTON_MAX_DIM`) warmup measures its distance to the mode in posterior units — the
Newton decrement on a fixed minibatch — and, when it is far beyond what minibatch noise
explains, jumps to the mode region by damped Newton steps, which are invariant to the units of
θ; a run already in the mode region is left as it was. The Hessian this check takes is kept for
the sampler's hand-over (ConstantSGD-full's relaxation time), so no second Hessian is compiled.

Per-example gradients, the moments, the noise average and the factorisation of the full M are
taken on every k-th step only (:func:`warmup_refresh_every`); the steps between take the plain
minibatch gradient and solve with the last factor, so warmup costs about what sampling costs
per SG step.

``final(state, theta, oracle)`` returns a :class:`WarmupSummary`: the per-plate noise Q_p and
the prior's Hessian at θ, from which every kernel computes its frozen dynamics with
:func:`~numpyro_sgd.numerics.noise.effective_curvature`.
"""

from __future__ import annotations

import warnings
from fractions import Fraction
from typing import Callable, NamedTuple

import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from numpyro.util import find_stack_level

from ..numerics.linalg import cho_solve, cholesky
from ..numerics.noise import NOISE_ESTIMATORS, NoiseState
from ..numerics.noise import noise_estimator as make_noise_estimator
from ..numerics.preconditioners import psd_part
from ..protocol import StepInfo
from ..validation import check_choice, check_number
from .newton import MODE_REGION_FACTOR, NEWTON_MAX_DIM, newton_to_mode

__all__ = ["WarmupState", "WarmupSummary", "NoiseWarmup", "noise_warmup", "WarmupOptions", "WARMUP",
           "WARMUP_DEFAULTS", "warmup_step_of", "check_warmup_options", "warmup_refresh_every", "pop_warmup_options"]

class WarmupOptions(NamedTuple):
    """The options of the noise warmup every noise-adapting kernel accepts, with their defaults:
    the one place they are written (the kernels' signatures read them from :data:`WARMUP`)."""

    #: how the minibatch gradient-noise covariance is estimated (None: the kernel's choice)
    noise_estimator: object = None
    #: fraction of the warmup steps spent in Adam towards the mode
    adam_fraction: float = 0.4
    #: fraction of the warmup steps whose minibatch gradients average the noise estimate
    noise_window: float = 0.4
    #: Adam's learning rate at the start and at the end of its phase (cosine decay)
    adam_lr: tuple = (0.1, 1e-3)
    #: the largest SG step during the noise phase, in posterior sds of the current estimate
    warmup_max_step: float = 1.0
    #: Newton steps to the mode region at the hand-over from Adam when warmup is far from it
    warmup_newton: bool = True


#: the warmup's defaults
WARMUP = WarmupOptions()
#: the same, as a dict
WARMUP_DEFAULTS = WARMUP._asdict()


class WarmupState(NamedTuple):
    """State of the noise warmup (one chain)."""

    #: optax Adam state (phase 1)
    adam_state: tuple
    #: EMA of the uncentred second moment of ∇Û_S (phase 2 preconditioner; (D, D) for kernels
    #: that estimate the full Q, else its diagonal)
    second_moment: jnp.ndarray
    #: Hessian of the prior (and Jacobian) terms, taken once halfway through Adam and added to the
    #: phase-2 preconditioner (same shape as ``second_moment``)
    prior_curvature: jnp.ndarray
    #: running state of the noise estimator (phase 3)
    noise_state: NoiseState
    #: SG step at which Adam hands over to preconditioned SGD
    adam_steps: jnp.ndarray
    #: SG step from which the noise covariance is averaged
    window_start: jnp.ndarray
    #: Adam learning rate at the start and at the end of its phase
    adam_lr: jnp.ndarray
    #: largest ``|Δθ_k|`` of a phase-2 step
    max_step: jnp.ndarray
    #: Cholesky factor of the phase-2 preconditioner M + Λ⁺ (+ jitter), refreshed with the
    #: moments (full only; a placeholder () for the diagonal)
    factor: jnp.ndarray
    #: ∇²Û_B on the fixed minibatch where the Newton check at the hand-over from Adam ended
    #: (NaN before it; a placeholder () unless the kernel keeps it, see ``keep_hessian``)
    hessian: jnp.ndarray = ()


class WarmupSummary(NamedTuple):
    """What warmup hands to the sampler."""

    #: per-plate gradient-noise covariance Q_p of ∇Û_S (a tuple; Q = their sum); (D,) or (D, D)
    plate_noise: tuple
    #: Hessian of the prior and Jacobian terms at the point of ``final`` ((D,) or (D, D))
    prior_curvature: jnp.ndarray

    @property
    def noise(self):
        """Q = Σ_p Q_p."""
        return sum(self.plate_noise)


class NoiseWarmup(NamedTuple):
    """The adapter: ``init(theta, num_warmup_steps)``, ``update(rng_key, step, theta, state, oracle)
    -> (theta, state, info)``, ``final(state, theta, oracle) -> WarmupSummary``; ``estimator`` is
    the noise estimator it averages (SGFS keeps using it while sampling)."""

    init: Callable
    update: Callable
    final: Callable
    estimator: object


def _fraction_of(w, fraction):
    """⌊fraction·w⌋ in integers, without overflow (``fraction`` as p/q with q ≤ 1,000)."""
    ratio = Fraction(fraction).limit_denominator(1000)
    p, q = ratio.numerator, ratio.denominator
    return (w // q) * p + (w % q) * p // q


def warmup_refresh_every(dim):
    """k: the warmup takes per-example gradients (and updates its O(S·D²) moments, the noise
    average and the factor of its preconditioner) on every k-th SG step only, k = min(8, ⌈D/16⌉);
    the other steps take the plain minibatch gradient, as sampling does.

    Measured (2-core CPU, logistic regression, S = 1,000): a step with per-example gradients and
    full moments costs 1.5× a plain step at D = 10 and 1.8–2.8× at D = 50, so with k = 4 at
    D = 50 warmup costs ≤ 1.5× sampling per SG step. Up to D = 16 (k = 1) every step refreshes.
    The noise average then holds (window length)/k minibatch covariances; give warmup enough
    steps (docs/performance.md: 10–20 data passes).
    """
    return min(8, -(-dim // 16))


def check_warmup_options(name, **options):
    """Validate the warmup options (:class:`WarmupOptions`; those not given take its defaults) in a
    kernel's ``__init__``, before any compute; returns all of them as a dict."""
    unknown = sorted(set(options) - set(WARMUP_DEFAULTS))
    if unknown:
        raise TypeError(f"{name}: {unknown} are not warmup options (those are {sorted(WARMUP_DEFAULTS)}).")
    noise_estimator, adam_fraction, noise_window, adam_lr, warmup_max_step, warmup_newton = WARMUP._replace(**options)
    if noise_estimator is not None:
        check_choice(name, "noise_estimator", noise_estimator, NOISE_ESTIMATORS)
    adam_fraction, noise_window, warmup_max_step = (check_number(name, arg, value) for arg, value in (
        ("adam_fraction", adam_fraction), ("noise_window", noise_window), ("warmup_max_step", warmup_max_step)))
    if not (0 <= adam_fraction < 1 and 0 < noise_window <= 1 - adam_fraction):
        raise ValueError(
            f"{name}: need 0 <= adam_fraction < 1 and 0 < noise_window <= 1 - adam_fraction, "
            f"got adam_fraction={adam_fraction}, noise_window={noise_window}."
        )
    if not (len(adam_lr) == 2 and adam_lr[0] > 0 and adam_lr[1] > 0):
        raise ValueError(f"{name}: adam_lr must be two positive learning rates (start, end), got {adam_lr!r}.")
    if not warmup_max_step > 0:
        raise ValueError(f"{name}: warmup_max_step must be > 0, got {warmup_max_step}.")
    if not isinstance(warmup_newton, (bool, np.bool_)):
        raise TypeError(f"{name}: warmup_newton must be True or False, got {warmup_newton!r}.")
    return dict(noise_estimator=noise_estimator, adam_fraction=adam_fraction, noise_window=noise_window,
                adam_lr=tuple(adam_lr), warmup_max_step=warmup_max_step, warmup_newton=bool(warmup_newton))


def noise_warmup(potential, full, name, *, keep_hessian=False, **options):
    """Build the warmup adapter for the traced model (see the module docstring); ``options``: the
    :class:`WarmupOptions` (those not given take its defaults).

    :param potential: the :class:`~numpyro_sgd.model.potential.SubsampledPotential` (plates, D).
    :param bool full: estimate the full D × D matrix Q (else its diagonal, O(S·D)).
    :param str name: the kernel's name, for messages.
    :param bool warmup_newton: Newton steps to the mode region at the hand-over from Adam when
        warmup is far from the mode in posterior units (module docstring; D ≤ 1000).
    :param bool keep_hessian: keep the Hessian estimate ∇²Û_B that the Newton check takes at the
        hand-over (``WarmupState.hessian``, D × D) for the sampler's end of warmup (ConstantSGD's
        relaxation time), so that no second Hessian program is compiled; needs ``warmup_newton``.
    """
    noise_estimator, adam_fraction, noise_window, adam_lr, warmup_max_step, warmup_newton = WARMUP._replace(**options)
    # under the cluster law a minibatch of S rows holds S/B independent units (its clusters)
    sizes = tuple(p.subsample_size for p in potential.plates)
    units = tuple(p.subsample_size // p.cluster_size for p in potential.plates)
    method = noise_estimator or ("minibatch" if min(units) >= 2 else "pooled")
    if method in ("minibatch", "eq25") and min(units) < 2:
        raise ValueError(
            f"{name}: noise_estimator={method!r} needs subsample_size >= 2 in every plate; "
            "use noise_estimator='pooled' or a larger subsample_size."
        )
    estimator = make_noise_estimator(method, sizes, potential.dim, full=full,
                                     cluster_sizes=tuple(p.cluster_size for p in potential.plates))
    refresh_every = warmup_refresh_every(potential.dim)
    # EMA of the second moment with a memory of 100 SG steps whatever the refresh interval
    ema = (0.99, 0.01) if refresh_every == 1 else (0.99**refresh_every, 1.0 - 0.99**refresh_every)
    adam = optax.scale_by_adam(b1=0.9, b2=0.9)
    rescue = warmup_newton and potential.dim <= NEWTON_MAX_DIM
    keep_hessian = keep_hessian and rescue

    def init(theta, num_warmup_steps):
        if isinstance(num_warmup_steps, int) and num_warmup_steps < MIN_WARMUP_STEPS:
            warnings.warn(short_warmup_message(name, num_warmup_steps, averaged_minibatches(num_warmup_steps)),
                          UserWarning, stacklevel=find_stack_level())
        dtype = theta.dtype
        shape = (theta.shape[0],) * (2 if full else 1)
        return WarmupState(
            adam_state=adam.init(theta),
            second_moment=jnp.zeros(shape, dtype),
            prior_curvature=jnp.zeros(shape, dtype),
            noise_state=estimator.init(dtype),
            **phase_starts(num_warmup_steps),
            adam_lr=jnp.asarray(adam_lr, dtype),
            max_step=jnp.asarray(warmup_max_step, dtype),
            factor=jnp.eye(theta.shape[0], dtype=dtype) if full else jnp.zeros((), dtype),
            hessian=jnp.full((theta.shape[0],) * 2, jnp.nan, dtype) if keep_hessian else jnp.zeros((), dtype),
        )

    def averaged_minibatches(num_warmup_steps):
        """How many minibatches the noise window of a warmup of W SG steps averages: the steps
        from ``window_start`` on that take per-example gradients (every ``refresh_every``-th)."""
        start = num_warmup_steps - max(_fraction_of(num_warmup_steps, noise_window), 1)
        return sum(1 for step in range(max(start, 0), num_warmup_steps) if step % refresh_every == 0)

    def phase_starts(num_warmup_steps):
        """``adam_steps`` = ⌊adam_fraction·W⌋ and ``window_start`` = W − max(⌊noise_window·W⌋, 1)
        for a warmup of W SG steps (exact integer arithmetic for a Python or a traced W)."""
        w = jnp.asarray(num_warmup_steps, jnp.int32)
        return dict(adam_steps=_fraction_of(w, adam_fraction),
                    window_start=w - jnp.maximum(_fraction_of(w, noise_window), 1))

    def uncentred_moment(per_example):
        """Uncentred second moment of ∇Û_S: Σ_p mean_n(g_{p,n} g_{p,n}ᵀ) / S_p (diagonal: O(S D))."""
        if full:
            return sum(g.T @ g / float(g.shape[0]) ** 2 for g in per_example)  # float: S² overflows int32
        return sum(jnp.mean(g**2, axis=0) / g.shape[0] for g in per_example)

    def preconditioner_factor(second, prior):
        """Cholesky factor of the phase-2 preconditioner M + Λ⁺ + jitter (full)."""
        # a generous jitter (relative to the mean diagonal) damps the warmup step in poorly
        # resolved directions; the frozen preconditioner uses the scale-invariant one
        jitter = 1e-6 * jnp.trace(second) / second.shape[0] * jnp.eye(second.shape[0], dtype=second.dtype)
        return cholesky(second + prior + jitter)

    def to_mode_region(theta, ws, oracle):
        """At the hand-over from Adam: Newton steps on a fixed minibatch of B rows when the Newton
        decrement there is beyond MODE_REGION_FACTOR × the D·max(1, N/B) that minibatch noise
        explains (:func:`~numpyro_sgd.adaptation.newton.newton_to_mode`). The phase-2 moment then restarts at the new point
        from the curvature Newton saw, M ≈ (N/S) ∇²Û_B (the Fisher identity), since
        the moment of the far-away gradients would keep the first steps short. Otherwise θ and
        the state are returned as they were."""
        batch = oracle.fixed_batch()
        rows = sum(idx.size for idx in batch.values())
        threshold = MODE_REGION_FACTOR * theta.shape[0] * max(1.0, oracle.num_data / rows)
        new_theta, decrement, hessian = newton_to_mode(lambda t: oracle.potential_energy(t, batch), theta,
                                                       threshold)
        moved = decrement > threshold
        # (the prior's share of the Hessian is counted in M as well: harmless for a warmup step)
        second = psd_part(hessian) * (oracle.num_data / oracle.batch_size)
        second = (second if full else jnp.diagonal(second)).astype(theta.dtype)
        ws = ws._replace(second_moment=jnp.where(moved, second, ws.second_moment))
        if full:
            ws = ws._replace(factor=jnp.where(moved, preconditioner_factor(second, ws.prior_curvature), ws.factor))
        if keep_hessian:
            ws = ws._replace(hessian=hessian.astype(theta.dtype))
        return jnp.where(moved, new_theta, theta), ws

    def moments(step, theta, ws, oracle, indices):
        """Per-example gradients at ``indices`` and everything estimated from them: the EMA of the
        uncentred second moment, the prior's curvature, the noise average and (full) the
        Cholesky factor of the phase-2 preconditioner. The phase of each chain is a select,
        O(D²), so that under vmap only the shared refresh predicate is a branch."""
        pe, grad, per_example = oracle.per_example_grads(theta, indices)
        uncentred = uncentred_moment(per_example)
        # the phases from the run's warmup length, which the driver gives unbatched (a branch
        # under vmap), else (a hand-written loop) from the state
        phases = (ws if oracle.num_warmup_steps is None else
                  ws._replace(**phase_starts(oracle.num_warmup_steps)))
        # restarted at the first refresh from halfway through Adam
        half = phases.adam_steps // 2
        restart = (step >= half) & (step < half + refresh_every)
        second = jnp.where(restart, uncentred, ema[0] * ws.second_moment + ema[1] * uncentred)
        # the curvature that the gradient noise does not see (prior, Jacobians): without it a
        # direction the likelihood leaves flat gets the step ḡ/0, clipped to max_step, every
        # step (measured: |θ|² from 2·10³ to 6·10⁷ in a softmax regression's shift directions)
        prior = lax.cond(restart, lambda t: psd_part(oracle.prior_hessian(t, diagonal=not full)).astype(t.dtype),
                         lambda t: ws.prior_curvature, theta)
        # phase 3 (overlapping phase 2): average the noise covariance
        noise_state = estimator.update(ws.noise_state, per_example, active=step >= phases.window_start)
        factor = ws.factor
        if full:
            factor = jnp.where(step >= half, preconditioner_factor(second, prior), factor)
        return pe, grad, ws._replace(second_moment=second, prior_curvature=prior, noise_state=noise_state,
                                     factor=factor)

    def update(rng_key, step, theta, ws, oracle):
        if rescue:  # one branch, on the step shared by all chains
            adam_steps = (ws if oracle.num_warmup_steps is None else
                          ws._replace(**phase_starts(oracle.num_warmup_steps))).adam_steps
            theta, ws = lax.cond(step == adam_steps, lambda t, w: to_mode_region(t, w, oracle),
                                 lambda t, w: (t, w), theta, ws)
        indices = oracle.draw(rng_key)
        if refresh_every == 1:
            pe, grad, ws = moments(step, theta, ws, oracle, indices)
        else:  # the step count is shared by all chains: a branch under vmap, not a select
            pe, grad, ws = lax.cond(step % refresh_every == 0,
                                    lambda ws: moments(step, theta, ws, oracle, indices),
                                    lambda ws: (*oracle.potential_and_grad(theta, indices), ws), ws)
        # phase 1: Adam, rate held then decaying exponentially
        updates, adam_state = adam.update(grad, ws.adam_state)
        frac = jnp.clip(2.0 * step / jnp.maximum(ws.adam_steps, 1) - 1.0, 0.0, 1.0)
        lr = ws.adam_lr[0] * (ws.adam_lr[1] / ws.adam_lr[0]) ** frac
        # phase 2: constant-SGD step preconditioned by the uncentred moment M = Q + ḡḡᵀ, clipped.
        # With the full M this is a natural-gradient step whose length limits itself far from
        # the mode: M⁻¹ḡ = Q⁻¹ḡ / (1 + ḡᵀQ⁻¹ḡ) (Sherman–Morrison), fast along correlated valleys.
        # The full M is factorised at each refresh only; a step solves with the factor, O(D²).
        if full:
            direction = cho_solve(ws.factor, grad)
        else:
            direction = grad / (ws.second_moment + ws.prior_curvature)
        sgd_delta = -jnp.clip(2.0 * direction, -ws.max_step, ws.max_step)
        delta = jnp.where(step < ws.adam_steps, -lr * updates, sgd_delta)
        return theta + delta, ws._replace(adam_state=adam_state), StepInfo(pe, oracle.batch_size, indices, True)

    def final(ws, theta, oracle):
        return WarmupSummary(estimator.final(ws.noise_state), oracle.prior_hessian(theta, diagonal=not full))

    return NoiseWarmup(init, update, final, estimator)


#: the fewest warmup SG steps that :func:`noise_warmup` counts as a warmup (fewer: a ``UserWarning``)
MIN_WARMUP_STEPS = 20


def short_warmup_message(name, num_warmup_steps, averaged):
    """The warning of a warmup of fewer than :data:`MIN_WARMUP_STEPS` SG steps (``averaged``: the
    minibatches its noise window averaged), saying what the kernel then does. With none averaged
    (``num_warmup=0``, or a window holding no refresh step) the frozen steps are NaN and every SG
    step is rejected (the noise-adapting kernels and ``with_default_steps``). With some, the kernel
    samples with steps from that rough noise estimate, from about where the chain started, so the
    first draws are burn-in; steps the estimate makes too long are rejected as any other.

    Measured (2-parameter regression, N = 2,000, S = 50, started 80 posterior sds from the mode,
    2,000 draws of one SG step, 5 seeds): after 1 warmup SG step no step was rejected, and the
    largest mean error was 0.43 posterior sd for SGLD, 0.47 for SGHMC and 0.15 for ConstantSGD
    (``steps_per_sample=1``) (medians; worst seeds 1.16, 1.21, 0.32), against 0.25, 0.25 and 0.10
    (worst 0.65, 0.68, 0.31) after 1,000 warmup steps. At D = 40 (a full noise covariance from 50
    rows), SGLD rejected 4 and 7 of its first 20 SG steps after 1 and 4 warmup steps.
    """
    fix = (f"Use num_warmup >= {MIN_WARMUP_STEPS} (warmup runs num_warmup × the SG steps of one warmup iteration, "
           "at least one each; typically hundreds to thousands of SG steps in all).")
    if averaged == 0:
        return (f"{name}: {num_warmup_steps} warmup SG steps cannot estimate the gradient noise (warmup needs at "
                f"least {MIN_WARMUP_STEPS}; it did not finish): its noise window averaged no minibatch, so the "
                "step size and preconditioner stay undefined (NaN) and every SG step is rejected and counted as a "
                "divergence (the draws repeat the initial point). " + fix)
    return (f"{name}: {num_warmup_steps} warmup SG steps cannot estimate the gradient noise well (warmup needs at "
            f"least {MIN_WARMUP_STEPS}; it did not finish). The kernel samples anyway, with its step size and "
            f"preconditioner set from the noise of only {averaged} minibatch{'es' if averaged > 1 else ''} (a rough "
            "estimate: steps it makes too long are rejected and counted as divergences), starting where those "
            f"{num_warmup_steps} steps left the chain, near its initial point rather than in the mode region: the "
            "first draws are burn-in and the means can be off by a large fraction of a posterior sd (measured for "
            "SGLD after 1 warmup step: 0.43 sd, median of 5 runs, against 0.25 after 1,000). " + fix)


def warmup_step_of(warmup, also=None, get=None, put=None):
    """An algorithm's ``warmup_step`` that delegates to the noise warmup ``warmup`` (its adapter),
    whose state is the kernel state's ``warmup`` field (``get(state)`` and ``put(state, ws)`` where
    it lies elsewhere: the Langevin kernels' ``adapted.warmup``); ``also(ws)``: other fields of the
    kernel state to set from the new warmup state."""
    get = (lambda s: s.warmup) if get is None else get
    put = (lambda s, ws: s._replace(warmup=ws)) if put is None else put

    def warmup_step(rng_key, step, theta, state, oracle):
        theta, ws, info = warmup.update(rng_key, step, theta, get(state), oracle)
        return theta, put(state, ws)._replace(**({} if also is None else also(ws))), info

    return warmup_step


def pop_warmup_options(name, kwargs, default_steps):
    """Take the warmup options (:data:`WARMUP_DEFAULTS`) out of a kernel's ``**kwargs`` and validate them.

    For the kernels whose default step size comes from a noise warmup (SGLD, pSGLD, SGHMC, EWSG,
    OverdampedEWSG, Santa): with a user step size (``default_steps=False``) there is no such
    warmup, and a warmup option is refused rather than ignored.
    """
    given = {k: kwargs.pop(k) for k in list(kwargs) if k in WARMUP_DEFAULTS}
    if given and not default_steps:
        raise ValueError(
            f"{name}: {sorted(given)} configure the noise warmup that sets the default step size; with a given "
            "step_size (and friction) warmup is plain burn-in. Drop these options or the step size."
        )
    return check_warmup_options(name, **given)


