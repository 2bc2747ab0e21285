"""The short runs whose draws ``tests/test_pinned_draws.py`` pins (one per kernel configuration).

``python tests/pinned_draws.py`` writes ``tests/data/pinned_draws.npz`` (see the test's docstring
and ``MOVED`` for when it was last written and why), so the test checks that later changes leave
every kernel's draws unchanged for a fixed key. Float64, one chain
and two vectorized chains: the returned samples, the last unconstrained state and the potentials.
"""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.infer import MCMC

import numpyro_sgd as ns

PATH = pathlib.Path(__file__).parent / "data" / "pinned_draws.npz"
N, S = 400, 20
_rng = np.random.default_rng(0)
X = _rng.normal(size=(N, 2))
Y = X @ np.array([1.0, -0.5]) + 0.7 * _rng.normal(size=N)


def model(x, y):
    w = numpyro.sample("w", dist.Normal(0, 3).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", x.shape[0], subsample_size=S) as idx:
        numpyro.sample("obs", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


def param_model(x, y):
    lam = numpyro.param("lam", 1.0, constraint=constraints.positive)
    w = numpyro.sample("w", dist.Normal(0, 1 / jnp.sqrt(lam)).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", x.shape[0], subsample_size=S) as idx:
        numpyro.sample("obs", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


# the kernels that choose their own steps_per_sample (one data pass) are pinned at one step per
# draw, the setting the pins were recorded with
CONFIGS = {
    "SGLD": lambda: ns.SGLD(model, step_size=1e-4),
    "SGLD-schedule": lambda: ns.SGLD(model, step_size=ns.robbins_monro(1e-3)),
    "PSGLD": lambda: ns.PSGLD(model, step_size=1e-4),
    "SGHMC": lambda: ns.SGHMC(model, step_size=1e-3, friction=20.0),
    "ConstantSGD-scalar": lambda: ns.ConstantSGD(model, preconditioner="scalar", steps_per_sample=1),
    "ConstantSGD-diag": lambda: ns.ConstantSGD(model, preconditioner="diag", steps_per_sample=1),
    "ConstantSGD-full": lambda: ns.ConstantSGD(model, preconditioner="full", steps_per_sample=1),
    "ConstantSGD-sqrt": lambda: ns.ConstantSGD(model, preconditioner="sqrt", steps_per_sample=1),
    "ConstantSGD-full-momentum": lambda: ns.ConstantSGD(model, preconditioner="full", momentum=0.5, steps_per_sample=1),
    "ConstantSGD-diag-step": lambda: ns.ConstantSGD(model, preconditioner="diag", step_size=1e-3),
    "ConstantSGD-full-prior-noise": lambda: ns.ConstantSGD(model, preconditioner="full", prior_noise=True,
                                                           steps_per_sample=1),
    "ConstantSGD-diag-shuffle-sps3": lambda: ns.ConstantSGD(model, preconditioner="diag", warmup_subsample="shuffle",
                                                         steps_per_sample=3),
    "SGFS-full": lambda: ns.SGFS(model, preconditioner="full", steps_per_sample=1),
    "SGFS-diag": lambda: ns.SGFS(model, preconditioner="diag", max_step=1e-3, steps_per_sample=1),
    "SGFS-full-offline": lambda: ns.SGFS(model, preconditioner="full", online=False, max_step=1e-2, steps_per_sample=1),
    "IASG": lambda: ns.IASG(model, preconditioner="scalar", check_validity=False),  # the old default (None)
    "IASG-diag": lambda: ns.IASG(model, preconditioner="diag", window=5, check_validity=False),
    "IASG-full": lambda: ns.IASG(model, preconditioner="full", check_validity=False),
    "EWSG": lambda: ns.EWSG(model, step_size=1e-3, friction=20.0, num_index_steps=2),
    "OverdampedEWSG": lambda: ns.OverdampedEWSG(model, step_size=1e-4, num_index_steps=1),
    "EWSGVR": lambda: ns.EWSGVR(model, step_size=1e-3, friction=20.0, num_index_steps=1),
    "Santa": lambda: ns.Santa(model, step_size=1e-6),
    "Santa-anneal-splitting": lambda: ns.Santa(model, step_size=1e-6, anneal=True, integrator="splitting"),
    "VEM-ConstantSGD-diag": lambda: ns.VariationalEM(ns.ConstantSGD(param_model, preconditioner="diag",
                                                                    steps_per_sample=1)),
    "VEM-IASG": lambda: ns.VariationalEM(ns.IASG(param_model, window=5, preconditioner="scalar",
                                                 check_validity=False)),
    "VEM-SGLD": lambda: ns.VariationalEM(ns.SGLD(param_model, step_size=1e-4)),
}
WARMUP, SAMPLES = {"IASG": (2, 3), "IASG-full": (2, 3)}, (40, 20)


def run(name, num_chains):
    num_warmup, num_samples = WARMUP.get(name, SAMPLES)
    mcmc = MCMC(CONFIGS[name](), num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(11), jnp.asarray(X), jnp.asarray(Y), extra_fields=("potential_energy",))
    samples = mcmc.get_samples(group_by_chain=True)
    out = {f"{name}/{num_chains}/sample/{k}": np.asarray(v) for k, v in samples.items()}
    out.update({f"{name}/{num_chains}/last_z/{k}": np.asarray(v) for k, v in mcmc.last_state.z.items()})
    extra = mcmc.get_extra_fields(group_by_chain=True)
    out[f"{name}/{num_chains}/potential_energy"] = np.asarray(extra["potential_energy"])
    return out


def all_runs():
    out = {}
    for name in CONFIGS:
        for chains in (1, 2):
            out.update(run(name, chains))
    return out


if __name__ == "__main__":
    # python tests/pinned_draws.py                  every configuration
    # python tests/pinned_draws.py NAME [NAME ...]  re-pin these only (see REPINNED in the test)
    import sys
    import warnings

    numpyro.enable_x64()
    warnings.simplefilter("ignore")
    PATH.parent.mkdir(exist_ok=True)
    names = sys.argv[1:]
    if names:
        unknown = sorted(set(names) - set(CONFIGS))
        if unknown:
            raise SystemExit(f"unknown configurations {unknown}; choose from {sorted(CONFIGS)}")
        pinned = dict(np.load(PATH))
        pinned = {k: v for k, v in pinned.items() if k.split("/")[0] not in names}
        for name in names:
            for chains in (1, 2):
                pinned.update(run(name, chains))
    else:
        pinned = all_runs()
    np.savez_compressed(PATH, **pinned)
    print(f"wrote {PATH}")
