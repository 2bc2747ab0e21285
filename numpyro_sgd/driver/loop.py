"""The driver's compiled loop: one SG step of one chain with the driver's guard and accounting
(:func:`transition`), and one MCMC iteration of every chain (:func:`iteration`): a block of warmup
or sampling steps, ``end_warmup`` where warmup ends, and the algorithm's ``start_block`` /
``end_block`` around the block. :class:`~numpyro_sgd.SGKernel` builds them for its algorithm, its
potential and one call's model arguments; they hold no state of their own.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax, random

from ..model.oracle import MinibatchOracle
from ..model.sharding import DataParallelOracle
from ..protocol import CHAINS, changed_finite, count_grad_evals, finite, guard

__all__ = ["oracle_factory", "transition", "iteration"]


def oracle_factory(potential, model_args, model_kwargs, mesh=None, mesh_axis="data"):
    """``oracle(state, method, num_warmup_steps=None)``: the minibatch oracle of one chain's
    ``state`` (its step counter and shuffle key) for these model arguments, data-parallel over
    ``mesh`` when one is given."""

    def oracle(state, method, num_warmup_steps=None):
        key = random.wrap_key_data(state.shuffle_key)
        if mesh is not None:
            return DataParallelOracle(mesh, mesh_axis, potential, model_args, model_kwargs, method, state.i, key,
                                      num_warmup_steps=num_warmup_steps)
        return MinibatchOracle(potential, model_args, model_kwargs, method, state.i, key,
                               num_warmup_steps=num_warmup_steps)

    return oracle


def transition(potential, oracle, state, theta, step, num_warmup_steps, step_fn, method):
    """One SG step of one chain on the carry ``(state, theta)``: the algorithm proposes, the
    driver guards (only what changed) and accounts. ``step`` and ``num_warmup_steps`` are the
    SG step count (``state.i``) and the warmup length, passed apart so that they stay
    unbatched under the vmap over chains (the oracle carries them to the algorithm).

    A rejected step (non-finite potential or position, a constrained position outside the open
    support, e.g. σ = exp(log σ) rounded to 0.0, or a non-finite changed state) keeps the old
    position and state and is counted. Only what the step changed is checked and selected: a
    state leaf the step returns unchanged (a frozen preconditioner, the warmup state during
    sampling) is read, never re-checked or copied."""
    key, k_step = random.split(state.rng_key)
    new_theta, ks, info = step_fn(k_step, step, theta, state.kernel_state,
                                  oracle(state._replace(i=step), method, num_warmup_steps))
    ok = (jnp.isfinite(info.potential_energy) & finite(new_theta) & potential.constrained_in_support(new_theta)
          & changed_finite(ks, state.kernel_state))
    state = count_grad_evals(state, info.num_grad_evals)._replace(
        i=state.i + 1,
        potential_energy=jnp.where(ok, info.potential_energy, state.potential_energy),
        num_divergences=state.num_divergences + (~ok),
        first_divergence=jnp.where((state.first_divergence < 0) & ~ok, state.i, state.first_divergence),
        diverging=state.diverging | ~ok,
        kernel_state=guard(ok, ks, state.kernel_state),
        rng_key=key,
    )
    return state, jnp.where(ok, new_theta, theta)


def iteration(alg, potential, oracle, state, warmup, *, warmup_steps, sample_steps, subsample, warmup_subsample):
    """One MCMC iteration of every chain: ``warmup_steps`` warmup steps (the iteration that ends
    warmup freezes what it adapted, ``end_warmup``), or ``sample_steps(state)`` sampling steps,
    in one compiled loop; then the algorithm's ``end_block``. Only the phase asked for is traced.

    ``num_warmup_steps`` is a multiple of the warmup block, so a block never straddles the end of
    warmup. Inside the block the flat θ is carried (not the dict ``z``). ``oracle``: from
    :func:`oracle_factory`; ``subsample`` / ``warmup_subsample``: the minibatch laws of the phases.
    """
    view = potential.view
    vectorized = jnp.ndim(state.i) > 0
    over_chains = functools.partial(jax.vmap, axis_name=CHAINS) if vectorized else (lambda f: f)
    # every chain is at the same SG step: passing it unbatched keeps an algorithm's
    # `lax.cond` on the step (SGFS's refresh) a branch under vmap, not a select of both
    i = state.i[0] if vectorized else state.i
    w = state.num_warmup_steps[0] if vectorized else state.num_warmup_steps

    def block(step_fn, method, steps):
        def chain(s, theta):
            def body(t, carry):
                return transition(potential, oracle, *carry, i + t, w, step_fn, method)

            if isinstance(steps, int) and steps == 1:
                return body(0, (s, theta))
            return lax.fori_loop(0, steps, body, (s, theta))

        return chain

    def end_warmup(s, theta):
        return s._replace(kernel_state=alg.end_warmup(theta, s.kernel_state, oracle(s, subsample))), theta

    def end_block(s, theta, sampling):
        key, theta, ks, evals = alg.end_block(s.rng_key, theta, s.kernel_state, oracle(s, subsample), sampling)
        return count_grad_evals(s, evals)._replace(kernel_state=ks, rng_key=key), theta

    state = state._replace(diverging=jnp.zeros_like(state.diverging))
    sampling = state.i >= state.num_warmup_steps
    theta = over_chains(view.ravel)(state.z)
    if alg.start_block is not None:
        theta, ks = over_chains(alg.start_block)(theta, state.kernel_state)
        state = state._replace(kernel_state=ks)
    if warmup:
        state, theta = over_chains(block(alg.step(warmup=True), warmup_subsample, warmup_steps))(state, theta)
        if alg.end_warmup is not None:
            state, theta = lax.cond(i + warmup_steps >= w, over_chains(end_warmup), lambda *c: c, state, theta)
    else:
        state, theta = over_chains(block(alg.sample_step, subsample, sample_steps(state)))(state, theta)
    if alg.end_block is not None:
        state, theta = over_chains(end_block)(state, theta, sampling)
    return state._replace(z=over_chains(view.unravel)(theta))
