"""What JAX's persistent compilation cache saves on a second process: the same run
(``benchmarks/overhead.py``'s logistic regression, ``mcmc.run``) in two fresh Python processes that
share a cache directory, the first with it empty. Prints, per process, the trace, lower and compile
seconds JAX reports and the end-to-end wall.

    python benchmarks/persistent_cache.py --n 100000 --d 10 --s 1000
    python benchmarks/persistent_cache.py --kernel SGLD-CV --n 1000000 --d 50 --s 1000

``--kernel ConstantSGD-full`` (default): ``ConstantSGD(model, preconditioner="full")``, 100 warmup
iterations. ``--kernel SGLD-CV``: ``SGLD(model, control_variates=True)`` as ``anchors.py`` runs it
(500 warmup + ``--num-samples`` iterations); the baseline beside it is the time of its data passes:
its passes (SG steps, the centre's, both chains) times the time of one full-data gradient pass of a
hand-written jitted ``lax.map`` over the same blocks of rows, measured in the same process after
the run (compiled first, best of three).

The cache is turned on as a user would, before the first compile::

    jax.config.update("jax_compilation_cache_dir", "/path/to/cache")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # default 1 s skips small programs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def child(args):
    import jax

    jax.config.update("jax_compilation_cache_dir", args.cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    from jax import random
    from numpyro.infer import MCMC

    sys.path.insert(0, os.path.dirname(__file__))
    from overhead import Clock, Counted, simulate

    from numpyro_sgd import ConstantSGD

    from numpyro_sgd import SGLD

    X, y = simulate(args.n, args.d)
    clock = Clock()
    t0 = time.perf_counter()
    if args.kernel == "SGLD-CV":
        kernel, num_warmup = SGLD(Counted(args.d, args.s), control_variates=True), 500
    else:
        kernel, num_warmup = ConstantSGD(Counted(args.d, args.s), preconditioner="full", subsample_size=args.s), 100
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=args.num_samples, num_chains=2, chain_method="vectorized",
                jit_model_args=True, progress_bar=False)
    mcmc.run(random.key(0), X, y)
    draws = jax.block_until_ready(mcmc.get_samples())
    out = clock.read()
    out["wall"] = time.perf_counter() - t0
    state = mcmc.last_state
    passes = float(np.sum(np.asarray(state.data_passes)))
    if args.kernel == "SGLD-CV":
        passes += float(np.sum(np.asarray(state.kernel_state.adapted.control.passes)))
    out["passes"], out["pass_s"] = passes, pass_seconds(X, y, np.asarray(draws["w"][0]))
    out["mean_w"] = np.asarray(draws["w"]).mean(0)[:3].round(4).tolist()
    print(json.dumps(out))


def pass_seconds(X, y, w, block=16_384):
    """Seconds of one full-data gradient pass of the logistic likelihood: a jitted ``lax.map`` over
    blocks of rows (the rows after the last whole block left out), compiled first, best of three."""
    import jax
    import jax.numpy as jnp

    n = (X.shape[0] // block) * block
    Xb, yb = jnp.asarray(X[:n]).reshape(-1, block, X.shape[1]), jnp.asarray(y[:n]).reshape(-1, block)

    @jax.jit
    def grad(w):
        def one(xy):
            x, t = xy
            return x.T @ (t - jax.nn.sigmoid(x @ w))
        return jnp.sum(jax.lax.map(one, (Xb, yb)), axis=0)

    w = jnp.asarray(w)
    jax.block_until_ready(grad(w))
    times = []
    for _ in range(3):
        t = time.perf_counter()
        jax.block_until_ready(grad(w))
        times.append(time.perf_counter() - t)
    return min(times) * X.shape[0] / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--s", type=int, default=1_000)
    ap.add_argument("--num-samples", type=int, default=500)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--kernel", choices=("ConstantSGD-full", "SGLD-CV"), default="ConstantSGD-full")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    cache = args.cache or tempfile.mkdtemp(prefix="jax_cache_")
    rows = []
    for label in ("first process (empty cache)", "second process (warm cache)"):
        cmd = [sys.executable, __file__, "--child", "--cache", cache, "--n", str(args.n), "--d", str(args.d),
               "--s", str(args.s), "--num-samples", str(args.num_samples), "--kernel", args.kernel]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        res = json.loads(out.strip().splitlines()[-1])
        rows.append((label, res))
    print(f"{args.kernel}: N = {args.n:,}, D = {args.d}, S = {args.s:,}; cache {cache}")
    print("| process | trace | lower | compile | XLA compile events | wall | data passes | their time (a hand-written "
          "pass × passes) | wall / (1.5 × their time + 1 s) | mean of w[:3] |\n|---|---|---|---|---|---|---|---|---|---|")
    for label, r in rows:
        their = r["passes"] * r["pass_s"]
        print(f"| {label} | {r['trace']:.2f} | {r['lower']:.2f} | {r['compile']:.2f} | {r['programs']} | "
              f"{r['wall']:.1f} | {r['passes']:.1f} | {their:.2f} ({r['pass_s']:.3f} s a pass) | "
              f"{r['wall'] / (1.5 * their + 1.0):.2f} | {r['mean_w']} |")


if __name__ == "__main__":
    main()
