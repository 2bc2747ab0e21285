"""What a large-N user would pick instead, on the same model, in one process: the control-variate
kernel against ConstantSGD-full, NumPyro's HMCECS, NumPyro SVI (AutoMultivariateNormal and
AutoNormal) and NUTS on all rows.

The problems are ``benchmark_scaling.py``'s simulated GLMs (float32, fixed seeds): logistic
regression (D = 50 by default, the covtype shape) and Poisson regression (D = 40, the HIGGS
shape), N rows in random order, prior w ~ N(0, I). The reference is the float64 Laplace
approximation at the full-data mode (``benchmark_scaling.laplace``), exact to O(1/N) in these
Bernstein–von Mises problems. Every method runs as its documentation recommends:

* ``SGLD-CV``: ``SGLD(model, control_variates=True)`` with the model's plate at S = 1,000, 2 chains
  (``chain_method="vectorized"``), 500 warmup and 1,000 sampling iterations of one SG step each
  (the exponential integrator's steps are about one effective sample each);
* ``ConstantSGD-full``: the large-N workflow of ``docs/workflow.md`` (``ConstantSGD(model)``,
  S = 10,000, 2 chains, 20 warmup + 400 draws, each draw one relaxation time);
* ``HMCECS``: NumPyro's ``examples/hmcecs.py`` recipe: an ``AutoDelta`` MAP by SVI (Adam 10⁻³,
  5,000 steps at S = 1,300) for the Taylor proxy, then ``HMCECS(NUTS(model), num_blocks=100,
  proxy=HMCECS.taylor_proxy(ref))``, S = 1,300, one chain of 500 warmup + 1,000 draws;
* ``SVI-MVN`` and ``SVI-Normal``: ``SVI(model, AutoMultivariateNormal / AutoNormal, Adam,
  Trace_ELBO())``, 20,000 steps at S = 1,000 with the rate decayed from 0.01 to 10⁻⁴ (optax's
  ``exponential_decay``), then 2,000 draws of the guide (independent: their ESS is their number);
* ``NUTS``: all rows, 2 chains of 500 warmup + 500 draws, where N ≤ ``--nuts-max-n`` (above, a
  leapfrog step's full-data gradient makes it the slowest by far; not run).

Reported per method: compile seconds (JAX's tracing, lowering and XLA compile, ``CompileClock``),
the rest of the wall, the end-to-end wall (what the user waits: everything from building the
kernel to draws in hand, the MAP of HMCECS and the optimisation of SVI included), data passes
(per-datum gradients / N, summed over chains; the control variates' centre passes included), min
bulk ESS, the largest mean error in reference sds and sd error, *accurate* (ESS ≥ 400, mean error ≤
0.15 sd, sd error ≤ 10 %), and the peak resident memory of the method (``VmHWM`` after a reset)
against the data's bytes. A method that is not accurate has no time to an accurate posterior.

    python benchmarks/anchors.py --n 1000000 --likelihood logistic --d 50 --doc docs/results/anchors_logistic_1000000.md
"""

from __future__ import annotations

import argparse
import datetime
import gc
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import optax
from benchmark_scaling import laplace, make_model, peak_rss_gib, reset_cell_peak, simulate
from benchmark_throughput import CompileClock
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import HMCECS, MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDelta, AutoMultivariateNormal, AutoNormal

from numpyro_sgd import SGLD, ConstantSGD

CLOCK = None
METHODS = ("SGLD-CV", "ConstantSGD-full", "HMCECS", "SVI-MVN", "SVI-Normal", "NUTS")
MIN_ESS, MEAN_TOL, SD_TOL = 400, 0.15, 0.10


def score(draws, reference):
    """(min bulk ESS, max |mean error| in sds, max |sd ratio − 1|) of (chains, draws, D) against
    the Laplace (mean, cov); guide draws are one chain of independent draws."""
    mean, cov = reference
    sd = np.sqrt(np.diag(cov))
    draws = np.asarray(draws, np.float64)
    flat = draws.reshape(-1, draws.shape[-1])
    return (float(np.min(effective_sample_size(draws))), float(np.max(np.abs(flat.mean(0) - mean) / sd)),
            float(np.max(np.abs(flat.std(0) / sd - 1.0))))


#: the split of the last SGLD-CV run: (warmup and centre seconds, sampling seconds, their compile seconds)
SPLIT = {}


def run_sgld_cv(model, data, key, n, clock=None):
    """``mcmc.warmup`` (the noise warmup, then the centre: Newton steps over streamed data passes,
    the Hessian and the control-variate noise there) and ``mcmc.run`` (sampling), timed apart."""
    kernel = SGLD(model, control_variates=True)
    mcmc = MCMC(kernel, num_warmup=500, num_samples=1_000, num_chains=2, chain_method="vectorized",
                jit_model_args=True, progress_bar=False)
    c0, t0 = CLOCK.seconds, time.perf_counter()
    mcmc.warmup(key, *data, subsample_size=1_000)
    jax.block_until_ready(mcmc.post_warmup_state)
    c1, t1 = CLOCK.seconds, time.perf_counter()
    warm_passes = float(np.sum(np.asarray(mcmc.post_warmup_state.data_passes)))
    mcmc.run(key, *data, subsample_size=1_000)
    draws = jax.block_until_ready(mcmc.get_samples(group_by_chain=True)["w"])
    c2, t2 = CLOCK.seconds, time.perf_counter()
    state = mcmc.last_state
    # one centre for the vectorized chains: each chain's state holds its passes
    centre = float(np.max(np.asarray(state.kernel_state.adapted.control.passes)))
    passes = float(np.sum(np.asarray(state.data_passes))) + centre
    SPLIT.update(warmup_s=t1 - t0 - (c1 - c0), sampling_s=t2 - t1 - (c2 - c1), compile_warmup_s=c1 - c0,
                 compile_sampling_s=c2 - c1, warmup_passes=warm_passes, centre_passes=centre,
                 sampling_passes=passes - warm_passes - centre)
    SPLIT.update(mcmc=mcmc, kernel=kernel, data=data)
    return draws, passes


def marginal_cost():
    """Seconds per draw (both chains) of the last SGLD-CV run, without the fixed cost of a run: a
    continued run of 5,000 draws less the 1,000 of the timed one (NumPyro's loop copies the data
    once per ``run`` call whatever its length), compile excluded. Not part of the timed row."""
    mcmc, kernel, data = SPLIT.pop("mcmc"), SPLIT.pop("kernel"), SPLIT.pop("data")
    longer = MCMC(kernel, num_warmup=500, num_samples=5_000, num_chains=2, chain_method="vectorized",
                  jit_model_args=True, progress_bar=False)
    longer.post_warmup_state = mcmc.last_state
    c0, t0 = CLOCK.seconds, time.perf_counter()
    longer.run(mcmc.last_state.rng_key, *data, subsample_size=1_000)
    jax.block_until_ready(longer.get_samples(group_by_chain=True)["w"])
    seconds = time.perf_counter() - t0 - (CLOCK.seconds - c0)
    return (seconds - SPLIT["sampling_s"]) / 4_000


def run_constant_sgd(model, data, key, n):
    mcmc = MCMC(ConstantSGD(model), num_warmup=20, num_samples=400, num_chains=2, chain_method="sequential",
                jit_model_args=True, progress_bar=False)
    mcmc.run(key, *data, subsample_size=10_000)
    draws = jax.block_until_ready(mcmc.get_samples(group_by_chain=True)["w"])
    return draws, float(np.sum(np.asarray(mcmc.last_state.data_passes)))


def run_hmcecs(model, data, key, n):
    k_svi, k_mcmc = jax.random.split(key)
    s = 1_300
    svi = SVI(model, AutoDelta(model), numpyro.optim.Adam(1e-3), Trace_ELBO())
    result = svi.run(k_svi, 5_000, *data, subsample_size=s, progress_bar=False)
    ref = {"w": result.params["w_auto_loc"]}
    kernel = HMCECS(NUTS(model), num_blocks=100, proxy=HMCECS.taylor_proxy(ref))
    mcmc = MCMC(kernel, num_warmup=500, num_samples=1_000, progress_bar=False)
    mcmc.run(k_mcmc, *data, subsample_size=s, extra_fields=("hmc_state.num_steps",))
    draws = jax.block_until_ready(mcmc.get_samples(group_by_chain=True)["w"])
    leapfrogs = float(np.sum(np.asarray(mcmc.get_extra_fields()["hmc_state.num_steps"])))
    # the MAP's steps, the proxy's full-data gradient and Hessian (one pass), and per leapfrog step
    # the subsample (the warmup's leapfrog steps are not collected: counted as the sampling ones)
    passes = 5_000 * s / n + 1.0 + 1.5 * leapfrogs * s / n
    return draws, passes


SVI_STEPS, SVI_S = 20_000, 1_000


def run_svi(guide_class):
    def run(model, data, key, n):
        k_svi, k_draw = jax.random.split(key)
        guide = guide_class(model)
        # Adam from 0.01, decayed to 10⁻⁴ over the run: the minibatch ELBO's gradient noise (N/S-scaled)
        # keeps a constant rate jittering around the optimum
        rate = optax.exponential_decay(0.01, SVI_STEPS, 0.01)
        svi = SVI(model, guide, numpyro.optim.optax_to_numpyro(optax.adam(rate)), Trace_ELBO())
        result = svi.run(k_svi, SVI_STEPS, *data, subsample_size=SVI_S, progress_bar=False)
        draws = guide.sample_posterior(k_draw, result.params, sample_shape=(2_000,))["w"]
        return jax.block_until_ready(draws)[None], SVI_STEPS * SVI_S / n

    return run


def run_nuts(model, data, key, n):
    mcmc = MCMC(NUTS(model), num_warmup=500, num_samples=500, num_chains=2, chain_method="sequential",
                jit_model_args=True, progress_bar=False)
    mcmc.run(key, *data, extra_fields=("num_steps",))
    draws = jax.block_until_ready(mcmc.get_samples(group_by_chain=True)["w"])
    return draws, 1.5 * float(np.sum(np.asarray(mcmc.get_extra_fields()["num_steps"])))


RUNNERS = {"SGLD-CV": run_sgld_cv, "ConstantSGD-full": run_constant_sgd, "HMCECS": run_hmcecs,
           "SVI-MVN": run_svi(AutoMultivariateNormal), "SVI-Normal": run_svi(AutoNormal), "NUTS": run_nuts}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--d", type=int, default=None, help="features (default: 50 logistic, 40 Poisson)")
    parser.add_argument("--likelihood", choices=("logistic", "poisson"), default="logistic")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--nuts-max-n", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--doc", help="write a markdown results page here")
    args = parser.parse_args(argv)
    d = args.d or (50 if args.likelihood == "logistic" else 40)
    global CLOCK
    clock = CLOCK = CompileClock()

    t0 = time.perf_counter()
    X, y, _ = simulate(args.likelihood, args.n, d, args.seed)
    sim_s = time.perf_counter() - t0
    mean, cov, info = laplace(args.likelihood, X, y)
    data = (jnp.asarray(X), jnp.asarray(y))
    data_gib = (X.nbytes + y.nbytes) / 2**30
    model = make_model(args.likelihood)
    lines = [f"{args.likelihood} regression, N = {args.n:,}, D = {d}, data {data_gib:.2f} GiB (float32); "
             f"simulated in {sim_s:.1f} s; Laplace reference: {info['newton_iterations']} float64 Newton steps, "
             f"{info['seconds']:.1f} s", ""]
    header = ("| method | compile s | rest s | wall s | data passes | min bulk ESS | max mean err (sd) | "
              "max sd err | accurate | time to accurate s | peak RSS GiB (× data) |")
    rows = [header, "|" + "|".join(["---"] * (header.count("|") - 1)) + "|"]
    notes = []
    print("\n".join(lines), flush=True)
    print(header, flush=True)
    for i, method in enumerate(args.methods):
        if method == "NUTS" and args.n > args.nuts_max_n:
            row = f"| NUTS | not run: N > {args.nuts_max_n:,} (a full-data gradient per leapfrog step) |||||||||"
            rows.append(row)
            print(row, flush=True)
            continue
        gc.collect()
        reset = reset_cell_peak()
        c0 = clock.seconds
        start = time.perf_counter()
        draws, passes = RUNNERS[method](model, data, jax.random.key(args.seed + i), args.n)
        wall = time.perf_counter() - start
        compile_s = clock.seconds - c0
        ess, mean_err, sd_err = score(draws, (mean, cov))
        if method.startswith("SVI"):
            ess = float(np.prod(np.shape(draws)[:2]))  # independent draws of the guide
        accurate = ess >= MIN_ESS and mean_err <= MEAN_TOL and sd_err <= SD_TOL
        _, peak = peak_rss_gib(reset)
        peak_text = "n/a" if peak is None else f"{peak:.2f} ({peak / data_gib:.1f}×)"
        row = (f"| {method} | {compile_s:.1f} | {wall - compile_s:.1f} | {wall:.1f} | {passes:,.1f} | {ess:,.0f} | "
               f"{mean_err:.3f} | {sd_err:.3f} | {'yes' if accurate else '**no**'} | "
               f"{f'{wall:.1f}' if accurate else '—'} | {peak_text} |")
        rows.append(row)
        print(row, flush=True)
        if method == "SGLD-CV":
            SPLIT["marginal_s_per_draw"] = marginal_cost()
            per_1000 = 1_000 * SPLIT["sampling_s"] / ess
            # ESS per draw of both chains: ess / 1,000 (1,000 draws per chain, ESS pooled over the 2 chains)
            marginal = 1e6 * SPLIT["marginal_s_per_draw"] / ess
            split = (f"SGLD-CV split: compile {SPLIT['compile_warmup_s']:.1f} s (warmup program) + "
                     f"{SPLIT['compile_sampling_s']:.1f} s (sampling loop); warmup and centre {SPLIT['warmup_s']:.1f} s "
                     f"({SPLIT['warmup_passes']:.1f} passes of SG steps + {SPLIT['centre_passes']:.1f} centre passes, "
                     f"one centre for both chains); sampling {SPLIT['sampling_s']:.2f} s ({SPLIT['sampling_passes']:.2f} passes): "
                     f"{per_1000:.2f} sampling s per 1,000 effective samples; the marginal cost of a draw (a "
                     f"continued run of 5,000 draws less this one of 1,000, which leaves out the per-run copy of the "
                     f"data): "
                     f"{1e3 * SPLIT['marginal_s_per_draw']:.3f} ms per draw of both chains, "
                     f"{marginal:.3f} s per 1,000 effective samples")
            notes.append(split)
            print(split, flush=True)
        jax.clear_caches()
    if args.doc:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        with open(args.doc, "w") as f:
            f.write(f"# Anchors: {args.likelihood}, N = {args.n:,}, D = {d}\n\n")
            f.write(f"`python benchmarks/anchors.py {' '.join(sys.argv[1:] if argv is None else argv)}` "
                    f"({stamp}; {platform.processor() or platform.machine()}, {jax.device_count()} "
                    f"{jax.default_backend()} device(s), jax {jax.__version__}, numpyro {numpyro.__version__}); "
                    "see the script's docstring for what each column measures.\n\n")
            f.write("\n".join(lines) + "\n" + "\n".join(rows) + "\n\n" + "\n\n".join(notes) + "\n")


if __name__ == "__main__":
    main()
