"""The pure-algorithm interface: a user's own ``lax.scan`` over an algorithm's steps gives the
draws of ``MCMC`` for the same key, and ``info`` reports the step's indices and work."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax import random
from numpyro.infer import MCMC

from numpyro_sgd import SGHMC, SGLD, ConstantSGD, StepInfo

N, S = 800, 40
Y = jnp.asarray(np.random.default_rng(3).normal(1.5, 1.0, N))


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    with numpyro.plate("data", y.shape[0], subsample_size=S) as idx:
        numpyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


KERNELS = [
    pytest.param(lambda: ConstantSGD(model, preconditioner="full", steps_per_sample=1), id="ConstantSGD-full"),
    pytest.param(lambda: SGLD(model, step_size=1e-4), id="SGLD"),
    pytest.param(lambda: SGHMC(model, step_size=1e-3, friction=20.0), id="SGHMC"),
]
WARMUP, SAMPLES = 50, 30


def scan_by_hand(kernel, key):
    """The driver's key streams (base.py module docstring), written out."""
    alg, oracle, theta = kernel.algorithm(key, Y)
    key, _, k_state, _, _ = random.split(key, 5)
    state = alg.init(k_state, theta, WARMUP)

    def run(step_fn, i0, n):
        def body(carry, i):
            key, theta, state = carry
            key, k_step = random.split(key)
            theta, state, info = step_fn(k_step, i, theta, state, oracle)
            return (key, theta, state), (theta, info)

        return jax.lax.scan(body, (key, theta, state), i0 + jnp.arange(n))

    (key, theta, state), _ = run(alg.step(warmup=True), 0, WARMUP)
    if alg.end_warmup is not None:
        state = alg.end_warmup(theta, state, oracle)
    _, (draws, info) = run(alg.sample_step, WARMUP, SAMPLES)
    return draws, info


@pytest.mark.parametrize("make", KERNELS)
def test_hand_written_scan_gives_the_mcmc_draws(make):
    key = random.key(5)
    draws, info = scan_by_hand(make(), key)
    mcmc = MCMC(make(), num_warmup=WARMUP, num_samples=SAMPLES, progress_bar=False)
    mcmc.run(key, Y)
    assert int(mcmc.last_state.num_divergences) == 0  # no rejected step, so the streams agree exactly
    np.testing.assert_array_equal(np.asarray(draws[:, 0]), np.asarray(mcmc.get_samples()["mu"]))
    assert isinstance(info, StepInfo)
    # one minibatch per step: S fresh indices in range, different between steps
    idx = np.asarray(info.indices["data"])
    assert idx.shape == (SAMPLES, S) and idx.min() >= 0 and idx.max() < N
    assert not np.array_equal(idx[0], idx[1])
    np.testing.assert_array_equal(np.asarray(info.num_grad_evals), S)
