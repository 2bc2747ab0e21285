"""Control-variate gradients, their centre, and the integrator exact for the Gaussian part.

The numerics are checked alone against closed forms (the full-data pass against the model's own
full potential, the centre against the exact mode of a conjugate regression, the control-variate
gradient's mean and its vanishing noise at the centre, the exponential step's one-step moments
against the Ornstein–Uhlenbeck transition), then the kernels' draws against the exact posterior of
a conjugate regression with tolerances from their effective sample size.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC

from numpyro_sgd import EWSG, SGHMC, SGLD, ConstantSGD, OverdampedEWSG, SGWithinGibbs, VariationalEM
from numpyro_sgd.adaptation.control_variates import (
    ControlVariateOracle,
    control_variate_noise,
    full_potential_and_grad,
    newton_centre,
)
from numpyro_sgd.numerics.diffusions import exponential_overdamped_langevin
from numpyro_sgd.numerics.step_rules import exponential_step_size
from numpyro_sgd.numerics.theory import exponential_autocorrelation_time

N, D, S = 20_000, 5, 200
_rng = np.random.default_rng(1)
X = _rng.normal(size=(N, D))
Y = X @ _rng.normal(size=D) + _rng.normal(size=N)
PRIOR_SD = 10.0
#: the exact posterior of the conjugate regression (unit noise, N(0, 10²) prior)
PRECISION = X.T @ X + np.eye(D) / PRIOR_SD**2
COV = np.linalg.inv(PRECISION)
MEAN = COV @ X.T @ Y
SD = np.sqrt(np.diag(COV))


def regression(X, y):
    w = numpyro.sample("w", dist.Normal(0, PRIOR_SD).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])


@pytest.fixture(scope="module")
def oracle():
    _, oracle, _ = SGLD(regression, control_variates=True).algorithm(jax.random.key(0), jnp.asarray(X),
                                                                      jnp.asarray(Y))
    return oracle


def test_the_streamed_pass_is_the_full_potential(oracle):
    """U and ∇U summed over blocks of 3,000 rows (N = 20,000: six full blocks and a rest of
    2,000) equal the model's potential on all rows: the prior counted once, every row once."""
    theta = jnp.asarray(_rng.normal(size=D))
    pe, grad = jax.jit(lambda t: full_potential_and_grad(oracle, t, chunk_size=3_000))(theta)
    exact_pe, exact_grad = jax.value_and_grad(oracle.potential.full_potential)(theta, oracle.model_args)
    np.testing.assert_allclose(pe, exact_pe, rtol=1e-10)
    np.testing.assert_allclose(grad, exact_grad, rtol=1e-9, atol=1e-8)


def test_newton_reaches_the_exact_mode_from_far(oracle):
    """From 1,000 posterior sds away the centre is the exact mode (the posterior mean of a
    conjugate regression) within the tolerance of the Newton decrement, 0.01: a tenth of a
    posterior sd. Full Newton steps (no trust region by default): the Hessian estimated on fixed
    rows (exact up to √(D/rows) ≈ 3 %) shrinks the distance about 30-fold per step, so 1,000 →
    about 30 → 1 → 0.03 sds: one data pass per step and one at the start, three to five; from 10
    sds, two to four. With a trust region of 30 sds that doubles after every step that needs no
    shortening (30 + 60 + ... + 480 > 1,000 after 6 steps), six or more."""
    start = jnp.asarray(MEAN + 1_000 * SD)
    newton = jax.jit(lambda t, r: newton_centre(oracle, t, radius=r))
    centre, passes = newton(start, jnp.inf)
    assert np.max(np.abs(np.asarray(centre.position) - MEAN) / SD) < 0.1
    assert 3 <= float(passes) <= 5
    centre, passes = newton(jnp.asarray(MEAN + 10 * SD), jnp.inf)
    assert np.max(np.abs(np.asarray(centre.position) - MEAN) / SD) < 0.1
    assert 2 <= float(passes) <= 4
    centre, passes = newton(start, 30.0)
    assert np.max(np.abs(np.asarray(centre.position) - MEAN) / SD) < 0.1
    assert 6 <= float(passes) <= 12


def test_control_variate_gradients_are_unbiased_and_exact_at_the_centre(oracle):
    """At θ̂ every minibatch gives ∇U(θ̂) exactly; a posterior sd away, the mean over 400
    minibatches is ∇U(θ) within 4 standard errors of that mean, and the noise is far below the
    plain minibatch gradient's (which grows like N²/S)."""
    centre, _ = jax.jit(lambda t: newton_centre(oracle, t))(jnp.asarray(MEAN))
    cv = ControlVariateOracle(oracle, centre)
    keys = jax.random.split(jax.random.key(3), 400)
    at_centre = jax.jit(jax.vmap(lambda k: cv.grad(k, centre.position)[1]))(keys)
    np.testing.assert_allclose(at_centre, np.broadcast_to(centre.grad, at_centre.shape), rtol=1e-8, atol=1e-6)
    theta = centre.position + jnp.asarray(SD * _rng.choice([-1.0, 1.0], D))
    draws = np.asarray(jax.jit(jax.vmap(lambda k: cv.grad(k, theta)[1]))(keys))
    plain = np.asarray(jax.jit(jax.vmap(lambda k: oracle.grad(k, theta)[1]))(keys))
    _, exact = jax.value_and_grad(oracle.potential.full_potential)(theta, oracle.model_args)
    se = draws.std(0) / np.sqrt(len(keys))
    assert np.all(np.abs(draws.mean(0) - np.asarray(exact)) < 4 * se + 1e-8)
    assert np.all(draws.std(0) < 0.1 * plain.std(0))
    # the measured noise covariance is the one the draws show (within a factor 2: 8 points, 1 sd)
    noise, nonlinearity = jax.jit(lambda: control_variate_noise(oracle, centre, jnp.asarray(np.linalg.cholesky(COV)),
                                                                jax.random.key(0)))()
    assert 0.5 < np.trace(np.asarray(noise)) / np.trace(np.cov(draws.T)) < 2.0
    # a Gaussian posterior: the gradient is linear, up to the Hessian's estimate on fixed rows
    assert float(nonlinearity) < 0.1


def test_the_exponential_step_is_the_exact_transition_of_a_gaussian():
    """For ∇U(θ) = c θ + b the step is the Ornstein–Uhlenbeck transition of dθ = −∇U dt + √2 dW
    over dt = ε/2, for any ε: mean e θ − (1 − e) b/c and variance (1 − e²)/c with e = exp(−cε/2);
    checked on 200,000 draws from one θ (4 standard errors)."""
    c, b, theta, eps = 50.0, 3.0, 0.7, 0.1  # c ε/2 = 2.5: far outside Euler's stability (c ε < 4)
    keys = jax.random.split(jax.random.key(0), 200_000)
    draws = np.asarray(jax.vmap(lambda k: exponential_overdamped_langevin(k, theta, c * theta + b, eps, c))(keys))
    e = np.exp(-c * eps / 2)
    mean, var = e * theta - (1 - e) * b / c, (1 - e**2) / c
    assert abs(draws.mean() - mean) < 4 * np.sqrt(var / draws.size)
    assert abs(draws.var() / var - 1) < 4 * np.sqrt(2 / draws.size)


def test_the_exponential_step_size_shrinks_with_the_nonlinearity_and_the_noise():
    """A Gaussian with no gradient noise takes the largest step (every step exact); a gradient
    farther from linear, or noisier, takes a smaller one, and the variance error the rule bounds
    stays ≤ τ; the autocorrelation time is one step at c ε/2 ≥ 4."""
    c = 1e4
    steps = [float(exponential_step_size(jnp.eye(3) * q, c, delta)) for q, delta in
             ((0.0, 0.0), (0.0, 0.1), (0.0, 0.5), (0.3 * c, 0.0), (3.0 * c, 0.1))]
    assert steps[0] == pytest.approx(2 * 4.0 / c)
    assert steps[0] > steps[1] > steps[2] > 0
    assert steps[0] > steps[3] > steps[4] > 0
    assert exponential_autocorrelation_time(steps[0], c) == pytest.approx((1 + np.exp(-4)) / (1 - np.exp(-4)))
    assert exponential_autocorrelation_time(steps[2], c, 0.5) > 2 * exponential_autocorrelation_time(steps[0], c)


CV_KERNELS = [
    # the exponential integrator: one SG step per draw (c ε/2 up to 4: nearly independent draws)
    pytest.param(lambda: SGLD(regression, control_variates=True), 1, id="SGLD-exponential"),
    # the Euler kernels keep their steps (bounded by the discretisation) and need ~ N/S steps per draw
    pytest.param(lambda: SGHMC(regression, control_variates=True, steps_per_sample=20), 20, id="SGHMC"),
    pytest.param(lambda: SGLD(regression, control_variates=True, integrator="euler", steps_per_sample=20), 20,
                 id="SGLD-euler", marks=pytest.mark.slow),
    pytest.param(lambda: EWSG(regression, control_variates=True, steps_per_sample=20), 20, id="EWSG",
                 marks=pytest.mark.slow),
    pytest.param(lambda: OverdampedEWSG(regression, control_variates=True, steps_per_sample=20), 20,
                 id="OverdampedEWSG", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("make, steps", CV_KERNELS)
def test_control_variate_kernels_sample_the_exact_posterior(make, steps):
    """Draws against the exact posterior of the conjugate regression. Each coordinate's mean is
    within 4 Monte Carlo standard errors (sd/√ESS) of the exact mean, and its sd within the
    variance inflation the default step allows (τ = 10 %: ≤ 5 % in sd) plus 4 standard errors of
    an sd (1/√(2 ESS)); the ESS is the run's own (bulk, per coordinate)."""
    mcmc = MCMC(make(), num_warmup=300, num_samples=1_000, num_chains=2, chain_method="vectorized",
                progress_bar=False)
    mcmc.run(jax.random.key(0), jnp.asarray(X), jnp.asarray(Y))
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    ess = effective_sample_size(draws)
    assert np.all(ess > 200)
    assert np.all(np.abs(draws.mean((0, 1)) - MEAN) / SD < 4 / np.sqrt(ess))
    assert np.all(np.abs(draws.reshape(-1, D).std(0) / SD - 1) < 0.05 + 4 / np.sqrt(2 * ess))
    control = mcmc.last_state.kernel_state.adapted.control
    assert np.max(np.abs(np.asarray(control.centre.position)[0] - MEAN) / SD) < 0.1  # the Newton tolerance
    assert np.all(np.asarray(control.passes) >= 2)


def test_vectorized_chains_share_one_centre():
    """Vectorized chains find one centre (``protocol.mean_over_chains``: Newton from the mean of
    their warmups' ends, its passes made once for all chains), while sequential chains each find
    their own from where their own warmup ended: the same mode to the Newton tolerance, not the
    same floats."""
    def centres(method):
        mcmc = MCMC(SGLD(regression, control_variates=True), num_warmup=100, num_samples=10, num_chains=2,
                    chain_method=method, progress_bar=False)
        mcmc.warmup(jax.random.key(3), jnp.asarray(X), jnp.asarray(Y))
        control = mcmc.post_warmup_state.kernel_state.adapted.control
        return np.asarray(control.centre.position), np.asarray(control.passes)

    shared, passes = centres("vectorized")
    np.testing.assert_array_equal(shared[0], shared[1])
    assert passes[0] == passes[1] >= 1
    assert np.max(np.abs(shared[0] - MEAN) / SD) < 0.1
    own, _ = centres("sequential")
    assert not np.array_equal(own[0], own[1])
    assert np.max(np.abs(own - MEAN) / SD) < 0.1


def two_plates(X, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("a", X.shape[0], subsample_size=10) as idx:
        numpyro.sample("ya", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])
    with numpyro.plate("b", X.shape[0], subsample_size=10) as idx:
        numpyro.sample("yb", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])


def test_control_variates_refuse_what_they_cannot_do():
    with pytest.raises(ValueError, match="set their step at the end of warmup.*leave step_size out"):
        SGLD(regression, control_variates=True, step_size=1e-4)
    with pytest.raises(ValueError, match="integrator='exponential' is exact for the Gaussian.*coordinates='scalar'"):
        SGLD(regression, integrator="exponential", coordinates="scalar")
    with pytest.raises(ValueError, match=r"integrator='leapfrog'; use one of \('euler', 'exponential'\)"):
        SGLD(regression, integrator="leapfrog")
    with pytest.raises(TypeError, match="control_variates must be True or False"):
        SGLD(regression, control_variates="yes")
    with pytest.raises(ValueError, match=r"SGHMC\(control_variates=True\) has no control variates for group latents"):
        SGWithinGibbs(SGHMC(regression, control_variates=True))
    with pytest.raises(ValueError, match="VariationalEM: the kernel's control variates"):
        VariationalEM(SGLD(regression, control_variates=True))
    kernel = SGLD(two_plates, control_variates=True)
    with pytest.raises(ValueError, match=r"needs the model's data in one subsample plate.*\['a', 'b'\]"):
        kernel.init(jax.random.key(0), 10, None, (jnp.asarray(X[:1000]), jnp.asarray(Y[:1000])), {})
    assert not ConstantSGD(regression).control_variates and SGLD(regression, control_variates=True).control_variates



def _off_gaussian_data(kind, n=4_000, d=4):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d)).astype(np.float32)
    x[:, 0] = 1.0
    w = np.array([0.5, 1.0, -0.5, 0.3])
    y = {"gaussian": x @ w + rng.normal(size=n), "logistic": rng.random(n) < 1 / (1 + np.exp(-x @ w)),
         "laplace": x @ w + rng.laplace(size=n), "separated": x[:, 1] > 0}[kind]
    likelihood = {"gaussian": lambda m: dist.Normal(m, 1.0), "logistic": lambda m: dist.Bernoulli(logits=m),
                  "laplace": lambda m: dist.Laplace(m, 1.0), "separated": lambda m: dist.Bernoulli(logits=m)}[kind]

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0, 3).expand([d]).to_event(1))
        with numpyro.plate("data", n, subsample_size=100) as idx:
            numpyro.sample("y", likelihood(X[idx] @ w), obs=y[idx])

    return model, jnp.asarray(x), jnp.asarray(y.astype(np.float32))


@pytest.mark.parametrize("kind, words", [
    # a kink at every datum: the Hessian is the prior's alone, Newton does not converge, δ ≈ 10⁴
    ("laplace", r"stopped after \d+ data passes without converging.*departs from the Gaussian's by δ = \d"),
    # the mode is where the prior stops the separating direction: pushed ≈ 5 posterior sds against it
    ("separated", r"the data push the centre against the prior by [1-9][0-9.]* posterior sds"),
])
def test_a_posterior_far_from_gaussian_is_warned_at_the_end_of_warmup(kind, words):
    """Off the Gaussian regime the control-variate kernels were silently wrong (a Laplace
    likelihood: SGLD's exponential step 25 sd off, SGHMC's sds 5–15× too small; separated
    classes: 0.15–0.3 sd off). At the end of warmup the kernel now names the cause it measured
    (the Newton decrement where the centre stopped, the prior's force at the centre in posterior
    sds, above 1, the gradient's departure δ from the Gaussian's over a posterior sd, above 0.2)
    and the alternatives; on a Gaussian and a logistic regression (force ≤ 0.01, δ ≈ 0.05–0.12)
    it says nothing."""
    model, X, y = _off_gaussian_data(kind)
    for make in (lambda: SGLD(model, control_variates=True), lambda: SGHMC(model, control_variates=True)):
        with pytest.warns(UserWarning, match=rf"control_variates=True: .*{words}.*Use control_variates=False.*"
                                             r"integrator='euler'"):
            MCMC(make(), num_warmup=100, num_samples=10, progress_bar=False).run(jax.random.key(0), X, y)
    for kind in ("gaussian", "logistic"):
        model, X, y = _off_gaussian_data(kind)
        mcmc = MCMC(SGLD(model, control_variates=True), num_warmup=100, num_samples=10, progress_bar=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mcmc.run(jax.random.key(0), X, y)
        assert not [w for w in caught if "control_variates=True:" in str(w.message)], kind
        control = mcmc.last_state.kernel_state.adapted.control
        assert float(control.nonlinearity) < 0.2 and float(control.prior_pull) < 0.1, control
