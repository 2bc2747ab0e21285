"""Subsampled PSIS-LOO (numpyro_sgd.diagnostics.loo) against full PSIS-LOO on exact posterior draws.

The model is Bayesian linear regression with known noise sd 1 and prior w ~ N(0, I): the posterior
is N((I + XᵀX)⁻¹ Xᵀy, (I + XᵀX)⁻¹), so the draws are exact and cheap, and full-data PSIS-LOO on
the (draws, N) pointwise log-likelihood of the same draws is the reference: ``arviz.loo`` with
ArviZ 0.23, and with ArviZ 1.x the same computation vectorised over observations
(tests/psis_reference.py), checked against ArviZ 1.x's ``loo`` below.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import psis_reference  # tests/psis_reference.py (tests/conftest.py puts this folder on sys.path)
import pytest
from numpyro.infer import MCMC

from numpyro_sgd import SGLD, compare_loo
from numpyro_sgd.diagnostics import arviz_compat, loo
from numpyro_sgd.diagnostics import arviz_export as diag
from numpyro_sgd.diagnostics.arviz_export import to_arviz
from numpyro_sgd.diagnostics.loo import loo_subsample
from numpyro_sgd.diagnostics.runs import pointwise_log_likelihood

CHAINS, DRAWS = 4, 100


def linreg(X, y=None):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])


def problem(n, d, seed, noise="normal", drop=0):
    """Data, an initialised kernel and exact posterior draws (CHAINS, DRAWS, d − drop)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    w = np.linspace(1.0, 0.5, d)
    eps = rng.standard_normal(n) if noise == "normal" else rng.standard_t(2.0, n)
    y = X @ w + eps
    X = X[:, : d - drop]
    cov = np.linalg.inv(np.eye(X.shape[1]) + X.T @ X)
    mean = cov @ (X.T @ y)
    draws = rng.multivariate_normal(mean, cov, size=(CHAINS, DRAWS))
    args = (jnp.asarray(X), jnp.asarray(y))
    kernel = SGLD(linreg, step_size=1e-5)
    kernel.init(jax.random.key(0), 0, None, args, {})
    return kernel, {"w": draws}, args


def arviz_loo(kernel, samples, args):
    """``arviz.loo`` of the installed ArviZ on the full (chains, draws, N) log-likelihood."""
    ll = pointwise_log_likelihood(kernel, samples, args, chunk_size=50_000)
    idata = arviz_compat.from_dict({"posterior": samples, "log_likelihood": ll})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return arviz_compat.loo(idata)


def vectorised_loo(kernel, samples, args):
    """What ArviZ 1.x's ``loo`` computes, vectorised over observations (tests/psis_reference.py),
    with ArviZ's r_eff as the package computes it (``loo._reff``: mean ESS of the scalar parameters
    over the number of draws)."""
    (ll,) = pointwise_log_likelihood(kernel, samples, args, chunk_size=50_000).values()
    ll = np.asarray(ll, dtype=float)
    chains, draws = ll.shape[:2]
    reff = loo._reff(samples, batch_ndims=2, num_draws=chains * draws)
    return psis_reference.loo(ll.reshape(chains * draws, -1).T, reff)


def full_loo(kernel, samples, args):
    """The full-data PSIS-LOO reference: ``arviz.loo`` where ArviZ 0.23 is installed; with ArviZ 1.x,
    whose ``loo`` loops over observations in Python (about 2 minutes at N = 10⁵ on the CI machine),
    the same computation vectorised, which test_vectorised_reference_is_the_installed_arviz_loo
    checks against ArviZ 1.x's ``loo`` term by term."""
    return vectorised_loo(kernel, samples, args) if arviz_compat.ARVIZ_1 else arviz_loo(kernel, samples, args)


@pytest.fixture(scope="module")
def large():
    kernel, samples, args = problem(100_000, 3, seed=0)
    return kernel, samples, args, full_loo(kernel, samples, args)


def test_matches_full_psis_loo_at_large_n(large):
    """N = 10⁵, m = 400. Without the posterior correction the subsampled terms are exactly
    ``arviz.loo``'s pointwise terms (same draws, same r_eff, same PSIS), so the only error is
    subsampling: |elpd − elpd_full| <= 2 subsampling SE. A 2-SE check fails about 5 % of the time
    by chance; the seed is fixed, so it passes or fails deterministically. The point estimate is
    also checked against the full value to 0.01 % of |elpd| (≈ 14 nats here): plpd is nearly exact
    for a well-specified model at this N (π_i − π̃_i = O(D/N)), so the subsampling SE is a few
    hundredths of a nat. The total SE must match ``arviz.loo``'s se (√(N Var π)) to 10 %: σ̂²
    has relative SE about √(2/m) ≈ 7 % from the subsample part, less with the control variate.
    """
    kernel, samples, args, ref = large
    res = loo_subsample(kernel, samples, model_args=args, num_observations=400, posterior_correction=False)
    full_i = np.asarray(ref.loo_i)[res.observations]
    np.testing.assert_allclose(res.elpd_loo_i, full_i, rtol=1e-10)
    np.testing.assert_allclose(res.pareto_k, np.asarray(ref.pareto_k)[res.observations], rtol=1e-10)
    assert res.num_observations == 400 and res.num_data == 100_000
    assert 0 < res.subsampling_se < res.se
    assert abs(res.elpd_loo - ref.elpd_loo) <= 2 * res.subsampling_se
    assert abs(res.elpd_loo - ref.elpd_loo) <= 1e-4 * abs(ref.elpd_loo)
    assert res.se == pytest.approx(ref.se, rel=0.1)
    assert res.p_loo == pytest.approx(ref.p_loo, abs=3 * res.p_loo_subsampling_se + 0.5)


def test_all_observations_is_the_installed_arviz_loo():
    """m = N, no posterior correction: there is no subsampling, so elpd_loo, p_loo and every
    pointwise term are those of ``arviz.loo`` of the installed ArviZ (0.23 or 1.x) on the same draws,
    to 1e-8 relative; the Pareto smoothing is that ArviZ's (``arviz_compat.psislw``), and
    ``psislw``'s weights are normalised. Runs on whichever ArviZ is installed."""
    kernel, samples, args = problem(2_000, 3, seed=5, noise="t")
    ref = arviz_loo(kernel, samples, args)
    res = loo_subsample(kernel, samples, model_args=args, num_observations=2_000, posterior_correction=False)
    assert res.subsampling_se == 0
    assert res.elpd_loo == pytest.approx(ref.elpd_loo, rel=1e-8)
    assert res.p_loo == pytest.approx(ref.p_loo, rel=1e-8)
    np.testing.assert_allclose(res.elpd_loo_i, ref.loo_i, rtol=1e-8)
    np.testing.assert_allclose(res.pareto_k, ref.pareto_k, rtol=1e-8)
    lw, k = arviz_compat.psislw(np.random.default_rng(0).standard_t(3, (4, 400)), reff=0.9)
    np.testing.assert_allclose(np.exp(lw).sum(-1), 1.0, rtol=1e-12)
    assert k.shape == (4,) and np.all(np.isfinite(k))


@pytest.mark.skipif(not arviz_compat.ARVIZ_1, reason="the vectorised reference is used, and checked, with ArviZ 1.x")
def test_vectorised_reference_is_the_installed_arviz_loo():
    """The vectorised reference full_loo uses with ArviZ 1.x gives ArviZ 1.x's ``loo`` term by term
    (elpd_i, Pareto k, totals, se, p_loo) to 1e-10 relative, on Student-t(2) noise, whose outliers
    give k̂ from −0.45 to 1.49; the truncation at the largest ratio acts on 2,993 of the 3,000
    observations. (The branches for a failed fit, k̂ = ∞ or σ <= 0, do not occur on this problem.)"""
    kernel, samples, args = problem(3_000, 3, seed=5, noise="t")
    ref, vec = arviz_loo(kernel, samples, args), vectorised_loo(kernel, samples, args)
    assert np.nanmin(ref.pareto_k) < 0 < 0.7 < np.nanmax(ref.pareto_k)
    np.testing.assert_allclose(vec.loo_i, ref.loo_i, rtol=1e-10)
    np.testing.assert_allclose(vec.pareto_k, ref.pareto_k, rtol=1e-10, atol=1e-12)
    assert vec.elpd_loo == pytest.approx(ref.elpd_loo, rel=1e-10)
    assert vec.se == pytest.approx(ref.se, rel=1e-10)
    assert vec.p_loo == pytest.approx(ref.p_loo, rel=1e-10)


def test_posterior_correction_and_lpd_agree(large):
    """With exact Gaussian draws the fitted g is the posterior up to fit noise, so the corrected
    estimate (posterior k small) lands within 3 subsampling SE of the full value; ``"lpd"`` as the
    approximation is also unbiased (the difference estimator is unbiased for any π̃) and checked at
    3 SE. 3 SE: a two-sided 3-SE check fails 0.3 % of the time by chance, seed fixed."""
    kernel, samples, args, ref = large
    res = loo_subsample(kernel, samples, model_args=args, approximation="lpd", posterior_correction=True,
                        rng_key=jax.random.key(3))
    assert res.posterior_correction and res.posterior_k < 0.5
    assert abs(res.elpd_loo - ref.elpd_loo) <= 3 * res.subsampling_se
    assert abs(res.elpd_loo - ref.elpd_loo) <= 1e-4 * abs(ref.elpd_loo)


def test_heavy_tailed_data_bad_approximation():
    """Student-t(2) noise under a Normal likelihood: outliers make π_i − π̃_i large and skewed, so
    the subsampling SE is large; the estimate must still land within 3 of its subsampling SEs of
    the full PSIS-LOO (3 SE because the error distribution of the difference estimator is skewed
    with heavy-tailed e_j, so the Normal 2-SE coverage is not reliable; seed fixed)."""
    kernel, samples, args = problem(10_000, 3, seed=1, noise="t")
    ref = full_loo(kernel, samples, args)
    res = loo_subsample(kernel, samples, model_args=args, num_observations=300, posterior_correction=False)
    assert res.subsampling_se > 1.0  # the approximation really is poor here
    assert abs(res.elpd_loo - ref.elpd_loo) <= 3 * res.subsampling_se


def _peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM")


def test_memory_does_not_grow_with_draws_times_n():
    """N = 10⁶, S = 200 draws: a (draws, N) float64 array would be 1.6 GB (float32: 0.8 GB). The
    peak resident memory during loo_subsample (with the posterior correction and "lpd", the two
    draws × N passes) must grow by less than 600 MB, and every streamed chunk must have at most
    chunk_size columns. Linux only (resets the peak with /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
        before = _peak_rss_bytes()
    except OSError:
        pytest.skip("needs Linux /proc/self/clear_refs to measure peak memory")
    kernel, samples, args = problem(1_000_000, 2, seed=2)
    samples = {"w": samples["w"][:2]}  # 2 chains × 100 draws
    widths = []
    real = loo.log_likelihood_chunks

    def recording(*a, **k):
        for plate, idx, chunk in real(*a, **k):
            widths.append(max(v.shape[-1] for v in chunk.values()))
            yield plate, idx, chunk

    loo.log_likelihood_chunks = recording
    try:
        res = loo_subsample(kernel, samples, model_args=args, approximation="lpd", posterior_correction=True,
                            chunk_size=5_000)
    finally:
        loo.log_likelihood_chunks = real
    grown = _peak_rss_bytes() - before
    assert np.isfinite(res.elpd_loo) and res.num_data == 1_000_000
    assert max(widths) <= 5_000 and len(widths) >= 1_000_000 // 5_000
    assert grown < 600 * 2**20, f"peak RSS grew by {grown / 2**20:.0f} MiB"


def test_compare_nested_models():
    """The true model has 3 features with weights (1, .75, .5); the nested one drops the third, so
    its predictive variance is 1.25 instead of 1 and it loses about ½ log 1.25 ≈ 0.11 nats per datum,
    ≈ 1,100 nats at N = 10⁴ — far more than any SE. The
    difference must equal (to 3 of its subsampling SEs) the full-data difference of ``arviz.loo``
    on the same draws, and its SE must be within 25 % of the full-data SE of the pointwise
    differences (√(N Var d)); the SE-of-SD estimate from m = 400 has relative SE about
    √((κ − 1)/(4m)), ≤ 10 % for kurtosis κ ≤ 17."""
    n = 10_000
    big, s_big, a_big = problem(n, 3, seed=4)
    small, s_small, a_small = problem(n, 3, seed=4, drop=1)
    r_big = loo_subsample(big, s_big, model_args=a_big, posterior_correction=False)
    r_small = loo_subsample(small, s_small, model_args=a_small, posterior_correction=False)
    table = compare_loo({"small": r_small, "big": r_big})
    assert list(table.index) == ["big", "small"]
    f_big, f_small = full_loo(big, s_big, a_big), full_loo(small, s_small, a_small)
    d_full = np.asarray(f_big.loo_i) - np.asarray(f_small.loo_i)
    row = table.loc["small"]
    assert row.elpd_diff > 0 and row.se_diff > 0
    assert abs(row.elpd_diff - d_full.sum()) <= 3 * row.subsampling_se_diff
    assert row.se_diff == pytest.approx(np.sqrt(n * d_full.var()), rel=0.25)
    other = loo_subsample(small, s_small, model_args=a_small, posterior_correction=False, rng_key=jax.random.key(9))
    with pytest.raises(ValueError, match="different subsamples.*same rng_key"):
        compare_loo({"big": r_big, "other": other})
    same = loo_subsample(small, s_small, model_args=a_small, posterior_correction=False, observations=r_big)
    np.testing.assert_array_equal(same.observations, r_big.observations)


# ---------------------------------------------------------------------------- to_arviz, MCMC input
N_SMALL = 300
Y_SMALL = jnp.asarray(np.random.default_rng(0).normal(1.0, 0.5, N_SMALL))


def normal_model(y):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", y.shape[0], subsample_size=20) as idx:
        numpyro.sample("obs", dist.Normal(mu, sigma), obs=y[idx])


@pytest.fixture(scope="module")
def run():
    mcmc = MCMC(SGLD(normal_model, step_size=1e-4, steps_per_sample=2), num_warmup=100, num_samples=60,
                num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0), Y_SMALL)
    return mcmc


def test_to_arviz_auto_skips_above_limit(run, monkeypatch):
    """2 chains × 60 draws × 300 × 4 bytes = 144,000 bytes: computed under the default limit,
    skipped with the warning under a limit of 100,000 bytes; True still forces it."""
    groups = arviz_compat.group_names
    assert "log_likelihood" in groups(to_arviz(run))
    monkeypatch.setattr(diag, "LOG_LIKELIHOOD_AUTO_MAX_BYTES", 100_000)
    with pytest.warns(UserWarning, match=r"would take 0 MiB.*log_likelihood=True.*loo_subsample"):
        idata = to_arviz(run)
    assert "log_likelihood" not in groups(idata) and "posterior" in groups(idata)
    assert "log_likelihood" in groups(to_arviz(run, log_likelihood=True))
    with pytest.raises(ValueError, match="log_likelihood must be True, False or 'auto'"):
        to_arviz(run, log_likelihood="yes")


def test_from_mcmc_run_with_correction(run):
    """From an SG run (model arguments from the run): m = N gives the full PSIS-LOO with the
    posterior correction, zero subsampling SE, and elpd equal to the sum of its terms."""
    res = loo_subsample(run, num_observations=N_SMALL, posterior_correction=True)
    assert res.subsampling_se == 0 and np.isfinite(res.posterior_k)
    assert res.elpd_loo == pytest.approx(res.elpd_loo_i.sum(), rel=1e-12)
    assert res.var_name == "obs" and res.plate == "data"


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_observations=N_SMALL + 1), r"2 <= num_observations <= N = 300"),
    (dict(num_observations=1), r"2 <= num_observations <= N = 300"),
    (dict(approximation="waic"), r"unknown approximation 'waic'; use one of \('plpd', 'lpd'\)"),
    (dict(observations=np.array([3, 3, 4])), r"at least 2 distinct indices in \[0, 300\)"),
    (dict(chunk_size=0), r"chunk_size must be an integer >= 1"),
    (dict(var_name="mu"), r"var_name='mu' is not an observed site.*\['obs'\]"),
])
def test_bad_input_raises_before_compute(run, monkeypatch, kwargs, match):
    def fail(*a, **k):
        raise AssertionError("computed before validating")

    monkeypatch.setattr(loo, "log_likelihood_chunks", fail)
    with pytest.raises(ValueError, match=match):
        loo_subsample(run, **kwargs)


def test_non_finite_draws_are_named_before_compute(run, monkeypatch):
    """Issue 30: one NaN draw made elpd NaN with a Pareto-k warning that named no draw."""
    def fail(*a, **k):
        raise AssertionError("computed before validating")

    samples = {k: np.array(v) for k, v in run.get_samples(group_by_chain=True).items()}
    samples["mu"][1, 7] = np.nan
    samples["sigma"][0, 3] = np.inf
    monkeypatch.setattr(loo, "log_likelihood_chunks", fail)
    with pytest.raises(ValueError, match=r"draws of 'mu' are not finite \(NaN or inf\) at \(chain, draw\) \(1, 7\)"):
        loo_subsample(run.sampler, samples, model_args=(Y_SMALL,))


def test_compare_loo_refuses_runs_fitted_to_different_responses():
    """Issue 30: two fits of the same model to responses of the same length were ranked as if
    the data were the same. The observed values at the shared subsample tell them apart."""
    n = 2_000
    kernel, samples, args = problem(n, 3, seed=5)
    other_y = args[1] + 1.0
    other = SGLD(linreg, step_size=1e-5)
    other.init(jax.random.key(0), 0, None, (args[0], other_y), {})
    a = loo_subsample(kernel, samples, model_args=args, posterior_correction=False)
    b = loo_subsample(other, samples, model_args=(args[0], other_y), posterior_correction=False)
    np.testing.assert_array_equal(a.observed_values, np.asarray(args[1])[a.observations])
    with pytest.raises(ValueError, match=r"'a' and 'b' were fitted to different data: the observed values of 'y' "
                                         r"at the shared subsample differ \(first at data index"):
        compare_loo({"a": a, "b": b})
    same = loo_subsample(kernel, samples, model_args=args, posterior_correction=False, rng_key=jax.random.key(0))
    assert list(compare_loo({"a": a, "same": same}).index)  # same data, same subsample: compared
