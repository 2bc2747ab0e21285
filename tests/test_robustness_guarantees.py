"""The rows of ``docs/robustness.md`` that no other module tests: every row the page calls checked
has a test.

Each test gives the smallest input that the row calls bad and asserts the message the row
promises (its type and its distinctive words); where a check could fire on everything, a good
input beside it must pass. The other rows are tested where their feature is (the list at the end
of ``docs/robustness.md``). Most checks here raise at construction or at ``init``, before any
sampling; the runs are a few dozen SG steps on at most 1,000 rows.

``test_every_row_of_the_robustness_page_has_tests_that_exist`` (at the end) keeps the page true:
every table row maps, in ``ROW_TESTS``, to the tests that check its promise, and those must exist.
"""

import ast
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.sharding import Mesh
from numpyro.distributions import constraints
from numpyro.infer import MCMC

from numpyro_sgd import EWSG, IASG, SGFS, SGLD, ConstantSGD, SGWithinGibbs, VariationalEM, check_run
from numpyro_sgd.diagnostics.arviz_export import to_arviz
from numpyro_sgd.diagnostics.compare import compare, nuts_reference
from numpyro_sgd.diagnostics.loo import loo_subsample

N = 1_000
_rng = np.random.default_rng(0)
X = jnp.asarray(_rng.standard_normal((N, 2)))
Y = X @ jnp.array([1.0, -0.5]) + jnp.asarray(_rng.standard_normal(N))


def model(X, Y, subsample_size=50):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=Y[idx])


def _init(kernel, *args):
    return kernel.init(jax.random.key(0), 10, None, args, {})


# ---------------------------------------------------------------------------- at construction
@pytest.mark.parametrize("value", [0, -1.0])
def test_warmup_passes_out_of_range_names_the_range(value):
    # row "argument types and ranges": warmup_passes is the one listed argument without a range test
    with pytest.raises(ValueError, match=rf"ConstantSGD: warmup_passes must be a positive number of data passes or "
                                         rf"None \(default \d+\), got {re.escape(repr(value))}\."):
        ConstantSGD(model, warmup_passes=value)


# ---------------------------------------------------------------------------- at init
def test_numpy_array_closed_over_and_indexed_by_the_plate_names_cause_and_fix():
    """The row's second example (the first, len(np.unique(group)), is in test_model_and_argument_errors.py): a
    NumPy array closed over by the model, indexed with the plate's traced indices."""
    X_np = np.asarray(X)

    def closed_over(Y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", N, subsample_size=50) as idx:
            numpyro.sample("y", dist.Normal(X_np[idx] @ w, 1.0), obs=Y[idx])

    with pytest.raises(TypeError, match=r"ConstantSGD: the model calls NumPy or Python on a value the sampler traces "
                                        r"\(TracerArrayConversionError\).*a NumPy array closed over by the model and "
                                        r"indexed with the plate's indices") as info:
        _init(ConstantSGD(closed_over), Y)
    assert isinstance(info.value.__cause__, jax.errors.TracerArrayConversionError)  # raised `from` JAX's error


def location_scale(Y):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1))
    with numpyro.plate("data", Y.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", dist.Normal(mu, sigma), obs=Y[idx])


@pytest.mark.parametrize("sampled, args, num_chains, chain_method, init_params, error, match", [
    (location_scale, (Y,), 2, "vectorized", {"mu": 0.5, "sigma": 1.0}, IndexError, "tuple index out of range"),
    (location_scale, (Y,), 2, "sequential", {"mu": 0.5, "sigma": 1.0}, IndexError, "tuple index out of range"),
    (model, (X, Y), 3, "vectorized", {"w": jnp.zeros(2)}, ValueError,
     "`init_params` must have the same leading dimension as `num_chains`"),
], ids=["scalar-first-vectorized", "scalar-first-sequential", "leading-dimension-not-num-chains"])
def test_unbatched_init_params_with_several_chains_stop_in_numpyro(sampled, args, num_chains, chain_method,
                                                                   init_params, error, match):
    """The row says what happens before the kernel can look (issue 44): NumPyro's MCMC.run reads
    the leading dimension of the first leaf of init_params (numpyro/infer/mcmc.py, MCMC.run,
    ``jnp.shape(prototype_init_val)[0]``) for any chain_method with num_chains > 1, and raises
    before it calls the kernel's init: IndexError for a scalar there, its own ValueError for
    another leading dimension than num_chains. NumPyro calls no kernel method with init_params
    before that line, so the kernel cannot intercept it (the kernel's own message, for a first
    site whose leading dimension is num_chains, is tested in test_model_and_argument_errors.py)."""
    kernel = ConstantSGD(sampled)
    mcmc = MCMC(kernel, num_warmup=10, num_samples=5, num_chains=num_chains, chain_method=chain_method,
                progress_bar=False)
    with pytest.raises(error, match=re.escape(match)):
        mcmc.run(jax.random.key(0), *args, init_params=init_params)
    assert not kernel.is_initialized  # NumPyro raised before calling the kernel


def test_sgfs_steps_per_sample_far_below_relaxation_warns():
    """The row names ConstantSGD and SGFS (ConstantSGD's warning is in test_constant_sgd.py):
    N/S = 20 SG steps relax the chain, so steps_per_sample=1 returns near-copies."""
    # num_warmup=0: the check runs before the warmup, which need not be compiled here (so init
    # also warns that no warmup step estimates the noise: the row "the noise warmup averaged too few")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*cannot estimate the gradient noise")
        with pytest.warns(UserWarning, match=r"SGFS: steps_per_sample=1 returns a draw every 0.05 of the chain's "
                                             r"relaxation time \(20 SG steps.*effective sample size is about "
                                             r"num_samples × 0.05"):
            SGFS(model, steps_per_sample=1).init(jax.random.key(0), 0, None, (X, Y), {})
    with warnings.catch_warnings(record=True) as record:  # at the relaxation time: no such warning
        warnings.simplefilter("always")
        SGFS(model, steps_per_sample=20).init(jax.random.key(0), 0, None, (X, Y), {})
    assert not [w for w in record if "relaxation time" in str(w.message)], [str(w.message) for w in record]


def two_plates(X, Y, Z):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=Y[idx])
    with numpyro.plate("other", Z.shape[0], subsample_size=50) as j:
        numpyro.sample("z", dist.Normal(w[0], 1.0), obs=Z[j])


# a mesh over this process's one device is enough for every refusal but the divisibility one
@pytest.mark.parametrize("make, args, match", [
    (lambda: ConstantSGD(model, mesh=Mesh(np.array(jax.devices()), ("x",))), (X, Y),
     r"ConstantSGD: the mesh has no axis 'data' \(its axes: \('x',\)\); pass mesh_axis= one of them"),
    (lambda: ConstantSGD(two_plates, mesh=Mesh(np.array(jax.devices()), ("data",))), (X, Y, Y),
     r"ConstantSGD: mesh= supports models with one subsample plate; this one has \['data', 'other'\]"),
    (lambda: ConstantSGD(model, mesh=Mesh(np.array(jax.devices()), ("data",)), warmup_subsample="shuffle"), (X, Y),
     r"ConstantSGD: warmup_subsample='shuffle' is not supported with mesh=; use 'with_replacement'"),
], ids=["no-mesh-axis", "two-plates", "shuffle"])
def test_mesh_that_the_data_parallel_step_cannot_use_is_refused(make, args, match):
    with pytest.raises(ValueError, match=match):
        _init(make(), *args)


def test_mesh_with_an_ewsg_kernel_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"EWSG: mesh= is not supported: this kernel draws its minibatch indices by "
                                         r"its own rule"):
        EWSG(model, step_size=1e-3, friction=1.0, mesh=Mesh(np.array(jax.devices()), ("data",)))


MESH_SIZES = textwrap.dedent("""
    import jax, numpy as np, numpyro, numpyro.distributions as dist
    from jax.sharding import Mesh
    from numpyro_sgd import ConstantSGD
    mesh = Mesh(np.array(jax.devices()), ("data",))
    def with_minibatch(s):  # S closed over (an S model argument is traced on the mesh path)
        def model(X):
            m = numpyro.sample("m", dist.Normal(0, 1))
            with numpyro.plate("data", X.shape[0], subsample_size=s) as idx:
                numpyro.sample("x", dist.Normal(m, 1.0), obs=X[idx])
        return model
    for n, s in ((999, 50), (1000, 25), (1000, 50)):
        X = jax.numpy.asarray(np.random.default_rng(0).standard_normal(n))
        try:
            ConstantSGD(with_minibatch(s), mesh=mesh).init(jax.random.key(0), 10, None, (X,), {})
            print("accepted", n, s)
        except ValueError as e:
            print("ValueError:", e)
""")


def test_mesh_over_devices_that_do_not_divide_n_or_s_is_refused():
    """Two host devices, forced in a subprocess (XLA_FLAGS must be set before JAX starts): N odd,
    then S odd, are refused naming both sizes and the fix; N and S even are accepted."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",  # the suite's compiler options (conftest.py) kept
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip())
    out = subprocess.run([sys.executable, "-c", MESH_SIZES], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3, out.stdout
    for line, (n, s) in zip(lines[:2], ((999, 50), (1000, 25))):
        assert re.search(rf"ValueError: ConstantSGD: with mesh= over 2 devices, plate 'data' needs N = {n} and "
                         rf"S = {s} divisible by 2 .*choose subsample_size a multiple of 2", line), line
    assert lines[2] == "accepted 1000 50", lines[2]


# ---------------------------------------------------------------------------- SGWithinGibbs at init
J = 4
_g = np.repeat(np.arange(J), N // J)
GROUPS, GROUP_Y = jnp.asarray(_g), jnp.asarray(_rng.normal((1.0 + _rng.normal(size=J))[_g], 1.0))


def centred(g, y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("groups", J):
        z = numpyro.sample("z", dist.Normal(mu, tau))
    with numpyro.plate("data", y.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Normal(z[g[idx]], 1.0), obs=y[idx])


def no_latent_reads_the_data(g, y):
    """Every latent is a hyperparameter: none is a parent of the observed site."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("groups", J):
        numpyro.sample("z", dist.Normal(mu, tau))
    with numpyro.plate("data", y.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y[idx])


@pytest.mark.parametrize("hyper_sites", [None, ["mu", "tau", "z"]], ids=["detected", "given"])
def test_sg_within_gibbs_with_every_latent_a_hyper_site_is_refused(hyper_sites):
    with pytest.raises(ValueError, match=r"SGWithinGibbs: every latent site is a hyper site; at least one must be "
                                         r"left to the SG kernel"):
        _init(SGWithinGibbs(ConstantSGD(no_latent_reads_the_data), hyper_sites=hyper_sites), GROUPS, GROUP_Y)


def test_sg_within_gibbs_around_iasg_is_refused():
    with warnings.catch_warnings(), pytest.raises(
            ValueError, match=r"SGWithinGibbs: IASG's returned draws are averages of its iterates, not draws of z "
                              r"given φ.*wrap ConstantSGD, SGFS, SGLD or SGHMC"):
        warnings.filterwarnings("ignore", message=r"IASG: the window T = \d+ is short")  # N/S = 10: tested elsewhere
        _init(SGWithinGibbs(IASG(centred)), GROUPS, GROUP_Y)


# ---------------------------------------------------------------------------- a frozen chain
def cusp(X, Y):
    """A potential with a cusp at w = 0: finite there, its gradient is not."""
    w = numpyro.sample("w", dist.Normal(0, 1))
    numpyro.factor("cusp", -jnp.sqrt(jnp.abs(w)))
    with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", dist.Normal(X[idx, 0] * w, 1.0), obs=Y[idx])


@pytest.fixture(scope="module")
def frozen():
    """ConstantSGD without warmup (no noise estimate, so every step is rejected: the row "the
    noise warmup averaged too few minibatches") started at the cusp: all 20 draws are w = 0."""
    mcmc = MCMC(ConstantSGD(cusp, steps_per_sample=1), num_warmup=0, num_samples=20, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "cannot estimate the gradient noise": tested elsewhere
        mcmc.run(jax.random.key(0), X, Y, init_params={"w": jnp.asarray(0.0)})
    assert int(mcmc.last_state.num_divergences) == 20
    assert np.all(np.asarray(mcmc.get_samples()["w"]) == 0.0)
    return mcmc


def test_progress_text_counts_the_rejected_steps(frozen):
    # the text tqdm draws (rendered when drawn: tests/test_run_checks.py checks the final line)
    text = f"{frozen.sampler.get_diagnostics_str(frozen.last_state)}"
    assert re.search(r"\b20 divergences\b", text), text


def test_check_run_says_undefined_r_hat_and_ess_in_words(frozen):
    """No variance within a chain half: split R-hat and bulk ESS divide by zero; the messages say
    so in words instead of printing nan or inf."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the other messages, re-issued by pytest.warns: checked below
        with pytest.warns(UserWarning, match=r"ConstantSGD: bulk ESS undefined \(the coordinate has no variance "
                                             r"within a chain half: the chain did not move\) < 10 for w") as record:
            messages = check_run(frozen, gradient=False)
    assert any(re.search(r"ConstantSGD: split R-hat undefined \(the coordinate has no variance within a chain half: "
                         r"the chain did not move\) > 1.1 for w", m) for m in messages), messages
    assert [str(w.message) for w in record if issubclass(w.category, UserWarning)] == messages
    assert not any(re.search(r"\b(nan|-?inf)\b", m) for m in messages), messages


def test_check_run_says_a_non_finite_gradient_at_the_mean_in_words(frozen):
    """The chain's mean is w = 0, where the full-data gradient is not finite: the mode-offset check
    says it cannot measure the distance, and does not raise."""
    messages = check_run(frozen, warn=False)
    assert any(re.search(r"ConstantSGD: the full-data gradient at chain 0's mean is not finite, so its distance "
                         r"from the mode cannot be measured", m) for m in messages), messages
    assert not any("posterior sds from the mode" in m for m in messages), messages


# ---------------------------------------------------------------------------- VariationalEM progress text
def vem_model(x, y):
    lam = numpyro.param("lam", 1.0, constraint=constraints.positive)
    noise = numpyro.param("noise", 1.0, constraint=constraints.positive)
    w = numpyro.sample("w", dist.Normal(0, 1 / jnp.sqrt(lam)).expand([x.shape[1]]).to_event(1))
    with numpyro.plate("data", y.shape[0], subsample_size=20) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ w, noise), obs=y[idx])


def test_rejected_lambda_steps_are_shown_in_the_progress_text():
    """hyper_step_size=1e3 pushes λ off the support (as in test_schedules_and_exports.py, which checks
    the count and the warning): the bar's text gives the number of rejected λ-steps."""
    x = jnp.asarray(np.random.default_rng(2).normal(size=(200, 2)))
    vem = VariationalEM(SGLD(vem_model, step_size=1e-4), hyper_step_size=1e3)
    mcmc = MCMC(vem, num_warmup=5, num_samples=40, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mcmc.run(jax.random.key(0), x, 1e-3 * x[:, 0])
    rejected = int(mcmc.last_state.kernel_state.num_hyper_rejected)
    assert rejected > 0
    text = f"{vem.get_diagnostics_str(mcmc.last_state)}"
    assert re.search(rf"\b{rejected} λ-steps rejected\b", text), text


# ---------------------------------------------------------------------------- compare: a degenerate reference
REF = {"w": np.random.default_rng(3).normal(size=(2, 100, 2))}


@pytest.mark.parametrize("reference, message, kl", [
    ({"w": np.concatenate([REF["w"][..., :1], np.full_like(REF["w"][..., 1:], 0.5)], axis=-1)},
     "compare: the reference has zero variance in w[1]", np.inf),
    ({"w": REF["w"] * 1e300}, "compare: the reference has non-finite moments in w[0]", np.nan),
], ids=["frozen", "overflow"])
def test_compare_against_a_degenerate_reference_warns(reference, message, kl):
    """The row says "a run (or reference)"; the runs are tested in test_schedules_and_exports.py."""
    with pytest.warns(UserWarning, match=re.escape(message)) as record:
        table = compare({"a": REF}, reference)
    assert not [w for w in record if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in record]
    np.testing.assert_equal(table.loc["a", ["kl_q_ref", "kl_ref_q"]].to_numpy(dtype=float), [kl, kl])


# ---------------------------------------------------------------------------- exports after a shared kernel
def normal_mean(y):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    with numpyro.plate("data", y.shape[0], subsample_size=20) as idx:
        numpyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


@pytest.fixture(scope="module")
def shared_kernel_runs():
    """One kernel object run on 300 rows, then on 500: it was re-initialised since the first run."""
    kernel = SGLD(normal_mean, step_size=1e-4)
    runs = []
    for n in (300, 500):
        mcmc = MCMC(kernel, num_warmup=10, num_samples=20, progress_bar=False)
        mcmc.run(jax.random.key(0), jnp.asarray(np.random.default_rng(n).normal(size=n)))
        runs.append(mcmc)
    return runs


def test_exports_of_a_run_whose_kernel_was_reinitialised_on_other_data_are_refused(shared_kernel_runs):
    """to_arviz, loo_subsample and nuts_reference raise before any compute; check_run, which never
    raises on a run it cannot judge, reports its two gradient checks as skipped with the same cause."""
    first, second = shared_kernel_runs
    cause = (r"plate 'data' has size 300 with this run's model arguments, but the kernel was initialised since "
             r"with N = 500")
    for export, name in ((to_arviz, "to_arviz"), (loo_subsample, "loo_subsample"), (nuts_reference, "nuts_reference")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # check_run on a 20-draw run: not this test's subject
            with pytest.raises(ValueError, match=rf"{name}: {cause}"):
                export(first)
    messages = check_run(first, warn=False)
    skipped = [m for m in messages if re.search(rf"check \(\d\) was skipped.*check_run: {cause}", m)]
    assert len(skipped) == 2, skipped  # the mode-offset and the spread checks
    with warnings.catch_warnings():  # the last run of the kernel exports
        warnings.simplefilter("ignore", UserWarning)
        idata = to_arviz(second)
    assert np.asarray(idata["log_likelihood"]["obs"]).shape == (1, 20, 500)


# ---------------------------------------------------------------------------- loo_subsample: Pareto k
N_LOO = 300


def _loo_problem(outlier):
    """Data (with y[0] = ``outlier`` unless None), an initialised kernel, and the exact posterior
    N(m, v) of the mean (prior N(0, 10²), unit noise)."""
    y = np.random.default_rng(1).normal(size=N_LOO)
    if outlier is not None:
        y[0] = outlier
    precision = N_LOO + 1 / 100
    kernel = SGLD(normal_mean, step_size=1e-4)
    kernel.init(jax.random.key(0), 0, None, (jnp.asarray(y),), {})
    return kernel, (jnp.asarray(y),), y.sum() / precision, 1 / precision


def _draws(mean, sd, seed=2):
    return {"mu": mean + sd * np.random.default_rng(seed).normal(size=(2, 100))}


def test_loo_pareto_k_above_the_threshold_warns():
    """Observation 0 at y = 100, about 100 data sds from the rest: its log-likelihood varies over
    the posterior draws by ~6 nats (100 × the posterior sd 0.058), so its leave-one-out importance
    ratios are heavy-tailed and its Pareto k is above the PSIS threshold."""
    kernel, args, mean, var = _loo_problem(outlier=100.0)
    with pytest.warns(UserWarning, match=r"loo_subsample: \d+ of the 4 subsampled observations have Pareto k > "
                                         r"0\.\d+ \(max [0-9.]+\), so their PSIS-LOO terms are unreliable"):
        res = loo_subsample(kernel, _draws(mean, np.sqrt(var)), model_args=args, posterior_correction=False,
                            observations=np.arange(4))
    assert res.pareto_k[0] > res.good_k


def test_loo_posterior_correction_pareto_k_above_07_warns():
    """Draws of the right spread centred 3 posterior sds off (a biased sampler): the Gaussian g
    fitted to them is a poor proposal for p(θ, y) (the weights p/g grow along one tail), and the
    correction's own Pareto k says so (measured 1.35)."""
    kernel, args, mean, var = _loo_problem(outlier=None)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*subsampled observations have Pareto k")  # the test above
        with pytest.warns(UserWarning, match=r"loo_subsample: the posterior-approximation weights p\(θ, y\)/g\(θ\) "
                                             r"have Pareto k = [0-9.]+ > 0.7: the Gaussian g fitted to the draws is a "
                                             r"poor proposal"):
            res = loo_subsample(kernel, _draws(mean + 3 * np.sqrt(var), np.sqrt(var)), model_args=args,
                                posterior_correction=True, observations=np.arange(4))
    assert res.posterior_k > 0.7


def test_loo_of_exact_draws_on_clean_data_does_not_warn():
    """The passing case of both checks: exact posterior draws, no outlier."""
    kernel, args, mean, var = _loo_problem(outlier=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for correction in (False, True):
            res = loo_subsample(kernel, _draws(mean, np.sqrt(var)), model_args=args, posterior_correction=correction,
                                observations=np.arange(4))
            assert np.all(res.pareto_k <= res.good_k), res.pareto_k


# ---------------------------------------------------------------------------- the page itself
ROBUSTNESS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "robustness.md"
TESTS_DIR = Path(__file__).resolve().parent

#: a stable prefix of each table row's first cell (the check, or the function) -> the tests that
#: give the row's bad input and match its message ("file::function"; issue 44)
ROW_TESTS = {
    # at construction
    "argument types and ranges": [
        "test_constant_sgd.py::test_bad_arguments", "test_sgld.py::test_bad_arguments",
        "test_baselines.py::test_bad_arguments", "test_ewsg.py::test_bad_arguments", "test_iasg.py::test_bad_arguments",
        "test_sgfs.py::test_bad_arguments", "test_driver.py::test_bad_subsample_size",
        "test_default_steps.py::test_target_inflation_validated", "test_vem.py::test_bad_input",
        "test_robustness_guarantees.py::test_warmup_passes_out_of_range_names_the_range"],
    "a numeric argument given as a string": [
        "test_model_and_argument_errors.py::test_numeric_argument_given_as_string_is_a_type_error",
        "test_model_and_argument_errors.py::test_ewsgvr_and_vem_string_arguments",
        "test_model_and_argument_errors.py::test_numpy_scalars_are_accepted_as_python_values",
        "test_model_and_argument_errors.py::test_float_subsample_size_of_the_kernel_suggests_the_int"],
    "an argument after `model`": ["test_vocabulary.py::test_arguments_after_the_model_are_keyword_only"],
    "warmup options given with a user step size": ["test_default_steps.py::test_warmup_options_need_the_default_step"],
    "`SGFS(step_size=...)` without `max_step`": [
        "test_schedules_and_exports.py::test_sgfs_step_size_without_max_step_is_refused"],
    "an SGLD `step_size` schedule": ["test_schedules_and_exports.py::test_non_positive_step_size_schedule_is_refused",
                                     "test_schedules_and_exports.py::test_valid_schedules_pass_the_check"],
    # at init
    "the model has no subsample plate": ["test_potential.py::test_bad_models_fail_at_init",
                                         "test_model_and_argument_errors.py::test_model_without_a_continuous_latent_is_refused"],
    "a plate declared with a non-integer `subsample_size`": [
        "test_model_and_argument_errors.py::test_float_subsample_size_in_the_plate_is_named"],
    "the kernel's `subsample_size` ≥ N": [
        "test_model_and_argument_errors.py::test_kernel_subsample_size_equal_to_n_is_full_batch"],
    "a pandas `DataFrame`/`Series`": ["test_model_and_argument_errors.py::test_pandas_arguments_are_refused_with_the_fix"],
    "a `numpyro.param` initialised outside its constraint": [
        "test_model_and_argument_errors.py::test_param_initialised_outside_its_constraint"],
    "the model calls NumPy or Python on a traced value": [
        "test_model_and_argument_errors.py::test_numpy_logic_on_a_traced_argument_names_cause_and_fix",
        "test_robustness_guarantees.py::test_numpy_array_closed_over_and_indexed_by_the_plate_names_cause_and_fix"],
    "`init_params` of the wrong shape": ["test_model_and_argument_errors.py::test_bad_init_params_name_the_site_and_shapes",
                                         "test_model_and_argument_errors.py::test_unbatched_init_params_for_vectorized_chains",
                                         "test_model_and_argument_errors.py::test_list_init_params_are_converted"],
    "rows that look ordered": ["test_minibatch_law.py::test_ordered_rows_are_detected_and_the_default_falls_back",
                               "test_streaming.py::test_shuffle_to_writes_one_random_order_in_bounded_memory"],
    "`cluster_size` that does not divide S": ["test_minibatch_law.py::test_cluster_size_errors_name_the_fix"],
    "a plate whose minibatch is half its data or more": [
        "test_run_checks.py::test_minibatch_near_full_data_is_refused_or_warned"],
    "a minibatch between a quarter and a half": [
        "test_run_checks.py::test_minibatch_near_full_data_is_refused_or_warned"],
    "a subsample plate with fewer than 100 rows": [
        "test_run_checks.py::test_minibatch_near_full_data_is_refused_or_warned"],
    "a plate declares `subsample_size` equal to its size N": [
        "test_driver.py::test_subsample_size_equal_to_n_is_named"],
    "a site inside a subsample plate whose shape does not broadcast": [
        "test_model_and_argument_errors.py::test_model_that_does_not_index_its_data_by_the_plate_names_the_plate"],
    "`mesh=` with `chain_method=\"parallel\"`": [
        "test_model_and_argument_errors.py::test_mesh_with_parallel_chains_is_refused_with_the_fix"],
    "unbatched `init_params`": [
        "test_robustness_guarantees.py::test_unbatched_init_params_with_several_chains_stop_in_numpyro",
        "test_model_and_argument_errors.py::test_unbatched_init_params_for_vectorized_chains"],
    "the kernel's `subsample_size` for a model without subsample plates": [
        "test_driver.py::test_subsampling_a_full_plate_needs_one_answer",
        "test_model_and_argument_errors.py::test_model_without_any_plate_and_a_kernel_subsample_size_is_refused_at_once",
        "test_minibatch_law.py::test_a_model_that_keeps_all_rows_is_named_when_s_is_given"],
    "a plate larger than the data it indexes, or a model index past the data": [
        "test_driver.py::test_plate_larger_than_the_data_is_refused",
        "test_streaming.py::test_rows_are_indexed_as_numpy_does_on_every_path"],
    "a memory-mapped file changed since an earlier run": [
        "test_streaming.py::test_a_file_truncated_between_runs_is_an_error_not_a_sigbus"],
    "a streamed array used whole by the model": ["test_streaming.py::test_a_streamed_array_used_whole_is_named"],
    "the native row reader's cache": [
        "test_native.py::test_a_folder_others_can_write_is_refused_and_nothing_in_it_is_loaded",
        "test_native.py::test_a_library_that_does_not_match_its_record_is_not_loaded_and_is_rebuilt",
        "test_native.py::test_a_corrupt_recorded_library_is_rebuilt_once",
        "test_native.py::test_a_cache_folder_of_another_user_is_refused"],
    "a memory-mapped file changed while the run reads it": [
        "test_streaming.py::test_a_file_changed_while_a_program_reads_it_stops_the_run"],
    "`SGLD(model, control_variates=True)` alone on a model with group latents": [
        "test_group_control_variates.py::test_structures_it_cannot_take_are_refused_before_sampling",
        "test_group_control_variates.py::test_the_routes_that_do_not_apply_name_the_one_that_does"],
    "`control_variates=True` off the Gaussian regime": [
        "test_control_variates.py::test_a_posterior_far_from_gaussian_is_warned_at_the_end_of_warmup"],
    "NaN or inf data": ["test_driver.py::test_non_finite_data_are_named_before_sampling"],
    "the potential is not finite at the initial point": [
        "test_model_and_argument_errors.py::test_non_finite_initial_potential_is_refused_before_sampling"],
    "`init_params` lacking latent sites": ["test_model_and_argument_errors.py::test_init_params_lacking_a_site_name_it"],
    "`chain_method=\"parallel\"` with NumPy data": ["test_model_and_argument_errors.py::test_parallel_chains_with_numpy_data"],
    "warmup longer than the int32 step counter": [
        "test_driver.py::test_warmup_beyond_the_int32_step_counter_is_refused"],
    "a minibatch gradient that does O(N) work": ["test_driver.py::test_a_step_that_touches_all_n_rows_warns"],
    "an explicit `steps_per_sample` below a tenth": [
        "test_constant_sgd.py::test_steps_per_sample_far_below_relaxation_warns",
        "test_robustness_guarantees.py::test_sgfs_steps_per_sample_far_below_relaxation_warns"],
    "more than 32 MiB of model arguments": ["test_compile_once.py::test_large_closed_over_data_warns_with_the_fix"],
    "IASG: a window shorter than its theory needs": [
        "test_iasg.py::test_short_window_warns", "test_iasg.py::test_window_other_than_one_pass_warns_with_the_scale"],
    "the model has hyperparameter sites": ["test_gibbs.py::test_plain_kernel_on_a_hierarchical_model_warns",
                                           "test_gibbs.py::test_plain_kernel_does_not_recommend_sg_within_gibbs_where_it_refuses"],
    "`SGWithinGibbs`: a group latent's element that no row reads": [
        "test_gibbs.py::test_groups_with_no_rows_or_few_rows_are_named_at_init",
        "test_gibbs.py::test_few_rows_per_group_per_minibatch_warns"],
    "`SGWithinGibbs`: an unknown hyper site": [
        "test_gibbs.py::test_bad_hyper_sites_raise_before_compute",
        "test_robustness_guarantees.py::test_sg_within_gibbs_with_every_latent_a_hyper_site_is_refused",
        "test_robustness_guarantees.py::test_sg_within_gibbs_around_iasg_is_refused"],
    "`SGWithinGibbs`: a support that depends on a site of the other block": [
        "test_gibbs.py::test_a_support_that_depends_on_the_other_block_is_refused",
        "test_gibbs.py::test_support_parents"],
    "`mesh=`: the mesh lacks `mesh_axis`": [
        "test_robustness_guarantees.py::test_mesh_that_the_data_parallel_step_cannot_use_is_refused",
        "test_robustness_guarantees.py::test_mesh_with_an_ewsg_kernel_is_refused_at_construction",
        "test_robustness_guarantees.py::test_mesh_over_devices_that_do_not_divide_n_or_s_is_refused"],
    "data sharded over several devices but compiled into the loop": [
        "test_devices.py::test_parallel_chains_and_sharded_constants_on_two_devices"],
    # at the end of warmup
    "ConstantSGD-full with `steps_per_sample` left unset": [
        "test_constant_sgd.py::test_default_steps_per_sample_follow_a_misspecified_model"],
    "a noise warmup of fewer than 20 SG steps": [
        "test_diagnostics_input_errors.py::test_one_warmup_step_warns_that_the_kernel_samples_from_a_rough_estimate",
        "test_diagnostics_input_errors.py::test_no_warmup_warns_that_every_step_is_rejected",
        "test_diagnostics_input_errors.py::"
        "test_a_short_warmup_whose_window_holds_no_refresh_step_warns_that_every_step_is_rejected",
        "test_constant_sgd.py::test_short_warmup_warns",
        "test_constant_sgd.py::test_without_warmup_no_step_is_taken_silently",
        "test_default_steps.py::test_without_warmup_no_step_is_taken_silently"],
    "`control_variates=True` or `integrator=\"exponential\"` with a given": [
        "test_control_variates.py::test_control_variates_refuse_what_they_cannot_do",
        "test_group_control_variates.py::test_the_routes_that_do_not_apply_name_the_one_that_does"],
    "a memory-mapped argument (or `numpyro_sgd.stream(...)`) whose dtype": [
        "test_streaming.py::test_bad_files_are_refused_before_any_compute"],
    "memory-mapped arguments with `MCMC(..., jit_model_args=True)`": [
        "test_streaming.py::test_bad_files_are_refused_before_any_compute"],
    "data read in place (memmaps, `stream`, `open_shards`) where the native row reader cannot be built": [
        "test_streaming.py::test_without_a_compiler_the_callback_reads_with_one_warning"],
    "a streamed row asked past the data inside a program": [
        "test_streaming.py::test_a_row_past_the_data_is_an_error_naming_the_array",
        "test_streaming.py::test_bad_files_are_refused_before_any_compute"],
    "`to_arviz(..., log_likelihood=True)` whose (chains, draws, N) pointwise array": [
        "test_streaming.py::test_to_arviz_refuses_a_pointwise_log_likelihood_larger_than_memory"],
    "`control_variates=True` on a model with several subsample plates": [
        "test_control_variates.py::test_control_variates_refuse_what_they_cannot_do"],
    "`control_variates=True`: the centre": [
        "test_control_variates.py::test_newton_reaches_the_exact_mode_from_far",
        "test_control_variates.py::test_the_exponential_step_size_shrinks_with_the_nonlinearity_and_the_noise",
        "test_control_variates.py::test_control_variate_kernels_sample_the_exact_posterior",
        "test_devices.py::test_control_variates_on_two_devices_match_the_laplace_posterior"],
    "IASG: step size and window outside the validity window": [
        "test_iasg.py::test_step_size_outside_validity_window_warns"],
    "SGLD, PSGLD, SGHMC, EWSG, OverdampedEWSG with their default steps": [
        "test_default_steps.py::test_a_run_too_short_for_the_chosen_steps_warns_at_the_end_of_warmup",
        "test_default_steps.py::test_a_long_enough_run_does_not_warn",
        "test_frozen_directions.py::test_a_direction_the_steps_leave_frozen_is_named_at_the_end_of_warmup",
        "test_frozen_directions.py::test_steps_that_relax_every_coordinate_alike_do_not_warn",
        "test_frozen_directions.py::test_the_predicted_relaxation_of_the_scalar_preconditioner_is_the_measured_one",
        "test_default_steps.py::test_a_given_friction_keeps_the_curvature_coordinates"],
    # at every SG step
    "a non-finite potential, gradient, position or changed state": [
        "test_mcmc_conformance.py::test_non_finite_steps_are_rejected_and_reported",
        "test_driver.py::test_a_step_onto_the_support_boundary_is_rejected",
        "test_robustness_guarantees.py::test_progress_text_counts_the_rejected_steps",
        "test_run_checks.py::test_progress_bar_final_line_shows_final_state"],
    "VariationalEM: a λ-step whose constrained λ would leave": [
        "test_schedules_and_exports.py::test_lambda_steps_that_leave_the_support_are_rejected_and_counted",
        "test_robustness_guarantees.py::test_rejected_lambda_steps_are_shown_in_the_progress_text"],
    # after the run
    "`numpyro_sgd.check_run(mcmc)`": [
        "test_run_checks.py::test_check_run_passes_a_good_run",
        "test_run_checks.py::test_check_run_flags_a_chain_that_never_reached_the_mode",
        "test_run_checks.py::test_check_run_flags_a_frozen_direction",
        "test_run_checks.py::test_check_run_flags_draws_wider_than_the_posterior",
        "test_run_checks.py::test_check_run_reports_rejected_steps",
        "test_run_checks.py::test_check_run_reports_a_check_it_cannot_evaluate_and_runs_the_others",
        "test_run_checks.py::test_check_run_on_a_dependent_support_model_returns_messages",
        "test_robustness_guarantees.py::test_check_run_says_undefined_r_hat_and_ess_in_words",
        "test_robustness_guarantees.py::test_check_run_says_a_non_finite_gradient_at_the_mean_in_words",
        "test_diagnostics_input_errors.py::test_diagnostics_of_an_mcmc_that_was_not_run_say_call_run"],
    "`SGKernel.warn_divergences(mcmc.last_state)`": [
        "test_mcmc_conformance.py::test_non_finite_steps_are_rejected_and_reported"],
    "`diagnostics.compare(runs, reference)`": [
        "test_diagnostics.py::test_compare_against_exact_gaussian",
        "test_diagnostics.py::test_compare_mcmc_runs_against_draws",
        "test_diagnostics.py::test_nuts_reference_is_the_full_data_posterior",
        "test_schedules_and_exports.py::test_compare_degenerate_runs_warn",
        "test_schedules_and_exports.py::test_compare_site_names_and_reference_without_chains",
        "test_robustness_guarantees.py::test_compare_against_a_degenerate_reference_warns",
        "test_diagnostics_input_errors.py::test_compare_with_a_reference_run_lacking_a_site_of_the_run_names_it",
        "test_diagnostics_input_errors.py::test_compare_with_a_reference_dict_lacking_a_site_of_the_run_names_it",
        "test_diagnostics_input_errors.py::test_compare_with_a_run_lacking_a_site_of_the_reference_names_it",
        "test_diagnostics_input_errors.py::test_diagnostics_of_an_mcmc_that_was_not_run_say_call_run"],
    "`arviz.from_numpyro(mcmc, log_likelihood=True)`": [
        "test_schedules_and_exports.py::test_arviz_from_numpyro_of_a_run_exports_its_own_rows_after_the_kernel_is_reused"],
    "`diagnostics.to_arviz(mcmc)`": [
        "test_loo.py::test_to_arviz_auto_skips_above_limit",
        "test_schedules_and_exports.py::test_to_arviz_exports_the_runs_own_data",
        "test_schedules_and_exports.py::test_to_arviz_with_an_improper_prior",
        "test_schedules_and_exports.py::test_to_arviz_refuses_data_of_another_size",
        "test_schedules_and_exports.py::test_to_arviz_before_run",
        "test_robustness_guarantees.py::test_exports_of_a_run_whose_kernel_was_reinitialised_on_other_data_are_refused"],
    "`loo_subsample(...)`": [
        "test_loo.py::test_bad_input_raises_before_compute",
        "test_loo.py::test_non_finite_draws_are_named_before_compute",
        "test_robustness_guarantees.py::test_loo_pareto_k_above_the_threshold_warns",
        "test_robustness_guarantees.py::test_loo_posterior_correction_pareto_k_above_07_warns",
        "test_robustness_guarantees.py::test_loo_of_exact_draws_on_clean_data_does_not_warn",
        "test_diagnostics_input_errors.py::test_loo_subsample_reads_flat_draws_from_their_shapes",
        "test_diagnostics_input_errors.py::test_loo_subsample_with_draws_that_contradict_batch_ndims_names_the_site"],
    "`compare_loo(results)`": ["test_loo.py::test_compare_nested_models",
                               "test_loo.py::test_compare_loo_refuses_runs_fitted_to_different_responses"],
}


def _table_rows(text):
    """The first cell of every table row of a Markdown page (a header row, the one above a
    ``|---|`` line, left out)."""
    lines = text.splitlines()
    rule = re.compile(r"^\|\s*:?-")
    return [line.strip().strip("|").split(" | ")[0].strip() for i, line in enumerate(lines)
            if line.startswith("|") and not rule.match(line) and not (i + 1 < len(lines) and rule.match(lines[i + 1]))]


def _test_functions(path):
    """Names of the module-level test functions of a test file (read, not imported)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_row_of_the_robustness_page_has_tests_that_exist():
    """Every check docs/robustness.md lists maps to the tests that give its bad input (issue 44):
    a row without an entry in ROW_TESTS, an entry that matches no row or several, and an entry
    naming a test file or function that does not exist all fail here."""
    rows = _table_rows(ROBUSTNESS_PAGE.read_text(encoding="utf-8"))
    assert len(rows) > 40, rows  # the parser found the tables
    unmapped = [row[:80] for row in rows if not any(row.startswith(prefix) for prefix in ROW_TESTS)]
    assert not unmapped, f"rows of docs/robustness.md with no tests in ROW_TESTS: {unmapped}"
    doubly = [row[:80] for row in rows if sum(row.startswith(prefix) for prefix in ROW_TESTS) > 1]
    assert not doubly, f"rows of docs/robustness.md that several ROW_TESTS prefixes match: {doubly}"
    matches = {prefix: [row[:60] for row in rows if row.startswith(prefix)] for prefix in ROW_TESTS}
    stale = {prefix: found for prefix, found in matches.items() if len(found) != 1}
    assert not stale, f"ROW_TESTS prefixes that match no row or several: {stale}"
    functions = {}
    missing = []
    for prefix, tests in ROW_TESTS.items():
        assert tests, prefix
        for test in tests:
            file, name = test.split("::")
            path = TESTS_DIR / file
            if file not in functions:
                functions[file] = _test_functions(path) if path.is_file() else set()
            if name not in functions[file]:
                missing.append(test)
    assert not missing, f"tests named in ROW_TESTS that do not exist: {missing}"


def test_the_table_parser_reads_rows_and_skips_headers():
    page = "| check | you see |\n|---|---|\n| a `x | y` row | text |\n| second | more |\n\nprose | not a row\n"
    assert _table_rows(page) == ["a `x", "second"]
