"""A uniformly random S-subset of the rows every step (sampling without replacement): its
minibatch gradient has the finite-population covariance factor (N − S)/(N − 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import random

from .law import MinibatchLaw

__all__ = ["WithoutReplacement", "subset_without_replacement"]

def subset_without_replacement(rng_key, size, subsample_size):
    """A uniformly random ``subsample_size``-subset of ``range(size)`` (sorted) in O(S log S).

    Duplicates of S i.i.d. draws are redrawn until there are none (about S²/(2N) redraws). For
    S > N/8 the redraw rounds grow (about N/(N − S) of them as S nears N), so the first S of a
    uniformly random permutation (``jax.random.permutation``, O(N log N) = O(S log N)) are taken.
    """
    if 8 * subsample_size > size:
        return jnp.sort(random.permutation(rng_key, size)[:subsample_size]).astype(jnp.int32)
    key, sub = random.split(rng_key)
    idx = jnp.sort(random.randint(sub, (subsample_size,), 0, size))

    def duplicated(i):
        return jnp.concatenate([jnp.zeros(1, bool), i[1:] == i[:-1]])

    def cond(carry):
        return jnp.any(duplicated(carry[1]))

    def body(carry):
        key, i = carry
        key, sub = random.split(key)
        fresh = random.randint(sub, i.shape, 0, size)
        return key, jnp.sort(jnp.where(duplicated(i), fresh, i))

    return jax.lax.while_loop(cond, body, (key, idx))[1]


class WithoutReplacement(MinibatchLaw):
    """A fresh uniformly random S-subset of every plate each step (each plate its own split of the
    step's key, :func:`subset_without_replacement`)."""

    name = "without_replacement"

    def draw(self, rng_key, plates, step=None, shuffle_key=None):
        keys = random.split(rng_key, len(plates))
        return {p.name: subset_without_replacement(key, p.size, p.subsample_size) for key, p in zip(keys, plates)}

    def draw_shard(self, rng_key, rows, size, cluster_size=1):
        return subset_without_replacement(rng_key, rows, size)

    def noise_factor(self, num_rows, size):
        return (num_rows - size) / max(num_rows - 1, 1)
