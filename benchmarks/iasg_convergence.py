"""Mandt, Hoffman & Blei (2017), Sec. 6.2 (arXiv v2 Sec. 7.2), Fig. 3–5: iterate averaging as approximate MCMC.

Reproduces the iterate-averaging study of *Stochastic Gradient Descent as Approximate Bayesian
Inference* (JMLR 18, 2017) with :class:`~numpyro_sgd.IASG` (the paper's Alg. 1):

* **problem** (as in the paper): Bayesian linear regression with data simulated from the model:
  N = 10,000 covariates x_n ~ N(0, I_D), D = 10, true weights from the prior w ~ N(0, I) (precision
  λ = 1), responses y_n ~ N(x_nᵀ w, σ²). The paper does not give σ²: **σ² = 1 here** (its loss
  ½ Σ (y_n − x_nᵀ w)², Eq. 50). The posterior is exactly Gaussian, precision A_U = XᵀX + I, so
  the truth (marginal variances = diag A_U⁻¹) is exact.
* **Fig. 3**: covariance of the SGD iterates vs the posterior vs the IASG samples, constant SGD
  with ε = 0.005, S = 1 and window T = N/S = 10⁴, started at the posterior mode (the paper does
  not say). The paper runs one chain of 10·D·N = 10⁶ iterations (100 averaged samples); here
  ``--fig3-chains`` = 32 chains of ``--fig3-windows`` = 25 windows (2.5·10⁵ iterations each) are
  pooled, 800 samples, at a quarter of the sequential cost (chain 0 alone is reported too).
  The "SGD iterates" are the chains' own iterates, one per
  window (the last iterate of each window, collected with
  ``extra_fields=("kernel_state.iterate",)``): consecutive ones are T = 10⁴ steps apart, far
  more than the relaxation time 1/(ελ) ≈ 200 steps, so they are independent draws of the
  iterates' stationary law.
* **Fig. 4 / 5**: smallest and largest posterior marginal variance estimated by each sampler vs
  the data passes it used, from the posterior mode ("MAP" init) and from random points ("random"
  init: independent N(0, I) draws, i.e. prior draws, ≈ 100 posterior sds from the mode), with
  one sd error bars over independent chains (all chains of a method run vectorized in one
  ``MCMC``; MAP and random chains together):

  ============================  ================================================================
  IASG (paper)                  ``IASG(model, step_size=0.003)``, S = 10, window T = N/S = 1000
                                (one sample per pass), no warmup (Alg. 1 as written)
  IASG (default ε)              ``IASG(model, preconditioner="scalar")``: ε from the curvature estimated in a
                                ``--iasg-warmup`` = 5 pass warmup (counted in the budget), set
                                for a 5 % variance shortfall (Eq. 46); an extra row, not in the paper
  SGLD                          ``SGLD(model, step_size=robbins_monro(1e-3, 1000, 0.5))``, S = 10
  NUTS                          NumPyro ``NUTS`` on the full data; warmup counted
  ============================  ================================================================

  **SGLD units.** Mandt's Eq. 32 is θ ← θ − (ε/2) N ∇L̂ + √ε V; N ∇L̂ = ∇Û_S is exactly the
  minibatch gradient of NumPyro's potential (a sum over the data), so :class:`~numpyro_sgd.SGLD`
  (θ ← θ − (ε/2) ∇Û_S + N(0, ε)) takes the paper's rates unchanged (as ``benchmarks/table1_kl.py``
  does): ε_t = ε₀/√(1000 + t), ε₀ = 10⁻³, t = the SG step count from 0 (1000 steps per pass),
  i.e. ``robbins_monro(scale=1e-3, offset=1000, power=0.5)``. SGLD returns every 100th iterate
  (10 draws per pass; its relaxation time 2/(ε_t λ_U) grows from 6 steps at the start to 100
  steps at pass 250 and 200 steps at pass 1000). No warmup (its burn-in is the discarded first
  10 passes below). ``--sgld-eps0`` changes ε₀.

  **NUTS.** A data pass is one leapfrog step (one full-data gradient); the per-draw leapfrog
  counts (``extra_fields=("num_steps",)``) of warmup and sampling are both counted. Not counted:
  the few gradients of each of NumPyro's step-size searches (``find_reasonable_step_size``, at
  the start and at the end of each adaptation window: three per chain). Warmup:
  ``--nuts-warmup`` = 50 draws of step-size adaptation (dual averaging, target acceptance 0.8),
  **identity mass matrix** (``adapt_mass_matrix=False``): X has unit covariance, so the posterior
  is isotropic to within O(√(D/N)) and the identity is already the right metric; NumPyro's
  diagonal adaptation from so short a warmup made NUTS slower in trials (longer warmup, deeper
  trees). ``--nuts-adapt-mass`` turns it on. Chains run vectorized (lock step); each chain's
  passes are its own leapfrog count. Row "NUTS" uses the post-warmup draws only (standard
  practice); row "NUTS (+warmup draws)" also uses the warmup draws, like the SG samplers, which
  use every draw from their start.

  **Metric** (the paper's): for a budget of b passes, each chain's estimate of the smallest and
  largest marginal variance is the min / max over the D coordinates of the sample variance
  (ddof = 1) of that chain's draws made after pass 10 and by pass b ("we excluded the first 10
  iterations": one IASG iteration is one pass, so the burn-in is 10 passes for every method).
  The table gives the error relative to the truth, mean ± standard error over chains, the sd
  over chains (the paper's error bars) and the RMS error over chains (bias and spread together),
  and the comparison "does IASG converge faster than SGLD and NUTS" uses the RMS error.

**Theory rows.** Eq. 45 of the paper (:func:`~numpyro_sgd.numerics.theory.iasg_covariance`, exact Hessian,
assumption A5) predicts the IASG samples' covariance; with ε = 0.003, S = 10, T = 1000 and
λ(A) ≈ 1, ε T λ ≈ 3 and the predicted variance shortfall is (1 − e⁻³)/3 ≈ 32 % in every direction
(outside the validity window of Eq. 46–47). Next to it: the exact law of the average of T iterates
of the linear recursion with the exact gradient noise at the mode
(:func:`~numpyro_sgd.numerics.theory.iterate_average_covariance`), and for SGLD the stationary covariance
of constant-ε SGLD at the schedule's last ε (discrete Lyapunov equation; the decreasing schedule is
never stationary, this is what its estimate would drift towards if ε stopped decreasing).

**Scaled down** (2 shared CPU cores): the paper runs 10³·D = 10⁴ passes with 100 chains. The
default here is ``--passes 300`` with ``--chains 16`` per initialisation (32 chains per method);
``docs/results/iasg_results.md`` and the figures in ``docs`` were made with ``--passes 1000`` (same
seeds: its numbers up to 300 passes are those of the default run). On CPU an SG step of 32
vectorized chains costs little more than one of a single chain, so the cost grows with the
passes far more than with the chains.
``--quick`` (smoke test): 40 passes, 4 chains per init, Fig. 3 4 chains × 5 windows, 10 NUTS
warmup draws. Float64 (``numpyro.enable_x64()``).

Runtime, measured on 2 CPU cores shared with other jobs (load average ≈ 6): default 6.6 min
(3.6 min CPU), ``--passes 1000`` 13–20 min, ``--quick`` 2–3 min; about 20 s of each IASG run
(three per invocation) is XLA compilation, which the persistent cache (``.jax_cache``) cannot
keep because the IASG program contains a host callback (its validity warning)::

    python benchmarks/iasg_convergence.py --out /tmp/iasg   # default: 300 passes
    python benchmarks/iasg_convergence.py --passes 1000      # docs/results/iasg_fig{3,4,5}.png, docs/results/iasg_results.md
    python benchmarks/iasg_convergence.py --quick            # smoke test, to examples/output/iasg_quick

Output: the tables (printed) and, in ``--out`` (default ``docs``; with ``--quick``
``examples/output/iasg_quick``), ``iasg_fig3.png`` (heat maps),
``iasg_fig4.png`` (min / max marginal variance vs passes), ``iasg_fig5.png`` (one chain's
covariance estimate per method) and ``iasg_results.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import scipy.linalg
from numpyro.infer import MCMC, NUTS

from numpyro_sgd import IASG, SGLD, robbins_monro
from numpyro_sgd.numerics.theory import iasg_covariance, iterate_average_covariance, window_error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from table1_kl import _positive_int  # noqa: E402  (the argparse type both benchmarks use)

numpyro.enable_x64()
# reruns skip most of the compilation (the cache folder is git-ignored)
jax.config.update("jax_compilation_cache_dir", os.environ.get(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".jax_cache")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

N, D = 10_000, 10
PRIOR_PRECISION = 1.0  # λ of the paper
NOISE_VAR = 1.0  # σ², not given in the paper
FIG3_S, FIG3_EPS = 1, 0.005  # Fig. 3: S = 1, ε = 0.005, window N/S
S, IASG_EPS = 10, 0.003  # Fig. 4: S = 10, ε = 0.003, window N/S
SGLD_EPS0, SGLD_OFFSET, SGLD_POWER = 1e-3, 1000.0, 0.5  # ε_t = ε₀ / √(1000 + t)
SGLD_STEPS_PER_DRAW = 100
BURN_IN_PASSES = 10  # "we excluded the first 10 iterations"
TABLE_BUDGETS = (20, 30, 100, 300, 1000, 3000, 10_000)
REFERENCE_CHAINS = 1000
REFERENCE_NAME = f"exact i.i.d. draws, 1 per pass ({REFERENCE_CHAINS} chains)"
REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


# ---------------------------------------------------------------------------- problem
def model(X, y, subsample_size=None):
    """y_n ~ N(x_nᵀ w, σ²), w ~ N(0, I/λ); ``subsample_size=None`` is the full-data model (NUTS)."""
    w = numpyro.sample("w", dist.Normal(0.0, PRIOR_PRECISION**-0.5).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, math.sqrt(NOISE_VAR)), obs=y[idx])


def simulate(seed):
    """The paper's data: X ~ N(0, I), w from the prior, y from the model."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D))
    w = rng.standard_normal(D) / math.sqrt(PRIOR_PRECISION)
    y = X @ w + math.sqrt(NOISE_VAR) * rng.standard_normal(N)
    return X, y, w


def exact_posterior(X, y):
    """Precision A_U = XᵀX/σ² + λI (the Hessian of the potential), mean and covariance A_U⁻¹."""
    hessian = X.T @ X / NOISE_VAR + PRIOR_PRECISION * np.eye(X.shape[1])
    cov = np.linalg.inv(hessian)
    mean = cov @ (X.T @ y) / NOISE_VAR
    return mean, 0.5 * (cov + cov.T), hessian


def gradient_noise(X, y, w, batch_size):
    """Exact covariance Q of the minibatch gradient ∇Û_S at w (indices drawn with replacement):
    Q = N² Cov_n[∇ℓ_n] / S, ℓ_n = (y_n − x_nᵀw)²/(2σ²) + λ|w|²/(2N)."""
    g = -X * ((y - X @ w) / NOISE_VAR)[:, None] + PRIOR_PRECISION * w / X.shape[0]
    return X.shape[0] ** 2 * np.cov(g.T, bias=True) / batch_size


# ---------------------------------------------------------------------------- runs
def _vectorized_mcmc(kernel, num_warmup, num_samples, num_chains, thinning=1):
    return MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method="vectorized", progress_bar=False, thinning=thinning)


def run_sg(kernel, key, data, init, num_warmup, num_samples, batch_size, extra=()):
    """Vectorized SG chains; returns draws (C, n, D), the data passes at each draw (C, n), the MCMC."""
    X, y = data
    mcmc = _vectorized_mcmc(kernel, num_warmup, num_samples, init.shape[0])
    mcmc.run(key, X, y, subsample_size=batch_size, init_params={"w": jnp.asarray(init)},
             extra_fields=("data_passes",) + tuple(extra))
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    passes = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["data_passes"], dtype=float)
    return draws, passes, mcmc


def run_nuts(key, data, init, num_warmup, num_passes, adapt_mass, chunk=25):
    """Full-data NUTS, vectorized; warmup draws kept (with their leapfrog counts), then sampling in
    chunks of ``chunk`` draws until every chain has used ``num_passes`` leapfrog steps."""
    X, y = data
    c = init.shape[0]
    mcmc = _vectorized_mcmc(NUTS(model, adapt_mass_matrix=adapt_mass), num_warmup, chunk, c)
    mcmc.warmup(key, X, y, init_params={"w": jnp.asarray(init)}, collect_warmup=True,
                extra_fields=("num_steps", "diverging"))
    fields = mcmc.get_extra_fields(group_by_chain=True)
    draws = [np.asarray(mcmc.get_samples(group_by_chain=True)["w"])]
    steps = [np.asarray(fields["num_steps"], dtype=float)]
    divergent = [np.asarray(fields["diverging"])]
    warm_passes = steps[0].sum(axis=1)
    while np.min(sum(s.sum(axis=1) for s in steps)) < num_passes or len(steps) == 1:
        mcmc.run(mcmc.post_warmup_state.rng_key, X, y, extra_fields=("num_steps", "diverging"))
        fields = mcmc.get_extra_fields(group_by_chain=True)
        draws.append(np.asarray(mcmc.get_samples(group_by_chain=True)["w"]))
        steps.append(np.asarray(fields["num_steps"], dtype=float))
        divergent.append(np.asarray(fields["diverging"]))
        mcmc.post_warmup_state = mcmc.last_state
    draws = np.concatenate(draws, axis=1)
    passes = np.cumsum(np.concatenate(steps, axis=1), axis=1)
    sampling = np.arange(draws.shape[1]) >= num_warmup
    info = {"warmup_passes": warm_passes, "num_draws": draws.shape[1] - num_warmup,
            "post_warmup_steps_per_draw": float(np.mean(np.concatenate(steps[1:], axis=1))),
            "divergences": int(np.sum(np.concatenate(divergent, axis=1)[:, num_warmup:])),
            "step_size": np.asarray(mcmc.last_state.adapt_state.step_size)}
    return draws, passes, sampling, info


# ---------------------------------------------------------------------------- metric
def variance_curves(draws, passes, budgets, usable=None, burn_in=BURN_IN_PASSES):
    """Per chain and budget b: the sample variances (ddof 1) of each coordinate over the chain's
    usable draws made after pass ``burn_in`` and by pass b. Returns (C, B, D), NaN with < 2 draws."""
    c, n, d = draws.shape
    usable = np.ones((c, n), bool) if usable is None else np.broadcast_to(usable, (c, n))
    out = np.full((c, len(budgets), d), np.nan)
    for i in range(c):
        keep = usable[i] & (passes[i] > burn_in)
        xs, ps = draws[i][keep], passes[i][keep]
        xs = xs - (xs.mean(axis=0) if len(xs) else 0.0)  # centred for the running sums' accuracy
        s1 = np.concatenate([np.zeros((1, d)), np.cumsum(xs, axis=0)])
        s2 = np.concatenate([np.zeros((1, d)), np.cumsum(xs**2, axis=0)])
        for j, b in enumerate(budgets):
            m = int(np.searchsorted(ps, b, side="right"))  # draws made by pass b
            if m >= 2:
                out[i, j] = (s2[m] - s1[m] ** 2 / m) / (m - 1)
    return out


def summarize(var, truth_min, truth_max):
    """Relative errors of the per-chain min / max marginal variances: mean, sd, SE, RMS over chains
    (chains without an estimate yet are left out; NaN where none has one)."""
    res = {}
    for name, est, truth in (("min", np.min(var, axis=-1), truth_min), ("max", np.max(var, axis=-1), truth_max)):
        rel = est / truth - 1.0  # (C, B)
        ok = np.isfinite(rel)
        n = ok.sum(axis=0)
        r0 = np.where(ok, rel, 0.0)
        mean = np.where(n > 0, r0.sum(axis=0) / np.maximum(n, 1), np.nan)
        dev = np.where(ok, rel - np.nan_to_num(mean), 0.0)
        sd = np.where(n > 1, np.sqrt((dev**2).sum(axis=0) / np.maximum(n - 1, 1)), np.nan)
        rms = np.where(n > 0, np.sqrt((r0**2).sum(axis=0) / np.maximum(n, 1)), np.nan)
        res[name] = {"est_mean": truth * (1.0 + mean), "est_sd": truth * sd, "mean": mean, "sd": sd,
                     "se": sd / np.sqrt(np.maximum(n, 1)), "rms": rms, "chains": n}
    return res


def rel_frobenius(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def wishart_rms(cov, n):
    """RMS relative Frobenius error of the sample covariance of n independent N(0, cov) draws."""
    return float(np.sqrt((np.trace(cov) ** 2 + np.trace(cov @ cov)) / n) / np.linalg.norm(cov))


def sgld_stationary(step_size, hessian, q):
    """Stationary covariance of θ ← θ − (ε/2)(∇U + ξ) + N(0, ε), ξ ~ N(0, Q) (discrete Lyapunov)."""
    m = np.eye(len(hessian)) - 0.5 * step_size * hessian
    return scipy.linalg.solve_discrete_lyapunov(m, step_size * np.eye(len(hessian)) + 0.25 * step_size**2 * q)


# ---------------------------------------------------------------------------- figures
def plot_fig3(iter_cov, post, iasg_cov, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = [(iter_cov, "(a) SGD iterates"), (post, "(b) posterior"), (iasg_cov, "(c) IASG samples")]
    for ax, (mat, title) in zip(axes, panels):
        im = ax.imshow(mat, cmap="viridis")
        ax.set_title(f"{title}\ntrace / trace(posterior) = {np.trace(mat) / np.trace(post):.3g}", fontsize=10)
        ax.set_xticks(range(D))
        ax.set_yticks(range(D))
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(f"Mandt et al. Fig. 3: constant SGD, S = {FIG3_S}, ε = {FIG3_EPS}, window N/S = {N // FIG3_S}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fig4(methods, budgets, truth, predictions, reference, nuts_warmup, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    names = list(methods)
    x = np.asarray(budgets, dtype=float)
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 2.5 * len(names) + 0.8), sharex=True, squeeze=False)
    colors = {"min": "goldenrod", "max": "tab:blue"}
    for r, name in enumerate(names):
        for c, init in enumerate(("MAP", "random")):
            ax = axes[r, c]
            res = methods[name][init]
            for key, color in colors.items():
                m, s = res[key]["est_mean"], res[key]["est_sd"]
                lower = np.where(m - s > 0, m - s, m / 10)  # log axis: clip where mean − sd <= 0
                ax.plot(x, m, color=color, lw=1.5)
                ax.fill_between(x, lower, m + s, color=color, alpha=0.25, lw=0)
                ax.plot(x, reference[key]["est_mean"], color=color, ls=":", lw=1)
                ax.axhline(truth[key], color="red", lw=1.2)
                if name in predictions:
                    ax.axhline(predictions[name][init][key], color=color, ls="--", lw=1)
            if name.startswith("NUTS") and nuts_warmup[init] <= x[-1]:
                ax.axvline(nuts_warmup[init], color="gray", ls="-.", lw=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
            lo, hi = ax.get_ylim()
            ax.set_ylim(max(lo, truth["min"] / 100), hi)  # a 2-draw estimate can be ~0: keep the truth readable
            ax.set_title(f"{name}, {init} init", fontsize=10)
            if r == len(names) - 1:
                ax.set_xlabel("data passes")
            if c == 0:
                ax.set_ylabel("marginal variance")
    handles = [Line2D([], [], color=colors["min"], lw=1.5, label="smallest marginal variance: mean ± sd over chains"),
               Line2D([], [], color=colors["max"], lw=1.5, label="largest marginal variance: mean ± sd over chains"),
               Line2D([], [], color="red", lw=1.2, label="truth (exact posterior)"),
               Line2D([], [], color="gray", ls="--", lw=1, label="IASG: Eq. 45 prediction"),
               Line2D([], [], color="gray", ls=":", lw=1, label="exact i.i.d. draws, one per pass (reference)"),
               Line2D([], [], color="gray", ls="-.", lw=1, label="NUTS: mean warmup passes")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("Mandt et al. Fig. 4: smallest / largest marginal variance vs data passes "
                 "(band lower edge clipped at mean/10 where mean − sd ≤ 0)", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_fig5(covs, post, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(covs)
    lim = float(np.max(np.abs(post)))
    fig, axes = plt.subplots(2, len(names) + 1, figsize=(2.6 * (len(names) + 1), 6.2), squeeze=False)
    for r, init in enumerate(("MAP", "random")):
        axes[r, 0].imshow(post, cmap="RdBu_r", vmin=-lim, vmax=lim)
        axes[r, 0].set_title(f"posterior\n({init} init row)", fontsize=9)
        for c, name in enumerate(names, start=1):
            mat = covs[name][init]
            axes[r, c].imshow(mat, cmap="RdBu_r", vmin=-lim, vmax=lim)
            err = rel_frobenius(mat, post) if np.all(np.isfinite(mat)) else math.nan
            axes[r, c].set_title(f"{name}, {init}\nrel. Frobenius err {err:.2f}", fontsize=9)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("Mandt et al. Fig. 5: one chain's covariance estimate at the full budget "
                 "(common colour scale = posterior's; values beyond it saturate)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------- tables
def _pct(x):
    return "—" if not np.isfinite(x) else f"{100 * x:+.1f}"


def _pct_abs(x):
    return "—" if not np.isfinite(x) else f"{100 * x:.1f}"


def results_table(methods, budgets, table_budgets, draws_at, reference):
    head = ["method", "init", "passes", "draws/chain", "min var: err % (mean ± SE)", "sd %", "RMS %",
            "max var: err % (mean ± SE)", "sd %", "RMS %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(name, init, res, b, draws):
        j = budgets.index(b)
        cells = [name, init, str(b), draws[j]]
        for key in ("min", "max"):
            r = res[key]
            cells += [f"{_pct(r['mean'][j])} ± {_pct_abs(r['se'][j])}" if np.isfinite(r["mean"][j]) else "—",
                      _pct_abs(r["sd"][j]), _pct_abs(r["rms"][j])]
        lines.append("| " + " | ".join(cells) + " |")

    for init in ("MAP", "random"):
        for name, per_init in methods.items():
            for b in table_budgets:
                row(name, init, per_init[init], b, draws_at[name][init])
    for b in table_budgets:
        row(REFERENCE_NAME, "—", reference, b, [str(max(bb - BURN_IN_PASSES, 0)) for bb in budgets])
    return "\n".join(lines)


def verdict_lines(methods, budgets, table_budgets, iasg_name, others):
    """Per budget, random init: is IASG's RMS error below every other method's, for min and max?"""
    lines = []
    for b in table_budgets:
        j = budgets.index(b)
        parts, wins = [], []
        for key in ("min", "max"):
            vals = {n: methods[n]["random"][key]["rms"][j] for n in [iasg_name, *others]}
            parts.append(f"{key} var RMS % " + ", ".join(f"{n} {_pct_abs(v)}" for n, v in vals.items()))
            mine = vals[iasg_name]
            wins.append(np.isfinite(mine) and all(not np.isfinite(v) or mine < v for v in
                                                  (vals[n] for n in others)))
        answer = "yes (both)" if all(wins) else ("no" if not any(wins) else
                                                 f"only for the {'min' if wins[0] else 'max'} variance")
        lines.append(f"* {b} passes: {iasg_name} lowest RMS error: **{answer}** — " + "; ".join(parts))
    return lines


# ---------------------------------------------------------------------------- CLI
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=_positive_int, help="data-pass budget of Fig. 4 (default 300; quick 40)")
    parser.add_argument("--chains", type=_positive_int, help="chains per initialisation (default 16; quick 4)")
    parser.add_argument("--fig3-chains", type=_positive_int, help="Fig. 3 chains (default 32; quick 4)")
    parser.add_argument("--fig3-windows", type=_positive_int,
                        help="Fig. 3 averaged samples (windows of N steps) per chain (default 25; quick 5; "
                             "the paper: 100, i.e. 10⁶ iterations)")
    parser.add_argument("--nuts-warmup", type=_positive_int, help="NUTS warmup draws (default 50; quick 10)")
    parser.add_argument("--nuts-adapt-mass", action="store_true", help="adapt NUTS's diagonal mass matrix in warmup")
    parser.add_argument("--iasg-warmup", type=_positive_int, default=5,
                        help="warmup passes of the default-ε IASG (counted in its budget; default 5)")
    parser.add_argument("--sgld-eps0", type=float, default=SGLD_EPS0,
                        help="ε₀ of SGLD's ε_t = ε₀/√(1000 + t), NumPyro potential units (default: the paper's 1e-3)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test (about a minute with a warm compilation cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="folder for the PNGs and iasg_results.md (default docs/; with --quick "
                        "examples/output/iasg_quick/)")
    args = parser.parse_args(argv)
    q = args.quick
    args.passes = args.passes or (40 if q else 300)
    args.chains = args.chains or (4 if q else 16)
    args.fig3_chains = args.fig3_chains or (4 if q else 32)
    args.fig3_windows = args.fig3_windows or (5 if q else 25)
    args.nuts_warmup = args.nuts_warmup or (10 if q else 50)
    args.out = args.out or (os.path.join(REPO, "examples", "output", "iasg_quick") if q else os.path.join(REPO, "docs", "results"))
    if args.passes <= BURN_IN_PASSES + 2:
        parser.error(f"--passes must exceed {BURN_IN_PASSES + 2} (the first {BURN_IN_PASSES} passes are burn-in)")
    if not args.sgld_eps0 > 0:
        parser.error("--sgld-eps0 must be > 0")
    if args.iasg_warmup >= args.passes:
        parser.error("--iasg-warmup must be smaller than --passes")
    return args


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    timings = {}
    os.makedirs(args.out, exist_ok=True)
    command = " ".join(["python benchmarks/iasg_convergence.py", *(sys.argv[1:] if argv is None else argv)])
    X_np, y_np, w_true = simulate(args.seed)
    mean, post, hessian = exact_posterior(X_np, y_np)
    lam = np.linalg.eigvalsh(hessian / N)  # eigenvalues of Mandt's A = A_U / N
    truth = {"min": float(np.min(np.diag(post))), "max": float(np.max(np.diag(post)))}
    data = (jnp.asarray(X_np), jnp.asarray(y_np))
    key_fig3, key_iasg, key_default, key_sgld, key_nuts, key_init = jax.random.split(jax.random.key(args.seed), 6)
    c = args.chains
    rng = np.random.default_rng(args.seed + 1)
    init = np.concatenate([np.tile(mean, (c, 1)), rng.standard_normal((c, D))])  # MAP chains, then random
    inits = {"MAP": slice(0, c), "random": slice(c, 2 * c)}
    print(f"problem: linear regression, N = {N}, D = {D}, λ = {PRIOR_PRECISION}, σ² = {NOISE_VAR} (not given in "
          f"the paper); eig(A = A_U/N) in [{lam[0]:.3f}, {lam[-1]:.3f}]; true marginal variances "
          f"min {truth['min']:.4g}, max {truth['max']:.4g}")
    print(f"config: {args.passes} passes, {c} chains per init (MAP, random), Fig. 3 {args.fig3_chains} chains × "
          f"{args.fig3_windows} windows, NUTS warmup {args.nuts_warmup} draws "
          f"({'diag' if args.nuts_adapt_mass else 'identity'} mass), float64", flush=True)

    # ------------------------------------------------------------ Fig. 3
    t0 = time.perf_counter()
    fig3_kernel = IASG(model, step_size=FIG3_EPS)
    fig3_draws, _, fig3_mcmc = run_sg(fig3_kernel, key_fig3, data, np.tile(mean, (args.fig3_chains, 1)), 0,
                                      args.fig3_windows, FIG3_S, extra=("kernel_state.iterate",))
    iterates = np.asarray(fig3_mcmc.get_extra_fields(group_by_chain=True)["kernel_state.iterate"])
    timings["Fig. 3 (IASG, S = 1)"] = time.perf_counter() - t0
    pooled = fig3_draws.reshape(-1, D)
    iasg_cov3 = np.cov(pooled.T)
    iter_cov3 = np.cov(iterates.reshape(-1, D).T)
    chain0_cov3 = np.cov(fig3_draws[0].T)
    eq45_fig3 = iasg_covariance(hessian, N, FIG3_S, FIG3_EPS)
    q1 = gradient_noise(X_np, y_np, mean, FIG3_S)
    exact_fig3 = iterate_average_covariance(FIG3_EPS / N, hessian, q1, N // FIG3_S)
    fig3 = {
        "samples": pooled.shape[0],
        "err_pooled": rel_frobenius(iasg_cov3, post),
        "err_chain0": rel_frobenius(chain0_cov3, post),
        "wishart_pooled": wishart_rms(post, pooled.shape[0]),
        "wishart_chain0": wishart_rms(post, fig3_draws.shape[1]),
        "err_eq45_vs_post": rel_frobenius(eq45_fig3, post),
        "err_exact_vs_post": rel_frobenius(exact_fig3, post),
        "err_vs_exact": rel_frobenius(iasg_cov3, exact_fig3),
        "iter_scale": float(np.trace(iter_cov3) / np.trace(post)),
        "iter_scale_theory": D * FIG3_EPS / (2 * FIG3_S) / float(np.trace(post)),
        "window_product": FIG3_EPS * (N / FIG3_S) * lam[0],
        "divergences": int(np.sum(np.asarray(fig3_mcmc.last_state.num_divergences))),
    }
    fig3_lines = [
        f"* {args.fig3_chains} chains × {args.fig3_windows} windows of T = {N // FIG3_S} SGD steps (S = {FIG3_S}, "
        f"ε = {FIG3_EPS}), MAP init; ε T λ_min = {fig3['window_product']:.1f}, Eq. 45 shortfall along λ_min "
        f"{100 * window_error(fig3['window_product']):.1f} %; {fig3['divergences']} rejected steps",
        f"* IASG samples vs posterior, relative Frobenius error: pooled ({fig3['samples']} samples) "
        f"**{fig3['err_pooled']:.3f}** (sampling-noise RMS for as many independent draws "
        f"{fig3['wishart_pooled']:.3f}); chain 0 alone ({fig3_draws.shape[1]} samples) "
        f"{fig3['err_chain0']:.3f} (noise RMS {fig3['wishart_chain0']:.3f})",
        f"* predicted deviation from the posterior: Eq. 45 {fig3['err_eq45_vs_post']:.3f}, exact linear recursion "
        f"with the exact gradient noise {fig3['err_exact_vs_post']:.3f}; IASG samples vs the exact prediction "
        f"{fig3['err_vs_exact']:.3f}",
        f"* SGD iterates: trace(cov) / trace(posterior) = **{fig3['iter_scale']:.1f}** (Eq. 43: one iterate has "
        f"covariance ε/(2S)·I, i.e. {fig3['iter_scale_theory']:.1f} × the posterior's trace); "
        f"{iterates.shape[0] * iterates.shape[1]} iterates, one per window",
    ]
    print("\n== Fig. 3\n" + "\n".join(fig3_lines), flush=True)
    plot_fig3(iter_cov3, post, iasg_cov3, os.path.join(args.out, "iasg_fig3.png"))

    # ------------------------------------------------------------ Fig. 4 / 5
    budgets = sorted({int(round(b)) for b in np.geomspace(BURN_IN_PASSES + 2, args.passes, 40)}
                     | {b for b in TABLE_BUDGETS if b <= args.passes} | {args.passes})
    table_budgets = sorted({b for b in TABLE_BUDGETS if b <= args.passes} | {args.passes})
    runs = {}  # name -> (draws, passes, usable)

    t0 = time.perf_counter()
    kernel = IASG(model, step_size=IASG_EPS)
    draws, passes, _ = run_sg(kernel, key_iasg, data, init, 0, args.passes, S)
    runs["IASG (paper ε)"] = (draws, passes, None)
    timings["IASG (paper ε)"] = time.perf_counter() - t0
    print(f"IASG (paper ε = {IASG_EPS}): {timings['IASG (paper ε)']:.1f} s", flush=True)

    t0 = time.perf_counter()
    kernel_default = IASG(model, preconditioner="scalar")  # Alg. 1 (H = I) with the default ε
    draws, passes, mcmc_default = run_sg(kernel_default, key_default, data, init, args.iasg_warmup,
                                         args.passes - args.iasg_warmup, S)
    runs["IASG (default ε)"] = (draws, passes, None)
    validity = [kernel_default.validity(mcmc_default.last_state, chain=i) for i in range(2 * c)]
    eps_default = np.array([v["step_size"] for v in validity])
    timings["IASG (default ε)"] = time.perf_counter() - t0
    print(f"IASG (default ε): {timings['IASG (default ε)']:.1f} s; ε = {eps_default.mean():.4g} "
          f"(range {eps_default.min():.4g}–{eps_default.max():.4g})", flush=True)

    t0 = time.perf_counter()
    schedule = robbins_monro(args.sgld_eps0, SGLD_OFFSET, SGLD_POWER)
    draws_per_pass = N // S // SGLD_STEPS_PER_DRAW
    kernel_sgld = SGLD(model, step_size=schedule, steps_per_sample=SGLD_STEPS_PER_DRAW)
    draws, passes, mcmc_sgld = run_sg(kernel_sgld, key_sgld, data, init, 0, args.passes * draws_per_pass, S)
    runs["SGLD"] = (draws, passes, None)
    sgld_last_eps = float(np.asarray(mcmc_sgld.last_state.kernel_state.last_step_size)[0])
    timings["SGLD"] = time.perf_counter() - t0
    print(f"SGLD: {timings['SGLD']:.1f} s; ε_t from {float(schedule(0)):.3g} to {sgld_last_eps:.3g}", flush=True)

    t0 = time.perf_counter()
    draws, passes, sampling, nuts_info = run_nuts(key_nuts, data, init, args.nuts_warmup, args.passes,
                                                  args.nuts_adapt_mass)
    runs["NUTS"] = (draws, passes, np.broadcast_to(sampling, passes.shape))
    runs["NUTS (+warmup draws)"] = (draws, passes, None)
    timings["NUTS"] = time.perf_counter() - t0
    nuts_warm = {k: float(np.mean(nuts_info["warmup_passes"][s])) for k, s in inits.items()}
    print(f"NUTS: {timings['NUTS']:.1f} s; warmup passes (mean) MAP {nuts_warm['MAP']:.0f}, random "
          f"{nuts_warm['random']:.0f}; {nuts_info['num_draws']} post-warmup draws at "
          f"{nuts_info['post_warmup_steps_per_draw']:.2f} leapfrog steps each; "
          f"{nuts_info['divergences']} divergences", flush=True)

    # metrics
    methods, draws_at, fig5 = {}, {}, {}
    for name, (draws, passes, usable) in runs.items():
        methods[name], draws_at[name], fig5[name] = {}, {}, {}
        for init_name, sl in inits.items():
            u = None if usable is None else usable[sl]
            var = variance_curves(draws[sl], passes[sl], budgets, u)
            methods[name][init_name] = summarize(var, truth["min"], truth["max"])
            keep = (passes[sl] > BURN_IN_PASSES) & (True if u is None else u)
            counts = [(keep & (passes[sl] <= b)).sum(axis=1) for b in budgets]
            draws_at[name][init_name] = [f"{int(np.median(k))}" if k.min() == k.max() else
                                         f"{int(k.min())}–{int(k.max())}" for k in counts]
            chain0 = keep[0] & (passes[sl][0] <= args.passes)
            fig5[name][init_name] = (np.cov(draws[sl][0][chain0].T) if chain0.sum() > 1
                                     else np.full((D, D), np.nan))

    # reference: an ideal sampler returning one independent exact posterior draw per pass, same metric
    ref_draws = np.random.default_rng(args.seed + 2).multivariate_normal(mean, post, (REFERENCE_CHAINS, args.passes))
    ref_passes = np.broadcast_to(np.arange(1.0, args.passes + 1), ref_draws.shape[:2])
    reference = summarize(variance_curves(ref_draws, ref_passes, budgets), truth["min"], truth["max"])

    # theory
    q10 = gradient_noise(X_np, y_np, mean, S)
    t_win = N // S
    predictions = {}
    theory_lines = []
    for name, eps in (("IASG (paper ε)", np.full(2 * c, IASG_EPS)), ("IASG (default ε)", eps_default)):
        pred = {}
        for init_name, sl in inits.items():
            eq45 = [np.diag(iasg_covariance(hessian, N, S, e)) for e in eps[sl]]
            pred[init_name] = {"min": float(np.mean([np.min(v) for v in eq45])),
                               "max": float(np.mean([np.max(v) for v in eq45]))}
        predictions[name] = pred
        e = float(np.mean(eps))
        eq45 = np.diag(iasg_covariance(hessian, N, S, e))
        exact = np.diag(iterate_average_covariance(e / N, hessian, q10, t_win))
        x = e * t_win * lam
        theory_lines.append(
            f"* {name}: ε = {e:.4g}, T = {t_win}, ε T λ in [{x[0]:.2f}, {x[-1]:.2f}] (Eq. 46 shortfall "
            f"{100 * window_error(x[0]):.1f} % along λ_min, {100 * window_error(x[-1]):.1f} % along λ_max), "
            f"ε λ_max = {e * lam[-1]:.3g} (< 2 for stability, Eq. 47). Predicted min / max marginal-variance "
            f"error: Eq. 45 {_pct(np.min(eq45) / truth['min'] - 1)} % / "
            f"{_pct(np.max(eq45) / truth['max'] - 1)} %; exact linear recursion "
            f"{_pct(np.min(exact) / truth['min'] - 1)} % / {_pct(np.max(exact) / truth['max'] - 1)} %")
    v0 = validity[0]
    theory_lines.append(
        f"* IASG (default ε): the kernel's own Eq. 46–47 numbers (`validity()`, chain 0, estimated curvature): "
        f"λ_min {v0['eig_min']:.3f}, λ_max {v0['eig_max']:.3f}, ε T λ_min {v0['window_product']:.1f}, "
        f"variance shortfall along λ_min {100 * v0['window_error']:.1f} % (exact discrete-time form), "
        f"ε λ_max {v0['stability']:.3g}")
    sgld_cov = np.diag(sgld_stationary(sgld_last_eps, hessian, q10))
    theory_lines.append(
        f"* SGLD: ε_t = {args.sgld_eps0:g}/√({SGLD_OFFSET:g} + t) falls from {float(schedule(0)):.3g} to "
        f"{sgld_last_eps:.3g} at t = {args.passes * t_win} steps; constant-ε SGLD at the last ε would be "
        f"stationary at min / max marginal-variance error {_pct(np.min(sgld_cov) / truth['min'] - 1)} % / "
        f"{_pct(np.max(sgld_cov) / truth['max'] - 1)} % (minibatch-noise inflation ≈ ε N/(4S) λ_U; "
        f"discrete Lyapunov with the exact noise)")
    print("\n== Theory\n" + "\n".join(theory_lines))

    table = results_table(methods, budgets, table_budgets, draws_at, reference)
    verdict = ["Random init, RMS relative error over chains (lower is better), IASG (paper ε) vs SGLD and NUTS:"]
    others = ["SGLD", "NUTS", "NUTS (+warmup draws)"]
    verdict += verdict_lines(methods, budgets, table_budgets, "IASG (paper ε)", others)
    verdict += ["", "Same for IASG (default ε):"]
    verdict += verdict_lines(methods, budgets, table_budgets, "IASG (default ε)", others)
    print("\n== Marginal-variance errors (relative to the truth, %; mean ± SE over chains, sd, RMS)\n" + table)
    print("\n" + "\n".join(verdict))

    plot_fig4(methods, budgets, truth, predictions, reference, nuts_warm, os.path.join(args.out, "iasg_fig4.png"))
    plot_fig5({n: fig5[n] for n in ("IASG (paper ε)", "IASG (default ε)", "SGLD", "NUTS")}, post,
              os.path.join(args.out, "iasg_fig5.png"))
    total = time.perf_counter() - t_start
    timing_text = ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
    print(f"\ntotal {total:.0f} s ({timing_text}; including compilation)")

    md = [
        "# IASG convergence study (Mandt, Hoffman & Blei 2017, Sec. 6.2 / arXiv Sec. 7.2, Fig. 3–5)",
        "",
        f"Command: `{command}` — runtime {total:.0f} s on this machine ({timing_text}; "
        "compilation included).",
        "",
        "Generated by `benchmarks/iasg_convergence.py` (its docstring lists every choice). "
        f"Scaled down from the paper: {args.passes} data passes (paper 10⁴), {c} chains per initialisation "
        f"(paper 100), Fig. 3 pools {args.fig3_chains} chains of {args.fig3_windows} windows. "
        f"σ² = {NOISE_VAR} (not given in the paper); float64; seed {args.seed}. Random init: N(0, I) draws. "
        f"Burn-in: draws made in the first {BURN_IN_PASSES} passes are excluded for every method. SGLD: "
        f"ε_t = {args.sgld_eps0:g}/√({SGLD_OFFSET:g} + t) in the units of Mandt's Eq. 32 (= NumPyro's potential), "
        f"every {SGLD_STEPS_PER_DRAW}th iterate kept. NUTS: full data, {args.nuts_warmup} warmup draws "
        f"({'diagonal' if args.nuts_adapt_mass else 'identity'} mass matrix), a pass = a leapfrog step, warmup "
        f"counted (mean warmup passes: MAP {nuts_warm['MAP']:.0f}, random {nuts_warm['random']:.0f}); "
        f"{nuts_info['post_warmup_steps_per_draw']:.2f} leapfrog steps per post-warmup draw.",
        "",
        f"Truth: smallest marginal variance {truth['min']:.4g}, largest {truth['max']:.4g} "
        f"(exact posterior (XᵀX + I)⁻¹); eig(A_U/N) in [{lam[0]:.3f}, {lam[-1]:.3f}].",
        "",
        "## Fig. 3 (`iasg_fig3.png`)",
        "",
        *fig3_lines,
        "",
        "![Fig. 3](iasg_fig3.png)",
        "",
        "## Theory (Eq. 45 and the exact recursion; validity window Eq. 46–47)",
        "",
        *theory_lines,
        "",
        "## Fig. 4 / 5: marginal-variance errors (`iasg_fig4.png`, `iasg_fig5.png`)",
        "",
        "Relative error (%) of each chain's smallest / largest estimated marginal variance: mean ± standard "
        "error over chains, sd over chains (the paper's error bars), RMS over chains. '—': no draws yet "
        "(burn-in, or NUTS still in warmup). draws/chain: draws used (a range when chains differ).",
        "",
        table,
        "",
        "How to read it:",
        "",
        "* The metric is biased even for a perfect sampler: the smallest (largest) of D noisy variance "
        "estimates is biased low (high) at small sample sizes. The row 'exact i.i.d. draws, 1 per pass' "
        "applies the same metric to one independent exact posterior draw per pass (what independent "
        "exact samples at IASG's rate of one per pass would give).",
        "* IASG with the paper's ε converges to the covariance of Eq. 45, not to the posterior, when ε T λ is "
        "not large (see the theory section for its value and the predicted errors); the default ε puts "
        "the predicted shortfall at 5 %.",
        "* SGLD (paper's rate, Eq. 32 units): the minibatch-gradient noise (ε_t²/4) Q adds to the injected "
        "noise ε_t I; with Q ≈ (N/S) A_U it dominates while ε_t N λ_U / (4S) > 1, and SGLD then "
        "overestimates the variances (theory section: the stationary error at the schedule's last ε). The "
        "paper does not state its SGLD units; `--sgld-eps0` changes ε₀.",
        "* NUTS pays for its warmup (counted) before its first retained draw, and each of its draws costs "
        "several full-data gradients; the '+warmup draws' row shows what keeping the warmup draws does.",
        "",
        "![Fig. 4](iasg_fig4.png)",
        "",
        "![Fig. 5](iasg_fig5.png)",
        "",
        "## Does IASG converge faster than SGLD and NUTS from random init?",
        "",
        "Computed from the table (RMS over chains combines bias and chain-to-chain spread); differences "
        "smaller than about twice the standard errors in the table are not significant.",
        "",
        *verdict,
        "",
    ]
    path = os.path.join(args.out, "iasg_results.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    print(f"wrote {path} and iasg_fig3.png, iasg_fig4.png, iasg_fig5.png in {args.out}")
    return methods


if __name__ == "__main__":
    main()
