"""The full-data pointwise log-likelihood of a traced model, streamed in chunks.

Below the driver: :mod:`numpyro_sgd.driver.init_checks` reads it at ``init`` (non-finite data), and
:mod:`numpyro_sgd.diagnostics.arviz_export` and :mod:`numpyro_sgd.diagnostics.loo` build on it. It asks the kernel only for
its public ``potential`` and ``subsampled_model``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers

from ..data.model_args import as_jax_args, split_arrays
from ..numerics.compilation import matmul_precision
from .discovery import SetPlateIndices

__all__ = ["log_likelihood_chunks"]


def log_likelihood_chunks(kernel, samples, model_args=(), model_kwargs=None, chunk_size=10_000,
                          batch_ndims=2, indices=None, plates=None):
    """Stream the full-data pointwise log-likelihood chunk by chunk (memory O(draws × chunk)).

    Yields ``(plate, idx, values)`` for every chunk of every subsample plate that has observed
    sites: ``idx`` the NumPy data indices of the chunk (at most ``chunk_size``), ``values`` a
    dict site -> JAX array (flat draws, len(idx)) of log p(y_i | θ_s), event dimensions summed.
    The plate is set to the chunk's indices (never to a random minibatch); one compiled program
    serves every chunk (the last chunk is padded with index 0 and cut), and the model's arrays
    are passed to it as arguments, not compiled in as constants.

    :param kernel: a numpyro_sgd kernel after ``init`` (e.g. ``mcmc.sampler``).
    :param dict samples: constrained samples with ``batch_ndims`` leading dimensions.
    :param indices: ``{plate name: int array}`` of the data indices to evaluate (default: all N,
        in order).
    :param plates: names of the plates to evaluate (default: every plate with observed sites).
    """
    model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
    potential = kernel.potential
    samples = {k: jnp.asarray(v) for k, v in samples.items() if k in potential.view.names}
    flat = {k: v.reshape((-1,) + v.shape[batch_ndims:]) for k, v in samples.items()}
    model = kernel.subsampled_model
    if potential.param_values:
        model = handlers.substitute(model, data=potential.param_values)
    arrays, rebuild, _ = split_arrays(model_args, model_kwargs)
    base_idx = {p.name: jnp.arange(min(p.subsample_size, p.size)) for p in potential.plates}
    for plate in potential.plates:
        sites = potential.observed[plate.name]
        if not sites or (plates is not None and plate.name not in plates):
            continue
        wanted = np.arange(plate.size) if indices is None else np.asarray(indices[plate.name])
        width = max(1, min(chunk_size, wanted.shape[0]))

        def one(values, chunk_idx, arrays, _plate=plate.name, _sites=sites):
            args, kwargs = rebuild(arrays)
            idx = dict(base_idx, **{_plate: chunk_idx})
            m = handlers.substitute(SetPlateIndices(model, indices=idx), data=values)
            tr = handlers.trace(m).get_trace(*args, **kwargs)
            res = {}
            for k in _sites:
                lp = tr[k]["fn"].log_prob(tr[k]["value"])
                # sum event/inner-plate dims so that one column is one datum of the plate
                res[k] = jnp.reshape(lp, (lp.shape[0], -1)).sum(-1) if lp.ndim > 1 else lp
            return res

        program = jax.jit(jax.vmap(one, in_axes=(0, None, None)))
        for start in range(0, wanted.shape[0], width):
            idx = wanted[start:start + width]
            padded = np.zeros(width, dtype=np.int64)
            padded[:idx.shape[0]] = idx
            with matmul_precision():  # traced as the kernel traces the model
                chunk = program(flat, jnp.asarray(padded, dtype=jnp.int32), arrays)
            yield plate.name, idx, {k: v[:, :idx.shape[0]] for k, v in chunk.items()}
