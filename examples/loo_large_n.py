"""Leave-one-out model comparison at N = 10⁷ with ``loo_subsample`` and ``compare_loo``.

Simulated linear regression (float32, fixed seeds): X ~ N(0, I) with D = 10 columns, true weights
linspace(1, 0.1, D), y = X w + N(0, 1) noise. Two competing models, both with w ~ N(0, I) and
σ ~ HalfNormal(1): ``full`` uses all D features, ``reduced`` drops the last ``--drop`` (default 2).

Draws are the realistic SG case: ``ConstantSGD(model, preconditioner="full", subsample_size=10_000)``,
2 chains × 500 draws, 200 warmup draws, ``--steps-per-sample`` 10 (default; shorter than the
kernel's relaxation time of one data pass, 1,000 SG steps at N = 10⁷, S = 10⁴, so the kernel warns
that consecutive draws are correlated: the point here is the cost of LOO, not the sampling; with 1,
the 700 SG steps are 0.7 data passes, the chains have not relaxed and p_loo comes out in the
thousands), ``MCMC(..., jit_model_args=True)``. Then ``loo_subsample`` for each model (m = 400,
``approximation="plpd"``; the same ``rng_key``, so the same subsample) on every ``--thin``-th draw
(default 5: 200 draws), without the posterior correction (``--correction`` turns it on: a Gaussian
g fitted to the draws, one data pass per draw), and ``compare_loo``. Printed: elpd, SE,
subsampling SE, p_loo, max Pareto k, posterior-correction k, the difference and its SE, wall
seconds of each ``loo_subsample`` call, and the peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) after the data, after sampling and after each
LOO call, against the size of the data in bytes.

Run: ``python examples/loo_large_n.py --n 10000000`` (and ``--n 1000000`` to see RSS at two N).
No network access; CPU or GPU.
"""

import argparse
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_sgd import ConstantSGD, compare_loo, loo_subsample


def model(X, y=None):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=10_000) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, sigma), obs=y[idx])


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--drop", type=int, default=2)
    parser.add_argument("--num-observations", type=int, default=400)
    parser.add_argument("--thin", type=int, default=5)
    parser.add_argument("--steps-per-sample", type=int, default=10)
    parser.add_argument("--chunk-size", type=int, default=20_000)
    parser.add_argument("--correction", action="store_true", help="posterior_correction=True")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.n, args.d), dtype=np.float32)
    w_true = np.linspace(1.0, 0.1, args.d).astype(np.float32)
    y = (X @ w_true + rng.standard_normal(args.n, dtype=np.float32)).astype(np.float32)
    X, y = jnp.asarray(X), jnp.asarray(y)
    data_bytes = X.nbytes + y.nbytes
    print(f"N = {args.n:,}, D = {args.d}; data {data_bytes / 2**20:,.0f} MiB; peak RSS after data "
          f"{peak_rss_mib():,.0f} MiB; backend {jax.default_backend()}")

    results, rows = {}, []
    for name, cols in (("full", args.d), ("reduced", args.d - args.drop)):
        Xm = X[:, :cols]
        mcmc = MCMC(ConstantSGD(model, preconditioner="full", steps_per_sample=args.steps_per_sample), num_warmup=200,
                    num_samples=500, num_chains=2, chain_method="vectorized", progress_bar=False,
                    jit_model_args=True)
        t0 = time.perf_counter()
        mcmc.run(jax.random.key(1), Xm, y)
        samples = mcmc.get_samples(group_by_chain=True)
        jax.block_until_ready(samples)
        t_sample = time.perf_counter() - t0
        thinned = {k: v[:, ::args.thin] for k, v in samples.items()}
        t0 = time.perf_counter()
        res = loo_subsample(mcmc.sampler, thinned, model_args=(Xm, y), num_observations=args.num_observations,
                            posterior_correction=args.correction, chunk_size=args.chunk_size,
                            rng_key=jax.random.key(2))
        t_loo = time.perf_counter() - t0
        results[name] = res
        rows.append((name, t_sample, t_loo, peak_rss_mib(), res))
        print(f"{name:8s} sampling {t_sample:6.1f} s | loo_subsample {t_loo:6.1f} s ({res.num_draws} draws) | "
              f"elpd_loo {res.elpd_loo:,.1f}  SE {res.se:.1f}  subsampling SE {res.subsampling_se:.2f}  "
              f"p_loo {res.p_loo:.1f}  max k {np.max(res.pareto_k):.2f}  posterior k {res.posterior_k:.2f} | "
              f"peak RSS {peak_rss_mib():,.0f} MiB")
    table = compare_loo(results)
    print(table[["elpd_loo", "se", "subsampling_se", "elpd_diff", "se_diff", "subsampling_se_diff",
                 "max_pareto_k"]].to_string(float_format=lambda v: f"{v:,.2f}"))
    print(f"peak RSS {peak_rss_mib():,.0f} MiB vs data {data_bytes / 2**20:,.0f} MiB "
          f"(a draws × N float32 log-likelihood would be {4 * 1000 * args.n / 2**20:,.0f} MiB)")


if __name__ == "__main__":
    main()
