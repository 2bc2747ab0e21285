"""Data-parallel minibatch gradients over a device mesh (``SGKernel(..., mesh=mesh)``).

The data arrays are split along their first axis over the ``k`` devices of a mesh axis
(``"data"`` by default): device d holds rows ``d·N/k ... (d+1)·N/k − 1``. One SG step then

1. draws a *stratified* minibatch: S/k indices on each device, uniformly among its own N/k rows
   (with or without replacement within the shard);
2. evaluates on each device its own minibatch potential with the global scale N/(S/k) on its
   S/k rows, Û_d(θ) = −log p(θ) − (N/(S/k)) Σ_{n ∈ B_d} log p(x_n | θ);
3. averages: Û_S(θ) = (1/k) Σ_d Û_d(θ) (a scalar all-reduce), and its gradient, taken through
   the average, is one all-reduce of a D-vector. No data row leaves its device.

Û_S is unbiased for U: E Û_d = −log p(θ) − N · mean_{n in shard d} log p(x_n | θ), and the k
shards have equal sizes. Stratification changes the minibatch law and so the gradient noise:
Cov ∇Û_S = (N²/S) C_within, the per-example gradient covariance *within* shards, against
(N²/S) C for a simple random minibatch (C = C_within + C_between; equal when the rows are
assigned to shards at random, smaller otherwise). The warmup's noise estimate sees the
per-example gradients centred on their own shard's mean (plus the overall mean), their deviations
scaled by √((K − 1)/(K − k)) for the k shard means estimated from K rows (K = S/B cluster rows
under the cluster law), so it estimates the stratified Q that the KL-optimal preconditioner needs.

Warmup refresh steps gather the S × D per-example gradients (not the data) to estimate Q; the
prior's Hessian is computed on every device from its own rows and averaged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax, random
from jax.sharding import PartitionSpec
from numpyro.primitives import Messenger

from ..data.model_args import split_arrays
from ..data.streaming import blocks_of
from ..minibatch.law import law_names, law_of
from .oracle import MinibatchOracle

__all__ = ["DataParallelOracle", "check_mesh", "refuse_parallel_chains"]


class _GlobalScale(Messenger):
    """Scale the sites of a subsample plate so that the scale is N_global / len(indices) whatever
    size the model declares (``X.shape[0]`` inside ``shard_map`` is the local N/k)."""

    def __init__(self, fn, sizes):
        self.sizes = sizes
        self.declared = {}
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] in self.sizes:
            self.declared[msg["name"]] = msg["args"][0]
        elif msg["type"] == "sample":
            for frame in msg["cond_indep_stack"]:
                if frame.name in self.sizes:
                    factor = self.sizes[frame.name] / self.declared[frame.name]
                    msg["scale"] = factor if msg["scale"] is None else msg["scale"] * factor


def check_mesh(name, mesh, axis, potential, subsample, warmup_subsample):
    """Raise a ValueError, before any compute, for a mesh the data-parallel step cannot use."""
    if axis not in mesh.axis_names:
        raise ValueError(f"{name}: the mesh has no axis {axis!r} (its axes: {mesh.axis_names}); pass "
                         f"mesh_axis= one of them.")
    k = mesh.shape[axis]
    if len(potential.plates) != 1:
        raise ValueError(f"{name}: mesh= supports models with one subsample plate; this one has "
                         f"{[p.name for p in potential.plates]}.")
    (plate,) = potential.plates
    if plate.size % k or plate.subsample_size % k:
        raise ValueError(
            f"{name}: with mesh= over {k} devices, plate '{plate.name}' needs N = {plate.size} and S = "
            f"{plate.subsample_size} divisible by {k} (each device holds N/{k} rows and draws S/{k} of them); "
            f"trim or pad the data and choose subsample_size a multiple of {k}.")
    for option, law in (("subsample", subsample), ("warmup_subsample", warmup_subsample)):
        if not law_of(law).on_mesh:
            usable = [n for n in law_names() if law_of(n).on_mesh]
            raise ValueError(f"{name}: {option}={law!r} is not supported with mesh=; use "
                             f"{' or '.join(map(repr, usable))} (each device draws its rows among its own).")


class DataParallelOracle(MinibatchOracle):
    """A :class:`~numpyro_sgd.MinibatchOracle` whose minibatch is stratified over the
    shards of ``mesh``'s axis ``axis`` and whose potentials are computed where the rows are (see
    the module docstring). Indices are global row numbers; device d's S/k of them lie in its shard.
    """

    def __init__(self, mesh, axis, potential, model_args=(), model_kwargs=None, method="with_replacement",
                 step=None, shuffle_key=None, params=None, num_warmup_steps=None):
        super().__init__(potential, model_args, model_kwargs, method, step, shuffle_key, params,
                         num_warmup_steps)
        self.mesh, self.axis = mesh, axis
        (self.plate,) = potential.plates
        self.shards = mesh.shape[axis]
        sizes = {self.plate.name: self.plate.size}
        self.local = potential.derived(("global_scale", tuple(sizes.items())),
                                       lambda p: p.with_model(_GlobalScale(p.model, sizes)))

    def _arguments(self):
        # with_params and conditioned keep the mesh, its axis and the sharded computation
        return dict(super()._arguments(), mesh=self.mesh, axis=self.axis)

    # ------------------------------------------------------------------ layout
    def _specs(self, tree):
        """P(axis) for arrays whose first axis is the plate's N (the data), P() for the rest."""
        n = self.plate.size

        def spec(x):
            return PartitionSpec(self.axis) if jnp.ndim(x) >= 1 and jnp.shape(x)[0] == n else PartitionSpec()

        return jax.tree.map(spec, tree)

    def _sharded(self, local_fn, out_specs, theta, indices):
        """``local_fn(theta, local_indices, model_args, model_kwargs)`` on every device.

        Only the array arguments are operands of the ``shard_map``; the others (a Python
        ``subsample_size``, a flag, a string) reach the model as they are, as without ``mesh=``:
        an operand would be a tracer, which ``numpyro.plate`` cannot take as its size."""
        arrays, rebuild, _ = split_arrays(self.model_args, self.model_kwargs)
        rows = self.plate.size // self.shards

        def on_device(theta, idx, arrays):
            offset = lax.axis_index(self.axis) * rows
            # a streamed argument is the whole file on every process: each device reads its own block
            args = blocks_of(rebuild(arrays), offset, rows, self.plate.size, (self.axis,))
            return local_fn(theta, {self.plate.name: idx - offset}, *args)

        specs = (PartitionSpec(), PartitionSpec(self.axis), self._specs(arrays))
        return jax.shard_map(on_device, mesh=self.mesh, in_specs=specs, out_specs=out_specs)(
            theta, indices[self.plate.name], arrays)

    # ------------------------------------------------------------------ what a step asks
    def draw(self, rng_key):
        """S/k indices per shard, uniform among the shard's N/k rows (or S/(k·B) clusters of B
        consecutive rows of the shard, wrapping within it), as global row numbers."""
        k, rows, per = self.shards, self.plate.size // self.shards, self.plate.subsample_size // self.shards
        keys, law = random.split(rng_key, k), law_of(self.method)
        local = jax.vmap(lambda key: law.draw_shard(key, rows, per, self.plate.cluster_size))(keys)
        idx = (local + rows * jnp.arange(k, dtype=local.dtype)[:, None]).reshape(-1)
        return {self.plate.name: idx}

    @property
    def num_shards(self):
        """k, the devices of the mesh axis: a full-data pass walks every device's own rows."""
        return self.shards

    def shard_rows(self, start, size):
        """Rows ``start … start + size − 1`` of every device's shard, device d's in its block."""
        rows = self.plate.size // self.shards
        local = start + jnp.arange(size, dtype=jnp.int32)
        idx = local[None, :] + rows * jnp.arange(self.shards, dtype=jnp.int32)[:, None]
        return {self.plate.name: idx.reshape(-1)}

    def _join_batches(self, stacked):
        """``{plate: int32[m, S]}`` → ``{plate: int32[m·S]}`` with device d's m·S/k rows in its block."""
        (idx,) = stacked.values()
        m, k = idx.shape[0], self.shards
        return {self.plate.name: idx.reshape(m, k, -1).transpose(1, 0, 2).reshape(-1)}

    def potential_energy(self, theta, indices):
        def local(theta, idx, model_args, model_kwargs):
            return lax.pmean(self.local.potential(theta, idx, model_args, model_kwargs, self.params), self.axis)

        return self._sharded(local, PartitionSpec(), theta, indices)

    def likelihood_energy(self, theta, indices):
        def local(theta, idx, model_args, model_kwargs):
            return lax.pmean(self.local.likelihood(theta, idx, model_args, model_kwargs, self.params), self.axis)

        return self._sharded(local, PartitionSpec(), theta, indices)

    def potential_and_grad(self, theta, indices):
        # the gradient of the device average: one all-reduce of a D-vector in the backward pass
        return jax.value_and_grad(self.potential_energy)(theta, indices)

    def per_example_grads(self, theta, indices):
        # The noise estimators take the scatter of the K = S/B rows (cluster rows) of a step about
        # their mean with K − 1 degrees of freedom; centred on each of the k shards' own means it
        # has K − k (k means are estimated). Scaling the deviations by √((K − 1)/(K − k)) makes
        # the estimate unbiased for the within-shard noise: without it, Q came out (K − k)/(K − 1)
        # too small (measured, 2 devices, S = 20: sds 23–26 % too large with 2 clusters of 5 rows
        # per device, 2–4 % with 10 random rows per device; docs/scaling.md).
        units = self.plate.subsample_size // self.plate.cluster_size
        inflate = (units - 1) / (units - self.shards) if units > self.shards else 1.0

        def local(theta, idx, model_args, model_kwargs):
            theta = lax.pcast(theta, (self.axis,), to="varying")  # each device's own rows
            pe, grad, (rows,) = self.local.per_example_grads(theta, idx, model_args, model_kwargs, self.params)
            mean = lax.pmean(grad, self.axis)
            # centred on the shard's own mean: the noise of a stratified minibatch (module docstring)
            return lax.pmean(pe, self.axis), mean, mean + (rows - grad) * inflate ** 0.5

        spec = PartitionSpec(self.axis)
        pe, grad, rows = self._sharded(local, (PartitionSpec(), PartitionSpec(), spec), theta, indices)
        return pe, grad, (rows,)

    def prior_hessian(self, theta, diagonal=False):
        def local(theta, idx, model_args, model_kwargs):
            theta = lax.pcast(theta, (self.axis,), to="varying")
            h = jax.hessian(self.local.prior_potential)(theta, model_args, model_kwargs, self.params)
            return lax.pmean(h, self.axis)

        per = self.plate.subsample_size // self.shards
        indices = {self.plate.name: jnp.tile(jnp.arange(per), self.shards)
                   + jnp.repeat(jnp.arange(self.shards) * (self.plate.size // self.shards), per)}
        h = self._sharded(local, PartitionSpec(), theta, indices)
        return jnp.diagonal(h) if diagonal else h


def refuse_parallel_chains(name, mesh, parallel):
    """Refuse ``mesh=`` with NumPyro's ``chain_method="parallel"`` (``parallel``: the chain key is a
    pmap tracer)."""
    if mesh is not None and parallel:
        raise ValueError(
            f"{name}: mesh= splits the data rows over the mesh's devices, and chain_method='parallel' would put one "
            "chain on each device as well (JAX then reports a 'Context mesh ... should match the mesh of sharding' "
            "error at the model's indexing). Use chain_method='vectorized' (every chain on every device, each with "
            "its own rows' gradients) or 'sequential' with mesh=, or drop mesh= to run parallel chains.")
