"""Runs on the data users have: JAX arrays, NumPy arrays (small, and large enough that the kernel
reads them in place: ``model_args.AUTO_STREAM_BYTES``, lowered here), pandas columns and
memory-mapped files.

A fitted kernel's ``model`` (:class:`numpyro_sgd.model.discovery.AllRows`) sets each subsample plate to
all N rows, so every consumer of a run evaluates the full data: ArviZ's own export
(``az.from_numpyro``, which traces the model under a ``jit``), NumPyro's ``Predictive`` and
``log_likelihood``, and the package's ``to_arviz``, ``check_run`` and ``loo_subsample``. The plate
indices must then be concrete, or a NumPy array indexed by them (``x[idx]``) fails on a tracer
(issue 44: ``TracerArrayConversionError`` on NumPy data). One body for every kernel, the two
wrappers and each kind of data; in CI NumPy data run on every kernel and each other kind on the
kernels of ``CI_KINDS``, the rest with ``-m slow``.
"""


import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from kernel_registry import REGISTRY
from numpyro.infer import MCMC, Predictive, log_likelihood

from numpyro_sgd import ConstantSGD, SGWithinGibbs, StreamedRows, check_run, loo_subsample, to_arviz
from numpyro_sgd.data import model_args, native

pd = pytest.importorskip("pandas")


N, S = 500, 25
_rng = np.random.default_rng(11)
X = _rng.normal(size=N)
Y = 1.0 + 0.5 * X + _rng.normal(scale=0.5, size=N)


def model(x, y=None):
    # a param site: held at its value by the kernels, fitted by VariationalEM
    prior_scale = numpyro.param("prior_scale", 10.0, constraint=dist.constraints.positive)
    mu = numpyro.sample("mu", dist.Normal(0.0, prior_scale))
    slope = numpyro.sample("slope", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", x.shape[0], subsample_size=S) as idx:
        numpyro.sample("obs", dist.Normal(mu + slope * x[idx], sigma), obs=None if y is None else y[idx])


def hierarchical_model(x, y=None):
    """``tau`` has no observed child in the plate: SGWithinGibbs's hyper site."""
    tau = numpyro.sample("tau", dist.HalfNormal(5.0))
    mu = numpyro.sample("mu", dist.Normal(0.0, tau))
    slope = numpyro.sample("slope", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", x.shape[0], subsample_size=S) as idx:
        numpyro.sample("obs", dist.Normal(mu + slope * x[idx], sigma), obs=None if y is None else y[idx])


def _data(kind, tmp_path):
    """(x, y) as the user would pass them."""
    if kind == "jax":
        return jnp.asarray(X), jnp.asarray(Y)
    if kind in ("numpy", "large-numpy"):
        return X.copy(), Y.copy()
    if kind == "pandas":  # columns of a data frame, as NumPy arrays (a DataFrame itself is refused at init)
        frame = pd.DataFrame({"x": X, "y": Y})
        return frame["x"].to_numpy(), frame["y"].to_numpy()
    assert kind == "memmap"
    for name, values in (("x", X), ("y", Y)):
        np.save(tmp_path / f"{name}.npy", values)
    return (np.load(tmp_path / "x.npy", mmap_mode="r"), np.load(tmp_path / "y.npy", mmap_mode="r"))


def _gibbs(m, **kw):
    return SGWithinGibbs(ConstantSGD(m, preconditioner="diag", **kw), hyper_sites=["tau"])


#: (factory, id, marks, model): every kernel of the registry (tests/kernel_registry.py) and SGWithinGibbs
RUNS = [(e.make, name, e.marks, model) for name, e in REGISTRY.items()] + [
    (_gibbs, "SGWithinGibbs", (), hierarchical_model)]
KINDS = ("numpy", "large-numpy", "pandas", "memmap", "jax")
#: the kernels each other kind of data runs on in CI (NumPy data runs on every kernel). The kind
#: decides the driver's data path (read in place, memory-mapped, converted), which is the same
#: for every kernel; each representative kernel meets at least one other kind, and SGWithinGibbs,
#: which reads its groups' rows itself, meets each kind that is read in place.
CI_KINDS = {"large-numpy": ("SGWithinGibbs", "VariationalEM", "IASG-diag"),
            "memmap": ("SGWithinGibbs", "SGLD", "ConstantSGD-full-momentum"),
            "pandas": ("EWSGVR",), "jax": ("ConstantSGD-full-momentum", "SGLD-CV")}


def _cases():
    for make, name, marks, m in RUNS:
        for kind in KINDS:
            quick = kind == "numpy" or name in CI_KINDS[kind]
            yield pytest.param(make, m, kind, id=f"{kind}-{name}",
                               marks=[*marks] if quick else [*marks, pytest.mark.slow])


@pytest.mark.parametrize("make, m, kind", list(_cases()))
def test_every_export_on_every_kind_of_data(make, m, kind, tmp_path, monkeypatch):
    x, y = _data(kind, tmp_path)
    if kind == "large-numpy":  # every NumPy array counts as large: both are read in place
        monkeypatch.setattr(model_args, "AUTO_STREAM_BYTES", 0)
    mcmc = MCMC(make(m, steps_per_sample=1), num_warmup=60, num_samples=40, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0), x, y)
    if kind == "large-numpy":
        streamed = native.can_read([x], jax.dtypes.canonicalize_dtype(x.dtype))
        assert all(isinstance(a, StreamedRows) == streamed for a in mcmc.sampler.run_args[0])
    samples = mcmc.get_samples()
    latent = sorted(samples)

    # ArviZ's own export (traces the model under jit): the full N columns
    idata = az.from_numpyro(mcmc, log_likelihood=True)
    assert idata["posterior"]["mu"].shape == (2, 40)
    assert idata["log_likelihood"]["obs"].shape == (2, 40, N)
    np.testing.assert_allclose(np.asarray(idata["observed_data"]["obs"]), Y)

    # NumPyro's Predictive and log_likelihood on the fitted model, with the user's kind of data
    predicted = Predictive(mcmc.sampler.model, samples)(jax.random.key(1), x)
    assert predicted["obs"].shape == (80, N)
    ll = log_likelihood(mcmc.sampler.model, samples, x, y)["obs"]
    assert ll.shape == (80, N) and np.all(np.isfinite(np.asarray(ll)))

    # the package's own consumers
    ours = to_arviz(mcmc, log_likelihood=True)
    np.testing.assert_allclose(np.asarray(ours["log_likelihood"]["obs"]).reshape(80, N), np.asarray(ll),
                               rtol=1e-6, atol=1e-8)
    assert isinstance(check_run(mcmc, warn=False), list)
    loo = loo_subsample(mcmc, num_observations=50, rng_key=jax.random.key(2))
    assert np.isfinite(loo.elpd_loo)
    assert latent == sorted(idata["posterior"].data_vars)
