"""EWSG paper (Li, Wang, Zha, Tao), Sec. 5.1 and Fig. 1: sampling a 2-D Gaussian with minibatches of one.

V(θ) = Σ_{i=1}^{50} ½‖θ − c_i‖², c_i ~ N(0, I₂), so the target is exactly N(mean(c), I/50). Every
method runs 30 data passes (per-datum gradients / N) with minibatch size 1 on many independent
chains (vectorized); at each recorded point the chains' current positions are fitted by a Gaussian
q and KL(p ‖ q) = ∫ p log(p/q) against the exact target p is reported (the paper's KL(p‖q); the
table also gives KL(q ‖ p)). The standard error of the final KL is a bootstrap over chains.

Settings of the paper: 10,000 chains; SGLD and pSGLD step 5e-3, SGHMC and EWSG step h = 5e-2 and
friction γ = 10 (σ² = 2γ); Fig. 1b compares the x of Eq. 4 at h = 7e-2; Fig. 1c compares the index
chain lengths M ∈ {0, 1, 9, 19} at equal data passes (M = 0 is SGHMC). SVRG-LD (Fig. 1a) is not
part of this package and is left out.

Choices where the paper is silent:

* **initialisation**: not stated in the paper; every chain starts from the kernels' default,
  θ ~ U(−2, 2)² (NumPyro's ``init_to_uniform``) and r ~ N(0, I). At 30 passes it is forgotten.
* **SGLD/pSGLD step sizes** are used as the ε of Welling & Teh and of Li et al. (2016)
  (θ ← θ − (ε/2) ∇Û + N(0, ε), this package's convention). The EWSG paper writes overdamped
  Langevin as θ − h∇V + √(2h) ξ (App. E); if its 5e-3 meant that h, our ε would be 1e-2
  (``--sgld-step-size 1e-2``).
* **x = 1** of Fig. 1b is read as the vector (1, 1).
* **extra rows**: App. F's EWSG-VR (L = 1 pass, data passes counted honestly: anchor gradients
  and full-data calibrations included) and App. E's overdamped EWSG (x = 0, SGLD's step).
  At the Fig. 1 step h = 5e-2, EWSG-VR's Euler step is unstable: its friction matrix Γ ≈
  (σ² + h·Var(n∇V_i))/2 ≈ 72 gives hΓ ≈ 3.6 > 2. It is therefore also run at h = 2e-2
  (hΓ ≈ 0.7), next to SGHMC and EWSG at that step (the ``vr`` panel).

Run (the paper's 10,000 chains: measured 6.5 minutes on 2 CPU cores that other jobs kept busy, mostly
compilation of the 17 configurations; ``--quick``, 2,000 chains: about 3 minutes)::

    python benchmarks/ewsg_gaussian.py
    python benchmarks/ewsg_gaussian.py --quick --out /tmp/ewsg

Output: the table (printed), ``ewsg_gaussian.md`` and the PNGs ``ewsg_fig1a.png``,
``ewsg_fig1b.png``, ``ewsg_fig1c.png``, ``ewsg_vr.png`` in ``--out`` (default ``docs/``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from numpyro_sgd import EWSG, EWSGVR, PSGLD, SGHMC, SGLD, OverdampedEWSG
from numpyro_sgd.diagnostics.compare import gaussian_kl
from numpyro_sgd.diagnostics.plots import plot_convergence
from numpyro_sgd.numerics.index_chain import index_acceptance_rate

N = 50
RECORD_EVERY = 20  # per-datum gradients between recorded points (0.4 passes); divisible by M + 1


def model(c):
    theta = numpyro.sample("theta", dist.ImproperUniform(dist.constraints.real_vector, (), (2,)))
    with numpyro.plate("data", c.shape[0], subsample_size=1) as idx:
        numpyro.sample("c", dist.Normal(theta, 1.0).to_event(1), obs=c[idx])


def run(name, make_kernel, evals_per_step, c, target, cfg, key):
    """Run ``cfg.chains`` chains for ``cfg.passes`` data passes, recording every RECORD_EVERY
    per-datum gradients (rounded to whole steps). Returns a result row and the KL curve."""
    steps_per_record = max(1, round(RECORD_EVERY / evals_per_step))
    num_records = int(np.ceil(cfg.passes * N / (steps_per_record * evals_per_step)))
    kernel = make_kernel(steps_per_record)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=num_records, num_chains=cfg.chains,
                chain_method="vectorized", progress_bar=False)
    t0 = time.perf_counter()
    mcmc.run(key, c, extra_fields=("data_passes",))
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["theta"])  # (chains, records, 2)
    seconds = time.perf_counter() - t0
    passes = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["data_passes"])[0]
    usable = np.all(np.abs(draws) < 1e6, axis=(0, 2))  # a diverged run (EWSG-VR at h = 5e-2) has KL = inf
    kls = np.array([gaussian_kl(target, draws[:, j]) if usable[j] else np.inf for j in range(draws.shape[1])])
    final = draws[:, -1]
    rng = np.random.default_rng(0)
    if usable[-1]:
        boot = [gaussian_kl(target, final[rng.integers(0, len(final), len(final))]) for _ in range(cfg.boot)]
        se, kl_qp = float(np.std(boot)), gaussian_kl(final, target)
        var_ratio = np.var(final, axis=0) * N
    else:
        se, kl_qp, var_ratio = np.nan, np.inf, np.array([np.inf, np.inf])
    state = mcmc.last_state
    rate = np.asarray(index_acceptance_rate(state)) if hasattr(state.kernel_state, "num_index_proposed") else None
    rate = float(np.mean(rate)) if rate is not None and not np.all(np.isnan(rate)) else np.nan
    row = dict(method=name, steps=int(state.i[0]), passes=float(passes[-1]), kl=float(kls[-1]), se=se,
               kl_qp=float(kl_qp), var_ratio=float(np.mean(var_ratio)), accept=rate,
               rejected=int(np.sum(state.num_divergences)), seconds=seconds)
    print(f"  {name:32s} KL(p‖q) {row['kl']:.4g} ± {se:.2g}  ({row['passes']:.1f} passes, "
          f"{row['steps']} steps, {seconds:.1f} s)", flush=True)
    return row, (passes, kls)


def fmt(x, spec=".4g"):
    if isinstance(x, float) and np.isnan(x):
        return "—"
    return format(x, spec)


def table(rows):
    head = ("| method | steps | data passes | KL(p‖q) ± SE | KL(q‖p) | var / target var | index acceptance | "
            "rejected steps | seconds |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['steps']} | {r['passes']:.1f} | {fmt(r['kl'])} ± {fmt(r['se'], '.2g')} | "
            f"{fmt(r['kl_qp'])} | {fmt(r['var_ratio'], '.3g')} | {fmt(r['accept'], '.3f')} | {r['rejected']} | "
            f"{r['seconds']:.1f} |"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chains", type=int, default=10_000, help="independent chains (paper: 10,000)")
    p.add_argument("--passes", type=float, default=30.0, help="data passes per run (paper: 30)")
    p.add_argument("--quick", action="store_true", help="2,000 chains")
    p.add_argument("--sgld-step-size", type=float, default=5e-3, help="ε of SGLD and pSGLD (paper: 5e-3)")
    p.add_argument("--boot", type=int, default=200, help="bootstrap resamples for the SE")
    p.add_argument("--seed", type=int, default=0, help="seed of the c_i and of the chains")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "results"))
    args = p.parse_args(argv)
    if args.quick:
        args.chains = 2000
    if args.chains < 2 or args.passes <= 0:
        p.error("--chains must be >= 2 and --passes > 0")
    return args


def main(argv=None):
    cfg = parse_args(argv)
    numpyro.enable_x64()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    c = np.random.default_rng(cfg.seed).standard_normal((N, 2))
    target = (c.mean(0), np.eye(2) / N)
    keys = iter(jax.random.split(jax.random.key(cfg.seed), 64))
    eps, h, gamma = cfg.sgld_step_size, 5e-2, 10.0
    print(f"EWSG Sec. 5.1: n = {N}, minibatch 1, {cfg.passes:g} passes, {cfg.chains} chains")

    def ewsg(step, m, **kw):
        return lambda k: EWSG(model, step_size=step, friction=gamma, num_index_steps=m, steps_per_sample=k, **kw)

    sections = {}
    print("Fig. 1a")
    a = [
        ("SGLD (ε = %g)" % eps, lambda k: SGLD(model, step_size=eps, steps_per_sample=k), 1),
        ("pSGLD (ε = %g)" % eps, lambda k: PSGLD(model, step_size=eps, steps_per_sample=k), 1),
        ("SGHMC (h = 5e-2)", lambda k: SGHMC(model, step_size=h, friction=gamma, steps_per_sample=k), 1),
        ("EWSG M = 1 (h = 5e-2)", ewsg(h, 1), 2),
        ("overdamped EWSG M = 1 (ε = %g)" % eps, lambda k: OverdampedEWSG(model, step_size=eps, num_index_steps=1,
                                                                          steps_per_sample=k), 2),
    ]
    sections["a"] = [run(name, mk, e, c, target, cfg, next(keys)) for name, mk, e in a]
    print("Fig. 1b (h = 7e-2, M = 1)")
    b = [(f"EWSG x = {x}", ewsg(7e-2, 1, x_estimate=x), 2) for x in ("momentum", "zero", "one", "stop")]
    sections["b"] = [run(name, mk, e, c, target, cfg, next(keys)) for name, mk, e in b]
    print("Fig. 1c (h = 5e-2)")
    sections["c"] = [(dict(sections["a"][2][0], method="EWSG M = 0 (= SGHMC)"), sections["a"][2][1]),
                     (dict(sections["a"][3][0], method="EWSG M = 1"), sections["a"][3][1])]
    sections["c"] += [run(f"EWSG M = {m}", ewsg(h, m), m + 1, c, target, cfg, next(keys)) for m in (9, 19)]
    print("App. F: EWSG-VR (L = 1)")
    vr = [
        ("EWSG-VR M = 1 (h = 5e-2)", lambda k: EWSGVR(model, step_size=h, friction=gamma, num_index_steps=1,
                                                      steps_per_sample=k), 5),
        ("SGHMC (h = 2e-2)", lambda k: SGHMC(model, step_size=2e-2, friction=gamma, steps_per_sample=k), 1),
        ("EWSG M = 1 (h = 2e-2)", ewsg(2e-2, 1), 2),
        ("EWSG-VR M = 1 (h = 2e-2)", lambda k: EWSGVR(model, step_size=2e-2, friction=gamma, num_index_steps=1,
                                                      steps_per_sample=k), 5),
        ("EWSG-VR M = 0 (h = 2e-2)", lambda k: EWSGVR(model, step_size=2e-2, friction=gamma, num_index_steps=0,
                                                      steps_per_sample=k), 3),
    ]
    # EWSG-VR's evals per step: (M + 2) S, plus N = 50 every ⌈N / ((M + 1) S)⌉ steps (amortised)
    sections["vr"] = [run(name, mk, e, c, target, cfg, next(keys)) for name, mk, e in vr]

    titles = {"a": "Fig. 1a: KL against data passes", "b": "Fig. 1b: choices of x (h = 7e-2, M = 1)",
              "c": "Fig. 1c: index chain length M (h = 5e-2, equal data passes)",
              "vr": "App. F: EWSG-VR (its passes include anchor gradients and calibrations)"}
    files = {"a": "ewsg_fig1a.png", "b": "ewsg_fig1b.png", "c": "ewsg_fig1c.png", "vr": "ewsg_vr.png"}
    md = [
        "# EWSG paper, Sec. 5.1 / Fig. 1: 2-D Gaussian, minibatch 1",
        "",
        f"Generated by `benchmarks/ewsg_gaussian.py` ({cfg.chains} chains, {cfg.passes:g} data passes, seed "
        f"{cfg.seed}). KL(p‖q): exact target p, Gaussian q fitted to the chains' positions at the end; SE: "
        f"bootstrap over chains ({cfg.boot} resamples). The Gaussian-fit bias is ≈ 2.5/chains = "
        f"{2.5 / cfg.chains:.1g}. `rejected steps`: steps the base refused because a value was not finite.",
        "",
    ]
    for key, rows in sections.items():
        print(f"\n{titles[key]}\n{table([r for r, _ in rows])}")
        curves = {r["method"]: (p, np.where(np.isfinite(k), k, np.nan)) for r, (p, k) in rows}
        plot_convergence(curves, out / files[key], ylabel="KL(p ‖ q)", logx=False, logy=True)
        md += [f"## {titles[key]}", "", table([r for r, _ in rows]), "", f"![{files[key]}]({files[key]})", ""]
    (out / "ewsg_gaussian.md").write_text("\n".join(md))
    print(f"\nwrote {out / 'ewsg_gaussian.md'} and the PNGs")


if __name__ == "__main__":
    main()
