"""Time to an accurate posterior from N = 10⁵ to 10⁷ rows: ConstantSGD, SGFS and IASG against NUTS.

What is measured
----------------
For simulated Bayesian GLMs (float32, fixed seeds) — logistic regression and Poisson regression
with a log link, N ∈ {10⁵, 10⁶, 10⁷} rows, D ∈ {10, 50} features, no intercept, prior
w ~ N(0, I); features x ~ N(0, I/D), true weights ~ N(0, 1) (logistic) or N(0, 0.5²) (Poisson, so
that the rates exp(x·w) stay O(1)) — how long a user waits for an accurate posterior with

* ``ConstantSGD(model, preconditioner="full", subsample_size=S, steps_per_sample=k)``,
* ``SGFS(model, preconditioner="full", subsample_size=S, steps_per_sample=k)``,
* ``IASG(model, preconditioner="full", subsample_size=S)`` (a sample is the mean of a window of
  ⌈N/S⌉ iterates, one data pass; the kernel fixes its steps per sample),

each with 2 chains, ``chain_method="vectorized"``, and NUTS (default settings, 2 chains,
``chain_method="sequential"``, 1,000 warmup + 1,000 samples) on the full-data model. Every run uses
``MCMC(..., jit_model_args=True, progress_bar=False)`` (the data are arguments of the compiled loop,
not constants folded into it). The model is the ordinary NumPyro pattern,
``numpyro.plate("data", N, subsample_size=S)`` with ``X[idx]``, ``y[idx]``; with
``subsample_size=None`` (NUTS) the same function uses ``X``, ``y`` directly, since ``X[arange(N)]``
is a full gather of the data per gradient (2.6× slower than ``X @ w`` at N = 10⁶, D = 50, measured
on the development machine) that no NUTS user would write.

Per run (one row of the table):

* wall seconds of ``mcmc.warmup(key, *args)`` and of ``mcmc.run(key, *args)`` (ending with
  ``block_until_ready`` on the draws and the state); the seconds JAX reports for tracing, lowering
  and compiling during each call (``CompileClock`` of ``benchmarks/benchmark_throughput.py``) are
  split out: *compile* = both calls' compile time, *warmup* / *sampling* = each call's wall minus
  its compile time, *total* = the sum of both walls (what the user waits). NumPyro 0.22 with
  ``progress_bar=False`` recompiles its loop on every ``run``/``warmup`` call, so both calls compile;
* data passes (per-datum gradients / N, **summed over the 2 chains**) in warmup and sampling:
  ``mcmc.last_state.data_passes`` for the SG kernels; for NUTS the number of leapfrog steps
  (``num_steps`` extra field, summed), each a full-data gradient, i.e. one pass;
* min bulk ESS over the D coordinates of w (ArviZ, both chains), ESS per second of *total*;
* max |mean − ref mean| / ref sd and max |sd / ref sd − 1| against the Laplace reference (below),
  via ``numpyro_sgd.diagnostics.compare.compare``; a run is *accurate* if they are ≤ 0.15 and ≤ 0.10;
* peak RSS: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (the process's peak so far; cells run
  in increasing N·D, so it is the peak of the largest cell so far) and the cell's own peak
  (``VmHWM`` of ``/proc/self/status`` after resetting it through ``/proc/self/clear_refs`` at the
  start of the cell; empty where the kernel refuses the reset).

For each method and S the *best* S of a cell is the one with the highest ESS/s among the accurate
runs (marked ``best``).

Rules (each with a CLI override)
--------------------------------
* ``steps_per_sample`` k = max(1, N // S // 10) (``--steps-per-sample``): a returned sample is
  p = k·S/N ≈ 0.1 data pass; IASG: p = ⌈N/S⌉·S/N ≈ 1.
* ``num_samples`` per chain = ⌈target / (0.5 · chains · p)⌉ (``--num-samples``, ``--target-ess``
  default 400, ``--ess-per-pass`` default 0.5): enough for min bulk ESS ≥ 400 if the kernel mixes at
  0.5 ESS per data pass (the full-preconditioner kernels measured 0.67–0.84 in the main job).
* ``num_warmup`` per chain = ⌈warmup passes / p⌉ returned samples (``--warmup-passes``, default 20,
  or ``--num-warmup``); the kernels' default warmup (Adam, then preconditioned SGD while the noise
  covariance is averaged; frozen at the end of warmup).
* NUTS: before the default run, a pilot (1 chain, 100 warmup + 100 samples, ``--nuts-pilot``)
  measures the seconds per full-data gradient and the leapfrog steps per iteration; the default run's
  gradients are estimated as chains × (pilot warmup gradients + (1,000 − 100) · s + 1,000 · s), s the
  pilot's steps per sampling iteration, and its time as that × seconds per gradient + the pilot's
  compile time. If that exceeds ``--nuts-max-minutes`` (default 20) the default run is not made: the
  row is marked *extrapolated* and its accuracy columns are empty; otherwise the default run is made.
* Time to target (min bulk ESS ≥ 400 with max mean error ≤ 0.15 sd and sd error ≤ 10 %): for an
  accurate run, compile + warmup + sampling × max(1, 400 / ESS) seconds — the sampling time is
  extrapolated linearly in ESS where the run fell short of 400 (marked ``*``); a run that is not
  accurate does not reach the target (the error it had is shown). Per method and N the smallest
  time over the S values is reported. Extrapolated NUTS: the estimated time of the default run,
  assuming (not measured) that it reaches ESS ≥ 400 and the accuracy, as the measured default runs
  at smaller N did (marked ``†``).

Reference posterior: Laplace at the full-data MAP
-------------------------------------------------
The MAP is found by Newton's method in float64 with NumPy, the gradient and Xᵀ W X accumulated over
row chunks cast to float64 (backtracking while the Newton decrement λ² = gᵀ H⁻¹ g ≥ 0.1, full steps
after), stopped at λ² < 1e-10; the reference is N(ŵ, H⁻¹), H the negative log posterior's Hessian at
ŵ. Why it is accurate enough: the log likelihood is a sum of N smooth terms, so in the coordinates
z = H^{1/2}(w − ŵ) the log posterior is −‖z‖²/2 + O(‖z‖³/√N) (its third derivatives are O(N)
against a curvature O(N)). By Bernstein–von Mises (with its Laplace/Edgeworth refinement) the
posterior mean differs from ŵ by O(1/√N) posterior sd and the posterior sd from the Laplace sd by
a relative O(1/N): at N = 10⁵, 1/√N ≈ 0.003 (times a constant growing with D), far below the 0.15 sd
and 10 % criteria, and smaller still at larger N. It is checked, not assumed: at N ≤ 10⁵
(``--nuts-check-max-n``) a long NUTS run (2 chains × 1,000 warmup + 2,000 samples on the full data)
is compared with the Laplace reference and the max mean difference (sd units) and max sd relative
difference are printed; their Monte Carlo floor at ESS ≈ 2,000–4,000 is about 0.02–0.05 (max over D).

Data, memory, caches
--------------------
The data are generated in chunks of rows with a NumPy ``Generator`` straight into float32 arrays
(N = 10⁷, D = 50 is 2 GB), the Laplace fit reads them in chunks, then they are handed to JAX and the
NumPy copy is dropped; peak RSS stays about ≤ 2× the data. Each cell's data are freed before the next
cell is generated, and ``jax.clear_caches(); gc.collect()`` runs between runs (long JAX processes
otherwise exhaust ``vm.max_map_count``).

Run
---
::

    python benchmarks/benchmark_scaling.py --quick              # N = 10⁵, D = 10, logistic, S = 1000: ~3 min
    python benchmarks/benchmark_scaling.py --n 100000 --d 10 50 --likelihood logistic poisson
    python benchmarks/benchmark_scaling.py --n 100000 1000000 10000000      # the full benchmark (hours)
    python benchmarks/benchmark_scaling.py --methods ConstantSGD-full NUTS --subsample-sizes 1000 IASG-full=1000,10000
    python benchmarks/benchmark_scaling.py --merge a.json b.json --doc docs/all.md --out all.json  # combine runs

Output: the tables on stdout, Markdown in ``--doc`` (default ``docs/results/benchmark_scaling.md``, with the
command line, machine, date and package versions), JSON in ``--out`` (default
``examples/output/benchmark_scaling.json``) and the time-to-target plot (log-log) next to ``--doc``
(``docs/results/benchmark_scaling.png``; skipped with a message if matplotlib is missing).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import resource
import shlex
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from benchmark_throughput import CompileClock, timed  # the same compile clock (benchmarks/)
from numpyro.infer import MCMC, NUTS

from numpyro_sgd import IASG, SGFS, ConstantSGD
from numpyro_sgd.diagnostics.compare import compare

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "output" / "benchmark_scaling.json"
DEFAULT_DOC = HERE.parent / "docs" / "results" / "benchmark_scaling.md"
LIKELIHOODS = ("logistic", "poisson")
WEIGHT_SD = {"logistic": 1.0, "poisson": 0.5}
SG_KERNELS = {"ConstantSGD-full": ConstantSGD, "SGFS-full": SGFS, "IASG-full": IASG}
METHODS = tuple(SG_KERNELS) + ("NUTS",)
DEFAULT_S = {name: (1000, 10000) for name in SG_KERNELS}
CHAINS = 2
MEAN_TOL, SD_TOL = 0.15, 0.10
CHUNK = 1 << 16


# --------------------------------------------------------------------------- problem
def make_model(likelihood):
    """One model for both: a subsample plate for the SG kernels, the full data for NUTS."""

    def model(X, y, subsample_size=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
            xb, yb = (X, y) if subsample_size is None else (X[idx], y[idx])
            eta = xb @ w
            law = dist.Bernoulli(logits=eta) if likelihood == "logistic" else dist.Poisson(jnp.exp(eta))
            numpyro.sample("y", law, obs=yb)

    return model


def simulate(likelihood, n, d, seed=0):
    """float32 X (n, d) ~ N(0, I/d) and y, generated in row chunks (no float64 copy of the data)."""
    k_w, k_data = np.random.SeedSequence([seed, n, d, LIKELIHOODS.index(likelihood)]).spawn(2)
    w_true = np.random.default_rng(k_w).normal(0.0, WEIGHT_SD[likelihood], d)
    rng = np.random.default_rng(k_data)
    X = np.empty((n, d), np.float32)
    y = np.empty(n, np.float32)
    scale = np.float32(1.0 / math.sqrt(d))
    for a in range(0, n, CHUNK):
        b = min(n, a + CHUNK)
        rng.standard_normal(out=X[a:b], dtype=np.float32)
        X[a:b] *= scale
        eta = X[a:b] @ w_true
        if likelihood == "logistic":
            y[a:b] = rng.random(b - a) < 1.0 / (1.0 + np.exp(-eta))
        else:
            y[a:b] = rng.poisson(np.exp(eta))
    return X, y, w_true


# --------------------------------------------------------------------------- Laplace reference
def _neg_log_post(likelihood, X, y, w):
    """U(w) (up to a constant), its gradient and Hessian in float64, accumulated over row chunks."""
    d = w.shape[0]
    u, g, h = 0.5 * w @ w, w.copy(), np.eye(d)
    for a in range(0, X.shape[0], CHUNK):
        xc = X[a:a + CHUNK].astype(np.float64)
        yc = y[a:a + CHUNK].astype(np.float64)
        eta = xc @ w
        if likelihood == "logistic":
            log_lik = yc * eta - np.logaddexp(0.0, eta)
            mu = 0.5 * (1.0 + np.tanh(0.5 * eta))
            weight = mu * (1.0 - mu)
        else:
            mu = np.exp(eta)
            log_lik, weight = yc * eta - mu, mu
        u -= log_lik.sum()
        g -= xc.T @ (yc - mu)
        h += (xc * weight[:, None]).T @ xc
    return u, g, h


def laplace(likelihood, X, y, tol=1e-10, max_iter=100):
    """Full-data MAP by (damped) Newton in float64 and the Laplace covariance H⁻¹ at it."""
    start = time.perf_counter()
    w = np.zeros(X.shape[1])
    u, g, h = _neg_log_post(likelihood, X, y, w)
    passes = iterations = 0
    while True:
        step = np.linalg.solve(h, g)
        decrement = float(g @ step)  # λ²
        if decrement < tol:
            break
        if iterations == max_iter:
            raise RuntimeError(f"Laplace: Newton did not reach λ² < {tol} in {max_iter} steps (λ² = {decrement:.3g})")
        t = 1.0
        while True:
            w_new = w - t * step
            u_new, g_new, h_new = _neg_log_post(likelihood, X, y, w_new)
            passes += 1
            # Armijo backtracking far from the optimum; full Newton steps near it, where U's
            # rounding (U ~ N) would swamp the decrease the test looks for
            if decrement < 0.1 or (np.isfinite(u_new) and u_new <= u - 0.25 * t * decrement) or t < 1e-6:
                break
            t *= 0.5
        w, u, g, h = w_new, u_new, g_new, h_new
        iterations += 1
    cov = np.linalg.inv(h)
    info = {"newton_iterations": iterations, "decrement": decrement, "passes": passes + 1,
            "seconds": time.perf_counter() - start}
    return w, 0.5 * (cov + cov.T), info


# --------------------------------------------------------------------------- memory
def reset_cell_peak():
    """Reset the kernel's peak-RSS mark of this process (Linux ``clear_refs`` 5); False if refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_gib(cell_reset):
    """(process peak from getrusage, this cell's peak from VmHWM or None) in GiB."""
    process = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    cell = None
    if cell_reset:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                cell = int(line.split()[1]) / 2**20
    return process, cell


def release():
    jax.clear_caches()
    gc.collect()


# --------------------------------------------------------------------------- runs
def _block(mcmc, state_attr):
    return jax.block_until_ready(getattr(mcmc, state_attr))


def timed_warmup_and_run(mcmc, clock, key, data, *, warmup_kwargs=None, run_kwargs=None):
    """``mcmc.warmup`` then ``mcmc.run``, each timed, with JAX's compile seconds split out."""
    warmup_kwargs, run_kwargs = warmup_kwargs or {}, run_kwargs or {}
    _, w_wall, w_comp, _ = timed(lambda: (mcmc.warmup(key, *data, **warmup_kwargs),
                                          _block(mcmc, "post_warmup_state")), clock)
    after_warmup = mcmc.get_extra_fields() if "extra_fields" in warmup_kwargs else None
    warmup_state = mcmc.post_warmup_state
    _, r_wall, r_comp, _ = timed(lambda: (mcmc.run(key, *data, **run_kwargs),
                                          jax.block_until_ready((mcmc.get_samples(), mcmc.last_state))), clock)
    times = {"compile_s": w_comp + r_comp, "warmup_s": w_wall - w_comp, "sampling_s": r_wall - r_comp,
             "total_s": w_wall + r_wall, "warmup_wall_s": w_wall, "run_wall_s": r_wall,
             "warmup_compile_s": w_comp, "run_compile_s": r_comp}
    return times, warmup_state, after_warmup


def accuracy(mcmc, label, reference, total_s, passes):
    """min bulk ESS, ESS/s and the moment errors against the Laplace reference (diagnostics.compare)."""
    row = compare({label: mcmc}, reference, names=["w"], wall_times={label: total_s},
                  data_passes={label: passes}).loc[label]
    out = {"min_ess_bulk": float(row["min_ess_bulk"]), "min_ess_tail": float(row["min_ess_tail"]),
           "ess_per_s": float(row["ess_per_s"]), "max_mean_err_sd": float(row["max_mean_err_sd"]),
           "max_sd_rel_err": float(row["max_sd_rel_err"]), "kl_q_ref": float(row["kl_q_ref"])}
    out["accurate"] = out["max_mean_err_sd"] <= MEAN_TOL and out["max_sd_rel_err"] <= SD_TOL
    return out


def sg_schedule(method, n, s, args):
    """(steps_per_sample or None for IASG, passes per returned sample, num_warmup, num_samples) per chain."""
    if method == "IASG-full":
        k, per_sample = None, math.ceil(n / s) * s / n
    else:
        k = args.steps_per_sample or max(1, n // s // 10)
        per_sample = k * s / n
    num_samples = args.num_samples or math.ceil(args.target_ess / (args.ess_per_pass * CHAINS * per_sample))
    num_warmup = args.num_warmup or math.ceil(args.warmup_passes / per_sample)
    return k, per_sample, num_warmup, num_samples


def run_sg(method, s, model, data, reference, clock, key, args):
    n = data[0].shape[0]
    k, per_sample, num_warmup, num_samples = sg_schedule(method, n, s, args)
    options = dict(preconditioner="full", subsample_size=s)
    if k is not None:
        options["steps_per_sample"] = k
    mcmc = MCMC(SG_KERNELS[method](model, **options), num_warmup=num_warmup, num_samples=num_samples,
                num_chains=CHAINS, chain_method="vectorized", jit_model_args=True, progress_bar=False)
    kw = {"subsample_size": s}
    times, warm_state, _ = timed_warmup_and_run(mcmc, clock, key, data, warmup_kwargs=kw, run_kwargs=kw)
    warm_passes = float(np.sum(np.asarray(warm_state.data_passes)))
    all_passes = float(np.sum(np.asarray(mcmc.last_state.data_passes)))
    rec = {"method": method, "S": s, "steps_per_sample": mcmc.sampler.steps_per_sample,
           "passes_per_sample": per_sample, "num_warmup": num_warmup, "num_samples": num_samples, **times,
           "warmup_passes": warm_passes, "sampling_passes": all_passes - warm_passes,
           "divergences": int(np.sum(np.asarray(mcmc.last_state.num_divergences))), "status": "measured"}
    rec.update(accuracy(mcmc, method, reference, rec["total_s"], all_passes))
    return rec


def _steps(fields):
    return np.asarray(fields["num_steps"]).astype(float)


def run_nuts(model, data, clock, key, num_warmup, num_samples, num_chains):
    """NUTS on the full data; returns (mcmc, timings, gradient counts)."""
    mcmc = MCMC(NUTS(model), num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method="sequential", jit_model_args=True, progress_bar=False)
    times, _, warm_fields = timed_warmup_and_run(
        mcmc, clock, key, data, warmup_kwargs={"collect_warmup": True, "extra_fields": ("num_steps",)},
        run_kwargs={"extra_fields": ("num_steps",)})
    grads = {"warmup_passes": float(_steps(warm_fields).sum()),
             "sampling_passes": float(_steps(mcmc.get_extra_fields()).sum())}
    divergences = int(np.sum(np.asarray(mcmc.get_extra_fields().get("diverging", 0))))
    return mcmc, times, grads, divergences, warm_fields


def nuts_cell(model, data, reference, clock, key, args):
    """Pilot, then the default run (or its extrapolation); returns the row and the pilot's numbers."""
    pw, ps = args.nuts_pilot
    pilot, p_times, p_grads, _, p_warm_fields = run_nuts(model, data, clock, key, pw, ps, 1)
    p_total_grads = p_grads["warmup_passes"] + p_grads["sampling_passes"]
    sec_per_grad = (p_times["warmup_s"] + p_times["sampling_s"]) / p_total_grads
    steps_per_iter = p_grads["sampling_passes"] / ps
    est_grads = CHAINS * (p_grads["warmup_passes"] + max(0, args.nuts_warmup - pw) * steps_per_iter
                          + args.nuts_samples * steps_per_iter)
    est_s = p_times["compile_s"] + est_grads * sec_per_grad
    pilot_info = {"pilot_warmup": pw, "pilot_samples": ps, "pilot_seconds_per_grad": sec_per_grad,
                  "pilot_steps_per_iter_warmup": float(_steps(p_warm_fields).mean()),
                  "pilot_steps_per_iter_sampling": steps_per_iter, "pilot_compile_s": p_times["compile_s"],
                  "pilot_total_s": p_times["total_s"], "estimated_grads": est_grads, "estimated_total_s": est_s}
    del pilot
    release()
    base = {"method": "NUTS", "S": None, "steps_per_sample": None, "num_warmup": args.nuts_warmup,
            "num_samples": args.nuts_samples, **pilot_info}
    if est_s > 60 * args.nuts_max_minutes:
        # extrapolated: a default run's time from the pilot; compile as measured in the pilot
        warm_grads = CHAINS * (p_grads["warmup_passes"] + max(0, args.nuts_warmup - pw) * steps_per_iter)
        return {**base, "status": "extrapolated", "compile_s": p_times["compile_s"],
                "warmup_s": warm_grads * sec_per_grad, "sampling_s": (est_grads - warm_grads) * sec_per_grad,
                "total_s": est_s, "warmup_passes": warm_grads, "sampling_passes": est_grads - warm_grads}
    mcmc, times, grads, divergences, _ = run_nuts(model, data, clock, key, args.nuts_warmup, args.nuts_samples,
                                                  CHAINS)
    rec = {**base, "status": "measured", **times, **grads, "divergences": divergences}
    rec.update(accuracy(mcmc, "NUTS", reference, rec["total_s"], grads["warmup_passes"] + grads["sampling_passes"]))
    return rec


def nuts_check(model, data, reference, clock, key, args):
    """Long NUTS against the Laplace reference: how far is Laplace from the posterior?"""
    w, s = args.nuts_check
    mcmc, times, grads, divergences, _ = run_nuts(model, data, clock, key, w, s, CHAINS)
    acc = accuracy(mcmc, "NUTS-long", reference, times["total_s"], grads["warmup_passes"] + grads["sampling_passes"])
    return {"num_warmup": w, "num_samples": s, "chains": CHAINS, **times, **grads, "divergences": divergences,
            "min_ess_bulk": acc["min_ess_bulk"], "laplace_vs_nuts_max_mean_diff_sd": acc["max_mean_err_sd"],
            "laplace_vs_nuts_max_sd_rel_diff": acc["max_sd_rel_err"], "kl_nuts_laplace": acc["kl_q_ref"]}


# --------------------------------------------------------------------------- one cell
def run_cell(likelihood, n, d, methods, s_lists, clock, args):
    cell_reset = reset_cell_peak()
    t0 = time.perf_counter()
    X, y, w_true = simulate(likelihood, n, d, seed=args.seed)
    gen_s = time.perf_counter() - t0
    mean, cov, lap = laplace(likelihood, X, y)
    reference = (mean, cov)
    data = (jax.device_put(X), jax.device_put(y))
    jax.block_until_ready(data)
    del X, y
    gc.collect()
    model = make_model(likelihood)
    cell = {"likelihood": likelihood, "n": n, "d": d, "data_gib": (n * d + n) * 4 / 2**30, "generate_s": gen_s,
            "laplace": {**lap, "mean": mean.tolist(), "sd": np.sqrt(np.diag(cov)).tolist(),
                        "w_true": w_true.tolist()}, "runs": []}
    print(f"\n== {likelihood} N={n:,} D={d}: data {cell['data_gib']:.3f} GiB generated in {gen_s:.1f} s; Laplace: "
          f"{lap['newton_iterations']} Newton steps, λ² = {lap['decrement']:.1e}, {lap['seconds']:.1f} s", flush=True)
    key = jax.random.key(args.seed)
    for method in methods:
        for s in (s_lists[method] if method in SG_KERNELS else [None]):
            if s is not None and s > n:
                print(f"   {method} S={s}: skipped (S > N)")
                continue
            rec = (run_sg(method, s, model, data, reference, clock, key, args) if s is not None
                   else nuts_cell(model, data, reference, clock, key, args))
            rec["peak_rss_gib"], rec["cell_peak_rss_gib"] = peak_rss_gib(cell_reset)
            rec["loadavg_1min"] = os.getloadavg()[0]  # the machine is shared: how busy it was
            cell["runs"].append(rec)
            print("   " + run_line(rec), flush=True)
            release()
    if n <= args.nuts_check_max_n and args.nuts_check[1] > 0:
        check = nuts_check(model, data, reference, clock, key, args)
        cell["nuts_check"] = check
        print(f"   Laplace vs long NUTS ({CHAINS}×{check['num_warmup']}+{check['num_samples']}, ESS "
              f"{check['min_ess_bulk']:.0f}, {check['total_s']:.0f} s): max mean diff "
              f"{check['laplace_vs_nuts_max_mean_diff_sd']:.3f} sd, max sd rel diff "
              f"{check['laplace_vs_nuts_max_sd_rel_diff']:.3f}", flush=True)
        release()
    mark_best(cell["runs"])
    cell["peak_rss_gib"], cell["cell_peak_rss_gib"] = peak_rss_gib(cell_reset)
    del data
    release()
    return cell


def mark_best(runs):
    for method in {r["method"] for r in runs}:
        ok = [r for r in runs if r["method"] == method and r.get("accurate")]
        for r in runs:
            if r["method"] == method:
                r["best"] = bool(ok) and r is max(ok, key=lambda r: r["ess_per_s"])


def time_to_target(rec, target):
    """(seconds, marker) by the rule of the module docstring; (None, reason) where not reached."""
    if rec["status"] == "extrapolated":
        return rec["total_s"], "†"
    if not rec.get("accurate"):
        return None, f"not accurate ({rec['max_mean_err_sd']:.2f} sd, {100 * rec['max_sd_rel_err']:.0f} %)"
    factor = max(1.0, target / rec["min_ess_bulk"])
    return rec["compile_s"] + rec["warmup_s"] + rec["sampling_s"] * factor, ("*" if factor > 1 else "")


# --------------------------------------------------------------------------- reporting
def _fmt(x, spec):
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def run_line(r):
    acc = (f"ESS {r['min_ess_bulk']:.0f}, {r['ess_per_s']:.1f} ESS/s, mean err {r['max_mean_err_sd']:.3f} sd, "
           f"sd err {r['max_sd_rel_err']:.3f}{'' if r['accurate'] else ' (NOT accurate)'}"
           if "min_ess_bulk" in r else "EXTRAPOLATED from the pilot")
    where = "" if r["S"] is None else f" S={r['S']}"
    return (f"{r['method']}{where}: total {r['total_s']:.1f} s (compile "
            f"{r['compile_s']:.1f}, warmup {r['warmup_s']:.1f}, sampling {r['sampling_s']:.1f}), "
            f"{r['warmup_passes'] + r['sampling_passes']:.0f} passes, {acc}, peak RSS {r['peak_rss_gib']:.2f} GiB")


RUN_COLUMNS = [
    ("likelihood", "likelihood", "s"), ("N", "n", ","), ("D", "d", "d"), ("method", "method", "s"), ("S", "S", ","),
    ("k", "steps_per_sample", "d"), ("warmup / samples per chain", "schedule", "s"),
    ("compile s", "compile_s", ".1f"), ("warmup s", "warmup_s", ".1f"), ("sampling s", "sampling_s", ".1f"),
    ("total s", "total_s", ".1f"), ("passes warmup + sampling (Σ 2 chains)", "passes", "s"),
    ("min bulk ESS", "min_ess_bulk", ".0f"), ("ESS/s", "ess_per_s", ".2f"),
    ("max mean err (sd)", "max_mean_err_sd", ".3f"), ("max sd err", "max_sd_rel_err", ".3f"),
    ("accurate", "accurate_text", "s"), ("best S", "best_text", "s"),
    ("peak RSS GiB (process / cell)", "rss", "s"), ("load avg", "loadavg_1min", ".1f"),
]


def run_rows(cells):
    rows = []
    for c in cells:
        for r in c["runs"]:
            row = {**r, "likelihood": c["likelihood"], "n": c["n"], "d": c["d"],
                   "schedule": f"{r['num_warmup']} / {r['num_samples']}",
                   "passes": f"{r['warmup_passes']:.0f} + {r['sampling_passes']:.0f}",
                   "accurate_text": {True: "yes", False: "**no**"}.get(r.get("accurate"), "extrapolated"),
                   "best_text": "best" if r.get("best") else "",
                   "rss": f"{r['peak_rss_gib']:.2f} / {_fmt(r['cell_peak_rss_gib'], '.2f')}"}
            rows.append(row)
    return rows


def markdown_table(columns, rows):
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(key), spec) for _, key, spec in columns) + " |")
    return "\n".join(lines)


def check_table(cells):
    columns = [("likelihood", "likelihood", "s"), ("N", "n", ","), ("D", "d", "d"),
               ("NUTS run", "run", "s"), ("min bulk ESS", "min_ess_bulk", ".0f"),
               ("max mean diff (sd)", "laplace_vs_nuts_max_mean_diff_sd", ".3f"),
               ("max sd rel diff", "laplace_vs_nuts_max_sd_rel_diff", ".3f"),
               ("Newton steps", "newton_iterations", "d"), ("Laplace s", "laplace_s", ".1f"),
               ("NUTS s", "total_s", ".0f")]
    rows = [{**c["nuts_check"], "likelihood": c["likelihood"], "n": c["n"], "d": c["d"],
             "run": f"{CHAINS} × ({c['nuts_check']['num_warmup']} + {c['nuts_check']['num_samples']})",
             "newton_iterations": c["laplace"]["newton_iterations"], "laplace_s": c["laplace"]["seconds"]}
            for c in cells if "nuts_check" in c]
    return markdown_table(columns, rows) if rows else "(no long NUTS check in this run)"


def target_summary(cells, methods, target):
    """{(likelihood, d): {method: {n: (seconds or None, marker, S)}}} — smallest over S."""
    out = {}
    for c in cells:
        panel = out.setdefault((c["likelihood"], c["d"]), {})
        for method in methods:
            best = None
            for r in (r for r in c["runs"] if r["method"] == method):
                t, mark = time_to_target(r, target)
                if t is not None and (best is None or best[0] is None or t < best[0]):
                    best = (t, mark, r["S"])
                elif best is None:
                    best = (None, mark, r["S"])
            if best is not None:
                panel.setdefault(method, {})[c["n"]] = best
    return out


def target_table(summary, ns):
    header = "| likelihood | D | method | " + " | ".join(f"N = {n:,}" for n in ns) + " |"
    lines = [header, "|" + "---|" * (3 + len(ns))]
    for (lik, d), panel in summary.items():
        for method, by_n in panel.items():
            cells = []
            for n in ns:
                if n not in by_n:
                    cells.append("")
                    continue
                t, mark, s = by_n[n]
                where = f" (S = {s:,})" if s else ""
                cells.append(f"{t:.1f} s{mark}{where}" if t is not None else f"— {mark}{where}")
            lines.append(f"| {lik} | {d} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return None
    panels = list(summary)
    methods = list(dict.fromkeys(m for panel in summary.values() for m in panel))
    colors = {m: f"C{i}" for i, m in enumerate(methods)}  # one colour per method in every panel
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, key in zip(axes.flat, panels, strict=True):
        for method, by_n in summary[key].items():
            pts = sorted((n, t, mark) for n, (t, mark, _) in by_n.items() if t is not None)
            if not pts:
                continue
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", lw=1.4, label=method,
                            color=colors[method])
            hollow = [p for p in pts if p[2]]
            if hollow:
                ax.plot([p[0] for p in hollow], [p[1] for p in hollow], "o", ms=9, mfc="none", color=line.get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{key[0]}, D = {key[1]}", fontsize=10)
        ax.set_xlabel("N")
        ax.grid(alpha=0.3, which="both")
    axes.flat[0].set_ylabel("seconds to ESS ≥ 400, accurate")
    axes.flat[0].legend(fontsize=7, title="ring: extrapolated", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def environment():
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    mem = next((int(line.split()[1]) / 2**20 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), float("nan")) if Path("/proc/meminfo").exists() else float("nan")
    import arviz

    import numpyro_sgd

    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "cpu": cpu,
            "cpu_count": os.cpu_count(), "memory_gib": mem, "platform": platform.platform(),
            "jax_backend": jax.devices()[0].platform, "python": platform.python_version(), "numpy": np.__version__,
            "jax": jax.__version__, "numpyro": numpyro.__version__, "arviz": arviz.__version__,
            "numpyro_sgd": getattr(numpyro_sgd, "__version__", "dev"), "loadavg_start": os.getloadavg()}


def write_markdown(path, result, summary, plot_path):
    env = result["environment"]
    ns = sorted({c["n"] for c in result["cells"]})
    text = [
        "# Time to an accurate posterior, N = 10⁵ to 10⁷: SG kernels against NUTS",
        "",
        "Generated by `benchmarks/benchmark_scaling.py` (its docstring states every rule); every number is "
        f"measured in {'the runs merged below' if result.get('sources') else 'this run'} except those marked "
        "extrapolated.",
        "",
        f"- command: `{result['command']}`",
        f"- machine: {env['cpu']}, {env['cpu_count']} CPUs, {env['memory_gib']:.0f} GiB, JAX backend "
        f"{env['jax_backend']}; load average at start {env['loadavg_start'][0]:.2f}",
        f"- date: {env['date']}; total {result['total_s'] / 60:.1f} min"
        + ("" if result["complete"] else " (INCOMPLETE: not every cell of the command(s) finished)"),
        f"- versions: Python {env['python']}, NumPy {env['numpy']}, JAX {env['jax']}, NumPyro {env['numpyro']}, "
        f"ArviZ {env['arviz']}, numpyro_sgd {env['numpyro_sgd']}",
        *[f"- merged from `{src['file']}`: `{src['command']}` ({src['date']}, load average at start "
          f"{src['loadavg_start']:.2f}{'' if src['complete'] else ', INCOMPLETE'})"
          for src in result.get("sources", [])],
        "",
        "## Is the Laplace reference accurate enough?",
        "",
        "Laplace N(ŵ, H⁻¹) at the float64 full-data MAP against a long NUTS run on the full data "
        "(differences in Laplace sd units; the NUTS Monte Carlo floor, max over D, is about 0.02–0.05):",
        "",
        check_table(result["cells"]),
        "",
        f"## Time to target (min bulk ESS ≥ {result['settings']['target_ess']}, max mean error ≤ {MEAN_TOL} sd, "
        f"max sd error ≤ {100 * SD_TOL:.0f} %)",
        "",
        "compile + warmup + sampling × max(1, target / ESS) of the fastest accurate S; `*`: sampling time "
        "extrapolated linearly in ESS; `†`: NUTS default run extrapolated from a pilot (accuracy assumed, "
        "not measured); `—`: no run of this method met the accuracy criteria.",
        "",
        target_table(summary, ns),
        "",
    ]
    if plot_path:
        text += [f"![time to target]({Path(plot_path).name})", ""]
    text += [
        "## Every run",
        "",
        "Seconds: compile (JAX-reported, both the `warmup` and the `run` call), warmup and sampling (wall minus "
        "compile), total (wall of both calls: what the user waits). Passes are per-datum gradients / N summed over "
        "the 2 chains (NUTS: leapfrog steps). ESS/s uses the total. Peak RSS: process peak (`ru_maxrss`) / the "
        "cell's own peak (`VmHWM` after a reset). Load avg: the 1-minute load average at the end of the run "
        f"(the machine has {env['cpu_count']} CPUs and is shared). `best S`: highest ESS/s among the accurate "
        "runs of the method.",
        "",
        markdown_table(RUN_COLUMNS, run_rows(result["cells"])),
        "",
        "Extrapolated NUTS rows (pilot: seconds per gradient, leapfrog steps per iteration):",
        "",
    ]
    extrap = [f"- {c['likelihood']} N = {c['n']:,} D = {c['d']}: pilot 1 × ({r['pilot_warmup']} + "
              f"{r['pilot_samples']}) took {r['pilot_total_s']:.0f} s, {1e3 * r['pilot_seconds_per_grad']:.2f} ms per "
              f"gradient, {r['pilot_steps_per_iter_sampling']:.1f} steps per sampling iteration → "
              f"{r['estimated_grads']:.0f} gradients, {r['estimated_total_s'] / 60:.1f} min"
              for c in result["cells"] for r in c["runs"] if r["status"] == "extrapolated"]
    text += (extrap or ["- none"]) + ["", "## Findings", "", "See README.md, section \"Speed\".", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text))


# --------------------------------------------------------------------------- main
def parse_s_lists(items, methods):
    s_lists = {m: list(DEFAULT_S[m]) for m in SG_KERNELS}
    common = [int(x) for x in items if "=" not in x]
    if common:
        s_lists = {m: common for m in SG_KERNELS}
    for item in (x for x in items if "=" in x):
        name, values = item.split("=", 1)
        if name not in SG_KERNELS:
            raise SystemExit(f"--subsample-sizes: unknown method {name!r} (one of {list(SG_KERNELS)})")
        s_lists[name] = [int(v) for v in values.split(",")]
    return {m: s_lists[m] for m in methods if m in SG_KERNELS}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000], help="numbers of rows N")
    p.add_argument("--d", type=int, nargs="+", default=[10, 50], help="numbers of features D")
    p.add_argument("--likelihood", nargs="+", choices=LIKELIHOODS, default=list(LIKELIHOODS))
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--subsample-sizes", nargs="+", default=[],
                   help="S values: '1000 10000' for every SG method, or 'IASG-full=1000,10000' per method "
                        f"(default {DEFAULT_S})")
    p.add_argument("--warmup-passes", type=float, default=20.0, help="warmup data passes per chain (default 20)")
    p.add_argument("--target-ess", type=float, default=400.0, help="target min bulk ESS (default 400)")
    p.add_argument("--ess-per-pass", type=float, default=0.5,
                   help="assumed ESS per data pass that sizes num_samples (default 0.5)")
    p.add_argument("--steps-per-sample", type=int, help="override k = max(1, N // S // 10) (not IASG)")
    p.add_argument("--num-samples", type=int, help="override the SG num_samples rule (per chain)")
    p.add_argument("--num-warmup", type=int, help="override the SG num_warmup rule (per chain, returned samples)")
    p.add_argument("--nuts-warmup", type=int, default=1000)
    p.add_argument("--nuts-samples", type=int, default=1000)
    p.add_argument("--nuts-pilot", type=int, nargs=2, default=[100, 100], metavar=("WARMUP", "SAMPLES"),
                   help="the NUTS pilot run (1 chain) that measures seconds per gradient (default 100 100)")
    p.add_argument("--nuts-max-minutes", type=float, default=20.0,
                   help="extrapolate NUTS instead of running it where the estimate exceeds this (default 20)")
    p.add_argument("--nuts-check", type=int, nargs=2, default=[1000, 2000], metavar=("WARMUP", "SAMPLES"),
                   help="long NUTS run (2 chains) checking the Laplace reference (default 1000 2000; 0 0: none)")
    p.add_argument("--nuts-check-max-n", type=int, default=100_000, help="run the long NUTS check up to this N")
    p.add_argument("--quick", action="store_true",
                   help="N = 10⁵, D = 10, logistic, the first S of each method, no long NUTS check (~3 min)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="run nothing: combine the cells of these result files into one table and plot")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    p.add_argument("--doc", type=Path, default=DEFAULT_DOC, help=f"Markdown output (default {DEFAULT_DOC})")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.d, args.likelihood, args.nuts_check = [100_000], [10], ["logistic"], [0, 0]
    args.s_lists = parse_s_lists(args.subsample_sizes, args.methods)
    if args.quick:
        args.s_lists = {m: v[:1] for m, v in args.s_lists.items()}
    return args


def merge(files, command, args):
    """One result from the cells of several result files (``--merge``): runs nothing, writes the
    combined tables and the time-to-target plot across N."""
    parts = [(f, json.loads(Path(f).read_text())) for f in files]
    cells = [c for _, r in parts for c in r["cells"]]
    args.n = sorted({c["n"] for c in cells})
    args.methods = list(dict.fromkeys(r["method"] for c in cells for r in c["runs"]))
    first = parts[0][1]
    return {"command": command, "environment": first["environment"], "settings": first["settings"],
            "cells": cells, "total_s": sum(r.get("total_s", 0.0) for _, r in parts),
            "complete": all(r.get("complete", False) for _, r in parts),
            "sources": [{"file": f, "command": r["command"], "date": r["environment"]["date"],
                         "loadavg_start": r["environment"]["loadavg_start"][0], "complete": r.get("complete", False)}
                        for f, r in parts]}


def main(argv=None):
    args = parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__)] + list(
        sys.argv[1:] if argv is None else argv))
    if args.merge:
        result = merge(args.merge, command, args)
        write_outputs(result, args, final=True)
        return result
    clock = CompileClock()
    env = environment()
    print(f"{command}\n{env['cpu']}, {env['cpu_count']} CPUs, JAX {env['jax']} ({env['jax_backend']}), "
          f"NumPyro {env['numpyro']}; S lists {args.s_lists}", flush=True)
    start = time.perf_counter()
    grid = sorted(((n * d, lik, n, d) for n in args.n for d in args.d for lik in args.likelihood))
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "doc")}
    result = {"command": command, "environment": env, "settings": settings, "cells": []}
    for i, (_, lik, n, d) in enumerate(grid):
        result["cells"].append(run_cell(lik, n, d, args.methods, args.s_lists, clock, args))
        result["total_s"] = time.perf_counter() - start
        result["complete"] = i + 1 == len(grid)
        write_outputs(result, args, final=result["complete"])  # after every cell: a killed run keeps its cells
    return result


def write_outputs(result, args, final):
    cells = result["cells"]
    summary = target_summary(cells, args.methods, args.target_ess)
    result["time_to_target"] = {f"{lik} D={d}": {m: {str(n): list(v) for n, v in by_n.items()}
                                                 for m, by_n in panel.items()}
                                for (lik, d), panel in summary.items()}
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_path = plot(summary, args.doc.with_suffix(".png")) if final else None
    write_markdown(args.doc, result, summary, plot_path)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    if final:
        print("\n" + check_table(cells) + "\n\n" + markdown_table(RUN_COLUMNS, run_rows(cells)) + "\n\n"
              + target_table(summary, sorted(args.n)))
        print(f"\nwrote {args.doc}, {args.out}" + (f", {plot_path}" if plot_path else ""))

if __name__ == "__main__":
    main()
