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


def python_scalars(model_args, model_kwargs):
    """Positions and names of the Python scalar model arguments (e.g. a ``subsample_size``)."""
    scalar = (int, float, bool, str)
    return ({i: v for i, v in enumerate(model_args) if isinstance(v, scalar)},
            {k: v for k, v in model_kwargs.items() if isinstance(v, scalar)})


def restore_scalars(args, scalars):
    """``(model_args, model_kwargs)`` with the Python scalars of ``scalars`` (:func:`python_scalars`
    of the run's ``init``) put back where they are traced: with ``MCMC(..., jit_model_args=True)``
    NumPyro passes every argument into its compiled loop, where an int such as a
    ``subsample_size`` argument would become a tracer that ``numpyro.plate`` cannot use."""
    (model_args, model_kwargs), (positions, names) = args, scalars
    model_args = tuple(positions[i] if i in positions and is_tracer(a) else a for i, a in enumerate(model_args))
    model_kwargs = {k: names[k] if k in names and is_tracer(v) else v for k, v in model_kwargs.items()}
    return model_args, model_kwargs
