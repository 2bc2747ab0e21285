"""Reading a finished run: its kernel, draws, model arguments and pointwise log-likelihood (the
full-data log-likelihood in blocks), what :func:`~numpyro_sgd.to_arviz`, the end-of-run checks
and the comparisons build on.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from numpyro import handlers

from ..model.likelihood import log_likelihood_chunks

__all__ = ["pointwise_log_likelihood", "run_model_args", "draws_of", "require_run", "kernel_of"]


def require_run(run, name, who="this MCMC"):
    """Refuse an ``MCMC`` whose ``run`` has not been called (it has no draws and no last state:
    NumPyro would fail later with a ``TypeError`` or ``AttributeError`` on ``None``)."""
    if hasattr(run, "get_samples") and hasattr(run, "last_state") and run.last_state is None:
        raise ValueError(f"{name}: {who} has not been run; call mcmc.run(rng_key, *model_args) first.")


def kernel_of(mcmc, name="to_arviz"):
    """The numpyro_sgd kernel of a finished ``MCMC`` run (``name``: the calling function, for messages)."""
    from ..driver.kernel import SGKernel

    kernel = getattr(mcmc, "sampler", None)
    if not isinstance(kernel, SGKernel):
        raise TypeError(
            f"{name}: expected an MCMC run of a numpyro_sgd kernel; use az.from_numpyro for other kernels."
        )
    require_run(mcmc, name)
    return kernel


def pointwise_log_likelihood(kernel, samples, model_args=(), model_kwargs=None, chunk_size=10_000,
                             batch_ndims=2):
    """Full-data pointwise log-likelihood of every observed site in a subsample plate.

    The plate is set to chunks of ``chunk_size`` consecutive indices (never to a random
    minibatch), so memory stays O(draws × chunk) per evaluation; the result for site ``k`` in a
    plate of size N has shape ``batch + (N,)`` (event dimensions summed). See
    :func:`log_likelihood_chunks` to reduce the chunks without keeping them.

    :param kernel: a numpyro_sgd kernel after ``init`` (e.g. ``mcmc.sampler``).
    :param dict samples: constrained samples with ``batch_ndims`` leading dimensions.
    """
    batch_shape = next(iter(samples.values())).shape[:batch_ndims]
    pieces = {}
    for _, _, chunk in log_likelihood_chunks(kernel, samples, model_args, model_kwargs, chunk_size, batch_ndims):
        for k, v in chunk.items():
            pieces.setdefault(k, []).append(np.asarray(v))
    return {k: np.concatenate(v, axis=-1).reshape(batch_shape + (-1,)) for k, v in pieces.items()}


def trace_at_draw(kernel, samples, model_args, model_kwargs, batch_ndims=2):
    """The model traced once with every subsample plate at all its N indices and the latent sites
    at the first draw of ``samples``: no site is sampled, so improper priors (``ImproperUniform``)
    trace, and each plate site records the size the model declares for these arguments."""
    from ..data.model_args import as_jax_args
    from ..model.discovery import SetPlateIndices

    model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
    potential = kernel.potential
    draw = {k: jnp.asarray(v)[(0,) * batch_ndims] for k, v in samples.items() if k in potential.view.names}
    model = handlers.substitute(SetPlateIndices(kernel.subsampled_model, indices=potential.full_indices()), data=draw)
    return handlers.trace(handlers.seed(model, 0)).get_trace(*model_args, **model_kwargs)


def run_model_args(run, samples, model_args=None, model_kwargs=None, batch_ndims=2, name="to_arviz"):
    """``(model_args, model_kwargs)`` to evaluate a finished run's model with, checked against it.

    Default (both None): the arguments of the run itself, which NumPyro's ``MCMC.run`` keeps
    (a kernel object shared by several ``MCMC`` runs holds only the latest run's). Either way
    the model is traced once at the first draw and every subsample plate must declare the size
    N the run used, and must not be longer than the data it indexes.

    :param run: a finished ``MCMC`` run of a numpyro_sgd kernel, or such a kernel after ``init``.
    :raises ValueError: naming the plate and both sizes.
    """
    from ..data.model_args import as_jax_args
    from ..model.discovery import check_plate_sizes

    kernel = getattr(run, "sampler", run)
    given = model_args is not None or model_kwargs is not None
    if not given:
        if hasattr(run, "sampler"):
            model_args, model_kwargs = getattr(run, "_args", ()), getattr(run, "_kwargs", {})
        else:
            model_args, model_kwargs = kernel.run_args
    model_args, model_kwargs = as_jax_args((tuple(model_args or ()), dict(model_kwargs or {})))
    trace = trace_at_draw(kernel, samples, model_args, model_kwargs, batch_ndims)
    for plate in kernel.potential.plates:
        size = int(trace[plate.name]["args"][0]) if plate.name in trace else None
        if size == plate.size:
            continue
        if given:
            raise ValueError(
                f"{name}: plate '{plate.name}' has size {size} with the model arguments given, but the run used "
                f"N = {plate.size}; pass the run's own model arguments, or none (the run's are used).")
        raise ValueError(
            f"{name}: plate '{plate.name}' has size {size} with this run's model arguments, but the kernel was "
            f"initialised since with N = {plate.size} (a later MCMC run on other data with the same kernel "
            "object), so its plates no longer describe this run. Export each run before the next run of a shared "
            "kernel, or give each MCMC its own kernel.")
    try:
        check_plate_sizes(kernel.potential, model_args, model_kwargs)
    except ValueError as e:
        raise ValueError(f"{name}: the model arguments do not fit the run: {e}") from e
    return model_args, model_kwargs


def transforms_from(runs, transforms):
    if transforms is not None:
        return transforms
    from ..driver.kernel import SGKernel

    for run in runs.values():
        kernel = getattr(run, "sampler", None)
        if isinstance(kernel, SGKernel) and kernel.is_initialized:
            return kernel.potential.transforms
    return {}


def site_arrays(x):
    """dict site -> (chains, draws, ...) numpy arrays from an MCMC run, ArviZ data or a dict."""
    if hasattr(x, "get_samples"):
        return {k: np.asarray(v) for k, v in x.get_samples(group_by_chain=True).items()}
    try:  # ArviZ InferenceData / DataTree
        post = x["posterior"]
        return {k: np.asarray(post[k].values) for k in post.data_vars}
    except (KeyError, TypeError, AttributeError):
        pass
    if hasattr(x, "files"):  # np.load(...) of an .npz
        return {k: np.asarray(x[k]) for k in x.files if k not in ("param_names", "flat_names")}
    if isinstance(x, dict):
        return {k: np.asarray(v) for k, v in x.items()}
    raise TypeError(f"compare: cannot read draws from {type(x).__name__}")


def draws_of(run, names, transforms=None, unconstrained=False):
    """Draws of ``run`` as an array (chains, draws, P): the sites ``names`` flattened in order,
    optionally mapped to the unconstrained scale with ``transforms`` (site -> transform from
    unconstrained to constrained, e.g. ``kernel.potential.transforms``)."""
    arrays = site_arrays(run)
    cols = []
    for k in names:
        a = arrays[k]
        if unconstrained and transforms and k in transforms:
            a = np.asarray(transforms[k].inv(jnp.asarray(a)))
        cols.append(a.reshape(a.shape[:2] + (-1,)))
    return np.concatenate(cols, axis=-1)
