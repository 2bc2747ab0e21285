"""Bad inputs of the diagnostics: each gives a message that names the function, the site or
argument, the problem and the fix, raised before any compute.

* ``compare`` with a reference (an ``MCMC`` run or a dict of draws) that lacks a site of the run,
  or a run that lacks a site of the reference;
* ``loo_subsample`` with flat draws (``mcmc.get_samples()``), which are accepted: the leading
  dimensions are read from the shapes;
* ``check_run``, ``to_arviz``, ``compare``, ``loo_subsample`` and ``nuts_reference`` on an ``MCMC``
  whose ``run`` was never called;
* a warmup of fewer than 20 SG steps: the warning says what the kernel then does (samples with a
  rough noise estimate from near its initial point, or rejects every step when no minibatch was
  averaged).

The runs are a few dozen SG steps on 400 rows (the full-data NUTS reference: 100 iterations).
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS

from numpyro_sgd import IASG, SGFS, SGHMC, SGLD, ConstantSGD, check_run
from numpyro_sgd.diagnostics.arviz_export import to_arviz
from numpyro_sgd.diagnostics.compare import compare, nuts_reference
from numpyro_sgd.diagnostics.loo import loo_subsample

N = 400
_rng = np.random.default_rng(1)
X = jnp.asarray(_rng.normal(size=(N, 2)))
Y = X @ jnp.array([3.0, -2.0]) + jnp.asarray(_rng.normal(size=N))


def regression(X, y):
    """A linear regression with an unknown noise scale: a vector site and a constrained scalar."""
    w = numpyro.sample("w", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    with numpyro.plate("data", X.shape[0], subsample_size=20) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, sigma), obs=y[idx])


@pytest.fixture(scope="module")
def sg_run():
    """Two vectorized chains of SGLD at a given step (no noise warmup), 50 draws each."""
    mcmc = MCMC(SGLD(regression, step_size=1e-4), num_warmup=20, num_samples=50, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0), X, Y)
    return mcmc


# ---------------------------------------------------------------------------- compare: missing sites
@pytest.fixture(scope="module")
def nuts_without_sigma():
    """Full-data NUTS of the regression with the noise scale known: no site 'sigma'."""
    def known_noise(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
        numpyro.sample("y", dist.Normal(X @ w, 1.0).to_event(1), obs=y)

    mcmc = MCMC(NUTS(known_noise), num_warmup=50, num_samples=50, progress_bar=False)
    mcmc.run(jax.random.key(1), X, Y)
    return mcmc


def test_compare_with_a_reference_run_lacking_a_site_of_the_run_names_it(sg_run, nuts_without_sigma):
    """It used to compare 'w' alone, saying nothing (and, with no shared site, failed with NumPy's
    "need at least one array to concatenate")."""
    with pytest.raises(ValueError, match=r"compare: the reference has no site 'sigma' of run 'sg' \(the reference's "
                                         r"sites: \['w'\]; the run's: \['sigma', 'w'\]\); pass a reference with "
                                         r"draws of every latent site of the runs, or names=\[\.\.\.\]"):
        compare({"sg": sg_run}, nuts_without_sigma)
    # names= restricts the comparison to the shared sites: accepted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # check_run's verdict on a 100-draw run: not this test's
        table = compare({"sg": sg_run}, nuts_without_sigma, names=["w"])
    assert list(table.index) == ["sg"]


@pytest.mark.parametrize("reference, missing, has", [
    ({"w": np.zeros((1, 50, 2))}, "sigma", r"\['w'\]"),
    ({"scale": np.ones((1, 50))}, "sigma", r"\['scale'\]"),  # no shared site at all
], ids=["one-missing", "none-shared"])
def test_compare_with_a_reference_dict_lacking_a_site_of_the_run_names_it(sg_run, reference, missing, has):
    with pytest.raises(ValueError, match=rf"compare: the reference has no site '{missing}' of run 'sg' \(the "
                                         rf"reference's sites: {has}"):
        compare({"sg": sg_run}, reference)


def test_compare_with_a_run_lacking_a_site_of_the_reference_names_it(sg_run):
    draws = sg_run.get_samples(group_by_chain=True)
    reference = {k: np.asarray(v) for k, v in draws.items()}
    with pytest.raises(ValueError, match=r"compare: run 'partial' has no site 'sigma' \(its sites: \['w'\]\); pass "
                                         r"names=\[\.\.\.\] with the sites that every run and the reference share"):
        compare({"sg": sg_run, "partial": {"w": reference["w"]}}, reference)


# ---------------------------------------------------------------------------- loo_subsample: flat draws
def test_loo_subsample_reads_flat_draws_from_their_shapes(sg_run):
    """``mcmc.get_samples()`` (draws, ...) used to be read as (chains, draws) and fail in a matmul.
    The leading dimensions are now read from each site's shape against its shape in the model,
    so flat and grouped draws of the same run give the same elpd (the same draws in the same
    order; reff given, since flat draws carry no chains to measure it from)."""
    options = dict(observations=np.arange(0, N, 40), reff=1.0)
    flat = loo_subsample(sg_run, sg_run.get_samples(), **options)
    grouped = loo_subsample(sg_run, sg_run.get_samples(group_by_chain=True), **options)
    np.testing.assert_allclose(flat.elpd_loo, grouped.elpd_loo, rtol=1e-12)
    np.testing.assert_allclose(flat.pareto_k, grouped.pareto_k, rtol=1e-12)
    assert np.isfinite(flat.elpd_loo)


def test_loo_subsample_with_draws_that_contradict_batch_ndims_names_the_site(sg_run):
    flat = sg_run.get_samples()
    with pytest.raises(ValueError, match=r"loo_subsample: batch_ndims=2, but the draws of 'sigma' have shape \(100,\), "
                                         r"which has 1 leading dimension\(s\).*leave batch_ndims out"):
        loo_subsample(sg_run, flat, batch_ndims=2)
    grouped = sg_run.get_samples(group_by_chain=True)
    with pytest.raises(ValueError, match=r"loo_subsample: the sites' draws disagree on their leading dimensions "
                                         r"\('sigma' \(2, 50\), 'w' \(100, 2\)\)"):
        loo_subsample(sg_run, {"w": flat["w"], "sigma": grouped["sigma"]})
    with pytest.raises(ValueError, match=r"loo_subsample: the draws of 'w' have shape \(2, 50, 3\); expected "
                                         r"\(chains, draws\) \+ \(2,\) or \(draws,\) \+ \(2,\)"):
        loo_subsample(sg_run, {"w": np.zeros((2, 50, 3)), "sigma": grouped["sigma"]})


# ---------------------------------------------------------------------------- before mcmc.run
@pytest.mark.parametrize("shared", [False, True], ids=["fresh-kernel", "kernel-run-by-another-mcmc"])
def test_diagnostics_of_an_mcmc_that_was_not_run_say_call_run(sg_run, shared):
    """``check_run`` raised AttributeError ('NoneType' ... 'num_divergences'), ``compare`` a
    TypeError; each now says that the MCMC has not been run, also when its kernel object was
    initialised by another MCMC's run (so the kernel alone cannot tell)."""
    kernel = sg_run.sampler if shared else SGLD(regression, step_size=1e-4)
    idle = MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False)
    calls = [(check_run, "check_run", "this MCMC"), (to_arviz, "to_arviz", "this MCMC"),
             (loo_subsample, "loo_subsample", "this MCMC"), (nuts_reference, "nuts_reference", "this MCMC"),
             (lambda m: compare({"sg": m}, {"w": np.zeros((1, 9, 2)), "sigma": np.ones((1, 9))}), "compare",
              "the MCMC of run 'sg'"),
             (lambda m: compare({"sg": sg_run}, m), "compare", "the reference MCMC")]
    for call, name, who in calls:
        with pytest.raises(ValueError, match=rf"{name}: {re.escape(who)} has not been run; call "
                                             r"mcmc\.run\(rng_key, \*model_args\) first"):
            call(idle)


# ---------------------------------------------------------------------------- a warmup shorter than 20 SG steps
# one SG step per warmup iteration: the Langevin kernels' default, ConstantSGD and SGFS with
# steps_per_sample=1, IASG with a window of one step (ConstantSGD and SGFS by default spread
# warmup_passes over num_warmup, so their warmup is short only at num_warmup=0)
def _noise_warmup(kernel_state):
    """The noise warmup's state: a Langevin kernel's ``adapted.warmup``, ConstantSGD's, SGFS's and
    IASG's ``warmup``."""
    return kernel_state.adapted.warmup if hasattr(kernel_state, "adapted") else kernel_state.warmup


SHORT_WARMUP_KERNELS = [
    pytest.param(lambda: SGLD(regression), id="SGLD"),
    pytest.param(lambda: SGHMC(regression), id="SGHMC"),
    pytest.param(lambda: ConstantSGD(regression, steps_per_sample=1), id="ConstantSGD"),
    pytest.param(lambda: SGFS(regression, steps_per_sample=1), id="SGFS"),
    pytest.param(lambda: IASG(regression, window=1), id="IASG"),
]


def _run_short(make, num_warmup, num_samples=10):
    kernel = make()
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        mcmc.run(jax.random.key(0), X, Y)
    texts = [str(w.message) for w in record if "warmup SG steps cannot estimate" in str(w.message)]
    assert len(texts) == 1, [str(w.message) for w in record]
    return type(kernel).__name__, mcmc, texts[0]


@pytest.mark.parametrize("make", SHORT_WARMUP_KERNELS)
def test_one_warmup_step_warns_that_the_kernel_samples_from_a_rough_estimate(make):
    """With num_warmup=1 the noise window averages one minibatch: nothing is NaN, no step of this
    well-conditioned 3-parameter problem is rejected, and the chain moves; the warning used to
    say that every step would be rejected. It now says that warmup did not finish, what the
    kernel does instead, and the num_warmup to use."""
    name, mcmc, text = _run_short(make, num_warmup=1)
    assert re.fullmatch(
        rf"{name}: 1 warmup SG steps cannot estimate the gradient noise well \(warmup needs at least 20; it did not "
        r"finish\)\. The kernel samples anyway, with its step size and preconditioner set from the noise of only 1 "
        r"minibatch \(a rough estimate: .*\), starting where those 1 steps left the chain, near its initial point "
        r"rather than in the mode region: the first draws are burn-in .* Use num_warmup >= 20 .*", text), text
    state = mcmc.last_state
    assert int(_noise_warmup(state.kernel_state).noise_state.count) == 1
    assert int(state.num_divergences) == 0
    assert np.ptp(np.asarray(mcmc.get_samples()["w"]), axis=0).min() > 0


@pytest.mark.parametrize("make", SHORT_WARMUP_KERNELS)
def test_no_warmup_warns_that_every_step_is_rejected(make):
    name, mcmc, text = _run_short(make, num_warmup=0, num_samples=5)
    assert re.fullmatch(
        rf"{name}: 0 warmup SG steps cannot estimate the gradient noise \(warmup needs at least 20; it did not "
        r"finish\): its noise window averaged no minibatch, so the step size and preconditioner stay undefined "
        r"\(NaN\) and every SG step is rejected and counted as a divergence .* Use num_warmup >= 20 .*", text), text
    state = mcmc.last_state
    assert int(_noise_warmup(state.kernel_state).noise_state.count) == 0
    assert int(state.num_divergences) == int(state.i) > 0


def test_a_short_warmup_whose_window_holds_no_refresh_step_warns_that_every_step_is_rejected():
    """At D = 40 the warmup takes per-example gradients on every 3rd SG step only
    (``warmup_refresh_every``): 2 warmup steps put step 1 alone in the noise window, which
    averages nothing, so the message is the rejecting one although the warmup was not empty."""
    wide = jnp.asarray(np.random.default_rng(2).normal(size=(N, 39)))  # w and sigma: D = 40
    for num_warmup, averaged in ((2, "no minibatch, so"), (1, "only 1 minibatch ")):
        kernel = SGLD(regression)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="(?!SGLD: .* warmup SG steps cannot estimate)")
            with pytest.warns(UserWarning, match=rf"SGLD: {num_warmup} warmup SG steps cannot estimate the gradient "
                                                 rf"noise.*{averaged}"):
                state = kernel.init(jax.random.key(0), num_warmup, None, (wide, wide[:, 0]), {})
        assert int(_noise_warmup(state.kernel_state).noise_state.count) == (num_warmup == 1)
