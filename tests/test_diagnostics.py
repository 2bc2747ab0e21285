"""to_arviz and compare on small runs: exact numbers where there are closed forms."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, log_likelihood

from numpyro_sgd import SGLD
from numpyro_sgd.diagnostics import arviz_compat
from numpyro_sgd.diagnostics.arviz_export import to_arviz
from numpyro_sgd.diagnostics.compare import compare, moment_errors
from numpyro_sgd.diagnostics.runs import draws_of

N, S = 300, 20
Y = jnp.asarray(np.random.default_rng(0).normal(1.0, 0.5, N))


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", y.shape[0], subsample_size=S) as idx:
        numpyro.sample("obs", dist.Normal(mu, sigma), obs=y[idx])


@pytest.fixture(scope="module")
def run():
    mcmc = MCMC(SGLD(model, step_size=1e-4, steps_per_sample=2), num_warmup=100, num_samples=60, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0), Y, extra_fields=("data_passes",))
    return mcmc


def test_to_arviz_full_data_log_likelihood(run):
    idata = to_arviz(run, chunk_size=128)  # 3 chunks, the last one partial
    ll = np.asarray(idata["log_likelihood"]["obs"])
    assert ll.shape == (2, 60, N)
    full_model = run.sampler.model  # plates set to all N indices
    expected = log_likelihood(full_model, run.get_samples(group_by_chain=True), Y, batch_ndims=2)["obs"]
    np.testing.assert_allclose(ll, np.asarray(expected), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(idata["observed_data"]["obs"]), np.asarray(Y))
    stats = idata["sample_stats"]
    assert np.asarray(stats["data_passes"]).shape == (2, 60)
    assert not np.any(np.asarray(stats["diverging"]))


def test_loo_and_waic_run(run):
    import arviz as az

    idata = to_arviz(run)
    assert np.isfinite(arviz_compat.loo(idata).elpd_loo)
    if hasattr(az, "waic"):  # removed in ArviZ 1.x
        assert np.isfinite(float(az.waic(idata).elpd_waic))


def test_moment_errors_closed_form():
    x = np.array([[0.0, 10.0], [2.0, 14.0]])  # means (1, 12), sds (√2, 2√2)
    mean_err, sd_err = moment_errors(x, ref_mean=[0.0, 12.0], ref_sd=[np.sqrt(2) / 2, np.sqrt(2)])
    assert mean_err == pytest.approx(np.sqrt(2))
    assert sd_err == pytest.approx(1.0)


def test_compare_against_exact_gaussian():
    """Draws from N(m, C) exactly (as a dict of arrays) against (m, C) and against a shifted,
    scaled Gaussian, where KL and the moment errors have closed forms."""
    rng = np.random.default_rng(1)
    m, c = np.array([1.0, -1.0]), np.array([[1.0, 0.3], [0.3, 0.5]])
    draws = rng.multivariate_normal(m, c, size=(4, 25_000))
    runs = {"exact": {"theta": draws}}
    table = compare(runs, (m, c), transforms={})
    row = table.loc["exact"]
    bias = (2 * 3 / 4 + 2 / 2) / 100_000  # (D(D+1)/4 + D/2) / n
    assert row.kl_q_ref < bias + 1e-3 and row.kl_ref_q < bias + 1e-3
    assert row.max_mean_err_sd < 5 / np.sqrt(100_000 / 1)
    assert row.min_ess_bulk > 50_000
    m2 = m + np.array([np.sqrt(c[0, 0]), 0.0])  # shift by one sd in the first coordinate
    shifted = compare(runs, (m2, c), transforms={}).loc["exact"]
    # KL(N(m, C) || N(m2, C)) = ½ δᵀ C⁻¹ δ
    delta = m2 - m
    assert shifted.kl_q_ref == pytest.approx(0.5 * delta @ np.linalg.solve(c, delta), abs=0.01)
    assert shifted.max_mean_err_sd == pytest.approx(1.0, abs=0.02)


def test_compare_mcmc_runs_against_draws(run):
    """A run compared with itself as reference: zero errors; the transforms come from the kernel
    (σ compared on the log scale for the KL)."""
    ref = {k: np.asarray(v) for k, v in run.get_samples(group_by_chain=True).items()}
    table = compare({"sgld": run}, ref, wall_times={"sgld": 2.0})
    row = table.loc["sgld"]
    assert row.kl_q_ref == pytest.approx(0.0, abs=1e-9) and row.max_mean_err_sd == pytest.approx(0.0, abs=1e-9)
    assert row.data_passes == pytest.approx(2 * 320 * S / N)
    assert row.ess_per_s == pytest.approx(row.min_ess_bulk / 2.0)
    u = draws_of(run, ["mu", "sigma"], run.sampler.potential.transforms, unconstrained=True)
    np.testing.assert_allclose(u[..., 1], np.log(ref["sigma"]), rtol=1e-10)


def test_nuts_reference_is_the_full_data_posterior(run):
    """compare(runs, "nuts") runs NUTS on the SG run's own model with all N indices. Its μ draws
    match the normal model's posterior: mean within 0.3 posterior sd of ȳ (posterior sd
    s/√N ≈ 0.029; NUTS's Monte Carlo error with 2 × 300 draws is about 0.05 sd, the N(0, 10)
    prior moves the mean by < 0.001 sd) and sd within 20 % (Monte Carlo error about 3 %). A
    minibatch posterior (S = 20) would have an sd √(N/S) ≈ 3.9 times larger."""
    from numpyro_sgd.diagnostics.compare import nuts_reference

    nuts = nuts_reference(run, num_warmup=300, num_samples=300)
    mu = np.asarray(nuts.get_samples()["mu"])
    sd = float(np.std(np.asarray(Y))) / np.sqrt(N)
    assert abs(mu.mean() - float(np.mean(np.asarray(Y)))) < 0.3 * sd
    assert abs(mu.std() / sd - 1) < 0.2
    assert nuts.num_chains == 2
    with pytest.raises(ValueError, match="only named reference is 'nuts'"):
        compare({"sgld": run}, "laplace")
