"""Sampling-phase cost of the kernels' SG step against a hand-written ``lax.scan`` loop.

What is measured
----------------
Seconds per data pass of the *sampling phase* (warmup done, frozen dynamics) on Bayesian logistic
regression (N data, D features, float32, simulated with a fixed seed), for each kernel, minibatch
size S, dimension D and number of vectorized chains, and the ratio

    hand-written seconds per pass / kernel seconds per pass      (≥ 0.9 is the target of issue 12)

* kernel: ``MCMC(kernel, num_samples=K/steps_per_sample, progress_bar=False)`` continued from the
  state after warmup (``mcmc.post_warmup_state = mcmc.last_state``), ``steps_per_sample=10``.
  NumPyro 0.22 recompiles its sampling loop on every ``MCMC.run`` (the transform it passes to
  ``fori_collect`` is a fresh closure each run); the seconds JAX reports for tracing, lowering and
  compiling (``jax.monitoring`` events ``/jax/core/compile/*``) are subtracted and reported apart.
* hand-written: ``jax.jit`` of a ``lax.scan`` over the same K steps with the *same frozen
  quantities read from the kernel's state* (preconditioner, friction, step size, injected-noise
  factor), the same minibatch potential written by hand (prior N(0, I), Bernoulli-logit
  likelihood, N/S-scaled, with NumPyro's ``log_prob``: a hand ``logaddexp`` form measured 1.3×
  slower), ``jax.random.randint`` indices, ``vmap`` over the chains, returning
  every ``steps_per_sample``-th iterate (as MCMC collects them). SGFS's hand loop also keeps averaging the within-
  minibatch gradient covariance and refactorises every 10 steps (online Fisher), as SGFS does.
* Interleaved rounds (hand, kernel, hand, kernel, ...) in one process; medians over rounds.

Run
---
::

    python benchmarks/benchmark_step.py                     # the full grid (about 20 minutes on 2 cores)
    python benchmarks/benchmark_step.py --quick             # S = 1000, D = 10, 1 chain, 3 kernels

Figures go to stdout and to ``--out`` (JSON, default ``examples/output/benchmark_step.json``).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from benchmark_throughput import CompileClock, make_model, simulate  # the same problem and clock (benchmarks/)
from jax import lax, random
from jax.scipy.linalg import cho_solve
from numpyro.infer import MCMC

from numpyro_sgd import EWSG, SGFS, SGHMC, SGLD, ConstantSGD

SPS = 10
DEFAULT_OUT = Path(__file__).resolve().parent / "output" / "benchmark_step.json"


KERNELS = {
    "ConstantSGD-scalar": lambda m: ConstantSGD(m, preconditioner="scalar", steps_per_sample=SPS),
    "ConstantSGD-diag": lambda m: ConstantSGD(m, preconditioner="diag", steps_per_sample=SPS),
    "ConstantSGD-full": lambda m: ConstantSGD(m, preconditioner="full", steps_per_sample=SPS),
    "SGFS-full": lambda m: SGFS(m, preconditioner="full", steps_per_sample=SPS),
    "SGLD": lambda m: SGLD(m, step_size=1e-5, steps_per_sample=SPS),
    "SGHMC": lambda m: SGHMC(m, step_size=2e-3, friction=50.0, steps_per_sample=SPS),
    "EWSG": lambda m: EWSG(m, step_size=2e-3, friction=50.0, num_index_steps=1, steps_per_sample=SPS),
}


# --------------------------------------------------------------------------- hand-written loops
def hand_loop(kind, ks, n, s, num_steps):
    """jit(vmap over chains of a scan of ``num_steps`` steps) for ``kind``, frozen values from ``ks``."""

    def potential(w, xb, yb, scale):  # the model's minibatch potential, with NumPyro's log densities
        prior = dist.Normal(0.0, 1.0).log_prob(w).sum()
        return -prior - scale * jnp.sum(dist.Bernoulli(logits=xb @ w).log_prob(yb))

    grad_u = jax.value_and_grad(potential)

    def minibatch(key, w, X, y):
        idx = random.randint(key, (s,), 0, n)
        return grad_u(w, X[idx], y[idx], n / s)

    if kind.startswith("ConstantSGD"):
        def step(carry, key, X, y, frozen):
            w, _ = carry
            _, g = minibatch(key, w, X, y)
            p = frozen.preconditioner
            w = w - (p @ g if p.ndim == 2 else p * g)
            return (w, _), w
        init = lambda w, k: (w, jnp.zeros(()))  # noqa: E731
    elif kind == "SGLD":
        def step(carry, key, X, y, frozen):
            w, _ = carry
            k_idx, k_noise = random.split(key)
            _, g = minibatch(k_idx, w, X, y)
            eps = frozen.step_size
            w = w - 0.5 * eps * g + jnp.sqrt(eps) * random.normal(k_noise, w.shape, w.dtype)
            return (w, _), w
        init = lambda w, k: (w, jnp.zeros(()))  # noqa: E731
    elif kind in ("SGHMC", "EWSG"):
        m_steps = 1 if kind == "EWSG" else 0

        def step(carry, key, X, y, frozen):
            w, r = carry
            k_idx, k_noise = random.split(key)
            h, gamma = frozen.step_size, frozen.friction
            _, g = minibatch(k_idx, w, X, y)
            if m_steps:  # one Metropolis step over minibatches, weights exp(½‖x + √h/σ ∇Û_B‖²)
                sigma = jnp.sqrt(2.0 * gamma)
                x = jnp.sqrt(h) * gamma * r / sigma
                k_prop, k_acc = random.split(random.fold_in(key, 7))
                _, g2 = minibatch(k_prop, w, X, y)
                lw = lambda gg: 0.5 * jnp.sum((x + jnp.sqrt(h) / sigma * gg) ** 2)  # noqa: E731
                accept = jnp.log(random.uniform(k_acc)) < lw(g2) - lw(g)
                g = jnp.where(accept, g2, g)
            w_new = w + h * r
            r = r - h * (g + gamma * r) + jnp.sqrt(2.0 * gamma * h) * random.normal(k_noise, r.shape, r.dtype)
            return (w_new, r), w_new
        init = lambda w, r: (w, r)  # noqa: E731
    elif kind == "SGFS-full":
        per_example = jax.vmap(jax.grad(potential), (None, 0, 0, None))

        def step(carry, key, X, y, frozen):
            w, (t, q_mean, chol) = carry
            idx = random.randint(random.split(key)[0], (s,), 0, n)
            g_rows = per_example(w, X[idx][:, None, :], y[idx][:, None], float(n))
            g = jnp.mean(g_rows, 0)
            dev = g_rows - g
            q_mean = q_mean + (dev.T @ dev / (s - 1) - q_mean) / (t + 1)
            chol = lax.cond(t % 10 == 0, lambda: jnp.linalg.cholesky(frozen.ratio * q_mean / s
                                                                        + frozen.prior_curvature),
                            lambda: chol)
            xi = jnp.sqrt(frozen.injected) * random.normal(random.split(key)[1], w.shape, w.dtype)
            w = w - 2.0 * cho_solve((chol, True), g + xi)
            return (w, (t + 1, q_mean, chol)), w
        init = lambda w, f: (w, (jnp.zeros((), jnp.int32), f[0], f[1]))  # noqa: E731
    else:
        raise ValueError(kind)

    @jax.jit
    def run(key, carry, X, y, frozen):
        def chain(key, carry, frozen):
            # blocks of SPS steps, the last iterate of each block kept (what MCMC collects)
            def block(c, keys):
                c, _ = lax.scan(lambda c, k: step(c, k, X, y, frozen), c, keys)
                return c, c[0]

            keys = random.split(key, num_steps).reshape(num_steps // SPS, SPS)
            return lax.scan(block, carry, keys)

        chains = jax.tree.leaves(carry)[0].shape[0]
        if chains == 1:  # as the kernel: no vmap for one chain
            one = jax.tree.map(lambda x: x[0], (carry, frozen))
            return jax.tree.map(lambda x: x[None], chain(key, *one))
        return jax.vmap(chain)(random.split(key, chains), carry, frozen)

    return run, init


def hand_carry(kind, state, s):
    w = state.z["w"]
    ks = state.kernel_state
    if kind in ("SGHMC", "EWSG"):
        return (w, ks.momentum)
    if kind == "SGFS-full":
        # the running mean of the within-minibatch covariance Cov_n = S Q, from the frozen Q
        return (w, (jnp.zeros(w.shape[:1], jnp.int32), ks.noise_cov * s, ks.factor))
    return (w, jnp.zeros(w.shape[:1]))


# --------------------------------------------------------------------------- one cell
def cell(kind, n, d, s, chains, repeats, clock, X, y):
    model = make_model(d, s)
    steps = int(min(max(50 * n // s, 2000), 20_000)) // SPS * SPS  # runs of ≈ 0.3-1 s: MCMC.run's fixed cost is small
    passes = steps * s / n
    warmup = max(600 // SPS, 20)
    mcmc = MCMC(KERNELS[kind](model), num_warmup=warmup, num_samples=steps // SPS, num_chains=chains,
                chain_method="vectorized", progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(random.key(1), X, y)
    jax.block_until_ready(mcmc.last_state)
    last = mcmc.last_state
    if chains == 1:  # NumPyro gives one chain no chain axis; the hand loop always vmaps over chains
        last = jax.tree.map(lambda x: x[None], last)
    frozen = last.kernel_state
    run, _ = hand_loop(kind, frozen, n, s, steps)
    carry = hand_carry(kind, last, s)
    jax.block_until_ready(run(random.key(2), carry, X, y, frozen))  # compile
    hand_t, kern_t, comp_t = [], [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(run(random.key(3 + r), carry, X, y, frozen))
        hand_t.append((time.perf_counter() - t0) / passes)
        mcmc.post_warmup_state = mcmc.last_state
        c0 = clock.seconds
        t0 = time.perf_counter()
        mcmc.run(mcmc.post_warmup_state.rng_key, X, y)
        jax.block_until_ready((mcmc.last_state, mcmc.get_samples()))
        wall = time.perf_counter() - t0
        comp = clock.seconds - c0
        kern_t.append((wall - comp) / passes)
        comp_t.append(comp)
    assert int(jnp.sum(mcmc.last_state.num_divergences)) == 0, kind
    h, k = statistics.median(hand_t), statistics.median(kern_t)
    return {"kernel": kind, "N": n, "D": d, "S": s, "chains": chains, "steps": steps, "hand_s_per_pass": h,
            "kernel_s_per_pass": k, "ratio": h / k, "compile_s": statistics.median(comp_t)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--kernels", nargs="*", default=list(KERNELS))
    p.add_argument("--dims", nargs="*", type=int, default=[10, 50])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    clock = CompileClock()
    if args.quick:
        grid = list(itertools.product(["ConstantSGD-full", "SGLD", "SGHMC"], [10], [1000], [1]))
    else:
        grid = list(itertools.product(args.kernels, args.dims, [100, 1000, 10_000], [1, 4]))
    print(f"N={args.n} jax {jax.__version__} numpyro {numpyro.__version__} {jax.devices()[0].platform}; "
          f"steps_per_sample={SPS}; medians of {args.repeats} interleaved rounds", flush=True)
    print(f"{'kernel':20s} {'D':>3s} {'S':>6s} {'ch':>3s} {'hand s/pass':>12s} {'kernel s/pass':>14s} "
          f"{'ratio':>6s} {'compile s':>9s}", flush=True)
    data = {}
    rows = []
    for kind, d, s, chains in grid:
        if d not in data:
            data[d] = simulate(args.n, d)
        row = cell(kind, args.n, d, s, chains, args.repeats, clock, *data[d])
        # every MCMC.run recompiles (NumPyro 0.22) and each XLA:CPU executable keeps its memory
        # mappings: release them, or the process passes vm.max_map_count and LLVM fails
        jax.clear_caches()
        gc.collect()
        rows.append(row)
        print(f"{kind:20s} {d:3d} {s:6d} {chains:3d} {row['hand_s_per_pass']:12.5f} {row['kernel_s_per_pass']:14.5f} "
              f"{row['ratio']:6.2f} {row['compile_s']:9.2f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    print(f"ratio hand/kernel: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}, "
          f"cells below 0.9: {sum(r < 0.9 for r in ratios)} of {len(ratios)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
