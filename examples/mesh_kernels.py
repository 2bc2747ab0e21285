"""Every kernel with ``mesh=`` on 2 forced host devices against the same kernel on 1 device.

Conjugate linear regression (N = 4,000, D = 3, S = 40, float32), 100 warmup iterations and 300
draws (one data pass per draw), ``jit_model_args=True``. Printed: KL(q ‖ exact posterior) of a
Gaussian fitted to the draws on 1 device and with the rows split over 2 devices, VariationalEM on
the mesh, and EWSG's refusal.

    python examples/mesh_kernels.py
"""

import os
import warnings

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # before JAX starts

import jax  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

import numpyro_sgd as ns  # noqa: E402

N, D, S = 4_000, 3, 40


def regression(X, t):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=S) as i:
        numpyro.sample("t", dist.Normal(X[i] @ w, 1.0), obs=t[i])


def regression_with_param(X, t):
    prior_scale = numpyro.param("prior_scale", 1.0, constraint=dist.constraints.positive)
    w = numpyro.sample("w", dist.Normal(0.0, prior_scale).expand([D]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=S) as i:
        numpyro.sample("t", dist.Normal(X[i] @ w, 1.0), obs=t[i])


def main():
    warnings.simplefilter("ignore")
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rng = np.random.default_rng(1)
    X = rng.normal(size=(N, D)) * np.array([1.0, 2.0, 3.0])
    t = X @ rng.normal(size=D) + rng.normal(size=N)
    cov = np.linalg.inv(np.eye(D) + X.T @ X)
    mean = cov @ X.T @ t
    X, t = X.astype(np.float32), t.astype(np.float32)
    sharded = tuple(jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (X, t))

    def kl(w):
        m, c = w.mean(0), np.cov(w.T)
        return 0.5 * (np.trace(np.linalg.solve(cov, c)) + (mean - m) @ np.linalg.solve(cov, mean - m) - D
                      + np.linalg.slogdet(cov)[1] - np.linalg.slogdet(c)[1])

    def run(kernel, args, chains=1):
        mcmc = MCMC(kernel, num_warmup=100, num_samples=300, num_chains=chains, chain_method="vectorized",
                    progress_bar=False, jit_model_args=True)
        mcmc.run(jax.random.key(2), *args)
        return mcmc

    per_pass = N // S
    cases = [("ConstantSGD-full", lambda m: ns.ConstantSGD(regression, preconditioner="full", mesh=m), 1),
             ("SGFS", lambda m: ns.SGFS(regression, mesh=m), 1),
             ("IASG", lambda m: ns.IASG(regression, mesh=m), 1),
             ("SGLD", lambda m: ns.SGLD(regression, steps_per_sample=per_pass, mesh=m), 1),
             ("PSGLD", lambda m: ns.PSGLD(regression, steps_per_sample=per_pass, mesh=m), 1),
             ("SGHMC", lambda m: ns.SGHMC(regression, steps_per_sample=per_pass, mesh=m), 1),
             ("Santa", lambda m: ns.Santa(regression, steps_per_sample=per_pass, mesh=m), 1),
             ("ConstantSGD-full, 2 vectorized chains", lambda m: ns.ConstantSGD(regression, preconditioner="full",
                                                                                mesh=m), 2)]
    for name, make, chains in cases:
        one = kl(np.asarray(run(make(None), (X, t), chains).get_samples()["w"], np.float64))
        two = kl(np.asarray(run(make(mesh), sharded, chains).get_samples()["w"], np.float64))
        print(f"{name}: KL 1 device {one:.4f}, 2 devices {two:.4f}", flush=True)
    mcmc = run(ns.VariationalEM(ns.ConstantSGD(regression_with_param, preconditioner="full", mesh=mesh)), sharded)
    print(f"VariationalEM on the mesh: KL {kl(np.asarray(mcmc.get_samples()['w'], np.float64)):.4f}, "
          f"λ {mcmc.sampler.hyperparameters(mcmc.last_state)}")
    try:
        ns.EWSG(regression, mesh=mesh)
    except ValueError as e:
        print("EWSG:", e)


if __name__ == "__main__":
    main()
