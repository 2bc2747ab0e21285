"""Rows drawn i.i.d. uniformly with replacement, one at a time or as clusters of consecutive
rows (the default law): counter-based hash draws that XLA computes once per step.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax, random

from .law import MinibatchLaw

__all__ = ["WithReplacement", "uniform_indices", "cluster_indices"]

_GOLDEN = 0x9E3779B9  # ⌊2³² / φ⌋: spreads consecutive counters over the 32-bit words


def _fmix32(x):
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 in which every input bit flips each
    output bit with probability close to ½ (two xor-shift-multiply rounds)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def _mul_wide(a, b):
    """(high, low) 32-bit words of the 64-bit product a·b of uint32 arrays (16-bit limbs)."""
    mask = jnp.uint32(0xFFFF)
    a0, a1, b0, b1 = a & mask, a >> 16, b & mask, b >> 16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> 16) + (p01 & mask) + (p10 & mask)
    return p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16), (p00 & mask) | (mid << 16)


def uniform_indices(rng_key, size, n, stream=0):
    """``size`` i.i.d. uniform integers in [0, n) (int32), for minibatch rows.

    Counter-based: word c of the stream is h(c) = fmix32(fmix32(c·φ + k₀ + stream·φ²) ⊕ k₁) with
    (k₀, k₁) the key's first and last 32-bit words, and index j is ⌊(h(2j)·2³² + h(2j+1))·n / 2⁶⁴⌋,
    whose law differs from the uniform one by at most n/2⁶⁴ per value (as ``random.randint``'s
    two-word draw). The key is not hashed again: a step's key is already a fresh threefry output
    (the driver splits the chain key once per step), so a draw costs two cheap hashes per index
    instead of threefry's twenty rounds, and it compiles to a few fused elementwise ops.

    The result is reduced modulo n once more, by an n that XLA cannot see as a constant. The
    value is unchanged (it is already below n), but XLA treats an integer remainder by a
    non-constant as expensive, so it computes the indices once. Otherwise it fuses the whole
    hash into each gather that reads rows with them, and recomputes it for every gathered
    element. In a hand-written loop at N = 10⁷, D = 50, S = 10⁴, a data pass took 4.1–5.4 s with
    the hash fused into the gathers, 2.2 s without, and 2.8 s with ``random.randint``. (XLA's
    choice depends on the shapes and on what reads the rows: where it fuses the gather into a
    reduction, or at small S and D, the hash stays fused; the values are the same either way.)
    """
    index = _hashed_indices(rng_key, size, n, stream)
    return (index % lax.optimization_barrier(jnp.uint32(n))).astype(jnp.int32)


def _hashed_indices(rng_key, size, n, stream):
    """:func:`~numpyro_sgd.minibatch.with_replacement.uniform_indices` as uint32, without the last remainder."""
    words = random.key_data(rng_key).reshape(-1).astype(jnp.uint32)
    k0 = words[0] + jnp.uint32(stream) * jnp.uint32(0x3C6EF372)  # stream·φ² (mod 2³²)
    k1 = words[-1]
    counter = jnp.arange(2 * size, dtype=jnp.uint32)
    h = _fmix32(_fmix32(counter * jnp.uint32(_GOLDEN) + k0) ^ k1).reshape(size, 2)
    hi, lo = h[:, 0], h[:, 1]
    n = jnp.uint32(n)
    a_hi, a_lo = _mul_wide(hi, n)
    b_hi, _ = _mul_wide(lo, n)
    total = a_lo + b_hi
    return a_hi + (total < a_lo).astype(jnp.uint32)


def cluster_indices(rng_key, size, n, cluster_size, stream=0):
    """``size`` minibatch rows as ``size // cluster_size`` clusters of B = ``cluster_size``
    consecutive rows (int32; ``size`` must be a multiple of B).

    The law (*circular clusters*): K = S/B starts c_1..c_K i.i.d. uniform on [0, N)
    (:func:`~numpyro_sgd.minibatch.with_replacement.uniform_indices`), cluster k the rows c_k, c_k + 1, ...,
    c_k + B − 1 taken modulo N. Every row lies in exactly B of the N possible clusters, so each
    row is drawn with probability B/N per cluster whatever the order of the data, and the
    minibatch gradient (N/S) Σ_k Σ_{i∈k} ∇ℓ_i is unbiased for ∇U. Its noise covariance is
    (N²/S) C_B with C_B = Cov_k[Σ_{i∈k} ∇ℓ_i] / B, the covariance of a cluster's gradient sum per
    row; on rows in random order C_B = C (the per-row covariance) up to a relative
    O(√(D·B/N)), and the noise estimators of :mod:`numpyro_sgd.numerics.noise` estimate C_B itself from the
    cluster sums. The rows of a cluster are read as one contiguous block of memory: on a
    2-core CPU at N = 10⁷, D = 50, S = 10⁴ a hand-written data pass costs 1.5–2× one NumPy read
    of X with B = 125–250, against 10–14× with random rows (``benchmarks/index_draws.py``).

    The indices pass through ``lax.optimization_barrier``: otherwise XLA fuses the arithmetic
    into every gather that reads rows with them and recomputes it per element (measured 20 %
    slower at B = 32).
    """
    starts = uniform_indices(rng_key, size // cluster_size, n, stream)
    rows = (starts[:, None] + jnp.arange(cluster_size, dtype=jnp.int32)) % jnp.int32(n)
    return lax.optimization_barrier(rows.reshape(-1))


class WithReplacement(MinibatchLaw):
    """S i.i.d. uniform rows per plate (:func:`uniform_indices`), or, for a plate with
    ``cluster_size`` B > 1, S/B i.i.d. uniform clusters of B consecutive rows
    (:func:`cluster_indices`); plate j draws stream j of the step's key."""

    name = "with_replacement"
    clusters = True

    def draw(self, rng_key, plates, step=None, shuffle_key=None):
        return {p.name: uniform_indices(rng_key, p.subsample_size, p.size, stream=j) if p.cluster_size == 1
                else cluster_indices(rng_key, p.subsample_size, p.size, p.cluster_size, stream=j)
                for j, p in enumerate(plates)}

    def draw_shard(self, rng_key, rows, size, cluster_size=1):
        if cluster_size > 1:  # size/B clusters of B consecutive rows of the shard, wrapping within it
            return cluster_indices(rng_key, size, rows, cluster_size)
        return uniform_indices(rng_key, size, rows)
