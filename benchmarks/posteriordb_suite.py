"""numpyro_sgd kernels on posteriordb reference posteriors (10,000 Stan NUTS draws each).

For every posterior folder under ``<data>/posteriordb`` (see its README) this runs ConstantSGD
(full and diagonal preconditioners), IASG (full preconditioner, the same number of SG steps) and
SGLD on the NumPyro rewrite of the model
(``numpyro_reference_models.py`` in the same folder, imported from there) with the data plate
subsampled, and prints per posterior and kernel: max |mean error| in reference-sd units, max
relative sd error (constrained scale) and the Gaussian-fit KL in both directions on the
unconstrained scale, next to the reference's own noise floor (split-half NUTS validation in
``validation_numpyro_nuts.json``).

    python benchmarks/posteriordb_suite.py --data /path/to/data  # holding posteriordb/ (or set $NUMPYRO_SGD_DATA)
    python benchmarks/posteriordb_suite.py --data /path/to/data --posteriors sblri-blr kidiq-kidscore_interaction

SGLD's step size is set per posterior from the gradient-noise covariance Q that ConstantSGD-full
estimated in its warmup: with Fisher ≈ Hessian, A_U ≈ (S/N) Q, and ε = 0.05 / λ_max(A_U); SGLD
starts from ConstantSGD-full's final state (at such a step it cannot burn in from a random point).
No network access: everything is read from the local data folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time

import jax
import numpy as np
from numpyro.infer import MCMC

from numpyro_sgd import IASG, SGLD, ConstantSGD, SubsampledPotential, datasets
from numpyro_sgd.diagnostics.compare import compare

GOLD = [
    "sblri-blr", "sblrc-blr", "kidiq-kidscore_interaction", "earnings-logearn_interaction",
    "earnings-earn_height", "nes1992-nes", "nes2000-nes", "diamonds-diamonds", "arK-arK",
    "low_dim_gauss_mix-low_dim_gauss_mix",
]
SUPPLEMENTARY = ["german_credit_numeric-logistic_regression"]


def default_data_dir():
    """$NUMPYRO_SGD_DATA, else a development checkout's data folder (``datasets.default_data_dir``)."""
    return str(datasets.default_data_dir())


def load_models(pdb_dir):
    path = os.path.join(pdb_dir, "numpyro_reference_models.py")
    spec = importlib.util.spec_from_file_location("posteriordb_numpyro_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MODELS


def posterior_dir(pdb_dir, name):
    direct = os.path.join(pdb_dir, name)
    return direct if os.path.isdir(direct) else os.path.join(pdb_dir, "supplementary", name)


def run_posterior(name, pdb_dir, models, args, key):
    folder = posterior_dir(pdb_dir, name)
    with open(os.path.join(folder, "data.json")) as f:
        data = json.load(f)
    ref = np.load(os.path.join(folder, "reference_draws.npz"))
    names = [str(n) for n in ref["param_names"]]
    model = models[name]
    # N is the size of the data plate (traced once with a small minibatch); S = min(100, N // 5)
    n = SubsampledPotential.from_model(model, (data,), {"subsample_size": 2}).plates[0].size
    s = max(2, min(args.max_subsample, n // 5))
    rows, wall, sps = {}, {}, args.steps_per_sample
    # IASG returns one sample per window of T = ⌈N/S⌉ SG steps: same SG-step budget, fewer samples
    window = -(-n // s)
    kernels = {
        "ConstantSGD-full": (lambda: ConstantSGD(model, preconditioner="full", steps_per_sample=sps), 1),
        "ConstantSGD-diag": (lambda: ConstantSGD(model, preconditioner="diag", steps_per_sample=sps), 1),
        "IASG-full": (lambda: IASG(model, preconditioner="full"), sps / window),
    }
    runs = {}
    for kname, (make, per_sample) in kernels.items():
        mcmc = MCMC(make(), num_warmup=max(1, round(args.num_warmup * per_sample)),
                    num_samples=round(args.num_samples * per_sample), num_chains=args.chains,
                    chain_method="vectorized", progress_bar=False)
        start = time.perf_counter()
        mcmc.run(key, data, subsample_size=s)
        jax.block_until_ready(mcmc.get_samples())
        wall[kname] = time.perf_counter() - start
        runs[kname] = mcmc
    q = np.asarray(runs["ConstantSGD-full"].last_state.kernel_state.noise_cov[0])
    lam = float(np.linalg.eigvalsh(q * s / n)[-1])
    eps = 0.05 / lam
    mcmc = MCMC(SGLD(model, step_size=eps, steps_per_sample=sps), num_warmup=args.num_warmup,
                num_samples=args.num_samples, num_chains=args.chains, chain_method="vectorized", progress_bar=False)
    start = time.perf_counter()
    # warm start at ConstantSGD-full's last (unconstrained) state: at a step this small SGLD
    # cannot burn in from a random point in this budget
    mcmc.run(key, data, subsample_size=s, init_params=runs["ConstantSGD-full"].last_state.z)
    jax.block_until_ready(mcmc.get_samples())
    wall["SGLD"] = time.perf_counter() - start
    runs["SGLD"] = mcmc
    table = compare(runs, ref, names=names, wall_times=wall)
    for kname in runs:
        rows[kname] = table.loc[kname]
    return n, s, eps, rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=default_data_dir(),
                        help="data folder holding posteriordb/ (default: $NUMPYRO_SGD_DATA)")
    parser.add_argument("--posteriors", nargs="*", default=None, help="posterior folder names (default: all gold)")
    parser.add_argument("--supplementary", action="store_true", help="also run German credit (gold mean/sd)")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--num-warmup", type=int, default=500)
    parser.add_argument("--num-samples", type=int, default=2000)
    parser.add_argument("--steps-per-sample", type=int, default=10)
    parser.add_argument("--max-subsample", type=int, default=100)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "output", "posteriordb"))
    args = parser.parse_args(argv)
    pdb_dir = os.path.join(args.data, "posteriordb")
    if not os.path.isdir(pdb_dir):
        raise SystemExit(f"no posteriordb folder at {pdb_dir}; pass --data or set NUMPYRO_SGD_DATA")
    os.makedirs(args.out, exist_ok=True)
    models = load_models(pdb_dir)
    with open(os.path.join(pdb_dir, "validation_numpyro_nuts.json")) as f:
        validation = json.load(f)
    names = args.posteriors or (GOLD + (SUPPLEMENTARY if args.supplementary else []))
    key = jax.random.key(0)
    lines = ["| posterior | N | S | kernel | max mean err (sd) | max sd rel err | KL(ref‖q) | KL(q‖ref) | "
             "min ESS | wall s | NUTS noise floor: mean / sd / KL |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    results = {}
    for name in names:
        n, s, eps, rows = run_posterior(name, pdb_dir, models, args, key)
        floor = _floor(validation, name)
        results[name] = {"N": n, "S": s, "sgld_step_size": eps,
                         "rows": {k: {c: float(v) for c, v in r.items()} for k, r in rows.items()}}
        for kname, r in rows.items():
            lines.append(f"| {name} | {n} | {s} | {kname} | {r.max_mean_err_sd:.3f} | {r.max_sd_rel_err:.3f} | "
                         f"{r.kl_ref_q:.4f} | {r.kl_q_ref:.4f} | {r.min_ess_bulk:.0f} | {r.wall_s:.1f} | {floor} |")
        print("\n".join(lines[-len(rows):]), flush=True)
    table = "\n".join(lines)
    print("\n" + table)
    with open(os.path.join(args.out, "posteriordb.md"), "w") as f:
        f.write("# posteriordb reference posteriors (benchmarks/posteriordb_suite.py)\n\n" + table + "\n")
    with open(os.path.join(args.out, "posteriordb.json"), "w") as f:
        json.dump(results, f, indent=1)


def _floor(validation, name):
    split = validation.get("split_half_noise_floor", {}).get(name)
    if split is None:
        return "n/a"
    try:
        return (f"{split['max_abs_mean_err_in_ref_sd']:.3f} / {split['max_abs_sd_rel_err']:.3f} / "
                f"{split['gaussian_kl_ref_to_test_unconstrained']:.4f}")
    except (KeyError, TypeError):
        return "n/a"


if __name__ == "__main__":
    main()
