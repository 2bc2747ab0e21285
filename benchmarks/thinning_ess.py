"""Effective samples per data pass of ConstantSGD-full against how far apart its draws are.

With the KL-optimal preconditioner the chain is, to first order, an Ornstein–Uhlenbeck process
whose coordinates all forget at rate 2 per data pass: its drift per step is H*A (Mandt et al.
2017, Eq. 21) with H* = (2S/N)(BBᵀ)⁻¹ (Thm. 2, Eq. 20), and where the gradient-noise covariance
BBᵀ is the Hessian A (a well-specified model near the mode) that is (2S/N)·I. Draws 1/k of a pass apart then have
lag-one autocorrelation ρ = e^(−2/k), and one pass gives k (1 − ρ)/(1 + ρ) effective samples:
0.76, 0.92 and 0.98 for k = 1, 2, 4 (the limit is 1). This script measures it.

What runs (one process): a simulated logistic regression of ``benchmark_scaling.py`` (float32,
D = 50), ``ConstantSGD(model, preconditioner="full", subsample_size=S, steps_per_sample=N/(k·S))``
with ``MCMC(num_warmup=20, num_samples=k·P, num_chains=2, chain_method="sequential",
jit_model_args=True)`` for each k of ``--draws-per-pass`` and each of ``--seeds`` seeds, so every
run samples P passes per chain. Printed per run: the bulk ESS (``arviz.ess``) of each of the D
coordinates, as its minimum and median, and both per sampling pass (2 chains × P passes).

    python benchmarks/thinning_ess.py --n 1000000 --passes 500 --seeds 2
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import jax
import numpy as np
from numpyro.infer import MCMC

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_scaling import make_model, simulate  # noqa: E402

from numpyro_sgd import ConstantSGD  # noqa: E402
from numpyro_sgd.diagnostics import arviz_compat  # noqa: E402


def theory(k):
    """Effective samples per pass of draws 1/k of a pass apart, for an OU rate of 2 per pass."""
    rho = math.exp(-2.0 / k)
    return k * (1 - rho) / (1 + rho)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--d", type=int, default=50)
    p.add_argument("--s", type=int, default=10_000)
    p.add_argument("--passes", type=int, default=500, help="sampling passes per chain")
    p.add_argument("--draws-per-pass", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seeds", type=int, default=2)
    args = p.parse_args(argv)
    X, y, _ = simulate("logistic", args.n, args.d)
    data = (jax.device_put(X), jax.device_put(y))
    model = make_model("logistic")
    print(f"N = {args.n:,}, D = {args.d}, S = {args.s:,}, {args.passes} sampling passes per chain, 2 chains")
    print("| draws per pass | seed | min ESS | median ESS | min per pass | median per pass | theory per pass | s |")
    print("|---|---|---|---|---|---|---|---|")
    for k in args.draws_per_pass:
        for seed in range(args.seeds):
            kernel = ConstantSGD(model, preconditioner="full", subsample_size=args.s,
                                 steps_per_sample=math.ceil(args.n / (k * args.s)), warmup_passes=20)
            mcmc = MCMC(kernel, num_warmup=20, num_samples=k * args.passes, num_chains=2,
                        chain_method="sequential", jit_model_args=True, progress_bar=False)
            t = time.perf_counter()
            mcmc.run(jax.random.key(seed), *data, subsample_size=args.s)
            w = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
            ess = np.array([arviz_compat.ess(w[..., j]) for j in range(args.d)])
            per = 2 * args.passes
            print(f"| {k} | {seed} | {ess.min():.0f} | {np.median(ess):.0f} | {ess.min() / per:.3f} | "
                  f"{np.median(ess) / per:.3f} | {theory(k):.3f} | {time.perf_counter() - t:.0f} |", flush=True)


if __name__ == "__main__":
    main()
