"""A run as ArviZ ``InferenceData`` (:func:`to_arviz`), at large N without the N-sized groups.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
from numpyro.util import find_stack_level

from . import arviz_compat
from .run_checks import check_run
from .runs import (
    kernel_of,
    pointwise_log_likelihood,
    run_model_args,
    trace_at_draw,
)

__all__ = ["LOG_LIKELIHOOD_AUTO_MAX_BYTES", "to_arviz"]

#: ``to_arviz(log_likelihood="auto")`` stores the pointwise log-likelihood only up to this size
#: (chains × draws × N × 4 bytes; 512 MiB).
LOG_LIKELIHOOD_AUTO_MAX_BYTES = 512 * 2**20


def _observed_data(kernel, samples, model_args, model_kwargs):
    tr = trace_at_draw(kernel, samples, model_args, model_kwargs)
    potential = kernel.potential
    out = {}
    for sites in potential.observed.values():
        for k in sites:
            if tr[k]["fn"].__class__.__name__ != "Unit":  # numpyro.factor sites have no data
                out[k] = np.asarray(tr[k]["value"])
    return out

def _pointwise_bytes(kernel, chains, draws):
    """Bytes of the (chains, draws, N) float32 pointwise log-likelihood of every observed site."""
    potential = kernel.potential
    return sum(4 * chains * draws * p.size * len(potential.observed[p.name]) for p in potential.plates)

def to_arviz(mcmc, *args, chunk_size=10_000, log_likelihood="auto", **kwargs):
    """ArviZ data of an ``MCMC`` run of a numpyro_sgd kernel, correct for subsampled models.

    Groups: ``posterior`` (constrained samples), ``log_likelihood`` (full-data pointwise, shape
    (chains, draws, N) per observed site, computed in chunks; ``az.loo`` works on it),
    ``observed_data`` (all N observations), ``sample_stats`` (``diverging``, ``data_passes`` and
    ``potential_energy`` when collected as extra fields, the frozen ``step_size``), and the
    attributes ``num_divergences`` and ``data_passes`` of the final state.

    :param mcmc: a finished :class:`numpyro.infer.MCMC` run of a numpyro_sgd kernel.
    :param args: the model arguments, with ``kwargs`` the keyword ones (default: those of
        ``mcmc``'s own last ``run``, even if its kernel object was used by another ``MCMC`` since).
        Their plate sizes must be those of the run (``run_model_args``; a ``ValueError`` otherwise).
    :param int chunk_size: data points per evaluation of the log-likelihood.
    :param log_likelihood: ``True``: add ``log_likelihood`` and ``observed_data``; ``False``: leave
        them out; ``"auto"`` (default): add them only if chains × draws × N × 4 bytes (summed over
        the observed sites) is at most ``LOG_LIKELIHOOD_AUTO_MAX_BYTES`` (512 MiB), else leave
        them out with a ``UserWarning`` saying how large they would be. At large N use
        :func:`numpyro_sgd.loo_subsample`, whose memory does not grow with N.
    :return: ``arviz.InferenceData`` (ArviZ 0.23) or ``xarray.DataTree`` (ArviZ 1.x).
    """
    kernel = kernel_of(mcmc)
    if getattr(mcmc, "_states", None) is None or not kernel.is_initialized:
        raise ValueError("to_arviz: this MCMC has not been run; call mcmc.run(rng_key, *model_args) first.")
    check_run(mcmc, gradient=False)  # warns for rejected steps, R-hat, frozen directions
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    groups = {"posterior": samples}
    extra = {k: np.asarray(v) for k, v in mcmc.get_extra_fields(group_by_chain=True).items()}
    stats = {}
    for name in ("diverging", "data_passes", "potential_energy"):
        if name in extra:
            stats[name] = extra[name]
    last = mcmc.last_state
    step = getattr(last.kernel_state, "step_size", None)
    chains, draws = next(iter(samples.values())).shape[:2]
    if step is not None:
        step = np.broadcast_to(np.asarray(step, float).reshape(-1)[:chains], (chains,))
        stats["step_size"] = np.repeat(step[:, None], draws, axis=1)
    groups["sample_stats"] = stats
    if log_likelihood not in (True, False, "auto"):
        raise ValueError(f"to_arviz: log_likelihood must be True, False or 'auto', got {log_likelihood!r}.")
    if log_likelihood == "auto":
        size = _pointwise_bytes(kernel, chains, draws)
        log_likelihood = size <= LOG_LIKELIHOOD_AUTO_MAX_BYTES
        if not log_likelihood:
            warnings.warn(
                f"to_arviz: the pointwise log-likelihood would take {size / 2**20:,.0f} MiB "
                f"(chains × draws × N × 4 bytes, above LOG_LIKELIHOOD_AUTO_MAX_BYTES = "
                f"{LOG_LIKELIHOOD_AUTO_MAX_BYTES / 2**20:,.0f} MiB), so the log_likelihood and observed_data "
                "groups are left out; pass log_likelihood=True to compute them anyway, or use "
                "numpyro_sgd.loo_subsample for leave-one-out cross-validation at large N.",
                UserWarning, stacklevel=find_stack_level())
    if log_likelihood is True:
        size, memory = _pointwise_bytes(kernel, chains, draws), _physical_memory_bytes()
        if memory and size > memory / 2:
            raise ValueError(
                f"to_arviz: the pointwise log-likelihood would take {size / 2**30:,.1f} GiB (chains × draws × N × "
                f"4 bytes), more than half of this machine's {memory / 2**30:,.1f} GiB. Use "
                "numpyro_sgd.loo_subsample for leave-one-out cross-validation at large N, or thin the draws "
                "(to_arviz of fewer draws), or pass log_likelihood=False.")
    if log_likelihood:
        args, kwargs = run_model_args(mcmc, samples, *((args, kwargs) if args or kwargs else (None, None)))
        groups["log_likelihood"] = pointwise_log_likelihood(kernel, samples, args, kwargs, chunk_size)
        groups["observed_data"] = _observed_data(kernel, samples, args, kwargs)
    attrs = {
        "inference_library": "numpyro_sgd",
        "kernel": type(kernel).__name__,
        "num_divergences": int(np.sum(np.asarray(last.num_divergences))),
        "data_passes": float(np.sum(np.asarray(last.data_passes))),
    }
    return arviz_compat.from_dict(groups, attrs=attrs)

def _physical_memory_bytes():
    """This machine's memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
