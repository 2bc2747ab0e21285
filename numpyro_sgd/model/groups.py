"""The random-effects structure of a model, read from its plates and checked on its rows.

A *group latent* is a latent site in a plate that is not subsampled (``numpyro.plate("groups",
G)``), whose element g the data plate reads as ``a[g[idx]]``. The control variates of
:func:`~numpyro_sgd.kernels.group_sgld.group_sgld` need every row to read the global latents and
the coordinates of one group only: the Hessian is then block-arrowhead
(:mod:`~numpyro_sgd.numerics.arrowhead`). :func:`group_layout` finds the group sites from the
plates; :func:`check_one_group_per_row` checks, on a fixed set of rows, that the likelihood's
and the prior's Hessians have that form (a crossed or multi-membership effect, or a prior that
couples the groups, does not), before any sampling.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import random

from ..data.model_args import as_jax_args, split_arrays
from ..numerics.arrowhead import GroupLayout, from_probes, probes
from ..numerics.compilation import jit_once
from .structure import abstract_trace

__all__ = ["GroupSites", "group_layout", "GroupStructureError", "check_one_group_per_row",
           "CHECK_ROWS", "rows_per_group", "GROUP_SCAN_ROWS",
           "plates_read_whole", "global_only", "few_enough_global", "WHOLE_ROWS", "MAX_WHOLE_DIM"]

#: rows on which :func:`check_one_group_per_row` compares the arrowhead Hessian with the exact one
CHECK_ROWS = 512


class GroupSites:
    """The group plate, its group sites and the global sites of a potential's θ."""

    def __init__(self, plate, num_groups, group, glob, layout):
        #: the group plate's name
        self.plate = plate
        #: G
        self.num_groups = num_groups
        #: the group sites (each of shape (G, …))
        self.group = tuple(group)
        #: the other latent sites of θ
        self.glob = tuple(glob)
        #: :class:`~numpyro_sgd.numerics.arrowhead.GroupLayout` in θ
        self.layout = layout


def global_only(potential):
    """:class:`GroupSites` with no groups: every latent coordinate of ``potential`` global."""
    layout = GroupLayout(np.arange(potential.view.dim, dtype=np.int32), np.zeros((0, 0), np.int32))
    return GroupSites(None, 0, [], list(potential.view.names), layout)


def group_layout(potential, model_args, model_kwargs, name, read_whole=()):
    """:class:`GroupSites` of ``potential``'s latent sites (its ``view``), or None when no latent
    site lies in a plate that is not subsampled. The sites of the plates named in ``read_whole``
    (a regression's coefficients, :func:`plates_read_whole`) are global coordinates.

    Raises, naming the sites, when the group sites lie in two plates (crossed effects), in nested
    plates, or do not have the group plate as their first axis.
    """
    tr = abstract_trace(potential.model, model_args, model_kwargs)
    subsampled = {p.name for p in potential.plates}
    frames = {}
    for site in potential.view.names:
        outer = [f for f in tr[site]["cond_indep_stack"] if f.name not in subsampled and f.name not in read_whole]
        if len(outer) > 1:
            raise ValueError(
                f"{name}: the latent site '{site}' lies in the plates {[f.name for f in outer]}; the control variates "
                "for group latents take one group plate, with each site's first axis its groups (e.g. a (G, 2) "
                "intercept and slope as one site of event shape (2,), or two sites in the one plate). Write it so, "
                "or use SGWithinGibbs(ConstantSGD(model)).")
        if outer:
            frames[site] = outer[0]
    if not frames:
        return global_only(potential) if read_whole else None
    plates = sorted({f.name for f in frames.values()})
    if len(plates) > 1:
        by_plate = {p: [s for s, f in frames.items() if f.name == p] for p in plates}
        raise ValueError(
            f"{name}: the group latents lie in {len(plates)} group plates ({by_plate}): crossed effects (a row read "
            "by one group of each plate, e.g. user and item) make the Hessian's group blocks overlap, which the "
            "block-arrowhead curvature of the control variates does not cover yet. Use "
            "SGWithinGibbs(ConstantSGD(model)) (with S ≥ 10 × the groups of the larger plate), or NUTS.")
    (plate,) = plates
    num_groups = int(next(iter(frames.values())).size)
    shapes = dict(zip(potential.view.names, potential.view.shapes))
    offsets = dict(zip(potential.view.names, np.cumsum((0,) + potential.view.sizes)[:-1]))
    local, glob = [], []
    for site in potential.view.names:
        span = np.arange(offsets[site], offsets[site] + int(np.prod(shapes[site], dtype=int)))
        if site not in frames:
            glob.append(span)
            continue
        if not shapes[site] or shapes[site][0] != num_groups:
            raise ValueError(
                f"{name}: the group latent '{site}' has shape {shapes[site]}, whose first axis is not its "
                f"{num_groups} groups of plate '{plate}'; declare the plate as the site's leftmost batch dimension "
                "(the default dim=-1 with an event shape on the right).")
        local.append(span.reshape(num_groups, -1))
    layout = GroupLayout(np.concatenate(glob).astype(np.int32) if glob else np.zeros(0, np.int32),
                         np.concatenate(local, axis=1).astype(np.int32))
    return GroupSites(plate, num_groups, [s for s in potential.view.names if s in frames],
                      [s for s in potential.view.names if s not in frames], layout)


class GroupStructureError(ValueError):
    """The Hessian is not block-arrowhead in the layout :func:`check_one_group_per_row` was given."""


def check_one_group_per_row(potential, sites, theta, model_args, model_kwargs, params, name, rows=CHECK_ROWS):
    """Raise unless the Hessian of ``potential`` (its likelihood on ``rows`` rows of the one
    subsample plate, and its prior) at θ is block-arrowhead in ``sites.layout``: the exact
    Hessian-vector product along a random direction is compared with the arrowhead read from the
    probes (:func:`~numpyro_sgd.numerics.arrowhead.from_probes`). A row that reads two groups'
    coordinates (crossed or multi-membership effects), or a prior that couples groups, fails.

    :param params: constrained values of the sites ``potential`` does not sample (the hyperparameters).
    :return: whether the prior couples the global and the group coordinates (its global × group
        block is not zero at θ and at a random point beside it; an analytic function whose mixed
        derivative is not zero everywhere vanishes on a set of measure zero), so that
        :func:`~numpyro_sgd.adaptation.group_centre.prior_part` must read that block at every step.
    """
    (plate,) = potential.plates
    n = plate.size
    idx = np.sort(np.random.default_rng(0).choice(n, min(rows, n), replace=False)).astype(np.int32)
    arrays, rebuild, _ = split_arrays(*as_jax_args((model_args, model_kwargs)))
    layout = sites.layout
    dtype = theta.dtype
    probe = probes(layout, np.dtype(dtype))
    # from NumPy: an eager jax.random draw is two more XLA compilations at init (0.25 s)
    direction = np.random.default_rng(1).normal(size=theta.shape).astype(dtype)

    @jit_once
    def mismatch(theta, arrays, idx):
        args, kwargs = rebuild(arrays)

        def likelihood(t):
            return potential.likelihood(t, {plate.name: idx}, args, kwargs, params)

        def prior(t):
            return potential.prior_potential(t, args, kwargs, params)

        def arrowhead(fn, t):  # (the Hessian-vector product of fn at t, its arrowhead read from the probes)
            hvp = jax.linearize(jax.grad(fn), t)[1]
            return hvp, from_probes(layout, jax.vmap(hvp)(probe))

        out, assembled = [], None
        for fn in (likelihood, prior):
            hvp, assembled = arrowhead(fn, theta)
            exact = hvp(direction)
            out.append(jnp.linalg.norm(exact - assembled.matvec(layout, direction))
                       / jnp.maximum(jnp.linalg.norm(exact), 1e-30))
        # the prior's global × group block at θ (the loop's last) and at a point beside it
        coupling = [jnp.max(jnp.abs(h.cross), initial=0.0) for h in (assembled, arrowhead(prior, theta + direction)[1])]
        return jnp.stack(out), jnp.max(jnp.stack(coupling))

    (lik, pri), coupling = jax.tree.map(np.asarray, mismatch(theta, arrays, jnp.asarray(idx)))
    for what, value in (("the likelihood of a row", lik), ("the prior", pri)):
        if not value <= 1e-3:
            raise GroupStructureError(
                f"{name}: {what} couples the coordinates of different groups of the group latents {list(sites.group)} "
                f"(plate '{sites.plate}'): its Hessian is not one block per group plus the global latents (relative "
                f"mismatch {value:.2g} on {idx.size} rows). The control variates for group latents need each row to "
                "read one group (a[g[idx]]) and the groups to be independent given the hyperparameters; a crossed "
                "or multi-membership effect, or a prior that correlates the groups, is not covered. Use "
                "SGWithinGibbs(ConstantSGD(model)) or NUTS.")
    return bool(coupling > 0)


#: rows of a one-plate model scanned at init to count each group's rows (all of them when N is at
#: most this; otherwise a uniform sample of this many, without replacement, fixed seed)
GROUP_SCAN_ROWS = 200_000


def rows_per_group(potential, sites, model_args, model_kwargs, max_rows=GROUP_SCAN_ROWS, chunk=2048):
    """Expected rows of a minibatch that touch each element of the latent ``sites``.

    Row n touches element j when the single-row likelihood gradient N ∇ℓ_n has a non-zero j-th
    coordinate (its likelihood reads z_j, e.g. ``z[g[idx]]`` with ``g[n] = j``). The gradients are
    taken at an initial point, for every row when N ≤ ``max_rows`` (exact counts) or for a
    uniform sample of ``max_rows`` rows, in chunks; a count c_j of the m scanned rows becomes
    c_j·S/m rows per minibatch. One plate only (``{}`` otherwise).

    :return: ``({site: float array of the site's shape}, exact)``; ``exact``: every row scanned.
    """
    if len(potential.plates) != 1 or not sites:
        return {}, False
    (plate,) = potential.plates
    n, s = plate.size, plate.subsample_size
    m = min(n, max_rows)
    rows = np.arange(n) if m == n else np.sort(np.random.default_rng(0).choice(n, m, replace=False))
    args = as_jax_args((model_args, model_kwargs))
    theta = potential.initial_params(random.key(0), *args)
    offsets = dict(zip(potential.view.names, np.cumsum((0,) + potential.view.sizes)[:-1]))
    sizes = dict(zip(potential.view.names, potential.view.sizes))
    cols = np.concatenate([np.arange(offsets[k], offsets[k] + sizes[k]) for k in sites])
    # only the array arguments are traced: the others (a Python int group count, which a plate's
    # size needs concrete) stay as they are, as in the potential's own jitted calls
    arrays, rebuild, _ = split_arrays(*args)

    @jax.jit
    def touched(idx, valid, arrays):
        args = rebuild(arrays)
        prior = jax.grad(potential.prior_potential)(theta, *args)[cols]

        def one(i):
            return jax.grad(potential.potential)(theta, {plate.name: i[None]}, *args)[cols]

        lik = jax.vmap(one)(idx) - prior  # N ∇ℓ_n: the prior's part cancels to rounding
        hit = jnp.abs(lik) > 1e-6 * jnp.abs(prior) + jnp.finfo(lik.dtype).tiny
        return jnp.sum(hit & valid[:, None], axis=0)

    counts = np.zeros(cols.shape[0], np.int64)
    for start in range(0, m, chunk):
        block = rows[start:start + chunk]
        valid = np.arange(chunk) < block.shape[0]
        idx = np.resize(block, chunk).astype(np.int32)  # the last chunk padded with its own rows
        counts += np.asarray(touched(idx, valid, arrays))
    per_batch = counts * (s / m)
    out, k = {}, 0
    for site in sites:
        out[site] = per_batch[k:k + sizes[site]].reshape(potential.view.shapes[potential.view.names.index(site)])
        k += sizes[site]
    return out, m == n


#: rows on which :func:`plates_read_whole` counts the elements each row reads
WHOLE_ROWS = 64
#: the most coordinates of the plates read whole, which become dense global coordinates (their
#: block of the curvature is D_g², factored at every step: 10³ coordinates cost 15 ms a step)
MAX_WHOLE_DIM = 4096


def plates_read_whole(potential, sites, model_args, model_kwargs):
    """The group plate of ``sites`` (:class:`GroupSites`) when its elements are not groups but
    coefficients every row reads (``X[idx] @ beta`` with ``beta`` in a plate of the p
    coefficients, under a shrinkage prior): on :data:`WHOLE_ROWS` rows, each reads more than half
    of the plate's elements (:func:`rows_per_group` at the initial point). ``()`` when a row reads
    one group, as ``a[g[idx]]`` does, or a few (a multi-membership effect, which stays refused)."""
    touched, _ = rows_per_group(potential, sites.group, model_args, model_kwargs, max_rows=WHOLE_ROWS,
                                chunk=WHOLE_ROWS)
    (plate,) = potential.plates
    # an element every scanned row reads is read by every row of a minibatch: S
    counts = np.concatenate([np.ravel(v) for v in touched.values()]) if touched else np.zeros(0)
    fraction = counts / plate.subsample_size
    return (sites.plate,) if fraction.size and np.mean(fraction > 0.99) > 0.5 else ()


def few_enough_global(sites, name, why):
    """``sites`` (:class:`GroupSites`), unless its global coordinates are more than
    :data:`MAX_WHOLE_DIM` (their curvature is a dense block factored at every step); ``why``: how
    they came to be global, for the message."""
    dim = sites.layout.global_index.shape[0]
    if dim > MAX_WHOLE_DIM:
        raise ValueError(
            f"{name}: {why}, so {dim} latent coordinates are global; their curvature is a dense {dim} × {dim} block "
            f"factored at every step, beyond the {MAX_WHOLE_DIM} this route takes. Use "
            "SGWithinGibbs(ConstantSGD(model)).")
    return sites
