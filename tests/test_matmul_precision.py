"""Every program a kernel traces computes the model's float32 matrix products at float32 precision
unless the user chose a precision (``numerics.compilation.full_precision_matmuls``): JAX's default
on a GPU rounds their operands to TensorFloat-32, about 0.1 posterior sd of a regression weight at
N = 10⁷ rows, where the centre's Newton steps then stall (measured on an H200). The precision is
fixed when a product is traced, so the model records the setting it is traced under."""

import warnings

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_sgd import SGLD


def recording_model(seen):
    def model(X, y):
        seen.append(jax.config.jax_default_matmul_precision)
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        numpyro.deterministic("first_logit", X[0] @ w)
        with numpyro.plate("data", X.shape[0], subsample_size=50) as i:
            numpyro.sample("y", dist.Bernoulli(logits=X[i] @ w), obs=y[i])

    return model


def run(seen):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 2)).astype(np.float32)
    y = (rng.random(500) < 1 / (1 + np.exp(-X @ np.array([1.0, -0.5])))).astype(np.float32)
    mcmc = MCMC(SGLD(recording_model(seen), control_variates=True), num_warmup=20, num_samples=20,
                progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mcmc.run(jax.random.key(0), X, y)
    return mcmc


def test_the_kernel_traces_the_model_with_float32_products():
    seen = []
    mcmc = run(seen)
    assert "first_logit" in mcmc.get_samples()  # the postprocessing trace is among those recorded
    assert len(seen) >= 3 and set(seen) == {"float32"}, seen
    assert jax.config.jax_default_matmul_precision is None  # and the setting is the user's again after


def test_a_precision_the_user_set_stands():
    seen = []
    with jax.default_matmul_precision("bfloat16"):
        run(seen)
    assert len(seen) >= 3 and set(seen) == {"bfloat16"}, seen
