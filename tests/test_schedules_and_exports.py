"""Step-size schedules and VariationalEM's hyperparameter steps are checked and take effect;
``to_arviz`` and ``compare`` export and compare a run's own data, and refuse what they cannot.

Most checks raise before any compute; the sampling runs are tiny (N = 200, S = 20, a few dozen
SG steps) and shared by a module fixture.
"""

import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.distributions import constraints
from numpyro.infer import MCMC

from numpyro_sgd import SGFS, SGLD, VariationalEM, robbins_monro
from numpyro_sgd.diagnostics.arviz_export import to_arviz
from numpyro_sgd.diagnostics.compare import compare
from numpyro_sgd.numerics.schedules import check_schedule, polynomial_annealing

N, S = 200, 20


def model(x, y):
    """Linear regression with an improper flat prior (ImproperUniform cannot be sampled)."""
    w = numpyro.sample("w", dist.ImproperUniform(constraints.real, (), (x.shape[1],)))
    with numpyro.plate("data", y.shape[0], subsample_size=S) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=y[idx])


def data(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, 2))
    return jnp.asarray(x), jnp.asarray(x @ np.array([1.0, -1.0]) + rng.normal(size=N))


@pytest.fixture(scope="module")
def runs():
    """One kernel object (with a robbins_monro schedule) used by two MCMC runs on different data
    of the same shapes: the second run re-initialises the shared kernel."""
    kernel = SGLD(model, step_size=robbins_monro(1e-3, offset=100.0))
    first, second = data(0), data(1)
    out = []
    for key, args in ((0, first), (1, second)):
        mcmc = MCMC(kernel, num_warmup=10, num_samples=30, progress_bar=False)
        mcmc.run(jax.random.key(key), *args)
        out.append((mcmc, args))
    return out


# ---------------------------------------------------------------------------- item 6: options
def test_sgfs_step_size_without_max_step_is_refused():
    # with the KL-optimal H* (Mandt Eq. 36) ε H* does not depend on ε: only the cap ε·h_max does
    with pytest.raises(ValueError, match=r"SGFS: step_size=0.001 has no effect without max_step"):
        SGFS(model, step_size=1e-3)
    SGFS(model, step_size=1e-3, max_step=0.1)  # the cap ε·h_max: accepted


@pytest.mark.parametrize("schedule, value, step", [
    (lambda t: 1e-3 - 1e-6 * t, "0", 1000),  # linear decay through zero
    (optax.linear_schedule(1e-3, 0.0, 100), "0", 100),  # decays to exactly 0 at step 100
    (lambda t: -1e-3 * (1.0 + t) ** -0.5, "-0.001", 0),  # a sign slip
    (lambda t: 1e-3 / (1e4 - t), "inf", 10_000),  # a pole
    (lambda t: jnp.nan * t, "nan", 0),
])
def test_non_positive_step_size_schedule_is_refused(schedule, value, step):
    with pytest.raises(ValueError, match=rf"SGLD: the step_size schedule gives ε_t = {value}\S* at SG step {step}\b"):
        SGLD(model, step_size=schedule)


def test_valid_schedules_pass_the_check():
    for schedule in (robbins_monro(1e-3), optax.exponential_decay(1e-3, 1000, 0.5, end_value=1e-9), 1e-3, None):
        check_schedule("SGLD", "step_size", schedule)


def test_schedules_pickle(runs):
    schedule = robbins_monro(1e-3, offset=100.0)
    assert float(pickle.loads(pickle.dumps(schedule))(7)) == float(schedule(7)) == 1e-3 * 107.0**-0.55
    kernel = SGLD(model, step_size=schedule)
    draws = []
    for k in (kernel, pickle.loads(pickle.dumps(kernel))):  # the clone steps by the same schedule
        mcmc = MCMC(k, num_warmup=0, num_samples=20, progress_bar=False)
        mcmc.run(jax.random.key(0), *data(0))
        draws.append(np.asarray(mcmc.get_samples()["w"]))
    np.testing.assert_array_equal(draws[0], draws[1])
    beta = pickle.loads(pickle.dumps(polynomial_annealing(0.5, 2.0)))
    assert float(beta(4)) == 4.0
    mcmc, _ = runs[0]  # after a run
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(mcmc)).get_samples()["w"], mcmc.get_samples()["w"])


def vem_model(x, y):
    """Two positive params: the data push ``lam`` (a prior precision) up and ``noise`` down."""
    lam = numpyro.param("lam", 1.0, constraint=constraints.positive)
    noise = numpyro.param("noise", 1.0, constraint=constraints.positive)
    w = numpyro.sample("w", dist.Normal(0, 1 / jnp.sqrt(lam)).expand([x.shape[1]]).to_event(1))
    with numpyro.plate("data", y.shape[0], subsample_size=S) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ w, noise), obs=y[idx])


@pytest.fixture(scope="module")
def wild_vem():
    """ρ₀ = 10³: each λ-step moves log λ by about 10³ (the default update is Adam-normalised),
    so exp(log λ) overflows to inf or underflows to 0.0, on the edge of the support."""
    x = jnp.asarray(np.random.default_rng(2).normal(size=(N, 2)))
    y = 1e-3 * x[:, 0]  # w ≈ 0 and almost no noise: λ → ∞, noise → 0
    vem = VariationalEM(SGLD(vem_model, step_size=1e-4), hyper_step_size=1e3)
    mcmc = MCMC(vem, num_warmup=5, num_samples=40, progress_bar=False)
    mcmc.run(jax.random.key(0), x, y, extra_fields=("kernel_state.hyper",))
    return vem, mcmc


def test_lambda_steps_that_leave_the_support_are_rejected_and_counted(wild_vem):
    vem, mcmc = wild_vem
    with pytest.warns(UserWarning, match=r"VariationalEM: \d+ λ-steps were rejected \(in 40 sampling SG steps\)"):
        lam = vem.hyperparameters(mcmc.last_state)
    # λ stays at its last value inside the open support (it used to be inf and 0.0)
    for name in ("lam", "noise"):
        assert np.isfinite(float(lam[name])) and float(lam[name]) > 0, lam
    assert int(mcmc.last_state.kernel_state.num_hyper_rejected) > 0
    trace = np.asarray(mcmc.get_extra_fields()["kernel_state.hyper"])
    assert np.all(np.isfinite(trace)) and np.all(np.abs(trace) < 709)  # exp(log λ) never inf or 0.0


def test_hyperparameters_arguments(wild_vem):
    vem, mcmc = wild_vem
    with pytest.raises(TypeError, match=r"hyperparameters: got a dict with keys \['lam'\]"):
        vem.hyperparameters({"lam": 2.0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = vem.hyperparameters(mcmc.get_extra_fields())  # the extra-fields dict works
        last = vem.hyperparameters(mcmc.last_state)
    np.testing.assert_allclose(trace["lam"][-1], last["lam"])


# ---------------------------------------------------------------------------- items 7 and 9: to_arviz
def test_to_arviz_exports_the_runs_own_data(runs):
    (first, (x0, y0)), (second, (x1, y1)) = runs
    # the shared kernel was last initialised by the second run: each export must still be its own
    for mcmc, y in ((first, y0), (second, y1)):
        idata = to_arviz(mcmc)
        np.testing.assert_array_equal(np.asarray(idata["observed_data"]["y"]), np.asarray(y))
        np.testing.assert_array_equal(np.asarray(idata["posterior"]["w"]), np.asarray(mcmc.get_samples(True)["w"]))


def test_to_arviz_with_an_improper_prior(runs):
    mcmc, (x, y) = runs[0]
    idata = to_arviz(mcmc)  # used to raise a bare NotImplementedError (sampling ImproperUniform)
    w = np.asarray(mcmc.get_samples(True)["w"])
    loglik = np.asarray(idata["log_likelihood"]["y"])
    expected = dist.Normal(jnp.einsum("cdj,nj->cdn", w, x), 1.0).log_prob(y)
    np.testing.assert_allclose(loglik, np.asarray(expected), rtol=1e-12)


def test_to_arviz_refuses_data_of_another_size(runs):
    mcmc, (x, y) = runs[0]
    with pytest.raises(ValueError, match=r"to_arviz: plate 'data' has size 100 with the model arguments given, "
                                         r"but the run used N = 200"):
        to_arviz(mcmc, x[:100], y[:100])


def test_to_arviz_before_run():
    mcmc = MCMC(SGLD(model, step_size=1e-3), num_warmup=2, num_samples=2, progress_bar=False)
    with pytest.raises(ValueError, match=r"to_arviz: this MCMC has not been run; call mcmc.run"):
        to_arviz(mcmc)


# ---------------------------------------------------------------------------- item 9, errors: compare
REF = {"w": np.random.default_rng(3).normal(size=(2, 100, 2))}


FROZEN = {"w": np.concatenate([REF["w"][..., :1], np.full_like(REF["w"][..., 1:], 0.5)], axis=-1)}


@pytest.mark.parametrize("name, run, message, kl", [
    ("frozen", FROZEN, "compare: run 'frozen' has zero variance in w[1]", np.inf),  # w[1] never moved
    ("huge", {"w": REF["w"] * 1e300}, "compare: run 'huge' has non-finite moments in w[0]", np.nan),  # overflow
])
def test_compare_degenerate_runs_warn(name, run, message, kl):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        table = compare({name: run}, REF)  # used to raise LinAlgError / return NaN with a RuntimeWarning
    assert not [w for w in record if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in record]
    messages = [str(w.message) for w in record if issubclass(w.category, UserWarning)]
    assert any(message in m for m in messages), messages
    np.testing.assert_equal(table.loc[name, ["kl_q_ref", "kl_ref_q"]].to_numpy(dtype=float), [kl, kl])


def test_compare_site_names_and_reference_without_chains():
    with pytest.raises(ValueError, match=r"compare: run 'a' has no site 'v' \(its sites: \['w'\]\)"):
        compare({"a": REF}, {"v": REF["w"]})  # names default to the reference's sites
    with pytest.raises(ValueError, match=r"compare: the reference has no site 'w' \(its sites: \['v'\]\)"):
        compare({"a": REF}, {"v": REF["w"]}, names=["w"])
    # a reference of shape (draws, ...) is one chain
    flat = compare({"a": REF}, {"w": REF["w"][0]})
    chained = compare({"a": REF}, {"w": REF["w"][:1]})
    np.testing.assert_array_equal(flat.to_numpy(), chained.to_numpy())
    with pytest.raises(ValueError, match=r"compare: the reference's site 'w' has shape \(100, 3\)"):
        compare({"a": REF}, {"w": np.zeros((100, 3))})


def test_arviz_from_numpyro_of_a_run_exports_its_own_rows_after_the_kernel_is_reused():
    """Issue 30: a kernel object used by a second run on data of another size; ArviZ's own
    ``from_numpyro`` of the first run evaluated the plate at the second run's N (the kernel's
    ``model`` fixed the plate's indices at the last init). The plate now takes all the rows of
    the data it is called with."""
    import arviz as az

    def normal(y):
        mu = numpyro.sample("mu", dist.Normal(0, 10))
        with numpyro.plate("data", y.shape[0], subsample_size=20) as idx:
            numpyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])

    kernel = SGLD(normal, step_size=1e-4)
    runs = []
    for n in (300, 500):
        mcmc = MCMC(kernel, num_warmup=10, num_samples=20, progress_bar=False)
        y = jnp.asarray(np.random.default_rng(n).normal(size=n))
        mcmc.run(jax.random.key(0), y)
        runs.append((mcmc, y))
    for mcmc, y in runs:
        loglik = np.asarray(az.from_numpyro(mcmc, log_likelihood=True)["log_likelihood"]["obs"])
        mu = np.asarray(mcmc.get_samples()["mu"])
        np.testing.assert_allclose(loglik[0], np.asarray(dist.Normal(mu[:, None], 1.0).log_prob(y)), rtol=1e-12)


def test_every_builder_takes_its_potential_then_keywords():
    """The algorithm builders have one signature: ``x(potential, *, ...)`` (a wrapper's
    ``x(inner, potential, *, ...)``), so an option is always named."""
    import importlib
    import inspect

    import numpyro_sgd

    ewsg_module = importlib.import_module("numpyro_sgd.kernels.ewsg")

    builders = [numpyro_sgd.constant_sgd, numpyro_sgd.sgfs, numpyro_sgd.iasg, numpyro_sgd.sgld, numpyro_sgd.psgld,
                numpyro_sgd.sghmc, numpyro_sgd.santa_algorithm, ewsg_module.ewsg, ewsg_module.overdamped_ewsg,
                ewsg_module.ewsg_vr, numpyro_sgd.sg_within_gibbs, numpyro_sgd.variational_em]
    positional = {b.__name__: [p.name for p in inspect.signature(b).parameters.values()
                               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)] for b in builders}
    assert {k: v for k, v in positional.items() if v not in (["potential"], ["inner", "potential"])} == {}
