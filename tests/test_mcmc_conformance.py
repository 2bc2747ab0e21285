"""Every kernel honours NumPyro's MCMC protocol (one body per property, no per-kernel branches)."""

import pickle

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from kernel_registry import params
from numpyro.infer import MCMC

from numpyro_sgd import SGLD

#: every kernel of the registry (tests/kernel_registry.py): (factory, data passes per 100 SG steps)
KERNELS_AND_VEM = params()
#: the driver-only checks run on the representative configurations, which together exercise every
#: path of the shared driver: plain steps (SGLD), an adapting warmup with momentum (ConstantSGD), a
#: window with end_block (IASG), the index chain and a full-data calibration (EWSGVR) and a wrapper
#: (VariationalEM); on every kernel with the slow tests (-m slow). What depends on each kernel's
#: state (vmap, determinism, continuation, pickling, progress text) runs on every kernel.
DRIVER_ONLY = params(driver_only=True)


N, S = 500, 25


def model(y):
    # a param site: held at its init value by the kernels (as NUTS does), fitted by VariationalEM
    prior_scale = numpyro.param("prior_scale", 10.0, constraint=dist.constraints.positive)
    mu = numpyro.sample("mu", dist.Normal(0, prior_scale))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", y.shape[0], subsample_size=S) as idx:
        numpyro.sample("obs", dist.Normal(mu, sigma), obs=y[idx])


Y = jnp.asarray(np.random.default_rng(0).normal(1.0, 0.5, N))


def _passes(passes_per_100, warmup_steps, sample_steps):
    """Expected data passes; VariationalEM and control variates (None): S per warmup step, 2 S per
    sampling step."""
    if passes_per_100 is None:
        return (warmup_steps + 2 * sample_steps) * S / N
    return passes_per_100 * (warmup_steps + sample_steps) / 100


def _mcmc(make, num_chains=1, chain_method="vectorized", progress_bar=False, steps_per_sample=1, **kw):
    return MCMC(make(model, steps_per_sample=steps_per_sample), num_warmup=60, num_samples=40,
                num_chains=num_chains, chain_method=chain_method, progress_bar=progress_bar, **kw)


# each chain method and each progress-bar path once (the four combinations cost 2 minutes of CI):
# vectorized with the progress bar for every kernel, sequential without it for the representative
# ones (the others with the slow tests)
@pytest.mark.parametrize("make, passes, chain_method, progress_bar", [
    pytest.param(*p.values, method, bar, id=f"{method}-{p.id}", marks=p.marks)
    for method, bar, configs in (("vectorized", True, KERNELS_AND_VEM), ("sequential", False,
                                                                        DRIVER_ONLY))
    for p in configs])
def test_two_chains(make, passes, chain_method, progress_bar):
    mcmc = _mcmc(make, num_chains=2, chain_method=chain_method, progress_bar=progress_bar)
    mcmc.run(jax.random.key(0), Y, extra_fields=("potential_energy", "data_passes", "num_divergences"))
    s = mcmc.get_samples(group_by_chain=True)
    assert s["mu"].shape == (2, 40) and s["sigma"].shape == (2, 40)
    assert np.all(np.asarray(s["sigma"]) > 0)
    assert mcmc.get_samples()["mu"].shape == (80,)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    assert extra["potential_energy"].shape == (2, 40) and extra["diverging"].shape == (2, 40)
    # data passes: 60 warmup and 40 sampling SG steps
    np.testing.assert_allclose(extra["data_passes"][:, -1], _passes(passes, 60, 40))


@pytest.mark.parametrize("make, passes", KERNELS_AND_VEM)
def test_same_key_same_samples_and_different_key_different(make, passes):
    a, b, c = _mcmc(make), _mcmc(make), _mcmc(make)
    a.run(jax.random.key(1), Y)
    b.run(jax.random.key(1), Y)
    c.run(jax.random.key(2), Y)
    np.testing.assert_array_equal(a.get_samples()["mu"], b.get_samples()["mu"])
    assert not np.array_equal(a.get_samples()["mu"], c.get_samples()["mu"])


@pytest.mark.parametrize("make, passes", KERNELS_AND_VEM)
def test_continuation_pickling_and_diagnostics_string(make, passes):
    mcmc = _mcmc(make)
    mcmc.run(jax.random.key(3), Y)
    first = mcmc.get_samples()["mu"]
    text = mcmc.sampler.get_diagnostics_str(mcmc.last_state)  # the progress bar's text
    assert "passes" in text and "0 divergences" in text
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.post_warmup_state.rng_key, Y)
    assert int(mcmc.last_state.i) == 140  # 60 warmup + 40 + 40 continued steps
    assert not np.array_equal(first, mcmc.get_samples()["mu"])
    clone = pickle.loads(pickle.dumps(mcmc))
    np.testing.assert_array_equal(clone.get_samples()["mu"], mcmc.get_samples()["mu"])
    clone.post_warmup_state = clone.last_state
    clone.run(clone.post_warmup_state.rng_key, Y)
    assert int(clone.last_state.i) == 180


@pytest.mark.parametrize("make, passes", DRIVER_ONLY)
def test_warmup_then_run(make, passes):
    mcmc = _mcmc(make)
    mcmc.warmup(jax.random.key(4), Y)
    assert int(mcmc.post_warmup_state.i) == 60
    mcmc.run(jax.random.key(5), Y)
    assert int(mcmc.last_state.i) == 100


@pytest.mark.parametrize("make, passes", DRIVER_ONLY)
def test_steps_per_sample(make, passes):
    mcmc = _mcmc(make, steps_per_sample=5)
    mcmc.run(jax.random.key(6), Y, extra_fields=("i", "data_passes"))
    extra = mcmc.get_extra_fields()
    np.testing.assert_array_equal(extra["i"], 300 + 5 * np.arange(1, 41))  # 60 × 5 warmup steps
    np.testing.assert_allclose(extra["data_passes"][-1], _passes(passes, 300, 200))


@pytest.mark.parametrize("make, passes", DRIVER_ONLY)
def test_print_summary_and_arviz(make, passes, capsys):
    mcmc = _mcmc(make, num_chains=2)
    mcmc.run(jax.random.key(7), Y)
    mcmc.print_summary()
    out = capsys.readouterr().out
    assert "mu" in out and "sigma" in out and "Number of divergences: 0" in out
    idata = az.from_numpyro(mcmc, log_likelihood=True)  # ArviZ 1.x computes it only on request
    # ArviZ 0.23 gives InferenceData, 1.x a DataTree: both support item access by group
    assert idata["posterior"]["mu"].shape == (2, 40)
    # the kernel's model property exposes the full data: pointwise log-likelihood of all N points
    assert idata["log_likelihood"]["obs"].shape == (2, 40, N)
    assert idata["observed_data"]["obs"].shape == (N,)


def test_non_finite_steps_are_rejected_and_reported():
    """A step size far beyond stability overflows: those steps are not taken, counted, and the
    samples stay finite (never NaN)."""
    mcmc = MCMC(SGLD(model, step_size=10.0), num_warmup=10, num_samples=50, progress_bar=False)
    mcmc.run(jax.random.key(9), Y)
    st = mcmc.last_state
    assert int(st.num_divergences) > 0
    assert 0 <= int(st.first_divergence) < 60
    for v in mcmc.get_samples().values():
        assert np.all(np.isfinite(np.asarray(v)))
    assert np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))
    with pytest.warns(UserWarning, match="had a non-finite potential"):
        SGLD.warn_divergences(st)
