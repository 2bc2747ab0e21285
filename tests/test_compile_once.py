"""Compilation: a repeated ``MCMC.run`` compiles nothing new, and large data are never compiled in
as constants without a warning.

Compilations are counted with JAX's own monitoring events (``/jax/core/compile/...``), not timed.
NumPyro turns the progress bar off when ``CI`` is set; the tests switch it back on
(``mcmc.progress_bar = True``) because the progress-bar path is the one in which NumPyro 0.22
reuses its compiled step across runs (its ``progress_bar=False`` loop is recompiled by every
``MCMC.run``, pyro-ppl/numpyro#2171, fixed after 0.22.0).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax import monitoring
from numpyro.infer import MCMC

from numpyro_sgd import SGFS, SGLD, ConstantSGD
from numpyro_sgd.base import CONSTANT_DATA_WARN_BYTES

N, S = 2_000, 50
_rng = np.random.default_rng(0)
X = jnp.asarray(_rng.normal(size=(N, 3)), jnp.float32)
Y = X @ jnp.array([1.0, -0.5, 0.2]) + 0.5 * jnp.asarray(_rng.normal(size=N), jnp.float32)


def model(x, y, subsample_size):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([3]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("obs", dist.Normal(x[idx] @ w, 0.5), obs=y[idx])


class CompileCounter:
    """Counts XLA backend compilations while active."""

    def __init__(self):
        self.count, self.active = 0, False
        monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **_):
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1

    def __enter__(self):
        self.count, self.active = 0, True
        return self

    def __exit__(self, *exc):
        self.active = False


@pytest.fixture(scope="module")
def counter():
    return CompileCounter()


@pytest.mark.parametrize("kernel", [ConstantSGD, SGFS])
@pytest.mark.parametrize("jit_model_args", [False, True])
def test_repeated_runs_compile_nothing(counter, kernel, jit_model_args):
    """After the first run (which compiles), a second run with a new key (the kernel's init
    again) and a continuation from ``post_warmup_state`` compile no new program; the
    continuation returns new draws."""
    mcmc = MCMC(kernel(model, steps_per_sample=5), num_warmup=20, num_samples=10, num_chains=2,
                chain_method="vectorized", jit_model_args=jit_model_args)
    mcmc.progress_bar = True
    with counter:
        mcmc.run(jax.random.key(0), X, Y, S)
    assert counter.count > 0  # the counter sees compilations
    with counter:
        mcmc.run(jax.random.key(1), X, Y, S)
    assert counter.count == 0
    first = mcmc.get_samples()["w"]
    mcmc.post_warmup_state = mcmc.last_state
    with counter:
        mcmc.run(mcmc.post_warmup_state.rng_key, X, Y, S)
        second = mcmc.get_samples()["w"]
    assert counter.count == 0
    assert second.shape == first.shape and not np.allclose(second, first)


def test_large_closed_over_data_warns_with_the_fix():
    n = CONSTANT_DATA_WARN_BYTES // (3 * 4) + 1_000
    x = jnp.zeros((n, 3), jnp.float32)
    y = jnp.zeros(n, jnp.float32)
    mcmc = MCMC(SGLD(model, step_size=1e-6), num_warmup=0, num_samples=1, progress_bar=False)
    with pytest.warns(UserWarning, match="jit_model_args=True"):
        mcmc.run(jax.random.key(0), x, y, S)
    mcmc = MCMC(SGLD(model, step_size=1e-6), num_warmup=0, num_samples=1, progress_bar=False, jit_model_args=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*compiled into the sampling loop.*")
        mcmc.run(jax.random.key(0), x, y, S)


def test_kept_init_program_follows_the_number_of_chains():
    """The kernel keeps its compiled init for the next run with the same arguments; a run with
    another number of chains (one chain, then two vectorized) must not reuse it."""
    kernel = ConstantSGD(model, steps_per_sample=5)
    MCMC(kernel, num_warmup=20, num_samples=5, progress_bar=False).run(jax.random.key(0), X, Y, S)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=5, num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0), X, Y, S)
    assert mcmc.get_samples(group_by_chain=True)["w"].shape == (2, 5, 3)
