"""The subsampled-potential machinery: plates, indices, scaling, per-example gradients, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.util import potential_energy

from numpyro_sgd import SGLD, ConstantSGD, SubsampledPotential
from numpyro_sgd.minibatch.shuffle import _permute


def _potential(problem):
    return SubsampledPotential.from_model(problem.model, problem.args)


def _manual_potential(problem, w, idx):
    """−log p(w) − (N/S) Σ_{n∈idx} log N(y_n | x_n·w, σ), by hand."""
    prior = jnp.sum(dist.Normal(0, problem.prior_scale).log_prob(w))
    ll = dist.Normal(problem.X[idx] @ w, problem.noise).log_prob(problem.y[idx])
    return -prior - problem.n / len(idx) * jnp.sum(ll)


def test_plate_discovery(small_linreg):
    pot = _potential(small_linreg)
    assert [(p.name, p.size, p.subsample_size) for p in pot.plates] == [("data", 2000, 50)]
    assert pot.observed == {"data": ("y",)}
    assert pot.dim == 3 and pot.num_data == 2000 and pot.batch_size == 50
    assert pot.view.names == ("w",)


def test_minibatch_potential_uses_numpyro_scaling(small_linreg):
    p = small_linreg
    pot = _potential(p)
    w = jnp.array([0.3, -0.2, 1.0])
    idx = pot.draw_indices(jax.random.key(0))
    np.testing.assert_allclose(pot.potential(w, idx, p.args), _manual_potential(p, w, idx["data"]), rtol=1e-10)
    full = pot.full_potential(w, p.args)
    np.testing.assert_allclose(full, _manual_potential(p, w, jnp.arange(p.n)), rtol=1e-10)


def test_minibatch_potential_is_unbiased(small_linreg):
    """E_idx[Û_S] = U: the mean of 400 minibatch potentials is within 4 standard errors of U."""
    p = small_linreg
    pot = _potential(p)
    w = jnp.array([0.3, -0.2, 1.0])
    keys = jax.random.split(jax.random.key(1), 400)
    vals = jax.vmap(lambda k: pot.potential(w, pot.draw_indices(k), p.args))(keys)
    se = np.std(vals) / np.sqrt(len(vals))
    assert abs(np.mean(vals) - pot.full_potential(w, p.args)) < 4 * se


def test_per_example_gradients(small_linreg):
    p = small_linreg
    pot = _potential(p)
    w = jnp.array([0.3, -0.2, 1.0])
    idx = pot.draw_indices(jax.random.key(2))
    pe, grad, (rows,) = pot.per_example_grads(w, idx, p.args)
    assert rows.shape == (p.s, p.d)
    _, g_mb = pot.potential_and_grad(w, idx, p.args)
    np.testing.assert_allclose(grad, g_mb, rtol=1e-10)
    np.testing.assert_allclose(pe, pot.potential(w, idx, p.args), rtol=1e-10)
    # row n is ∇[−log p(w) − N log p(y_n | w)] by hand
    i = idx["data"]
    resid = (p.y[i] - p.X[i] @ w) / p.noise**2
    expected = w / p.prior_scale**2 - p.n * resid[:, None] * p.X[i]
    np.testing.assert_allclose(rows, expected, rtol=1e-8)


def test_indices_change_between_steps_and_stay_in_range(small_linreg):
    pot = _potential(small_linreg)
    a = pot.draw_indices(jax.random.key(0))["data"]
    b = pot.draw_indices(jax.random.key(1))["data"]
    assert a.shape == (50,) and not np.array_equal(a, b)
    assert int(a.min()) >= 0 and int(a.max()) < 2000


@pytest.mark.parametrize("n, s, quantile", [
    (20, 15, 43.8),    # S > N/8: the first S of a random permutation; χ²(19) 99.9 % quantile
    (200, 20, 266.4),  # S ≤ N/8: i.i.d. draws with duplicates redrawn; χ²(199) 99.9 % quantile
])
def test_without_replacement_is_a_uniform_subset(n, s, quantile):
    """Draws are distinct; over many draws each datum is picked S/N of the time (χ² test; the
    finite-population correction makes the quantile conservative). Both algorithms."""
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        with numpyro.plate("data", n, subsample_size=s) as idx:
            numpyro.sample("obs", dist.Normal(mu, 1), obs=y[idx])

    pot = SubsampledPotential.from_model(model, (jnp.zeros(n),))
    keys = jax.random.split(jax.random.key(0), 4000)
    idx = jax.vmap(lambda k: pot.draw_indices(k, "without_replacement")["data"])(keys)
    idx = np.asarray(idx)
    assert all(len(set(row)) == s for row in idx)
    counts = np.bincount(idx.ravel(), minlength=n)
    expected = 4000 * s / n
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert chi2 < quantile, chi2


def test_without_replacement_near_n_is_a_permutation_prefix():
    """S = N − 1: redrawing duplicates needed about N rounds per draw (18 s per draw at
    N = 10⁴ before); the permutation path gives S distinct indices in range."""
    from numpyro_sgd.minibatch.without_replacement import subset_without_replacement

    draw = jax.jit(lambda k: subset_without_replacement(k, 10_000, 9_999))
    for i in range(3):
        idx = np.asarray(draw(jax.random.key(i)))
        assert idx.shape == (9_999,) and len(np.unique(idx)) == 9_999 and idx.min() >= 0 and idx.max() < 10_000


def test_shuffle_visits_every_datum_once_per_epoch():
    n, s = 37, 5
    key = jax.random.key(3)
    perm0 = np.asarray(jax.vmap(lambda x: _permute(key, x, n))(jnp.arange(n)))
    assert sorted(perm0) == list(range(n))

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        with numpyro.plate("data", n, subsample_size=s) as idx:
            numpyro.sample("obs", dist.Normal(mu, 1), obs=y[idx])

    pot = SubsampledPotential.from_model(model, (jnp.zeros(n),))
    draw = jax.jit(lambda t: pot.draw_indices(jax.random.key(0), "shuffle", t, key)["data"])
    steps = [np.asarray(draw(t)) for t in range(3 * n)]
    flat = np.concatenate(steps)  # 3 n steps × s = 5 epochs... take the first 3 full epochs
    for e in range(3):
        assert sorted(flat[e * n:(e + 1) * n]) == list(range(n))
    assert not np.array_equal(flat[:n], flat[n:2 * n])  # a new permutation every epoch


def test_two_subsample_plates():
    """Each plate is scaled by its own N/S; per-example rows of each plate average to ∇Û_S."""
    rng = np.random.default_rng(0)
    y1, y2 = jnp.asarray(rng.normal(1, 1, 100)), jnp.asarray(rng.normal(2, 1, 60))

    def model(y1, y2):
        a = numpyro.sample("a", dist.Normal(0, 1))
        with numpyro.plate("p1", 100, subsample_size=10) as i:
            numpyro.sample("o1", dist.Normal(a, 1), obs=y1[i])
        with numpyro.plate("p2", 60, subsample_size=6) as j:
            numpyro.sample("o2", dist.Normal(2 * a, 1), obs=y2[j])

    pot = SubsampledPotential.from_model(model, (y1, y2))
    assert pot.num_data == 160 and pot.batch_size == 16
    idx = pot.draw_indices(jax.random.key(0))
    a = jnp.array([0.4])
    manual = (-dist.Normal(0, 1).log_prob(0.4) - 10 * jnp.sum(dist.Normal(0.4, 1).log_prob(y1[idx["p1"]]))
              - 10 * jnp.sum(dist.Normal(0.8, 1).log_prob(y2[idx["p2"]])))
    np.testing.assert_allclose(pot.potential(a, idx, (y1, y2)), manual, rtol=1e-10)
    _, grad, rows = pot.per_example_grads(a, idx, (y1, y2))
    for r in rows:
        np.testing.assert_allclose(r.mean(0), grad, rtol=1e-10)


def test_full_potential_matches_numpyro_without_subsampling(small_linreg):
    p = small_linreg

    def full_model(X, y):
        w = numpyro.sample("w", dist.Normal(0, p.prior_scale).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(X @ w, p.noise), obs=y)

    w = jnp.array([0.1, 0.2, -0.3])
    expected = potential_energy(full_model, p.args, {}, {"w": w})
    np.testing.assert_allclose(_potential(p).full_potential(w, p.args), expected, rtol=1e-10)


def test_constrain_returns_support_and_global_deterministics():
    def model(y):
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        numpyro.deterministic("log_sigma", jnp.log(sigma))
        with numpyro.plate("data", y.shape[0], subsample_size=4) as idx:
            numpyro.deterministic("per_datum", y[idx] / sigma)
            numpyro.sample("obs", dist.Normal(0, sigma), obs=y[idx])

    pot = SubsampledPotential.from_model(model, (jnp.ones(10),))
    out = pot.constrain(jnp.array([np.log(2.0)]), (jnp.ones(10),))
    assert set(out) == {"sigma", "log_sigma"}
    np.testing.assert_allclose(out["sigma"], 2.0)
    np.testing.assert_allclose(out["log_sigma"], np.log(2.0))


def test_param_sites_held_at_init_values():
    def model(y):
        scale = numpyro.param("scale", 3.0)
        mu = numpyro.sample("mu", dist.Normal(0, scale))
        with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
            numpyro.sample("obs", dist.Normal(mu, 1), obs=y[idx])

    y = jnp.zeros(10)
    pot = SubsampledPotential.from_model(model, (y,))
    idx = {"data": jnp.arange(5)}
    expected = -dist.Normal(0, 3.0).log_prob(0.5) - 2 * jnp.sum(dist.Normal(0.5, 1).log_prob(y[:5]))
    np.testing.assert_allclose(pot.potential(jnp.array([0.5]), idx, (y,)), expected, rtol=1e-10)


# ---------------------------------------------------------------------------- bad models
def _no_plate(y):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("obs", dist.Normal(mu, 1), obs=y)


def _local_latent(y):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
        z = numpyro.sample("z", dist.Normal(mu, 1))
        numpyro.sample("obs", dist.Normal(z, 1), obs=y[idx])


def _discrete_latent(y):
    k = numpyro.sample("k", dist.Bernoulli(0.5))
    with numpyro.plate("data", y.shape[0], subsample_size=5) as idx:
        numpyro.sample("obs", dist.Normal(k, 1), obs=y[idx])


def _too_large(y):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("data", y.shape[0], subsample_size=y.shape[0] + 1) as idx:
        numpyro.sample("obs", dist.Normal(mu, 1), obs=y[idx])


def _too_small(y):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("data", y.shape[0], subsample_size=0) as idx:
        numpyro.sample("obs", dist.Normal(mu, 1), obs=y[idx])


def _two_plates(y):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("rows", 10, subsample_size=5, dim=-2) as i:
        with numpyro.plate("cols", 10, subsample_size=5, dim=-1) as j:
            numpyro.sample("obs", dist.Normal(mu, 1), obs=y[i][:, j])


@pytest.mark.parametrize("kernel", [ConstantSGD, lambda m: SGLD(m, step_size=1e-3)], ids=["ConstantSGD", "SGLD"])
@pytest.mark.parametrize(
    "model, match",
    [
        (_no_plate, "has no subsample plate; wrap the likelihood in numpyro.plate"),
        (_local_latent, "latent site 'z' is inside the subsample plate 'data'"),
        (_discrete_latent, "latent site 'k' is discrete"),
        (_too_large, "subsample_size=11 but size=10; use 1 <= subsample_size <= size"),
        (_too_small, "subsample_size=0 but size=10"),
        (_two_plates, "site 'obs' is inside two subsample plates"),
    ],
    ids=["no_plate", "local_latent", "discrete", "too_large", "too_small", "two_plates"],
)
def test_bad_models_fail_at_init(kernel, model, match):
    y = jnp.zeros((10, 10)) if model is _two_plates else jnp.zeros(10)
    k = kernel(model)
    with pytest.raises(ValueError, match=match):
        k.init(jax.random.key(0), 100, None, (y,), {})


def test_uniform_indices_law_and_exact_arithmetic():
    """``uniform_indices``: the 64-bit product behind the multiply-high is exact (checked against
    Python integers), every value of [0, n) appears with frequency 1/n (χ² at 10⁶ draws, 6 and
    999 degrees of freedom: a 10⁻⁴ test, seed fixed), the extreme n = 2³¹ − 1 stays in range,
    and plates (streams) of one key are not the same draw."""
    from scipy import stats

    from numpyro_sgd.minibatch.with_replacement import _mul_wide, uniform_indices

    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 2**32, 2_000, dtype=np.uint64) for _ in range(2))
    hi, lo = _mul_wide(jnp.asarray(a, jnp.uint32), jnp.asarray(b, jnp.uint32))
    got = [(int(h) << 32) + int(v) for h, v in zip(np.asarray(hi), np.asarray(lo))]
    assert got == [int(x) * int(y) for x, y in zip(a, b)]
    for n in (7, 1000):
        idx = np.asarray(uniform_indices(jax.random.key(3), 1_000_000, n))
        counts = np.bincount(idx, minlength=n)
        assert counts.size == n
        chi2 = (((counts - 1e6 / n) ** 2) / (1e6 / n)).sum()
        assert stats.chi2.sf(chi2, n - 1) > 1e-4, chi2
    big = np.asarray(uniform_indices(jax.random.key(4), 100_000, 2**31 - 1))
    assert big.min() >= 0 and big.max() < 2**31 - 1 and abs(big.mean() / (2**31 - 1) - 0.5) < 0.01
    s0, s1 = (np.asarray(uniform_indices(jax.random.key(5), 1000, 10**6, stream=j)) for j in (0, 1))
    assert np.mean(s0 == s1) < 0.01


def _fusions_with(hlo_text, *ops):
    """The computations of compiled HLO text that hold every one of ``ops``."""
    return [c for c in hlo_text.split("\n\n") if all(f" {op}(" in c for op in ops)]


def test_minibatch_indices_are_computed_once_not_inside_the_gather():
    """XLA fuses cheap elementwise producers into the consumer that reads them, a gather's index
    operand included, and then computes the producer again for every gathered element (D times
    per row). ``uniform_indices`` ends with a remainder by an n XLA cannot see as a constant,
    which XLA counts as expensive: in the compiled step of a model whose rows feed a dot, no
    computation holds both the hash (``xor``) and the gather of the rows. Without the last
    remainder the hash is fused into the gather (checked here with the same arithmetic), and a
    data pass at N = 10⁷, D = 50 was measured 2× slower. XLA's choice depends on the shapes and
    the consumers (at S = 100, D = 20, or where the gather feeds a reduction, it fuses the hash
    whatever the remainder), so the check is made at the measured shapes."""
    from numpyro_sgd.minibatch.with_replacement import _hashed_indices, uniform_indices

    n, s, d = 100_000, 10_000, 50  # the shapes measured (float32: the sizes decide XLA's fusion)

    def compiled(draw):
        def data_pass(w, key, X, y):  # constant-SGD steps of a logistic regression, in a scan
            def step(w, k):
                idx = draw(k)
                xb, yb = X[idx], y[idx]
                return w - 1e-6 * xb.T @ (jax.nn.sigmoid(xb @ w) - yb), None
            return jax.lax.scan(step, w, jax.random.split(key, 4))[0]

        return jax.jit(data_pass).lower(jax.ShapeDtypeStruct((d,), jnp.float32), jax.random.key(0),
                                        jax.ShapeDtypeStruct((n, d), jnp.float32),
                                        jax.ShapeDtypeStruct((n,), jnp.float32)).compile().as_text()

    assert not _fusions_with(compiled(lambda k: uniform_indices(k, s, n)), "xor", "gather")
    # the same values without the last remainder: the hash lands in the gather
    same = jax.jit(lambda k: _hashed_indices(k, s, n, 0).astype(jnp.int32))(jax.random.key(0))
    np.testing.assert_array_equal(same, uniform_indices(jax.random.key(0), s, n))
    assert _fusions_with(compiled(lambda k: _hashed_indices(k, s, n, 0).astype(jnp.int32)), "xor", "gather")
