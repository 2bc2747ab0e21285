"""Hierarchical linear regression (the shape of NumPyro's OSIC notebook) with SGWithinGibbs vs NUTS.

Simulated: P patients with n rows each (176 × 114 ≈ 20,000 rows by default), FVC_ij =
α_j + β_j · week_ij + ε, α_j ~ N(μ_α, σ_α²), β_j ~ N(μ_β, σ_β²), with the notebook's priors
(μ_α ~ N(0, 500²), σ_α ~ HalfNormal(100), μ_β ~ N(0, 3²), σ_β ~ HalfNormal(3), σ ~ HalfNormal(100)).

Runs, each against NUTS on all rows (the reference):

* ``SGWithinGibbs(ConstantSGD(centred))``: SG steps for (α, β, σ), NUTS on (μ_α, σ_α, μ_β, σ_β)
  given (α, β) between them;
* ``ConstantSGD(non_centred)`` (``LocScaleReparam(0)`` on α and β): the non-centred model has no
  hyper site (μ and σ enter the likelihood), so the wrapper refuses it; the plain kernel is shown;
* ``ConstantSGD(centred)`` alone, for comparison.

Printed: posterior mean and sd of the scale hyperparameters per run, their errors in NUTS sds and
sd ratios, the largest group-latent mean error in NUTS sds, and wall times.

    python examples/hierarchical.py                    # 176 patients × 114 rows
    python examples/hierarchical.py --rows 30          # reduced size
"""

import argparse
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS
from numpyro.infer.reparam import LocScaleReparam

from numpyro_sgd import ConstantSGD, SGWithinGibbs, hyper_candidates

HYPER = ("mu_a", "sigma_a", "mu_b", "sigma_b")


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


def non_centred(pid, weeks, fvc, num_patients, subsample_size=None, priors=PRIORS["raw"]):
    with numpyro.handlers.reparam(config={"a": LocScaleReparam(0), "b": LocScaleReparam(0)}):
        centred(pid, weeks, fvc, num_patients, subsample_size, priors)


def simulate(num_patients, rows, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(2500.0, 250.0, num_patients)
    b = rng.normal(-4.0, 1.0, num_patients)
    pid = np.repeat(np.arange(num_patients), rows)
    weeks = rng.uniform(-12.0, 133.0, pid.shape[0])
    fvc = a[pid] + b[pid] * weeks + rng.normal(0.0, 150.0, pid.shape[0])
    return jnp.asarray(pid), jnp.asarray(weeks), jnp.asarray(fvc)


def run(kernel, args, num_warmup, num_samples, seed=1, **kwargs):
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=2, chain_method="vectorized",
                progress_bar=False, **kwargs)
    start = time.perf_counter()
    mcmc.run(jax.random.key(seed), *args)
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
    jax.block_until_ready(samples)
    return samples, time.perf_counter() - start, mcmc


def report(name, samples, ref, seconds, extra=""):
    print(f"\n{name}: {seconds:.1f} s{extra}")
    print(f"  {'site':8s} {'mean':>10s} {'sd':>9s} {'NUTS mean':>10s} {'NUTS sd':>9s} {'err/sd':>7s} {'sd ratio':>8s}")
    worst = {}
    for k in HYPER:
        m, s, rm, rs = samples[k].mean(), samples[k].std(), ref[k].mean(), ref[k].std()
        print(f"  {k:8s} {m:10.4g} {s:9.3g} {rm:10.4g} {rs:9.3g} {(m - rm) / rs:7.2f} {s / rs:8.2f}")
    for k in ("a", "b"):
        err = np.abs(samples[k].mean(0) - ref[k].mean(0)) / ref[k].std(0)
        ratio = samples[k].std(0) / ref[k].std(0)
        worst[k] = err.max()
        print(f"  group {k}: max |mean err| {err.max():.2f} NUTS sd (median {np.median(err):.2f}); "
              f"sd ratio {ratio.min():.2f}–{ratio.max():.2f}")
    ok_hyper = all(abs(samples[k].mean() - ref[k].mean()) <= 0.2 * ref[k].std()
                   and abs(samples[k].std() / ref[k].std() - 1) <= 0.2 for k in ("sigma_a", "sigma_b"))
    print(f"  acceptance (scales within 0.2 sd and 20 % sd; groups within 0.25 sd): "
          f"scales {'pass' if ok_hyper else 'FAIL'}, groups {'pass' if max(worst.values()) <= 0.25 else 'FAIL'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=176)
    parser.add_argument("--rows", type=int, default=114, help="rows per patient")
    parser.add_argument("--subsample-size", type=int, default=500)
    parser.add_argument("--num-samples", type=int, default=1000)
    parser.add_argument("--skip-plain", action="store_true", help="skip the plain ConstantSGD runs")
    parser.add_argument("--standardise", action="store_true",
                        help="centre and scale FVC and weeks to unit sd (priors on the unit scale)")
    args = parser.parse_args()
    numpyro.enable_x64()
    pid, weeks, fvc = simulate(args.patients, args.rows)
    priors = PRIORS["raw"]
    if args.standardise:  # the sampler's warmup moves in absolute units: give it unit-scale data
        fvc, weeks = (fvc - fvc.mean()) / fvc.std(), (weeks - weeks.mean()) / weeks.std()
        priors = PRIORS["standardised"]
    print(f"{args.patients} patients × {args.rows} rows = {fvc.shape[0]:,} rows, S = {args.subsample_size}")
    data = (pid, weeks, fvc, args.patients)
    centred_model = partial(centred, priors=priors)
    non_centred_model = partial(non_centred, priors=priors)
    print("hyper candidates: centred", hyper_candidates(centred_model, *data, args.subsample_size),
          "| non-centred", hyper_candidates(non_centred_model, *data, args.subsample_size))

    ref, t_nuts, _ = run(NUTS(centred_model), data, 1000, args.num_samples)
    print(f"\nNUTS (centred, all rows, 2 chains × 1000 warmup + {args.num_samples}): {t_nuts:.1f} s")
    sg_args = data + (args.subsample_size,)
    kernel = SGWithinGibbs(ConstantSGD(centred_model))
    samples, seconds, mcmc = run(kernel, sg_args, 500, args.num_samples)
    ks = mcmc.last_state.kernel_state
    report("SGWithinGibbs(ConstantSGD(centred))", samples, ref, seconds,
           f", {float(mcmc.last_state.data_passes[0]):.0f} data passes, SG divergences "
           f"{int(np.sum(mcmc.last_state.num_divergences))}, φ-NUTS accept {np.asarray(ks.mean_accept_prob).round(2)}, "
           f"φ divergences {np.asarray(ks.num_hyper_divergences)}")
    if not args.skip_plain:
        for name, model in (("ConstantSGD(centred)", centred_model), ("ConstantSGD(non_centred)", non_centred_model)):
            samples, seconds, mcmc = run(ConstantSGD(model), sg_args, 500, args.num_samples)
            if model is non_centred_model:  # report the group effects on their natural scale
                samples["a"] = samples["mu_a"][:, None] + samples["sigma_a"][:, None] * samples["a_decentered"]
                samples["b"] = samples["mu_b"][:, None] + samples["sigma_b"][:, None] * samples["b_decentered"]
            report(name, samples, ref, seconds, f", SG divergences {int(np.sum(mcmc.last_state.num_divergences))}")


if __name__ == "__main__":
    main()
