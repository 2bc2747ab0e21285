"""The control-variate kernel off the Gaussian regime, against long NUTS runs on the same data.

``SGLD(model, control_variates=True)`` chooses its exponential step from what it measures at the
end of warmup (the control-variate noise and how far the gradient is from linear over a
posterior sd, δ). On posteriors far from Gaussian it must either stay accurate by taking smaller
steps or say so during the run. Problems (simulated, fixed seeds; N rows, S = 100):

* ``separation``: logistic regression whose first predictor nearly separates the classes
  (true weight 9, N(0, 10²) prior): a skewed posterior;
* ``poisson-small``: Poisson regression with counts mostly 0–2 (exp(−2.5 + ...));
* ``studentt``: a regression with StudentT(3) errors and an unknown scale;
* ``hierarchical``: a random-intercept normal model (20 groups, a group scale τ): the plain kernel
  warns at init that τ is a hyperparameter site, and ``SGWithinGibbs`` refuses control variates;
* ``laplace``: a regression with Laplace errors (a kink at every datum: the Hessian is the
  prior's alone, far from the Gaussian regime);
* ``separated``: a logistic regression whose second predictor separates the classes completely
  (the mode is where the N(0, 3²) prior stops that coefficient).

The last two are far from Gaussian: the kernels warn at the end of warmup (the Newton decrement,
the prior's pull on the centre, δ). ``--kernels`` runs SGHMC and EWSG with control variates too.

For each: the reference is NUTS on all rows (2 chains × 4,000 draws after 1,000 warmup), the
kernel runs 2 chains × (500 warmup + 2,000) draws of one step; printed are min bulk ESS, the
largest |mean error| in NUTS sds and |sd ratio − 1| over every latent coordinate, the step
N ε/2 and δ the kernel chose, the warnings the run gave, and ``check_run``'s messages.

    python benchmarks/cv_off_gaussian.py                 # every problem at N = 500 and 5,000
    python benchmarks/cv_off_gaussian.py --problems separation --n 500
    python benchmarks/cv_off_gaussian.py --problems laplace separated --n 5000 --kernels SGLD SGHMC EWSG
"""

from __future__ import annotations

import argparse
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, NUTS

from numpyro_sgd import EWSG, SGHMC, SGLD, ConstantSGD, SGWithinGibbs, check_run

PROBLEMS = ("separation", "poisson-small", "studentt", "hierarchical", "laplace", "separated")
KERNELS = {"SGLD": SGLD, "SGHMC": SGHMC, "EWSG": EWSG}
GROUPS = 20


def problem(name, n, seed=0):
    """(model, X, y) of a problem; the model's plate subsamples S rows (``S=None``: all)."""
    rng = np.random.default_rng(seed)
    if name == "separation":
        d = 4
        X = rng.normal(size=(n, d))
        y = (rng.random(n) < 1 / (1 + np.exp(-X @ np.array([9.0, 0.75, -0.75, 0.0])))).astype(float)

        def model(X, y, S=None):
            w = numpyro.sample("w", dist.Normal(0, 10).expand([d]).to_event(1))
            with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
                numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])
    elif name == "poisson-small":
        d = 3
        X = 0.5 * rng.normal(size=(n, d))
        y = rng.poisson(np.exp(X @ np.array([-1.5, 0.3, 0.2]) - 1.0)).astype(float)

        def model(X, y, S=None):
            b = numpyro.sample("b", dist.Normal(0, 5))
            w = numpyro.sample("w", dist.Normal(0, 5).expand([d]).to_event(1))
            with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
                numpyro.sample("y", dist.Poisson(jnp.exp(X[idx] @ w + b)), obs=y[idx])
    elif name == "studentt":
        d = 3
        X = rng.normal(size=(n, d))
        y = X @ np.array([1.0, -0.5, 0.2]) + rng.standard_t(3, size=n)

        def model(X, y, S=None):
            w = numpyro.sample("w", dist.Normal(0, 10).expand([d]).to_event(1))
            s = numpyro.sample("s", dist.HalfNormal(5))
            with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
                numpyro.sample("y", dist.StudentT(3.0, X[idx] @ w, s), obs=y[idx])
    elif name in ("laplace", "separated"):
        d = 4
        X = rng.normal(size=(n, d))
        X[:, 0] = 1.0
        w0 = np.array([0.5, 1.0, -0.5, 0.3])
        y = X @ w0 + rng.laplace(size=n) if name == "laplace" else (X[:, 1] > 0).astype(float)

        def model(X, y, S=None):
            w = numpyro.sample("w", dist.Normal(0, 3).expand([d]).to_event(1))
            with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
                mean = X[idx] @ w
                likelihood = dist.Laplace(mean, 1.0) if name == "laplace" else dist.Bernoulli(logits=mean)
                numpyro.sample("y", likelihood, obs=y[idx])
    else:
        X = rng.integers(0, GROUPS, n).astype(float)  # the group of each row
        y = rng.normal(0.0, 1.0, GROUPS)[X.astype(int)] * 0.5 + rng.normal(size=n)

        def model(X, y, S=None):
            tau = numpyro.sample("tau", dist.HalfNormal(2.0))
            with numpyro.plate("groups", GROUPS):
                a = numpyro.sample("a", dist.Normal(0.0, tau))
            with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
                numpyro.sample("y", dist.Normal(a[X[idx].astype(jnp.int32)], 1.0), obs=y[idx])
    return model, jnp.asarray(X), jnp.asarray(y)


def errors(run, reference):
    """(min bulk ESS, max |mean error| / NUTS sd, max |sd ratio − 1|) over every latent coordinate."""
    ours = run.get_samples(group_by_chain=True)
    ess, mean_err, sd_err = np.inf, 0.0, 0.0
    for site, ref in reference.items():
        r = np.asarray(ref).reshape(len(ref), -1)
        x = np.asarray(ours[site]).reshape(ours[site].shape[0], ours[site].shape[1], -1)
        flat = x.reshape(-1, r.shape[1])
        ess = min(ess, float(np.min(effective_sample_size(x))))
        mean_err = max(mean_err, float(np.max(np.abs(flat.mean(0) - r.mean(0)) / r.std(0))))
        sd_err = max(sd_err, float(np.max(np.abs(flat.std(0) / r.std(0) - 1))))
    return ess, mean_err, sd_err


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", nargs="+", choices=PROBLEMS, default=list(PROBLEMS))
    parser.add_argument("--n", nargs="+", type=int, default=[500, 5_000])
    parser.add_argument("--kernels", nargs="+", choices=list(KERNELS), default=["SGLD"],
                        help="the control-variate kernels to run (default: SGLD)")
    args = parser.parse_args(argv)
    numpyro.enable_x64()
    print("| problem | kernel | N | min bulk ESS | max mean err (NUTS sd) | max sd err | N ε/2 | δ | prior pull | "
          "warnings during the run | check_run |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.problems:
        for n in args.n:
            model, X, y = problem(name, n)
            nuts = MCMC(NUTS(model), num_warmup=1_000, num_samples=4_000, num_chains=2, chain_method="sequential",
                        progress_bar=False)
            nuts.run(jax.random.key(1), X, y)
            for kernel in args.kernels:
                run = MCMC(KERNELS[kernel](model, control_variates=True), num_warmup=500, num_samples=2_000,
                           num_chains=2, chain_method="vectorized", progress_bar=False)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    run.run(jax.random.key(0), X, y, S=100)
                said = [str(w.message).split(":")[1 + str(w.message).startswith(f"{kernel}: control")].split(".")[0]
                        .strip()[:90] for w in caught
                        if issubclass(w.category, UserWarning) and str(w.message).startswith(kernel)]
                ess, mean_err, sd_err = errors(run, nuts.get_samples())
                state = run.last_state.kernel_state
                step = float(np.asarray(state.step_size)[0]) * n / 2
                delta = float(np.asarray(state.adapted.control.nonlinearity)[0])
                pull = float(np.asarray(state.adapted.control.prior_pull)[0])
                checks = [m.split(":")[1].split(".")[0].strip()[:60] for m in check_run(run, warn=False)]
                print(f"| {name} | {kernel} | {n:,} | {ess:,.0f} | {mean_err:.3f} | {sd_err:.3f} | {step:.2g} | "
                      f"{delta:.3g} | {pull:.2g} | {'; '.join(said) or '—'} | {'; '.join(checks) or '—'} |", flush=True)
            if name == "hierarchical":
                try:
                    SGWithinGibbs(SGLD(model, control_variates=True))
                except ValueError as error:
                    print(f"|  |  | SGWithinGibbs refuses: {str(error)[:100]}… |||||||", flush=True)
                gibbs = MCMC(SGWithinGibbs(ConstantSGD(model)), num_warmup=200, num_samples=1_000, num_chains=2,
                             chain_method="vectorized", progress_bar=False)
                gibbs.run(jax.random.key(2), X, y, S=max(100, 10 * GROUPS))
                ess, mean_err, sd_err = errors(gibbs, nuts.get_samples())
                print(f"| hierarchical | SGWithinGibbs(ConstantSGD) | {n:,} | {ess:,.0f} | {mean_err:.3f} | "
                      f"{sd_err:.3f} | | | | | |", flush=True)


if __name__ == "__main__":
    main()
