"""Driver options that change what the user writes: a kernel-level ``subsample_size`` and
``MCMC(..., jit_model_args=True)`` with the minibatch size passed as a model argument."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from numpyro_sgd import SGLD, ConstantSGD

N = 1000
_rng = np.random.default_rng(0)
X = jnp.asarray(_rng.normal(size=(N, 2)))
Y = X @ jnp.array([1.0, -0.5]) + jnp.asarray(_rng.normal(size=N))


def model(x, y, subsample_size=10):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=y[idx])


def _run(kernel, *args, progress_bar=False, **mcmc_kw):
    mcmc = MCMC(kernel, num_warmup=100, num_samples=50, progress_bar=progress_bar, **mcmc_kw)
    mcmc.run(jax.random.key(3), *args, extra_fields=("data_passes",))
    return mcmc


def test_kernel_subsample_size_is_the_model_declaring_it():
    """subsample_size=40 on the kernel draws exactly what a model declaring S = 40 draws, with
    NumPyro's N/S scaling (so the same potentials) and 40 per-datum gradients per step."""
    overridden = _run(ConstantSGD(model, preconditioner="full", subsample_size=40, steps_per_sample=1), X, Y)
    declared = _run(ConstantSGD(model, preconditioner="full", steps_per_sample=1), X, Y, 40)
    np.testing.assert_array_equal(overridden.get_samples()["w"], declared.get_samples()["w"])
    np.testing.assert_allclose(overridden.get_extra_fields()["data_passes"][-1], 150 * 40 / N)
    assert overridden.sampler.potential.plates[0].subsample_size == 40


@pytest.mark.parametrize("progress_bar", [False, True])
def test_jit_model_args_with_the_minibatch_size_as_an_argument(progress_bar):
    """NumPyro passes every argument into its compiled loop with jit_model_args=True; the kernel
    keeps Python ints static, so the plate works and the draws are those of the default path."""
    jitted = _run(SGLD(model, step_size=1e-4), X, Y, 20, jit_model_args=True, progress_bar=progress_bar)
    plain = _run(SGLD(model, step_size=1e-4), X, Y, 20)
    np.testing.assert_allclose(jitted.get_samples()["w"], plain.get_samples()["w"], rtol=1e-12)
    # continuation from the post-warmup state keeps working
    jitted.post_warmup_state = jitted.last_state
    jitted.run(jitted.post_warmup_state.rng_key, X, Y, 20)
    assert int(jitted.last_state.i) == 200


@pytest.mark.parametrize("size, match", [
    (0, "subsample_size must be an integer >= 1"),
    (2.5, "subsample_size must be an integer >= 1"),
    ({"other": 5}, r"names \['other'\], which are not subsample plates"),
    (5000, r"must be an integer in \[1, 1000\]"),
])
def test_bad_subsample_size(size, match):
    with pytest.raises(ValueError, match=match):
        _run(ConstantSGD(model, subsample_size=size), X, Y)


def test_auto_preconditioner_is_one_rule():
    """preconditioner="auto" (the default of ConstantSGD, SGFS, IASG): full up to D = 1000, diag
    above; IASG with a given ε runs Alg. 1 as written (H = I)."""
    from numpyro_sgd import IASG, SGFS
    from numpyro_sgd.numerics.preconditioners import AUTO_FULL_MAX_DIM, resolve_preconditioner

    assert resolve_preconditioner("auto", AUTO_FULL_MAX_DIM) == "full"
    assert resolve_preconditioner("auto", AUTO_FULL_MAX_DIM + 1) == "diag"
    assert resolve_preconditioner("sqrt", 5) == "sqrt"
    # (kernel, the state field holding its preconditioner, its shape for D = 2)
    table = ((ConstantSGD(model), "preconditioner", (2, 2)), (SGFS(model), "factor", (2, 2)),
             (IASG(model), "preconditioner", (2, 2)), (IASG(model, step_size=0.1), "preconditioner", ()))
    for kernel, field, shape in table:
        alg, _, theta = kernel.algorithm(jax.random.key(0), X, Y)
        state = alg.init(jax.random.key(1), theta, 100)
        assert getattr(state, field).shape == shape, (kernel, field)


def full_plate_model(x, y, subsample_size=None):
    """NumPyro's own pattern (examples/covtype.py, hmcecs.py): one model for NUTS (None: the
    plate covers all N) and for subsampling kernels."""
    w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=y[idx])


def test_one_model_for_nuts_and_sg():
    """A plate declared without subsample_size is subsampled by the kernel's subsample_size: the
    same draws as passing S as the model argument, and NumPyro's N/S scaling (the potential of a
    minibatch of all N indices is the full-data potential)."""
    by_kernel = _run(ConstantSGD(full_plate_model, preconditioner="full", subsample_size=40, steps_per_sample=1), X, Y)
    by_argument = _run(ConstantSGD(full_plate_model, preconditioner="full", steps_per_sample=1), X, Y, 40)
    np.testing.assert_array_equal(by_kernel.get_samples()["w"], by_argument.get_samples()["w"])
    potential = by_kernel.sampler.potential
    assert [(p.name, p.size, p.subsample_size) for p in potential.plates] == [("data", N, 40)]
    theta = jnp.array([0.3, -0.2])
    full = potential.potential(theta, potential.full_indices(), (X, Y))
    nuts_model_potential = numpyro.infer.util.potential_energy(full_plate_model, (X, Y), {}, {"w": theta})
    np.testing.assert_allclose(full, nuts_model_potential, rtol=1e-6)


def two_plate_model(x, y, z):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0]) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=y[idx])
    with numpyro.plate("other", z.shape[0]) as j:
        numpyro.sample("z", dist.Normal(w[0], 1.0), obs=z[j])


def unindexed_model(x, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(x @ w, 1.0), obs=y)


def test_subsampling_a_full_plate_needs_one_answer():
    """Two plates with data and an int subsample_size: which one is meant is not guessed; a dict
    picks it. A model that does not index its data by the plate's indices cannot be subsampled."""
    z = jnp.ones(50)
    with pytest.raises(ValueError, match=r"does not say which to subsample.*\['data', 'other'\].*subsample_size="):
        ConstantSGD(two_plate_model, subsample_size=10).init(jax.random.key(0), 0, None, (X, Y, z), {})
    kernel = ConstantSGD(two_plate_model, subsample_size={"data": 10})
    kernel.init(jax.random.key(0), 0, None, (X, Y, z), {})
    assert [(p.name, p.subsample_size) for p in kernel.potential.plates] == [("data", 10)]
    with pytest.raises(ValueError, match=r"subsampling plate\(s\) \['data'\].*as idx"):
        ConstantSGD(unindexed_model, subsample_size=10).init(jax.random.key(0), 0, None, (X, Y), {})


def test_a_step_that_touches_all_n_rows_warns():
    """mu = X @ w outside the plate, mu[idx] inside: the same draws, but every step does O(N)
    work; init says so (XLA cost analysis at two minibatch sizes). The per-datum model does not
    warn. N = 20,000 ≥ FULL_DATA_CHECK_MIN_N."""
    import warnings

    n = 20_000
    x = jnp.asarray(np.random.default_rng(1).normal(size=(n, 2)))
    y = x @ jnp.array([1.0, -0.5])

    def predictor_on_all_rows(x, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        mu = x @ w
        with numpyro.plate("data", x.shape[0], subsample_size=100) as idx:
            numpyro.sample("y", dist.Normal(mu[idx], 1.0), obs=y[idx])

    with pytest.warns(UserWarning, match=r"does not shrink with S.*mu\[idx\].*X\[idx\] @ w"):
        ConstantSGD(predictor_on_all_rows).init(jax.random.key(0), 0, None, (x, y), {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ConstantSGD(model).init(jax.random.key(0), 10, None, (x, y, 100), {})


def scale_model(y):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", y.shape[0], subsample_size=20) as idx:
        numpyro.sample("obs", dist.Normal(mu, sigma), obs=y[idx])


def test_a_step_onto_the_support_boundary_is_rejected():
    """exp(log σ) underflowing to σ = 0.0 is a point where the density is not defined: the step
    that lands there is rejected and counted like a non-finite one (before: SGLD at ε = 0.01 on
    this model returned σ = 0.0 exactly in 199 of 200 draws). The check itself: σ = 0.0 and
    σ = ∞ are outside the open support."""
    y = jnp.asarray(np.random.default_rng(0).normal(1.0, 0.5, 300))
    mcmc = MCMC(SGLD(scale_model, step_size=1e-2), num_warmup=0, num_samples=200, progress_bar=False)
    mcmc.run(jax.random.key(1), y)
    assert np.all(np.asarray(mcmc.get_samples()["sigma"]) > 0)
    assert int(mcmc.last_state.num_divergences) > 0
    potential = mcmc.sampler.potential

    def at(log_sigma):  # the flat unconstrained θ with log σ given
        return potential.view.ravel({"mu": jnp.asarray(0.0), "sigma": jnp.asarray(log_sigma)})

    assert bool(potential.constrained_in_support(at(0.0)))
    assert not bool(potential.constrained_in_support(at(-800.0)))  # σ = 0.0
    assert not bool(potential.constrained_in_support(at(800.0)))  # σ = inf
    from numpyro.distributions import biject_to, constraints

    from numpyro_sgd.model.discovery import in_open_support

    # NumPyro's sigmoid clips strictly inside (0, 1), so a logit of 40 stays in the support
    assert bool(in_open_support(biject_to(constraints.unit_interval), jnp.asarray(40.0, jnp.float32)))


def test_non_finite_data_are_named_before_sampling():
    """One NaN row used to make every minibatch holding it a rejected step (detected or not
    depending on the key). init now names the plate, site and rows; NaN the model masks out
    (handlers.mask with a finite filler) is allowed."""
    y = np.asarray(Y).copy()
    y[[7, 503]] = np.nan
    with pytest.raises(ValueError, match=r"site 'y' of plate 'data'.*2 row\(s\) \[7, 503\].*handlers.mask"):
        ConstantSGD(model).init(jax.random.key(0), 0, None, (X, jnp.asarray(y)), {})
    with pytest.raises(ValueError, match=r"\[7, 503\]"):  # NumPy data, vectorized chains
        ConstantSGD(model).init(jax.random.split(jax.random.key(0), 2), 0, None, (X, y), {})

    def masked_model(x, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", x.shape[0], subsample_size=10) as idx:
            yi = y[idx]
            with numpyro.handlers.mask(mask=jnp.isfinite(yi)):
                numpyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=jnp.nan_to_num(yi))

    ConstantSGD(masked_model).init(jax.random.key(0), 0, None, (X, jnp.asarray(y)), {})


def test_the_finite_check_reads_wide_data_in_small_blocks(monkeypatch):
    """all_finite reads about FINITE_CHECK_ELEMENTS values at a time whatever the width (blocks of
    10⁶ rows held 50 MB of booleans at D = 50), and still sees a NaN in the last block."""
    from numpyro_sgd.driver import init_checks as checks

    monkeypatch.setattr(checks, "FINITE_CHECK_ELEMENTS", 64)
    reads = []

    class Rows(np.ndarray):  # an ndarray that records the rows each block read asks for
        def __getitem__(self, key):
            if isinstance(key, slice):
                reads.append(key.stop - key.start)
            return super().__getitem__(key)

    wide = np.zeros((50, 20), np.float32)
    assert checks.all_finite(wide.view(Rows))
    assert set(reads) == {64 // 20} and len(reads) == 17  # 3 rows a block: 17 blocks
    wide[-1, -1] = np.nan
    assert not checks.all_finite(wide.view(Rows))
    column = np.zeros(200, np.float32)
    column[-1] = np.inf
    assert not checks.all_finite(column.view(Rows))  # 64 rows a block


def test_jax_arguments_are_checked_for_nan_in_one_program():
    """The JAX array arguments of every shape are scanned by one program: a NaN in any of them is
    found, and arrays of several shapes compile once."""
    from numpyro_sgd.driver import init_checks as checks

    x, y = jnp.zeros((7, 3)), jnp.ones(7)
    assert checks._jax_arrays_finite([x, y]) and checks._jax_arrays_finite([])
    assert not checks._jax_arrays_finite([x, y.at[6].set(jnp.nan)])
    assert not checks._jax_arrays_finite([x.at[0, 2].set(jnp.inf), y])
    size = checks._jit_all_finite._cache_size()
    checks._jax_arrays_finite([jnp.zeros((5, 2)), jnp.ones(5), jnp.ones((5, 1))])
    assert checks._jit_all_finite._cache_size() == size + 1


def test_plate_larger_than_the_data_is_refused():
    """numpyro.plate("data", 2000, ...) over 1,000 rows ran on JAX's clamped indices (the last
    row repeated, 9 sd off, no warning); it is refused at init, naming the plate and the fix,
    whether the data are arguments or closed over by the model."""

    def too_big(x, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", 2 * N, subsample_size=50) as idx:
            numpyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=y[idx])

    with pytest.raises(ValueError, match=r"plate .data. has size 2000.*out of bounds.*X.shape\[0\]"):
        ConstantSGD(too_big).init(jax.random.key(0), 0, None, (X, Y), {})

    def closed_over(size):  # data in the closure, no array argument: JAX's index checks see it
        def m():
            w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
            with numpyro.plate("data", size, subsample_size=50) as idx:
                numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=Y[idx])
        return m

    with pytest.raises(ValueError, match=r"plate 'data' has size 2000"):
        ConstantSGD(closed_over(2 * N)).init(jax.random.key(0), 0, None, (), {})
    ConstantSGD(closed_over(N)).init(jax.random.key(0), 0, None, (), {})


def test_subsample_size_equal_to_n_is_named():
    """subsample_size = N used to give "the model has no subsample plate", which is false."""
    with pytest.raises(ValueError, match=r"plate 'data' declares subsample_size equal to its size N = 1000.*NUTS"):
        ConstantSGD(model).init(jax.random.key(0), 0, None, (X, Y, N), {})
    kernel = ConstantSGD(model, subsample_size=100)  # the kernel's S still subsamples it
    kernel.init(jax.random.key(0), 0, None, (X, Y, N), {})
    assert kernel.potential.plates[0].subsample_size == 100


def test_warmup_beyond_the_int32_step_counter_is_refused():
    with pytest.raises(ValueError, match=r"2,200,000,000 warmup steps, beyond the int32 step counter"):
        ConstantSGD(model, steps_per_sample=1_100_000).init(jax.random.key(0), 2_000, None, (X, Y), {})
