"""Stochastic-gradient-within-Gibbs for hierarchical models (the pattern of NumPyro's ``HMCGibbs``).

A hyperparameter site φ (a group scale σ_α, a group mean μ_α, a horseshoe's scales) is a global
latent none of whose children is observed in a subsample plate: its only children are other
latents z (the group effects). Its full conditional then involves no data (Gelman et al.,
*Bayesian Data Analysis*, 3rd ed., Sec. 11.1 and 15.4, the Gibbs sampler for hierarchical
models):

    p(φ | z, x) ∝ p(φ) Π_j p(z_j | φ)                                     (no likelihood term)

so the scheme alternates, one chain:

    every SG step       z ← inner kernel step on Û_S(z; φ)  (φ held fixed: the inner potential
                                                               is the model with φ substituted)
    every returned      φ ~ one NUTS transition on U_φ(φ) = −log p(φ) − Σ_j log p(z_j | φ) − log|J_φ|
    sample              (Hoffman & Gelman 2014, Alg. 3; NumPyro's ``build_tree``), no data pass;
                        then the inner kernel's frozen tuning is re-derived at the new φ

The inner kernel's stationary law at fixed φ is p(z | φ, x) only when its tuning matches φ: for
constant SGD the stationary covariance Σ of θ ← θ − P(A(θ − θ*) + ξ), Cov ξ = fQ, solves
2PAΣ-type Lyapunov equations and equals A⁻¹ iff P = 2(fQ + A)⁻¹ (ConstantSGD's notes), where
A = (S/N)Q + ∇²[−log p(z | φ)] carries the prior curvature, which moves with φ (1/σ_α² for
z_j ~ N(μ_α, σ_α²)). A P frozen for one φ is *not* correct for another (its Σ is then not A⁻¹),
so after every φ update the inner ``end_warmup`` recomputes P from the warmup noise estimate Q
(which does not depend on φ: φ has no observed child, so the per-datum gradients do not involve
it) and the prior Hessian at the current (z, φ), without a data pass.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random
from numpyro import handlers
from numpyro.infer.hmc_util import build_tree, dual_averaging, euclidean_kinetic_energy, velocity_verlet
from numpyro.util import find_stack_level

from ..data.model_args import as_jax_args
from ..driver.kernel import SGKernel
from ..driver.wrapper import SGWrapper
from ..model.discovery import FlatView
from ..model.groups import (
    GROUP_SCAN_ROWS,
    GroupStructureError,
    check_one_group_per_row,
    few_enough_global,
    global_only,
    group_layout,
    plates_read_whole,
    rows_per_group,
)
from ..model.structure import centre_loc_scale, classify_sites, prior_dependencies, support_conflict
from ..protocol import SGAlgorithm

__all__ = ["SGWithinGibbs", "SGWithinGibbsState", "sg_within_gibbs"]

#: fraction of the warmup (in SG steps) after which the φ-NUTS mass matrix is frozen; the rest
#: of warmup adapts its step size only (NumPyro's final window)
MASS_FREEZE = 0.8
#: fraction of the warmup from which the φ draws are averaged into the mass matrix
MASS_WINDOW_START = 0.4
#: fraction of the warmup during which φ is held at its initial value (the inner kernel's Adam phase)
HOLD_FRACTION = 0.4
#: fewest rows of each group in a minibatch (S / groups) below which SGWithinGibbs warns: measured
#: on the OSIC-shaped model, 2.8 and 8.5 rows per group gave σ_β 0.86 and 0.50 NUTS sd off, 10
#: (random-intercept logistic) and 11.4 (OSIC at 2·10⁴ and 2·10⁵ rows) met 0.2 sd (docs/results/hierarchical.md)
MIN_ROWS_PER_GROUP = 10
#: first step size of the φ transition (in units of the adapted mass: about the conditional sd)
INITIAL_STEP_SIZE = 0.5


class SGWithinGibbsState(NamedTuple):
    """State of the :func:`sg_within_gibbs` algorithm (one chain)."""

    #: the inner algorithm's state (on the non-hyper coordinates z)
    inner: NamedTuple
    #: dual-averaging state of log ε_φ (NumPyro's ``dual_averaging``)
    step_state: tuple
    #: diagonal inverse mass of the φ-NUTS transition (identity, then the window's variance)
    inverse_mass: jnp.ndarray
    #: running mean of the φ draws over the mass window (Welford)
    draw_mean: jnp.ndarray
    #: running sum of squared deviations of the φ draws over the mass window (Welford)
    sum_squares: jnp.ndarray
    #: number of φ draws in the mass window
    draw_count: jnp.ndarray
    #: whether the mass matrix is frozen
    mass_frozen: jnp.ndarray
    #: SG warmup steps of the run (the adaptation windows are fractions of it)
    num_warmup_steps: jnp.ndarray
    #: mean acceptance statistic of the sampling-phase φ transitions
    mean_accept_prob: jnp.ndarray
    #: sampling-phase φ transitions so far
    num_hyper_updates: jnp.ndarray
    #: φ transitions whose trajectory diverged (energy error > 1000) or whose proposal was non-finite
    #: or outside the support (φ kept)
    num_hyper_divergences: jnp.ndarray


def _group_sites(potential, hyper_names, model_args, model_kwargs, deps):
    """``{site: G}`` for the group latents: children of a hyper site that lie in plates of G
    elements outside the subsample plates (one trace of the model)."""
    subsampled = {p.name for p in potential.plates}
    args, kwargs = as_jax_args((model_args, model_kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = handlers.trace(handlers.seed(potential.model, 0)).get_trace(*args, **kwargs)
    out = {}
    for site in potential.view.names:
        if site in hyper_names or not set(deps.get(site, {})) & set(hyper_names):
            continue
        frames = [f for f in tr[site]["cond_indep_stack"] if f.name not in subsampled]
        if frames:
            out[site] = int(np.prod([f.size for f in frames]))
    return out


def _sparse_groups(groups, potential):
    """``[(site, G)]`` of the group latents ``groups`` (:func:`_group_sites`) with G > S /
    MIN_ROWS_PER_GROUP: with each row in one group, a minibatch of S rows holds about S/G rows
    of each group."""
    rows = min(p.subsample_size for p in potential.plates)
    return [(site, g) for site, g in groups.items() if rows < MIN_ROWS_PER_GROUP * g]


def _sparse_group_message(potential, sites, model_args, model_kwargs):
    """A warning text naming the elements of the group latents ``sites`` with no rows, or with
    fewer than ``MIN_ROWS_PER_GROUP`` rows per minibatch (counted per group by
    :func:`rows_per_group`), or None."""
    counts, exact = rows_per_group(potential, sites, model_args, model_kwargs)
    (plate,) = potential.plates if len(potential.plates) == 1 else (None,)
    for site, per_batch in counts.items():
        flat = per_batch.reshape(-1)
        empty = np.flatnonzero(flat == 0)
        few = np.flatnonzero((flat > 0) & (flat < MIN_ROWS_PER_GROUP))
        if not empty.size and not few.size:
            continue

        def element(j):
            return f"{site}[{', '.join(map(str, np.unravel_index(j, per_batch.shape)))}]"

        def names(ix):
            return ", ".join(map(element, ix[:5])) + (f" and {ix.size - 5} more" if ix.size > 5 else "")

        parts = []
        if empty.size:
            where = "in the data" if exact else f"among {min(plate.size, GROUP_SCAN_ROWS):,} rows sampled from the data"
            parts.append(
                f"{names(empty)} {'has' if empty.size == 1 else 'have'} no row {where}: no data reads "
                f"{'it' if empty.size == 1 else 'them'}, so {'its' if empty.size == 1 else 'their'} gradient has no "
                "minibatch noise and the constant-rate inner kernel collapses its spread (measured: a group with "
                "no rows came out with 0.15× NUTS's sd, and τ 0.23 sd off). Drop such groups from the model (their "
                "draws would be the prior given the hyperparameters), or use NUTS")
        if few.size:
            j = few[np.argmin(flat[few])]
            parts.append(
                f"{names(few)} {'has' if few.size == 1 else 'have'} fewer than {MIN_ROWS_PER_GROUP} rows per minibatch "
                f"of S = {plate.subsample_size} (fewest: {element(j)}, {flat[j]:.2g}): below about "
                f"{MIN_ROWS_PER_GROUP} the group's gradient noise is far from Gaussian "
                "and its draws' sd come out wrong (measured on the OSIC-shaped model: 2.8 rows per group gave group "
                "sds up to 20× NUTS's). Raise subsample_size to at least "
                f"{int(np.ceil(plate.subsample_size * MIN_ROWS_PER_GROUP / flat[j]))}, or use NUTS")
        return f"SGWithinGibbs: the group latent '{site}': " + "; ".join(parts) + "."
    return None


def _resolve_hyper_sites(requested, potential, model_args, model_kwargs, name, deps=None):
    """The hyper sites to use: the requested ones, validated, or the detected candidates."""
    candidates, parents = classify_sites(potential, model_args, model_kwargs, deps)
    latent = potential.view.names
    if requested is None:
        if not candidates:
            raise ValueError(
                f"{name}: the model has no hyperparameter site (a global latent whose only children are other "
                f"latents; every latent of {list(latent)} is a parent of observed data). A model non-centred "
                "by hand (α = μ + σ·α_raw) puts μ and σ into the likelihood; write the group effects centred "
                "(α ~ Normal(μ, σ)), or as NumPyro's LocScaleReparam(0) (which SGWithinGibbs samples centred), "
                "or run the inner kernel alone."
            )
        chosen = candidates
    else:
        chosen = sorted(set(requested))
        unknown = [s for s in chosen if s not in latent]
        if unknown:
            raise ValueError(
                f"{name}: hyper_sites names {unknown}, which are not latent sample sites of the model (those are "
                f"{list(latent)}); pass some of the detected candidates {candidates} or hyper_sites=None."
            )
        with_data = [s for s in chosen if s in parents]
        if with_data:
            s = with_data[0]
            raise ValueError(
                f"{name}: hyper site '{s}' is a parent of the observed site '{parents[s]}' in a subsample plate, so "
                f"its conditional law needs the data; leave it out of hyper_sites (the inner kernel samples it) "
                f"or use the detected candidates {candidates}."
            )
    if len(chosen) == len(latent):
        raise ValueError(f"{name}: every latent site is a hyper site; at least one must be left to the SG kernel.")
    return tuple(chosen)


def _split_indices(view, hyper_names):
    """Index arrays of the hyper and of the other coordinates of the flat θ, and the hyper view."""
    offsets = np.cumsum((0,) + view.sizes)
    hyper_idx, z_idx, shapes = [], [], dict(zip(view.names, view.shapes))
    for k, n in enumerate(view.names):
        (hyper_idx if n in hyper_names else z_idx).extend(range(offsets[k], offsets[k + 1]))
    hyper_view = FlatView({n: np.zeros(shapes[n]) for n in hyper_names})
    return np.asarray(hyper_idx, np.int32), np.asarray(z_idx, np.int32), hyper_view


def z_sites(potential, hyper_names):
    """The latent sites the inner kernel samples: all but the hyper sites."""
    return tuple(n for n in potential.view.names if n not in set(hyper_names))


def sg_within_gibbs(inner, potential, *, hyper_names, target_accept_prob=0.8, max_tree_depth=8,
                    burn_in=False):
    """SG-within-Gibbs around ``inner`` (see the module docstring): the inner algorithm's steps
    move the non-hyper coordinates z with the hyper sites φ substituted at their current values,
    and one NUTS transition on φ's full conditional follows every block of SG steps (every
    returned sample and every warmup iteration).

    The inner algorithm samples ``potential.restricted(z sites)`` and asks the driver's oracle
    for its variant on it (``MinibatchOracle.conditioned``), so a
    data-parallel oracle (``mesh=``) stays data-parallel.

    :param inner: ``potential -> SGAlgorithm``, the wrapped kernel's build
        (:meth:`~numpyro_sgd.SGWrapper.inner_algorithm`).
    :param potential: the full model's :class:`~numpyro_sgd.model.potential.SubsampledPotential`.
    :param tuple hyper_names: the hyper sites (validated by the caller).
    :param bool burn_in: whether warmup may run as sampling iterations when the inner algorithm's
        warmup is burn-in (:attr:`~numpyro_sgd.SGAlgorithm.burn_in`): φ's NUTS adapts all the same,
        told the phase by ``end_block``'s ``sampling``; then NumPyro compiles one program for warmup
        and sampling. False keeps a warmup program of its own.
    :return: :class:`~numpyro_sgd.SGAlgorithm` with state :class:`SGWithinGibbsState`.
    """
    hyper_idx, z_idx, hyper_view = _split_indices(potential.view, set(hyper_names))
    z_potential = potential.restricted(z_sites(potential, hyper_names))
    algorithm = inner(z_potential)
    da_init, da_update = dual_averaging()

    def start_step_size(step_size):
        """Dual-averaging state that starts at ``step_size`` with NumPyro's prox centre log(10 ε)."""
        _, _, g_avg, t, center = da_init(jnp.log(10.0 * step_size))
        log_step = jnp.log(step_size)
        return log_step, log_step, g_avg, t, center

    def conditioned(oracle, theta):
        """The oracle of the z-potential with φ substituted (constrained) at its value in θ."""
        u = hyper_view.unravel(theta[hyper_idx])
        return oracle.conditioned(z_potential, {k: potential.transforms[k](v) for k, v in u.items()})

    def hyper_potential(theta, oracle):
        """U_φ(φ) at fixed z: the full potential without its likelihood (no data)."""
        def pe(phi):
            return oracle.prior_potential(theta.at[hyper_idx].set(phi))
        return pe

    def init(rng_key, theta, num_warmup_steps):
        d, dtype = hyper_idx.shape[0], theta.dtype
        step_state = start_step_size(jnp.asarray(INITIAL_STEP_SIZE, dtype))
        zero = jnp.zeros((), jnp.int32)
        return SGWithinGibbsState(
            inner=algorithm.init(rng_key, theta[z_idx], num_warmup_steps), step_state=step_state,
            inverse_mass=jnp.ones(d, dtype), draw_mean=jnp.zeros(d, dtype), sum_squares=jnp.zeros(d, dtype),
            draw_count=zero,
            mass_frozen=jnp.array(False), num_warmup_steps=jnp.asarray(num_warmup_steps, jnp.int32),
            mean_accept_prob=jnp.zeros((), dtype), num_hyper_updates=zero, num_hyper_divergences=zero)

    def inner_step(step_fn):
        def step(rng_key, i, theta, state, oracle):
            z, inner_state, info = step_fn(rng_key, i, theta[z_idx], state.inner, conditioned(oracle, theta))
            return theta.at[z_idx].set(z), state._replace(inner=inner_state), info
        return step

    def adapt_mass(state, phi, progress):
        """Warmup: Welford's variance of the φ draws over the window [0.4, 0.8) of warmup
        (regularised towards 10⁻³ as NumPyro's ``warmup_adapter`` does), then frozen as the
        inverse mass; identity before it."""
        in_window = (progress >= MASS_WINDOW_START) & ~state.mass_frozen
        count = state.draw_count + in_window
        delta = phi - state.draw_mean
        mean = jnp.where(in_window, state.draw_mean + delta / jnp.maximum(count, 1), state.draw_mean)
        m2 = jnp.where(in_window, state.sum_squares + delta * (phi - mean), state.sum_squares)
        freeze = (progress >= MASS_FREEZE) & ~state.mass_frozen
        n = count.astype(phi.dtype)
        variance = m2 / jnp.maximum(n - 1.0, 1.0)
        regularised = (n / (n + 5.0)) * variance + 1e-3 * (5.0 / (n + 5.0))
        usable = freeze & (count >= 5) & jnp.all(jnp.isfinite(regularised)) & jnp.all(regularised > 0)
        inverse_mass = jnp.where(usable, jnp.where(usable, regularised, 1.0), state.inverse_mass)
        # NumPyro restarts dual averaging when the mass changes
        step_state = jax.tree.map(lambda new, old: jnp.where(freeze, new, old),
                                  start_step_size(jnp.exp(state.step_state[0])), state.step_state)
        return state._replace(inverse_mass=inverse_mass, draw_mean=mean, sum_squares=m2, draw_count=count,
                              mass_frozen=state.mass_frozen | freeze, step_state=step_state)

    def hyper_update(rng_key, theta, state, oracle, sampling):
        """One NUTS transition of φ from p(φ | z) (Hoffman & Gelman Alg. 3), adapted in warmup."""
        phi = theta[hyper_idx]
        pe = hyper_potential(theta, oracle)
        progress = oracle.step / jnp.maximum(state.num_warmup_steps, 1)
        state = jax.tree.map(lambda new, old: jnp.where(sampling, old, new), adapt_mass(state, phi, progress), state)
        log_step = jnp.where(sampling, state.step_state[1], state.step_state[0])  # x̄ (frozen) or x_t
        k_r, k_tree = random.split(rng_key)
        r = random.normal(k_r, phi.shape, phi.dtype) / jnp.sqrt(state.inverse_mass)
        vv_init, vv_update = velocity_verlet(pe, euclidean_kinetic_energy)
        tree = build_tree(vv_update, euclidean_kinetic_energy, vv_init(phi, r), state.inverse_mass, jnp.exp(log_step),
                          k_tree, max_tree_depth=max_tree_depth)
        accept = tree.sum_accept_probs / jnp.maximum(tree.num_proposals, 1)
        new_phi = tree.z_proposal
        u = hyper_view.unravel(new_phi)
        ok = (jnp.all(jnp.isfinite(new_phi)) & jnp.isfinite(tree.z_proposal_pe)
              & jnp.all(jnp.stack([jnp.all(jnp.isfinite(potential.transforms[k](v))) for k, v in u.items()])))
        # φ is held during the first part of warmup, while the inner warmup moves z from its initial
        # point towards the data: a φ drawn given a z that has not moved yet (all z_j alike) is a
        # collapsed group scale, which then pins z (measured on the OSIC-shaped example)
        move = ok & (sampling | (progress >= HOLD_FRACTION))
        theta = theta.at[hyper_idx].set(jnp.where(move, new_phi, phi))
        adapted = da_update(target_accept_prob - accept, state.step_state)
        n = state.num_hyper_updates + sampling
        state = state._replace(
            step_state=jax.tree.map(lambda new, old: jnp.where(sampling, old, new), adapted, state.step_state),
            mean_accept_prob=jnp.where(sampling, state.mean_accept_prob + (accept - state.mean_accept_prob)
                                       / jnp.maximum(n, 1), state.mean_accept_prob),
            num_hyper_updates=n,
            num_hyper_divergences=state.num_hyper_divergences + (sampling & (tree.diverging | ~ok)))
        return theta, state

    end_warmup = None
    if algorithm.end_warmup is not None:
        def end_warmup(theta, state, oracle):
            return state._replace(inner=algorithm.end_warmup(theta[z_idx], state.inner, conditioned(oracle, theta)))

    def end_block(rng_key, theta, state, oracle, sampling):
        rng_key, k_hyper = random.split(rng_key)
        theta, state = hyper_update(k_hyper, theta, state, oracle, sampling)
        if end_warmup is not None:
            # the inner tuning is frozen once warmup has ended: re-derive it at the new φ (its
            # prior curvature; the noise estimate is kept, no data pass)
            frozen = oracle.step >= state.num_warmup_steps
            state = lax.cond(frozen, lambda s: end_warmup(theta, s, oracle), lambda s: s, state)
        return rng_key, theta, state, 0

    def describe(state):
        text = algorithm.describe(state.inner) if algorithm.describe is not None else ""
        n = int(state.num_hyper_updates)
        hyper = (f"φ-NUTS ε {float(jnp.exp(state.step_state[1])):.3g}, accept {float(state.mean_accept_prob):.2f}"
                 if n else "φ-NUTS adapting")
        div = int(state.num_hyper_divergences)
        hyper += f", {div} φ divergences" if div else ""
        return f"{text}, {hyper}" if text else hyper

    # a warmup step of its own even when the inner warmup is burn-in, unless asked (burn_in)
    warmup_step = None if burn_in and algorithm.burn_in else inner_step(algorithm.step(warmup=True))
    return SGAlgorithm(init, inner_step(algorithm.sample_step), warmup_step=warmup_step,
                       end_warmup=end_warmup, block=algorithm.block.through(lambda s: s.inner),
                       end_block=end_block, describe=describe)


class SGWithinGibbs(SGWrapper):
    """Stochastic gradients for the data-dependent latents, exact NUTS for the hyperparameters.

    **References:**

    1. *Bayesian Data Analysis*, A. Gelman et al., 3rd ed. (2013): Sec. 11.1 (Gibbs sampler),
       Sec. 15.4 (hierarchical linear models: the hyperparameters' conditional given the group
       effects does not involve the data).
    2. *The No-U-Turn Sampler*, M. D. Hoffman, A. Gelman, JMLR 15 (2014): Alg. 3 (the φ transition),
       Alg. 5 / Sec. 3.2 (dual averaging of its step size).
    3. *Stochastic Gradient Descent as Approximate Bayesian Inference*, S. Mandt, M. D. Hoffman,
       D. M. Blei, JMLR 18 (2017): the inner ConstantSGD (Eq. 15, 20).

    ==========================  ==================================================================
    scheme                      here
    ==========================  ==================================================================
    φ (hyperparameters)         ``hyper_sites`` (default: :func:`hyper_candidates`, the global
                                latents with no observed child in a subsample plate)
    z | φ, x  (SG step)         the wrapped ``kernel`` on the model with φ substituted
    φ | z     (exact step)      one NUTS transition on U_φ = −log p(φ) − Σ log p(z | φ) − log|J|
                                after every block of ``steps_per_sample`` SG steps (every returned
                                sample; every warmup iteration)
    ==========================  ==================================================================

    Runs as ``MCMC(SGWithinGibbs(ConstantSGD(model)), num_warmup=..., num_samples=...)``; the
    samples hold every latent site, φ included. ``steps_per_sample`` (the SG steps between two φ
    updates) defaults to the inner kernel's relaxation time (one data pass for ConstantSGD), the
    time z needs to forget where it was: updating φ more often moves it given nearly the same z.

    .. note:: **Why the inner kernel stays correct as φ moves.** ConstantSGD's stationary
       covariance equals the posterior's only for P = 2 (fQ + A)⁻¹, and A contains the prior
       curvature of z, which depends on φ (1/σ² for z ~ N(μ, σ²)); a preconditioner frozen at one
       φ is biased at another. After each φ update of the sampling phase the inner kernel's
       ``end_warmup`` is re-run at the new φ: the warmup noise estimate Q is kept (it does not
       depend on φ, which has no observed child) and the prior Hessian is re-taken, so no data
       pass is made. Kernels without frozen tuning (SGLD with a given step) need nothing.

    .. note:: **Adaptation of the φ transition.** During warmup the NUTS step size follows
       NumPyro's dual averaging (target ``target_accept_prob``) and the diagonal inverse mass
       matrix is the (regularised) variance of the φ draws over 40–80 % of warmup, then frozen,
       after which dual averaging restarts; the step size of the sampling phase is the dual
       average. φ also moves during warmup, so the inner kernel's
       warmup (its noise estimate, its mode search) happens at plausible hyperparameters.

    .. note:: **Data passes.** The φ transition touches no data; ``data_passes`` counts the
       inner kernel's minibatch gradients only.

    .. note:: **Non-centred models.** A site under NumPyro's ``LocScaleReparam(c)`` is sampled in
       its centred form (:class:`centre_loc_scale`): in the decentred form x̃ the group mean and
       scale are parents of the data, in the centred form they are hyper sites. The posterior of
       the model's quantities is the same; the draws hold x and its decentred value
       ``"{x}_decentered"`` (a deterministic site here, a sample site under NUTS). With many rows
       per group the centred form is also the better-conditioned one (Papaspiliopoulos, Roberts &
       Sköld 2007). The ``reparam`` handler must wrap the model
       (``numpyro.handlers.reparam(model, config=...)``); a ``with`` block inside the model is
       refused with that fix. A model non-centred by hand (``α = μ + σ α_raw`` inside the
       likelihood) has no hyper site and is refused: write it centred or with ``LocScaleReparam``.

    .. warning:: Each group needs about ``MIN_ROWS_PER_GROUP`` = 10 rows in a minibatch (S ≥ 10 ×
       the number of groups): with fewer, its gradient noise is far from Gaussian and the group sds
       come out inflated; the kernel warns at init. Put the outcome on unit scale: latents that
       start far from the data pin the hyperparameters (``check_run`` reports it). Kernels whose
       draws are not iterates (IASG) are refused, and so is a site whose support depends on a hyper
       site, or a hyper site whose support depends on any latent (``b ~ Uniform(0, a)`` with ``a`` a
       hyper site: write ``b = a * u``, ``u ~ Uniform(0, 1)``).

    :param SGKernel kernel: a kernel of this package built on the model (ConstantSGD, SGFS, SGLD,
        SGHMC, ...); only its public ``build`` and ``driver_options`` are used.
    :param hyper_sites: site name(s) to update by NUTS (default None: the detected candidates).
    :param float target_accept_prob: dual-averaging target of the φ transition (default 0.8).
    :param int max_tree_depth: NUTS tree depth limit of the φ transition (default 8: ≤ 255
        leapfrog steps on the cheap, data-free U_φ).
    :param kwargs: :class:`~numpyro_sgd.driver.kernel.SGKernel` options overriding the inner kernel's.

    .. doctest::

        >>> import jax, numpy as np, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from numpyro_sgd import ConstantSGD, SGWithinGibbs
        >>> g = np.repeat(np.arange(8), 250)
        >>> y = np.random.default_rng(0).normal(np.linspace(-2, 2, 8)[g], 1.0)
        >>> def model(g, y):
        ...     tau = numpyro.sample("tau", dist.HalfNormal(3.0))
        ...     with numpyro.plate("groups", 8):
        ...         z = numpyro.sample("z", dist.Normal(0.0, tau))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=100) as idx:
        ...         numpyro.sample("y", dist.Normal(z[g[idx]], 1.0), obs=y[idx])
        >>> mcmc = MCMC(SGWithinGibbs(ConstantSGD(model)), num_warmup=200, num_samples=300, progress_bar=False)
        >>> mcmc.run(jax.random.key(0), g, y)
        >>> bool(0.7 < float(mcmc.get_samples()["tau"].mean()) < 2.5)
        True
    """

    def __init__(self, kernel, *, hyper_sites=None, target_accept_prob=0.8, max_tree_depth=8, **kwargs):
        # LocScaleReparam sites are sampled centred (their scale and mean become hyper sites)
        model = centre_loc_scale(kernel.subsampled_model) if isinstance(kernel, SGKernel) else None
        super().__init__(kernel, model=model, **kwargs)
        # SGLD(control_variates=True): the control variates for group latents (kernels/group_sgld.py)
        if kernel.control_variates and not hasattr(kernel, "group_algorithm"):
            raise ValueError(
                f"SGWithinGibbs: {type(kernel).__name__}(control_variates=True) has no control variates for group "
                "latents; use SGWithinGibbs(SGLD(model, control_variates=True)), the large-N route for random-effects "
                f"models, or {type(kernel).__name__} with control_variates=False.")
        self._group_algorithm = kernel.group_algorithm("SGWithinGibbs") if kernel.control_variates else None
        self._group_layout = self._prior_cross = None
        if isinstance(hyper_sites, str):
            hyper_sites = (hyper_sites,)
        if hyper_sites is not None and (not isinstance(hyper_sites, (list, tuple, set, frozenset))
                                        or not hyper_sites or not all(isinstance(s, str) for s in hyper_sites)):
            raise TypeError(
                f"SGWithinGibbs: hyper_sites must be None (detect them), a site name or a non-empty list of site "
                f"names, got {hyper_sites!r}."
            )
        if not 0 < target_accept_prob < 1:
            raise ValueError(f"SGWithinGibbs: target_accept_prob must lie in (0, 1), got {target_accept_prob!r}.")
        if isinstance(max_tree_depth, bool) or not isinstance(max_tree_depth, (int, np.integer)) or not (
                1 <= max_tree_depth <= 15):
            raise ValueError(f"SGWithinGibbs: max_tree_depth must be an integer in [1, 15], got {max_tree_depth!r}.")
        self._hyper_option = None if hyper_sites is None else tuple(hyper_sites)
        self._nuts_options = dict(target_accept_prob=float(target_accept_prob), max_tree_depth=int(max_tree_depth))
        self._hyper_names = None
        self._setup_args = None
        self._z_potential = None
        self._group_warning = None

    @property
    def hyper_sites(self):
        """The hyper sites in use (known after ``init``)."""
        return self._traced(self._hyper_names)

    @property
    def group_warning(self):
        """The warning ``init`` gave about groups with no rows, or too few rows per minibatch
        (None if every group had enough); :func:`~numpyro_sgd.check_run` repeats its cause."""
        return getattr(self, "_group_warning", None)  # kernels pickled before it existed

    @property
    def z_potential(self):
        """The :class:`~numpyro_sgd.model.potential.SubsampledPotential` the inner kernel samples (the
        non-hyper sites; the hyper sites are substituted)."""
        self._get_algorithm()
        if self._z_potential is None:
            self._z_potential = self.potential.restricted(z_sites(self.potential, self._hyper_names))
        return self._z_potential

    def _setup(self, rng_key, model_args, model_kwargs):
        # the hyper sites are resolved from the model's dependency structure, which needs the model
        # arguments: _build (called by the base setup) reads them from here
        self._setup_args, self._hyper_names = (model_args, model_kwargs), None
        try:
            return super()._setup(rng_key, model_args, model_kwargs)
        finally:
            self._setup_args = None

    def _build(self, potential, adapt_steps_per_sample=True):
        if self._hyper_names is None:
            model_args, model_kwargs = self._setup_args if self._setup_args is not None else self._run_args
            # the model's structure and the group counts (a gradient per row), once per data
            self._hyper_names, self._group_warning = self._once_per_data(
                "model structure", model_args, model_kwargs, potential.plates,
                lambda: self._find_structure(potential, model_args, model_kwargs))
            if self._group_warning is not None:
                warnings.warn(self._group_warning, UserWarning, stacklevel=find_stack_level())
        self._z_potential = None
        inner = self.inner_algorithm
        if self._group_algorithm is not None:
            def inner(z_potential, layout=self._group_layout, prior_cross=self._prior_cross):
                return self._group_algorithm(z_potential, layout, prior_cross=prior_cross)
        # the group route's warmup is its sampling step (the centre found when due): one program
        algorithm = sg_within_gibbs(inner, potential, hyper_names=self._hyper_names,
                                    burn_in=self._group_algorithm is not None, **self._nuts_options)
        if algorithm.block.summarises:
            raise ValueError(
                f"SGWithinGibbs: {type(self._inner).__name__}'s returned draws are averages of its iterates, not "
                "draws of z given φ, so φ cannot be updated from them; wrap ConstantSGD, SGFS, SGLD or SGHMC."
            )
        return algorithm

    def _find_structure(self, potential, model_args, model_kwargs):
        """``(hyper sites, warning)``: the hyper sites (``hyper_sites`` or the model's dependency
        structure) and the warning about groups with too few rows per minibatch, or None."""
        deps = prior_dependencies(potential.model, model_args, model_kwargs)
        hyper = _resolve_hyper_sites(self._hyper_option, potential, model_args, model_kwargs, "SGWithinGibbs", deps)
        conflict = support_conflict(potential, hyper, model_args, model_kwargs)
        if conflict is not None:
            raise ValueError(f"SGWithinGibbs: {conflict}")
        if self._group_algorithm is not None:
            self._group_layout, self._prior_cross = self._group_structure(potential, hyper, model_args, model_kwargs)
            return hyper, None  # every group moves with the centre's curvature: no rows-per-group rule
        groups = _group_sites(potential, hyper, model_args, model_kwargs, deps)
        sparse = _sparse_groups(groups, potential)
        if sparse:
            site, groups = sparse[0]
            rows = min(p.subsample_size for p in potential.plates)
            return hyper, (
                f"SGWithinGibbs: the group latent '{site}' has {groups} groups and a minibatch holds S = {rows} "
                f"rows, about {rows / groups:.2g} rows of each group (if each row belongs to one group). Below "
                f"about {MIN_ROWS_PER_GROUP} rows per group per minibatch the group latents' gradient noise is far "
                "from Gaussian and the draws of their sds come out inflated (measured on the OSIC-shaped model: "
                "2.8 rows per group gave group sds up to 20× NUTS's; 11 gave all within 0.15 sd). Raise "
                f"subsample_size to at least {MIN_ROWS_PER_GROUP * groups}, or use NUTS.")
        # the average is enough: count each group's rows
        return hyper, _sparse_group_message(potential, list(groups), model_args, model_kwargs)

    def _group_structure(self, potential, hyper, model_args, model_kwargs):
        """The :class:`~numpyro_sgd.numerics.arrowhead.GroupLayout` of the non-hyper sites, checked on the rows,
        and whether their prior couples the global and the group coordinates
        (:func:`~numpyro_sgd.model.groups.check_one_group_per_row`)."""
        name = "SGWithinGibbs(SGLD(control_variates=True))"
        if self._driver.mesh is not None:
            raise ValueError(f"{name}: mesh= is not supported yet with the control variates for group latents "
                             "(their centre's pass is not reduced across devices); run on one device.")
        z_potential = potential.restricted(z_sites(potential, hyper))
        sites = group_layout(z_potential, model_args, model_kwargs, name)
        if sites is None:  # no group plate: every latent is global (a flat regression under a learned prior scale)
            sites = few_enough_global(global_only(z_potential), name, "the model has no group plate")
        # a point drawn as init_to_uniform draws one (uniform on [-2, 2] in every unconstrained
        # coordinate), from NumPy: tracing the model for it compiled a program of its own (0.6–0.9 s)
        theta = jnp.asarray(np.random.default_rng(0).uniform(-2.0, 2.0, potential.dim), jnp.result_type(float))
        hyper_idx, z_idx, hyper_view = _split_indices(potential.view, set(hyper))
        params = {k: potential.transforms[k](v) for k, v in hyper_view.unravel(theta[hyper_idx]).items()}
        try:
            prior_cross = check_one_group_per_row(z_potential, sites, theta[z_idx], model_args, model_kwargs, params,
                                                  name)
        except GroupStructureError:
            # a plate of coefficients that every row reads (a shrinkage regression's β): global coordinates
            whole = plates_read_whole(potential, sites, model_args, model_kwargs) if sites.num_groups else ()
            if not whole:
                raise
            sites = group_layout(z_potential, model_args, model_kwargs, name, read_whole=whole)
            sites = few_enough_global(sites, name, f"every row reads the whole of plate '{whole[0]}'")
            prior_cross = check_one_group_per_row(z_potential, sites, theta[z_idx], model_args, model_kwargs, params,
                                                  name)
        return sites.layout, prior_cross
