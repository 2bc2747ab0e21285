"""What JAX's persistent compilation cache saves on a second process: the same ConstantSGD-full run
(``benchmarks/overhead.py``'s logistic regression, ``mcmc.run``) in two fresh Python processes that
share a cache directory, the first with it empty. Prints, per process, the trace, lower and compile
seconds JAX reports and the end-to-end wall.

    python benchmarks/persistent_cache.py --n 100000 --d 10 --s 1000

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


def child(args):
    import jax

    jax.config.update("jax_compilation_cache_dir", args.cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    from jax import random
    from numpyro.infer import MCMC

    sys.path.insert(0, os.path.dirname(__file__))
    from overhead import Clock, Counted, simulate

    from numpyro_sgd import ConstantSGD

    X, y = simulate(args.n, args.d)
    clock = Clock()
    t0 = time.perf_counter()
    mcmc = MCMC(ConstantSGD(Counted(args.d, args.s), preconditioner="full", subsample_size=args.s), num_warmup=100,
                num_samples=args.num_samples, num_chains=2, chain_method="vectorized", jit_model_args=True,
                progress_bar=False)
    mcmc.run(random.key(0), X, y)
    jax.block_until_ready(mcmc.get_samples())
    out = clock.read()
    out["wall"] = time.perf_counter() - t0
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--s", type=int, default=1_000)
    ap.add_argument("--num-samples", type=int, default=500)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    cache = args.cache or tempfile.mkdtemp(prefix="jax_cache_")
    rows = []
    for label in ("first process (empty cache)", "second process (warm cache)"):
        cmd = [sys.executable, __file__, "--child", "--cache", cache, "--n", str(args.n), "--d", str(args.d),
               "--s", str(args.s), "--num-samples", str(args.num_samples)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        res = json.loads(out.strip().splitlines()[-1])
        rows.append((label, res))
    print(f"N = {args.n:,}, D = {args.d}, S = {args.s:,}; cache {cache}")
    print("| process | trace | lower | compile | XLA compile events | wall |\n|---|---|---|---|---|---|")
    for label, r in rows:
        print(f"| {label} | {r['trace']:.2f} | {r['lower']:.2f} | {r['compile']:.2f} | {r['programs']} | "
              f"{r['wall']:.1f} |")


if __name__ == "__main__":
    main()
