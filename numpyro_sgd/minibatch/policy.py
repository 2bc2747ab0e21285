"""The policy that picks a plate's minibatch from the data when the user leaves it to the
kernel: the size S (``subsample_size="auto"``) and the cluster size B of the default law.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np

from ..data.model_args import is_tracer, split_arrays
from ..data.streaming import StreamedRows, streamed_sources

__all__ = ["MAX_AUTO_SUBSAMPLE", "MIN_STEPS_PER_PASS", "choose_subsample_size", "choose_cluster_size",
           "order_design_effect", "resolve_cluster_sizes"]


#: the largest minibatch :func:`choose_subsample_size` picks, by JAX backend: on a CPU a data pass
#: costs least near S = 10⁴ (larger minibatches fall out of the cache between the gather and the
#: gradient: 2.8× a NumPy read per pass at S = 5·10⁴ against 1.4–2× at 10⁴, N = 10⁷, D = 50); on a
#: GPU a step is latency-bound, and S = 10⁵ is the cheaper pass at N = 10⁷
MAX_AUTO_SUBSAMPLE = {"cpu": 10_000, "default": 100_000}


#: fewest SG steps per data pass :func:`choose_subsample_size` allows: the KL-optimal chain relaxes
#: in about one pass, so a pass of ≥ 10 steps keeps its dynamics a discretised diffusion, and the
#: discrete-time correction's S/N stays ≤ 0.1
MIN_STEPS_PER_PASS = 10


def choose_subsample_size(num_data, backend=None, min_steps_per_pass=MIN_STEPS_PER_PASS):
    """The minibatch size S a kernel picks when the user leaves it to the kernel
    (``subsample_size="auto"``, or a model whose data plate declares none and a kernel given none):
    S = min(:data:`MAX_AUTO_SUBSAMPLE` of the backend, ⌊N / min_steps_per_pass⌋), at least 1.
    On a CPU that is S = 10⁴ from N = 10⁵ up; on a GPU 10⁵ from N = 10⁶ up. IASG asks for ≥ 100
    steps per pass (its window)."""
    backend = jax.default_backend() if backend is None else backend
    cap = MAX_AUTO_SUBSAMPLE.get(backend, MAX_AUTO_SUBSAMPLE["default"])
    return int(max(1, min(cap, num_data // min_steps_per_pass)))


#: data smaller than this (bytes of the arrays the plate indexes) keep random rows: they stay in
#: the CPU's caches, where a random row costs about what a contiguous one does
CLUSTER_MIN_DATA_BYTES = 64 * 2 ** 20


#: a cluster is chosen to span at least this many bytes of contiguous rows (a few pages: the
#: hardware prefetcher then streams it; measured at N = 10⁷, D = 50: 16 KB clusters cost 2.6×
#: a NumPy read per pass, 25 KB 1.5–2×, 50 KB 1.5×)
CLUSTER_BYTES = 32 * 2 ** 10


#: the law's relative effect on the noise covariance, √(D·B/N), is kept below this
CLUSTER_MAX_SPREAD = 0.05


#: at least this many clusters per minibatch (the within-minibatch noise estimate has K − 1
#: degrees of freedom per step, and a minibatch gradient stays a sum of many independent terms)
MIN_CLUSTERS = 32


#: a column of the data whose cluster means vary this many times more than random rows' means
#: would (its design effect) marks the rows as ordered
ORDERED_DESIGN_EFFECT = 1.5


def choose_cluster_size(num_data, subsample_size, dim, row_bytes):
    """The cluster size B of the default minibatch law (1: random rows).

    B = 1 when the data the plate indexes (N · ``row_bytes``) are below
    :data:`CLUSTER_MIN_DATA_BYTES` or the bound below is under 2; else the largest divisor of S
    that is at most the smallest of: the rows in :data:`CLUSTER_BYTES` (rounded up), the B with
    √(D·B/N) at most :data:`CLUSTER_MAX_SPREAD`, and S over :data:`MIN_CLUSTERS`. At N = 10⁷,
    D = 50, S = 10⁴ (204 bytes a row) that is B = 125.
    """
    if row_bytes is None or num_data * row_bytes < CLUSTER_MIN_DATA_BYTES:
        return 1
    bound = min(-(-CLUSTER_BYTES // max(int(row_bytes), 1)),
                int(CLUSTER_MAX_SPREAD ** 2 * num_data / max(dim, 1)),
                subsample_size // MIN_CLUSTERS)
    if bound < 2:
        return 1
    return max(b for b in range(1, bound + 1) if subsample_size % b == 0)


def order_design_effect(arrays, num_data, cluster_size, num_clusters=1000, seed=0, chunk_elements=1 << 20):
    """How much more the means of clusters of ``cluster_size`` consecutive rows vary than means
    of as many random rows would: max over the columns of ``arrays`` (those with N rows) of
    B · Var_k(cluster mean) / Var(row), on ``num_clusters`` clusters at random offsets (read on the
    host, about num_clusters · B rows; no compile).

    About 1 (± 3·√(2/K)) for rows in random order; about B for rows sorted by that column
    (a response, a time stamp, a group label). A column constant within clusters but varying
    between them is what makes the cluster law's noise larger than random rows'.

    The clusters are read a few at a time (about ``chunk_elements`` values, 8 MB in float64), so
    the check holds O(chunk) memory (reading all 10⁵ rows at once held 120 MB at D = 50). The
    clusters being of one size, Var(row) = mean_k(within-cluster variance) + Var_k(cluster mean)
    (the law of total variance), so each chunk keeps only its clusters' means and variances.
    """
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, num_data - cluster_size + 1, size=num_clusters)
    worst = 0.0
    for a in arrays:
        if np.ndim(a) == 0 or np.shape(a)[0] != num_data or not np.issubdtype(np.dtype(a.dtype), np.number):
            continue
        width = max(int(np.prod(np.shape(a)[1:])), 1)
        per_chunk = max(1, chunk_elements // (cluster_size * width))
        means, variances = [], []
        for first in range(0, num_clusters, per_chunk):
            rows = (starts[first:first + per_chunk, None] + np.arange(cluster_size)).reshape(-1)
            read = a.gather(rows) if isinstance(a, StreamedRows) else a[rows]
            block = np.asarray(read, dtype=np.float64).reshape(-1, cluster_size, width)
            means.append(block.mean(axis=1))
            variances.append(block.var(axis=1))
        between_var = np.concatenate(means).var(axis=0)
        total = np.concatenate(variances).mean(axis=0) + between_var
        between = between_var * cluster_size
        ok = total > 0
        if np.any(ok):
            worst = max(worst, float(np.max(between[ok] / total[ok])))
    return worst


def resolve_cluster_sizes(potential, model_args, model_kwargs, requested=None, kernel_name="numpyro_sgd",
                          shards=1):
    """``{plate: B}`` for the run: ``requested`` (an int for every plate, or ``{plate: B}``), else
    :func:`choose_cluster_size` from the arrays with N rows among the model arguments (their
    bytes per row). A chosen B > 1 falls back to 1 (random rows) with a warning when
    :func:`order_design_effect` finds the rows ordered; a requested one is kept, with the warning.
    A requested B must divide S and leave at least two clusters (ValueError naming the fix).
    With ``shards`` = k devices (``mesh=``), each device draws S/k rows among its own N/k: B is
    chosen for, and must divide, S/k.
    """
    arrays = split_arrays(model_args, model_kwargs)[0] + streamed_sources((model_args, model_kwargs))
    sizes = {}
    for p in potential.plates:
        mine = [a for a in arrays if np.ndim(a) >= 1 and np.shape(a)[0] == p.size]
        per, where = p.subsample_size // shards, "" if shards == 1 else f" per device (S/{shards})"
        if requested is not None:
            b = requested.get(p.name, 1) if isinstance(requested, dict) else requested
            if per % b or per // b < 2:
                divisors = [d for d in range(1, per // 2 + 1) if per % d == 0]
                raise ValueError(
                    f"{kernel_name}: cluster_size={b} must divide plate '{p.name}'s subsample_size{where} "
                    f"S = {per} and leave at least 2 clusters; use one of "
                    f"{divisors[-8:]} (or cluster_size=1 for random rows).")
        # under pmap (tracers), or rows held by other processes: the order cannot be read here
        tracers = is_tracer(mine)
        traced = tracers or not all(getattr(a, "is_fully_addressable", True) for a in mine)
        if requested is None:
            row_bytes = sum(np.dtype(a.dtype).itemsize * int(np.prod(np.shape(a)[1:])) for a in mine)
            b = choose_cluster_size(p.size // shards, per, potential.dim, row_bytes if mine and not tracers else None)
        if b > 1 and mine and not traced:
            effect = order_design_effect(mine, p.size, b)
            if effect > ORDERED_DESIGN_EFFECT:
                fallback = requested is None
                warnings.warn(
                    f"{kernel_name}: the rows of plate '{p.name}' look ordered: means of {b} consecutive rows "
                    f"vary {effect:.3g} times more than means of {b} random rows would (design effect; about 1 "
                    "for rows in random order). Minibatches of consecutive rows stay unbiased, but their noise "
                    f"is up to that much larger, so the chain mixes slower. "
                    + ("The kernel draws random rows instead (slower per data pass at this size). " if fallback
                       else "") +
                    "Put the rows in random order once (numpyro_sgd.datasets.shuffle_rows(X, y, ...); for "
                    "files, numpyro_sgd.datasets.shuffle_to(['X.npy', 'y.npy'], ['Xs.npy', 'ys.npy'])) to get "
                    "the faster law" + (", or pass cluster_size=1." if not fallback else "."),
                    UserWarning, stacklevel=4)
                if fallback:
                    b = 1
        sizes[p.name] = int(b)
    return sizes
