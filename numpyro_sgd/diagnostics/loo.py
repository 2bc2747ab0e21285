"""Leave-one-out cross-validation at large N: PSIS-LOO on a subsample, a difference estimator for the rest.

Full PSIS-LOO needs the draws × N pointwise log-likelihood. Here only m subsampled observations
get it; every other observation contributes a cheap approximation π̃_i of its elpd_loo term,
streamed over the data in chunks, so memory is O(draws × (m + chunk)) whatever N is.

* :func:`loo_subsample` — elpd_loo, its SE, the subsampling SE, p_loo and Pareto k of one model.
* :func:`compare_loo` — a table of several models, with the elpd difference and its SE estimated
  from the same subsample (the difference estimator applied to pointwise differences).

ArviZ 0.23 has no subsampled LOO; ArviZ 1.x's arviz-stats has one (Python >= 3.12 only), which
needs the full (draws, N) log-likelihood in memory. Pareto smoothing is the installed ArviZ's
(:func:`numpyro_sgd.diagnostics.arviz_compat.psislw`), so with all N observations the result is
``arviz.loo``'s. The formulas follow ref [2] (and R's ``loo`` package, ``loo_subsample`` with
``estimator = "diff_srs"``); the code is this package's own.

**References:**

1. *Bayesian leave-one-out cross-validation for large data*, Måns Magnusson, Michael Riis
   Andersen, Johan Jonasson, Aki Vehtari (ICML 2019).
2. *Leave-one-out cross-validation for Bayesian model comparison in large data*, Måns Magnusson,
   Michael Riis Andersen, Johan Jonasson, Aki Vehtari (AISTATS 2020).
3. *Practical Bayesian model evaluation using leave-one-out cross-validation and WAIC*, Aki
   Vehtari, Andrew Gelman, Jonah Gabry (Statistics and Computing 2017).
4. *Pareto smoothed importance sampling*, Aki Vehtari, Daniel Simpson, Andrew Gelman, Yuling Yao,
   Jonah Gabry (JMLR 2024).
5. *Stochastic gradient descent as approximate Bayesian inference*, Stephan Mandt, Matthew D.
   Hoffman, David M. Blei (JMLR 2017).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from numpyro.util import find_stack_level

from ..model.likelihood import log_likelihood_chunks
from . import arviz_compat
from .compare import fit_gaussian
from .runs import require_run, run_model_args

__all__ = ["APPROXIMATIONS", "LooSubsample", "loo_subsample"]

#: The cheap approximations π̃_i of elpd_loo,i (ref [1], Sec. 3.2): ``"plpd"`` = log p(y_i | θ̄) at
#: the posterior mean θ̄ (one likelihood evaluation per datum); ``"lpd"`` = log (1/S) Σ_s p(y_i | θ_s)
#: (S evaluations per datum).
APPROXIMATIONS = ("plpd", "lpd")

#: Pareto k above which the posterior-approximation weights p/g are unreliable (ref [4], Sec. 3.2.4).
POSTERIOR_K_THRESHOLD = 0.7


@dataclass(frozen=True)
class LooSubsample:
    """The result of :func:`loo_subsample` (log scale: larger elpd is better).

    Totals are over all N observations; the ``*_i`` arrays are per subsampled observation, in the
    order of ``observations`` (sorted).
    """

    #: estimate of elpd_loo = Σ_i ``log p(y_i | y_-i)`` (ref [2], Eq. 7)
    elpd_loo: float
    #: total SE, sqrt(se_loo² + subsampling_se²)
    se: float
    #: SE of elpd_loo had all N terms been computed exactly, sqrt(N σ̂²_loo) (ref [2], Eq. 9)
    se_loo: float
    #: SE due to using m of the N observations (ref [2], Eq. 8)
    subsampling_se: float
    #: effective number of parameters, Σ_i (lpd_i − elpd_loo,i), estimated by SRS (ref [1], Sec. 3)
    p_loo: float
    #: subsampling SE of p_loo
    p_loo_subsampling_se: float
    #: indices (into the plate) of the m subsampled observations, sorted
    observations: np.ndarray
    #: PSIS elpd_loo,i of the subsampled observations
    elpd_loo_i: np.ndarray
    #: the approximation π̃_i at the subsampled observations
    elpd_loo_approx_i: np.ndarray
    #: Pareto k of the leave-one-out weights of the subsampled observations
    pareto_k: np.ndarray
    #: Σ_i π̃_i and Σ_i π̃_i² over all N observations (streamed)
    approx_sum: float
    approx_sum_sq: float
    #: m and N
    num_observations: int
    num_data: int
    #: number of posterior draws S
    num_draws: int
    #: the approximation used (see ``APPROXIMATIONS``)
    approximation: str
    #: whether the importance ratios were corrected for an approximate posterior
    posterior_correction: bool
    #: Pareto k of the posterior-approximation weights p(θ, y)/g(θ) (NaN without the correction)
    posterior_k: float
    #: the threshold used for ``pareto_k`` warnings, min(1 − 1/log10 S, 0.7) (ref [4])
    good_k: float
    #: observed site and plate
    var_name: str
    plate: str
    #: the observed values of ``var_name`` at ``observations`` (what :func:`compare_loo` checks
    #: the models were fitted to)
    observed_values: np.ndarray | None = None

    def __str__(self):
        return (f"elpd_loo = {self.elpd_loo:.2f} (SE {self.se:.2f}, subsampling SE {self.subsampling_se:.2f}), "
                f"p_loo = {self.p_loo:.2f}; m = {self.num_observations} of N = {self.num_data}, "
                f"approximation {self.approximation!r}, max Pareto k {np.max(self.pareto_k):.2f}")


# ---------------------------------------------------------------------------- estimators
def srs_difference_estimate(approx_sum, approx_sum_sq, y, y_approx, num_data):
    """The difference estimator under simple random sampling without replacement (ref [2], Sec. 3).

    With π̃ known for all N and π exact on an SRS-WOR sample of m, e_j = π_j − π̃_j:

    * total (Eq. 7): t̂ = Σ_i π̃_i + N ē;
    * its subsampling variance (Eq. 8): v̂ = N² (1 − m/N) s_e² / m;
    * the variance of the total over the population, N σ²_loo = Σ π_i² − (Σ π_i)²/N (Eq. 9, with the
      sign of the first line's second term as in the supplementary material, Eq. 6):
      σ̂² = Σ π̃_i² + N mean_j(π_j² − π̃_j²) − (t̂² − v̂)/N, where t̂² − v̂ estimates (Σ π_i)² unbiasedly.

    ``approx_sum_sq=None`` estimates Σ π_i² by N mean_j(π_j²) instead (unbiased, from the m points
    only): :func:`compare_loo` uses it for pointwise differences, whose Σ π̃_i² over N needs the
    cross term of two models' approximations, which is not kept.

    :return: ``(t̂, v̂, σ̂²)``.
    """
    y, y_approx = np.asarray(y, float), np.asarray(y_approx, float)
    m, n = y.shape[0], num_data
    e = y - y_approx
    total = approx_sum + n * e.mean()  # Eq. 7
    var_sub = n**2 * (1 - m / n) * e.var(ddof=1) / m  # Eq. 8
    if approx_sum_sq is None:
        sum_sq = n * np.mean(y**2)
    else:
        sum_sq = approx_sum_sq + n * np.mean(y**2 - y_approx**2)
    var_pop = sum_sq - (total**2 - var_sub) / n  # Eq. 9 (supplementary Eq. 6)
    return float(total), float(var_sub), float(var_pop)


def _logsumexp(x, axis, b=None):
    mx = np.max(x, axis=axis, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    w = np.exp(x - mx) if b is None else b * np.exp(x - mx)
    return np.log(np.sum(w, axis=axis)) + np.squeeze(mx, axis=axis)


# ---------------------------------------------------------------------------- inputs
def _resolve(run, samples, model_args, model_kwargs, batch_ndims):
    from ..driver.kernel import SGKernel

    kernel = getattr(run, "sampler", run)
    if not isinstance(kernel, SGKernel):
        raise TypeError(
            f"loo_subsample: expected an MCMC run of a numpyro_sgd kernel or such a kernel, got "
            f"{type(run).__name__}; for other kernels use arviz.loo on az.from_numpyro(mcmc)."
        )
    require_run(run, "loo_subsample")
    if not kernel.is_initialized:
        raise ValueError("loo_subsample: the kernel has not traced the model; call MCMC.run or kernel.init first.")
    if samples is None:
        if not hasattr(run, "get_samples"):
            raise ValueError("loo_subsample: a kernel needs its samples; call loo_subsample(kernel, samples, ...).")
        samples = run.get_samples(group_by_chain=True)
        batch_ndims = 2
    missing = set(kernel.potential.view.names) - set(samples)
    if missing:
        raise ValueError(f"loo_subsample: samples lack the latent sites {sorted(missing)}; pass draws of every "
                         "latent site (constrained, as mcmc.get_samples() returns them).")
    samples = {k: np.asarray(v) for k, v in samples.items() if k in kernel.potential.view.names}
    batch_ndims = _batch_ndims(kernel.potential, samples, batch_ndims)
    # the run's own arguments (not those of a later run of the same kernel), plate sizes checked
    model_args, model_kwargs = run_model_args(run, samples, model_args, model_kwargs, batch_ndims, "loo_subsample")
    return kernel, samples, model_args, model_kwargs, batch_ndims


def _batch_ndims(potential, samples, batch_ndims):
    """The leading dimensions of ``samples``, (chains, draws) or (draws,): each latent site's
    shape is compared with its constrained shape in the model (which fixes the count by the
    number of dimensions), so flat draws (``mcmc.get_samples()``) need no ``batch_ndims``; a
    given ``batch_ndims`` must agree. Raises ``ValueError`` naming the site and the shapes."""
    found = {}
    for site, shape in zip(potential.view.names, potential.view.shapes):
        transform = potential.transforms.get(site)
        event = tuple(transform.forward_shape(shape)) if transform is not None else tuple(shape)
        given = np.shape(samples[site])
        lead = len(given) - len(event)
        if lead not in (1, 2) or given[lead:] != event:
            raise ValueError(
                f"loo_subsample: the draws of '{site}' have shape {given}; expected (chains, draws) + {event} "
                f"or (draws,) + {event}, with {event} the site's shape in the model. Pass "
                "mcmc.get_samples(group_by_chain=True) or mcmc.get_samples().")
        found[site] = lead
    leads = sorted(set(found.values()))
    if len(leads) > 1:
        shown = ", ".join(f"'{k}' {np.shape(samples[k])}" for k in found)
        raise ValueError(f"loo_subsample: the sites' draws disagree on their leading dimensions ({shown}): some "
                         "have (chains, draws), some (draws,). Take them all from one call of mcmc.get_samples.")
    if batch_ndims is not None and batch_ndims != leads[0]:
        site = next(iter(found))
        raise ValueError(
            f"loo_subsample: batch_ndims={batch_ndims}, but the draws of '{site}' have shape "
            f"{np.shape(samples[site])}, which has {leads[0]} leading dimension(s) before the site's shape in the "
            f"model; leave batch_ndims out (it is read from the shapes) or pass "
            f"batch_ndims={leads[0]}.")
    return leads[0]


def _target(potential, var_name):
    sites = {k: p.name for p in potential.plates for k in potential.observed[p.name]}
    if var_name is None:
        if len(sites) != 1:
            raise ValueError(f"loo_subsample: the model has the observed sites {sorted(sites)} in subsample plates; "
                             "choose the one to leave out with var_name=...")
        var_name = next(iter(sites))
    if var_name not in sites:
        raise ValueError(f"loo_subsample: var_name={var_name!r} is not an observed site inside a subsample plate; "
                         f"use one of {sorted(sites)}.")
    plate = next(p for p in potential.plates if p.name == sites[var_name])
    return var_name, plate


def _validate_observations(num_observations, observations, n):
    if observations is not None:
        if isinstance(observations, LooSubsample):
            observations = observations.observations
        obs = np.asarray(observations)
        if obs.ndim != 1 or not np.issubdtype(obs.dtype, np.integer):
            raise ValueError("loo_subsample: observations must be a 1-D integer array of data indices "
                             "(or a LooSubsample result whose subsample to reuse).")
        obs = np.sort(obs)
        if obs.shape[0] < 2 or obs[0] < 0 or obs[-1] >= n or np.any(obs[1:] == obs[:-1]):
            raise ValueError(f"loo_subsample: observations must be at least 2 distinct indices in [0, {n}); "
                             f"got {obs.shape[0]} indices in [{obs.min() if obs.size else '-'}, "
                             f"{obs.max() if obs.size else '-'}].")
        return obs
    if isinstance(num_observations, bool) or not isinstance(num_observations, (int, np.integer)) \
            or not 2 <= num_observations <= n:
        raise ValueError(f"loo_subsample: num_observations must be an integer with 2 <= num_observations <= N = {n} "
                         f"(the plate size), got {num_observations!r}; a few hundred is typical (ref [1]).")
    return None


# ---------------------------------------------------------------------------- streaming passes
def _check_finite_draws(samples, batch_ndims):
    """Refuse draws holding NaN or inf before any compute: PSIS-LOO of such a draw is NaN."""
    for site, v in samples.items():
        bad = ~np.isfinite(v.reshape(v.shape[:batch_ndims] + (-1,))).all(axis=-1)
        if bad.any():
            where = np.argwhere(bad)
            label = "(chain, draw)" if batch_ndims == 2 else "draw"
            shown = ", ".join(str(tuple(int(i) for i in w)) if batch_ndims == 2 else str(int(w[0])) for w in where[:5])
            raise ValueError(
                f"loo_subsample: the draws of '{site}' are not finite (NaN or inf) at {label} {shown}"
                + (f" and {len(where) - 5} more" if len(where) > 5 else "")
                + ": their log-likelihoods would make elpd_loo NaN. Drop those draws from samples= (a numpyro_sgd "
                "run never returns non-finite draws: they come from elsewhere, e.g. a transformation of the draws)."
            )


def _observed_at(kernel, samples, args, kwargs, batch_ndims, plate, var_name, obs):
    """The observed values of ``var_name`` at the data indices ``obs`` (one trace of the model)."""
    from numpyro import handlers

    from ..data.model_args import as_jax_args
    from ..model.discovery import SetPlateIndices

    args, kwargs = as_jax_args((args, kwargs))
    potential = kernel.potential
    first = {k: jnp.asarray(v.reshape((-1,) + v.shape[batch_ndims:])[0]) for k, v in samples.items()}
    idx = {p.name: jnp.arange(min(p.subsample_size, p.size)) for p in potential.plates}
    idx[plate.name] = jnp.asarray(obs)
    model = kernel.subsampled_model
    if potential.param_values:
        model = handlers.substitute(model, data=potential.param_values)
    model = handlers.seed(handlers.substitute(SetPlateIndices(model, indices=idx), data=first), 0)
    return np.asarray(handlers.trace(model).get_trace(*args, **kwargs)[var_name]["value"])


def _unconstrained_draws(potential, samples, batch_ndims):
    """Flat unconstrained draws θ_s, shape (S, D)."""
    cols = []
    for k in potential.view.names:
        v = jnp.asarray(samples[k])
        t = potential.transforms.get(k)
        u = t.inv(v) if t is not None else v
        cols.append(np.asarray(u).reshape(int(np.prod(v.shape[:batch_ndims])), -1))
    return np.concatenate(cols, axis=1)


def _constrained(potential, theta):
    """Constrained sites from flat unconstrained θ of shape (S, D): a dict with one batch dim."""
    z = jax.vmap(potential.view.unravel)(jnp.asarray(theta))
    return {k: (potential.transforms[k](v) if k in potential.transforms else v) for k, v in z.items()}


def _lpd(ll):
    """log (1/S) Σ_s exp(ll[s, i]) for (S, n) ``ll``."""
    return np.asarray(jax.scipy.special.logsumexp(ll, axis=0)) - math.log(ll.shape[0])


def _stream(kernel, samples, args, kwargs, chunk_size, batch_ndims, plate, var_name, per_draw, approx):
    """One pass over all N: ``(Σ π̃, Σ π̃², per-draw total log-likelihood or None)``.

    ``approx`` is ``"lpd"`` (π̃_i from these draws) or ``"point"`` (``samples`` is the single draw θ̄,
    π̃_i = log p(y_i | θ̄)) or ``None``. ``per_draw`` also sums every observed site of every plate per
    draw (the log-likelihood part of the log joint). Nothing of size N is kept.
    """
    total, total_sq, per = 0.0, 0.0, None
    plates = None if per_draw else [plate.name]
    for name, _, chunk in log_likelihood_chunks(kernel, samples, args, kwargs, chunk_size, batch_ndims,
                                                plates=plates):
        if per_draw:
            s = np.asarray(sum(v.sum(axis=1) for v in chunk.values()), dtype=float)
            per = s if per is None else per + s
        if approx is not None and name == plate.name:
            pi = _lpd(chunk[var_name]) if approx == "lpd" else np.asarray(chunk[var_name][0])
            pi = pi.astype(float)
            total += float(pi.sum())
            total_sq += float(np.dot(pi, pi))
    return total, total_sq, per


def _subsample_log_likelihood(kernel, samples, args, kwargs, chunk_size, batch_ndims, plate, var_name, obs):
    """(S, m) log p(y_j | θ_s) at the subsampled observations."""
    pieces = [np.asarray(c[var_name], dtype=float) for _, _, c in log_likelihood_chunks(
        kernel, samples, args, kwargs, chunk_size, batch_ndims, indices={plate.name: obs}, plates=[plate.name])]
    return np.concatenate(pieces, axis=1)


def _log_joint_minus_log_g(kernel, theta, ll_total, args, kwargs):
    """log p(θ_s, y) − log g(θ_s) on the unconstrained scale, g = Gaussian fitted to the draws.

    log p(θ_s, y) = −U(θ_s) = log p(θ_s) + log|J(θ_s)| + Σ_i log p(y_i | θ_s), the full-data log joint
    of the unconstrained θ (``ll_total`` holds the streamed likelihood sum).
    """
    from ..data.model_args import split_arrays

    potential = kernel.potential
    arrays, rebuild, _ = split_arrays(args, kwargs)
    prior = jax.jit(jax.vmap(lambda t, a: potential.prior_potential(t, *rebuild(a)), in_axes=(0, None)))
    log_p = ll_total - np.asarray(prior(jnp.asarray(theta), arrays), dtype=float)
    mean, cov = fit_gaussian(theta)
    try:
        chol = np.linalg.cholesky(cov)
    except np.linalg.LinAlgError as e:
        raise ValueError(
            f"loo_subsample: the covariance of the {theta.shape[0]} draws (D = {theta.shape[1]}) is singular, so no "
            "Gaussian g can be fitted for the posterior correction; pass more draws than D, or "
            "posterior_correction=False."
        ) from e
    z = np.linalg.solve(chol, (theta - mean).T)
    log_g = -0.5 * np.sum(z**2, 0) - np.sum(np.log(np.diag(chol))) - 0.5 * theta.shape[1] * math.log(2 * math.pi)
    return log_p - log_g


def _reff(samples, batch_ndims, num_draws):
    """Relative efficiency ESS/S as ``arviz.loo`` computes it (mean ESS over all scalar parameters)."""
    first = next(iter(samples.values()))
    if batch_ndims != 2 or first.shape[0] == 1:
        return 1.0
    ess = [arviz_compat.ess(v.reshape(v.shape[:2] + (-1,))[..., j], method="mean")
           for v in samples.values() for j in range(int(np.prod(v.shape[2:], dtype=int)))]
    return float(np.mean(ess)) / num_draws


# ---------------------------------------------------------------------------- public
def loo_subsample(run, samples=None, *, num_observations=400, observations=None, approximation="plpd",
                  posterior_correction=False, rng_key=None, chunk_size=2_000, model_args=None, model_kwargs=None,
                  var_name=None, batch_ndims=None, reff=None):
    r"""PSIS-LOO of a large-N model from m subsampled observations (refs [1], [2]).

    For every observation i a cheap approximation π̃_i of elpd_loo,i = ``log p(y_i | y_-i)`` is
    computed in one streamed pass over the data (``approximation``); only Σ π̃_i and Σ π̃_i² are
    kept. For an SRS-WOR subsample of m observations, elpd_loo,j is computed exactly by PSIS
    (ref [3], Eq. 10; ref [4]); the difference estimator (ref [2], Eq. 7–9; see
    ``srs_difference_estimate``) combines the two. Memory is O(S × (m + chunk_size)) for S
    draws, independent of N; time is O(N) model evaluations for ``"plpd"`` and O(S N) for
    ``"lpd"`` or with ``posterior_correction``.

    Usage: ``loo_subsample(mcmc)`` after ``mcmc.run(...)`` (draws and model arguments from the
    run), or ``loo_subsample(kernel, samples, model_args=...)`` for draws from elsewhere (e.g.
    exact posterior draws) and a kernel after ``init``. ``samples`` may be grouped by chain
    (``mcmc.get_samples(group_by_chain=True)``) or flat (``mcmc.get_samples()``): which one is
    read from the shapes.

    .. note:: **Posterior correction** (ref [2], Sec. 4, "approximate posteriors"; R's
       ``loo_approximate_posterior``). By default the draws are treated as posterior draws, as
       ``arviz.loo`` and R's ``loo_subsample`` treat them; for SG-MCMC draws whose law is close to
       the posterior (ConstantSGD/SGFS with the full preconditioner, within the accuracy
       ``numpyro_sgd.diagnostics.compare.compare`` reports) that is the estimate to use. With
       ``posterior_correction=True`` the importance ratios are
       r_s,i ∝ exp(−log p(y_i | θ_s) + log p(θ_s, y) − log g(θ_s)), where log p(θ_s, y) is the
       full-data log joint on the unconstrained scale (streamed in chunks) and g is a **Gaussian
       fitted to the draws** on the unconstrained scale (the stationary law of a constant-rate SG
       sampler is approximately Gaussian, ref [5], Eq. 13; its density is otherwise unknown);
       p_loo then uses lpd_i weighted by the smoothed weights p/g, and the Pareto k of p/g is
       reported (``posterior_k``; a warning above 0.7). It costs one full-data likelihood pass per
       draw (O(S N) time, O(S × chunk) memory), so thin the draws to a few hundred. Not the
       default: measured on SG draws at N = 10⁶–10⁷ (``docs/results/loo_large_n.md``) it raised the
       subsampling SE 10–100× through the noise of the fitted g.

    :param run: a finished :class:`numpyro.infer.MCMC` run of a numpyro_sgd kernel, or a
        numpyro_sgd kernel after ``init`` (then ``samples`` is required).
    :param dict samples: constrained draws {site: array} with leading (chains, draws) or
        (draws,) dimensions (default: ``run.get_samples(group_by_chain=True)``).
    :param int num_observations: m, the subsample size, 2 <= m <= N (default 400).
    :param observations: explicit data indices of the subsample (or a :class:`LooSubsample` whose
        subsample to reuse); overrides ``num_observations`` and ``rng_key``.
    :param str approximation: π̃_i, ``"plpd"`` (default) or ``"lpd"`` (see ``APPROXIMATIONS``).
        θ̄ for ``"plpd"`` is the mean of the draws on the unconstrained scale, mapped to the support.
    :param bool posterior_correction: correct for an approximate posterior (see the note; default
        False).
    :param rng_key: JAX key for the subsample (default ``jax.random.key(0)``): the same key, m and N
        give the same subsample, which :func:`compare_loo` needs.
    :param int chunk_size: data points per streamed evaluation (memory O(S × chunk_size)).
    :param model_args: model arguments, with ``model_kwargs`` the keyword ones (default: those of
        the last ``mcmc.run``).
    :param str var_name: the observed site to leave out (needed if there are several).
    :param int batch_ndims: leading dimensions of ``samples``: 2 (chains, draws) or 1 (draws);
        default None: read from the shapes (each site's against its shape in the model), and a
        given value must agree with them.
    :param float reff: relative efficiency for PSIS (default: as ``arviz.loo``, mean ESS / S;
        1 for flat draws (one chain) and with the posterior correction, as R's
        ``loo_approximate_posterior``).
    :return: :class:`LooSubsample`.

    .. doctest::

        >>> import jax, numpyro, numpyro.distributions as dist
        >>> from numpyro_sgd import SGLD, loo_subsample
        >>> y = jax.random.normal(jax.random.key(1), (5000,))
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=100) as idx:
        ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
        >>> kernel = SGLD(model, step_size=1e-4)
        >>> _ = kernel.init(jax.random.key(0), 0, model_args=(y,))
        >>> draws = {"mu": y.mean() + jax.random.normal(jax.random.key(2), (1, 300)) / 5000**0.5}
        >>> res = loo_subsample(kernel, draws, num_observations=200, posterior_correction=False)
        >>> bool(abs(res.elpd_loo / 5000 + 1.42) < 0.05)  # ≈ −½ log 2π − ½ per datum
        True
    """
    # ---- validation, before any compute
    if approximation not in APPROXIMATIONS:
        raise ValueError(f"loo_subsample: unknown approximation {approximation!r}; use one of {APPROXIMATIONS} "
                         "('plpd': log p(y_i | posterior mean), cheapest; 'lpd': log mean_s p(y_i | θ_s)).")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"loo_subsample: chunk_size must be an integer >= 1, got {chunk_size!r}.")
    if batch_ndims not in (None, 1, 2):
        raise ValueError(f"loo_subsample: batch_ndims must be 1 (draws), 2 (chains, draws) or None (read from the "
                         f"shapes), got {batch_ndims!r}.")
    if posterior_correction not in (True, False):
        raise ValueError(f"loo_subsample: posterior_correction must be True or False, got {posterior_correction!r}.")
    kernel, samples, args, kwargs, batch_ndims = _resolve(run, samples, model_args, model_kwargs, batch_ndims)
    _check_finite_draws(samples, batch_ndims)
    potential = kernel.potential
    var_name, plate = _target(potential, var_name)
    n = plate.size
    obs = _validate_observations(num_observations, observations, n)
    num_draws = int(np.prod(next(iter(samples.values())).shape[:batch_ndims]))
    if num_draws < 2:
        raise ValueError(f"loo_subsample: need at least 2 draws, got {num_draws}.")
    if obs is None:
        key = random.key(0) if rng_key is None else rng_key
        if num_observations == n:
            obs = np.arange(n)
        else:
            from ..minibatch.without_replacement import subset_without_replacement

            obs = np.sort(np.asarray(subset_without_replacement(key, n, int(num_observations))))
    m = obs.shape[0]

    # ---- the draws, θ̄, and the streamed pass(es) over all N
    theta = _unconstrained_draws(potential, samples, batch_ndims)
    stream = dict(kernel=kernel, args=args, kwargs=kwargs, chunk_size=chunk_size, plate=plate, var_name=var_name)
    ll_total = None
    if posterior_correction or approximation == "lpd":
        approx_sum, approx_sum_sq, ll_total = _stream(samples=samples, batch_ndims=batch_ndims,
                                                      per_draw=posterior_correction,
                                                      approx="lpd" if approximation == "lpd" else None, **stream)
    ll = _subsample_log_likelihood(kernel, samples, args, kwargs, chunk_size, batch_ndims, plate, var_name, obs)
    if approximation == "plpd":
        point = _constrained(potential, theta.mean(0, keepdims=True))
        approx_sum, approx_sum_sq, _ = _stream(samples=point, batch_ndims=1, per_draw=False, approx="point", **stream)
        approx_i = _subsample_log_likelihood(kernel, point, args, kwargs, chunk_size, 1, plate, var_name, obs)[0]
    else:
        approx_i = _lpd(ll)

    # ---- PSIS on the subsample (ref [3], Eq. 10; ref [2], Sec. 4 for the correction)
    log_ratios = -ll.T  # (m, S)
    posterior_k = float("nan")
    if posterior_correction:
        correction = _log_joint_minus_log_g(kernel, theta, ll_total, args, kwargs)
        lw_post, posterior_k = arviz_compat.psislw(correction - correction.max(), 1.0)
        posterior_k = float(posterior_k)
        log_ratios = log_ratios + (correction - correction.max())[None, :]
        lpd_i = _logsumexp(ll.T + lw_post[None, :], axis=1)
        reff = 1.0 if reff is None else reff
    else:
        lpd_i = _lpd(ll)
        reff = _reff(samples, batch_ndims, num_draws) if reff is None else reff
    lw, pareto_k = arviz_compat.psislw(log_ratios, reff)
    elpd_i = _logsumexp(ll.T + lw, axis=1)
    p_i = lpd_i - elpd_i

    # ---- difference estimator (ref [2], Eq. 7–9) and SRS for p_loo
    elpd, var_sub, var_pop = srs_difference_estimate(approx_sum, approx_sum_sq, elpd_i, approx_i, n)
    p_loo = n * float(p_i.mean())
    p_var_sub = n**2 * (1 - m / n) * float(p_i.var(ddof=1)) / m

    good_k = min(1 - 1 / math.log10(num_draws), 0.7) if num_draws > 10 else 0.0
    bad = int(np.sum(pareto_k > good_k))
    if bad:
        warnings.warn(
            f"loo_subsample: {bad} of the {m} subsampled observations have Pareto k > {good_k:.2f} (max "
            f"{np.max(pareto_k):.2f}), so their PSIS-LOO terms are unreliable; use more draws, a more robust "
            "model, or exact LOO (refit without the observation) for them.",
            UserWarning, stacklevel=find_stack_level())
    if posterior_correction and posterior_k > POSTERIOR_K_THRESHOLD:
        warnings.warn(
            f"loo_subsample: the posterior-approximation weights p(θ, y)/g(θ) have Pareto k = {posterior_k:.2f} "
            f"> {POSTERIOR_K_THRESHOLD}: the Gaussian g fitted to the draws is a poor proposal for the posterior, "
            "so the corrected estimate is unreliable; run the sampler closer to the posterior (smaller step "
            "size, preconditioning) or, for exact draws, pass posterior_correction=False.",
            UserWarning, stacklevel=find_stack_level())
    return LooSubsample(
        elpd_loo=elpd, se=math.sqrt(max(var_pop, 0.0) + var_sub), se_loo=math.sqrt(max(var_pop, 0.0)),
        subsampling_se=math.sqrt(var_sub), p_loo=p_loo, p_loo_subsampling_se=math.sqrt(p_var_sub),
        observations=obs, elpd_loo_i=elpd_i, elpd_loo_approx_i=np.asarray(approx_i, float),
        pareto_k=np.asarray(pareto_k, float), approx_sum=approx_sum, approx_sum_sq=approx_sum_sq,
        num_observations=m, num_data=n, num_draws=num_draws, approximation=approximation,
        posterior_correction=bool(posterior_correction), posterior_k=posterior_k, good_k=good_k,
        var_name=var_name, plate=plate.name,
        observed_values=_observed_at(kernel, samples, args, kwargs, batch_ndims, plate, var_name, obs),
    )


