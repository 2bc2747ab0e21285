"""Control variates for group latents: ``SGWithinGibbs(SGLD(model, control_variates=True))``.

* The block-arrowhead algebra against dense NumPy (products, solves, the law of the draws).
* A linear mixed model against its exact posterior (``lmm_reference``: β and the a_g integrate
  out given σ, τ; a grid over them), at 3 rows of a group per minibatch: a third of what
  ``SGWithinGibbs(ConstantSGD(model))`` needs.
* When the centre is searched (first step, end of warmup; never while sampling) and the prior's
  blocks (with and without a prior that couples β and a).
* What the route refuses, before any sampling, naming the sites and the fix.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from lmm_reference import lmm_reference
from numpyro.infer import MCMC

from numpyro_sgd import SGHMC, SGLD, SGWithinGibbs
from numpyro_sgd.numerics.arrowhead import GroupLayout, factor, from_probes, probes

N, G, D, S = 20_000, 200, 3, 600


def _arrowhead_problem(seed=0, groups=7, d_l=2, d_g=3):
    rng = np.random.default_rng(seed)
    dim = d_g + groups * d_l
    perm = rng.permutation(dim)
    layout = GroupLayout(perm[:d_g], perm[d_g:].reshape(groups, d_l))
    h = np.zeros((dim, dim))
    m = rng.normal(size=(d_g, d_g))
    h[np.ix_(layout.global_index, layout.global_index)] = m @ m.T + d_g * np.eye(d_g)
    for g in range(groups):
        c = rng.normal(size=(d_l, d_l))
        block = c @ c.T + 0.3 * np.eye(d_l)  # positive definite, not diagonally dominant
        b = 0.3 * rng.normal(size=(d_l, d_g))
        li = layout.local_index[g]
        h[np.ix_(li, li)] = block
        h[np.ix_(li, layout.global_index)] = b
        h[np.ix_(layout.global_index, li)] = b.T
    return layout, h


def test_arrowhead_products_solves_and_draws_match_dense():
    layout, h = _arrowhead_problem()
    assert np.all(np.linalg.eigvalsh(h) > 0)
    matrix = from_probes(layout, jnp.asarray(probes(layout, np.float32) @ h.astype(np.float32)))
    v = np.random.default_rng(1).normal(size=h.shape[0])
    vj = jnp.asarray(v, jnp.float32)
    np.testing.assert_allclose(matrix.matvec(layout, vj), h @ v, rtol=1e-4, atol=1e-4)
    chol = factor(matrix, jitter=0.0)
    np.testing.assert_allclose(chol.solve(layout, vj), np.linalg.solve(h, v), rtol=1e-3, atol=1e-4)
    noise = jax.random.normal(jax.random.key(0), (40_000, h.shape[0]), jnp.float32)
    draws = np.asarray(jax.vmap(lambda x: chol.sample(layout, x))(noise), np.float64)
    cov = np.linalg.inv(h)
    # the sample covariance of 40,000 draws: each entry within 5 standard errors
    se = np.sqrt((cov**2 + np.outer(np.diag(cov), np.diag(cov))) / draws.shape[0])
    assert np.all(np.abs(np.cov(draws.T) - cov) < 5 * se)


def test_arrowhead_factor_makes_an_indefinite_matrix_positive_and_keeps_a_definite_one():
    layout, h = _arrowhead_problem()
    assert np.all(np.linalg.eigvalsh(h) > 0)
    matrix = from_probes(layout, jnp.asarray(probes(layout, np.float32) @ h.astype(np.float32)))
    v = jnp.asarray(np.random.default_rng(3).normal(size=h.shape[0]), jnp.float32)
    np.testing.assert_allclose(factor(matrix).solve(layout, v), np.linalg.solve(h, np.asarray(v)), rtol=2e-3,
                               atol=2e-3)
    bad = matrix._replace(glob=matrix.glob - 10 * jnp.eye(matrix.glob.shape[0], dtype=matrix.glob.dtype),
                          local=matrix.local.at[:, 0].set(-matrix.local[:, 0]))
    step = factor(bad).solve(layout, v)
    assert np.all(np.isfinite(np.asarray(step)))
    assert float(v @ step) > 0  # a descent direction for a gradient v


def _data(seed=0):
    rng = np.random.default_rng(seed)
    g = rng.permutation(np.repeat(np.arange(G), N // G)).astype(np.int32)
    X = rng.normal(size=(N, D)).astype(np.float32)
    X[:, 0] = 1.0
    a = 0.6 * rng.normal(size=G)
    y = (X @ np.array([0.5, -1.0, 0.8]) + a[g] + 1.2 * rng.normal(size=N)).astype(np.float32)
    return X, g, y


def lmm(X, g, y):
    beta = numpyro.sample("beta", dist.Normal(0.0, 5.0).expand([D]).to_event(1))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("groups", G):
        a = numpyro.sample("a", dist.Normal(0.0, tau))
    with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta + a[g[idx]], sigma), obs=y[idx])


def _assert_within(draws, reference, wide):
    """Every site's means within 0.15 reference sd and sds within 10 %; the site ``wide`` (many
    coordinates: the maxima over them) within 0.2 sd and 15 %."""
    for site, (mean, sd) in reference.items():
        x = np.asarray(draws[site], np.float64)
        mean_err = np.max(np.abs(x.mean(0) - mean) / sd)
        sd_err = np.max(np.abs(x.std(0) / sd - 1))
        tol = (0.2, 0.15) if site == wide else (0.15, 0.10)
        assert mean_err < tol[0] and sd_err < tol[1], (site, mean_err, sd_err)


def test_linear_mixed_model_matches_its_exact_posterior():
    """3 rows of each group per minibatch (S = 600, 200 groups of 100 rows). Tolerances: 2 chains
    × 800 draws with about 0.4 effective samples per draw give a Monte Carlo sd of the mean of
    ~0.04 posterior sd and of the sd of ~3 %: means within 0.15 sd and sds within 10 % for β, σ,
    τ; the maxima over 200 groups within 0.2 sd and 15 %."""
    X, g, y = _data()
    reference = lmm_reference(X, g, y, G)
    assert reference.pop("grid_edge_weight") < 1e-6
    mcmc = MCMC(SGWithinGibbs(SGLD(lmm, control_variates=True)), num_warmup=60, num_samples=800, num_chains=2,
                chain_method="vectorized", jit_model_args=True, progress_bar=False)
    mcmc.run(jax.random.key(0), jnp.asarray(X), jnp.asarray(g), jnp.asarray(y))
    _assert_within(mcmc.get_samples(), reference, wide="a")
    state = mcmc.last_state.kernel_state.inner
    assert np.all(np.asarray(state.centre.decrement) < 0.01)  # the centre converged
    assert np.all(np.asarray(state.passes) <= 20)


def crossed(X, g, h, y):
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("users", 10):
        u = numpyro.sample("u", dist.Normal(0.0, tau))
    with numpyro.plate("items", 7):
        v = numpyro.sample("v", dist.Normal(0.0, tau))
    with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", dist.Normal(u[g[idx]] + v[h[idx]], 1.0), obs=y[idx])


def two_memberships(X, g, h, y):
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", 10):
        u = numpyro.sample("u", dist.Normal(0.0, tau))
    with numpyro.plate("data", X.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", dist.Normal(u[g[idx]] + u[h[idx]], 1.0), obs=y[idx])


@pytest.mark.parametrize("model, match", [
    (crossed, r"2 group plates \(\{'items': \['v'\], 'users': \['u'\]\}\): crossed effects"),
    (two_memberships, r"the likelihood of a row couples the coordinates of different groups.*\['u'\]"),
])
def test_structures_it_cannot_take_are_refused_before_sampling(model, match):
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.normal(size=(500, 2)), jnp.float32)
    g, h = jnp.asarray(np.arange(500) % 10), jnp.asarray(np.arange(500) % 7)
    y = jnp.asarray(rng.normal(size=500), jnp.float32)
    mcmc = MCMC(SGWithinGibbs(SGLD(model, control_variates=True)), num_warmup=5, num_samples=5, progress_bar=False)
    with pytest.raises(ValueError, match=match):
        mcmc.run(jax.random.key(0), X, g, h, y)


def test_the_routes_that_do_not_apply_name_the_one_that_does():
    X, g, y = (jnp.asarray(a) for a in _data())
    with pytest.raises(ValueError, match=r"SGLD: control_variates=True on a random-effects model \(group latents "
                                         r"\['a'\] in plate 'groups', 200 groups; hyperparameters \['tau'\]\).*"
                                         r"Use SGWithinGibbs\(SGLD\(model, control_variates=True\)\)"):
        MCMC(SGLD(lmm, control_variates=True), num_warmup=5, num_samples=5, progress_bar=False).run(
            jax.random.key(0), X, g, y)
    with pytest.raises(ValueError, match=r"SGHMC\(control_variates=True\) has no control variates for group latents; "
                                         r"use SGWithinGibbs\(SGLD\(model, control_variates=True\)\)"):
        SGWithinGibbs(SGHMC(lmm, control_variates=True))
    with pytest.raises(ValueError, match="leave step_size and integrator to it"):
        SGWithinGibbs(SGLD(lmm, control_variates=True, integrator="euler"))


def test_the_prior_blocks_match_the_dense_hessian_with_and_without_coupling():
    """prior_part reads A, B and C apart; with ``cross=False`` B is taken as zero, which is
    right only for a prior that does not couple β and a (the kernel finds which at init)."""
    from types import SimpleNamespace

    from numpyro_sgd.adaptation.group_centre import prior_part

    layout = GroupLayout(np.array([6, 7, 8]), np.arange(6).reshape(3, 2))

    def decoupled(t):
        a, b = t[:6].reshape(3, 2), t[6:]
        return jnp.sum(jnp.log1p(a**2)) + 0.5 * jnp.sum(b**2) + jnp.sum(a[:, 0] * a[:, 1])

    def coupled(t):
        a, b = t[:6].reshape(3, 2), t[6:]
        return decoupled(t) + 0.5 * jnp.sum((a[:, 0] - b[0]) ** 2 * jnp.exp(b[1]))

    theta = jax.random.normal(jax.random.key(3), (9,))
    v = jax.random.normal(jax.random.key(4), (9,))
    for fn, cross in ((decoupled, False), (decoupled, True), (coupled, True)):
        grad, hessian = prior_part(SimpleNamespace(prior_potential=fn), theta, layout, cross)
        np.testing.assert_allclose(grad, jax.grad(fn)(theta), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(hessian.matvec(layout, v), jax.hessian(fn)(theta) @ v, rtol=1e-4, atol=1e-5)
    _, hessian = prior_part(SimpleNamespace(prior_potential=coupled), theta, layout, False)
    assert not np.allclose(hessian.matvec(layout, v), jax.hessian(coupled)(theta) @ v, atol=1e-3)


def coupled_lmm(X, g, y):
    """The LMM with its intercept as the groups' mean: the prior couples β and a."""
    beta = numpyro.sample("beta", dist.Normal(0.0, 5.0).expand([D]).to_event(1))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("groups", G):
        a = numpyro.sample("a", dist.Normal(beta[0], tau))
    with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
        numpyro.sample("y", dist.Normal(X[idx, 1:] @ beta[1:] + a[g[idx]], sigma), obs=y[idx])


def test_the_centre_is_searched_at_the_first_step_and_at_the_end_of_warmup_only():
    """Warmup and sampling are one program (the step searches when due): no search while
    sampling, and without warmup one search at the first sampling step. The prior's coupling of
    β and a is found at init (none in the LMM; the intercept as the groups' mean couples them)."""
    X, g, y = (jnp.asarray(a) for a in _data())
    kernel = SGWithinGibbs(SGLD(lmm, control_variates=True))
    mcmc = MCMC(kernel, num_warmup=20, num_samples=30, progress_bar=False, jit_model_args=True)
    mcmc.warmup(jax.random.key(0), X, g, y)
    after_warmup = float(mcmc.post_warmup_state.kernel_state.inner.passes)
    mcmc.run(jax.random.key(1), X, g, y)
    state = mcmc.last_state.kernel_state.inner
    assert after_warmup > 0 and float(state.passes) == after_warmup
    assert bool(state.recentred) and float(state.centre.decrement) < 0.01
    assert kernel._prior_cross is False
    kernel = SGWithinGibbs(SGLD(coupled_lmm, control_variates=True))
    cold = MCMC(kernel, num_warmup=0, num_samples=30, progress_bar=False, jit_model_args=True)
    cold.run(jax.random.key(2), X, g, y)
    state = cold.last_state.kernel_state.inner
    assert float(state.passes) > 0 and float(state.centre.decrement) < 0.01 and bool(state.recentred)
    assert all(np.all(np.isfinite(np.asarray(v))) for v in cold.get_samples().values())
    assert int(cold.last_state.num_divergences) == 0
    assert kernel._prior_cross is True


def test_arrowhead_without_groups_is_the_dense_global_block():
    """No group latents (a regression's coefficients read whole): the factor is the global block's,
    by eigendecomposition up to :data:`SMALL_GLOBAL` coordinates and by a Cholesky factor beyond
    (its diagonal where the block is indefinite)."""
    from numpyro_sgd.numerics.arrowhead import SMALL_GLOBAL
    rng = np.random.default_rng(4)
    for d_g in (5, SMALL_GLOBAL + 16):
        layout = GroupLayout(np.arange(d_g, dtype=np.int32), np.zeros((0, 0), np.int32))
        m = rng.normal(size=(d_g, d_g))
        h = m @ m.T / d_g + np.eye(d_g)
        matrix = from_probes(layout, jnp.asarray(probes(layout, np.float64) @ h))
        v = rng.normal(size=d_g)
        np.testing.assert_allclose(matrix.matvec(layout, jnp.asarray(v)), h @ v, rtol=1e-10)
        chol = factor(matrix, jitter=0.0)
        np.testing.assert_allclose(chol.solve(layout, jnp.asarray(v)), np.linalg.solve(h, v), rtol=1e-8)
        lower = np.asarray(chol.schur)
        np.testing.assert_allclose(lower @ lower.T, h, rtol=1e-8, atol=1e-10)
        indefinite = factor(matrix._replace(glob=matrix.glob - 3.0 * jnp.eye(d_g)))
        step = np.asarray(indefinite.solve(layout, jnp.asarray(v)))
        assert np.all(np.isfinite(step)) and float(v @ step) > 0  # positive definite: a descent direction


P_RIDGE, N_RIDGE = 80, 6_000


def ridge(X, y):
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("coef", X.shape[1]):
        beta = numpyro.sample("beta", dist.Normal(0.0, tau))
    with numpyro.plate("data", X.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta, 1.0), obs=y[idx])


def _ridge_reference(X, y, grid=2_000):
    """Exact posterior moments of :func:`ridge` (float64): given τ, y ~ N(0, I + τ² X Xᵀ) and
    β | τ, y ~ N(V Xᵀ y, V), V = (XᵀX + I/τ²)⁻¹; p(τ | y) on a grid in log τ (prior HalfNormal(1)
    and the Jacobian τ), the β moments mixed over it."""
    X, y = X.astype(np.float64), y.astype(np.float64)
    xtx, xty = X.T @ X, X.T @ y
    eig, vec = np.linalg.eigh(xtx)
    proj = vec.T @ xty
    log_tau = np.linspace(np.log(0.05), np.log(5.0), grid)
    tau2 = np.exp(2 * log_tau)[:, None]
    # log N(y; 0, I + τ² X Xᵀ) up to a constant, by the eigenvalues of XᵀX (Woodbury)
    logml = -0.5 * np.sum(np.log1p(tau2 * eig), 1) + 0.5 * np.sum(proj**2 * tau2 / (1 + tau2 * eig), 1)
    logp = logml - 0.5 * np.exp(2 * log_tau) + log_tau
    w = np.exp(logp - logp.max())
    w /= w.sum()
    assert w[0] < 1e-8 and w[-1] < 1e-8  # the grid holds the posterior
    means = (proj / (eig + 1 / tau2)) @ vec.T                      # (grid, p)
    variances = (1 / (eig + 1 / tau2)) @ (vec.T**2)
    mean = w @ means
    sd = np.sqrt(w @ (variances + means**2) - mean**2)
    t = np.exp(log_tau)
    tau_mean = w @ t
    return dict(tau=(tau_mean, np.sqrt(w @ t**2 - tau_mean**2)), beta=(mean, sd))


def test_coefficients_every_row_reads_are_global_and_match_the_exact_posterior():
    """A ridge regression with an unknown prior scale τ: β's plate is read whole by every row, so
    its 80 coordinates are global (no group latents, the dense block past SMALL_GLOBAL) and τ is the
    hyper site. With 6,000 rows the search's Newton directions read ∇²L from 32 rows per coefficient
    (:func:`~numpyro_sgd.adaptation.group_centre.direction_rows`) and the final centre's from every
    row: XᵀX exactly (σ = 1), which the control variates need. Tolerances: 2 chains × 1,000 draws,
    about 0.4 effective samples per draw: Monte Carlo sd of a mean ~0.035 sd and of an sd ~2.5 %;
    the maxima over 80 coefficients within 0.2 sd and 15 %, τ within 0.15 sd and 10 %."""
    from numpyro_sgd.adaptation.group_centre import direction_rows

    rng = np.random.default_rng(5)
    X = rng.normal(size=(N_RIDGE, P_RIDGE)).astype(np.float32)
    y = (X @ (0.3 * rng.normal(size=P_RIDGE)) + rng.normal(size=N_RIDGE)).astype(np.float32)
    reference = _ridge_reference(X, y)
    kernel = SGWithinGibbs(SGLD(ridge, control_variates=True))
    mcmc = MCMC(kernel, num_warmup=100, num_samples=1_000, num_chains=2, chain_method="vectorized",
                jit_model_args=True, progress_bar=False)
    mcmc.run(jax.random.key(0), jnp.asarray(X), jnp.asarray(y))
    assert kernel.hyper_sites == ("tau",)
    assert kernel._group_layout.num_groups == 0 and kernel._group_layout.global_index.size == P_RIDGE
    assert direction_rows(N_RIDGE, kernel._group_layout) == 32 * P_RIDGE
    centre = mcmc.last_state.kernel_state.inner.centre
    np.testing.assert_allclose(np.asarray(centre.lik_hessian.glob), np.broadcast_to(X.T @ X, (2, P_RIDGE, P_RIDGE)),
                               rtol=1e-4, atol=1e-4 * N_RIDGE)
    _assert_within(mcmc.get_samples(), reference, wide="beta")


def test_too_many_coefficients_read_whole_are_refused(monkeypatch):
    import numpyro_sgd.model.groups as groups
    monkeypatch.setattr(groups, "MAX_WHOLE_DIM", 40)
    rng = np.random.default_rng(6)
    X, y = jnp.asarray(rng.normal(size=(500, 50)), jnp.float32), jnp.asarray(rng.normal(size=500), jnp.float32)
    mcmc = MCMC(SGWithinGibbs(SGLD(ridge, control_variates=True)), num_warmup=5, num_samples=5, progress_bar=False)
    with pytest.raises(ValueError, match=r"every row reads the whole of plate .coef., so 50 latent coordinates are "
                                         r"global.*beyond the 40"):
        mcmc.run(jax.random.key(0), X, y)


def ridge_without_plate(X, y):
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, tau).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta, 1.0), obs=y[idx])


def test_a_model_without_a_group_plate_runs_with_every_latent_global():
    rng = np.random.default_rng(7)
    X = jnp.asarray(rng.normal(size=(500, 4)), jnp.float32)
    y = jnp.asarray(X @ np.ones(4) + rng.normal(size=500), jnp.float32)
    kernel = SGWithinGibbs(SGLD(ridge_without_plate, control_variates=True))
    mcmc = MCMC(kernel, num_warmup=20, num_samples=50, progress_bar=False)
    mcmc.run(jax.random.key(0), X, y)
    assert kernel._group_layout.num_groups == 0 and kernel._group_layout.global_index.size == 4
    assert np.all(np.isfinite(np.asarray(mcmc.get_samples()["beta"])))


def _tight_prior_regression(X, y):
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1e-6).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=100) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ beta, sigma), obs=y[idx])


def test_likelihood_is_read_without_its_prior():
    """The control variates' ∇²L comes from the sites in the data plate alone
    (``SubsampledPotential.likelihood``), not as the potential less its prior: a null coefficient
    under a horseshoe has prior curvature 1/(τλ)² ~ 10¹², and in float32 the difference keeps a
    likelihood curvature of 10³ to ±2¹⁶ (the check on the difference below shows the test can
    fail). The two parts still sum to the potential."""
    from numpyro_sgd import SubsampledPotential

    rng = np.random.default_rng(0)
    X = rng.normal(size=(1_000, 4)).astype(np.float32)
    y = rng.normal(size=1_000).astype(np.float32)  # every coefficient null
    args = (jnp.asarray(X), jnp.asarray(y))
    potential = SubsampledPotential.from_model(_tight_prior_regression, args)
    theta = jnp.zeros(potential.dim, jnp.float32)  # β = 0, log σ = 0
    rows = {"data": jnp.arange(1_000)}
    beta = [i for i, n in enumerate(np.repeat(potential.view.names, potential.view.sizes)) if n == "beta"]
    exact = X.astype(np.float64).T @ X  # ∂²L/∂β² at σ = 1
    hessian = jax.hessian(potential.likelihood)(theta, rows, args)
    np.testing.assert_allclose(np.asarray(hessian)[np.ix_(beta, beta)], exact, rtol=1e-5, atol=1e-3)
    difference = jax.hessian(lambda t: potential.potential(t, rows, args) - potential.prior_potential(t, args))(theta)
    assert np.max(np.abs(np.asarray(difference)[np.ix_(beta, beta)] - exact)) > 0.1 * np.max(exact)
    np.testing.assert_allclose(potential.likelihood(theta, rows, args) + potential.prior_potential(theta, args),
                               potential.potential(theta, rows, args), rtol=1e-6)
