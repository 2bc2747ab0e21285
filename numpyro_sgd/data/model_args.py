"""The model's arguments as the kernels see them: which leaves are arrays (passed to compiled
programs, never embedded as constants), NumPy data made JAX arrays, memmaps and large in-memory
NumPy arrays made :class:`~numpyro_sgd.data.streaming.StreamedRows`, and whether a value is being
traced.
"""

from __future__ import annotations

import functools
import weakref

import jax
import numpy as np

from . import native
from .native import rows_local
from .streaming import StreamedRows, wrap_memmap


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


#: In-memory NumPy arrays of at least this many bytes among the model arguments of a kernel's
#: ``init`` are read in place, like memmaps (:func:`stream_in_memory`), where the native reader
#: serves them. It is also the bound of the warning about data compiled in as constants
#: (``checks.CONSTANT_DATA_WARN_BYTES``): below it, holding the data several times costs little.
AUTO_STREAM_BYTES = 32 * 2**20

#: ``id(array)`` → the :class:`StreamedRows` :func:`stream_in_memory` made for the in-memory array,
#: while something (a kernel's kept run arguments or programs) holds it: every later entry point
#: (``sample``, ``postprocess_fn``, ``to_arviz``, ``loo_subsample``) then reads the same wrapper,
#: hence the same compiled programs
_IN_MEMORY = weakref.WeakValueDictionary()
#: ``id(array)`` → a weak reference to an array the model uses whole (:func:`keep_in_memory`)
_KEPT = {}


def _in_memory_rows(array):
    rows = _IN_MEMORY.get(id(array))
    return rows if rows is not None and rows.origin is array else None


def _kept(array):
    ref = _KEPT.get(id(array))
    return ref is not None and ref() is array


def _streams_by_default(x, lengths):
    """Whether the in-memory array ``x`` is read in place by default: a plain NumPy array (not a
    memmap, which always is) of at least :data:`AUTO_STREAM_BYTES`, or of as many rows as such an
    array (``lengths``: e.g. the labels ``y`` beside ``X``), whose rows the native reader serves
    on this backend, and which no model has used whole."""
    return (type(x) is np.ndarray and x.ndim >= 1 and (x.nbytes >= AUTO_STREAM_BYTES or x.shape[0] in lengths)
            and x.dtype.kind in "biuf" and not _kept(x)
            and native.can_read([x], jax.dtypes.canonicalize_dtype(x.dtype)))


def stream_in_memory(tree, copy_below):
    """``(tree, wrapped)``: ``tree`` (model arguments) with each large in-memory NumPy array
    (:func:`_streams_by_default`) replaced by its :class:`StreamedRows`, made once per array, and
    the arrays so replaced.

    With NumPyro's default ``MCMC(..., jit_model_args=False)`` an array argument is compiled into
    the sampling loop as a constant: the data are held about four times (measured: 4.4× the data's
    bytes at N = 2·10⁶, D = 50, float32; ``benchmarks/out_of_core.py --in-memory``). Read in place
    by the native reader, they are held once (1.3–1.4×), and a step reads its rows as fast as from
    device memory. The caller (a kernel's ``init``) gives them back with :func:`keep_in_memory`
    where the model uses one whole (``X @ w``, ``X.mean(0)``).

    A matrix in Fortran order (what pandas' ``DataFrame.to_numpy()`` gives) is read in place
    too, a row's elements one column at a time: with the cluster law's runs of rows, about 2.5×
    the time of C order per minibatch (0.42 against 0.17 ms at S = 10⁴, D = 50, clusters of 100
    rows), but the data are held once. Up to ``copy_below`` bytes (the kernel passes
    ``policy.CLUSTER_MIN_DATA_BYTES``, below which the law reads random rows, each element then a
    separate cache miss: 9× the time of C order) it is read from a copy in C order instead."""
    wrapped = []
    lengths = {x.shape[0] for x in jax.tree.leaves(tree) if _in_memory_rows(x) or _streams_by_default(x, ())}

    def wrap(x):
        if isinstance(x, np.ndarray) and not isinstance(x, np.memmap):
            rows = _in_memory_rows(x)
            if rows is None and _streams_by_default(x, lengths):
                source = x if rows_local(x) or x.nbytes > copy_below else np.ascontiguousarray(x)
                rows = _IN_MEMORY[id(x)] = StreamedRows(source, f"in-memory argument of shape {x.shape}")
                rows.origin = x
            if rows is not None:
                wrapped.append(x)
                return rows
        return x

    return jax.tree.map(wrap, tree), wrapped


def keep_in_memory(arrays):
    """Read ``arrays`` (made :class:`StreamedRows` by :func:`stream_in_memory`) as arrays again,
    from now on: the model uses them whole."""
    for x in arrays:
        key = id(x)
        _IN_MEMORY.pop(key, None)
        _KEPT[key] = weakref.ref(x, functools.partial(_forget, key))


def _forget(key, _):
    _KEPT.pop(key, None)


def should_read_in_place(mesh, rng_key, mcmc):
    """Whether a kernel's ``init`` reads large in-memory NumPy arguments in place
    (:func:`stream_in_memory`): under NumPyro's default ``jit_model_args=False`` (with ``True``
    the calling ``mcmc`` passes them into its loop as device arrays), one process, no ``mesh``
    (which shards device arrays over devices) and no ``chain_method="parallel"`` (a pmap:
    ``rng_key`` is a tracer)."""
    return (mesh is None and not is_tracer(rng_key) and jax.process_count() == 1
            and not getattr(mcmc, "_jit_model_args", False))


def setup_with_streams(given, stream, copy_below, setup):
    """``(setup(model_args, model_kwargs), (model_args, model_kwargs))``, a kernel's first trace of
    the model: on the arguments ``given`` with memmaps and, where ``stream``, large in-memory NumPy
    arrays read in place (:func:`stream_in_memory`). When the model fails to trace with the
    latter (it uses one whole: ``X @ w``, ``X.mean(0)``), they are kept as arrays for good
    (:func:`keep_in_memory`) and the model is traced again; an error of the model as given is then
    raised on its own, not chained to the first."""
    args, streamed = stream_in_memory(given, copy_below) if stream else (given, [])
    args = streamed_leaves(args, in_memory=False)
    done = None
    try:
        done = setup(*args)
    except Exception:
        if not streamed:
            raise
    if done is None:  # outside the handler, so that nothing is chained
        keep_in_memory(streamed)
        args = streamed_leaves(given, in_memory=False)
        done = setup(*args)
    return done, args


def streamed_leaves(tree, in_memory=True):
    """``tree`` with every NumPy memmap leaf replaced by its :class:`StreamedRows` (one per memmap)
    and, with ``in_memory``, every in-memory array that a kernel's ``init`` streamed
    (:func:`stream_in_memory`) by its own."""
    def wrap(x):
        if isinstance(x, np.memmap):
            return wrap_memmap(x)
        return (in_memory and _in_memory_rows(x)) or x if isinstance(x, np.ndarray) else x

    return jax.tree.map(wrap, tree)


def as_jax_args(tree):
    """NumPy arrays in model arguments become JAX arrays, so traced minibatch indices can index
    them (by ``jax.device_put``, which canonicalises the dtype as ``jnp.asarray`` does but compiles
    no staging program per shape); memmaps become their
    :class:`~numpyro_sgd.data.streaming.StreamedRows`, read in place."""
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
