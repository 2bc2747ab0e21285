"""XLA's floor for the control-variate kernel: SGLD with control variates written by hand for one
model (the logistic regression of ``anchors.py``, prior w ~ N(0, I)), as two jitted programs, timed
beside ``SGLD(model, control_variates=True)`` in the same process.

The hand-written algorithm is the package's, without its generality (no model tracing, no checks,
no noise estimates, one fixed step):

* warmup: 500 Adam steps (rate 0.01) from 0 on minibatches of S rows, both chains (``lax.scan``);
* centre: Newton steps from the warmup's end, ∇U over all rows (``lax.map`` over blocks of
  16,000 rows), the Hessian on 4,096 fixed rows, until λ² ≤ 0.01 (``lax.while_loop``); the Hessian
  at the centre on 65,536 fixed rows, its Cholesky factor L;
* sampling: 1,000 steps of θ ← θ − (1 − e^{−1}) H⁻¹ ĝ + √(1 − e^{−2}) L⁻ᵀ ξ, ĝ the control-variate
  gradient ∇U(θ̂) + (θ − θ̂) + (N/S) Σ_B [∇u_i(θ) − ∇u_i(θ̂)] (the prior's part exact), 2 chains
  (``vmap``), one step per draw.

Both routes are checked against the float64 Laplace posterior (``benchmark_scaling.laplace``).
Reported per route: trace + lower + compile seconds (``jax.monitoring``), the rest of the wall, the
end-to-end wall, min bulk ESS, the largest mean error in posterior sds and sd error.

    python benchmarks/cv_scan_baseline.py --n 1000000 --d 50
    # warm: the same command twice, in two processes sharing a persistent compile cache
    python benchmarks/cv_scan_baseline.py --n 1000000 --routes hand-written --cache-dir /tmp/hw_cache
    # what NumPyro's MCMC adds: the hand-written programs as a minimal MCMCKernel
    python benchmarks/cv_scan_baseline.py --n 1000000 --routes hand-written-mcmc --cache-dir /tmp/hwm_cache

The route ``hand-written-mcmc`` (not run by default) is the same algorithm behind ``MCMC.run``
(:class:`HandWrittenKernel`): the floor of any kernel run the way users run ours.
"""

from __future__ import annotations

import argparse
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from benchmark_scaling import laplace, make_model, simulate
from benchmark_throughput import CompileClock
from jax import lax, random
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC
from numpyro.infer.mcmc import MCMCKernel

from numpyro_sgd import SGLD

BLOCK, NEWTON_ROWS, CURVATURE_ROWS, TOLERANCE = 16_000, 4_096, 65_536, 0.01


def hand_written_programs(n, d, s, num_warmup=500):
    """The hand-written algorithm of the module docstring for N = ``n`` rows of D = ``d``:
    ``warmup_and_centre(key, X, y) -> (centre, ∇U(centre), L)``, jitted, and ``step(theta, key,
    centre, grad, chol, X, y) -> theta``, one sampling step. The data are arguments (never XLA
    constants)."""
    usable = (n // BLOCK) * BLOCK

    def lik_grad_rows(w, x, t):  # Σ over the rows of ∇(−log p(y | x, w))
        return x.T @ (jax.nn.sigmoid(x @ w) - t)

    def full_grad(w, X, y):
        xb, yb = X[:usable].reshape(-1, BLOCK, d), y[:usable].reshape(-1, BLOCK)
        total = jnp.sum(lax.map(lambda xy: lik_grad_rows(w, *xy), (xb, yb)), axis=0)
        return total + lik_grad_rows(w, X[usable:], y[usable:]) + w

    def hessian(w, rows, X):
        x = X[:rows]
        p = jax.nn.sigmoid(x @ w)
        return (n / rows) * (x.T * (p * (1 - p))) @ x + jnp.eye(d)

    @jax.jit
    def warmup_and_centre(key, X, y):
        opt = optax.adam(0.01)

        def adam_step(carry, k):
            w, state = carry
            idx = random.randint(k, (s,), 0, n)
            g = (n / s) * lik_grad_rows(w, X[idx], y[idx]) + w
            updates, state = opt.update(g, state)
            return (optax.apply_updates(w, updates), state), None

        w0 = jnp.zeros(d, X.dtype)
        (w, _), _ = lax.scan(adam_step, (w0, opt.init(w0)), random.split(key, num_warmup))

        def newton(carry):
            i, w, g, _ = carry
            step = jnp.linalg.solve(hessian(w, NEWTON_ROWS, X), g)
            w = w - step
            g = full_grad(w, X, y)
            return i + 1, w, g, g @ jnp.linalg.solve(hessian(w, NEWTON_ROWS, X), g)

        g = full_grad(w, X, y)
        _, centre, grad, _ = lax.while_loop(lambda c: (c[0] < 20) & (c[3] > TOLERANCE), newton,
                                            (0, w, g, jnp.asarray(jnp.inf, X.dtype)))
        return centre, grad, jnp.linalg.cholesky(hessian(centre, CURVATURE_ROWS, X))

    def step(theta, k, centre, grad, chol, X, y):
        decay = jnp.exp(-1.0)
        k_b, k_n = random.split(k)
        idx = random.randint(k_b, (s,), 0, n)
        x, t = X[idx], y[idx]
        g = grad + (theta - centre) + (n / s) * (lik_grad_rows(theta, x, t) - lik_grad_rows(centre, x, t))
        drift = jax.scipy.linalg.cho_solve((chol, True), g)
        noise = jax.scipy.linalg.solve_triangular(chol.T, random.normal(k_n, (d,), X.dtype), lower=False)
        return theta - (1 - decay) * drift + jnp.sqrt(1 - decay**2) * noise

    return warmup_and_centre, step


def hand_written(X, y, s, key, num_warmup=500, num_samples=1_000, chains=2):
    """The algorithm of the module docstring as two jitted programs; returns the draws
    (chains, num_samples, D)."""
    warmup_and_centre, step = hand_written_programs(*X.shape, s, num_warmup)

    @jax.jit
    def sample(key, centre, grad, chol, X, y):
        def chain(k):
            def one(theta, k):
                theta = step(theta, k, centre, grad, chol, X, y)
                return theta, theta
            return lax.scan(one, centre, random.split(k, num_samples))[1]

        return jax.vmap(chain)(random.split(key, chains))

    k_w, k_s = random.split(key)
    centre, grad, chol = warmup_and_centre(k_w, X, y)
    return np.asarray(sample(k_s, centre, grad, chol, X, y))


class HandWrittenState(NamedTuple):
    z: jax.Array
    key: jax.Array
    centre: jax.Array
    grad: jax.Array
    chol: jax.Array


class HandWrittenKernel(MCMCKernel):
    """The hand-written algorithm behind NumPyro's ``MCMC`` (the ``hand-written-mcmc`` route):
    ``init`` runs the jitted warmup and centre once (from the first chain's key; every chain
    starts at the centre), ``sample`` is one step. What it adds to the hand-written route is what
    ``MCMC.run`` itself costs a process: NumPyro traces, lowers and compiles (or loads) its
    collection loop and runs its eager bookkeeping."""

    sample_field = "z"

    def __init__(self, n, d, s):
        self._warmup_and_centre, self._step = hand_written_programs(n, d, s)

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        X, y = model_args
        keys = rng_key if rng_key.ndim else rng_key[None]
        centre, grad, chol = self._warmup_and_centre(keys[0], X, y)
        chains = keys.shape[0]

        def tile(x):
            return jnp.broadcast_to(x, (chains,) + x.shape)

        state = HandWrittenState(tile(centre), keys, tile(centre), tile(grad), tile(chol))
        return state if rng_key.ndim else jax.tree.map(lambda x: x[0], state)

    def sample(self, state, model_args, model_kwargs):
        X, y = model_args

        def one(state):
            key, k = random.split(state.key)
            return state._replace(z=self._step(state.z, k, state.centre, state.grad, state.chol, X, y), key=key)

        return jax.vmap(one)(state) if state.key.ndim else one(state)  # vectorized chains: NumPyro batches the state


def hand_written_mcmc(X, y, s, key):
    mcmc = MCMC(HandWrittenKernel(*X.shape, s), num_warmup=0, num_samples=1_000, num_chains=2,
                chain_method="vectorized", jit_model_args=True, progress_bar=False)
    mcmc.run(key, X, y)
    return np.asarray(mcmc.get_samples(group_by_chain=True))


def package(X, y, s, key):
    mcmc = MCMC(SGLD(make_model("logistic"), control_variates=True), num_warmup=500, num_samples=1_000,
                num_chains=2, chain_method="vectorized", jit_model_args=True, progress_bar=False)
    mcmc.run(key, X, y, subsample_size=s)
    return np.asarray(mcmc.get_samples(group_by_chain=True)["w"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=50)
    ap.add_argument("--s", type=int, default=1_000)
    ap.add_argument("--routes", nargs="+", choices=("package", "hand-written", "hand-written-mcmc"),
                    default=["package", "hand-written"])
    ap.add_argument("--cache-dir", help="JAX's persistent compile cache here: run twice for the warm figure")
    args = ap.parse_args()
    if args.cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    Xn, yn, _ = simulate("logistic", args.n, args.d)
    mean, cov, _ = laplace("logistic", Xn, yn)
    sd = np.sqrt(np.diag(cov))
    X, y = jnp.asarray(Xn), jnp.asarray(yn)
    clock = CompileClock()
    print(f"logistic regression, N = {args.n:,}, D = {args.d}, S = {args.s:,}; 2 chains × (500 warmup + 1,000) steps")
    print("| route | trace + lower + compile s | rest s | wall s | min bulk ESS | max mean err (sd) | max sd err |")
    print("|---|---|---|---|---|---|---|")
    routes = {"package": ("SGLD(model, control_variates=True)", package),
              "hand-written": ("hand-written (lax.scan)", hand_written),
              "hand-written-mcmc": ("hand-written, through NumPyro's MCMC", hand_written_mcmc)}
    for name, fn in (routes[r] for r in args.routes):
        c0, t0 = clock.reading()[0], time.perf_counter()
        draws = jax.block_until_ready(fn(X, y, args.s, random.key(0)))
        wall, compile_s = time.perf_counter() - t0, clock.reading()[0] - c0
        flat = draws.reshape(-1, args.d)
        ess = float(np.min(effective_sample_size(draws.astype(np.float64))))
        err = float(np.max(np.abs(flat.mean(0) - mean) / sd))
        sd_err = float(np.max(np.abs(flat.std(0) / sd - 1)))
        print(f"| {name} | {compile_s:.1f} | {wall - compile_s:.1f} | {wall:.1f} | {ess:,.0f} | {err:.3f} | "
              f"{100 * sd_err:.1f} % |", flush=True)


if __name__ == "__main__":
    main()
