"""The Langevin kernels with their default steps, in the curvature's coordinates and in the model's.

SGLD, pSGLD, SGHMC, EWSG and Santa set their steps at the end of the noise warmup. By default
(``preconditioner="auto"``) they then run in the coordinates φ of the warmup's curvature
(θ = L φ, L Lᵀ = N A⁻¹; :class:`numpyro_sgd.adaptation.coordinates.CurvatureBasis`); ``preconditioner="scalar"``
is the papers' kernel in the model's coordinates. This script runs both on three problems, with
ConstantSGD-full (its defaults) as the baseline, every kernel at the same budget: 200 warmup
and 1,000 sampling iterations of one data pass (N/S SG steps) each, 4 vectorized chains.

* ``regression``: a conjugate linear regression, N = 20,000, D = 10, AR(1) feature correlation
  0.9 and feature scales 0.5–3, S = 500; exact posterior.
* ``correlated``: two predictors with correlation 0.99 (posterior correlation −0.99), N = 1,000,
  S = 100; exact posterior.
* ``poisson``: a Poisson regression with counts around 1,100 (intercept 7, three predictors of
  sd 0.1), N = 2,000, S = 100; reference: NUTS on the full data (4,000 draws).

For each run: the largest |mean error| in posterior sds, the range of the sd ratios, the
smallest bulk ESS (ArviZ) and the data passes per chain. Every figure comes from this process.

    python benchmarks/langevin_defaults.py                      # all three problems
    python benchmarks/langevin_defaults.py correlated --out docs/results/langevin_defaults.md
"""

from __future__ import annotations

import argparse
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

from numpyro_sgd import EWSG, PSGLD, SGHMC, SGLD, ConstantSGD, Santa

LANGEVIN = {"SGLD": SGLD, "pSGLD": PSGLD, "SGHMC": SGHMC, "EWSG": EWSG, "Santa": Santa}


def linear_regression(n, d, rho, s, seed, scales=None, prior=10.0):
    """A conjugate linear regression (unit noise, N(0, prior²) weights): model, data, exact mean and sd."""
    rng = np.random.default_rng(seed)
    corr = rho ** np.abs(np.subtract.outer(np.arange(d), np.arange(d)))
    x = rng.standard_normal((n, d)) @ np.linalg.cholesky(corr).T
    x = x * (np.ones(d) if scales is None else np.asarray(scales))
    y = x @ rng.standard_normal(d) + rng.standard_normal(n)
    cov = np.linalg.inv(x.T @ x + np.eye(d) / prior**2)

    def model(x, y):
        w = numpyro.sample("w", dist.Normal(0, prior).expand([d]).to_event(1))
        with numpyro.plate("data", x.shape[0], subsample_size=s) as idx:
            numpyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=y[idx])

    return model, (jnp.asarray(x), jnp.asarray(y)), cov @ x.T @ y, np.sqrt(np.diag(cov)), n // s


def poisson_regression(n=2_000, s=100, seed=5):
    """Counts around e⁷ ≈ 1,100; the reference is NUTS on the full data."""
    rng = np.random.default_rng(seed)
    x = 0.1 * rng.standard_normal((n, 3))
    y = rng.poisson(np.exp(7.0 + x @ np.array([0.5, -0.3, 0.2]))).astype(np.float64)

    def model(x, y, subsample_size=s):
        w = numpyro.sample("w", dist.Normal(0, 5).expand([3]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0, 10))
        with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
            numpyro.sample("y", dist.Poisson(jnp.exp(b + x[idx] @ w)), obs=y[idx])

    data = (jnp.asarray(x), jnp.asarray(y))
    nuts = MCMC(NUTS(model), num_warmup=1000, num_samples=4000, progress_bar=False)
    nuts.run(jax.random.key(1), *data, subsample_size=n)
    ref = flatten(nuts.get_samples())
    return model, data, ref.mean(0), ref.std(0), n // s


PROBLEMS = {
    "regression": lambda: linear_regression(20_000, 10, 0.9, 500, 11, scales=np.linspace(0.5, 3.0, 10)),
    "correlated": lambda: linear_regression(1_000, 2, 0.99, 100, 3),
    "poisson": poisson_regression,
}


def flatten(samples):
    """The draws as one array (..., D): the intercept first, if the model has one."""
    w = np.asarray(samples["w"])
    return np.concatenate([np.asarray(samples["b"])[..., None], w], -1) if "b" in samples else w


def run(kernel, data, chains):
    mcmc = MCMC(kernel, num_warmup=200, num_samples=1000, num_chains=chains, chain_method="vectorized",
                progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(jax.random.key(0), *data)
    return mcmc


def summary(mcmc, mean, sd):
    draws = flatten(mcmc.get_samples(group_by_chain=True))
    flat = draws.reshape(-1, draws.shape[-1])
    ess = np.asarray(az.ess(az.convert_to_dataset({"x": draws}))["x"].values)
    ratio = flat.std(0) / sd
    return dict(error=float(np.max(np.abs(flat.mean(0) - mean) / sd)), sd_lo=float(ratio.min()),
                sd_hi=float(ratio.max()), ess=float(ess.min()),
                passes=float(np.mean(np.asarray(mcmc.last_state.data_passes))),
                rejected=int(np.sum(np.asarray(mcmc.last_state.num_divergences))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="*", help=f"some of {list(PROBLEMS)} (default: all three)")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--out", help="write the table as markdown here")
    args = parser.parse_args(argv)
    unknown = set(args.problems) - set(PROBLEMS)
    if unknown:
        parser.error(f"unknown problems {sorted(unknown)}; choose from {list(PROBLEMS)}")
    lines = ["| problem | kernel | coordinates | max \\|mean error\\| (sd) | sd ratio | min ESS | passes/chain |"
             " rejected |", "|---|---|---|---|---|---|---|---|"]
    for name in args.problems or list(PROBLEMS):
        model, data, mean, sd, per_pass = PROBLEMS[name]()
        print(f"== {name}: N = {data[0].shape[0]}, D = {mean.size}, N/S = {per_pass}")
        runs = [("ConstantSGD-full", "(its own)", ConstantSGD(model, preconditioner="full"))]
        for kernel, cls in LANGEVIN.items():
            for coords, option in (("curvature", "auto"), ("model", "scalar")):
                runs.append((kernel, coords, cls(model, preconditioner=option, steps_per_sample=per_pass)))
        for kernel, coords, k in runs:
            r = summary(run(k, data, args.chains), mean, sd)
            row = (f"| {name} | {kernel} | {coords} | {r['error']:.3f} | {r['sd_lo']:.2f}–{r['sd_hi']:.2f} | "
                   f"{r['ess']:.0f} | {r['passes']:.0f} | {r['rejected']} |")
            print(row)
            lines.append(row)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
