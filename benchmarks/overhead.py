"""What a user waits for besides sampling: tracing, lowering and compiling, per kernel, against a
hand-written pipeline of the same algorithm steps and against NUTS, in one process.

Problem: Bayesian logistic regression, float32, x ~ N(0, I/D), w_true ~ N(0, I), prior w ~ N(0, I),
N rows, D features, minibatch S; 2 chains (``chain_method="vectorized"``), ``jit_model_args=True``,
``progress_bar=False``.

For each kernel (ConstantSGD-full, SGFS, IASG, SGLD: each with its defaults and ``subsample_size``)
and each user flow

* ``run``: ``mcmc.run(key, X, y)`` (warmup and sampling in one call),
* ``warmup+run``: ``mcmc.warmup(key, X, y)`` then ``mcmc.run(key, X, y)``,

the seconds JAX reports for tracing (``/jax/core/compile/jaxpr_trace_duration``), lowering
(``jaxpr_to_mlir_module_duration``) and XLA compiling (``backend_compile_duration``), the number of
XLA programs compiled, the number of times the user's model function is called (traces), and wall
seconds. *Overhead* = trace + lower + compile seconds; *warmup* and *sampling* = the wall of the
warmup (init) part and of the sampling part, less their overhead.

The **pipeline** baseline does ConstantSGD-full's algorithm by hand, as three jitted ``lax.scan``
programs on the same NumPyro model (its potential from ``numpyro.infer.util.potential_energy`` with
the plate's indices substituted): (1) Adam over 40 % of the warmup steps; (2) per-example gradients
at fresh minibatches, averaged into the noise covariance Q; (3) sampling θ ← θ − P ∇Û_S with the
frozen P = 2 (Q + (S/N) Q)⁻¹. Its overhead is measured the same way.

**NUTS** (1,000 warmup + 1,000 samples, 2 chains, vectorized, full data): overhead and wall; its draws
are the accuracy reference. *Time to an accurate posterior* is a kernel's end-to-end wall when its run
(defaults, ``num_warmup`` 100, ``num_samples`` 500 per chain) has min bulk ESS ≥ 400, max |mean error|
≤ 0.15 NUTS sd and max sd error ≤ 10 % against NUTS; the ratio is NUTS's wall over it.

Every configuration is repeated ``--repeats`` times, interleaved (kernel A, B, ..., pipeline, then again),
each time with a new model function so that nothing is reused from an earlier compile; the table gives
the median. Before the first, one tiny run of each kernel (other shapes) takes the one-time costs of a
fresh process out of the first configuration's figures. Run::

    python benchmarks/overhead.py --n 100000 --d 10 --s 1000
    python benchmarks/overhead.py --n 1000000 --d 50 --s 10000 --repeats 1

and it writes ``docs/results/overhead_<n>_<d>.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import arviz
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from jax import lax, monitoring, random
from numpyro import handlers
from numpyro.infer import MCMC, NUTS
from numpyro.infer.util import potential_energy

from numpyro_sgd import IASG, SGFS, SGLD, ConstantSGD

EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "compile"}


class Clock:
    """Sums JAX's compile-path durations (jax.monitoring) and counts XLA compilations."""

    def __init__(self):
        self.totals = dict.fromkeys(EVENTS.values(), 0.0)
        self.programs = 0
        monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **_):
        name = EVENTS.get(event)
        if name is not None:
            self.totals[name] += duration
            self.programs += name == "compile"

    def read(self):
        return dict(self.totals, programs=self.programs)


def delta(after, before):
    return {k: after[k] - before[k] for k in after}


# --------------------------------------------------------------------------- problem
# the simulated logistic regression of benchmarks/benchmark_throughput.py (x ~ N(0, I/D), w ~ N(0, I))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmark_throughput import simulate  # noqa: E402


class Counted:
    """A fresh model function (nothing compiled for it yet) that counts its calls (traces)."""

    def __init__(self, d, subsample_size):
        self.calls, self.d, self.s = 0, d, subsample_size

    def __call__(self, X, y):
        self.calls += 1
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([self.d]).to_event(1))
        if self.s is None:
            numpyro.sample("y", dist.Bernoulli(logits=X @ w).to_event(1), obs=y)
            return
        with numpyro.plate("data", X.shape[0], subsample_size=self.s) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


KERNELS = {
    "ConstantSGD-full": lambda m, s: ConstantSGD(m, preconditioner="full", subsample_size=s),
    "SGFS": lambda m, s: SGFS(m, subsample_size=s),
    "IASG": lambda m, s: IASG(m, subsample_size=s),
    "SGLD": lambda m, s: SGLD(m, subsample_size=s),
}


def _block(mcmc):
    jax.block_until_ready((mcmc.get_samples(), mcmc.last_state))


def run_kernel(name, flow, args, clock, X, y, key, reference=None):
    model = Counted(args.d, args.s)
    mcmc = MCMC(KERNELS[name](model, args.s), num_warmup=args.num_warmup, num_samples=args.num_samples,
                num_chains=2, chain_method="vectorized", jit_model_args=True, progress_bar=False)
    rec = {"kernel": name, "flow": flow}
    c0, t0 = clock.read(), time.perf_counter()
    if flow == "run":
        # the init (with warmup) and the sampling loop are told apart by the traces' order: read
        # the clock when the kernel's init returns
        kernel = mcmc.sampler
        init = kernel.init
        marks = {}

        def timed_init(*a, **k):
            out = init(*a, **k)
            jax.block_until_ready(out)
            marks["clock"], marks["t"], marks["calls"] = clock.read(), time.perf_counter(), model.calls
            return out

        kernel.init = timed_init
        mcmc.run(key, X, y)
        _block(mcmc)
        del kernel.init
    else:
        mcmc.warmup(key, X, y)
        jax.block_until_ready(mcmc.post_warmup_state)
        marks = {"clock": clock.read(), "t": time.perf_counter(), "calls": model.calls}
        mcmc.run(random.fold_in(key, 1), X, y)
        _block(mcmc)
    c1, t1 = clock.read(), time.perf_counter()
    first, second = delta(marks["clock"], c0), delta(c1, marks["clock"])
    over1 = first["trace"] + first["lower"] + first["compile"]
    over2 = second["trace"] + second["lower"] + second["compile"]
    rec.update(trace=first["trace"] + second["trace"], lower=first["lower"] + second["lower"],
               compile=first["compile"] + second["compile"], programs=first["programs"] + second["programs"],
               overhead=over1 + over2, model_traces=model.calls, warmup_traces=marks["calls"],
               warmup=marks["t"] - t0 - over1, sampling=t1 - marks["t"] - over2, wall=t1 - t0,
               warmup_overhead=over1, sampling_overhead=over2)
    if reference is not None:
        rec.update(accuracy(mcmc, reference))
    return rec


def accuracy(mcmc, reference):
    w = np.asarray(mcmc.get_samples(group_by_chain=True)["w"], float)
    ess = min(float(arviz.ess(w[..., j], method="bulk")) for j in range(w.shape[-1]))
    flat = w.reshape(-1, w.shape[-1])
    mean_err = float(np.max(np.abs(flat.mean(0) - reference[0]) / reference[1]))
    sd_err = float(np.max(np.abs(flat.std(0, ddof=1) / reference[1] - 1)))
    return {"ess": ess, "mean_err": mean_err, "sd_err": sd_err,
            "accurate": ess >= 400 and mean_err <= 0.15 and sd_err <= 0.10}


# --------------------------------------------------------------------------- hand-written pipeline
def run_pipeline(args, clock, X, y, key):
    """ConstantSGD-full's steps by hand: Adam scan, per-example noise scan, sampling scan."""
    model = Counted(args.d, args.s)
    n, d, s = args.n, args.d, args.s
    steps_per_pass = -(-n // s)
    warmup_steps = args.warmup_passes * steps_per_pass
    adam_steps, noise_steps = int(0.4 * warmup_steps), warmup_steps - int(0.4 * warmup_steps)

    def potential(w, idx, X, y):
        m = handlers.substitute(model, data={"data": idx})
        return potential_energy(m, (X, y), {}, {"w": w})

    def draw(k):
        return random.randint(k, (s,), 0, n)

    grad = jax.value_and_grad(potential)
    adam = optax.adam(1e-2, b1=0.9, b2=0.9)

    @jax.jit
    def stage_adam(w, key, X, y):
        def step(carry, k):
            w, opt = carry
            _, g = grad(w, draw(k), X, y)
            upd, opt = adam.update(g, opt)
            return (optax.apply_updates(w, upd), opt), None

        (w, _), _ = lax.scan(step, (w, adam.init(w)), random.split(key, adam_steps))
        return w

    @jax.jit
    def stage_noise(w, key, X, y):
        def step(acc, k):
            idx = draw(k)
            per = jax.vmap(lambda i: grad(w, i[None], X, y)[1])(idx)  # rows of N-scaled gradients
            centred = per - per.mean(0)
            return acc + centred.T @ centred / (s - 1) / s, None

        q, _ = lax.scan(step, jnp.zeros((d, d), w.dtype), random.split(key, noise_steps // 8))
        q = q / (noise_steps // 8)
        return 2.0 * jnp.linalg.inv(q + (s / n) * q)

    @jax.jit
    def stage_sample(w, p, key, X, y):
        def block(w, k):
            def step(w, kk):
                _, g = grad(w, draw(kk), X, y)
                return w - p @ g, None

            w, _ = lax.scan(step, w, random.split(k, steps_per_pass))
            return w, w

        _, draws = lax.scan(block, w, random.split(key, args.num_samples))
        return draws

    c0, t0 = clock.read(), time.perf_counter()
    k1, k2, k3 = random.split(key, 3)
    w0 = jnp.zeros((2, d), jnp.float32)
    keys = random.split(k1, 2)
    # two chains, vectorized as the kernels run them
    w = jax.jit(jax.vmap(stage_adam, in_axes=(0, 0, None, None)))(w0, keys, X, y)
    p = jax.jit(jax.vmap(stage_noise, in_axes=(0, 0, None, None)))(w, random.split(k2, 2), X, y)
    jax.block_until_ready(p)
    cm, tm = clock.read(), time.perf_counter()
    draws = jax.jit(jax.vmap(stage_sample, in_axes=(0, 0, 0, None, None)))(w, p, random.split(k3, 2), X, y)
    jax.block_until_ready(draws)
    c1, t1 = clock.read(), time.perf_counter()
    first, second = delta(cm, c0), delta(c1, cm)
    over1 = first["trace"] + first["lower"] + first["compile"]
    over2 = second["trace"] + second["lower"] + second["compile"]
    return dict(kernel="pipeline", flow="3 programs", trace=first["trace"] + second["trace"],
                lower=first["lower"] + second["lower"], compile=first["compile"] + second["compile"],
                programs=first["programs"] + second["programs"], overhead=over1 + over2,
                model_traces=model.calls, warmup_traces=None, warmup=tm - t0 - over1, sampling=t1 - tm - over2,
                wall=t1 - t0, warmup_overhead=over1, sampling_overhead=over2)


# --------------------------------------------------------------------------- NUTS
def run_nuts(args, clock, X, y, key):
    model = Counted(args.d, None)
    mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=1000, num_chains=2, chain_method="vectorized",
                jit_model_args=True, progress_bar=False)
    c0, t0 = clock.read(), time.perf_counter()
    mcmc.run(key, X, y)
    _block(mcmc)
    c1, t1 = clock.read(), time.perf_counter()
    c = delta(c1, c0)
    w = np.asarray(mcmc.get_samples()["w"], float)
    rec = dict(kernel="NUTS", flow="run", trace=c["trace"], lower=c["lower"], compile=c["compile"],
               programs=c["programs"], overhead=c["trace"] + c["lower"] + c["compile"], model_traces=model.calls,
               warmup_traces=None, warmup=None, sampling=None, wall=t1 - t0)
    return rec, (w.mean(0), w.std(0, ddof=1))


def warm_up_the_process(args):
    """One tiny run of every kernel asked for (other shapes, so none of its programs is reused):
    the one-time costs of a fresh process (JAX's eager helpers, imports) are then not charged to
    whichever configuration happens to run first."""
    Xs, ys = simulate(2_000, 3, seed=1)
    for name in args.kernels:
        MCMC(KERNELS[name](Counted(3, 50), 50), num_warmup=5, num_samples=5, num_chains=2,
             chain_method="vectorized", jit_model_args=True, progress_bar=False).run(random.key(0), Xs, ys)


# --------------------------------------------------------------------------- report
COLUMNS = ["kernel", "flow", "trace", "lower", "compile", "overhead", "programs", "model_traces", "warmup_traces",
           "warmup", "sampling", "wall", "ess", "mean_err", "sd_err"]


def median_rows(records):
    groups = {}
    for r in records:
        groups.setdefault((r["kernel"], r["flow"]), []).append(r)
    rows = []
    for (kernel, flow), recs in groups.items():
        row = {"kernel": kernel, "flow": flow, "repeats": len(recs)}
        for k in recs[0]:
            if k in ("kernel", "flow"):
                continue
            vals = [r[k] for r in recs if r.get(k) is not None and not isinstance(r[k], (bool, str))]
            if vals:
                row[k] = statistics.median(vals)
        # the first repeat also pays the one-time compilations at these shapes (op-by-op work
        # JAX then caches for the process), which the median leaves out: a user's first run pays them
        row["first_overhead"] = recs[0].get("overhead")
        row["first_wall"] = recs[0].get("wall")
        row["accurate"] = all(r.get("accurate", True) for r in recs) if "accurate" in recs[0] else None
        rows.append(row)
    return rows


def fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def table(rows):
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join("| " + " | ".join(fmt(r.get(c)) for c in COLUMNS) + " |\n" for r in rows)


def environment():
    dev = jax.devices()[0]
    return (f"{datetime.date.today().isoformat()}, {platform.node()}, {os.cpu_count()} CPUs, "
            f"{dev.platform} ({getattr(dev, 'device_kind', '')}), Python {platform.python_version()}, "
            f"jax {jax.__version__}, numpyro {numpyro.__version__}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--s", type=int, default=1_000)
    ap.add_argument("--num-warmup", type=int, default=100)
    ap.add_argument("--num-samples", type=int, default=500)
    ap.add_argument("--warmup-passes", type=int, default=20, help="the pipeline's warmup (the kernels' default)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kernels", nargs="*", default=list(KERNELS))
    ap.add_argument("--flows", nargs="*", default=["run", "warmup+run"])
    ap.add_argument("--no-nuts", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", False)
    X, y = simulate(args.n, args.d)
    warm_up_the_process(args)
    clock = Clock()
    records, reference = [], None
    if not args.no_nuts:
        nuts, reference = run_nuts(args, clock, X, y, random.key(7))
        records.append(nuts)
        print(table([nuts]), flush=True)
    for r in range(args.repeats):
        for name in args.kernels:
            for flow in args.flows:
                rec = run_kernel(name, flow, args, clock, X, y, random.key(r), reference)
                records.append(rec)
                print(table([rec]).splitlines()[-1], flush=True)
        rec = run_pipeline(args, clock, X, y, random.key(r))
        records.append(rec)
        print(table([rec]).splitlines()[-1], flush=True)
    rows = median_rows(records)
    pipe = next(r for r in rows if r["kernel"] == "pipeline")
    nuts_row = next((r for r in rows if r["kernel"] == "NUTS"), None)
    lines = ["", "| kernel | flow | overhead / pipeline's | first run's overhead / pipeline's first | wall | "
             "first run's wall | NUTS wall / wall | NUTS wall / first run's wall | accurate |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kernel"] in ("pipeline", "NUTS"):
            continue
        speed = f"{nuts_row['wall'] / r['wall']:.2f}" if nuts_row else ""
        first_speed = f"{nuts_row['wall'] / r['first_wall']:.2f}" if nuts_row else ""
        lines.append(f"| {r['kernel']} | {r['flow']} | {r['overhead'] / pipe['overhead']:.2f} | "
                     f"{r['first_overhead'] / pipe['first_overhead']:.2f} | {r['wall']:.1f} | {r['first_wall']:.1f} | "
                     f"{speed} | {first_speed} | {r.get('accurate')} |")
    summary = "\n".join(lines)
    text = (f"# Overhead: N = {args.n:,}, D = {args.d}, S = {args.s:,}\n\n{environment()}\n\n"
            f"Command: `python benchmarks/overhead.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n\n"
            f"Medians of {args.repeats} interleaved repeats (seconds; NUTS once).\n\n{table(rows)}{summary}\n")
    print(text)
    out = args.out or f"docs/results/overhead_{args.n}_{args.d}.md"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print("wrote", out)


if __name__ == "__main__":
    main()
