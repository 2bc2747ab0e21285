"""Subsampled potentials for any NumPyro model.

Every kernel in this package sees the model only through :class:`SubsampledPotential`. It is
built once per ``MCMC.run`` from one trace of the user's model and then provides, for a flat
vector ``theta`` of the unconstrained global latents (notation of Mandt et al. 2017):

* ``draw_indices(key)``: fresh minibatch indices for every subsample plate, in O(S);
* ``potential_and_grad(theta, idx)``: the minibatch potential
  Û_S(θ) = −log p(θ) − Σ_plates (N/S) Σ_{n∈S} log p(x_n | θ) and its gradient (NumPyro's own
  plate scaling N/S is used: the indices are substituted into the plate, which then scales);
* ``per_example_grads(theta, idx)``: Û_S, ∇Û_S and, per plate, the S × D matrix of
  single-example potential gradients ∇Û_{[n]} (the plate substituted with the one index n, so
  NumPyro scales it by N/1). Their mean is ∇Û_S exactly and their covariance over n is
  N² Cov_n[∇ log p(x_n|θ)], the per-plate gradient noise (``noise.py``);
* ``full_potential(theta)``: the full-data potential U(θ) (plate set to all N indices).

The plate never draws its own indices (that costs O(N) per step in NumPyro's Fisher–Yates
shuffle); the kernel draws them and substitutes them.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random
from jax._src import core as _jax_core  # only for _under_a_trace
from jax.experimental import checkify
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.distributions.constraints import real
from numpyro.distributions.transforms import IdentityTransform
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import constrain_fn, potential_energy
from numpyro.primitives import Messenger

from .streaming import PAST_THE_DATA, StreamedRows, streamed_leaves, streamed_sources
from .validation import check_model_args, check_param_values

__all__ = ["PlateInfo", "SubsampledPotential", "MinibatchOracle", "SUBSAMPLE_METHODS", "uniform_indices",
           "cluster_indices", "choose_cluster_size", "order_design_effect", "CLUSTER_MIN_DATA_BYTES",
           "CLUSTER_BYTES", "CLUSTER_MAX_SPREAD", "MIN_CLUSTERS", "ORDERED_DESIGN_EFFECT", "resolve_cluster_sizes",
           "choose_subsample_size", "MAX_AUTO_SUBSAMPLE", "MIN_STEPS_PER_PASS"]

#: How minibatch indices are drawn. ``"with_replacement"`` (default) draws S i.i.d. uniform
#: indices; ``"without_replacement"`` draws a fresh uniformly random S-subset every step;
#: ``"shuffle"`` walks through a random permutation epoch by epoch (every datum once per
#: epoch). Shuffling makes consecutive gradients negatively correlated and shrinks the
#: stationary spread (measured), so kernels only allow it for warmup.
SUBSAMPLE_METHODS = ("with_replacement", "without_replacement", "shuffle")


# ---------------------------------------------------------------------------- index draws
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


def cluster_indices(rng_key, size, n, cluster_size, stream=0):
    """``size`` minibatch rows as ``size // cluster_size`` clusters of B = ``cluster_size``
    consecutive rows (int32; ``size`` must be a multiple of B).

    The law (*circular clusters*): K = S/B starts c_1..c_K i.i.d. uniform on [0, N)
    (:func:`~numpyro_sgd.potential.uniform_indices`), cluster k the rows c_k, c_k + 1, ...,
    c_k + B − 1 taken modulo N. Every row lies in exactly B of the N possible clusters, so each
    row is drawn with probability B/N per cluster whatever the order of the data, and the
    minibatch gradient (N/S) Σ_k Σ_{i∈k} ∇ℓ_i is unbiased for ∇U. Its noise covariance is
    (N²/S) C_B with C_B = Cov_k[Σ_{i∈k} ∇ℓ_i] / B, the covariance of a cluster's gradient sum per
    row; on rows in random order C_B = C (the per-row covariance) up to a relative
    O(√(D·B/N)), and the noise estimators of :mod:`numpyro_sgd.noise` estimate C_B itself from the
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


def order_design_effect(arrays, num_data, cluster_size, num_clusters=1000, seed=0):
    """How much more the means of clusters of ``cluster_size`` consecutive rows vary than means
    of as many random rows would: max over the columns of ``arrays`` (those with N rows) of
    B · Var_k(cluster mean) / Var(row), on ``num_clusters`` clusters at random offsets (read on the
    host, about num_clusters · B rows; no compile).

    About 1 (± 3·√(2/K)) for rows in random order; about B for rows sorted by that column
    (a response, a time stamp, a group label). A column constant within clusters but varying
    between them is what makes the cluster law's noise larger than random rows'.
    """
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, num_data - cluster_size + 1, size=num_clusters)
    rows = (starts[:, None] + np.arange(cluster_size)).reshape(-1)
    worst = 0.0
    for a in arrays:
        if np.ndim(a) == 0 or np.shape(a)[0] != num_data or not np.issubdtype(np.dtype(a.dtype), np.number):
            continue
        read = a.gather(rows) if isinstance(a, StreamedRows) else a[rows]
        block = np.asarray(read, dtype=np.float64).reshape(num_clusters, cluster_size, -1)
        total = block.reshape(num_clusters * cluster_size, -1).var(axis=0)
        between = block.mean(axis=1).var(axis=0) * cluster_size
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
    arrays = _split_arrays(model_args, model_kwargs)[0] + streamed_sources((model_args, model_kwargs))
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
        tracers = _is_tracer(mine)
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


def _is_tracer(x):
    """Whether any leaf of the pytree ``x`` is a JAX tracer (it is being traced: jit, pmap ...)."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(x))


def _hashed_indices(rng_key, size, n, stream):
    """:func:`~numpyro_sgd.potential.uniform_indices` as uint32, without the last remainder."""
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


class PlateInfo(NamedTuple):
    """A subsample plate of the model."""

    name: str
    #: number of data points N in the plate
    size: int
    #: minibatch size S
    subsample_size: int
    #: B: minibatches are S/B clusters of B consecutive rows
    #: (:func:`~numpyro_sgd.potential.cluster_indices`); 1: random rows
    cluster_size: int = 1


class AllRows(Messenger):
    """Every subsample plate of the model set to all of its rows, at the size the plate declares
    in this call (``numpyro.plate(name, N, subsample_size=S)`` gets the indices ``arange(N)`` of
    this call's N), so the model evaluates the full data it is given, whatever data an earlier
    ``init`` traced."""

    def process_message(self, msg):
        if msg["type"] != "plate":
            return
        size, subsample_size = msg["args"]
        if subsample_size is not None and subsample_size != size:
            # concrete even inside a jit (ArviZ's export traces the model under one): NumPy data
            # cannot be indexed by a tracer
            with jax.ensure_compile_time_eval():
                msg["value"] = jnp.arange(size)
            msg["args"] = (size, size)


class _SetPlateIndices(Messenger):
    """Substitute indices into subsample plates and keep NumPyro's N/len(idx) scaling.

    ``indices=None`` is the discovery mode: every subsample plate is validated, recorded into
    ``self.found`` and given the indices ``arange(S)`` (a valid minibatch, no O(N) draw).
    Setting ``msg["args"]`` as well as ``msg["value"]`` avoids NumPyro's warning that the
    substituted length differs from the declared subsample_size (e.g. for one index).
    """

    def __init__(self, fn=None, indices=None, promote=None, name="numpyro_sgd"):
        self.indices = indices
        self.name = name
        self.promote = {} if promote is None else promote
        self.found = {}
        #: {name: size} of the plates that do not subsample (discovery mode), and those of them
        #: that declare subsample_size = size
        self.full_plates, self.declared_full = {}, []
        super().__init__(fn)

    def postprocess_message(self, msg):
        # discovery: a numpyro.param outside its constraint is refused before the model uses it
        if self.indices is None and msg["type"] == "param":
            check_param_values(self.name, {msg["name"]: msg["value"]},
                               {msg["name"]: msg["kwargs"].get("constraint", real)})

    def process_message(self, msg):
        if msg["type"] != "plate":
            return
        size, subsample_size = msg["args"]
        name = msg["name"]
        if self.indices is None and subsample_size is not None and (
                isinstance(subsample_size, (bool, np.bool_)) or not isinstance(subsample_size, (int, np.integer))):
            raise ValueError(
                f"numpyro_sgd: plate '{name}' has subsample_size={subsample_size!r} ({type(subsample_size).__name__}), "
                f"not an integer; declare numpyro.plate('{name}', {size}, subsample_size=S) with an int S"
                + (f", e.g. subsample_size={int(subsample_size)}." if isinstance(subsample_size, float)
                   and subsample_size.is_integer() else ".")
            )
        if self.indices is None:
            if (subsample_size is None or subsample_size == size) and name in self.promote:
                subsample_size = min(self.promote[name], size)  # the kernel's S for a full plate
                msg["args"] = (size, subsample_size)
            if subsample_size is None or subsample_size == size:
                self.full_plates[name] = int(size)
                if subsample_size is not None:
                    self.declared_full.append(name)
                return
            if not 1 <= subsample_size <= size:
                raise ValueError(
                    f"numpyro_sgd: plate '{name}' has subsample_size={subsample_size} but "
                    f"size={size}; use 1 <= subsample_size <= size, e.g. "
                    f"numpyro.plate('{name}', {size}, subsample_size={min(100, size)})."
                )
            self.found[name] = PlateInfo(name, int(size), int(subsample_size))
            msg["value"] = jnp.arange(subsample_size)
        elif name in self.indices:
            idx = self.indices[name]
            msg["value"] = idx
            msg["args"] = (size, idx.shape[0])


class _MaskPlateSites(Messenger):
    """Mask (drop from the log density) every sample site inside the given plates."""

    def __init__(self, fn=None, plate_names=()):
        self.plate_names = set(plate_names)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and any(f.name in self.plate_names for f in msg["cond_indep_stack"]):
            msg["fn"] = msg["fn"].mask(False)


class _FlatView:
    """Ravel a dict of arrays into one vector and back, with static (picklable) shapes."""

    def __init__(self, example):
        self.names = tuple(sorted(example))
        self.shapes = tuple(tuple(np.shape(example[k])) for k in self.names)
        self.sizes = tuple(int(np.prod(s, dtype=int)) for s in self.shapes)
        self.dim = sum(self.sizes)

    def ravel(self, params):
        return jnp.concatenate([jnp.ravel(params[k]) for k in self.names])

    def unravel(self, flat):
        out, start = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes):
            out[name] = jnp.reshape(flat[start : start + size], shape)
            start += size
        return out


def _under_a_trace():
    """Whether JAX is staging a program (jit, pmap, shard_map, scan ...) rather than running ops
    one by one (eagerly, or under an eager vmap/grad). JAX has no public query for this; where
    its private one is missing, the answer is "yes", which keeps the inlined evaluation."""
    query = getattr(_jax_core, "unsafe_am_i_under_a_jit", None)
    return True if query is None else bool(query())


_REPLAYS = {}
_REPLAYS_KEPT = 32


def _replay(jaxpr):
    """A jitted ``(consts, *args) -> outputs`` evaluating ``jaxpr``, shared by equal programs.

    Called op by op (NumPyro applies the vmapped ``postprocess_fn`` to the initial state for the
    shapes of its sample buffers), a jaxpr would cost one XLA compilation per operation; jitted
    it is one program, and under an enclosing trace a nested call (:func:`_evaluate`). The
    kernel traces its model afresh at each ``init``, so the program is looked up by the jaxpr's
    text (with the constants as arguments, equal text is the same computation): a second run
    compiles nothing new.
    """
    key = str(jaxpr)
    fn = _REPLAYS.get(key)
    if fn is None:
        fn = jax.jit(lambda consts, *args: jaxpr_as_fun(ClosedJaxpr(jaxpr, consts))(*args))
        if len(_REPLAYS) >= _REPLAYS_KEPT:
            _REPLAYS.pop(next(iter(_REPLAYS)))
        _REPLAYS[key] = fn
    return fn


def _evaluate(closed, arrays, replay=None):
    """The outputs of the closed jaxpr ``closed`` on ``arrays``, as a call of one jitted program
    (``replay``, else :func:`_replay`'s).

    Where JAX runs op by op, that is one compiled program instead of one per operation. Inside a
    trace it is a nested call, which XLA inlines: JAX then differentiates, batches and lowers the
    model's jaxpr once per kind of use (its ``jvp``/``vmap`` rules for a jitted call keep their
    results for the same jaxpr) instead of going through it equation by equation at every use,
    and a kernel's step uses the potential many times (gradient, per-example gradients, noise
    moments, curvature). With several devices (``mesh=``, ``chain_method="parallel"``,
    ``jax.distributed``) the jaxpr is inlined as it is instead: there a nested jit meets JAX's
    sharding rules (pmap's per-chain mesh against the data's).
    """
    if jax.device_count() > 1 and _under_a_trace():
        return jaxpr_as_fun(closed)(*arrays)
    return (replay or _replay(closed.jaxpr))(closed.consts, *arrays)


def as_jax_args(tree):
    """NumPy arrays in model arguments become JAX arrays, so traced minibatch indices can index
    them (by ``jax.device_put``, which canonicalises the dtype as ``jnp.asarray`` does but compiles
    no staging program per shape); memmaps become their
    :class:`~numpyro_sgd.streaming.StreamedRows`, read in place."""
    return jax.tree.map(lambda x: jax.device_put(x) if isinstance(x, np.ndarray) else x, streamed_leaves(tree))


def _site_plates(site, plate_names):
    return [f.name for f in site["cond_indep_stack"] if f.name in plate_names]


class SubsampledPotential:
    """The subsampled potential of a NumPyro model whose data plates subsample.

    Built by :meth:`from_model`, which traces the model once and raises a clear
    ``ValueError`` at once (before any sampling) for models the package cannot handle.

    :param model: the NumPyro model.
    :param tuple plates: :class:`PlateInfo` of every subsample plate.
    :param view: (``_FlatView``) the layout of the flat unconstrained vector θ.
    :param dict param_values: values of ``numpyro.param`` sites (held fixed, as NUTS does).
    :param dict observed: plate name -> names of observed sites inside it.
    :param tuple plate_deterministic: deterministic sites inside a subsample plate (they depend
        on the minibatch and are not returned by :meth:`constrain`).
    :param str kernel_name: name used in error messages.
    :param dict transforms: site name -> transform from unconstrained space to the support.
    :param dict param_constraints: ``numpyro.param`` name -> its constraint (``real`` if none).
    """

    def __init__(self, model, plates, view, param_values, observed, plate_deterministic, kernel_name,
                 transforms=None, param_constraints=None):
        self.model = model
        self.plates = tuple(plates)
        self.view = view
        self.param_values = param_values
        self.observed = observed
        self.plate_deterministic = tuple(plate_deterministic)
        self.kernel_name = kernel_name
        self.transforms = {} if transforms is None else transforms
        self.param_constraints = {k: real for k in param_values} if param_constraints is None else param_constraints
        self._jaxprs = {}  # see _traced_once
        self._derived = {}  # see derived

    def _replace(self, **changes):
        """A new potential with some constructor fields changed (its traced programs are its own)."""
        fields = dict(model=self.model, plates=self.plates, view=self.view, param_values=self.param_values,
                      observed=self.observed, plate_deterministic=self.plate_deterministic,
                      kernel_name=self.kernel_name, transforms=self.transforms,
                      param_constraints=self.param_constraints)
        return type(self)(**{**fields, **changes})

    def restricted(self, names):
        """The potential of the same model over the latent sites ``names`` only.

        θ then holds those sites; every other latent site must be given, constrained, in the
        ``params`` of each call (it is substituted into the model as a ``numpyro.param`` value
        is), e.g. the hyperparameters φ that :class:`~numpyro_sgd.SGWithinGibbs` holds fixed
        while its inner kernel moves z: Û_S(z; φ) is the model's potential with φ substituted.

        :param names: latent site names (a subset of ``view.names``).
        """
        unknown = sorted(set(names) - set(self.view.names))
        if unknown:
            raise ValueError(f"{self.kernel_name}: restricted() names {unknown}, which are not latent sites "
                             f"of the model (those are {list(self.view.names)}).")
        shapes = dict(zip(self.view.names, self.view.shapes))
        view = _FlatView({n: np.zeros(shapes[n]) for n in names})
        return self._replace(view=view, transforms={k: t for k, t in self.transforms.items() if k in view.names})

    def with_model(self, model):
        """The same potential (sites, plates, layout of θ) evaluated on ``model``, a handler-wrapped
        version of this potential's model that keeps its sites (e.g. one that rescales them)."""
        return self._replace(model=model)

    def with_cluster_sizes(self, sizes):
        """The same potential whose plates draw clusters of ``sizes[plate name]`` consecutive rows
        (:func:`~numpyro_sgd.potential.cluster_indices`; a plate not named keeps its cluster size)."""
        plates = tuple(p._replace(cluster_size=int(sizes.get(p.name, p.cluster_size))) for p in self.plates)
        return self._replace(plates=plates)

    def derived(self, key, make):
        """``make(self)``, built once per ``key`` and kept with this potential: a potential that an
        oracle derives at every step's trace (the data-parallel oracle's rescaled local potential)
        then keeps its traced programs instead of tracing the model again each time."""
        if key not in self._derived:
            self._derived[key] = make(self)
        return self._derived[key]

    def __getstate__(self):  # the traced programs are rebuilt on first use after unpickling
        state = dict(self.__dict__)
        state["_jaxprs"] = {}
        state["_derived"] = {}
        return state

    def _traced_once(self, name, fn, *tree):
        """``fn(*tree)``, with the model traced once per argument signature.

        The first call with a given signature (tree structure, the array leaves' shapes and
        dtypes, the other leaves' values) traces ``fn`` (and so the model) into a jaxpr; every
        later call, under any transformation (``grad``, ``vmap``, ``jit``, ``checkify``),
        evaluates that jaxpr and never calls the model again. A jaxpr that closed over a value
        of an enclosing trace is used once and not kept.
        """
        leaves, treedef = jax.tree.flatten(tree)
        is_array = [isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves]
        arrays = [leaf for leaf, a in zip(leaves, is_array) if a]
        key = (name, treedef, tuple(jax.typeof(leaf) if a else leaf for leaf, a in zip(leaves, is_array)))
        try:
            entry = self._jaxprs.get(key)
        except TypeError:  # an unhashable static argument: trace as NumPyro would
            return fn(*tree)
        if entry is None:
            def flat(*values):
                it = iter(values)
                return fn(*jax.tree.unflatten(treedef, [next(it) if a else leaf for leaf, a in zip(leaves, is_array)]))

            closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(*arrays)
            entry = (closed, jax.tree.structure(out_shape), _replay(closed.jaxpr))
            if not any(isinstance(c, jax.core.Tracer) for c in closed.consts):
                self._jaxprs[key] = entry
        closed, out_tree, replay = entry
        return jax.tree.unflatten(out_tree, _evaluate(closed, arrays, replay))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, model, model_args=(), model_kwargs=None, *, rng_key=None,
                   init_strategy=init_to_uniform, kernel_name="numpyro_sgd", subsample_size=None,
                   min_steps_per_pass=MIN_STEPS_PER_PASS):
        """Trace ``model`` once, discover its subsample plates and sites, and validate it.

        ``subsample_size`` (an int for every subsample plate, or ``{plate name: S}``) replaces the
        minibatch size the model declares; NumPyro's plate then scales by N/S of the indices the
        kernel substitutes, so the potential stays unbiased. ``"auto"``, or None for a model none
        of whose plates subsamples, gives each plate
        :func:`~numpyro_sgd.potential.choose_subsample_size` of its N
        (``min_steps_per_pass``: the kernel's fewest SG steps per data pass).
        """
        model_kwargs = {} if model_kwargs is None else model_kwargs
        check_model_args(kernel_name, model_args, model_kwargs)
        # NumPy data become JAX arrays, as in every later trace: under pmap (chain_method="parallel")
        # the plate's indices are tracers, which a NumPy array cannot be indexed with
        model_args, model_kwargs = as_jax_args((model_args, model_kwargs))
        rng_key = random.key(0) if rng_key is None else rng_key
        promote = {}
        tr, finder = _discover(model, model_args, model_kwargs, rng_key, init_strategy, kernel_name)
        implicit = None

        def auto(n):
            return choose_subsample_size(n, min_steps_per_pass=min_steps_per_pass)

        if subsample_size is None and not finder.found and not finder.declared_full and finder.full_plates:
            # the NumPyro one-model pattern with no S anywhere: the kernel picks S for the one plate
            # holding observed sites (if there is no such plate, the error below names the fix)
            try:
                _plates_to_promote(tr, finder.full_plates, "auto", kernel_name)
                implicit = subsample_size = "auto"
            except ValueError:
                pass
        if subsample_size == "auto" and finder.found:
            subsample_size = {name: min(auto(p.size), p.size - 1) for name, p in finder.found.items()}
        if not finder.found and subsample_size is not None:
            # the model's plates do not subsample (NumPyro's `subsample_size=None` pattern, one
            # model for NUTS and SG): the kernel's subsample_size says which plate to subsample
            promote = _plates_to_promote(tr, finder.full_plates, subsample_size, kernel_name)
            promote = {k: (auto(finder.full_plates[k]) if v == "auto" else v) for k, v in promote.items()}
            fix = ("Index the data with the plate's indices, `with numpyro.plate(name, N, subsample_size="
                   "subsample_size) as idx: ... X[idx] ... obs=y[idx]`, so that a minibatch can be substituted.")
            try:
                promoted = _discover(model, model_args, model_kwargs, rng_key, init_strategy, kernel_name, promote)
                unindexed = _unindexed_observations(promoted[0], promote, finder.full_plates)
                if unindexed:
                    raise ValueError(f"observed site(s) {unindexed} keep all N rows of the plate")
            except ValueError as e:
                if not implicit:
                    raise ValueError(f"{kernel_name}: subsampling plate(s) {sorted(promote)} (declared without "
                                     f"subsample_size) failed: {e}. {fix}") from e
                promote = {}  # the kernel's own choice of S: the model is not written for it (error below)
            else:
                tr, finder = promoted
        plates = _override_subsample_sizes(tuple(finder.found.values()),
                                           None if subsample_size == "auto" else subsample_size, kernel_name)
        if not plates and finder.declared_full and finder.declared_full[0] in promote:
            name = finder.declared_full[0]
            raise ValueError(
                f"{kernel_name}: subsample_size={promote[name]} is at least the size N = {finder.full_plates[name]} "
                f"of plate '{name}', so every step would be a full-data gradient (full-batch gradient descent or "
                "Langevin) with no minibatch noise to estimate. Use NUTS for full-batch sampling, or a "
                "subsample_size below N."
            )
        if not plates and finder.declared_full:
            name = finder.declared_full[0]
            raise ValueError(
                f"{kernel_name}: plate '{name}' declares subsample_size equal to its size "
                f"N = {finder.full_plates[name]}, so every step would be a full-data gradient with no minibatch "
                "noise to estimate. Use NUTS for full-batch sampling, or a subsample_size below N (in the plate "
                "or as the kernel's subsample_size=S)."
            )
        if not plates:
            raise ValueError(
                f"{kernel_name}: the model has no subsample plate; wrap the likelihood in "
                "numpyro.plate('data', N, subsample_size=S) so that the kernel can draw "
                "minibatches (or give the kernel subsample_size=S for a plate declared without one; "
                "use NUTS for full-batch sampling)."
            )
        names = {p.name for p in plates}
        latent, params, observed, plate_det = {}, {}, {p.name: [] for p in plates}, []
        param_constraints = {}
        for name, site in tr.items():
            if site["type"] == "param":
                params[name] = site["value"]
                param_constraints[name] = _discovered_support(site)
                continue
            in_plates = _site_plates(site, names)
            if site["type"] == "deterministic":
                if in_plates:
                    plate_det.append(name)
                continue
            if site["type"] != "sample":
                continue
            if len(in_plates) > 1:
                raise ValueError(
                    f"{kernel_name}: site '{name}' is inside two subsample plates "
                    f"{in_plates}; the kernel subsamples each plate independently, so a site "
                    "may lie in at most one of them. Subsample only the outer plate."
                )
            if site["is_observed"]:
                if in_plates:
                    observed[in_plates[0]].append(name)
                continue
            if in_plates:
                raise ValueError(
                    f"{kernel_name}: latent site '{name}' is inside the subsample plate "
                    f"'{in_plates[0]}'; local latent variables are not supported by "
                    "stochastic-gradient kernels. Marginalise it out, or move it out of the "
                    "plate (make it a global latent)."
                )
            if site["fn"].support.is_discrete:
                raise ValueError(
                    f"{kernel_name}: latent site '{name}' is discrete; stochastic-gradient "
                    "kernels need continuous latents. Marginalise it out (e.g. with "
                    "numpyro.contrib.funsor enumeration inside a NUTS model) or make it "
                    "continuous."
                )
            latent[name] = site
        if not latent:
            raise ValueError(f"{kernel_name}: the model has no continuous latent sample site to sample.")
        unconstrained = {
            k: biject_to(_discovered_support(s)).inv(s["value"]) for k, s in latent.items()
        }
        view = _FlatView(unconstrained)
        obs = {k: tuple(v) for k, v in observed.items()}
        transforms = {k: biject_to(_discovered_support(s)) for k, s in latent.items()}
        potential = cls(model, plates, view, params, obs, plate_det, kernel_name, transforms, param_constraints)
        _check_plate_sizes(potential, model_args, model_kwargs)
        return potential

    # ------------------------------------------------------------------ basic facts
    @property
    def dim(self):
        """D, the dimension of the unconstrained latent vector θ."""
        return self.view.dim

    @property
    def num_data(self):
        """Σ over subsample plates of N (the denominator of a data pass)."""
        return sum(p.size for p in self.plates)

    @property
    def batch_size(self):
        """Σ over subsample plates of S (per-datum gradients per minibatch gradient)."""
        return sum(p.subsample_size for p in self.plates)

    @property
    def steps_per_pass(self):
        """⌈N/S⌉: SG steps per data pass."""
        return -(-self.num_data // self.batch_size)

    def initial_params(self, rng_key, model_args=(), model_kwargs=None, init_strategy=init_to_uniform):
        """Unconstrained initial θ (flat) for one chain, following ``init_strategy``."""
        model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
        idx = {p.name: jnp.arange(p.subsample_size) for p in self.plates}
        # substitute must be outside seed so that the init strategy finds the seeded key
        m = handlers.substitute(
            handlers.seed(_SetPlateIndices(self._with_params(), indices=idx), rng_key),
            substitute_fn=init_strategy,
        )
        tr = handlers.trace(m).get_trace(*model_args, **model_kwargs)
        z = {k: biject_to(tr[k]["fn"].support).inv(tr[k]["value"]) for k in self.view.names}
        return self.view.ravel(z)

    # ------------------------------------------------------------------ indices
    def draw_indices(self, rng_key, method="with_replacement", step=None, shuffle_key=None):
        """Minibatch indices ``{plate: int32[S]}`` in O(S) per plate.

        ``"with_replacement"`` draws S i.i.d. uniform indices (:func:`~numpyro_sgd.potential.uniform_indices`),
        or, for a plate with ``cluster_size`` B > 1, S/B i.i.d. uniform clusters of B consecutive
        rows (:func:`~numpyro_sgd.potential.cluster_indices`).
        ``"without_replacement"`` draws S i.i.d. indices and redraws the duplicates until
        there are none (expected S²/(2N) redraws); the law of the set is invariant under
        permutations of the data, so it is the uniform law over S-subsets.
        ``"shuffle"`` takes positions ``step*S ... step*S + S - 1`` of a pseudo-random
        permutation of the data that changes every epoch (a keyed Feistel permutation with
        cycle walking, evaluated only at the S positions: no O(N) permutation is stored).
        """
        if method == "with_replacement":  # one stream per plate of the step's key (uniform_indices)
            return {p.name: uniform_indices(rng_key, p.subsample_size, p.size, stream=j) if p.cluster_size == 1
                    else cluster_indices(rng_key, p.subsample_size, p.size, p.cluster_size, stream=j)
                    for j, p in enumerate(self.plates)}
        keys = random.split(rng_key, len(self.plates))
        out = {}
        for j, (key, p) in enumerate(zip(keys, self.plates)):
            if method == "without_replacement":
                out[p.name] = _subset_without_replacement(key, p.size, p.subsample_size)
            elif method == "shuffle":
                if step is None or shuffle_key is None:
                    raise ValueError("draw_indices: 'shuffle' needs the step and a shuffle_key")
                pos = step * p.subsample_size + jnp.arange(p.subsample_size)
                plate_key = random.fold_in(shuffle_key, j)
                out[p.name] = jax.vmap(_shuffled_position, (None, 0, 0, None))(
                    plate_key, pos // p.size, pos % p.size, p.size
                )
            else:
                raise ValueError(f"draw_indices: unknown method {method!r}")
        return out

    # ------------------------------------------------------------------ potentials
    def _with_params(self, params=None):
        values = dict(self.param_values)
        if params is not None:
            values.update(params)
        model = _explain_tracer_errors(self.model, self.kernel_name)
        return handlers.substitute(model, data=values) if values else model

    def potential(self, theta, indices, model_args=(), model_kwargs=None, params=None):
        """Û at flat θ with the plates substituted by ``indices`` (NumPyro's N/len(idx) scale).

        The model is traced once per shape of the arguments (``_traced_once``)."""
        model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
        return self._traced_once("potential", self._potential, theta, indices, model_args, model_kwargs, params)

    def _potential(self, theta, indices, model_args, model_kwargs, params):
        model = _SetPlateIndices(self._with_params(params), indices=indices)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return potential_energy(model, model_args, model_kwargs, self.view.unravel(theta))

    def potential_and_grad(self, theta, indices, model_args=(), model_kwargs=None, params=None):
        """(Û_S(θ), ∇Û_S(θ)) for one minibatch."""
        return jax.value_and_grad(self.potential)(theta, indices, model_args, model_kwargs, params)

    def fixed_step_cost(self, model_args=(), model_kwargs=None):
        """How many data points' worth of work a minibatch gradient does whatever S is.

        XLA's cost analysis (flops) of the lowered ∇Û_S at two minibatch sizes, one row and S
        (every plate at once; nothing is compiled or run; the model traces are those the sampler
        uses anyway) gives cost(s) = a + b s; the result is a / b,
        the S-independent work in units of one datum's. A well-written model scores about the
        prior's cost (a few data points); one that computes on all N rows every step (e.g. a
        predictor ``mu = X @ w`` indexed as ``mu[idx]`` inside the plate) scores about N.
        Returns None where the cost analysis is unavailable.
        """
        arrays, rebuild, _ = _split_arrays(model_args, {} if model_kwargs is None else model_kwargs)
        abstract = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in arrays]
        theta = jax.ShapeDtypeStruct((self.dim,), jnp.result_type(float))

        def flops(scale):
            idx = {p.name: jax.ShapeDtypeStruct((1 if scale == 1 else min(p.size, p.subsample_size),), jnp.int32)
                   for p in self.plates}
            fn = jax.jit(lambda th, i, arr: self.potential_and_grad(th, i, *rebuild(arr)))
            cost = fn.lower(theta, idx, abstract).cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            return (float(cost["flops"]) if cost and "flops" in cost else None), sum(v.shape[0] for v in idx.values())

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (f1, n1), (f2, n2) = flops(1), flops(2)
        except Exception:  # noqa: BLE001 - an advisory check; the sampler reports real failures
            return None
        if f1 is None or f2 is None or n2 == n1 or f2 <= f1:
            return None
        per_datum = (f2 - f1) / (n2 - n1)
        return max(0.0, f1 - per_datum * n1) / per_datum

    def per_example_grads(self, theta, indices, model_args=(), model_kwargs=None, params=None):
        """Û_S(θ), ∇Û_S(θ) and a tuple (one per plate) of S × D single-example gradients.

        For plate p the row n is ∇Û with plate p substituted by the single index n (scale N_p)
        and the other plates at their minibatch. The rows average to ∇Û_S and their covariance
        over n is N_p² Cov_n[∇ log p(x_n | θ)]. One vmapped pass (about 1.0–1.3× the cost of
        the minibatch gradient for one plate); with several plates each plate costs S_p
        minibatch-of-the-others evaluations.
        """
        vg = jax.value_and_grad(self.potential)
        pots, grads = [], []
        for p in self.plates:
            def single(i, _p=p):
                idx = dict(indices)
                idx[_p.name] = i[None]
                return vg(theta, idx, model_args, model_kwargs, params)

            pot_p, grad_p = jax.vmap(single)(indices[p.name])
            pots.append(jnp.mean(pot_p))
            grads.append(grad_p)
        # Every plate's rows average to the same minibatch gradient; use the first plate's.
        return pots[0], jnp.mean(grads[0], axis=0), tuple(grads)

    def prior_potential(self, theta, model_args=(), model_kwargs=None, params=None):
        """The potential without its likelihood: −log p(θ) − log|J| (sites in the plates masked)."""
        model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
        return self._traced_once("prior", self._prior_potential, theta, model_args, model_kwargs, params)

    def _prior_potential(self, theta, model_args, model_kwargs, params):
        idx = {p.name: jnp.arange(p.subsample_size) for p in self.plates}
        model = _MaskPlateSites(_SetPlateIndices(self._with_params(params), indices=idx),
                                plate_names=[p.name for p in self.plates])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return potential_energy(model, model_args, model_kwargs, self.view.unravel(theta))

    def full_indices(self):
        return {p.name: jnp.arange(p.size) for p in self.plates}

    def full_potential(self, theta, model_args=(), model_kwargs=None, params=None):
        """U(θ) on all the data (every plate set to all its N indices, scale 1)."""
        return self.potential(theta, self.full_indices(), model_args, model_kwargs, params)

    def full_hessian(self, at, model_args=(), model_kwargs=None, params=None):
        """∇²U at ``at`` (flat θ or a dict of unconstrained values) on all the data, as NumPy (D, D)."""
        theta = self.view.ravel(at) if isinstance(at, dict) else jnp.asarray(at)
        return np.asarray(jax.hessian(self.full_potential)(theta, model_args, model_kwargs, params))

    # ------------------------------------------------------------------ constraining
    def constrained_in_support(self, theta):
        """Whether θ maps to constrained values inside the open support: finite (exp(log σ) does
        not overflow) and off its boundary (exp(log σ) does not underflow to σ = 0.0; a sigmoid
        does not round to 0 or 1), so that no returned draw sits where the density is 0 or ∞.

        Uses the support transforms found at init (cheap, O(D), no model evaluation); a support
        that depends on other latents is checked with its transform at the initial point.
        """
        z = self.view.unravel(theta)
        checks = [_in_open_support(t, z[k]) for k, t in self.transforms.items()
                  if not isinstance(t, IdentityTransform)]  # θ itself is checked by the caller
        return jnp.all(jnp.stack(checks)) if checks else jnp.array(True)

    def constrain(self, theta, model_args=(), model_kwargs=None, params=None):
        """Latent sites in their support plus global deterministic sites, from flat θ.

        Deterministic sites inside a subsample plate depend on the minibatch and are left
        out; use :class:`numpyro.infer.Predictive` with the samples to get them.
        """
        model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
        return self._traced_once("constrain", self._constrain, theta, model_args, model_kwargs, params)

    def _constrain(self, theta, model_args, model_kwargs, params):
        idx = {p.name: jnp.arange(p.subsample_size) for p in self.plates}
        model = _SetPlateIndices(self._with_params(params), indices=idx)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            out = constrain_fn(model, model_args, model_kwargs, self.view.unravel(theta),
                               return_deterministic=True)
        return {k: v for k, v in out.items() if k not in self.plate_deterministic}


def _split_arrays(model_args, model_kwargs):
    """``(arrays, rebuild, key)``: the array leaves of the model arguments, a function putting
    arrays back into place (the other leaves, e.g. a Python ``subsample_size``, stay as they
    are) and a hashable key that identifies the arguments (arrays by identity)."""
    leaves, treedef = jax.tree.flatten((model_args, model_kwargs))
    is_array = [isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves]

    def rebuild(arrays):
        it = iter(arrays)
        return jax.tree.unflatten(treedef, [next(it) if a else leaf for leaf, a in zip(leaves, is_array)])

    key = (treedef, tuple(id(leaf) if a else leaf for leaf, a in zip(leaves, is_array)))
    return [leaf for leaf, a in zip(leaves, is_array) if a], rebuild, key


@contextlib.contextmanager
def _quiet_callback_errors():
    """JAX logs a failing host callback at ERROR level before raising; the plate check expects one."""
    logger = logging.getLogger("jax._src.callback")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check_plate_sizes(potential, model_args, model_kwargs):
    """Raise when a subsample plate is larger than the data it indexes: its indices would run
    past the data, and JAX clamps out-of-range gathers silently (the last row repeated).

    Cheap first: a plate no larger than some dimension of an array argument passes. Otherwise
    (a larger plate, or data closed over by the model) the minibatch potential is evaluated once
    at the plate's last index with JAX's index checks (``checkify``), which sees every gather.
    """
    arrays = _split_arrays(model_args, model_kwargs)[0]
    largest = max((d for a in arrays for d in np.shape(a)), default=0)
    streams = streamed_sources((model_args, model_kwargs))
    for p in potential.plates:
        if p.size <= largest and all(len(r) >= p.size for r in streams):
            continue
        idx = {q.name: jnp.full((1,), q.size - 1 if q.name == p.name else 0, jnp.int32) for q in potential.plates}
        theta = jnp.zeros(potential.dim)
        with warnings.catch_warnings(), _quiet_callback_errors():
            warnings.simplefilter("ignore")
            try:
                error, _ = checkify.checkify(potential.potential, errors=checkify.index_checks)(
                    theta, idx, model_args, model_kwargs)
                message = error.get()
            except Exception as e:  # a streamed read past the file (StreamedRows.gather)
                if PAST_THE_DATA not in str(e):
                    raise
                message = re.search(rf"row \d+ {PAST_THE_DATA} \d+ rows", str(e)).group(0)
        if message:
            raise ValueError(
                f"{potential.kernel_name}: plate '{p.name}' has size {p.size}, but the data it indexes are shorter "
                f"({message.strip()}): minibatch indices up to {p.size - 1} would read past the data, which "
                f"JAX clamps silently. Declare the plate with the data's length, e.g. "
                f"numpyro.plate('{p.name}', X.shape[0], subsample_size=...)."
            )


def _in_open_support(transform, u):
    """All of ``transform(u)`` finite, in the codomain, and strictly inside its bounds."""
    v = transform(u)
    support = transform.codomain
    ok = jnp.all(jnp.isfinite(v)) & jnp.all(support.check(v))
    lower, upper = getattr(support, "lower_bound", None), getattr(support, "upper_bound", None)
    if lower is not None:
        ok = ok & jnp.all(v > lower)
    if upper is not None:
        ok = ok & jnp.all(v < upper)
    return ok


#: what JAX raises when a model turns a traced value into a NumPy array or a Python value
TRACER_ERRORS = (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError,
                 jax.errors.TracerIntegerConversionError)


def _explain_tracer_errors(model, kernel_name):
    """``model``, re-raising JAX's tracer-conversion errors with the likely cause and the fix.

    The kernel traces the model with its array arguments (compiled init,
    ``jit_model_args=True``, ``chain_method="parallel"``) and always with traced minibatch
    indices; NUTS traces a model without subsample plates only with concrete data, so NumPy or
    Python logic on the data that works there fails here with a jaxpr dump.
    """
    def explained(*args, **kwargs):
        try:
            return model(*args, **kwargs)
        except TRACER_ERRORS as err:
            raise TypeError(
                f"{kernel_name}: the model calls NumPy or Python on a value the sampler traces "
                f"({type(err).__name__}): its array arguments and the plate's minibatch indices are JAX tracers "
                "here, so e.g. len(np.unique(group)), int(x.max()) or a NumPy array closed over by the model and "
                "indexed with the plate's indices cannot run; compute such sizes outside the model and pass them "
                "as Python ints (n_groups=len(np.unique(group))), and use jnp, or pass the data as model "
                "arguments, for array operations."
            ) from err

    return explained


def _discover(model, model_args, model_kwargs, rng_key, init_strategy, kernel_name, promote=None):
    """Trace ``model`` once in discovery mode: ``(trace, finder)`` (``finder.found``: its subsample
    plates; ``promote``: full plates to treat as subsampled with the given S).

    The trace runs as one compiled program (:func:`_replay`), not op by op: run eagerly, each
    operation of the model compiles an XLA program of its own for the data's shapes (about 17 for
    a GLM, 0.6–0.8 s on a 2-core CPU at a new N, more on a GPU). The program returns every sample
    and param site's value, and every support or param constraint that depends on a traced value,
    so the trace given back holds concrete arrays wherever the caller reads values; the
    distributions in it (``site["fn"]``) are for their static facts only (support type,
    discreteness). NumPyro's argument validation still checks constants (it evaluates them at
    trace time).
    """
    finder = _SetPlateIndices(promote=promote, name=kernel_name)
    traced = handlers.trace(handlers.substitute(handlers.seed(finder(_explain_tracer_errors(model, kernel_name)),
                                                              rng_key), substitute_fn=init_strategy))
    arrays, rebuild, _ = _split_arrays(model_args, model_kwargs)
    box = {}

    def program(arrays):
        args, kwargs = rebuild(arrays)
        box["trace"] = tr = traced.get_trace(*args, **kwargs)
        out = {}
        for name, site in tr.items():
            if site["type"] in ("sample", "param"):
                out[(name, "value")] = site["value"]
            support = _declared_support(site)  # latent sites only, as from_model reads them
            if support is not None and any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(support)):
                out[(name, "support")] = support
        return out

    try:
        # traced here; compiled once per distinct program (a second run, or a new MCMC on the same
        # model and shapes, compiles nothing new)
        closed, out_shape = jax.make_jaxpr(program, return_shape=True)(arrays)
        concrete = jax.tree.unflatten(jax.tree.structure(out_shape), _evaluate(closed, arrays))
        tr = box["trace"]
        for (name, what), value in concrete.items():
            tr[name]["value" if what == "value" else "_concrete_support"] = value
        return tr, finder
    except NotImplementedError as e:  # pragma: no cover - unusual user distributions
        raise ValueError(f"{kernel_name}: could not trace the model: {e}") from e
    except ValueError as e:
        sizes = {p.subsample_size for p in finder.found.values()} | {p.size for p in finder.found.values()}
        if not (str(e).startswith("Incompatible shapes for broadcasting") and finder.found
                and any(str(n) in str(e) for n in sizes)):
            raise
        plates = ", ".join(f"'{p.name}' (N = {p.size}, subsample_size = {p.subsample_size})"
                           for p in finder.found.values())
        raise ValueError(
            f"{kernel_name}: a site inside the subsample plate {plates} has a shape that does not broadcast with "
            f"the plate's minibatch ({e}): the model uses all N rows of its data inside the plate instead of "
            "the minibatch. Index every data array by the plate's indices: `with numpyro.plate('data', N, "
            "subsample_size=S) as idx: numpyro.sample('obs', dist.Normal(X[idx] @ w, sigma), obs=y[idx])` "
            "(or numpyro.subsample(y, event_dim=0))."
        ) from e


def _declared_support(site):
    """A param site's constraint (``real`` if it declares none) or a latent sample site's
    support, as the model declared it (traced leaves where it depends on traced values); None
    for any other site."""
    if site["type"] == "param":
        return site["kwargs"].get("constraint", real)
    if site["type"] == "sample" and not site.get("is_observed"):
        return site["fn"].support
    return None


def _discovered_support(site):
    """A latent site's support, or a param site's constraint, from :func:`_discover`'s trace
    (concrete where it was traced)."""
    return site["_concrete_support"] if "_concrete_support" in site else _declared_support(site)


def _unindexed_observations(trace, promote, full_plates):
    """Observed sites in a promoted plate whose value still holds all N rows along the plate's
    dimension (``obs=y`` instead of ``obs=y[idx]``): substituting a minibatch cannot work."""
    out = []
    for name, site in trace.items():
        if site["type"] != "sample" or not site.get("is_observed"):
            continue
        for frame in site["cond_indep_stack"]:
            shape = np.shape(site["value"])
            if (frame.name in promote and len(shape) >= -frame.dim
                    and shape[frame.dim] == full_plates[frame.name] != promote[frame.name]):
                out.append(name)
    return out


def _plates_to_promote(trace, full_plates, subsample_size, kernel_name):
    """``{plate: S}`` for a model none of whose plates subsamples: the plates the kernel's
    ``subsample_size`` names (a dict), or the one plate holding observed sites (an int)."""
    if isinstance(subsample_size, dict):
        unknown = sorted(set(subsample_size) - set(full_plates))
        if unknown:
            raise ValueError(f"{kernel_name}: subsample_size names {unknown}, which are not plates of the model "
                             f"(those are {sorted(full_plates)}).")
        return dict(subsample_size)
    observed = sorted({f.name for site in trace.values() if site["type"] == "sample" and site.get("is_observed")
                       for f in site["cond_indep_stack"] if f.name in full_plates})
    if len(observed) != 1:
        raise ValueError(
            f"{kernel_name}: no plate of the model subsamples, and subsample_size={subsample_size} does not say "
            f"which to subsample: the plates holding observed sites are {observed or 'none'}. Pass "
            "subsample_size={plate name: S}, or declare numpyro.plate(name, N, subsample_size=S) in the model."
        )
    return {observed[0]: subsample_size}


def _override_subsample_sizes(plates, subsample_size, kernel_name):
    """The plates with the kernel's ``subsample_size`` in place of the model's (see ``from_model``)."""
    if subsample_size is None or not plates:
        return plates
    names = [p.name for p in plates]
    sizes = subsample_size if isinstance(subsample_size, dict) else {name: subsample_size for name in names}
    unknown = sorted(set(sizes) - set(names))
    if unknown:
        raise ValueError(f"{kernel_name}: subsample_size names {unknown}, which are not subsample plates of the "
                         f"model (those are {names}); declare numpyro.plate(name, N, subsample_size=S) in the model.")
    out = []
    for p in plates:
        s = sizes.get(p.name, p.subsample_size)
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 1 <= s <= p.size:
            raise ValueError(f"{kernel_name}: subsample_size={s!r} for plate '{p.name}' must be an integer in "
                             f"[1, {p.size}] (the plate's size N).")
        out.append(p._replace(subsample_size=int(s)))
    return tuple(out)


def grad_and_hessian(fn, theta):
    """(∇fn(θ), ∇²fn(θ)) in one trace of ``fn``: the JVP of the gradient along each basis vector."""
    basis = jnp.eye(theta.shape[0], dtype=theta.dtype)
    grads, columns = jax.vmap(lambda e: jax.jvp(jax.grad(fn), (theta,), (e,)))(basis)
    return grads[0], columns


#: rows over which :meth:`MinibatchOracle.hessian_estimate` averages minibatch Hessians, and the
#: seed of the minibatches it draws
HESSIAN_ROWS = 4096
HESSIAN_SEED = 2017


class MinibatchOracle:
    """What an algorithm step may ask of the model: minibatch indices, minibatch potentials and
    gradients, per-example gradients and the prior's Hessian.

    A :class:`SubsampledPotential` bound to the model arguments of one ``sample`` call (never
    cached across calls), to how indices are drawn (``method``; ``"shuffle"`` needs the SG
    ``step`` and ``shuffle_key``) and to the values of ``numpyro.param`` sites (``params``; None:
    the model's init values). Built at trace time; it holds no state of its own.
    """

    def __init__(self, potential, model_args=(), model_kwargs=None, method="with_replacement", step=None,
                 shuffle_key=None, params=None, num_warmup_steps=None):
        self.potential = potential
        #: warmup SG steps of the run (set by the driver, the same for every chain, so that an
        #: algorithm's phase switch on it stays a branch under vmap; None: not known)
        self.num_warmup_steps = num_warmup_steps
        self.model_args = model_args
        self.model_kwargs = {} if model_kwargs is None else model_kwargs
        self.method = method
        self.step = step
        self.shuffle_key = shuffle_key
        self.params = params

    def _arguments(self):
        """The constructor arguments of this oracle (a subclass adds its own)."""
        return dict(potential=self.potential, model_args=self.model_args, model_kwargs=self.model_kwargs,
                    method=self.method, step=self.step, shuffle_key=self.shuffle_key, params=self.params,
                    num_warmup_steps=self.num_warmup_steps)

    def _variant(self, **changes):
        return type(self)(**{**self._arguments(), **changes})

    def with_params(self, params):
        """The same oracle with the ``numpyro.param`` sites set to ``params``."""
        return self._variant(params=params)

    def conditioned(self, potential, values):
        """The same oracle (model arguments, minibatch law, step; a subclass keeps its own layout,
        e.g. :class:`~numpyro_sgd.sharding.DataParallelOracle` its mesh) on ``potential``, a
        ``SubsampledPotential.restricted`` potential of the same model,
        with the sites it does not sample fixed at ``values`` (constrained; added to the
        ``numpyro.param`` values).

        :param potential: the restricted potential.
        :param dict values: ``{site: constrained value}`` for the sites left out of ``potential``.
        """
        params = dict(values) if self.params is None else {**self.params, **values}
        return self._variant(potential=potential, params=params)

    @property
    def batch_size(self):
        """Per-datum gradients in one minibatch gradient (Σ_p S_p)."""
        return self.potential.batch_size

    @property
    def num_data(self):
        """N = Σ_p N_p."""
        return self.potential.num_data

    @property
    def plates(self):
        return self.potential.plates

    def draw(self, rng_key):
        """Fresh minibatch indices ``{plate: int32[S]}``."""
        return self.potential.draw_indices(rng_key, self.method, self.step, self.shuffle_key)

    def potential_energy(self, theta, indices):
        """Û_S(θ) on ``indices``."""
        return self.potential.potential(theta, indices, self.model_args, self.model_kwargs, self.params)

    def potential_and_grad(self, theta, indices):
        """(Û_S(θ), ∇Û_S(θ)) on ``indices``."""
        return self.potential.potential_and_grad(theta, indices, self.model_args, self.model_kwargs, self.params)

    def per_example_grads(self, theta, indices):
        """Û_S, ∇Û_S and, per plate, the S × D single-example gradients
        (:meth:`~numpyro_sgd.SubsampledPotential.per_example_grads`)."""
        return self.potential.per_example_grads(theta, indices, self.model_args, self.model_kwargs, self.params)

    def prior_potential(self, theta):
        """The potential without its likelihood terms (prior and Jacobians) at θ; reads no data."""
        return self.potential.prior_potential(theta, self.model_args, self.model_kwargs, self.params)

    def prior_hessian(self, theta, diagonal=False):
        """Hessian of the potential without its likelihood terms (prior and Jacobians) at θ."""
        h = jax.hessian(self.prior_potential)(theta)
        return jnp.diagonal(h) if diagonal else h

    def fixed_batch(self, rows=HESSIAN_ROWS):
        """Indices of m = ⌈rows/S⌉ (at most 16) minibatches drawn with a fixed key, joined into one
        minibatch of m·S_p rows per plate (the plate's scale becomes N_p/(m·S_p)): the same rows for
        every chain and every call, drawn from nothing of the chain's key stream, so what is
        estimated on them leaves a run's draws as they were. ``Û_B = potential_energy(θ,
        fixed_batch())`` is an unbiased estimate of U(θ) and a deterministic function of θ."""
        m = max(1, min(16, -(-rows // self.batch_size)))
        stacked = jax.vmap(self.draw)(random.split(random.PRNGKey(HESSIAN_SEED), m))
        return self._join_batches(stacked)

    def _join_batches(self, stacked):
        """``{plate: int32[m, S]}`` → ``{plate: int32[m·S]}``."""
        return {name: idx.reshape(-1) for name, idx in stacked.items()}

    def hessian_estimate(self, theta, rows=HESSIAN_ROWS):
        """∇²U(θ) estimated without a data pass: ∇²Û_B(θ) on :meth:`fixed_batch` (unbiased for ∇²U).
        Costs D forward-mode passes over m·S rows (used at the end of warmup by kernels with a
        full D × D preconditioner)."""
        batch = self.fixed_batch(rows)
        return grad_and_hessian(lambda t: self.potential_energy(t, batch), theta)[1]

    def grad(self, rng_key, theta):
        """Draw a minibatch; return ``(Û_S, ∇Û_S)`` at θ and the indices."""
        indices = self.draw(rng_key)
        return (*self.potential_and_grad(theta, indices), indices)


def _subset_without_replacement(rng_key, size, subsample_size):
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


def _shuffled_position(plate_key, epoch, rank, size):
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
