"""Cost of one data pass of random-row minibatches against one NumPy read of the data.

A hand-written jitted ``lax.scan`` of constant-SGD steps of a logistic regression (gather S
rows, gradient, update) makes one pass of N/S steps, with the minibatch indices from
``random.randint`` (threefry), from ``numpyro_sgd.minibatch.with_replacement.uniform_indices`` (the package's
counter-based hash), or as S/B clusters of B consecutive rows
(``numpyro_sgd.minibatch.with_replacement.cluster_indices``, ``--clusters B ...``); the baseline is NumPy's
``X.sum(0)`` of the same array in the same process. Medians of interleaved repeats::

    python benchmarks/index_draws.py --n 10000000 --d 50 --s 10000 --clusters 16 50 125 250
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random

from numpyro_sgd.minibatch.with_replacement import cluster_indices, uniform_indices


def data_pass(draw, n, s):
    @jax.jit
    def run(w, key, X, y):
        def step(w, k):
            idx = draw(k)
            xb, yb = X[idx], y[idx]
            return w - 1e-9 * (n / s) * xb.T @ (jax.nn.sigmoid(xb @ w) - yb), None

        return lax.scan(step, w, random.split(key, n // s))[0]

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--d", type=int, default=50)
    ap.add_argument("--s", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clusters", type=int, nargs="*", default=[], help="cluster sizes B (each must divide S)")
    args = ap.parse_args()
    n, d, s = args.n, args.d, args.s
    rng = np.random.default_rng(0)
    Xn = rng.standard_normal((n, d), dtype=np.float32)
    yn = (rng.random(n) < 0.5).astype(np.float32)
    X, y = jnp.asarray(Xn), jnp.asarray(yn)
    passes = {"random.randint (threefry)": data_pass(lambda k: random.randint(k, (s,), 0, n), n, s),
              "uniform_indices (hash)": data_pass(lambda k: uniform_indices(k, s, n), n, s)}
    for b in args.clusters:
        passes[f"cluster_indices B={b}"] = data_pass(lambda k, b=b: cluster_indices(k, s, n, b), n, s)
    w = jnp.zeros(d, jnp.float32)
    for run in passes.values():  # compile
        jax.block_until_ready(run(w, random.key(0), X, y))
    times = {name: [] for name in ["numpy X.sum(0)", *passes]}
    for r in range(args.repeats):
        t = time.perf_counter()
        Xn.sum(0)
        times["numpy X.sum(0)"].append(time.perf_counter() - t)
        for name, run in passes.items():
            t = time.perf_counter()
            jax.block_until_ready(run(w, random.key(r + 1), X, y))
            times[name].append(time.perf_counter() - t)
    base = np.median(times["numpy X.sum(0)"])
    print(f"N = {n:,}, D = {d}, S = {s:,}, float32, {jax.default_backend()}, jax {jax.__version__}")
    for name, v in times.items():
        print(f"{name:28s} {np.median(v):7.3f} s per pass  {np.median(v) / base:5.2f}x the NumPy read")


if __name__ == "__main__":
    main()
