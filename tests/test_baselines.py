"""pSGLD and SGHMC against an exact Gaussian posterior (and SGHMC's exact discrete-time law)."""

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.linalg
from numpyro.infer import MCMC

from numpyro_sgd import PSGLD, SGHMC
from numpyro_sgd.numerics.diffusions import underdamped_langevin

N, S, PRIOR_SD = 1000, 100, 10.0
Y = jnp.asarray(np.random.default_rng(0).normal(2.0, 1.0, N))
A = 1 / PRIOR_SD**2 + N  # posterior precision (Hessian of U)
POST_VAR = 1 / A
POST_MEAN = POST_VAR * float(jnp.sum(Y))
V = N**2 * float(jnp.var(Y)) / S  # variance of the minibatch gradient (with replacement)


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0, PRIOR_SD))
    with numpyro.plate("data", y.shape[0], subsample_size=S) as idx:
        numpyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


def _draws(kernel, init_params=None):
    mcmc = MCMC(kernel, num_warmup=300, num_samples=3000, num_chains=4, chain_method="vectorized",
                progress_bar=False)
    mcmc.run(jax.random.key(0), Y, init_params=init_params)
    mu = np.asarray(mcmc.get_samples(group_by_chain=True)["mu"])
    return mu, float(az.ess(az.convert_to_dataset({"mu": mu}))["mu"])


def test_underdamped_step_without_noise_or_friction_is_symplectic_euler_like():
    theta, r = jnp.array([1.0]), jnp.array([0.5])
    t2, r2 = underdamped_langevin(jax.random.key(0), theta, r, jnp.array([2.0]), 0.1, 1e-30)
    np.testing.assert_allclose(t2, theta + 0.1 * r)
    np.testing.assert_allclose(r2, r - 0.1 * 2.0, atol=1e-12)


def test_sghmc_matches_its_exact_discrete_law():
    """x = (θ − m, r) follows x' = F x + w with F = [[1, h], [−hA, 1 − hγ]] and
    Cov w = diag(0, h² V + 2γh); its stationary θ-variance solves a 2×2 discrete Lyapunov
    equation (≈ 1.08/A here: the minibatch noise h²V is not negligible against 2γh)."""
    h, gamma = 1e-3, 30.0
    f = np.array([[1.0, h], [-h * A, 1 - h * gamma]])
    w = np.diag([0.0, h**2 * V + 2 * gamma * h])
    target = scipy.linalg.solve_discrete_lyapunov(f, w)[0, 0]
    mu, ess = _draws(SGHMC(model, step_size=h, friction=gamma, steps_per_sample=10))
    assert ess > 300
    # z = 4 on the mean (MCSE) and on the variance (relative sd √(2/n_eff))
    assert abs(mu.mean() - POST_MEAN) < 4 * np.sqrt(target / ess)
    assert abs(mu.var() / target - 1) < 4 * np.sqrt(2 / ess)
    assert target / POST_VAR - 1 > 0.05  # the test can tell the exact law from the posterior


def test_psgld_samples_gaussian_posterior_at_small_step():
    """Near the mode G ≈ 1/√Var(ḡ) ≈ 10, so with ε = 1e-6, εG A ≈ 0.01: the discretisation and
    minibatch-noise inflation (1 + εGV/4)/(1 − εGA/4) ≈ 1.03 is inside the tolerance
    0.03 + 4√(2/n_eff). Started at the mode: far from it G is ~40× smaller and burn-in at a step
    this small would take most of the run."""
    start = {"mu": jnp.full(4, POST_MEAN)}
    mu, ess = _draws(PSGLD(model, step_size=1e-6, steps_per_sample=10), init_params=start)
    assert ess > 100
    assert abs(mu.mean() - POST_MEAN) < 4 * np.sqrt(POST_VAR / ess)
    assert abs(mu.var() / POST_VAR - 1) < 0.03 + 4 * np.sqrt(2 / ess)


@pytest.mark.parametrize("make, match", [
    (lambda: SGHMC(model, step_size=0.0, friction=1.0), "step_size must be a positive float"),
    (lambda: SGHMC(model, step_size=1e-3, friction=0.0), "friction must be a positive float"),
    (lambda: PSGLD(model, step_size=-1.0), "step_size must be a positive float"),
    (lambda: PSGLD(model, step_size=1e-3, decay=1.0), "decay"),
    (lambda: PSGLD(model, step_size=1e-3, damping=0.0), "damping"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


