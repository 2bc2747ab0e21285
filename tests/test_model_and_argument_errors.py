"""Bad arguments, models and inputs of the kernels get one clear error, naming the problem and the
fix, before any compute; sizes that used to crash (S = 10⁵, N = 10⁷) warm up."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints
from numpyro.infer import MCMC

from numpyro_sgd import EWSG, IASG, PSGLD, SGFS, SGHMC, SGLD, ConstantSGD, OverdampedEWSG, Santa, VariationalEM
from numpyro_sgd.kernels.ewsg import EWSGVR

N = 1_000
_rng = np.random.default_rng(0)
X = _rng.standard_normal((N, 2))
Y = X @ np.array([1.0, -0.5]) + _rng.standard_normal(N)
GROUP = _rng.integers(0, 3, N)


def model(X, Y, subsample_size=50):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=Y[idx])


def _init(kernel, *args, init_params=None, rng_key=None, num_warmup=10):
    rng_key = jax.random.key(0) if rng_key is None else rng_key
    return kernel.init(rng_key, num_warmup, init_params, args, {})


# ---------------------------------------------------------------------------- case 1: subsample_size
def test_float_subsample_size_in_the_plate_is_named():
    # before: IndexError "only integers, slices ... are valid indices" from inside the model
    with pytest.raises(ValueError, match=r"plate 'data' has subsample_size=50.0 \(float\), not an integer.*"
                                         r"subsample_size=50\."):
        _init(ConstantSGD(model), X, Y, 50.0)


def test_float_subsample_size_of_the_kernel_suggests_the_int():
    with pytest.raises(ValueError, match=r"ConstantSGD: subsample_size must be an integer >= 1.*got 50.0; "
                                         r"pass subsample_size=50\."):
        ConstantSGD(model, subsample_size=50.0)


def test_kernel_subsample_size_equal_to_n_is_full_batch():
    # before: "the model has no subsample plate", which is false (the plate is declared without S)
    with pytest.raises(ValueError, match=r"subsample_size=1000 is at least the size N = 1000 of plate 'data'.*"
                                         r"full-batch gradient descent or Langevin.*Use NUTS"):
        _init(ConstantSGD(model, subsample_size=N), X, Y, None)


# ---------------------------------------------------------------------------- case 2: argument types
# every numeric constructor argument of every kernel, given as a string: a TypeError naming it
STRING_ARGS = [
    pytest.param(ConstantSGD, {"step_size": "0.1"}, "step_size", id="ConstantSGD-step_size"),
    pytest.param(ConstantSGD, {"momentum": "0.9"}, "momentum", id="ConstantSGD-momentum"),
    pytest.param(ConstantSGD, {"steps_per_sample": "10"}, "steps_per_sample", id="driver-steps_per_sample"),
    pytest.param(ConstantSGD, {"warmup_passes": "5"}, "warmup_passes", id="driver-warmup_passes"),
    pytest.param(ConstantSGD, {"subsample_size": "50"}, "subsample_size", id="driver-subsample_size"),
    pytest.param(ConstantSGD, {"adam_fraction": "0.3"}, "adam_fraction", id="warmup-adam_fraction"),
    pytest.param(SGFS, {"step_size": "0.1", "max_step": 1.0}, "step_size", id="SGFS-step_size"),
    pytest.param(SGFS, {"refresh_every": "2"}, "refresh_every", id="SGFS-refresh_every"),
    pytest.param(IASG, {"step_size": "0.1"}, "step_size", id="IASG-step_size"),
    pytest.param(IASG, {"window": "10"}, "window", id="IASG-window"),
    pytest.param(IASG, {"window_error": "0.1"}, "window_error", id="IASG-window_error"),
    pytest.param(SGLD, {"step_size": "0.1"}, "step_size", id="SGLD-step_size"),
    pytest.param(SGLD, {"temperature": "1"}, "temperature", id="SGLD-temperature"),
    pytest.param(PSGLD, {"step_size": "0.1"}, "step_size", id="PSGLD-step_size"),
    pytest.param(PSGLD, {"damping": "1e-5"}, "damping", id="PSGLD-damping"),
    pytest.param(SGHMC, {"step_size": "0.1"}, "step_size", id="SGHMC-step_size"),
    pytest.param(SGHMC, {"friction": "1"}, "friction", id="SGHMC-friction"),
    pytest.param(EWSG, {"num_index_steps": "2"}, "num_index_steps", id="EWSG-num_index_steps"),
    pytest.param(OverdampedEWSG, {"step_size": "0.1"}, "step_size", id="OverdampedEWSG-step_size"),
    pytest.param(Santa, {"step_size": "0.1"}, "step_size", id="Santa-step_size"),
    pytest.param(Santa, {"burnin": "10"}, "burnin", id="Santa-burnin"),
    pytest.param(Santa, {"decay": "0.9"}, "decay", id="Santa-decay"),
]


@pytest.mark.parametrize("kernel_cls, kwargs, arg", STRING_ARGS)
def test_numeric_argument_given_as_string_is_a_type_error(kernel_cls, kwargs, arg):
    # before: "0.1" was parsed by float() and accepted, or a bare Python comparison TypeError
    with pytest.raises(TypeError, match=rf"{kernel_cls.__name__}: {arg} must be .*got '.*' \(a str\).*strings are "
                                        "not converted"):
        kernel_cls(model, **kwargs)


def test_ewsgvr_and_vem_string_arguments():
    with pytest.raises(TypeError, match=r"EWSGVR: calibration_period must be an integer >= 1, got '2'"):
        EWSGVR(model, step_size=0.1, friction=1.0, calibration_period="2")
    with pytest.raises(TypeError, match=r"VariationalEM: hyper_step_size must be .*got '0.1' \(a str\)"):
        VariationalEM(ConstantSGD(model), hyper_step_size="0.1")


NUMPY_ARGS = [
    pytest.param(ConstantSGD, dict(steps_per_sample=np.int64(10), warmup_passes=np.float32(5),
                                   subsample_size=np.int64(50), momentum=np.float32(0.9)), id="ConstantSGD"),
    pytest.param(SGFS, dict(step_size=np.float32(0.1), max_step=np.float64(1.0), refresh_every=np.int64(2)),
                 id="SGFS"),
    pytest.param(IASG, dict(step_size=np.float32(0.1), window=np.int64(10)), id="IASG"),
    pytest.param(SGLD, dict(step_size=np.float32(0.1), temperature=np.float32(1.0)), id="SGLD"),
    pytest.param(PSGLD, dict(step_size=np.float32(0.1), damping=np.float32(1e-5)), id="PSGLD"),
    pytest.param(SGHMC, dict(step_size=np.float32(0.1), friction=np.int64(1)), id="SGHMC"),
    pytest.param(EWSG, dict(step_size=np.float32(0.1), friction=np.float32(1.0), num_index_steps=np.int64(2)),
                 id="EWSG"),
    pytest.param(Santa, dict(step_size=np.float32(0.1), burnin=np.int64(10), thermostat_init=np.float32(1.0)),
                 id="Santa"),
]


@pytest.mark.parametrize("kernel_cls, kwargs", NUMPY_ARGS)
def test_numpy_scalars_are_accepted_as_python_values(kernel_cls, kwargs):
    # before: np.int64 refused for SGFS refresh_every, IASG window, Santa burnin
    kernel = kernel_cls(model, **kwargs)
    for value in jax.tree.leaves((kernel.driver_options, getattr(kernel, "_options", {}))):
        assert not isinstance(value, np.generic), kwargs


# ---------------------------------------------------------------------------- case 3: pandas
def test_pandas_arguments_are_refused_with_the_fix():
    pd = pytest.importorskip("pandas")
    # before: KeyError "None of [Index([0, 1, ...])] are in the [columns]" (X[idx] selects columns)
    with pytest.raises(TypeError, match=r"model argument model_args\[0\] is a pandas DataFrame; pass an array, "
                                        r"e.g. df.to_numpy\(\)"):
        _init(ConstantSGD(model), pd.DataFrame(X), pd.Series(Y))


# ---------------------------------------------------------------------------- case 4: NumPy logic on traced data
def grouped_model(X, Y, group):
    n_groups = len(np.unique(group))  # NumPy logic on a model argument
    a = numpyro.sample("a", dist.Normal(0, 1).expand([n_groups]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", dist.Normal(X[idx, 0] + a[group[idx]], 1.0), obs=Y[idx])


def test_numpy_logic_on_a_traced_argument_names_cause_and_fix():
    # before: TracerArrayConversionError with a jaxpr dump from the compiled init
    with pytest.raises(TypeError, match=r"ConstantSGD: the model calls NumPy or Python on a value the sampler "
                                        r"traces \(TracerArrayConversionError\).*n_groups=len\(np.unique\(group\)\)"
                       ) as info:
        _init(ConstantSGD(grouped_model), X, Y, GROUP)
    assert isinstance(info.value.__cause__, jax.errors.TracerArrayConversionError)  # raised `from` JAX's error


# ---------------------------------------------------------------------------- case 5: init_params
@pytest.mark.parametrize("value, error, match", [
    (jnp.array([jnp.nan, 0.0]), ValueError, r"init_params\['w'\] is not finite \(\[nan, 0.0\]\)"),
    (jnp.zeros(3), ValueError, r"init_params\['w'\] has shape \(3,\), expected \(2,\), the site's unconstrained"),
    (["a", "b"], TypeError, r"init_params\['w'\] (is not an array of numbers|has dtype)"),
])
def test_bad_init_params_name_the_site_and_shapes(value, error, match):
    # before: "the potential is not finite at the initial point"; a cond-branch shape error from
    # the warmup; a bare ravel TypeError
    with pytest.raises(error, match=match):
        _init(ConstantSGD(model), X, Y, init_params={"w": value})


def test_unbatched_init_params_for_vectorized_chains():
    # before: a shape error from inside the compiled init (or NumPyro's IndexError for a scalar site)
    with pytest.raises(ValueError, match=r"init_params\['w'\] has shape \(2,\), expected \(2, 2\).*leading "
                                         r"dimension of 2"):
        _init(ConstantSGD(model), X, Y, init_params={"w": jnp.zeros(2)}, rng_key=jax.random.split(jax.random.key(0)))


def test_list_init_params_are_converted():
    # num_warmup=0: init returns the initial point (otherwise the state after warmup)
    state = _init(ConstantSGD(model), X, Y, init_params={"w": [0.25, -0.5]}, num_warmup=0)
    np.testing.assert_array_equal(state.z["w"], [0.25, -0.5])


# ---------------------------------------------------------------------------- case 6: chain_method="parallel"
PARALLEL = textwrap.dedent("""
    import jax, numpy as np, numpyro, numpyro.distributions as dist
    from numpyro.infer import MCMC
    from numpyro_sgd import SGLD
    X = np.random.default_rng(0).standard_normal(1000)  # NumPy data
    def model(X):
        m = numpyro.sample("m", dist.Normal(0, 1))
        with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
            numpyro.sample("x", dist.Normal(m, 1.0), obs=X[idx])
    mcmc = MCMC(SGLD(model, step_size=1e-4), num_warmup=5, num_samples=5, num_chains=2,
                chain_method="parallel", progress_bar=False)
    mcmc.run(jax.random.key(0), X)
    print(jax.local_device_count(), mcmc.get_samples(group_by_chain=True)["m"].shape)
""")


def test_parallel_chains_with_numpy_data():
    # before: TracerArrayConversionError from the model trace under pmap (indices are tracers there)
    env = dict(os.environ, JAX_PLATFORMS="cpu",  # the suite's compiler options (conftest.py) kept
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip())
    out = subprocess.run([sys.executable, "-c", PARALLEL], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "2 (2, 5)"


# ---------------------------------------------------------------------------- case 7: numpyro.param
def param_model(X, Y):
    s = numpyro.param("s", -1.0, constraint=constraints.positive)
    w = numpyro.sample("w", dist.Normal(0, s).expand([2]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=Y[idx])


@pytest.mark.parametrize("make", [SGLD, lambda m: VariationalEM(ConstantSGD(m))], ids=["SGLD", "VariationalEM"])
def test_param_initialised_outside_its_constraint(make):
    # before: "Normal distribution got invalid scale parameter" (no site named), or λ = NaN
    with pytest.raises(ValueError, match=r"numpyro.param site 's' is initialised at -1.0, outside its constraint "
                                         r"Positive"):
        _init(make(param_model), X, Y)


# ---------------------------------------------------------------------------- case 8: large sizes
@pytest.fixture
def float32():
    """JAX's default int32/float32 (the suite runs in float64, where a Python int S² fits int64)."""
    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", True)


def _large_run(kernel_cls, n, s, **kwargs):
    x = jnp.asarray(np.random.default_rng(1).standard_normal(n, dtype=np.float32))
    y = 0.5 * x + jnp.asarray(np.random.default_rng(2).standard_normal(n, dtype=np.float32))

    def linear(x, y):
        w = numpyro.sample("w", dist.Normal(0, 1))
        with numpyro.plate("data", x.shape[0], subsample_size=s) as idx:
            numpyro.sample("y", dist.Normal(x[idx] * w, 1.0), obs=y[idx])

    mcmc = MCMC(kernel_cls(linear, steps_per_sample=2, warmup_passes=2, **kwargs), num_warmup=4, num_samples=2,
                progress_bar=False, jit_model_args=True)
    mcmc.run(jax.random.key(0), x, y)
    return mcmc


def test_full_noise_warmup_at_s_50000(float32):
    # before: OverflowError "... Got <class 'int'> with value 2500000000" (S² as an int32)
    mcmc = _large_run(ConstantSGD, 1_000_000, 50_000, preconditioner="full")
    assert np.isfinite(np.asarray(mcmc.get_samples()["w"])).all()
    assert int(mcmc.last_state.num_divergences) == 0


@pytest.mark.slow
@pytest.mark.parametrize("kernel_cls, kwargs", [
    (ConstantSGD, dict(preconditioner="full")), (ConstantSGD, dict(noise_estimator="pooled")),
    (SGFS, dict(preconditioner="full")), (SGLD, {}), (SGHMC, {}), (Santa, {}), (OverdampedEWSG, {}),
])
def test_warmup_at_s_100000_n_10_million(kernel_cls, kwargs, float32):
    mcmc = _large_run(kernel_cls, 10_000_000, 100_000, **kwargs)
    w = np.asarray(mcmc.get_samples()["w"])
    assert np.isfinite(w).all() and int(mcmc.last_state.num_divergences) == 0


def test_non_finite_initial_potential_is_refused_before_sampling():
    """A model whose potential is infinite at the initial point (here a factor that is −∞ unless
    w > 100) stops at init with the cause and the fixes, instead of sampling from a rejected state."""
    def bad(X, Y):
        w = numpyro.sample("w", dist.Normal(0, 1000.0).expand([2]).to_event(1))
        numpyro.factor("support", jnp.where(jnp.all(w > 100.0), 0.0, -jnp.inf))
        with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=Y[idx])

    with pytest.raises(ValueError, match="potential is not finite at the initial point.*init_params"):
        _init(ConstantSGD(bad), X, Y)


def test_init_params_lacking_a_site_name_it():
    with pytest.raises(ValueError, match=r"init_params lacks the latent sites \['w'\]"):
        _init(ConstantSGD(model), X, Y, init_params={})


def test_model_without_a_continuous_latent_is_refused():
    def no_latent(X, Y):
        with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ jnp.ones(2), 1.0), obs=Y[idx])

    with pytest.raises(ValueError, match="no continuous latent sample site"):
        _init(SGLD(no_latent, step_size=1e-3), X, Y)


# ---------------------------------------------------------------------------- issue 30: unclear errors
def test_model_that_does_not_index_its_data_by_the_plate_names_the_plate():
    # before: JAX's "Incompatible shapes for broadcasting: shapes=[(50,), (1000,)]", no plate named
    def unindexed(X, Y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=50):
            numpyro.sample("y", dist.Normal(X @ w, 1.0), obs=Y)

    with pytest.raises(ValueError, match=r"ConstantSGD: a site inside the subsample plate 'data' \(N = 1000, "
                                         r"subsample_size = 50\).*Index every data array by the plate's indices"):
        _init(ConstantSGD(unindexed), X, Y)


MESH_PARALLEL = textwrap.dedent("""
    import jax, numpy as np, numpyro, numpyro.distributions as dist
    from jax.sharding import Mesh
    from numpyro.infer import MCMC
    from numpyro_sgd import ConstantSGD
    X = np.random.default_rng(0).standard_normal(1000)
    def model(X):
        m = numpyro.sample("m", dist.Normal(0, 1))
        with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
            numpyro.sample("x", dist.Normal(m, 1.0), obs=X[idx])
    mesh = Mesh(np.array(jax.devices()), ("data",))
    mcmc = MCMC(ConstantSGD(model, mesh=mesh), num_warmup=20, num_samples=5, num_chains=2,
                chain_method="parallel", progress_bar=False)
    try:
        mcmc.run(jax.random.key(0), jax.numpy.asarray(X))
    except ValueError as e:
        print("ValueError:", e)
""")


def test_mesh_with_parallel_chains_is_refused_with_the_fix():
    # before: JAX's "Context mesh ... should match the mesh of sharding", pointing at the model's X[idx]
    env = dict(os.environ, JAX_PLATFORMS="cpu",  # the suite's compiler options (conftest.py) kept
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip())
    out = subprocess.run([sys.executable, "-c", MESH_PARALLEL], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ValueError: ConstantSGD: mesh= splits the data rows" in out.stdout, out.stdout[-2000:]
    assert "chain_method='vectorized'" in out.stdout


def test_model_without_any_plate_and_a_kernel_subsample_size_is_refused_at_once():
    # issue 30: NumPyro's divorce regression as written (no plate at all) with subsample_size=1000
    # ran for minutes without output in an earlier version
    def no_plate(X, Y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        numpyro.sample("y", dist.Normal(X @ w, 1.0), obs=Y)

    with pytest.raises(ValueError, match=r"ConstantSGD: no plate of the model subsamples, and subsample_size=500 does "
                                         r"not say which to subsample: the plates holding observed sites are none"):
        _init(ConstantSGD(no_plate, preconditioner="full", subsample_size=500), X, Y)
