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
   :func:`~numpyro_sgd.noise.noise_estimator`.

Adam moves in absolute units (about ``adam_lr`` per step), and phase 2's step limits its own
length far from the mode, so on a posterior whose sds are tiny in absolute units (predictors in
small units) both would stop thousands of sds from the mode with no rejected step. So at the
hand-over from Adam (:func:`newton_to_mode`; ``warmup_newton=True``, the default, up to
D = :data:`~numpyro_sgd.warmup.NEWTON_MAX_DIM`) warmup measures its distance to the mode in posterior units — the
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
:func:`~numpyro_sgd.noise.effective_curvature`.
"""

from __future__ import annotations

import warnings
from fractions import Fraction
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax, random
from numpyro.util import find_stack_level

from .basis import CurvatureBasis, OracleInBasis, curvature_basis, identity_basis, step_in_basis  # noqa: F401
from .control_variates import (
    ControlState,
    ControlVariateOracle,
    check_single_plate,
    control_variate_noise,
    curvature_at,
    curvature_rows,
    newton_centre,
    unset_control,
)
from .linalg import cho_solve, cholesky, eigh, inv
from .noise import (
    NOISE_ESTIMATORS,
    NoiseState,
    fisher_curvature,
    psd_part,
    resolve_preconditioner,
    sampling_noise,
)
from .noise import noise_estimator as make_noise_estimator
from .potential import grad_and_hessian
from .protocol import StepInfo
from .validation import check_choice, check_number

__all__ = ["WarmupState", "WarmupSummary", "NoiseWarmup", "noise_warmup", "WarmupOptions", "WARMUP",
           "WARMUP_DEFAULTS", "warmup_step_of", "check_warmup_options",
           "warmup_refresh_every", "pop_warmup_options", "with_default_steps", "newton_decrement", "newton_to_mode",
           "CurvatureBasis", "curvature_basis", "identity_basis", "OracleInBasis", "step_in_basis",
           "LANGEVIN_PRECONDITIONERS", "check_langevin_preconditioner", "PredictedRelaxation", "FROZEN_SPREAD",
           "coordinate_name", "frozen_direction_cause", "predicted_relaxation"]

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

    :param potential: the :class:`~numpyro_sgd.potential.SubsampledPotential` (plates, D).
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
        explains (:func:`newton_to_mode`). The phase-2 moment then restarts at the new point
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


def warmup_step_of(warmup, also=None):
    """An algorithm's ``warmup_step`` that delegates to the noise warmup ``warmup`` (its adapter),
    whose state is the kernel state's ``warmup`` field; ``also(ws)``: other fields of the kernel
    state to set from the new warmup state."""

    def warmup_step(rng_key, step, theta, state, oracle):
        theta, ws, info = warmup.update(rng_key, step, theta, state.warmup, oracle)
        return theta, state._replace(warmup=ws, **({} if also is None else also(ws))), info

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


#: the ``preconditioner`` values of the Langevin kernels (SGLD, pSGLD, SGHMC, EWSG, OverdampedEWSG,
#: Santa): their default steps run in the coordinates of the warmup's curvature (``"auto"``,
#: ``"full"``, ``"diag"``) or in the model's own (``"scalar"``, the papers' kernels)
LANGEVIN_PRECONDITIONERS = ("auto", "full", "diag", "scalar")


def check_langevin_preconditioner(name, preconditioner, steps_given):
    """Validate a Langevin kernel's ``preconditioner``; return it, ``"scalar"`` when the user gave
    the step size (a step in the model's coordinates: there is then no noise warmup whose curvature
    could precondition it, or, with SGHMC's and EWSG's friction left to the kernel, that warmup
    estimates the friction in the model's coordinates). A friction given alone keeps the
    curvature's coordinates (:class:`~numpyro_sgd.SGHMC`)."""
    check_choice(name, "preconditioner", preconditioner, LANGEVIN_PRECONDITIONERS)
    if steps_given:
        if preconditioner in ("full", "diag"):
            raise ValueError(
                f"{name}: preconditioner={preconditioner!r} comes from the curvature the noise warmup estimates, "
                "and a given step size skips that warmup. Leave the step size (and friction) to the kernel, or "
                "use preconditioner='scalar'."
            )
        return "scalar"
    return preconditioner


def with_default_steps(algorithm, potential, name, set_steps, warmup_options, subsample="with_replacement",
                       preconditioner="auto", control_variates=False):
    """The algorithm with its warmup replaced by the noise warmup (:func:`noise_warmup`) and an
    ``end_warmup`` that sets its step size (and friction) from the estimate.

    The algorithm's state must have a ``warmup`` field (empty for a user step size), and its
    sampling step must read its step sizes from the state.

    :param algorithm: the :class:`~numpyro_sgd.SGAlgorithm` built with placeholder (NaN) steps.
    :param set_steps: ``(state, noise, curvature) -> state``: the state with the steps set from
        the sampling-phase minibatch noise f Q (:func:`~numpyro_sgd.noise.sampling_noise`) and the
        curvature A_U ≈ Σ_p (S_p/N_p) Q_p + Λ⁺ (Fisher plus the positive part of the prior's
        Hessian, :func:`~numpyro_sgd.noise.fisher_curvature`), both (D,) or (D, D). When the
        noise window averaged nothing (too short a warmup; :func:`noise_warmup` warns) both are
        NaN, so the steps are NaN: every SG step is then rejected and counted as a divergence,
        never sampled.
    :param dict warmup_options: from :func:`pop_warmup_options`.
    :param str subsample: how the sampling phase draws minibatches (the kernel's ``subsample``).
    :param str preconditioner: ``"auto"``, ``"full"`` or ``"diag"``: the sampling step runs in the
        coordinates of the estimated curvature (:class:`CurvatureBasis`, kept in the state's
        ``basis`` field), and ``set_steps`` receives Q and A in those coordinates (A ≈ I);
        ``"scalar"``: in the model's coordinates, as the papers' kernels (``basis`` stays empty).

    Q is estimated in full up to D = :data:`~numpyro_sgd.noise.AUTO_FULL_MAX_DIM`, above only its
    diagonal (as ``preconditioner="auto"`` of the noise-adapting kernels); a ``"full"`` basis
    estimates it in full at any D.

    With ``control_variates=True`` (:mod:`numpyro_sgd.control_variates`) the end of warmup takes
    Newton steps from the warmup's last point to the centre θ̂ (one streamed data pass each, and
    one for ∇U(θ̂)), the curvature is the Hessian estimated at θ̂ (its positive part, on a fixed
    set of rows) instead of the Fisher, the coordinates are those of that Hessian, the noise
    ``set_steps`` receives is the control-variate gradient's, measured a posterior sd from θ̂
    (:func:`~numpyro_sgd.control_variates.control_variate_noise`, with how far ∇U is from linear
    there in ``state.control.nonlinearity``), and every sampling step's gradient is the
    control-variate estimate (:class:`~numpyro_sgd.control_variates.ControlVariateOracle`). The
    state needs a ``control`` field.
    """
    kind = resolve_preconditioner(preconditioner, potential.dim)
    full = kind == "full" or (kind != "diag" and resolve_preconditioner("auto", potential.dim) == "full")
    in_basis = kind != "scalar"
    without_replacement = subsample == "without_replacement"
    warmup = noise_warmup(potential, full, name, **warmup_options)

    if control_variates:
        check_single_plate(name, potential)

    def init(rng_key, theta, num_warmup_steps):
        state = algorithm.init(rng_key, theta, num_warmup_steps)._replace(warmup=warmup.init(theta, num_warmup_steps))
        if control_variates:
            state = state._replace(control=unset_control(theta))
        return state._replace(basis=identity_basis(theta, kind == "full")) if in_basis else state

    warmup_step = warmup_step_of(warmup)

    def end_warmup(theta, state, oracle):
        summary = warmup.final(state.warmup, theta, oracle)
        summary = summary._replace(prior_curvature=psd_part(summary.prior_curvature))
        estimated = state.warmup.noise_state.count > 0
        noise = jnp.where(estimated, sampling_noise(summary, potential.plates, without_replacement), jnp.nan)
        curvature = jnp.where(estimated, fisher_curvature(summary, potential.plates), jnp.nan)
        if control_variates:
            state, noise, curvature = _centre_and_noise(theta, state, oracle, full, without_replacement)
        if in_basis:
            basis = curvature_basis(curvature, kind == "full", potential.num_data)
            state = state._replace(basis=basis)
            noise, curvature = basis.express(noise), basis.express(curvature)
        return set_steps(state, noise, curvature)

    sample_step = step_in_basis(algorithm.sample_step) if in_basis else algorithm.sample_step
    changes = dict(init=init, warmup_step=warmup_step, end_warmup=end_warmup)
    if control_variates:
        sample_step = _with_control_variate_gradients(sample_step)
        changes["start_block"] = _start_at_the_centre
    return algorithm._replace(sample_step=sample_step, **changes)


def _centre_and_noise(theta, state, oracle, full, without_replacement):
    """The end of warmup of a control-variate kernel: (state with ``control`` set, the
    control-variate gradient's noise Q_cv, the Hessian's positive part at the centre), both (D, D)
    with ``full`` else their diagonals (see :func:`with_default_steps`)."""
    centre, passes = newton_centre(oracle, theta)
    hessian = psd_part(curvature_at(oracle, centre.position, curvature_rows(oracle)))
    # the posterior's scale at the centre (Laplace), where the noise and the non-linearity are measured
    scale = cholesky(inv(hessian)) if full else 1.0 / jnp.sqrt(jnp.diagonal(hessian))
    noise, nonlinearity = control_variate_noise(oracle, centre, scale, random.key(0), rows=curvature_rows(oracle))
    if without_replacement:  # drawn without replacement within each of the k shards (one off a mesh)
        (plate,) = oracle.plates
        rows, per = plate.size // oracle.num_shards, plate.subsample_size // oracle.num_shards
        noise = noise * ((rows - per) / max(rows - 1, 1))
    # the prior's force at the centre in posterior sds, |Lᵀ ∇U₀(θ̂)|: how far the data pushed the mode
    # against the prior along a direction the prior's curvature shares (control_variates.PRIOR_PULL_WARN)
    prior_grad = jax.grad(oracle.prior_potential)(centre.position)
    pull = jnp.max(jnp.abs(scale.T @ prior_grad if full else scale * prior_grad))
    state = state._replace(control=ControlState(centre, nonlinearity, passes, jnp.zeros((), bool), pull))
    return state, (noise if full else jnp.diagonal(noise)), (hessian if full else jnp.diagonal(hessian))


def _start_at_the_centre(theta, state):
    """Before the first sampling block, the chain moves to the centre θ̂ (the mode, where the
    control variates' noise is smallest and sampling starts in the posterior's bulk)."""
    control = state.control
    theta = jnp.where(control.moved, theta, control.centre.position)
    return theta, state._replace(control=control._replace(moved=jnp.ones((), bool)))


def _with_control_variate_gradients(step):
    """``step`` given the oracle of control-variate gradients about ``state.control.centre``."""

    def wrapped(rng_key, i, theta, state, oracle):
        return step(rng_key, i, theta, state, ControlVariateOracle(oracle, state.control.centre))

    return wrapped


# ---------------------------------------------------------------------------- the prediction at the end of warmup
class PredictedRelaxation(NamedTuple):
    """What ``SampleBlock.relaxation`` returns when it can say why the chain is slow: the
    predicted autocorrelation times and a sentence on the cause and its fix, which
    the driver's short-run warning (``checks.warn_short_run``) puts into its text (a bare array of
    times: no such sentence)."""

    #: integrated autocorrelation time of the slowest direction, SG steps, one per chain (or a scalar)
    steps: object
    #: the cause and its fix for the slowest chain (empty: none known beyond a short run)
    cause: str = ""


#: a direction whose curvature (relaxation rate) is more than this many times below the stiffest's
#: (fastest's) is named as frozen by the frozen steps: one step size cannot serve both
FROZEN_SPREAD = 100.0


def coordinate_name(view, index):
    """``'site'`` or ``'site[i, j]'``: the unconstrained coordinate of the flat θ at ``index``
    (``view``: the potential's ravel view, names, shapes and sizes in ravel order)."""
    start = 0
    for site, shape, size in zip(view.names, view.shapes, view.sizes):
        if index < start + size:
            return site if size == 1 else f"{site}[{', '.join(map(str, np.unravel_index(index - start, shape)))}]"
        start += size
    return f"coordinate {index}"


def frozen_direction_cause(spectrum, coordinates, fix, coordinate=None):
    """The sentence of :class:`PredictedRelaxation` for frozen steps whose directions relax at rates
    (curvatures, for a Langevin step) that span more than :data:`FROZEN_SPREAD` (one chain's
    :class:`~numpyro_sgd.noise.Spectrum`, as floats); "" otherwise. ``coordinates`` says where
    ("of the model's coordinates (preconditioner='scalar')"), ``coordinate`` names the one the
    slowest direction lies mostly along (None: not named), and ``fix`` what to use instead."""
    lowest, highest = spectrum.lowest, spectrum.highest
    if not (np.isfinite(lowest) and np.isfinite(highest) and lowest > 0 and highest > FROZEN_SPREAD * lowest):
        return ""
    spread = highest / lowest
    along = "" if coordinate is None else f", mostly along {coordinate},"
    return (f"The frozen steps contract the directions {coordinates} at rates that span a factor {spread:.3g} "
            f"(from the warmup's curvature): the step that keeps the fastest stable leaves the slowest{along} "
            f"nearly frozen, {spread:.3g}× slower. {fix} ")


def predicted_relaxation(steps, spectrum, coordinates, fix, view=None, more=None):
    """``SampleBlock.relaxation``'s answer from per-chain ``steps`` (NumPy): a
    :class:`PredictedRelaxation` whose cause is :func:`frozen_direction_cause` for the slowest
    chain's ``spectrum`` (a :class:`~numpyro_sgd.noise.Spectrum` of per-chain NumPy arrays; none
    when ``fix`` is None: a spread these steps do not cause), naming the coordinate of θ it lies
    along when ``view`` (the potential's ravel view) is given, followed by ``more(chain, lowest)``
    (a kernel's own sentence, or ""). All-NaN ``steps`` (no noise estimate) are returned as they are."""
    flat = np.ravel(steps)
    if np.all(np.isnan(flat)):
        return steps
    chain = int(np.nanargmax(flat))
    one = type(spectrum)(*(np.ravel(x)[chain].item() for x in spectrum))
    named = None if view is None else coordinate_name(view, one.coordinate)
    text = "" if fix is None else frozen_direction_cause(one, coordinates, fix, named)
    return PredictedRelaxation(steps, text + ("" if more is None else more(chain, one.lowest)))
