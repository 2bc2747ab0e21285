"""IASG on the linear regression of Mandt et al. Sec. 6.2 (data simulated from the model).

The exact references: the posterior covariance (XᵀX + I)⁻¹, Eq. 45 with the exact Hessian,
and the exact law of the average of T iterates of the linear recursion with the exact
per-example gradient covariance C at the mode (:func:`iterate_average_covariance`).
Tolerances: for n draws from N(0, Σ) the sample covariance has
E‖Σ̂ − Σ‖²_F = (Tr(Σ)² + Tr(Σ²))/n (Wishart), so 3× that RMS is the statistical allowance;
consecutive window averages are nearly independent (lag-1 correlation ≈ 1/(2x), x = ε T λ ≈ 20).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from numpyro_sgd import IASG
from numpyro_sgd.kernels.iasg import default_step_product
from numpyro_sgd.numerics.theory import (
    averaged_variance_shortfall,
    iasg_covariance,
    iterate_average_covariance,
    lyapunov_covariance,
    window_error,
)

N, D, S = 5000, 10, 10


def _data(scales=None, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, D)) * (1.0 if scales is None else scales)
    w = rng.normal(size=D) / (1.0 if scales is None else scales)  # prior draw (precision 1) on the unit scale
    y = x @ w + rng.normal(size=N)
    return jnp.asarray(x), jnp.asarray(y)


def model(x, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([D]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=S) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ w, 1), obs=y[idx])


def _exact(x, y):
    """Posterior covariance A_U⁻¹, A_U, and the per-example gradient noise Q = N² C / S at the mode."""
    x, y = np.asarray(x), np.asarray(y)
    hessian = x.T @ x + np.eye(D)
    post = np.linalg.inv(hessian)
    mode = post @ (x.T @ y)
    grads = -x * (y - x @ mode)[:, None] + mode / N  # ∇ℓ_n: likelihood + prior/N
    return post, hessian, N**2 * np.cov(grads.T, bias=True) / S


def _rel_frobenius(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _wishart_rms(cov, n):
    return float(np.sqrt((np.trace(cov) ** 2 + np.trace(cov @ cov)) / n) / np.linalg.norm(cov))


@pytest.fixture(scope="module")
def sec62_run():
    x, y = _data()
    kernel = IASG(model, preconditioner="scalar", check_validity=False)  # validity() checked below: no callback
    mcmc = MCMC(kernel, num_warmup=10, num_samples=500, num_chains=8, chain_method="vectorized",
                progress_bar=False)
    mcmc.run(jax.random.key(0), x, y, extra_fields=("data_passes",))
    return kernel, mcmc, x, y


def test_iasg_covariance_matches_posterior_and_theory(sec62_run):
    kernel, mcmc, x, y = sec62_run
    post, hessian, q = _exact(x, y)
    draws = np.asarray(mcmc.get_samples()["w"])
    n = draws.shape[0]
    cov = np.cov(draws.T)
    state = mcmc.last_state
    eps = float(state.kernel_state.step_size[0])
    precond = float(state.kernel_state.preconditioner[0])
    assert np.isclose(precond, eps / N)
    # the default ε puts the least-constrained direction at the 5 % shortfall of Eq. 46
    v = kernel.validity(state)
    assert v["window"] == N // S and abs(v["window_error"] - 0.05) < 1e-6 and v["stability"] < 0.1
    rms = _wishart_rms(post, n)
    # (1) the exact prediction for this chain (linear recursion, exact noise at the mode)
    predicted = iterate_average_covariance(precond, hessian, q, N // S)
    err_pred = _rel_frobenius(cov, predicted)
    assert err_pred < 3 * rms, (err_pred, rms)
    # (2) Eq. 45 (A5: the noise equals the Hessian) with the exact Hessian
    eq45 = iasg_covariance(hessian, N, S, eps)
    gap45 = _rel_frobenius(predicted, eq45)  # C ≠ A by O(√(D/N)) on a finite data set
    assert _rel_frobenius(cov, eq45) < gap45 + 3 * rms
    # (3) the exact posterior: allowance = the predicted deviation + sampling
    gap = _rel_frobenius(predicted, post)
    err_post = _rel_frobenius(cov, post)
    assert err_post < gap + 3 * rms, (err_post, gap, rms)
    # largest marginal-variance error: the prediction's + 4 sd of a variance estimate √(2/n)
    var_err = np.max(np.abs(np.diag(cov) / np.diag(post) - 1))
    assert var_err < np.max(np.abs(np.diag(predicted) / np.diag(post) - 1)) + 4 * np.sqrt(2 / n)
    # the averaged samples are ~√(εN/(2S)) ≈ 3.4× narrower than the SGD iterates themselves:
    # averaging over the wrong window (or not at all) could not pass the checks above
    iterate_cov = lyapunov_covariance(precond, hessian, q, discrete=True)
    assert np.trace(iterate_cov) / np.trace(post) > 5


def test_iasg_sample_costs_one_data_pass(sec62_run):
    _, mcmc, _, _ = sec62_run
    passes = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["data_passes"])
    np.testing.assert_allclose(np.diff(passes, axis=1), 1.0)  # T·S = N per-datum gradients
    np.testing.assert_allclose(passes[:, -1], 10 + 500)
    assert int(mcmc.last_state.i[0]) == 510 * (N // S)


@pytest.mark.slow  # 23 s; an accuracy run (CI budget)
def test_full_preconditioner_on_ill_conditioned_posterior():
    """Column scales 1…30: λ_max/λ_min ≈ 900 > T = 500, so scalar IASG cannot meet Eq. 47 (it
    warns, and the least-constrained direction comes out far too narrow);
    H = A⁻¹ makes every eigenvalue of HA ≈ 1 and the samples match the posterior."""
    scales = np.geomspace(1.0, 30.0, D)
    x, y = _data(scales, seed=1)
    post, _, _ = _exact(x, y)
    with pytest.warns(UserWarning, match="outside the validity window"):
        scalar = MCMC(IASG(model, preconditioner="scalar"), num_warmup=10, num_samples=200, num_chains=4,
                      chain_method="vectorized", progress_bar=False)
        scalar.run(jax.random.key(1), x, y)
    full = MCMC(IASG(model, preconditioner="full", check_validity=False), num_warmup=10, num_samples=500, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    full.run(jax.random.key(2), x, y)
    v = full.sampler.validity(full.last_state)
    assert abs(v["eig_min"] - 1) < 1e-6 and abs(v["window_error"] - 0.05) < 1e-6
    ratio_full = np.diag(np.cov(np.asarray(full.get_samples()["w"]).T)) / np.diag(post)
    ratio_scalar = np.diag(np.cov(np.asarray(scalar.get_samples()["w"]).T)) / np.diag(post)
    n = 2000
    # full: 5 % window shortfall + O(√(D/N)) noise-vs-Hessian gap (≤ 10 % here) + 4 sd
    assert np.all(np.abs(ratio_full - 1) < 0.15 + 4 * np.sqrt(2 / n)), ratio_full
    assert np.min(ratio_scalar) < 0.5  # the least-constrained direction is badly underestimated


def test_theory_discrete_average_equals_brute_force_and_eq44():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(3, 3))
    hessian = 100 * (a @ a.T + np.eye(3))
    n, s, eps = 1000, 10, 0.05
    q = n / s * hessian  # A5: Fisher = Hessian
    precond = eps / n
    sigma = lyapunov_covariance(precond, hessian, q, discrete=True)
    m = np.eye(3) - precond * hessian
    for t in (1, 7, 60):
        brute = sum(
            sigma @ np.linalg.matrix_power(m, j - i).T if j >= i else np.linalg.matrix_power(m, i - j) @ sigma
            for i in range(t) for j in range(t)
        ) / t**2
        atol = 1e-10 * np.abs(brute).max()  # off-diagonal entries are ~1e-4 of the diagonal
        np.testing.assert_allclose(iterate_average_covariance(precond, hessian, q, t), brute, rtol=1e-9, atol=atol)
        # the continuous-time Eq. 71 reduces to Eq. 44 under A5 (exactly)
        np.testing.assert_allclose(iterate_average_covariance(precond, hessian, q, t, discrete=False),
                                   iasg_covariance(hessian, n, s, eps, window=t), rtol=1e-9, atol=atol)
    # T = N/S: Eq. 45 = posterior × (1 − (1 − e^{−x})/x) along each eigendirection
    lam, u = np.linalg.eigh(hessian)
    shrink = 1 - window_error(eps * (n / s) * lam / n)
    expected = (u * shrink / lam) @ u.T
    np.testing.assert_allclose(iasg_covariance(hessian, n, s, eps), expected, atol=1e-12 * np.abs(expected).max())


def test_default_step_product_and_discrete_shortfall():
    # the shortfall formula is the 1-D case of the exact averaged covariance under A5, relative
    # to its long-window limit N/(S T) × the posterior variance 1/a (Eq. 44)
    n, s, a = 400, 4, 250.0
    for u, t in ((0.01, 100), (0.3, 7), (1.0, 5), (1.6, 9)):
        exact = iterate_average_covariance(u / a, [[a]], [[n / s * a]], t)[0, 0]
        assert abs((1 - exact * a * s * t / n) - averaged_variance_shortfall(u, t)) < 1e-10
    for err in (0.01, 0.05, 0.2):
        for t in (3, 20, 1000):
            u = default_step_product(err, t)
            assert 0 < u <= 1 and abs(averaged_variance_shortfall(u, t) - err) < 1e-9
    # long windows: u T → the x of the continuous Eq. 46
    u = default_step_product(0.05, 100_000)
    assert abs(window_error(u * 100_000) - 0.05) < 1e-3
    with pytest.raises(ValueError, match="window_error"):
        default_step_product(1.5, 10)


def test_given_step_size_runs_without_warmup():
    """Alg. 1 as written: a given ε and no preconditioner need no warmup estimate."""
    x, y = _small()
    mcmc = MCMC(IASG(model, step_size=0.2), num_warmup=0, num_samples=300, progress_bar=False)
    mcmc.run(jax.random.key(0), x, y, init_params={"w": jnp.zeros(D)})
    assert int(mcmc.last_state.num_divergences) == 0
    post, _, _ = _exact(x, y)
    draws = np.asarray(mcmc.get_samples()["w"])[50:]
    # ε T λ_min ≈ 0.2·50·0.7 = 7: shortfall ≤ 15 % (Eq. 46), + 5 sd of a variance from 250 draws
    ratio = np.diag(np.cov(draws.T)) / np.diag(post)
    assert np.all((ratio > 0.85 - 5 * np.sqrt(2 / 250)) & (ratio < 1 + 5 * np.sqrt(2 / 250))), ratio


def _small():
    x, y = _data()
    return x[:500], y[:500]


@pytest.mark.parametrize("step_size, match", [(3.0, "diverge"), (1e-4, "too small")])
def test_step_size_outside_validity_window_warns(step_size, match):
    mcmc = MCMC(IASG(model, step_size=step_size), num_warmup=5, num_samples=2, progress_bar=False)
    with pytest.warns(UserWarning, match=match):
        mcmc.run(jax.random.key(0), *_small())


def test_short_window_warns():
    """N/S = 5: the default ε needs ε λ ≈ 0.9 (Newton-like steps), outside the theory's regime."""
    x, y = _small()
    with pytest.warns(UserWarning, match="window T = 5 is short"):
        MCMC(IASG(model, preconditioner="scalar"), num_warmup=2, num_samples=2, progress_bar=False).run(
            jax.random.key(0), x[:50], y[:50])


def test_window_other_than_one_pass_warns_with_the_scale():
    mcmc = MCMC(IASG(model, window=25, preconditioner="scalar"), num_warmup=5, num_samples=2, progress_bar=False)
    with pytest.warns(UserWarning, match=r"N/\(T S\) = 2 × the posterior"):
        mcmc.run(jax.random.key(0), *_small())


@pytest.mark.parametrize("kwargs, error, match", [
    ({"window": 0}, ValueError, "window must be an integer >= 1"),
    ({"window": 2.5}, ValueError, "window must be an integer >= 1"),
    ({"step_size": 0.0}, ValueError, "step_size must be a positive float"),
    ({"step_size": -1e-3}, ValueError, "step_size must be a positive float"),
    ({"preconditioner": "sqrt"}, ValueError, "unknown preconditioner"),
    ({"steps_per_sample": 3}, TypeError, "pass window=T instead"),
    ({"window_error": 0.0}, ValueError, "window_error must lie in"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        IASG(model, **kwargs)


def test_scalar_preconditioner_is_h_equal_identity():
    kernel = IASG(model, preconditioner="scalar", step_size=0.2)
    x, y = _small()
    alg, _, theta = kernel.algorithm(jax.random.key(0), x, y)
    state = alg.init(jax.random.key(1), theta, 0)
    assert state.preconditioner.shape == ()  # H = I: P = ε/N, a scalar
    np.testing.assert_allclose(float(state.preconditioner), 0.2 / x.shape[0])



def test_driver_refuses_steps_per_sample_for_a_summarising_block():
    """A sample that summarises its block (SampleBlock.summarises) fixes the block's length: the
    driver refuses a steps_per_sample for any such algorithm (IASG refuses it at construction;
    here a kernel built directly on `iasg`), instead of letting the window silently win."""
    from numpyro_sgd.driver.kernel import SGKernel
    from numpyro_sgd.kernels.iasg import iasg

    class Averaged(SGKernel):
        def _build(self, potential, adapt_steps_per_sample=True):
            return iasg(potential, step_size=0.1, preconditioner="scalar", check_validity=False)

    mcmc = MCMC(Averaged(model, steps_per_sample=3), num_warmup=2, num_samples=2, progress_bar=False)
    with pytest.raises(ValueError, match="summarises a block of .* steps_per_sample cannot be set"):
        mcmc.run(jax.random.key(0), *_small())
