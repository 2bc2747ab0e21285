"""Throughput of the SG-MCMC kernels against a hand-written pure-JAX SGLD loop.

What is measured
----------------
Stochastic-gradient steps per second (SG steps / wall seconds) on Bayesian logistic
regression (N = 100,000 data, D = 50, minibatch S = 100, float32, simulated with a fixed
seed), for

* ``baseline``: SGLD written by hand in pure JAX, ``jax.jit`` of a ``lax.scan`` over K steps;
  each step draws S indices with ``jax.random.randint``, takes ``jax.grad`` of the minibatch
  potential U = ½‖w‖² − (N/S) Σ log Bernoulli(y | sigmoid(x·w)) and does
  w ← w − (ε/2)∇U + √ε ξ; the scan returns the K samples, as MCMC collects them;
* ``SGLD``: ``MCMC(SGLD(model, step_size=1e-5), num_warmup=0, num_samples=K, progress_bar=False)``;
* ``ConstantSGD-diag``: ``ConstantSGD(model, preconditioner="diag", steps_per_sample=1)``, sampling phase only (200
  warmup steps in the first, untimed run; the timed runs continue from ``post_warmup_state``);
* ``ConstantSGD-diag sps=10 +pbar``: the same with ``steps_per_sample=10`` and
  ``progress_bar=True``, K/10 returned samples, so the same K SG steps.

and the ratio of each kernel's median throughput to the baseline's median, printed beside a
target (SGLD ≥ 0.9×, ConstantSGD-diag ≥ 0.7×, sps=10 with progress bar ≥ 0.8×).

How
---
* Everything runs in one process. Each configuration is run once untimed (compilation,
  warmup), then ``--repeats`` rounds time baseline, SGLD, ConstantSGD-diag and
  ConstantSGD-diag sps=10 one after the other (interleaved, so that a change of machine load
  hits every configuration alike); medians over the rounds are reported. Each timed MCMC run
  continues the chain: ``mcmc.post_warmup_state = mcmc.last_state`` then
  ``mcmc.run(mcmc.post_warmup_state.rng_key, X, y)``; timings end with ``block_until_ready``
  on the samples and the last state.
* Compilation is excluded. The baseline and the progress-bar path of NumPyro (a Python loop
  over one jitted, cached step function) compile only in their untimed first run. The
  ``progress_bar=False`` path of NumPyro 0.22 does *not* reuse its compiled loop across
  ``MCMC.run`` calls, even with identical arguments: ``fori_collect`` passes a freshly
  ``jax.jit``-wrapped body as a *static* argument of the jitted loop, jit wrappers hash by
  identity, so every run re-lowers and recompiles the whole loop (3-5 s here, against about
  1 s of sampling; see pyro-ppl/numpyro#2171 upstream). ``jit_model_args=True`` does not avoid
  it (it only shrinks the program by passing X, y as arguments instead of constants). So each
  timed run records the time JAX itself reports for tracing, lowering and backend compilation
  (``jax.monitoring`` events ``/jax/core/compile/*``) and subtracts it from the run's wall
  time; what remains is sampling plus the per-run Python work of ``MCMC.run`` (about 15 ms,
  measured with K=10). The wall time including the recompilation is reported too
  (``with compile``).
* ``jit_model_args=False`` (NumPyro's default) is used unless ``--jit-model-args`` is given.
  With ``jit_model_args=True`` *and* the progress bar, NumPyro passes X, y through the output
  of its jitted per-sample step, which copies them (20 MB here) on every returned sample and
  makes the ``+pbar`` configuration about 10x slower; the compiled-loop configurations are
  unaffected.
* The progress bar is written to stderr. NumPyro silently disables it when the environment
  variable ``CI`` (or ``PYTEST_XDIST_WORKER``) is set; the script then warns, since the
  ``+pbar`` configuration would measure the compiled loop instead.

Run
---
::

    python benchmarks/benchmark_throughput.py                 # defaults: K=20000, 5 repeats
    python benchmarks/benchmark_throughput.py --num-steps 5000 --repeats 3 --out /tmp/bench.json

The figures are also written as JSON to ``--out`` (default
``examples/output/benchmark_throughput.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax import lax, monitoring, random
from numpyro.infer import MCMC

from numpyro_sgd import SGLD, ConstantSGD

SGLD_STEP_SIZE = 1e-5
CSGD_WARMUP_STEPS = 200
SPS = 10
TARGETS = {"SGLD": 0.9, "ConstantSGD-diag": 0.7, f"ConstantSGD-diag sps={SPS} +pbar": 0.8}
DEFAULT_OUT = Path(__file__).resolve().parent / "output" / "benchmark_throughput.json"


# --------------------------------------------------------------------------- compile clock
class CompileClock:
    """Sums the seconds JAX reports for tracing, lowering and compiling (jax.monitoring)."""

    PREFIX = "/jax/core/compile/"

    def __init__(self):
        self.seconds = 0.0
        self.events = 0
        monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **_):
        if event.startswith(self.PREFIX):
            self.seconds += duration
            self.events += 1

    def reading(self):
        return self.seconds, self.events


# --------------------------------------------------------------------------- problem
def simulate(n, d, seed=0):
    k_x, k_w, k_y = random.split(random.key(seed), 3)
    X = random.normal(k_x, (n, d), jnp.float32) / jnp.sqrt(jnp.float32(d))
    w_true = random.normal(k_w, (d,), jnp.float32)
    y = random.bernoulli(k_y, jax.nn.sigmoid(X @ w_true)).astype(jnp.float32)
    return X, y


def make_model(d, s):
    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=s) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])

    return model


def make_baseline(num_steps, s, step_size):
    """Hand-written SGLD: jit(scan) over ``num_steps`` steps, returning every sample."""

    def minibatch_potential(w, xb, yb, n):
        logits = xb @ w
        log_lik = yb * logits - jnp.logaddexp(0.0, logits)
        return 0.5 * jnp.dot(w, w) - (n / s) * jnp.sum(log_lik)

    grad_u = jax.grad(minibatch_potential)

    @jax.jit
    def run(rng_key, w0, X, y):
        n = X.shape[0]

        def step(w, key):
            k_idx, k_noise = random.split(key)
            idx = random.randint(k_idx, (s,), 0, n)
            g = grad_u(w, X[idx], y[idx], n)
            w = w - 0.5 * step_size * g + jnp.sqrt(step_size) * random.normal(k_noise, w.shape, w.dtype)
            return w, w

        return lax.scan(step, w0, random.split(rng_key, num_steps))

    return run


# --------------------------------------------------------------------------- runners
class Baseline:
    def __init__(self, num_steps, s, X, y):
        self.fn = make_baseline(num_steps, s, SGLD_STEP_SIZE)
        self.X, self.y = X, y
        self.w = jnp.zeros(X.shape[1], X.dtype)
        self.key = random.key(1)

    def __call__(self):
        self.key, key = random.split(self.key)
        self.w, samples = jax.block_until_ready(self.fn(key, self.w, self.X, self.y))
        return samples


class MCMCRunner:
    """Runs an MCMC object; after the first run every call continues from the last state."""

    def __init__(self, mcmc, X, y, seed):
        self.mcmc, self.X, self.y, self.seed = mcmc, X, y, seed
        self.started = False

    def __call__(self):
        mcmc = self.mcmc
        if not self.started:
            mcmc.run(random.key(self.seed), self.X, self.y)
            self.started = True
        else:
            mcmc.post_warmup_state = mcmc.last_state
            mcmc.run(mcmc.post_warmup_state.rng_key, self.X, self.y)
        return jax.block_until_ready((mcmc.get_samples(), mcmc.last_state))


def timed(fn, clock):
    c0, e0 = clock.reading()
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    c1, e1 = clock.reading()
    return out, wall, c1 - c0, e1 - e0


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-steps", type=int, default=20000, help="K, SG steps per timed run (default 20000)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timed rounds (default 5)")
    p.add_argument("--n", type=int, default=100_000, help="number of data N (default 100000)")
    p.add_argument("--d", type=int, default=50, help="dimension D (default 50)")
    p.add_argument("--s", type=int, default=100, help="minibatch size S (default 100)")
    p.add_argument("--jit-model-args", action="store_true",
                   help="MCMC(jit_model_args=True): X, y are arguments of the compiled loop, not constants")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    args = p.parse_args(argv)
    if args.num_steps < SPS or args.repeats < 1:
        p.error(f"need --num-steps >= {SPS} and --repeats >= 1")
    if args.num_steps % SPS:
        p.error(f"--num-steps must be a multiple of {SPS} (steps_per_sample of the last configuration)")
    if not 1 <= args.s <= args.n:
        p.error("need 1 <= --s <= --n")
    return args


def main(argv=None):
    args = parse_args(argv)
    K = args.num_steps
    if "CI" in os.environ or "PYTEST_XDIST_WORKER" in os.environ:
        print("warning: CI (or PYTEST_XDIST_WORKER) is set, so NumPyro disables the progress bar: the "
              f"'sps={SPS} +pbar' configuration measures the compiled loop instead.", file=sys.stderr)
    clock = CompileClock()
    X, y = simulate(args.n, args.d)
    model = make_model(args.d, args.s)
    common = dict(jit_model_args=args.jit_model_args)

    sgld = MCMC(SGLD(model, step_size=SGLD_STEP_SIZE), num_warmup=0, num_samples=K,
                progress_bar=False, **common)
    csgd = MCMC(ConstantSGD(model, preconditioner="diag", steps_per_sample=1), num_warmup=CSGD_WARMUP_STEPS,
                num_samples=K,
                progress_bar=False, **common)
    csgd_sps = MCMC(ConstantSGD(model, preconditioner="diag", steps_per_sample=SPS),
                    num_warmup=CSGD_WARMUP_STEPS // SPS,
                    num_samples=K // SPS, progress_bar=True, **common)
    configs = {
        "baseline": Baseline(K, args.s, X, y),
        "SGLD": MCMCRunner(sgld, X, y, seed=2),
        "ConstantSGD-diag": MCMCRunner(csgd, X, y, seed=3),
        f"ConstantSGD-diag sps={SPS} +pbar": MCMCRunner(csgd_sps, X, y, seed=4),
    }

    load_start = os.getloadavg()
    print(f"N={args.n} D={args.d} S={args.s} K={K} repeats={args.repeats} jit_model_args={args.jit_model_args} "
          f"jax {jax.__version__} numpyro {numpyro.__version__} on {jax.devices()[0].platform}, "
          f"{os.cpu_count()} CPUs, load average {load_start[0]:.2f}", flush=True)
    records = {name: {"wall_s": [], "compile_s": [], "compile_events": []} for name in configs}
    t_start = time.perf_counter()
    # untimed first run: compilation (and, for ConstantSGD, the warmup)
    for name, fn in configs.items():
        _, wall, comp, _ = timed(fn, clock)
        records[name]["first_run_s"] = wall
        records[name]["first_run_compile_s"] = comp
    for _ in range(args.repeats):
        for name, fn in configs.items():
            _, wall, comp, events = timed(fn, clock)
            rec = records[name]
            rec["wall_s"].append(wall)
            rec["compile_s"].append(comp)
            rec["compile_events"].append(events)

    base_rate = None
    for name, rec in records.items():
        rec["steps_per_s"] = [K / max(w - c, 1e-9) for w, c in zip(rec["wall_s"], rec["compile_s"], strict=True)]
        rec["steps_per_s_with_compile"] = [K / w for w in rec["wall_s"]]
        rec["median_steps_per_s"] = statistics.median(rec["steps_per_s"])
        rec["median_steps_per_s_with_compile"] = statistics.median(rec["steps_per_s_with_compile"])
        if base_rate is None:
            base_rate = rec["median_steps_per_s"]
            base_rates = rec["steps_per_s"]
        else:
            rec["ratio"] = rec["median_steps_per_s"] / base_rate
            rec["ratio_with_compile"] = rec["median_steps_per_s_with_compile"] / base_rate
            # paired per round (same load): a check on the ratio of medians
            paired = [a / b for a, b in zip(rec["steps_per_s"], base_rates, strict=True)]
            rec["median_paired_ratio"] = statistics.median(paired)
            rec["target"] = TARGETS[name]
            rec["meets_target"] = rec["ratio"] >= rec["target"]

    header = (f"{'configuration':34s} {'steps/s':>9s} {'ratio':>6s} {'target':>7s} {'ok':>3s}   "
              f"{'with compile':>12s} {'ratio':>6s} {'compile s':>9s}")
    lines = [header, "-" * len(header)]
    for name, rec in records.items():
        comp = statistics.median(rec["compile_s"])
        if "ratio" in rec:
            target = f"≥{rec['target']:.1f}x"
            cols = f"{rec['ratio']:5.2f}x {target:>7s} {'yes' if rec['meets_target'] else 'NO':>3s}"
            wc = f"{rec['median_steps_per_s_with_compile']:12.0f} {rec['ratio_with_compile']:5.2f}x"
        else:
            cols = f"{'1.00x':>6s} {'':>7s} {'':>3s}"
            wc = f"{rec['median_steps_per_s_with_compile']:12.0f} {'1.00x':>6s}"
        lines.append(f"{name:34s} {rec['median_steps_per_s']:9.0f} {cols}   {wc} {comp:9.2f}")
    total = time.perf_counter() - t_start
    lines.append(f"medians over {args.repeats} interleaved rounds of K={K} SG steps; compile time (JAX-reported, "
                 f"median per timed run) subtracted in 'steps/s'; total {total:.0f} s; "
                 f"load average {os.getloadavg()[0]:.2f}")
    print("\n" + "\n".join(lines))

    result = {
        "problem": {"n": args.n, "d": args.d, "s": args.s, "dtype": "float32", "num_steps": K,
                    "repeats": args.repeats, "sgld_step_size": SGLD_STEP_SIZE,
                    "constant_sgd_warmup_steps": CSGD_WARMUP_STEPS, "steps_per_sample": SPS,
                    "jit_model_args": args.jit_model_args},
        "environment": {"jax": jax.__version__, "numpyro": numpyro.__version__, "python": platform.python_version(),
                        "platform": jax.devices()[0].platform, "cpu_count": os.cpu_count(),
                        "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "ci_env": "CI" in os.environ},
        "total_s": total,
        "configurations": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=float))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
