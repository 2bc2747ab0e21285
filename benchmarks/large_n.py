"""N = 10⁷ rows on this machine: the large-N workflow as the docs write it, timed, with the cost of
a data pass against one NumPy read of the same array in the same process.

What runs (one process, in this order)
--------------------------------------
1. The data: a simulated GLM of ``benchmark_scaling.py`` (float32, rows i.i.d., so in random
   order), logistic with D = 50 or Poisson with D = 40 by default, and its Laplace reference
   (float64 Newton over row chunks; see that script for why it is accurate at this N), unless
   ``--skip-workflow``.
2. The workflow of ``docs/workflow.md`` with its defaults: ``ConstantSGD(model,
   preconditioner="full", subsample_size=S)``, ``MCMC(num_warmup=20, num_samples=A, num_chains=2,
   chain_method="sequential", jit_model_args=True)``, one ``mcmc.run``. Reported: the seconds JAX
   spends tracing, lowering and compiling (``CompileClock``), the rest of the wall split into warmup
   and sampling by the data passes of each phase (``SGState.data_passes``; a sequential run
   interleaves them per chain), the end-to-end wall, min bulk ESS and the largest mean and sd
   errors against the Laplace reference, and the peak resident memory of the run (``VmHWM`` after a
   reset) against the bytes of the data.
3. The cost of one chain's data pass in sampling for the minibatch laws: two ``mcmc.run`` calls of
   one chain (``warmup_passes=2``) from the same warmed-up state, of 2 and 12 draws one pass apart;
   the pass costs the difference of their sampling seconds (compile excluded) over the difference
   of their passes, so what every ``mcmc.run`` costs whatever its length (NumPyro's
   ``jit_model_args`` loop returns the data, so XLA copies them once per call) is reported apart,
   as the fixed cost of a run. Interleaved with ``X.sum(0)`` in NumPy (the streaming read of the
   data on the host) and with a jitted ``X.sum(0)`` on JAX's device (on a GPU, the read that a
   pass should be compared with); the medians of ``--repeats`` rounds are reported as ratios. The
   workflow's own seconds per chain-pass (its fixed costs spread over its 700–1,000 passes) are given
   against the same median reads.

    python benchmarks/large_n.py --likelihood logistic --d 50 --doc docs/results/large_n_logistic.md
    python benchmarks/large_n.py --likelihood poisson --d 40 --doc docs/results/large_n_poisson.md
"""

from __future__ import annotations

import argparse
import datetime
import gc
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import jax
import numpy as np
from benchmark_scaling import accuracy, laplace, make_model, reset_cell_peak, simulate
from benchmark_throughput import CompileClock, timed
from numpyro.infer import MCMC

from numpyro_sgd import IASG, SGFS, ConstantSGD
from numpyro_sgd.validation import DEFAULT_WARMUP_PASSES


def vm_hwm_gib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def workflow(model, data, s, num_samples, clock, key, draws_per_pass=None):
    """The docs' large-N workflow, one ``mcmc.run``: times, passes and the MCMC object. With
    ``draws_per_pass`` = k the draws are N/(k·S) steps apart instead of the kernel's default (one
    relaxation time, one pass at the KL-optimal preconditioner)."""
    # with steps_per_sample given, warmup_passes is given too: the same 20 warmup passes as the default
    steps = {} if draws_per_pass is None else {"steps_per_sample": math.ceil(data[0].shape[0] / (draws_per_pass * s)),
                                               "warmup_passes": DEFAULT_WARMUP_PASSES}
    kernel = ConstantSGD(model, preconditioner="full", subsample_size=s, **steps)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=num_samples, num_chains=2, chain_method="sequential",
                jit_model_args=True, progress_bar=False)
    reset = reset_cell_peak()
    _, wall, comp, _ = timed(lambda: (mcmc.run(key, *data, subsample_size=s),
                                      jax.block_until_ready((mcmc.get_samples(), mcmc.last_state))), clock)
    peak = vm_hwm_gib() if reset else float("nan")
    state = mcmc.last_state
    total_passes = float(np.sum(np.asarray(state.data_passes)))
    # warmup passes of each chain: 20 iterations of ⌈warmup_passes · N/S / 20⌉ steps
    warm_steps = 20 * kernel.warmup_steps_per_iteration
    warm_passes = 2 * warm_steps * s / data[0].shape[0]
    run_s = wall - comp
    rec = {"S": s, "cluster_size": kernel.potential.plates[0].cluster_size,
           "steps_per_sample": kernel.driver_options["steps_per_sample"]
           or int(np.max(np.asarray(state.kernel_state.steps_per_sample))),
           "num_samples": num_samples, "wall_s": wall, "compile_s": comp,
           "warmup_s": run_s * warm_passes / total_passes, "sampling_s": run_s * (1 - warm_passes / total_passes),
           "warmup_passes": warm_passes, "sampling_passes": total_passes - warm_passes, "peak_gib": peak}
    rec["s_per_chain_pass"] = rec["sampling_s"] / rec["sampling_passes"]
    return mcmc, rec


#: the streaming read of X by JAX on its default device (on a GPU, the read to compare a pass with)
DEVICE_READ = "jax X.sum(0) on the device"

#: the kernels whose data pass the comparison can time (``--kernels``): name → (class, options)
PASS_KERNELS = {
    "ConstantSGD-full": (ConstantSGD, dict(preconditioner="full")),
    "SGFS-full": (SGFS, dict(preconditioner="full")),
    "SGFS-full-offline": (SGFS, dict(preconditioner="full", online=False)),
    "SGFS-diag": (SGFS, dict(preconditioner="diag")),
    "IASG-full": (IASG, dict(preconditioner="full")),
}


def pass_cost(model, data, s, cluster_size, clock, key, kernel="ConstantSGD-full", draws=(2, 12)):
    """One chain's sampling seconds per data pass, its cluster size, and the fixed cost of a run.

    Two ``mcmc.run`` calls from the same ``post_warmup_state`` take ``draws`` = (a, b) draws of one
    pass each; the pass costs (t_b − t_a) / (passes_b − passes_a) (compile excluded). That
    difference cancels what a run costs whatever its length: NumPyro's collection loop returns the
    model arguments, so XLA writes a new copy of X at every run (0.35–0.5 s per GB into fresh
    pages on this CPU), which a short run would otherwise spread over its few passes. The fixed
    cost is t_a − (passes_a × the pass)."""
    n = data[0].shape[0]
    cls, options = PASS_KERNELS[kernel]
    # one draw per data pass (IASG: a window of N/S steps, its default)
    steps = {} if cls is IASG else {"steps_per_sample": math.ceil(n / s)}
    kernel = cls(model, **options, subsample_size=s, cluster_size=cluster_size, warmup_passes=2, **steps)
    mcmc = MCMC(kernel, num_warmup=2, num_samples=draws[0], num_chains=1, jit_model_args=True, progress_bar=False)
    mcmc.warmup(key, *data, subsample_size=s)
    jax.block_until_ready(mcmc.post_warmup_state)
    before = float(np.sum(np.asarray(mcmc.post_warmup_state.data_passes)))
    runs = []
    for num in draws:
        mcmc.num_samples = num
        _, wall, comp, _ = timed(lambda: (mcmc.run(key, *data, subsample_size=s),
                                          jax.block_until_ready(mcmc.last_state)), clock)
        runs.append((wall - comp, float(np.sum(np.asarray(mcmc.last_state.data_passes))) - before))
    (t_a, p_a), (t_b, p_b) = runs
    per_pass = (t_b - t_a) / (p_b - p_a)
    return per_pass, kernel.potential.plates[0].cluster_size, t_a - p_a * per_pass


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000_000)
    p.add_argument("--d", type=int, default=50)
    p.add_argument("--likelihood", choices=("logistic", "poisson"), default="logistic")
    p.add_argument("--s", type=int, default=10_000, help="subsample_size (the docs' CPU choice)")
    p.add_argument("--num-samples", type=int, default=300, help="draws per chain (default 300)")
    p.add_argument("--draws-per-pass", type=int, help="k draws per data pass (steps_per_sample = N/(k·S)); "
                   "default: the kernel's (one per relaxation time, about one pass)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of the pass-cost comparison")
    p.add_argument("--laws", nargs="+", default=["auto", "1"],
                   help="cluster sizes for the pass-cost comparison: 'auto' (the default law) or an int B")
    p.add_argument("--kernels", nargs="+", default=["ConstantSGD-full"], choices=list(PASS_KERNELS),
                   help="kernels for the pass-cost comparison (each with every law of --laws)")
    p.add_argument("--skip-workflow", action="store_true")
    p.add_argument("--doc", type=Path, help="write the results as Markdown here")
    args = p.parse_args(argv)
    lines = [f"# N = {args.n:,}: {args.likelihood} regression, D = {args.d}, on this machine", "",
             f"- command: `python benchmarks/large_n.py {shlex.join(sys.argv[1:] if argv is None else argv)}`",
             f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, JAX backend "
             f"{jax.default_backend()} ({jax.devices()[0].device_kind}); date "
             f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
             f"- versions: Python {platform.python_version()}, JAX {jax.__version__}", ""]

    def say(text=""):
        print(text, flush=True)
        lines.append(text)

    clock = CompileClock()
    t = time.perf_counter()
    X, y, _ = simulate(args.likelihood, args.n, args.d)
    data_gib = (X.nbytes + y.nbytes) / 2**30
    say(f"data: X {X.shape} float32 + y: {data_gib:.2f} GiB, simulated in {time.perf_counter() - t:.1f} s")
    if not args.skip_workflow:  # the reference is for the workflow's accuracy only
        mean, cov, info = laplace(args.likelihood, X, y)
        say(f"Laplace reference: {info['newton_iterations']} Newton steps, {info['seconds']:.1f} s")
        reference = (mean, cov)
    model = make_model(args.likelihood)
    data = (jax.device_put(X), jax.device_put(y))  # on the device once; the NumPy copies are dropped
    jax.block_until_ready(data)
    del X, y
    gc.collect()
    X = np.asarray(data[0])  # the same buffer, read by NumPy (no copy on CPU)
    say()
    if not args.skip_workflow:
        mcmc, rec = workflow(model, data, args.s, args.num_samples, clock, jax.random.key(0), args.draws_per_pass)
        passes = rec["warmup_passes"] + rec["sampling_passes"]
        acc = accuracy(mcmc, "ConstantSGD-full", reference, rec["wall_s"], passes)
        del mcmc
    laws = [None if law == "auto" else int(law) for law in args.laws]
    times = {"numpy X.sum(0)": [], DEVICE_READ: []}
    names = {}
    fixed_costs = {}
    device_sum = jax.jit(lambda a: a.sum(0))
    jax.block_until_ready(device_sum(data[0]))  # compiled once, outside the timing
    for r in range(args.repeats):
        t = time.perf_counter()
        X.sum(0)
        times["numpy X.sum(0)"].append(time.perf_counter() - t)
        t = time.perf_counter()
        jax.block_until_ready(device_sum(data[0]))
        times[DEVICE_READ].append(time.perf_counter() - t)
        for kern in args.kernels:
            for law in laws:
                cost, b, fixed = pass_cost(model, data, args.s, law, clock, jax.random.key(r + 1), kern)
                name = names.setdefault((kern, law), f"{kern}, "
                                        f"{'default law' if law is None else 'cluster_size=' + str(law)} (B = {b})")
                times.setdefault(name, []).append(cost)
                fixed_costs.setdefault(name, []).append(fixed)
    base = float(np.median(times["numpy X.sum(0)"]))
    device_base = float(np.median(times[DEVICE_READ]))
    if not args.skip_workflow:
        spacing = "defaults" if args.draws_per_pass is None else f"{args.draws_per_pass} draws per pass"
        say(f"## The workflow ({spacing}, 2 chains, sequential)")
        say()
        say("| S | B | steps per draw | draws per chain | compile s | warmup s | sampling s | end to end s | "
            "s per chain-pass (/ NumPy read, / JAX read) | min bulk ESS | max mean err (sd) | max sd err | peak GiB / data GiB |")
        say("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        say(f"| {rec['S']:,} | {rec['cluster_size']} | {rec['steps_per_sample']} | {rec['num_samples']} | "
            f"{rec['compile_s']:.1f} | {rec['warmup_s']:.1f} | {rec['sampling_s']:.1f} | {rec['wall_s']:.1f} | "
            f"{rec['s_per_chain_pass']:.4f} ({rec['s_per_chain_pass'] / base:.2f}×, "
            f"{rec['s_per_chain_pass'] / device_base:.2f}×) | {acc['min_ess_bulk']:.0f} | "
            f"{acc['max_mean_err_sd']:.3f} | "
            f"{acc['max_sd_rel_err']:.3f} | {rec['peak_gib']:.2f} / {data_gib:.2f} = "
            f"{rec['peak_gib'] / data_gib:.2f}× |")
        say()

    say(f"## Cost of one chain's data pass in sampling (median of {args.repeats} interleaved rounds)")
    say()
    say("| what | s per pass | / NumPy read | / JAX read on the device | / ConstantSGD-full's pass (same law) "
        "| fixed s per run |")
    say("|---|---|---|---|---|---|")
    for name, v in times.items():
        same = [key for key, n in names.items() if n == name]
        other = names.get(("ConstantSGD-full", same[0][1])) if same else None
        ratio = np.median(v) / float(np.median(times[other])) if other else float("nan")
        say(f"| {name} | {np.median(v):.4f} | {np.median(v) / base:.2f}× | {np.median(v) / device_base:.2f}× | "
            + ("— |" if np.isnan(ratio) else f"{ratio:.2f}× |")
            + (f" {np.median(fixed_costs[name]):.2f} |" if name in fixed_costs else " — |"))
    if args.doc:
        args.doc.parent.mkdir(parents=True, exist_ok=True)
        args.doc.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
