"""Data read in place (numpyro_sgd.data.streaming): memory-mapped files, .npy shards and stream().

The streamed path must give the same draws as the same data in device memory (the rows a step
reads are the same rows, gathered on the host instead of by XLA), read nothing whole, and refuse
before any compute what it cannot read in place, naming the argument and the fix.
"""

import os
import re
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from numpyro_sgd import SGLD, ConstantSGD, StreamedRows, loo_subsample, open_shards, stream, to_arviz

N, D, S = 4_000, 3, 100


def model(X, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D)).astype(np.float32)
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ np.array([1.0, -0.5, 0.25])))).astype(np.float32)
    d = tmp_path_factory.mktemp("stream")
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", y)
    return d, X, y


def run(kernel, *data, **mcmc_kwargs):
    mcmc = MCMC(kernel, num_warmup=10, num_samples=40, progress_bar=False, **mcmc_kwargs)
    mcmc.run(jax.random.key(0), *data)
    return mcmc


def test_memmap_draws_equal_device_draws(files):
    d, X, y = files
    Xm, ym = np.load(d / "X.npy", mmap_mode="r"), np.load(d / "y.npy", mmap_mode="r")
    device = run(ConstantSGD(model), jnp.asarray(X), jnp.asarray(y)).get_samples()["w"]
    streamed = run(ConstantSGD(model), Xm, ym)
    np.testing.assert_allclose(np.asarray(streamed.get_samples()["w"]), np.asarray(device), rtol=1e-5, atol=1e-6)
    # the full-data consumers read the file in blocks too
    idata = to_arviz(streamed, log_likelihood=True)
    ll = idata["log_likelihood"]["y"]
    assert ll.shape[-1] == N and np.isfinite(np.asarray(ll)).all()
    assert np.isfinite(loo_subsample(streamed, num_observations=200).elpd_loo)


def test_stream_passes_jit_model_args_and_shards_read_as_one_file(files, tmp_path):
    d, X, y = files
    reference = run(ConstantSGD(model), jnp.asarray(X), jnp.asarray(y), jit_model_args=True).get_samples()["w"]
    explicit = run(ConstantSGD(model), stream(str(d / "X.npy")), stream(d / "y.npy"), jit_model_args=True)
    np.testing.assert_allclose(np.asarray(explicit.get_samples()["w"]), np.asarray(reference), rtol=1e-5, atol=1e-6)
    for k, a in enumerate(range(0, N, 1_500)):  # shards of 1,500, 1,500 and 1,000 rows
        (tmp_path / "X").mkdir(exist_ok=True)
        np.save(tmp_path / "X" / f"{k:03d}.npy", X[a:a + 1_500])
    sharded = run(ConstantSGD(model), open_shards(tmp_path / "X"), stream(d / "y.npy"), jit_model_args=True)
    np.testing.assert_allclose(np.asarray(sharded.get_samples()["w"]), np.asarray(reference), rtol=1e-5, atol=1e-6)


def test_control_variates_on_a_memmap(files):
    d, X, y = files
    Xm, ym = np.load(d / "X.npy", mmap_mode="r"), np.load(d / "y.npy", mmap_mode="r")
    device = run(SGLD(model, control_variates=True), jnp.asarray(X), jnp.asarray(y)).get_samples()["w"]
    streamed = run(SGLD(model, control_variates=True), Xm, ym).get_samples()["w"]
    np.testing.assert_allclose(np.asarray(streamed), np.asarray(device), rtol=1e-4, atol=1e-5)


def test_streamed_rows_index_like_an_array(files):
    d, X, _ = files
    rows = stream(d / "X.npy")
    idx = jnp.array([3, 1, 2_000, 3])
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda i: rows[i])(idx)), X[np.asarray(idx)])
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda i: rows[i, 1])(idx)), X[np.asarray(idx), 1])
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda i: rows[:, 2][i])(idx)), X[np.asarray(idx), 2])
    batched = jax.jit(jax.vmap(lambda i: rows[i]))(jnp.stack([idx, idx + 1]))
    np.testing.assert_array_equal(np.asarray(batched), X[np.stack([np.asarray(idx), np.asarray(idx) + 1])])
    assert isinstance(rows[10:20], StreamedRows) and rows.shape == (N, D) and len(rows) == N
    with pytest.raises(TypeError, match="Index it with the plate's indices first"):
        jnp.asarray(rows)
    with pytest.raises(TypeError, match="all 4,000 rows of a streamed array"):
        rows @ jnp.ones(D)


def test_bad_files_are_refused_before_any_compute(files, tmp_path):
    d, X, y = files
    ym = np.load(d / "y.npy", mmap_mode="r")
    np.save(tmp_path / "F.npy", np.asfortranarray(X))
    with pytest.raises(ValueError, match="Fortran-order.*np.ascontiguousarray"):
        run(ConstantSGD(model), np.load(tmp_path / "F.npy", mmap_mode="r"), ym)
    np.save(tmp_path / "c.npy", X.astype(np.complex64))
    with pytest.raises(ValueError, match="dtype complex64 is not a number type"):
        run(ConstantSGD(model), np.load(tmp_path / "c.npy", mmap_mode="r"), ym)
    np.save(tmp_path / "short.npy", X[:N - 10])

    def longer(X, y):  # the plate's N from y, the rows from a shorter X
        w = numpyro.sample("w", dist.Normal(0, 1).expand([D]).to_event(1))
        with numpyro.plate("data", y.shape[0], subsample_size=S) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])

    with pytest.raises(ValueError, match=f"plate 'data' has size {N}.*row {N - 1} asked of data with {N - 10} rows"):
        run(ConstantSGD(longer), np.load(tmp_path / "short.npy", mmap_mode="r"), ym)
    (tmp_path / "shards").mkdir()
    np.save(tmp_path / "shards" / "0.npy", X[:100])
    np.save(tmp_path / "shards" / "1.npy", X[100:200, :2])
    with pytest.raises(ValueError, match=r"shard 1.npy has rows of shape \(2,\).*\(3,\)"):
        open_shards(tmp_path / "shards")
    Xm = np.load(d / "X.npy", mmap_mode="r")
    with pytest.raises(ValueError, match=r"jit_model_args=True\) would copy the memory-mapped.*numpyro_sgd.stream"):
        run(ConstantSGD(model), Xm, ym, jit_model_args=True)


def test_non_finite_rows_in_a_file_are_named(files, tmp_path):
    d, X, y = files
    bad = y.copy()
    bad[1234] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    with pytest.raises(ValueError, match=r"non-finite log-likelihood at 1 row\(s\) \[1234\]"):
        run(ConstantSGD(model), np.load(d / "X.npy", mmap_mode="r"), np.load(tmp_path / "nan.npy", mmap_mode="r"))


def test_shuffle_to_writes_one_random_order_in_bounded_memory(files, tmp_path):
    from numpyro_sgd.datasets import shuffle_to

    d, X, y = files
    order = np.argsort(y, kind="stable")  # a file sorted by the response
    np.save(tmp_path / "Xs.npy", X[order])
    np.save(tmp_path / "ys.npy", y[order])
    buckets = shuffle_to([tmp_path / "Xs.npy", tmp_path / "ys.npy"], [tmp_path / "Xr.npy", tmp_path / "yr.npy"],
                         memory_bytes=10_000, chunk_rows=500)
    assert buckets == -(-N * 16 // 10_000)  # 4 float32 a row
    Xr, yr = np.load(tmp_path / "Xr.npy"), np.load(tmp_path / "yr.npy")
    # the same rows, paired as before, in an order unrelated to y
    np.testing.assert_array_equal(np.sort(Xr[:, 0]), np.sort(X[:, 0]))
    pairs = {tuple(r): v for r, v in zip(X[order].tolist(), y[order].tolist())}
    assert all(pairs[tuple(r)] == v for r, v in zip(Xr.tolist(), yr.tolist()))
    half = N // 2  # sorted: the first half all 0; shuffled: about the overall rate, within 4 binomial sds
    rate = y.mean()
    assert abs(yr[:half].mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / half)
    with pytest.warns(UserWarning, match="look ordered.*shuffle_to"):
        ConstantSGD(model, cluster_size=25).algorithm(jax.random.key(0), np.load(tmp_path / "Xs.npy", mmap_mode="r"),
                                                      np.load(tmp_path / "ys.npy", mmap_mode="r"))


def test_to_arviz_refuses_a_pointwise_log_likelihood_larger_than_memory(files, monkeypatch):
    import numpyro_sgd.diagnostics.arviz_export as diagnostics

    d, X, y = files
    mcmc = run(ConstantSGD(model), np.load(d / "X.npy", mmap_mode="r"), np.load(d / "y.npy", mmap_mode="r"))
    monkeypatch.setattr(diagnostics, "_physical_memory_bytes", lambda: 2 * 40 * N * 4 - 8)  # just under 2× its size
    with pytest.raises(ValueError, match=r"would take 0.0 GiB.*loo_subsample"):
        to_arviz(mcmc, log_likelihood=True)


MESH_SCRIPT = r"""
import json, sys
import numpy as np, jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from numpyro.infer import MCMC
from numpyro_sgd import ConstantSGD, stream
from numpyro_sgd.data.streaming import StreamedRows

assert jax.device_count() == 2
d, n, s = sys.argv[1], 4000, 200
Xm, ym = np.load(d + "/X.npy", mmap_mode="r"), np.load(d + "/y.npy", mmap_mode="r")
mesh = Mesh(np.array(jax.devices()), ("data",))

def model(X, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=s) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])

reads, gather = [], StreamedRows.gather
StreamedRows.gather = lambda self, idx: (reads.append([int(np.min(idx)), int(np.max(idx)), int(np.size(idx))])
                                         or gather(self, idx))

def draws(*data, **kw):
    mcmc = MCMC(ConstantSGD(model, mesh=mesh, preconditioner="full"), num_warmup=10, num_samples=40,
                progress_bar=False, **kw)
    mcmc.run(jax.random.key(0), *data)
    return np.asarray(mcmc.get_samples()["w"]).tolist()

streamed = draws(stream(Xm, reader="callback"), stream(ym, reader="callback"))  # reads Python sees
step_reads = [r for r in reads if r[2] == s // 2]
native = draws(Xm, ym)  # the native reader: the same rows by the same block arithmetic
sh = NamedSharding(mesh, P("data"))
device = draws(jax.device_put(jnp.asarray(Xm), sh), jax.device_put(jnp.asarray(ym), sh), jit_model_args=True)
halves = sorted({(r[0] >= n // 2, r[1] >= n // 2) for r in step_reads})
print("RESULT" + json.dumps(dict(streamed=streamed, native=native, device=device, halves=halves,
                                 steps=len(step_reads))))
"""


def test_streamed_rows_under_a_mesh_read_each_devices_own_block(files):
    """``mesh=`` over 2 devices with memmapped data: each step's host reads (S/2 rows per device)
    lie in one half of the file, the device's own block, and the draws equal those of the same
    data sharded over the devices as JAX arrays (same law, same arithmetic), with the host-callback
    reader (whose reads are recorded) and the native one. The full
    preconditioner's warmup differentiates through the sharded potential twice (its Hessian):
    with host-read rows typed as the same on every device, it came out wrong."""
    import json
    import os
    import subprocess
    import sys

    d, X, y = files
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", MESH_SCRIPT, str(d)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT"))[len("RESULT"):])
    assert r["steps"] > 0 and r["halves"] == [[False, False], [True, True]], r["halves"]
    np.testing.assert_allclose(r["streamed"], r["device"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r["native"], r["device"], rtol=1e-5, atol=1e-6)


def test_a_plates_streamed_arrays_are_read_by_one_callback(files):
    """X[idx] and y[idx] under one plate are one host callback (its fixed cost paid once a step),
    with the values of the same potential on device arrays; an array of another length keeps its
    own callback."""
    from numpyro_sgd.model.potential import SubsampledPotential

    d, X, y = files
    streamed = (stream(d / "X.npy", reader="callback"), stream(d / "y.npy", reader="callback"))
    pot = SubsampledPotential.from_model(model, streamed)
    theta, idx = jnp.array([0.3, -0.2, 0.1]), {"data": jnp.arange(0, N, N // S)}
    text = str(jax.make_jaxpr(lambda t, i: pot.potential_and_grad(t, i, streamed))(theta, idx))
    assert text.count("pure_callback") == 1, text
    device = pot.potential_and_grad(theta, idx, (jnp.asarray(X), jnp.asarray(y)))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda t: pot.potential_and_grad(t, idx, streamed)[1])(theta)),
                               np.asarray(device[1]), rtol=1e-5)
    short = (stream(d / "X.npy", reader="callback"),
             stream(np.asarray(y)[: N // 2], reader="callback"))  # y not of the plate's length
    text = str(jax.make_jaxpr(lambda t, i: pot.potential(t, i, short))(theta, {"data": jnp.arange(S)}))
    assert text.count("pure_callback") == 2, text


def test_the_native_reader_reads_each_array_in_one_custom_call(files, tmp_path):
    """On the CPU a NumPy source's rows are read by the native reader (an XLA custom call, no
    Python): one call per array, none of them a host callback, with the rows and gradient of the
    same potential on device arrays; under vmap (chains), for static views (a column, reversed
    rows) and for shards (runs across shard boundaries, an empty shard) too; float64 rows too
    (the tests run with x64; without it they are narrowed, next test)."""
    from numpyro_sgd.data import native
    from numpyro_sgd.model.potential import SubsampledPotential

    d, X, y = files
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler on this machine: the native reader cannot be built")
    assert native.available()
    streamed = (stream(d / "X.npy"), stream(d / "y.npy"))
    assert all(s.native for s in streamed)
    pot = SubsampledPotential.from_model(model, streamed)
    theta, idx = jnp.array([0.3, -0.2, 0.1]), {"data": jnp.arange(0, N, N // S)}
    text = str(jax.make_jaxpr(lambda t, i: pot.potential_and_grad(t, i, streamed))(theta, idx))
    assert text.count("numpyro_sgd_row_gather") == 2 and "pure_callback" not in text, text
    device = pot.potential_and_grad(theta, idx, (jnp.asarray(X), jnp.asarray(y)))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda t: pot.potential_and_grad(t, idx, streamed)[1])(theta)),
                               np.asarray(device[1]), rtol=1e-5)
    rows = jnp.array([[3, 4, 5, N - 1], [0, 7, 6, 2]])
    Xs = streamed[0]
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(lambda i: Xs[i]))(rows)), X[np.asarray(rows)])
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda i: Xs[:, 1][i])(rows)), X[np.asarray(rows), 1])
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda i: Xs[::-1][i])(rows)), X[::-1][np.asarray(rows)])
    for k, (a, b) in enumerate([(0, 1_000), (1_000, 1_000), (1_000, 2_500), (2_500, N)]):  # one shard empty
        np.save(tmp_path / f"{k:03d}.npy", X[a:b])
    shards = open_shards(tmp_path)
    across = jnp.concatenate([jnp.arange(990, 1_010), jnp.arange(2_490, 2_510), jnp.array([N - 1, 0])])
    assert shards.native
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda i: shards[i])(across)), X[np.asarray(across)])
    wide = stream(X.astype(np.float64))
    assert wide.native and "pure_callback" not in str(jax.make_jaxpr(lambda i: wide[i])(rows[0]))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda i: wide[i])(rows[0])), X[np.asarray(rows[0])])


def test_the_native_reader_narrows_64_bit_rows_as_jax_does(files):
    """Without ``jax_enable_x64`` JAX holds float64, int64 and uint64 data as float32, int32 and
    uint32 (pandas columns and ``np.random`` draws are 64-bit): the native reader casts each row
    as it copies it, in one custom call and no host callback, to exactly the values of NumPy's
    ``astype``; packed rows, reversed rows (a negative stride), one column, every other column and
    a Fortran-order matrix (a row's elements N apart) alike."""
    d, X, y = files
    if not stream(X).native:
        pytest.skip("no native reader on this machine (no C++ compiler)")
    rows = np.array([3, 4, 5, N - 1, 0, 7, 6])
    sources = [(X.astype(np.float64) * np.pi, np.float32), (np.round(X * 1e6).astype(np.int64), np.int32),
               (np.abs(np.round(X * 1e6)).astype(np.uint64), np.uint32), ((y > 0).astype(np.int64), np.int32)]
    kept = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        for source, narrow in sources:
            fortran = (np.asfortranarray(source), source[:, ::2]) if source.ndim > 1 else ()
            for view in (source, source[::-1], source[:, 1] if source.ndim > 1 else source[::2], *fortran):
                s = stream(view)
                assert s.native and s.dtype == narrow, (source.dtype, s.dtype)
                idx = jnp.asarray(rows[rows < view.shape[0]])
                text = str(jax.make_jaxpr(lambda i: s[i])(idx))
                assert "numpyro_sgd_row_gather" in text and "pure_callback" not in text, text
                out = np.asarray(jax.jit(lambda i: s[i])(idx))
                assert out.dtype == narrow
                np.testing.assert_array_equal(out, view[np.asarray(idx)].astype(narrow))
    finally:
        jax.config.update("jax_enable_x64", kept)


def _centred(X, y):
    """The test model with the columns centred by their full-data mean: it uses X whole."""
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    mean = X.mean(0)
    with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=(X[idx] - mean) @ w), obs=y[idx])


def test_large_in_memory_arrays_are_read_in_place_by_default(files, monkeypatch):
    """NumPy arrays of ``AUTO_STREAM_BYTES`` or more (lowered here to X's size), and with them the
    arrays of as many rows (y), given to NumPyro's default ``jit_model_args=False`` are read in
    place by the native reader rather than compiled into the loop as constants (the data held
    about four times): the draws are those of the same data as device arrays, a second run reads
    the same wrapper with the kept programs, and ``to_arviz`` and ``loo_subsample`` read it too.
    Smaller arrays, ``jit_model_args=True`` and a model that uses the array whole (``X.mean(0)``:
    it is then kept as an array for good) keep the arrays as they were given."""
    from numpyro_sgd.data import model_args

    d, X, y = files
    Xn, yn = X.copy(), y.copy()
    if not stream(Xn).native:
        pytest.skip("no native reader on this machine (no C++ compiler)")
    monkeypatch.setattr(model_args, "AUTO_STREAM_BYTES", Xn.nbytes)
    kernel = ConstantSGD(model)
    mcmc = run(kernel, Xn, yn)
    Xs, ys = kernel.run_args[0]
    assert isinstance(Xs, StreamedRows) and Xs.source is Xn and isinstance(ys, StreamedRows) and ys.source is yn
    device = run(ConstantSGD(model), jnp.asarray(X), jnp.asarray(y)).get_samples()["w"]
    np.testing.assert_allclose(np.asarray(mcmc.get_samples()["w"]), np.asarray(device), rtol=1e-5, atol=1e-6)
    program = kernel._init_program.entry[1]
    mcmc.run(jax.random.key(1), Xn, yn)
    assert kernel.run_args[0][0] is Xs and kernel._init_program.entry[1] is program
    assert np.isfinite(np.asarray(to_arviz(mcmc, log_likelihood=True)["log_likelihood"]["y"])).all()
    assert np.isfinite(loo_subsample(mcmc, num_observations=200).elpd_loo)

    for args, jit_args in [((Xn[:-1].copy(), yn[:-1].copy()), False), ((X.copy(), y.copy()), True)]:
        other = ConstantSGD(model)
        run(other, *args, jit_model_args=jit_args)
        assert all(type(a) is np.ndarray for a in other.run_args[0]), (len(args[0]), jit_args)

    # a Fortran-order matrix (pandas' to_numpy()) is read in place above the size where the law
    # reads clusters of rows (lowered here to 0), and from a copy in C order below it
    from numpyro_sgd.minibatch import policy

    for cluster_bytes in (0, policy.CLUSTER_MIN_DATA_BYTES):
        monkeypatch.setattr(policy, "CLUSTER_MIN_DATA_BYTES", cluster_bytes)
        Xf = np.asfortranarray(X)
        fortran = ConstantSGD(model)
        draws = run(fortran, Xf, y.copy()).get_samples()["w"]
        Xs = fortran.run_args[0][0]
        assert isinstance(Xs, StreamedRows) and Xs.native and Xs.origin is Xf
        assert (Xs.source is Xf) == (cluster_bytes == 0) and (Xs.source.flags.c_contiguous or cluster_bytes == 0)
        same_law = run(ConstantSGD(model), jnp.asarray(X), jnp.asarray(y)).get_samples()["w"]  # 0: clusters
        np.testing.assert_allclose(np.asarray(draws), np.asarray(same_law), rtol=1e-5, atol=1e-6)

    Xc, yc = X.copy(), y.copy()
    centred = ConstantSGD(_centred)
    draws = run(centred, Xc, yc).get_samples()["w"]
    assert all(type(a) is np.ndarray for a in centred.run_args[0]) and model_args._kept(Xc)
    device = run(ConstantSGD(_centred), jnp.asarray(X), jnp.asarray(y)).get_samples()["w"]
    np.testing.assert_allclose(np.asarray(draws), np.asarray(device), rtol=1e-5, atol=1e-6)

    def broken(X, y):  # an error of the model itself is raised as it is, not the streamed array's
        raise ValueError("the model's own error")

    with pytest.raises(ValueError, match="the model's own error") as raised:
        run(ConstantSGD(broken), X.copy(), y.copy())
    assert raised.value.__context__ is None  # not raised while handling the first trace's error


def test_a_row_past_the_data_is_an_error_naming_the_array(files):
    """The native reader checks every row it copies: a row past the data is a runtime error with
    the array's name and the words the plate check reads, never a read outside the file."""
    d, X, y = files
    Xs = stream(d / "X.npy", name="X")
    if not Xs.native:
        pytest.skip("no native reader on this machine (no C++ compiler)")
    with pytest.raises(Exception, match=f"X: row {N} asked of data with {N} rows"):
        jax.block_until_ready(jax.jit(lambda i: Xs[i])(jnp.array([1, N])))
    with pytest.raises(Exception, match=f"X: row {-N - 1} asked of data with {N} rows \\(a row index i of an "
                                        "N-row array needs -N <= i < N\\)"):
        jax.block_until_ready(jax.jit(lambda i: Xs[i])(jnp.array([-N - 1, 2])))
    # a negative index within the data counts from the end, as NumPy's
    np.testing.assert_array_equal(jax.jit(lambda i: Xs[i])(jnp.array([-1, -N])), X[[-1, 0]])


def test_without_a_compiler_the_callback_reads_with_one_warning(files, tmp_path, monkeypatch):
    """Where the native reader cannot be built (here: no compiler), streamed rows are read by the
    host callback, with one warning naming the cause and the fix; the draws are the same."""
    from numpyro_sgd.data import native

    d, X, y = files
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.warns(UserWarning, match="native row reader is not used .*Install a C\\+\\+17 compiler"):
        assert not native.available()
    Xs, ys = stream(d / "X.npy"), stream(d / "y.npy")
    assert not Xs.native
    fallback = run(ConstantSGD(model), Xs, ys).get_samples()["w"]
    monkeypatch.undo()  # this process's reader (or none yet), the real cache and compiler
    if not Xs.native:
        pytest.skip("no native reader on this machine (no C++ compiler) to compare with")
    np.testing.assert_allclose(np.asarray(fallback), np.asarray(run(ConstantSGD(model), Xs, ys).get_samples()["w"]),
                               rtol=1e-5, atol=1e-6)


def test_a_file_truncated_between_runs_is_an_error_not_a_sigbus(files, tmp_path):
    """The same MCMC object run again after its memory-mapped file was truncated: a ValueError
    naming the file, the cause and the fix, raised before any row is read (reading the lost pages
    would kill the process with SIGBUS). A file written to between runs is named the same way."""
    d, X, y = files
    for change, words in (("truncate", "it is .* bytes, shorter than the .* mapped \\(it was truncated\\)"),
                          ("write", "it was written to")):
        shutil.copy(d / "X.npy", tmp_path / "X.npy")
        Xm, ym = np.load(tmp_path / "X.npy", mmap_mode="r"), np.load(d / "y.npy", mmap_mode="r")
        mcmc = run(ConstantSGD(model), Xm, ym)
        jax.block_until_ready(mcmc.last_state)  # the run's program has read its last rows (dispatch is async)
        if change == "truncate":
            with open(tmp_path / "X.npy", "r+b") as f:
                f.truncate(os.path.getsize(tmp_path / "X.npy") // 2)
        else:
            os.utime(tmp_path / "X.npy", ns=(0, os.stat(tmp_path / "X.npy").st_mtime_ns + 10**9))
        with pytest.raises(ValueError, match=f"the file {tmp_path / 'X.npy'} changed since the run opened it: "
                                             f"{words}.*Open it again"):
            mcmc.run(jax.random.key(1), Xm, ym)


@pytest.mark.parametrize("reader", ["auto", "callback"])
def test_a_file_changed_while_a_program_reads_it_stops_the_run(files, tmp_path, reader):
    """Inside a compiled program (the native reader, or the host callback), a streamed file whose
    modification time or size changed since it was wrapped is an error naming the file the next
    time its rows are read after the reader's 10 ms check interval, not rows of another file."""
    d, X, _ = files
    shutil.copy(d / "X.npy", tmp_path / "X.npy")
    Xs = stream(tmp_path / "X.npy", reader=reader)
    read = jax.jit(lambda i: Xs[i])
    np.testing.assert_array_equal(read(jnp.arange(5)), X[:5])
    os.utime(tmp_path / "X.npy", ns=(0, os.stat(tmp_path / "X.npy").st_mtime_ns + 10**9))
    time.sleep(0.05)
    with pytest.raises(Exception, match=f"the file {tmp_path / 'X.npy'} changed since the run opened it: it was "
                                        "written to"):
        np.asarray(read(jnp.arange(5)))


def shifted(shift):
    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx + shift] @ w), obs=y[idx])
    return model


def test_rows_are_indexed_as_numpy_does_on_every_path(files):
    """One rule whatever the data's home (JAX arrays, a memmap read by the native reader, a
    stream read by the host callback): an index ≥ N (``X[idx + 1]``) is refused at init with
    the same message, before any compute (JAX alone would clamp it silently); a negative one
    counts from the end (``X[idx - 1]``), and the three give the same draws."""
    d, X, y = files
    homes = {"jax": lambda: (jnp.asarray(X), jnp.asarray(y)),
             "memmap": lambda: (np.load(d / "X.npy", mmap_mode="r"), np.load(d / "y.npy", mmap_mode="r")),
             "callback": lambda: (stream(d / "X.npy", reader="callback"), stream(d / "y.npy", reader="callback"))}
    for data in homes.values():
        with pytest.raises(ValueError, match=r"reads its data outside their rows at the plates' first and last "
                                             rf"indices \('data': 0 and {N - 1}\).*{N}.*Every path indexes as NumPy "
                                             r"does: a row i of an N-row array needs -N <= i < N"):
            run(ConstantSGD(shifted(1)), *data())
    draws = [np.asarray(run(ConstantSGD(shifted(-1)), *data()).get_samples()["w"]) for data in homes.values()]
    np.testing.assert_allclose(draws[1], draws[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(draws[2], draws[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use, words", [("X.mean(0)", "X.mean"), ("X.T @ jnp.ones(X.shape[0])", "X.T"),
                                        ("np.mean(X, 0)", "X.mean"), ("jnp.mean(X, 0)", "converted to an array")])
def test_a_streamed_array_used_whole_is_named(files, use, words):
    """A whole-array use of a streamed argument beside ``X[idx]`` is a TypeError naming the
    argument, what the model did and the fix (it was an AttributeError for ``.mean`` and ``.T``)."""
    d, _, _ = files

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
            extra = jnp.sum(eval(use))
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w + 0.0 * extra), obs=y[idx])

    with pytest.raises(TypeError, match=rf"memory-mapped argument of shape \({N}, {D}\): the model uses all "
                                        rf"{N:,} rows of a streamed array at once \({re.escape(words)}.*Index it with "
                                        r"the plate's indices first.*pass it as an argument of its own"):
        run(ConstantSGD(model), np.load(d / "X.npy", mmap_mode="r"), np.load(d / "y.npy", mmap_mode="r"))
