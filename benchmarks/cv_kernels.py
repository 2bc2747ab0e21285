"""The kernels that take ``control_variates=True``, side by side.

``vectorized``: each of SGLD, SGHMC, EWSG and OverdampedEWSG with control variates on a
covtype-shaped logistic regression (N = 50,000, D = 55, S = 1,000, 2 vectorized chains, 200
warmup + 500 draws), each in its own process under a timeout: the wall time, or "did not finish"
(SGHMC's used to deadlock in jaxlib's batched eigendecomposition on 2 cores).

``ess``: on a conjugate linear regression (N = 16,000, D = 5, S = 200, correlated predictors;
exact posterior), 2 vectorized chains × 1,500 draws after 300 warmup iterations: the min bulk ESS,
the largest mean error (posterior sds) and sd ratio, the autocorrelation time the end of warmup
predicts (SG steps) and whether the short-run warning fired, for SGLD, SGHMC and EWSG with
control variates at one SG step per draw, and for SGHMC and EWSG without them at 40.

    python benchmarks/cv_kernels.py vectorized
    python benchmarks/cv_kernels.py ess
"""

import subprocess
import sys
import textwrap
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC

import numpyro_sgd

VECTORIZED = textwrap.dedent("""
    import sys, time, numpy as np, jax, numpyro, numpyro.distributions as dist
    from numpyro.infer import MCMC
    import numpyro_sgd
    rng = np.random.default_rng(0)
    N, D = 50_000, 55
    X = rng.normal(size=(N, D)).astype(np.float32)
    X[:, 0] = 1.0
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ (0.5 * rng.normal(size=D))))).astype(np.float32)
    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([D]).to_event(1))
        with numpyro.plate("data", N, subsample_size=1_000) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])
    start = time.perf_counter()
    mcmc = MCMC(getattr(numpyro_sgd, sys.argv[1])(model, control_variates=True), num_warmup=200, num_samples=500,
                num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0), jax.numpy.asarray(X), jax.numpy.asarray(y))
    w = np.asarray(mcmc.get_samples()["w"])
    print(f"{time.perf_counter() - start:.1f} {bool(np.isfinite(w).all())}")
""")


def vectorized(timeout=600):
    print("| kernel | wall (s) | draws finite |")
    print("|---|---|---|")
    for name in ("SGHMC", "SGLD", "EWSG", "OverdampedEWSG"):
        try:
            out = subprocess.run([sys.executable, "-W", "ignore", "-c", VECTORIZED, name], capture_output=True,
                                 text=True, timeout=timeout)
            wall, finite = out.stdout.split()[-2:] if out.returncode == 0 else ("failed", out.stderr[-200:])
        except subprocess.TimeoutExpired:
            wall, finite = f"did not finish in {timeout} s", "—"
        print(f"| {name} | {wall} | {finite} |", flush=True)


def regression():
    n, d = 16_000, 5
    rng = np.random.default_rng(3)
    corr = np.eye(d)
    corr[0, 1] = corr[1, 0] = 0.5
    corr[1, 2] = corr[2, 1] = 0.3
    X = rng.normal(size=(n, d)) @ np.linalg.cholesky(corr).T
    y = X @ rng.normal(size=d) + rng.normal(size=n)
    cov = np.linalg.inv(X.T @ X + np.eye(d) / 100)

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0, 10).expand([d]).to_event(1))
        with numpyro.plate("data", n, subsample_size=200) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])

    return model, (jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)), cov @ X.T @ y, np.sqrt(np.diag(cov))


def ess():
    model, data, mean, sd = regression()
    print("| kernel | SG steps per draw | min bulk ESS (of 3,000) | ESS per 1,000 SG steps | max mean err (sd) | "
          "sd ratios | predicted τ (SG steps) | short-run warning | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    cases = [("SGLD", True, 1), ("SGHMC", True, 1), ("EWSG", True, 1), ("SGHMC", False, 40), ("EWSG", False, 40)]
    for name, cv, steps in cases:
        kernel = getattr(numpyro_sgd, name)(model, control_variates=cv, steps_per_sample=steps)
        mcmc = MCMC(kernel, num_warmup=300, num_samples=1_500, num_chains=2, chain_method="vectorized",
                    progress_bar=False)
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mcmc.run(jax.random.key(0), *data)
            w = np.asarray(mcmc.get_samples(group_by_chain=True)["w"], np.float64)
        wall = time.perf_counter() - start
        bulk = float(np.min(effective_sample_size(w)))
        flat = w.reshape(-1, w.shape[-1])
        warned = [str(c.message) for c in caught if "forget its state" in str(c.message)]
        predicted = (warned[0].split("in about ")[1].split(" SG steps")[0] if warned else "—")
        print(f"| {name}{' + CV' if cv else ''} | {steps} | {bulk:.0f} | {1e3 * bulk / (1_500 * steps * 2):.1f} | "
              f"{np.max(np.abs(flat.mean(0) - mean) / sd):.3f} | {np.min(flat.std(0) / sd):.3f}–"
              f"{np.max(flat.std(0) / sd):.3f} | {predicted} | {'yes' if warned else 'no'} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    {"vectorized": vectorized, "ess": ess}[sys.argv[1] if len(sys.argv) > 1 else "vectorized"]()
