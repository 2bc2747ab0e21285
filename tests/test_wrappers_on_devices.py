"""The wrappers keep the data-parallel oracle (issue 29, item 1): ``SGWithinGibbs`` and
``VariationalEM`` around a kernel built with ``mesh=`` take their inner steps' gradients where the
rows are, and sample as they do on one device.

Two host CPU devices are forced in a subprocess of its own (``XLA_FLAGS`` must be set before JAX
starts, and the rest of the suite runs on one device), as in ``test_devices.py``.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

SCRIPT = textwrap.dedent(r"""
    import json, re
    import numpy as np, jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist, arviz as az
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from numpyro.distributions import constraints
    from numpyro.infer import MCMC
    from numpyro_sgd import ConstantSGD, SGWithinGibbs, VariationalEM

    assert jax.device_count() == 2, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    shard = lambda a: jax.device_put(a, NamedSharding(mesh, P("data")))
    out = {}

    def collectives(kernel, state, args):
        hlo = jax.jit(lambda st, a: kernel.sample(st, a, {})).lower(state, args).compile().as_text()
        ops = [l.strip()[:200] for l in hlo.splitlines()
               if any(op + "(" in l for op in ("all-reduce", "all-gather", "all-to-all", "collective-permute",
                                               "reduce-scatter"))]
        return ops, sorted(set(re.findall(r"f32\[(\d+)[,\]]", hlo)))

    # SGWithinGibbs: 4 groups, 500 rows each, rows interleaved so that each device holds all groups
    J, N, S = 4, 2_000, 80
    rng = np.random.default_rng(0)
    g = np.arange(N) % J
    y = (rng.normal(0.0, 1.0, J)[g] + rng.normal(size=N)).astype(np.float32)

    def hierarchical(g, y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfNormal(2.0))
        with numpyro.plate("groups", J):
            z = numpyro.sample("z", dist.Normal(mu, tau))
        with numpyro.plate("data", y.shape[0], subsample_size=S) as idx:
            numpyro.sample("y", dist.Normal(z[g[idx]], 1.0), obs=y[idx])

    for on_mesh in (False, True):
        kernel = SGWithinGibbs(ConstantSGD(hierarchical, mesh=mesh if on_mesh else None))
        args = (shard(g), shard(y)) if on_mesh else (g, y)
        mcmc = MCMC(kernel, num_warmup=200, num_samples=400, progress_bar=False, jit_model_args=True)
        mcmc.run(jax.random.key(3), *args)
        draws = mcmc.get_samples()
        for site in ("mu", "tau"):
            x = np.asarray(draws[site], np.float64)
            out[f"gibbs_{site}_{on_mesh}"] = [float(x.mean()), float(az.mcse(x[None], method="mean"))]
        out[f"gibbs_rejected_{on_mesh}"] = int(mcmc.last_state.num_divergences)
        if on_mesh:
            out["gibbs_ops"], out["gibbs_rows"] = collectives(kernel, mcmc.last_state, args)

    # VariationalEM: y ~ N(Xw, 1), w ~ N(0, 1/λ), λ a param; its type-II maximum-likelihood value
    n, d, s = 2_000, 3, 20
    X = rng.normal(size=(n, d))
    t = X @ (rng.normal(size=d) / 2.0) + rng.normal(size=n)
    lam = 1.0
    for _ in range(2_000):  # MacKay's fixed point (tests/test_vem.py)
        m = np.linalg.solve(lam * np.eye(d) + X.T @ X, X.T @ t)
        lam = np.sum(np.linalg.eigvalsh(X.T @ X) / (lam + np.linalg.eigvalsh(X.T @ X))) / (m @ m)
    out["type2"] = float(lam)
    X, t = X.astype(np.float32), t.astype(np.float32)

    def regression(X, t):
        lam = numpyro.param("lam", 1.0, constraint=constraints.positive)
        w = numpyro.sample("w", dist.Normal(0, 1 / jnp.sqrt(lam)).expand([d]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=s) as i:
            numpyro.sample("t", dist.Normal(X[i] @ w, 1.0), obs=t[i])

    for on_mesh in (True,):  # one device: tests/test_vem.py checks the same band
        vem = VariationalEM(ConstantSGD(regression, preconditioner="full", steps_per_sample=10,
                                        mesh=mesh if on_mesh else None))
        args = (shard(X), shard(t)) if on_mesh else (X, t)
        mcmc = MCMC(vem, num_warmup=200, num_samples=1_000, num_chains=2, chain_method="vectorized",
                    progress_bar=False, jit_model_args=True)
        mcmc.run(jax.random.key(4), *args)
        out[f"vem_lam_{on_mesh}"] = np.asarray(vem.hyperparameters(mcmc.last_state)["lam"]).tolist()
        out[f"vem_rejected_{on_mesh}"] = int(np.sum(mcmc.last_state.num_divergences))
        if on_mesh:
            out["vem_ops"], out["vem_rows"] = collectives(vem, mcmc.last_state, args)
    print("RESULT" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def wrapped_on_two_devices():
    """SCRIPT in a subprocess with two forced host devices; what it printed."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",  # the suite's compiler options (conftest.py) kept
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip())
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def _only_small_all_reduces(ops, largest):
    """Every collective of the compiled sampling step is an all-reduce of at most ``largest``
    floats per dimension (gradients, potentials, moments): no data row moves between devices."""
    assert ops and all("all-reduce(" in op for op in ops), ops
    for op in ops:
        dims = [int(x) for shape in re.findall(r"\[([0-9,]+)\]", op.split("all-reduce(")[0])
                for x in shape.split(",") if x]
        assert all(x <= largest for x in dims), op


@pytest.mark.parametrize("wrapper", ["gibbs", "vem"])
def test_wrapper_takes_sharded_gradients(wrapped_on_two_devices, wrapper):
    """The compiled sampling step of the wrapper on the mesh reduces its gradients across the two
    devices, moves no data row, and each device works on its own N/2 rows: the inner steps ask the
    driver's data-parallel oracle (before issue 29 SGWithinGibbs rebuilt an unsharded one)."""
    out = wrapped_on_two_devices
    _only_small_all_reduces(out[f"{wrapper}_ops"], largest=8)
    rows = out[f"{wrapper}_rows"]
    assert "1000" in rows and "2000" not in rows, rows


def test_sg_within_gibbs_on_two_devices_samples_as_on_one(wrapped_on_two_devices):
    """Posterior means of μ and τ on the mesh agree with the one-device run: the stratified
    minibatch changes only the gradient noise, which the warmup estimates, so both chains target
    the same law and their means differ by Monte Carlo error only. Z = 4 standard errors of the
    difference, sqrt(MCSE₁² + MCSE₂²) with the MCSEs from ArviZ's ESS (4 checks: a false alarm has
    probability about 2.5·10⁻⁴)."""
    out = wrapped_on_two_devices
    assert out["gibbs_rejected_False"] == 0 and out["gibbs_rejected_True"] == 0, out
    for site in ("mu", "tau"):
        (m1, e1), (m2, e2) = out[f"gibbs_{site}_False"], out[f"gibbs_{site}_True"]
        assert abs(m1 - m2) < 4.0 * np.hypot(e1, e2), (site, out[f"gibbs_{site}_False"], out[f"gibbs_{site}_True"])


def test_variational_em_on_two_devices_finds_the_type2_value(wrapped_on_two_devices):
    """λ of each chain on the mesh lies within 10 % of the exact type-II maximum-likelihood
    precision: the per-chain band that tests/test_vem.py checks on one device (whose
    Robbins–Monro spread at the end of the run was measured at ±2 %)."""
    out = wrapped_on_two_devices
    target = out["type2"]
    for on_mesh in (True,):
        lam = np.asarray(out[f"vem_lam_{on_mesh}"])
        assert out[f"vem_rejected_{on_mesh}"] == 0, out
        assert lam.shape == (2,) and np.all(np.abs(lam / target - 1) < 0.1), (on_mesh, lam, target)
