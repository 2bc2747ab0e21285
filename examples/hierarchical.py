"""Hierarchical models with SGWithinGibbs against NUTS: OSIC-shaped regression, random-intercept logistic, horseshoe.

Three problems (``--problem``), each simulated, each sampled by NUTS on all rows (the reference)
and by ``SGWithinGibbs(ConstantSGD(model))`` (SG steps for the data-dependent latents, one NUTS
transition on the hyperparameters' data-free conditional between blocks):

* ``osic`` — the shape of NumPyro's OSIC notebook: P patients × n rows (176 × 114 ≈ 20,000 by
  default), FVC_ij = α_j + β_j · week_ij + ε, α_j ~ N(μ_α, σ_α²), β_j ~ N(μ_β, σ_β²), with the
  notebook's priors (μ_α ~ N(0, 500²), σ_α ~ HalfNormal(100), μ_β ~ N(0, 3²), σ_β ~ HalfNormal(3),
  σ ~ HalfNormal(100)), or unit-scale ones on standardised data (``--standardise``). Runs the
  centred model and the non-centred one (``LocScaleReparam(0)`` on α and β, which SGWithinGibbs
  samples in its centred form); ``--with-plain`` adds plain ConstantSGD on both forms.
* ``logistic`` — random-intercept logistic regression: G groups × n rows (1,000 × 1,000 = 10⁶ by
  default), y ~ Bernoulli(σ(α_g + xᵀβ)), α_g ~ N(μ, s²), four standard-normal covariates.
* ``horseshoe`` — sparse linear regression with a horseshoe prior (NumPyro's horseshoe example's
  prior): β_j ~ N(0, τ² λ_j²), λ_j, τ ~ HalfCauchy(1), σ ~ HalfNormal(1); N = 20,000 rows, D = 10
  predictors, 3 non-zero. The reference NUTS runs at target_accept_prob 0.99.

Printed per run: wall time (trace, compile, warmup and sampling, what a user waits), data passes,
posterior mean and sd of each hyperparameter against NUTS (errors in NUTS sds, sd ratios; the
horseshoe's heavy-tailed scales on the log scale) and the mean difference in units of its Monte
Carlo standard error (err/MCSE, from both runs' bulk ESS: |err/MCSE| ≲ 2 is what sampling noise
alone gives), the largest group-latent mean error in NUTS sds, the smallest bulk ESS of the
hyperparameters and its rate per second, and the issue's acceptance check: scales within 0.2 NUTS
sd and 20 % in sd, group latents within 0.25 sd.

    python examples/hierarchical.py --problem osic --standardise --subsample-size 2000
    python examples/hierarchical.py --problem osic --standardise --rows 1140 --subsample-size 20000
    python examples/hierarchical.py --problem logistic
    python examples/hierarchical.py --problem horseshoe
"""

import argparse
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, NUTS
from numpyro.infer.reparam import LocScaleReparam

from numpyro_sgd import ConstantSGD, SGWithinGibbs, hyper_candidates

# --------------------------------------------------------------------------- OSIC-shaped regression

#: the notebook's prior scales (FVC in ml, weeks), and unit ones for standardised data
PRIORS = {"raw": (500.0, 100.0, 3.0, 3.0, 100.0), "standardised": (5.0, 1.0, 3.0, 1.0, 1.0)}


def centred(pid, weeks, fvc, num_patients, subsample_size=None, priors=PRIORS["raw"]):
    s_mu_a, s_sigma_a, s_mu_b, s_sigma_b, s_sigma = priors
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, s_mu_a))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(s_sigma_a))
    mu_b = numpyro.sample("mu_b", dist.Normal(0.0, s_mu_b))
    sigma_b = numpyro.sample("sigma_b", dist.HalfNormal(s_sigma_b))
    with numpyro.plate("patients", num_patients):
        a = numpyro.sample("a", dist.Normal(mu_a, sigma_a))
        b = numpyro.sample("b", dist.Normal(mu_b, sigma_b))
    sigma = numpyro.sample("sigma", dist.HalfNormal(s_sigma))
    with numpyro.plate("data", fvc.shape[0], subsample_size=subsample_size) as idx:
        p = pid[idx]
        numpyro.sample("obs", dist.Normal(a[p] + b[p] * weeks[idx], sigma), obs=fvc[idx])


def non_centred(priors=PRIORS["raw"]):
    """The non-centred model: NumPyro's reparam handler *around* the centred one (SGWithinGibbs
    samples its LocScaleReparam sites centred; a reparam block inside the model it refuses)."""
    return numpyro.handlers.reparam(partial(centred, priors=priors),
                                    config={"a": LocScaleReparam(0), "b": LocScaleReparam(0)})


def simulate_osic(num_patients, rows, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(2500.0, 250.0, num_patients)
    b = rng.normal(-4.0, 1.0, num_patients)
    pid = np.repeat(np.arange(num_patients), rows)
    weeks = rng.uniform(-12.0, 133.0, pid.shape[0])
    fvc = a[pid] + b[pid] * weeks + rng.normal(0.0, 150.0, pid.shape[0])
    return jnp.asarray(pid), jnp.asarray(weeks), jnp.asarray(fvc)


# --------------------------------------------------------------------------- random-intercept logistic

def random_intercept_logistic(group, x, y, num_groups, subsample_size=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.5))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    with numpyro.plate("groups", num_groups):
        alpha = numpyro.sample("alpha", dist.Normal(mu, s))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=alpha[group[idx]] + x[idx] @ beta), obs=y[idx])


def simulate_logistic(num_groups, rows, seed=0):
    rng = np.random.default_rng(seed)
    alpha = rng.normal(-0.5, 0.8, num_groups)
    beta = np.array([0.5, -0.3, 0.2, 0.0])
    group = np.repeat(np.arange(num_groups), rows)
    x = rng.normal(size=(group.shape[0], beta.shape[0])).astype(np.float32)
    y = (rng.uniform(size=group.shape[0]) < 1.0 / (1.0 + np.exp(-(alpha[group] + x @ beta)))).astype(np.float32)
    return jnp.asarray(group), jnp.asarray(x), jnp.asarray(y)


# --------------------------------------------------------------------------- horseshoe regression

def horseshoe(x, y, subsample_size=None):
    tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
    lam = numpyro.sample("lam", dist.HalfCauchy(jnp.ones(x.shape[1])).to_event(1))
    beta = numpyro.sample("beta", dist.Normal(0.0, tau * lam).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ beta, sigma), obs=y[idx])


def simulate_horseshoe(rows, predictors, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, predictors)).astype(np.float32)
    beta = np.zeros(predictors)
    beta[:3] = [1.0, -0.5, 0.2]
    y = (x @ beta + rng.normal(size=rows)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(y)


# --------------------------------------------------------------------------- running and reporting

def run(kernel, args, num_warmup, num_samples, num_chains, seed):
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method="vectorized", progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.key(seed), *args)
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    return samples, time.perf_counter() - start, mcmc


def min_bulk_ess(samples, sites):
    return min(float(np.min(effective_sample_size(samples[k].reshape(samples[k].shape[:2] + (-1,)))))
               for k in sites)


def report(name, samples, ref, seconds, scales, groups, log_scales=False, extra=""):
    """Print the comparison with NUTS; return whether the acceptance check passes."""
    flat = {k: v.reshape((-1,) + v.shape[2:]) for k, v in samples.items()}
    ref_flat = {k: v.reshape((-1,) + v.shape[2:]) for k, v in ref.items()}
    ess = min_bulk_ess(samples, scales)
    print(f"\n{name}: {seconds:.1f} s{extra}; min bulk ESS of {scales} {ess:.0f} ({ess / seconds:.1f}/s)")
    print(f"  {'site':10s} {'mean':>10s} {'sd':>9s} {'NUTS mean':>10s} {'NUTS sd':>9s} {'err/sd':>7s} {'sd ratio':>8s} "
          f"{'err/MCSE':>8s}")
    ok_scales = True
    for k in scales:
        x, r = flat[k], ref_flat[k]
        label = f"log {k}" if log_scales else k
        if log_scales:
            x, r = np.log(x), np.log(r)
        # the Monte Carlo error of the difference of the two means, from both runs' bulk ESS
        ess_x, ess_r = (effective_sample_size(v.reshape(v.shape[:2] + (-1,))) for v in (
            np.log(samples[k]) if log_scales else samples[k], np.log(ref[k]) if log_scales else ref[k]))
        x, r = x.reshape(x.shape[0], -1), r.reshape(r.shape[0], -1)
        for j in range(x.shape[1]):
            m, s, rm, rs = x[:, j].mean(), x[:, j].std(), r[:, j].mean(), r[:, j].std()
            mcse = np.sqrt(s**2 / ess_x.ravel()[j] + rs**2 / ess_r.ravel()[j])
            ok_scales &= bool(abs(m - rm) <= 0.2 * rs and abs(s / rs - 1) <= 0.2)
            site = label if x.shape[1] == 1 else f"{label}[{j}]"
            print(f"  {site:10s} {m:10.4g} {s:9.3g} {rm:10.4g} {rs:9.3g} {(m - rm) / rs:7.2f} {s / rs:8.2f} "
                  f"{(m - rm) / mcse:8.2f}")
    worst = 0.0
    for k in groups:
        err = np.abs(flat[k].mean(0) - ref_flat[k].mean(0)) / ref_flat[k].std(0)
        ratio = flat[k].std(0) / ref_flat[k].std(0)
        worst = max(worst, float(err.max()))
        print(f"  group {k}: max |mean err| {err.max():.2f} NUTS sd (median {np.median(err):.2f}); "
              f"sd ratio {ratio.min():.2f}–{ratio.max():.2f} (median {np.median(ratio):.2f})")
    print(f"  acceptance (scales within 0.2 sd and 20 % sd; groups within 0.25 sd): "
          f"scales {'pass' if ok_scales else 'FAIL'}, groups {'pass' if worst <= 0.25 else 'FAIL'}")
    return ok_scales and worst <= 0.25


def describe_sg(mcmc):
    state, ks = mcmc.last_state, mcmc.last_state.kernel_state
    return (f", {float(np.max(state.data_passes)):.0f} data passes per chain, SG divergences "
            f"{int(np.sum(state.num_divergences))}, φ-NUTS accept {np.asarray(ks.mean_accept_prob).round(2)}, "
            f"φ divergences {np.asarray(ks.num_hyper_divergences)}")


def describe_nuts(mcmc):
    extra = mcmc.get_extra_fields()
    steps = float(np.mean(extra["num_steps"]))
    return f", {int(np.sum(extra['diverging']))} divergences, {steps:.1f} leapfrog steps/draw"


def nuts_reference(model, data, args, **nuts_options):
    mcmc = MCMC(NUTS(model, **nuts_options), num_warmup=args.nuts_warmup, num_samples=args.num_samples,
                num_chains=args.num_chains, chain_method="vectorized", progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.key(0), *data, extra_fields=("diverging", "num_steps"))
    ref = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    seconds = time.perf_counter() - start
    ess = min_bulk_ess(ref, args.scales)
    print(f"\nNUTS (all rows, {args.num_chains} chains × {args.nuts_warmup} warmup + {args.num_samples}): "
          f"{seconds:.1f} s{describe_nuts(mcmc)}; min bulk ESS of {args.scales} {ess:.0f} ({ess / seconds:.1f}/s)")
    return ref, seconds


def sg_run(name, model, data, ref, nuts_seconds, args, log_scales=False, **kernel_options):
    kernel = SGWithinGibbs(ConstantSGD(model, **kernel_options))
    samples, seconds, mcmc = run(kernel, data, args.sg_warmup, args.num_samples, args.num_chains, seed=1)
    report(name, samples, ref, seconds, args.scales, args.groups, log_scales,
           describe_sg(mcmc) + f", NUTS/SG wall {nuts_seconds / seconds:.1f}×")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", choices=("osic", "logistic", "horseshoe"), default="osic")
    parser.add_argument("--patients", type=int, default=176, help="osic: patients")
    parser.add_argument("--rows", type=int, default=None,
                        help="osic: rows per patient (114); logistic: rows per group (1,000); horseshoe: rows (20,000)")
    parser.add_argument("--groups", type=int, default=1000, help="logistic: groups")
    parser.add_argument("--predictors", type=int, default=10, help="horseshoe: predictors")
    parser.add_argument("--subsample-size", type=int, default=None,
                        help="S of the SG runs (osic 2,000; logistic 10,000; horseshoe 1,000)")
    parser.add_argument("--num-samples", type=int, default=500, help="draws per chain (every run)")
    parser.add_argument("--num-chains", type=int, default=2)
    parser.add_argument("--nuts-warmup", type=int, default=500)
    parser.add_argument("--sg-warmup", type=int, default=200)
    parser.add_argument("--standardise", action="store_true",
                        help="osic: centre and scale FVC and weeks to unit sd (priors on the unit scale)")
    parser.add_argument("--with-plain", action="store_true", help="osic: add plain ConstantSGD runs")
    parser.add_argument("--warmup-newton", action="store_true",
                        help="ConstantSGD(warmup_newton=True): Newton steps to the mode at the end of Adam (raw units)")
    args = parser.parse_args()

    if args.problem == "osic":
        numpyro.enable_x64()
        rows, S = args.rows or 114, args.subsample_size or 2000
        pid, weeks, fvc = simulate_osic(args.patients, rows)
        priors = PRIORS["raw"]
        if args.standardise:  # the sampler's warmup moves in absolute units: give it unit-scale data
            fvc, weeks = (fvc - fvc.mean()) / fvc.std(), (weeks - weeks.mean()) / weeks.std()
            priors = PRIORS["standardised"]
        print(f"OSIC-shaped: {args.patients} patients × {rows} rows = {fvc.shape[0]:,} rows, S = {S}")
        data = (pid, weeks, fvc, args.patients)
        models = {"centred": partial(centred, priors=priors), "non-centred": non_centred(priors)}
        args.scales, args.groups = ["mu_a", "sigma_a", "mu_b", "sigma_b"], ["a", "b"]
    elif args.problem == "logistic":
        rows, S = args.rows or 1000, args.subsample_size or 10_000
        group, x, y = simulate_logistic(args.groups, rows)
        print(f"Random-intercept logistic: {args.groups} groups × {rows} rows = {y.shape[0]:,} rows, S = {S}")
        data = (group, x, y, args.groups)
        models = {"centred": random_intercept_logistic}
        args.scales, args.groups = ["mu", "s"], ["alpha", "beta"]
    else:
        rows, S = args.rows or 20_000, args.subsample_size or 1000
        x, y = simulate_horseshoe(rows, args.predictors)
        print(f"Horseshoe regression: {rows:,} rows × {args.predictors} predictors, S = {S}")
        data = (x, y)
        models = {"centred": horseshoe}
        args.scales, args.groups = ["tau", "lam"], ["beta", "sigma"]

    for form, model in models.items():
        print(f"hyper candidates ({form}):", hyper_candidates(model, *data, S))
    nuts_options = {"target_accept_prob": 0.99} if args.problem == "horseshoe" else {}
    ref, nuts_seconds = nuts_reference(models["centred"], data, args, **nuts_options)
    log_scales = args.problem == "horseshoe"  # half-Cauchy tails: the sd of λ itself has no stable estimate
    for form, model in models.items():
        sg_run(f"SGWithinGibbs(ConstantSGD({form}))", model, data + (S,), ref, nuts_seconds, args, log_scales,
               warmup_newton=args.warmup_newton)
    if args.with_plain and args.problem == "osic":
        for form, model in models.items():
            samples, seconds, mcmc = run(ConstantSGD(model), data + (S,), args.sg_warmup, args.num_samples,
                                         args.num_chains, seed=1)
            if form == "non-centred":  # its group effects are deterministic sites: rebuild them
                for g in ("a", "b"):
                    samples[g] = (samples[f"mu_{g}"][..., None]
                                  + samples[f"sigma_{g}"][..., None] * samples[f"{g}_decentered"])
            report(f"ConstantSGD({form})", samples, ref, seconds, args.scales, args.groups,
                   extra=f", SG divergences {int(np.sum(mcmc.last_state.num_divergences))}")


if __name__ == "__main__":
    main()
