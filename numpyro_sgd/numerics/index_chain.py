"""The index chain of EWSG: a Metropolis chain over minibatches (Li, Wang, Zha & Tao, Sec. 4, Eq. 4
and 6, Alg. 1, App. D).

Given the current point, a step of an EWSG sampler chooses its minibatch B by M Metropolis steps
with uniform proposals that target

    p_B ∝ exp(½‖x + n a_B‖²)                                                         (Eq. 4)

(``n a_B`` = scale · ∇Û_B, NumPyro's N/S-scaled minibatch gradient; x one of the choices of
Fig. 1b, :data:`X_ESTIMATES`), and accepts a proposal B' with probability
min(1, p_B' / p_B) (Eq. 6). :func:`select_minibatch` is that choice as the kernels take it: the
first minibatch is drawn with ``split(rng_key)[0]`` (the key of the uniform minibatch of
SGLD/SGHMC), the chain's keys come from ``fold_in(rng_key, _INDEX_CHAIN_STREAM)``, so M = 0 is the
uniform-minibatch sampler number for number.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax, random

__all__ = ["X_ESTIMATES", "index_chain", "index_acceptance_rate", "select_minibatch", "count_index_moves"]

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


#: The choices of x of the paper's Fig. 1b, by name: ``(momentum, drift, step_size, noise_scale) -> x``.
#: ``drift`` is γ r_k (Γ r_k for EWSG-VR), ``noise_scale`` is σ. The overdamped variant has no
#: momentum and supports ``"zero"`` only.
X_ESTIMATES = {"momentum": _x_momentum, "zero": _x_zero, "one": _x_one, "stop": _x_stop}


# ---------------------------------------------------------------------------- the chain
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


def select_minibatch(rng_key, propose, num_index_steps, x_of, scale):
    """The minibatch of one EWSG step: B ← uniform, then M index-chain steps (Alg. 1, App. D).

    :param rng_key: key of the SG step. The first minibatch is drawn with ``split(rng_key)[0]``
        (as SGLD and SGHMC draw theirs); the chain uses ``fold_in(rng_key, _INDEX_CHAIN_STREAM)``.
    :param propose: ``key -> (Û_B, ∇Û_B, ...)`` for a uniformly drawn minibatch B; the extra
        entries (indices, per-example gradients) are carried with it.
    :param int num_index_steps: M ≥ 0 (static); 0 returns the uniform minibatch.
    :param x_of: ``() -> x``, called only when M > 0.
    :param scale: the factor with ``scale · ∇Û_B = n a_B``, so log p_B = ½‖x + scale · ∇Û_B‖² (Eq. 4).
    :return: ``(the accepted proposal's tuple, number of accepted moves)``.
    """
    current = propose(random.split(rng_key)[0])                           # B ← uniform, ∇Û_B(θ_k)
    if num_index_steps == 0:
        return current, jnp.zeros((), jnp.int32)
    x = x_of()

    def log_weight(c):
        return 0.5 * jnp.sum((x + scale * c[1]) ** 2)

    return index_chain(random.fold_in(rng_key, _INDEX_CHAIN_STREAM), current, propose, log_weight,
                       num_index_steps)                                   # Eq. 6, M times


def count_index_moves(state, accepted, num_index_steps):
    """``state`` with the running index-chain counts advanced by one SG step (M proposals)."""
    return state._replace(num_index_accepted=state.num_index_accepted + accepted,
                          num_index_proposed=state.num_index_proposed + num_index_steps)


def index_acceptance_rate(state):
    """Acceptance rate of the index chain so far: accepted / proposed index moves.

    :param state: an :class:`~numpyro_sgd.SGState` (e.g. ``mcmc.last_state``) or the kernel
        state of :class:`~numpyro_sgd.EWSG`, :class:`~numpyro_sgd.OverdampedEWSG` or
        :class:`~numpyro_sgd.EWSGVR` (any leading chain dimensions are kept).
    :return: array of rates (NaN where nothing was proposed, e.g. ``num_index_steps=0``).
    """
    ks = getattr(state, "kernel_state", state)
    proposed = jnp.asarray(ks.num_index_proposed)
    return jnp.where(proposed > 0, ks.num_index_accepted / jnp.maximum(proposed, 1), jnp.nan)


def describe_index_chain(state):
    """Progress-bar text: the index chain's acceptance rate ("" while nothing was proposed)."""
    rate = float(index_acceptance_rate(state))
    return "" if rate != rate else f"index acceptance {rate:.2f}"
