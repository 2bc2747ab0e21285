"""Epoch-wise reshuffling: step t takes positions tS … tS + S − 1 of a pseudo-random permutation
of the rows that changes every epoch, evaluated at those S positions only (no O(N) permutation is
stored). Consecutive gradients are then anticorrelated, which shrinks the stationary spread: a
warmup law only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import random

from .law import MinibatchLaw

__all__ = ["Shuffle", "shuffled_position"]

def shuffled_position(plate_key, epoch, rank, size):
    """The datum at position ``rank`` of epoch ``epoch``'s permutation."""
    return _permute(random.fold_in(plate_key, epoch), rank, size)


def _permute(key, x, n):
    """Image of ``x`` under a keyed pseudo-random permutation of ``range(n)``.

    A 4-round balanced Feistel network on 2h bits (2^(2h) < 4n) is a permutation of
    ``range(2^(2h))``; re-applying it while the value is ≥ n (cycle walking) restricts it to a
    permutation of ``range(n)``. Expected < 4 rounds of walking.
    """
    half = max(1, (max(int(n - 1).bit_length(), 1) + 1) // 2)
    mask = jnp.uint32((1 << half) - 1)
    round_keys = random.split(key, 4)

    def encrypt(v):
        left, right = v >> half, v & mask
        for r in range(4):
            f = random.bits(random.fold_in(round_keys[r], right), dtype=jnp.uint32) & mask
            left, right = right, left ^ f
        return (left << half) | right

    v = encrypt(jnp.asarray(x, jnp.uint32))
    v = jax.lax.while_loop(lambda v: v >= n, encrypt, v)
    return v.astype(jnp.int32)


class Shuffle(MinibatchLaw):
    """Positions ``step·S … step·S + S − 1`` of epoch ``(step·S) // N``'s permutation (a keyed
    Feistel permutation with cycle walking, :func:`shuffled_position`), per plate."""

    name = "shuffle"
    for_sampling = False
    needs_step = True
    on_mesh = False

    def draw(self, rng_key, plates, step=None, shuffle_key=None):
        if step is None or shuffle_key is None:
            raise ValueError("subsample='shuffle' needs the SG step and a shuffle key")
        out = {}
        for j, p in enumerate(plates):
            pos = step * p.subsample_size + jnp.arange(p.subsample_size)
            out[p.name] = jax.vmap(shuffled_position, (None, 0, 0, None))(
                random.fold_in(shuffle_key, j), pos // p.size, pos % p.size, p.size)
        return out
