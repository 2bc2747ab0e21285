"""Several devices (issue 17, items 2 and 1a): parallel chains on 2 devices, and data sharded over
2 devices but closed over as constants (NumPyro's default ``jit_model_args=False``).

Two host CPU devices are forced in a subprocess of its own (``XLA_FLAGS`` must be set before JAX
starts, and the rest of the suite runs on one device).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

SCRIPT = textwrap.dedent("""
    import json, os, warnings
    import numpy as np, jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from numpyro.infer import MCMC
    from numpyro_sgd import SGLD, ConstantSGD

    assert jax.device_count() == 2, jax.devices()
    N, S = 1_000, 20
    y = jnp.asarray(np.random.default_rng(0).normal(1.0, 1.0, size=N), jnp.float32)

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("data", N, subsample_size=S) as i:
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[i])

    out = {}
    for kernel in (ConstantSGD, SGLD):
        draws, devices = [], None
        for _ in range(2):
            mcmc = MCMC(kernel(model), num_warmup=50, num_samples=100, num_chains=2, chain_method="parallel",
                        progress_bar=False)
            mcmc.run(jax.random.key(0), y)
            mu = mcmc.get_samples(group_by_chain=True)["mu"]
            draws.append(np.asarray(mu))
        mcmc.post_warmup_state = mcmc.last_state
        mcmc.run(mcmc.post_warmup_state.rng_key, y)
        more = np.asarray(mcmc.get_samples(group_by_chain=True)["mu"])
        out[kernel.__name__] = dict(
            shape=list(draws[0].shape), same=bool(np.array_equal(draws[0], draws[1])),
            chains_differ=bool(not np.array_equal(draws[0][0], draws[0][1])),
            continued_shape=list(more.shape), continued_new=bool(not np.array_equal(more, draws[0])),
            mean=float(draws[0].mean()), passes=np.asarray(mcmc.last_state.data_passes).tolist(),
            rejected=int(np.sum(mcmc.last_state.num_divergences)))
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharded = jax.device_put(y, NamedSharding(mesh, P("data")))
    for jit_model_args in (False, True):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            mcmc = MCMC(ConstantSGD(model), num_warmup=50, num_samples=50, progress_bar=False,
                        jit_model_args=jit_model_args)
            mcmc.run(jax.random.key(1), sharded)
        out[f"warned_{jit_model_args}"] = [str(w.message) for w in record if "sharded" in str(w.message)]
    print("RESULT" + json.dumps(out))
""")


def test_parallel_chains_and_sharded_constants_on_two_devices():
    """``chain_method="parallel"``: 2 chains on 2 devices give (2, 100) draws, the same draws for
    the same key, different chains, a continuation that moves on, both chains counting the same
    data passes, no rejected step, and a posterior mean within 5 posterior sds (1/√N) of the exact
    one (200 draws whose ESS is at least ~20: MCSE ≤ 0.25 sd, so 5 sd does not fail by chance).
    Data sharded over the devices and closed over as constants warns; with
    ``jit_model_args=True`` it does not."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    out = json.loads(line[len("RESULT"):])
    exact = _exact_mean()
    for name in ("ConstantSGD", "SGLD"):
        r = out[name]
        assert r["shape"] == [2, 100] and r["continued_shape"] == [2, 100], r
        assert r["same"] and r["chains_differ"] and r["continued_new"], r
        assert r["rejected"] == 0 and r["passes"][0] == r["passes"][1], r
        assert abs(r["mean"] - exact) < 5 / 1_000**0.5, (name, r["mean"], exact)
    assert len(out["warned_False"]) == 1 and "jit_model_args=True" in out["warned_False"][0]
    assert out["warned_True"] == []


def _exact_mean():
    y = np.random.default_rng(0).normal(1.0, 1.0, size=1_000).astype(np.float32).astype(np.float64)
    return y.sum() / (y.size + 1 / 100)  # prior N(0, 10²), unit noise
