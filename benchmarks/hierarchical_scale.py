"""Random-effects models at scale: ``SGWithinGibbs(SGLD(model, control_variates=True))`` (the
control variates for group latents) against an exact posterior and the older routes.

Problems (float32, fixed seeds, groups of 50–150 rows in random order of rows):

* ``lmm``: y = X β + a_g + σ ε, X N × D (first column 1), a_g ~ N(0, τ²), β_j ~ N(0, 5²),
  σ, τ ~ HalfNormal(2). Given (σ, τ), β and a integrate out in closed form (per-group sufficient
  statistics), so a grid over (σ, τ) gives the exact posterior of σ, τ, β and every a_g at any N
  (:func:`lmm_reference`, float64).
* ``glmm``: a random-intercept-and-slope logistic regression, y ~ Bernoulli(σ(X β + a_g + b_g
  x_1)), a_g ~ N(0, τ_a²), b_g ~ N(0, τ_b²); its reference is NUTS on all rows (``--nuts``).
* ``horseshoe``: a linear regression with p = ``--d`` coefficients under the horseshoe
  (Carvalho, Polson & Scott 2010): β_j ~ N(0, τ² λ_j²), λ_j, τ ~ HalfCauchy(1), σ ~
  HalfNormal(2), ten non-zero β_j; no groups (``--groups`` is ignored): every row reads all of β,
  whose plate becomes global coordinates, and (λ, τ) are the hyper sites φ's NUTS draws given β.
  Its reference is NUTS on all rows (``--nuts``); scored on log τ, log λ_j, σ and β_j.

Reported: the end-to-end wall of one ``mcmc.run`` from a cold start (from building the kernel
to draws in hand; its draws are the ones scored) and its compile seconds (``CompileClock``);
warmup with the centre and sampling seconds apart, from a second run with ``mcmc.warmup`` and
``mcmc.run`` called apart (compile taken out: warmup and sampling are one program); data passes
(the centre's passes and the SG steps' per-datum gradients / N), peak resident memory against the
data's bytes, min bulk ESS over β, σ, τ, and the errors in reference sds. *Accurate*: ESS ≥ 400,
β, σ, τ means within 0.15 sd and sds within 15 %, the group latents' means within 0.2 sd and sds
within 20 % (every group).

    python benchmarks/hierarchical_scale.py --problem lmm --n 1000000 --groups 10000
    python benchmarks/hierarchical_scale.py --problem lmm --n 10000000 --groups 100000
    python benchmarks/hierarchical_scale.py --problem glmm --n 100000 --groups 1000 --nuts
    python benchmarks/hierarchical_scale.py --problem horseshoe --n 20000 --d 100 --nuts
    python benchmarks/hierarchical_scale.py --problem horseshoe --n 1000000 --d 1000 --no-reference
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from benchmark_scaling import peak_rss_gib, reset_cell_peak
from benchmark_throughput import CompileClock
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, NUTS
from out_of_core import PeakAnon

from numpyro_sgd import SGLD, ConstantSGD, SGWithinGibbs

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from lmm_reference import lmm_reference  # noqa: E402 (the suite's exact LMM posterior)

PRIOR_BETA, PRIOR_SCALE = 5.0, 2.0  # lmm_reference's priors
MIN_ESS, MEAN_TOL, SD_TOL, GROUP_MEAN_TOL, GROUP_SD_TOL = 400, 0.15, 0.15, 0.2, 0.2


# --------------------------------------------------------------------------- problems
def simulate(problem, n, groups, d, seed=0):
    """(arrays, truth): unbalanced groups of 50–150 rows (scaled to n rows), rows shuffled; for the
    horseshoe, (X, y) with ten non-zero coefficients."""
    rng = np.random.default_rng(seed)
    if problem == "horseshoe":
        X = rng.normal(size=(n, d)).astype(np.float32)
        beta = np.zeros(d, np.float32)
        beta[:10] = [3.0, -2.0, 1.5, -1.0, 0.5, 0.3, -0.2, 0.1, 0.05, -0.03][:d]
        return (X, (X @ beta + rng.normal(size=n)).astype(np.float32)), dict(beta=beta, sigma=1.0)
    sizes = rng.integers(50, 151, groups).astype(float)
    sizes = np.maximum(1, np.floor(sizes * n / sizes.sum())).astype(np.int64)
    sizes[: n - sizes.sum()] += 1  # the rows left by the rounding, one each to the first groups
    g = rng.permutation(np.repeat(np.arange(groups), sizes)).astype(np.int32)
    X = rng.normal(size=(n, d)).astype(np.float32)
    X[:, 0] = 1.0
    beta = (0.5 * rng.normal(size=d)).astype(np.float32)
    if problem == "lmm":
        tau, sigma = 0.7, 1.3
        a = tau * rng.normal(size=groups)
        y = (X @ beta + a[g] + sigma * rng.normal(size=n)).astype(np.float32)
        return (X, g, y), dict(beta=beta, tau=tau, sigma=sigma, a=a)
    tau_a, tau_b = 0.8, 0.4
    a, b = tau_a * rng.normal(size=groups), tau_b * rng.normal(size=groups)
    logits = X @ beta + a[g] + b[g] * X[:, 1]
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return (X, g, y), dict(beta=beta, tau_a=tau_a, tau_b=tau_b, a=a, b=b)


def make_model(problem, groups, d, s):
    def lmm(X, g, y):
        beta = numpyro.sample("beta", dist.Normal(0.0, PRIOR_BETA).expand([d]).to_event(1))
        tau = numpyro.sample("tau", dist.HalfNormal(PRIOR_SCALE))
        sigma = numpyro.sample("sigma", dist.HalfNormal(PRIOR_SCALE))
        with numpyro.plate("groups", groups):
            a = numpyro.sample("a", dist.Normal(0.0, tau))
        with numpyro.plate("data", X.shape[0], subsample_size=s) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ beta + a[g[idx]], sigma), obs=y[idx])

    def glmm(X, g, y):
        beta = numpyro.sample("beta", dist.Normal(0.0, PRIOR_BETA).expand([d]).to_event(1))
        tau_a = numpyro.sample("tau_a", dist.HalfNormal(PRIOR_SCALE))
        tau_b = numpyro.sample("tau_b", dist.HalfNormal(PRIOR_SCALE))
        with numpyro.plate("groups", groups):
            a = numpyro.sample("a", dist.Normal(0.0, tau_a))
            b = numpyro.sample("b", dist.Normal(0.0, tau_b))
        with numpyro.plate("data", X.shape[0], subsample_size=s) as idx:
            x = X[idx]
            gi = g[idx]
            numpyro.sample("y", dist.Bernoulli(logits=x @ beta + a[gi] + b[gi] * x[:, 1]), obs=y[idx])

    def horseshoe(X, y):
        tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(PRIOR_SCALE))
        with numpyro.plate("coef", d):
            lam = numpyro.sample("lam", dist.HalfCauchy(1.0))
            beta = numpyro.sample("beta", dist.Normal(0.0, tau * lam))
        with numpyro.plate("data", X.shape[0], subsample_size=s) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ beta, sigma), obs=y[idx])

    return dict(lmm=lmm, glmm=glmm, horseshoe=horseshoe)[problem]


def on_scored_scale(problem, draws):
    """The horseshoe's scales on the log scale (``log_tau``, ``log_lam``), where they are scored."""
    if problem != "horseshoe":
        return draws
    out = {k: v for k, v in draws.items() if k not in ("tau", "lam")}
    return dict(out, log_tau=np.log(np.asarray(draws["tau"], np.float64)),
                log_lam=np.log(np.asarray(draws["lam"], np.float64)))


def write_memmaps(directory, arrays):
    """The arrays written to ``directory`` as ``.npy`` files and opened memory-mapped (read-only)."""
    path = pathlib.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    out = []
    for i, a in enumerate(arrays):
        np.save(path / f"array_{i}.npy", a)
        out.append(np.load(path / f"array_{i}.npy", mmap_mode="r"))
    return tuple(out)


# --------------------------------------------------------------------------- scoring
def score(draws, reference, globals_):
    """(min bulk ESS over the global sites, max |mean err| / sd, max |sd ratio − 1|, and the
    same two over the group latents)."""
    ess, mean_err, sd_err, g_mean, g_sd = np.inf, 0.0, 0.0, 0.0, 0.0
    for site, (m, s) in reference.items():
        if site not in draws:
            continue
        x = np.asarray(draws[site], np.float64)  # (chains, draws, ...)
        flat = x.reshape(-1, *x.shape[2:])
        err = np.max(np.abs(flat.mean(0) - m) / s)
        sde = np.max(np.abs(flat.std(0) / s - 1))
        print(f"  {site}: max |mean err| {err:.3f} sd, max |sd ratio - 1| {sde:.3f}"
              + (f", min ESS {float(np.min(effective_sample_size(x))):.0f}" if site in globals_ else ""))
        if site in globals_:
            ess = min(ess, float(np.min(effective_sample_size(x))))
            mean_err, sd_err = max(mean_err, err), max(sd_err, sde)
        else:
            g_mean, g_sd = max(g_mean, err), max(g_sd, sde)
    return ess, mean_err, sd_err, g_mean, g_sd


def accurate(ess, mean_err, sd_err, g_mean, g_sd):
    return (ess >= MIN_ESS and mean_err <= MEAN_TOL and sd_err <= SD_TOL and g_mean <= GROUP_MEAN_TOL
            and g_sd <= GROUP_SD_TOL)


# --------------------------------------------------------------------------- runs
def run_group_cv(model, data, clock, num_warmup, num_samples, split_run=True, extra_fields=(), jit_model_args=True):
    """``SGWithinGibbs(SGLD(model, control_variates=True))``: one ``mcmc.run`` from a cold start
    (what a user waits for: its wall and its compile; its draws are scored), then, with a second
    ``MCMC``, ``mcmc.warmup`` (the centre, then warmup steps with φ's NUTS adapting) and
    ``mcmc.run`` timed apart, the compile they repeat taken off. ``extra_fields``: as NumPyro's
    (``"~z.a"`` leaves the site ``a`` out of the draws); ``jit_model_args`` False for memmaps
    (NumPyro would otherwise copy them whole into its loop; the kernel says so)."""
    def make():
        return MCMC(SGWithinGibbs(SGLD(model, control_variates=True)), num_warmup=num_warmup,
                    num_samples=num_samples, num_chains=2, chain_method="vectorized", jit_model_args=jit_model_args,
                    progress_bar=False)

    t0, c0 = time.perf_counter(), clock.seconds
    mcmc = make()
    mcmc.run(jax.random.key(1), *data, extra_fields=extra_fields)
    draws = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    wall, compile_s = time.perf_counter() - t0, clock.seconds - c0
    state = mcmc.last_state
    centre = float(np.sum(np.asarray(state.kernel_state.inner.passes)))
    passes = float(np.sum(np.asarray(state.data_passes)))
    if not split_run:
        return draws, dict(compile_s=compile_s, wall_s=wall, centre_passes=centre, sg_passes=passes)
    t0, c0 = time.perf_counter(), clock.seconds
    split = make()
    split.warmup(jax.random.key(1), *data)
    jax.block_until_ready(split.post_warmup_state)
    t1, c1 = time.perf_counter(), clock.seconds
    split.run(jax.random.key(2), *data)
    jax.block_until_ready(split.get_samples())
    t2, c2 = time.perf_counter(), clock.seconds
    times = dict(compile_s=compile_s, warmup_s=t1 - t0 - (c1 - c0), sampling_s=t2 - t1 - (c2 - c1), wall_s=wall,
                 centre_passes=centre, sg_passes=passes)
    return draws, times


def run_old_route(model, data, clock, num_warmup, num_samples):
    """``SGWithinGibbs(ConstantSGD(model))`` (its documented route; S as the model's plate)."""
    t0, c0 = time.perf_counter(), clock.seconds
    mcmc = MCMC(SGWithinGibbs(ConstantSGD(model)), num_warmup=num_warmup, num_samples=num_samples, num_chains=2,
                chain_method="vectorized", jit_model_args=True, progress_bar=False)
    mcmc.run(jax.random.key(3), *data)
    draws = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    t1 = time.perf_counter()
    passes = float(np.sum(np.asarray(mcmc.last_state.data_passes)))
    return draws, dict(compile_s=clock.seconds - c0, wall_s=t1 - t0, sg_passes=passes)


def run_nuts(model, data, clock, num_warmup, num_samples, target_accept_prob=0.8):
    t0, c0 = time.perf_counter(), clock.seconds
    mcmc = MCMC(NUTS(model, target_accept_prob=target_accept_prob), num_warmup=num_warmup, num_samples=num_samples,
                num_chains=2, chain_method="vectorized",
                progress_bar=False, jit_model_args=True)
    mcmc.run(jax.random.key(4), *data)
    draws = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    return draws, dict(compile_s=clock.seconds - c0, wall_s=time.perf_counter() - t0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", choices=("lmm", "glmm", "horseshoe"), default="lmm")
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--subsample-size", type=int, default=10_000)
    parser.add_argument("--num-warmup", type=int, default=100)
    parser.add_argument("--num-samples", type=int, default=1_000)
    parser.add_argument("--old-route", action="store_true", help="also run SGWithinGibbs(ConstantSGD(model))")
    parser.add_argument("--baseline", action="store_true",
                        help="also run the hand-written lax.scan of the same algorithm (lmm only, lmm_scan_baseline)")
    parser.add_argument("--nuts", action="store_true", help="NUTS on all rows (the GLMM's reference)")
    parser.add_argument("--nuts-draws", metavar="NPZ",
                        help="with --nuts, save NUTS's draws here; when the file exists, score against them "
                             "instead of running NUTS again (same problem and sizes)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the exact reference, the scores and the second (split) run: the peak memory "
                             "is then one mcmc.run's")
    parser.add_argument("--memmap", metavar="DIR",
                        help="write the data to DIR as .npy files and run on them memory-mapped (read in place)")
    parser.add_argument("--no-group-draws", action="store_true",
                        help="leave the group latents out of the draws (extra_fields=('~z.a', ...)): their "
                             "(chains, draws, G) array is most of the memory at G = 10⁵")
    parser.add_argument("--cache", help="JAX's persistent compilation cache in this folder (run twice: the second "
                                        "process skips XLA's compile)")
    args = parser.parse_args(argv)
    if args.cache:
        jax.config.update("jax_compilation_cache_dir", args.cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    clock = CompileClock()
    sizes = f"p = {args.d}" if args.problem == "horseshoe" else f"G = {args.groups:,}, D = {args.d}"
    print(f"# {args.problem}: N = {args.n:,}, {sizes}, S = {args.subsample_size:,}; "
          f"{platform.processor() or platform.machine()}, jax {jax.__version__}, numpyro {numpyro.__version__}")
    arrays, truth = simulate(args.problem, args.n, args.groups, args.d)
    data_bytes = sum(a.nbytes for a in arrays)
    model = make_model(args.problem, args.groups, args.d, args.subsample_size)
    globals_ = dict(lmm=("beta", "sigma", "tau"), glmm=("beta", "tau_a", "tau_b"),
                    horseshoe=("log_tau", "sigma"))[args.problem]
    reference = None
    if args.problem == "lmm" and not args.no_reference:
        t = time.perf_counter()
        reference = lmm_reference(*arrays, args.groups, prior_beta=PRIOR_BETA, prior_scale=PRIOR_SCALE)
        print(f"exact reference (grid over σ, τ): {time.perf_counter() - t:.1f} s, "
              f"weight at the grid's edge {reference.pop('grid_edge_weight'):.1e}")
    if args.memmap:
        data = write_memmaps(args.memmap, arrays)
    else:
        data = tuple(jnp.asarray(a) for a in arrays)
    del arrays  # the generator's copy: the user holds the data once (as JAX arrays, or on disk)
    runs = {}
    if args.nuts_draws and pathlib.Path(args.nuts_draws).exists():
        with np.load(args.nuts_draws) as saved:
            draws = {k: saved[k] for k in saved.files}
        print(f"NUTS's draws from {args.nuts_draws} (an earlier run of this command)")
        runs["NUTS (saved draws)"] = (draws, dict(compile_s=float("nan"), wall_s=float("nan")))
    elif args.nuts:
        draws, split = run_nuts(make_model(args.problem, args.groups, args.d, None), data, clock, 500, 1000,
                                target_accept_prob=0.95 if args.problem == "horseshoe" else 0.8)
        draws = {k: np.asarray(v) for k, v in on_scored_scale(args.problem, draws).items()}
        runs["NUTS"] = (draws, split)
        if args.nuts_draws:
            np.savez(args.nuts_draws, **draws)
    if "NUTS" in runs or "NUTS (saved draws)" in runs:
        pooled = {k: v.reshape(-1, *v.shape[2:]) for k, v in draws.items()}
        reference = {k: (v.mean(0), v.std(0)) for k, v in pooled.items()}
    group_sites = dict(lmm=("a",), glmm=("a", "b"), horseshoe=())[args.problem]
    cell = reset_cell_peak()
    with PeakAnon() as anon:
        draws, split = run_group_cv(model, data, clock, args.num_warmup, args.num_samples,
                                    split_run=not args.no_reference,
                                    extra_fields=tuple(f"~z.{k}" for k in group_sites) if args.no_group_draws else (),
                                    jit_model_args=not args.memmap)
    draws = on_scored_scale(args.problem, draws)
    split["peak_gib"] = peak_rss_gib(cell)[1]
    print(f"peak resident {split['peak_gib']:.2f} GiB (VmHWM, file pages included); anonymous memory "
          f"{anon.base:.2f} GiB before the run (data in memory, JAX's runtime), peak {anon.peak:.2f} GiB "
          f"(+{anon.growth:.2f} GiB)")
    runs["SGLD-CV (group latents)"] = (draws, split)
    if args.baseline and args.problem == "lmm":
        from lmm_scan_baseline import run_scan_baseline

        runs["hand-written lax.scan (baseline)"] = run_scan_baseline(data, args.groups, args.subsample_size,
                                                                      args.num_warmup, args.num_samples)
    if args.old_route:
        runs["SGWithinGibbs(ConstantSGD)"] = run_old_route(model, data, clock, args.num_warmup, args.num_samples)
    print(f"data {data_bytes / 2**30:.3f} GiB")
    print("| route | compile s | warmup+centre s | sampling s | wall s | centre passes | SG passes | peak GiB | "
          "min ESS | mean err (sd) | sd err | group mean err | group sd err | accurate |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, (draws, split) in runs.items():
        if reference is None:  # the ESS alone
            nan = float("nan")
            ess, me, se, gm, gs = (min(float(np.min(effective_sample_size(np.asarray(draws[k], np.float64))))
                                       for k in globals_), nan, nan, nan, nan)
        else:
            ess, me, se, gm, gs = score(draws, reference, globals_)
        peak = split.get("peak_gib")
        print(f"| {name} | {split['compile_s']:.1f} | {split.get('warmup_s', float('nan')):.1f} | "
              f"{split.get('sampling_s', float('nan')):.1f} | {split['wall_s']:.1f} | "
              f"{split.get('centre_passes', float('nan')):.0f} | {split.get('sg_passes', float('nan')):.1f} | "
              f"{'' if peak is None else f'{peak:.2f}'} | {ess:.0f} | {me:.3f} | {se:.3f} | {gm:.3f} | {gs:.3f} | "
              f"{'yes' if accurate(ess, me, se, gm, gs) else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
