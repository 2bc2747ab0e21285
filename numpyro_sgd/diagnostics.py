"""How far is it from the truth? ArviZ data, Gaussian KL, moment errors, comparison tables, plots.

* :func:`to_arviz` — ArviZ data of a run of this package's kernels with the *full-data*
  pointwise log-likelihood (computed in chunks), the full observed data and SG sample stats.
  ArviZ 0.23 (``InferenceData``) and 1.x (``DataTree``).
* :func:`gaussian_kl`, :func:`moment_errors` — the papers' accuracy measures.
* :func:`compare` — one table (pandas) with a row per run against a reference (a NUTS run,
  ArviZ data, reference draws such as posteriordb's ``.npz``, or an exact Gaussian).
* :func:`plot_marginals`, :func:`plot_ellipses`, :func:`plot_convergence` — PNGs, headless.
"""

from __future__ import annotations

import math
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.util import find_stack_level

from . import arviz_compat
from .likelihood import log_likelihood_chunks

__all__ = [
    "gaussian_kl",
    "fit_gaussian",
    "moment_errors",
    "pointwise_log_likelihood",
    "log_likelihood_chunks",
    "LOG_LIKELIHOOD_AUTO_MAX_BYTES",
    "to_arviz",
    "draws_of",
    "compare",
    "nuts_reference",
    "plot_marginals",
    "plot_ellipses",
    "plot_convergence",
    "convergence_curve",
    "check_run",
    "run_model_args",
]


# ---------------------------------------------------------------------------- Gaussian KL
def fit_gaussian(x):
    """``(mean, cov)`` from a ``(mean, cov)`` pair or from draws of shape (..., D).

    Leading dimensions of draws (e.g. chains × samples) are flattened; 1-D draws are taken as
    D = 1. The covariance uses the n − 1 denominator.
    """
    if isinstance(x, (tuple, list)) and len(x) == 2:
        mean = np.atleast_1d(np.asarray(x[0], dtype=float))
        cov = np.atleast_2d(np.asarray(x[1], dtype=float))
        if cov.shape != (mean.shape[0], mean.shape[0]):
            raise ValueError(f"gaussian_kl: covariance shape {cov.shape} does not match mean shape {mean.shape}.")
        return mean, cov
    draws = np.asarray(x, dtype=float)
    if draws.ndim == 1:
        draws = draws[:, None]
    draws = draws.reshape(-1, draws.shape[-1])
    if draws.shape[0] < 2:
        raise ValueError("gaussian_kl: need at least 2 draws to fit a Gaussian.")
    return draws.mean(0), np.atleast_2d(np.cov(draws, rowvar=False))


def gaussian_kl(p, q):
    """KL(p ‖ q) between two Gaussians, each a ``(mean, cov)`` pair or draws of shape (..., D).

    KL = ½ [tr(Σ_q⁻¹ Σ_p) + (μ_q − μ_p)ᵀ Σ_q⁻¹ (μ_q − μ_p) − D + ln det Σ_q − ln det Σ_p],
    computed with Cholesky factors. Call it twice for both directions. Fitting a Gaussian to
    n draws biases the KL up by about (D(D+1)/4 + D/2)/n.
    """
    mp, sp = fit_gaussian(p)
    mq, sq = fit_gaussian(q)
    if mp.shape != mq.shape:
        raise ValueError(f"gaussian_kl: dimensions differ ({mp.shape[0]} vs {mq.shape[0]}).")
    d = mp.shape[0]
    lq = np.linalg.cholesky(sq)
    lp = np.linalg.cholesky(sp)
    a = np.linalg.solve(lq, lp)
    diff = np.linalg.solve(lq, mq - mp)
    logdet = 2 * (np.sum(np.log(np.diag(lq))) - np.sum(np.log(np.diag(lp))))
    return 0.5 * (np.sum(a**2) + diff @ diff - d + logdet)


def moment_errors(draws, ref_mean, ref_sd):
    """``(max_j |mean_j − ref_mean_j| / ref_sd_j, max_j |sd_j / ref_sd_j − 1|)`` of draws (..., P)."""
    x = np.asarray(draws, dtype=float).reshape(-1, np.shape(ref_mean)[-1])
    ref_mean, ref_sd = np.asarray(ref_mean, float), np.asarray(ref_sd, float)
    return (float(np.max(np.abs(x.mean(0) - ref_mean) / ref_sd)),
            float(np.max(np.abs(x.std(0, ddof=1) / ref_sd - 1))))


# ---------------------------------------------------------------------------- ArviZ
def require_run(run, name, who="this MCMC"):
    """Refuse an ``MCMC`` whose ``run`` has not been called (it has no draws and no last state:
    NumPyro would fail later with a ``TypeError`` or ``AttributeError`` on ``None``)."""
    if hasattr(run, "get_samples") and hasattr(run, "last_state") and run.last_state is None:
        raise ValueError(f"{name}: {who} has not been run; call mcmc.run(rng_key, *model_args) first.")


def _kernel_of(mcmc, name="to_arviz"):
    """The numpyro_sgd kernel of a finished ``MCMC`` run (``name``: the calling function, for messages)."""
    from .base import SGKernel

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


def _trace_at_draw(kernel, samples, model_args, model_kwargs, batch_ndims=2):
    """The model traced once with every subsample plate at all its N indices and the latent sites
    at the first draw of ``samples``: no site is sampled, so improper priors (``ImproperUniform``)
    trace, and each plate site records the size the model declares for these arguments."""
    from .potential import _SetPlateIndices, as_jax_args

    model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
    potential = kernel.potential
    draw = {k: jnp.asarray(v)[(0,) * batch_ndims] for k, v in samples.items() if k in potential.view.names}
    model = handlers.substitute(_SetPlateIndices(kernel.subsampled_model, indices=potential.full_indices()), data=draw)
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
    from .potential import _check_plate_sizes, as_jax_args

    kernel = getattr(run, "sampler", run)
    given = model_args is not None or model_kwargs is not None
    if not given:
        if hasattr(run, "sampler"):
            model_args, model_kwargs = getattr(run, "_args", ()), getattr(run, "_kwargs", {})
        else:
            model_args, model_kwargs = kernel.run_args
    model_args, model_kwargs = as_jax_args((tuple(model_args or ()), dict(model_kwargs or {})))
    trace = _trace_at_draw(kernel, samples, model_args, model_kwargs, batch_ndims)
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
        _check_plate_sizes(kernel.potential, model_args, model_kwargs)
    except ValueError as e:
        raise ValueError(f"{name}: the model arguments do not fit the run: {e}") from e
    return model_args, model_kwargs


def _observed_data(kernel, samples, model_args, model_kwargs):
    tr = _trace_at_draw(kernel, samples, model_args, model_kwargs)
    potential = kernel.potential
    out = {}
    for sites in potential.observed.values():
        for k in sites:
            if tr[k]["fn"].__class__.__name__ != "Unit":  # numpyro.factor sites have no data
                out[k] = np.asarray(tr[k]["value"])
    return out


#: ``to_arviz(log_likelihood="auto")`` stores the pointwise log-likelihood only up to this size
#: (chains × draws × N × 4 bytes; 512 MiB).
LOG_LIKELIHOOD_AUTO_MAX_BYTES = 512 * 2**20


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
    kernel = _kernel_of(mcmc)
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


# ---------------------------------------------------------------------------- comparison
def _transforms_from(runs, transforms):
    if transforms is not None:
        return transforms
    from .base import SGKernel

    for run in runs.values():
        kernel = getattr(run, "sampler", None)
        if isinstance(kernel, SGKernel) and kernel.is_initialized:
            return kernel.potential.transforms
    return {}


def _site_arrays(x):
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
    arrays = _site_arrays(run)
    cols = []
    for k in names:
        a = arrays[k]
        if unconstrained and transforms and k in transforms:
            a = np.asarray(transforms[k].inv(jnp.asarray(a)))
        cols.append(a.reshape(a.shape[:2] + (-1,)))
    return np.concatenate(cols, axis=-1)


def _ess(draws):
    """min bulk and min tail ESS over the columns of (chains, draws, P)."""
    bulk = [arviz_compat.ess(draws[..., j], method="bulk") for j in range(draws.shape[-1])]
    # tail ESS = min of the 5 % and 95 % quantile ESS (ArviZ's default, explicit for ArviZ 1.x arrays)
    tail = [arviz_compat.ess(draws[..., j], method="tail", prob=(0.05, 0.95)) for j in range(draws.shape[-1])]
    return min(bulk), min(tail)


def _data_passes(run):
    state = getattr(run, "last_state", None)
    if state is not None and hasattr(state, "data_passes"):
        return float(np.sum(np.asarray(state.data_passes)))
    try:  # NUTS with num_steps collected: every leapfrog step is one full-data gradient
        return float(np.sum(np.asarray(run.get_extra_fields()["num_steps"])))
    except (AttributeError, KeyError, TypeError):
        return float("nan")


def _divergences(run):
    state = getattr(run, "last_state", None)
    if state is not None and hasattr(state, "num_divergences"):
        return int(np.sum(np.asarray(state.num_divergences)))
    try:
        return int(np.sum(np.asarray(run.get_extra_fields()["diverging"])))
    except (AttributeError, KeyError, TypeError):
        return -1


def _check_sites(runs, names):
    """The first run's site arrays, after checking that every run has the sites ``names``."""
    first = None
    for name, run in runs.items():
        arrays = _site_arrays(run)
        missing = [k for k in names if k not in arrays]
        if missing:
            raise ValueError(f"compare: run {name!r} has no site {missing[0]!r} (its sites: {sorted(arrays)}); pass "
                             "names=[...] with the sites that every run and the reference share.")
        first = arrays if first is None else first
    return first


def _check_reference_sites(runs, reference, transforms):
    """With the default ``names`` (the reference's sites): every latent site of every run must be
    among them, so that no site of a run drops out of the comparison unsaid."""
    ref_sites = _site_arrays(reference)
    for name, run in runs.items():
        arrays = _site_arrays(run)
        latent = sorted(k for k in arrays if k in (transforms or arrays))
        missing = [k for k in latent if k not in ref_sites]
        if missing:
            raise ValueError(
                f"compare: the reference has no site {missing[0]!r} of run {name!r} (the reference's sites: "
                f"{sorted(ref_sites)}; the run's: {latent}); pass "
                "a reference with draws of every latent site of the runs, or names=[...] with the sites that every "
                "run and the reference share.")


def _reference_draws(reference, first, names):
    """The reference's draws of ``names`` as a dict of (chains, draws, ...) arrays: a site of
    shape (draws, ...) (the event shape of the runs' site, no chain dimension) is one chain."""
    arrays = _site_arrays(reference)
    out = {}
    for k in names:
        if k not in arrays:
            raise ValueError(f"compare: the reference has no site {k!r} (its sites: {sorted(arrays)}); pass "
                             "names=[...] with the sites that every run and the reference share.")
        a, event = arrays[k], first[k].shape[2:]
        if a.ndim == len(event) + 1 and a.shape[1:] == event:
            a = a[None]
        elif a.ndim != len(event) + 2 or a.shape[2:] != event:
            raise ValueError(
                f"compare: the reference's site {k!r} has shape {a.shape}; expected (chains, draws) + {event} or "
                f"(draws,) + {event}, the shape of the runs' draws of {k!r}.")
        out[k] = a
    return out


def _gaussian_problem(who, fit, labels):
    """A warning text if the Gaussian ``fit`` = (mean, cov) of ``who``'s unconstrained draws has a
    non-finite moment or a coordinate of zero variance (None if not)."""
    mean, cov = fit
    var = np.diag(cov)
    bad = ~(np.isfinite(mean) & np.isfinite(var))
    if np.any(bad):
        j = int(np.argmax(bad))
        return (f"compare: {who} has non-finite moments in {labels[j]} (mean {mean[j]:.3g}, variance {var[j]:.3g}, "
                "unconstrained): its draws are non-finite or so large that their moments overflow (a run that "
                "diverged), so its KL and moment errors are NaN or inf. Check the run (divergences, step size) "
                "before comparing it.")
    if np.any(var <= 0):
        j = int(np.argmax(var <= 0))
        return (f"compare: {who} has zero variance in {labels[j]} (unconstrained): every draw is the same there "
                "(a frozen chain: every step rejected, a step size of 0, or a preconditioner that freezes the "
                "direction), so its Gaussian fit is singular and its KL is inf.")
    return None


def _kl_pair(q, ref, problem, who, labels):
    """(KL(q ‖ ref), KL(ref ‖ q)) of two Gaussian fits, with a warning instead of an error where a
    fit is degenerate: NaN for non-finite moments, inf for a singular covariance."""
    if problem is None:
        try:
            return gaussian_kl(q, ref), gaussian_kl(ref, q)
        except np.linalg.LinAlgError:  # a zero-variance direction that no coordinate shows alone
            vals, vecs = np.linalg.eigh(q[1])
            problem = (f"compare: {who} has a zero-variance direction (its covariance is singular; the direction "
                       f"loads most on {labels[int(np.argmax(np.abs(vecs[:, 0])))]}, unconstrained): the chain "
                       "never moved along it, so its KL is inf.")
    warnings.warn(problem, UserWarning, stacklevel=find_stack_level())
    value = float("nan") if "non-finite" in problem else float("inf")
    return value, value


def nuts_reference(run, *, num_warmup=1000, num_samples=1000, num_chains=None, rng_key=None, **nuts_options):
    """A full-data NUTS run of the model of a numpyro_sgd ``run``: the same model (its
    subsample plates set to all N indices: :attr:`~numpyro_sgd.SGKernel.model`) and the same
    model arguments, so no second copy of the model is needed.

    :param run: a finished ``MCMC`` run of a numpyro_sgd kernel.
    :param num_chains: default: the run's number of chains (sequential).
    :param rng_key: default ``jax.random.key(0)``.
    :param nuts_options: passed to :class:`numpyro.infer.NUTS`.
    :return: the finished NUTS ``MCMC``.
    """
    from numpyro.infer import MCMC, NUTS

    kernel = _kernel_of(run, "nuts_reference")
    args, kwargs = run_model_args(run, run.get_samples(group_by_chain=True), name="nuts_reference")
    nuts = MCMC(NUTS(kernel.model, **nuts_options), num_warmup=num_warmup, num_samples=num_samples,
                num_chains=run.num_chains if num_chains is None else num_chains, chain_method="sequential",
                progress_bar=False)
    nuts.run(jax.random.key(0) if rng_key is None else rng_key, *args, **kwargs)
    return nuts


def compare(runs, reference, *, names=None, transforms=None, wall_times=None, data_passes=None):
    """One row per run: how far its draws are from ``reference``.

    Columns: ``kl_q_ref`` = KL(q ‖ ref) and ``kl_ref_q`` = KL(ref ‖ q) between Gaussians fitted on
    the unconstrained scale; ``max_mean_err_sd`` = ``max_j |mean_j − ref_j| / ref_sd_j`` and
    ``max_sd_rel_err`` = ``max_j |sd_j/ref_sd_j − 1|`` (constrained scale for draw references,
    unconstrained for a Gaussian reference); ``min_ess_bulk``, ``min_ess_tail`` (ArviZ);
    ``ess_per_s``, ``ess_per_pass`` (min bulk ESS per wall second / per data pass);
    ``wall_s``; ``data_passes`` (per-datum gradients / N summed over chains; NUTS: leapfrog
    steps, if ``num_steps`` was collected); ``divergences``.

    :param dict runs: name -> MCMC run, ArviZ data or dict of (chains, draws, ...) arrays.
    :param reference: an MCMC run (e.g. long NUTS), ArviZ data, a dict / ``np.load`` of reference
        draws (chains, draws, ...), an exact Gaussian ``(mean, cov)`` on the unconstrained scale,
        or ``"nuts"``: a full-data NUTS run of the first numpyro_sgd run's own model
        (``nuts_reference``, 1,000 warmup + 1,000 draws per chain).
    :param names: sites to compare (default: the reference's sites, or the first run's for a
        Gaussian reference; a draw reference must then hold every latent site of every run).
    :param transforms: site -> transform to the support (default: from the first numpyro_sgd run).
    :param dict wall_times: name -> seconds. :param dict data_passes: name -> passes (overrides).
    :return: ``pandas.DataFrame`` indexed by run name.
    :raises ValueError: an ``MCMC`` (run or reference) that has not been run, or a site missing
        from a run or from the reference (naming it), before any compute.
    """
    import pandas as pd

    for name, run in runs.items():
        require_run(run, "compare", f"the MCMC of run {name!r}")
    require_run(reference, "compare", "the reference MCMC")
    if isinstance(reference, str):
        if reference != "nuts":
            raise ValueError(f"compare: reference={reference!r}; the only named reference is 'nuts' (a full-data "
                             "NUTS run of the SG run's model); otherwise pass draws, a run or (mean, cov).")
        sg = [r for r in runs.values() if getattr(r, "sampler", None) is not None and hasattr(r.sampler, "potential")]
        if not sg:
            raise ValueError("compare: reference='nuts' needs an MCMC run of a numpyro_sgd kernel among the runs.")
        reference = nuts_reference(sg[0])
    transforms = _transforms_from(runs, transforms)
    gaussian_ref = isinstance(reference, (tuple, list)) and len(reference) == 2
    default_names = names is None
    if default_names:
        src = next(iter(runs.values())) if gaussian_ref else reference
        names = sorted(k for k in _site_arrays(src) if k in (transforms or _site_arrays(src)))
    first = _check_sites(runs, names)
    if default_names and not gaussian_ref:
        _check_reference_sites(runs, reference, transforms)
    if not names:
        raise ValueError("compare: no site to compare (names=[] or no latent site of the runs in the reference); "
                         "pass names=[...] with the sites that every run and the reference share.")
    if gaussian_ref:
        ref_u = fit_gaussian(reference)
        ref_mean, ref_sd = ref_u[0], np.sqrt(np.diag(ref_u[1]))
    else:
        reference = _reference_draws(reference, first, names)
        with np.errstate(all="ignore"):
            ref_c = draws_of(reference, names).reshape(-1, sum(
                int(np.prod(reference[k].shape[2:], dtype=int)) for k in names))
            ref_u = draws_of(reference, names, transforms, unconstrained=True)
            ref_u = fit_gaussian(ref_u.reshape(-1, ref_u.shape[-1]))
            ref_mean, ref_sd = ref_c.mean(0), ref_c.std(0, ddof=1)
    labels = _labels(first, names)
    ref_problem = _gaussian_problem("the reference", ref_u, labels)
    rows = {}
    for name, run in runs.items():
        if _is_sg_run(run):
            check_run(run, gradient=False)  # warns for rejected steps, R-hat, frozen directions
        with np.errstate(all="ignore"):
            u = fit_gaussian(draws_of(run, names, transforms, unconstrained=True))
        problem = ref_problem or _gaussian_problem(f"run {name!r}", u, labels)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            if problem:  # NaN / inf below come with the warning that says why
                warnings.simplefilter("ignore", RuntimeWarning)
            c = draws_of(run, names, transforms, unconstrained=True) if gaussian_ref else draws_of(run, names)
            mean_err, sd_err = moment_errors(c, ref_mean, ref_sd)
            bulk, tail = _ess(draws_of(run, names))
        kl_q_ref, kl_ref_q = _kl_pair(u, ref_u, problem, f"run {name!r}", labels)
        wall = (wall_times or {}).get(name, float("nan"))
        passes = (data_passes or {}).get(name, _data_passes(run))
        rows[name] = {
            "kl_q_ref": kl_q_ref,
            "kl_ref_q": kl_ref_q,
            "max_mean_err_sd": mean_err,
            "max_sd_rel_err": sd_err,
            "min_ess_bulk": bulk,
            "min_ess_tail": tail,
            "ess_per_s": bulk / wall if wall == wall else float("nan"),
            "ess_per_pass": bulk / passes if passes and passes == passes else float("nan"),
            "wall_s": wall,
            "data_passes": passes,
            "divergences": _divergences(run),
        }
    return pd.DataFrame.from_dict(rows, orient="index")


# ---------------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _labels(run, names):
    arrays = _site_arrays(run)
    out = []
    for k in names:
        shape = arrays[k].shape[2:]
        n = int(np.prod(shape, dtype=int))
        out += [k] if n == 1 else [f"{k}[{i}]" for i in range(n)]
    return out


def plot_marginals(runs, reference, path, *, names=None, max_params=12, bins=60):
    """Marginal densities of every run overlaid on the reference's, one panel per scalar
    parameter (constrained scale); saved as PNG at ``path``."""
    plt = _pyplot()
    names = names or sorted(_site_arrays(reference))
    ref = draws_of(reference, names).reshape(-1, sum(1 for _ in _labels(reference, names)))
    labels = _labels(reference, names)[:max_params]
    cols = min(4, len(labels))
    rows = math.ceil(len(labels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    for j, label in enumerate(labels):
        ax = axes.flat[j]
        lo, hi = np.quantile(ref[:, j], [0.001, 0.999])
        pad = 0.5 * (hi - lo)
        edges = np.linspace(lo - pad, hi + pad, bins)
        ax.hist(ref[:, j], edges, density=True, color="0.8", label="reference")
        for name, run in runs.items():
            x = draws_of(run, names).reshape(-1, ref.shape[1])[:, j]
            counts, _ = np.histogram(x, edges)
            if counts.sum() == 0:  # entirely outside the reference's range: say so in the legend
                ax.plot([], [], label=f"{name} (off range)")
                continue
            ax.hist(x, edges, density=True, histtype="step", lw=1.3, label=name)
        ax.set_title(label, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ellipse(mean, cov, nsd=2.0, n=200):
    vals, vecs = np.linalg.eigh(cov)
    t = np.linspace(0, 2 * np.pi, n)
    circle = np.stack([np.cos(t), np.sin(t)])
    return (mean[:, None] + vecs @ (nsd * np.sqrt(np.maximum(vals, 0))[:, None] * circle)).T


def plot_ellipses(runs, reference, path, *, names=None, transforms=None):
    """2-sd covariance ellipses of every run and of the reference in the plane spanned by the
    reference's smallest and largest principal directions, unconstrained and centred on the
    reference mean (the view of Mandt et al. Fig. 1); saved as PNG at ``path``."""
    plt = _pyplot()
    transforms = _transforms_from(runs, transforms)
    if isinstance(reference, (tuple, list)) and len(reference) == 2:
        m_ref, c_ref = fit_gaussian(reference)
        names = names or sorted(_site_arrays(next(iter(runs.values()))))
    else:
        names = names or sorted(_site_arrays(reference))
        m_ref, c_ref = fit_gaussian(draws_of(reference, names, transforms, unconstrained=True))
    vals, vecs = np.linalg.eigh(c_ref)
    basis = np.stack([vecs[:, 0], vecs[:, -1]], axis=1)  # smallest, largest
    fig, ax = plt.subplots(figsize=(5, 4.5))
    e = _ellipse(np.zeros(2), basis.T @ c_ref @ basis)
    ax.fill(e[:, 0], e[:, 1], color="0.85", label="reference")
    for name, run in runs.items():
        m, c = fit_gaussian(draws_of(run, names, transforms, unconstrained=True))
        e = _ellipse(basis.T @ (m - m_ref), basis.T @ c @ basis)
        ax.plot(e[:, 0], e[:, 1], lw=1.4, label=name)
    ax.set_xlabel(f"smallest principal direction (sd {np.sqrt(vals[0]):.3g})")
    ax.set_ylabel(f"largest principal direction (sd {np.sqrt(vals[-1]):.3g})")
    ax.set_title("2-sd ellipses, unconstrained scale")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_convergence(curves, path, *, ylabel="KL(q ‖ reference)", logx=True, logy=True):
    """A metric against data passes, one line per run: ``curves`` maps a name to
    ``(data_passes, values)``; saved as PNG at ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, (x, y) in curves.items():
        ax.plot(x, y, marker="o", ms=3, lw=1.3, label=name)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("data passes (per-datum gradients / N)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def convergence_curve(run, reference, *, names=None, transforms=None, num_points=12):
    """KL(q ‖ reference) of the draws collected up to each checkpoint against data passes.

    ``run`` must be an MCMC run of a numpyro_sgd kernel with ``extra_fields=("data_passes",)``
    collected; checkpoints are log-spaced over the collected draws. Returns ``(passes, kl)``.
    """
    transforms = _transforms_from({"run": run}, transforms)
    gaussian_ref = isinstance(reference, (tuple, list)) and len(reference) == 2
    names = names or sorted(_site_arrays(run))
    ref = reference if gaussian_ref else draws_of(reference, names, transforms, unconstrained=True)
    u = draws_of(run, names, transforms, unconstrained=True)
    passes = np.asarray(run.get_extra_fields(group_by_chain=True)["data_passes"])
    n = u.shape[1]
    ends = np.unique(np.geomspace(max(u.shape[-1] + 2, 10), n, num_points).astype(int))
    xs, ys = [], []
    for end in ends:
        xs.append(float(np.sum(passes[:, end - 1])))
        ys.append(gaussian_kl(u[:, :end], ref))
    return np.array(xs), np.array(ys)


# ---------------------------------------------------------------------------- end-of-run checks
#: :func:`check_run` thresholds: split R-hat above, bulk ESS below, mode offset (sds) above
RHAT_MAX, ESS_MIN, MODE_OFFSET_MAX = 1.1, 10.0, 3.0
#: check 5 of :func:`check_run`: the draws' sd along some direction is more than this factor
#: wider, or narrower, than the posterior's curvature at their mean gives (Laplace)
SPREAD_FACTOR_MAX = 2.0
#: and it runs up to this dimension (D forward-mode passes over a few thousand rows)
SPREAD_CHECK_MAX_DIM = 200


def _is_sg_run(run):
    from .base import SGKernel

    return isinstance(getattr(run, "sampler", None), SGKernel) and getattr(run, "_states", None) is not None


def _unconstrained_draws(kernel, samples):
    """{site: (chains, draws, d)} unconstrained draws of the latent sites, from constrained samples."""
    potential = kernel.potential
    out = {}
    for name in potential.view.names:
        value = jnp.asarray(samples[name])
        transform = potential.transforms.get(name)
        u = transform.inv(value) if transform is not None else value
        out[name] = np.asarray(u, np.float64).reshape(value.shape[:2] + (-1,))
    return out


def _full_gradient(kernel, theta, model_args, model_kwargs, params, chunk_size=100_000):
    """∇U(θ) on all the data: one plate of N > ``chunk_size`` rows is summed in chunks as
    Σ_c (K_c/N) ∇Û_{K_c}(θ) (each chunk's potential carries the prior and the scale N/K_c), so no
    N-sized intermediate is built."""
    potential = kernel.potential
    plates = potential.plates
    if len(plates) != 1 or plates[0].size <= chunk_size:
        return jax.grad(potential.full_potential)(theta, model_args, model_kwargs, params)
    (plate,) = plates
    n, m = plate.size, plate.size // chunk_size

    def grad_at(start, size):
        idx = {plate.name: start + jnp.arange(size)}
        return jax.grad(potential.potential)(theta, idx, model_args, model_kwargs, params) * (size / n)

    total = jnp.sum(jax.lax.map(lambda c: grad_at(c * chunk_size, chunk_size), jnp.arange(m)), axis=0)
    rest = n - m * chunk_size
    return total + (grad_at(m * chunk_size, rest) if rest else 0.0)


def _worst(stat, draws, pick):
    """(site, flat index, value) of the coordinate where ``stat`` is worst (``pick``: argmax/argmin)."""
    best = None
    for name, x in draws.items():
        values = np.asarray(stat(x), np.float64).reshape(-1)
        values = np.where(np.isfinite(values), values, -np.inf if pick is np.argmin else np.inf)
        j = int(pick(values))
        if best is None or (values[j] < best[2] if pick is np.argmin else values[j] > best[2]):
            best = (name, j, float(values[j]))
    return best


def _statistic(value):
    """A diagnostic's value as text; a non-finite one (a coordinate with no variance within a
    chain half, where R-hat and ESS divide by zero) says so instead of printing inf."""
    if np.isfinite(value):
        return f"{value:.3g}"
    return "undefined (the coordinate has no variance within a chain half: the chain did not move)"


def _coordinate(draws, name, j):
    return name if draws[name].shape[-1] == 1 else f"{name}[{j}]"


def check_run(mcmc, *, gradient=True, warn=True):
    """End-of-run checks of a numpyro_sgd run; each failed check gives a warning that names the
    problem and what to try. Returns the list of messages (empty: every check passed).

    NumPyro's ``MCMC.run`` gives the kernel no call after its last sample (and a host callback in
    the step would cost a sync per step and keep XLA's compilation cache from storing the loop),
    so these checks run here; :func:`to_arviz` and :func:`compare` run the cheap ones (all but
    ``gradient``) on every numpyro_sgd run they are given. The checks:

    1. *Rejected steps*: SG steps whose potential, gradient or new state was non-finite, or whose
       constrained value left the open support, were not taken (``mcmc.last_state.num_divergences``).
    2. *Not stationary*: split R-hat (Gelman et al. 2013, Sec. 11.4; every chain split in halves,
       so one chain that drifts is caught) above 1.1 on an unconstrained coordinate.
    3. *Frozen directions*: bulk ESS below 10 (or no variance at all) on a coordinate: the chain
       hardly moved in that direction, e.g. a badly scaled posterior under a scalar or diagonal
       preconditioner.
    4. *Away from the mode* (``gradient=True``, one full-data gradient per chain): at each chain's
       mean θ̄ of unconstrained draws with covariance Σ, the full-data gradient g = ∇U(θ̄) ≈ A(θ̄ − θ*)
       near a Gaussian mode, and with Σ ≈ A⁻¹, δ = (gᵀΣg)^½ is the distance of θ̄ from the mode in
       posterior sds; δ > 3 flags a chain that settled away from the posterior (e.g. a warmup that
       did not reach the mode). Skewed posteriors put the mean O(skewness) sds from the mode, far
       below 3.
    5. *Spread against curvature* (``gradient=True``, D ≤ 200): with Σ the draws' covariance
       (pooled over chains) and H ≈ ∇²U(θ̄) estimated on a fixed minibatch of a few thousand
       rows, the eigenvalues of Σ H are the squared sd ratios of the draws to the Laplace
       approximation (1 for a Gaussian posterior; large-N posteriors are close to Gaussian, the
       Bernstein–von Mises regime these kernels are for). A ratio above 2 or below 1/2 flags
       draws much wider (a step size whose minibatch noise inflates the variance) or much
       narrower (a direction frozen by the preconditioner) than the posterior.

    :param mcmc: a finished ``numpyro.infer.MCMC`` run of a numpyro_sgd kernel.
    :param bool gradient: run check 4 (one data pass per chain, computed in chunks).
    :param bool warn: also issue each message as a ``UserWarning``.
    :return: list of str.
    """
    kernel = _kernel_of(mcmc, "check_run")
    name = type(kernel).__name__
    state = mcmc.last_state
    messages = []
    rejected = int(np.sum(np.asarray(state.num_divergences)))
    if rejected:
        steps = int(np.sum(np.asarray(state.i)))
        first = np.asarray(state.first_divergence).reshape(-1)
        first = int(first[first >= 0].min()) if np.any(first >= 0) else -1
        messages.append(
            f"{name}: {rejected} of {steps} SG steps were rejected (first at step {first}): a non-finite "
            "potential, gradient or state, or a constrained value on the edge of its support. Each repeats "
            "the previous draw, so the chain mixes less than it seems. Try a longer warmup, init_params near "
            "the mode, or a smaller step (step_size / target_inflation). Many rejections on a model with "
            "local scale latents (hierarchical scales, horseshoe) mean a funnel that a constant-rate kernel "
            "cannot represent: sample those scales with SGWithinGibbs or use NUTS (docs/robustness.md).")
    samples = mcmc.get_samples(group_by_chain=True)
    draws = _unconstrained_draws(kernel, samples)
    num_draws = next(iter(draws.values())).shape[1] if draws else 0
    if num_draws >= 4:
        from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

        with np.errstate(all="ignore"):  # no variance or overflowing draws: said in words (_statistic)
            site, j, rhat = _worst(split_gelman_rubin, draws, np.argmax)
            ess_worst = _worst(effective_sample_size, draws, np.argmin)
        if not rhat <= RHAT_MAX:
            messages.append(
                f"{name}: split R-hat {_statistic(rhat)} > {RHAT_MAX} for {_coordinate(draws, site, j)} "
                "(unconstrained): "
                "the chain drifts between the halves of the run, or the chains sit in different places, so "
                "the draws are not yet from a stationary law and their means and sds are biased. Try a longer "
                "warmup (warmup_passes), predictors rescaled to unit scale (warmup's first phase moves in absolute "
                "units; keep warmup_newton=True, the default), or init_params near the mode." + _gibbs_hint(kernel))
        site, j, ess = ess_worst
        if not ess >= ESS_MIN:
            messages.append(
                f"{name}: bulk ESS {_statistic(ess)} < {ESS_MIN:g} for {_coordinate(draws, site, j)} "
                "(unconstrained): the "
                "chain hardly moves in this direction (a direction the preconditioner leaves frozen, or a run "
                "shorter than its relaxation time), so estimates along it are unreliable. Try "
                "preconditioner='full', a longer run (num_samples, steps_per_sample), or rescaled predictors.")
        if gradient:
            for check, label in ((_mode_offset_messages, "mode-offset check (4)"),
                                 (_spread_messages, "spread-against-curvature check (5)")):
                messages += _guarded(check, label, kernel, mcmc, state, draws, name)
    if warn:
        for message in messages:
            warnings.warn(message, UserWarning, stacklevel=find_stack_level())
    return messages


def _guarded(check, label, kernel, mcmc, state, draws, name):
    """``check(...)``'s messages, or, when it cannot run on this model or run (it raised, e.g. a
    distribution's argument check at a draws' mean outside a dependent support such as
    ``b ~ Uniform(0, a)``), one message naming the check and why it was skipped: ``check_run``
    never raises on a run it cannot judge, and its other checks still run."""
    try:
        with np.errstate(all="ignore"):  # non-finite values are reported in the messages
            return check(kernel, mcmc, state, draws, name)
    except Exception as err:  # noqa: BLE001 - any failure of a check is reported, not raised
        reason = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        return [f"{name}: check_run's {label} was skipped: it could not be evaluated on this model and run "
                f"({reason}). The run is not judged by this check; compare with NUTS on a subset of the data, "
                "or look at the draws' trace plots."]


def _spread_messages(kernel, mcmc, state, draws, name):
    """Check 5 of :func:`check_run` (the draws' covariance against the inverse Hessian at their mean)."""
    from .potential import MinibatchOracle

    potential = kernel.potential
    if getattr(kernel, "hyperparameters", None) is not None or potential.dim > SPREAD_CHECK_MAX_DIM:
        return []
    names = potential.view.names
    if set(names) != set(draws):  # a wrapper whose draws hold sites the potential does not
        return []
    model_args, model_kwargs = run_model_args(mcmc, mcmc.get_samples(group_by_chain=True), name="check_run")
    flat = np.concatenate([draws[k] for k in names], axis=-1)
    x = flat.reshape(-1, flat.shape[-1])
    cov = np.atleast_2d(np.cov(x, rowvar=False))
    oracle = MinibatchOracle(potential, model_args, model_kwargs)
    theta = jnp.asarray(x.mean(0), jnp.result_type(float))  # float32 unless x64 is on
    hessian = np.asarray(oracle.hessian_estimate(theta), np.float64)
    try:
        root = np.linalg.cholesky(cov + 1e-300 * np.eye(len(cov)))
    except np.linalg.LinAlgError:
        return []  # a degenerate covariance: the bulk-ESS check has already named it
    values, vectors = np.linalg.eigh(root.T @ (0.5 * (hessian + hessian.T)) @ root)
    if not np.all(np.isfinite(values)) or values[0] <= 0:
        return []  # no positive-definite curvature at the mean: the Laplace comparison does not apply
    ratios = np.sqrt(values)  # the draws' sd over the Laplace sd along each direction
    messages = []
    for ratio, vector in ((ratios[-1], vectors[:, -1]), (ratios[0], vectors[:, 0])):
        if 1.0 / SPREAD_FACTOR_MAX <= ratio <= SPREAD_FACTOR_MAX:
            continue
        j = int(np.argmax(np.abs(root @ vector)))
        site, offset = _site_of(draws, names, j)
        wide = ratio > 1
        messages.append(
            f"{name}: the draws' sd is {ratio:.3g}× the posterior's along a direction led by "
            f"{_coordinate(draws, site, offset)} (unconstrained; Laplace approximation from the Hessian at "
            "the draws' mean): the draws are " + (
                "too wide, e.g. a step size whose minibatch noise inflates the variance. Leave step_size unset "
                "(the default keeps the inflation at target_inflation) or lower it." if wide else
                "too narrow, e.g. a direction the preconditioner leaves frozen or a run shorter than its "
                "relaxation time. Try preconditioner='full' or a longer run."))
    return messages


def _site_of(draws, names, j):
    """(site, index within the site) of flat coordinate ``j``."""
    for name in names:
        size = draws[name].shape[-1]
        if j < size:
            return name, j
        j -= size
    raise IndexError(j)


def _mode_offset_messages(kernel, mcmc, state, draws, name):
    model_args, model_kwargs = run_model_args(mcmc, mcmc.get_samples(group_by_chain=True), name="check_run")
    flat = np.concatenate([draws[k] for k in kernel.potential.view.names], axis=-1)  # (chains, draws, D)
    hyperparameters = getattr(kernel, "hyperparameters", None)
    messages = []
    for c in range(flat.shape[0]):
        x = flat[c]
        params = None
        if hyperparameters is not None:
            params = hyperparameters(state if np.ndim(state.i) == 0 else jax.tree.map(lambda v, c=c: v[c], state))
        g = np.asarray(_full_gradient(kernel, jnp.asarray(x.mean(0)), model_args, model_kwargs, params), np.float64)
        cov = np.cov(x, rowvar=False).reshape(x.shape[1], x.shape[1]) if x.shape[1] <= 2000 else None
        if not np.all(np.isfinite(g)):
            messages.append(
                f"{name}: the full-data gradient at chain {c}'s mean is not finite, so its distance from the mode "
                "cannot be measured: the mean of the draws lies where the model's density is zero or undefined "
                "(e.g. outside a dependent support such as b ~ Uniform(0, a), or after rejected steps). Look at "
                "the draws of each site; try init_params near the mode or a longer warmup (warmup_passes).")
            continue
        offset = math.sqrt(max(float(g @ cov @ g) if cov is not None else float(np.sum(g**2 * x.var(0))), 0.0))
        if not offset <= MODE_OFFSET_MAX:
            messages.append(
                f"{name}: chain {c}'s mean is {offset:.3g} posterior sds from the mode (full-data gradient at "
                "the mean, in units of the draws' covariance): the chain settled away from the posterior, "
                "e.g. after a warmup that did not reach the mode. Try a longer warmup (warmup_passes), "
                "predictors rescaled to unit scale (keep warmup_newton=True, the default), or init_params near "
                "the mode."
                + _gibbs_hint(kernel))
    return messages


def _gibbs_hint(kernel):
    """The causes to name first for SGWithinGibbs: data far from unit scale (the group latents
    start on the unit scale, the hyperparameters are drawn given them and collapse, and a
    collapsed group scale pins the latents; measured on the OSIC-shaped model in ml), and too few
    rows of each group per minibatch (2.8 per group: group sds up to 20× NUTS's, mode offsets of
    7 and 170 sds)."""
    from .gibbs import SGWithinGibbs

    if not isinstance(kernel, SGWithinGibbs):
        return ""
    hint = (" With SGWithinGibbs, first put the outcome (not only the predictors) on unit scale: the group "
            "latents start on the unit scale, the hyperparameters are drawn given latents that have not yet "
            "reached the data, and a collapsed group scale pins them there (docs/results/hierarchical.md).")
    if kernel.group_warning is not None:  # the group-size cause applies: init found it
        hint += (" Groups with too few rows per minibatch also give this (init warned: "
                 + kernel.group_warning.removeprefix("SGWithinGibbs: ") + ")")
    return hint
