"""Runs against a reference: Gaussian fits and KL divergences, moment errors, ``compare``'s table,
a NUTS reference run and convergence curves.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np
from numpyro.util import find_stack_level

from . import arviz_compat
from .run_checks import check_run, is_sg_run
from .runs import (
    draws_of,
    kernel_of,
    require_run,
    run_model_args,
    site_arrays,
    transforms_from,
)

__all__ = ["run_labels", "fit_gaussian", "gaussian_kl", "moment_errors", "nuts_reference", "compare", "convergence_curve"]


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
        arrays = site_arrays(run)
        missing = [k for k in names if k not in arrays]
        if missing:
            raise ValueError(f"compare: run {name!r} has no site {missing[0]!r} (its sites: {sorted(arrays)}); pass "
                             "names=[...] with the sites that every run and the reference share.")
        first = arrays if first is None else first
    return first

def _check_reference_sites(runs, reference, transforms):
    """With the default ``names`` (the reference's sites): every latent site of every run must be
    among them, so that no site of a run drops out of the comparison unsaid."""
    ref_sites = site_arrays(reference)
    for name, run in runs.items():
        arrays = site_arrays(run)
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
    arrays = site_arrays(reference)
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

    kernel = kernel_of(run, "nuts_reference")
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
    transforms = transforms_from(runs, transforms)
    gaussian_ref = isinstance(reference, (tuple, list)) and len(reference) == 2
    default_names = names is None
    if default_names:
        src = next(iter(runs.values())) if gaussian_ref else reference
        names = sorted(k for k in site_arrays(src) if k in (transforms or site_arrays(src)))
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
    labels = run_labels(first, names)
    ref_problem = _gaussian_problem("the reference", ref_u, labels)
    rows = {}
    for name, run in runs.items():
        if is_sg_run(run):
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

def convergence_curve(run, reference, *, names=None, transforms=None, num_points=12):
    """KL(q ‖ reference) of the draws collected up to each checkpoint against data passes.

    ``run`` must be an MCMC run of a numpyro_sgd kernel with ``extra_fields=("data_passes",)``
    collected; checkpoints are log-spaced over the collected draws. Returns ``(passes, kl)``.
    """
    transforms = transforms_from({"run": run}, transforms)
    gaussian_ref = isinstance(reference, (tuple, list)) and len(reference) == 2
    names = names or sorted(site_arrays(run))
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

def run_labels(run, names):
    arrays = site_arrays(run)
    out = []
    for k in names:
        shape = arrays[k].shape[2:]
        n = int(np.prod(shape, dtype=int))
        out += [k] if n == 1 else [f"{k}[{i}]" for i in range(n)]
    return out
