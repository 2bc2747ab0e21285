"""The model's arguments as the kernels see them: which leaves are arrays (passed to compiled
programs, never embedded as constants), NumPy data made JAX arrays, memmaps made
:class:`~numpyro_sgd.streaming.StreamedRows`, and whether a value is being traced.
"""

from __future__ import annotations

import jax
import numpy as np

from .streaming import streamed_leaves


def is_tracer(x):
    """Whether any leaf of the pytree ``x`` is a JAX tracer (it is being traced: jit, pmap ...)."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(x))


def split_arrays(model_args, model_kwargs):
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


def as_jax_args(tree):
    """NumPy arrays in model arguments become JAX arrays, so traced minibatch indices can index
    them (by ``jax.device_put``, which canonicalises the dtype as ``jnp.asarray`` does but compiles
    no staging program per shape); memmaps become their
    :class:`~numpyro_sgd.streaming.StreamedRows`, read in place."""
    return jax.tree.map(lambda x: jax.device_put(x) if isinstance(x, np.ndarray) else x, streamed_leaves(tree))
