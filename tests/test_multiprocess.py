"""Two processes on localhost under ``jax.distributed`` (issue 17 item 3): each process holds only
its own half of the rows, the kernel runs SPMD with ``mesh=`` over the two processes' CPU devices
(gloo collectives), and both processes get the same draws of the exact posterior."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

#: a worker's start: process ``argv[1]`` of two, coordinator on 127.0.0.1:``argv[2]``, gloo collectives
PROLOGUE = textwrap.dedent(r"""
    import json, sys
    import jax
    process_id, port = int(sys.argv[1]), sys.argv[2]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                               initialization_timeout=60)
    import numpy as np, numpyro, numpyro.distributions as dist
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from numpyro.infer import MCMC
    from numpyro_sgd.datasets import process_rows
""")

WORKER = PROLOGUE + textwrap.dedent(r"""
    from numpyro_sgd import ConstantSGD

    n, d, s = 400, 3, 20
    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, d)) * np.array([1.0, 2.0, 3.0])
    t = X @ rng.normal(size=d) + rng.normal(size=n)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows = process_rows(n)  # this process's rows only: the other half never enters this process's arrays
    sharding = NamedSharding(mesh, P("data"))
    read = []
    if len(sys.argv) > 3:  # the files, memory-mapped whole by each process and streamed: record what is read
        from numpyro_sgd import stream
        from numpyro_sgd.data.streaming import StreamedRows

        gather = StreamedRows.gather
        StreamedRows.gather = lambda self, idx: read.append([int(np.min(idx)), int(np.max(idx)), int(np.size(idx))]) or gather(self, idx)
        # the host-callback reader, whose reads Python sees (the native reader's rows are the same)
        Xg, tg = stream(sys.argv[3] + "/X.npy", reader="callback"), stream(sys.argv[3] + "/t.npy", reader="callback")
    else:
        Xg = jax.make_array_from_process_local_data(sharding, X[rows].astype(np.float32), (n, d))
        tg = jax.make_array_from_process_local_data(sharding, t[rows].astype(np.float32), (n,))

    def regression(X, t):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=s) as i:
            numpyro.sample("t", dist.Normal(X[i] @ w, 1.0), obs=t[i])

    mcmc = MCMC(ConstantSGD(regression, preconditioner="full", mesh=mesh), num_warmup=50, num_samples=200,
                progress_bar=False,
                jit_model_args=True)
    mcmc.run(jax.random.key(2), Xg, tg)
    w = mcmc.get_samples()["w"]
    print("RESULT" + json.dumps(dict(
        process=jax.process_index(), devices=jax.device_count(), local_rows=[rows.start, rows.stop],
        step_reads=sorted({(r[0] >= n // 2, r[1] >= n // 2) for r in read if r[2] == s // 2}),
        other_reads=len([r for r in read if r[2] != s // 2]),
        w=np.asarray(w.addressable_data(0)).tolist(),
        passes=float(np.asarray(mcmc.last_state.data_passes.addressable_data(0))))))
""")


CV_WORKER = PROLOGUE + textwrap.dedent(r"""
    from numpyro_sgd import SGLD

    n, d, s = 100_000, 10, 1_000
    rng = np.random.default_rng(1)
    X = (rng.normal(size=(n, d)) / np.sqrt(d)).astype(np.float32)
    y = rng.poisson(np.exp(X @ (0.5 * rng.normal(size=d)))).astype(np.float32)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows = process_rows(n)
    read = []
    if len(sys.argv) > 3:  # the .npy files, streamed by each process (host-callback reader): record the reads
        from numpyro_sgd import stream
        from numpyro_sgd.data.streaming import StreamedRows

        gather = StreamedRows.gather
        def recorded(self, idx):
            read.append([int(np.min(idx)), int(np.max(idx)), int(np.size(idx))])
            return gather(self, idx)

        StreamedRows.gather = recorded
        Xg, yg = stream(sys.argv[3] + "/X.npy", reader="callback"), stream(sys.argv[3] + "/y.npy", reader="callback")
    else:
        sharding = NamedSharding(mesh, P("data"))
        Xg = jax.make_array_from_process_local_data(sharding, X[rows], (n, d))
        yg = jax.make_array_from_process_local_data(sharding, y[rows], (n,))

    def poisson(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=s) as i:
            numpyro.sample("y", dist.Poisson(jax.numpy.exp(X[i] @ w)), obs=y[i])

    mcmc = MCMC(SGLD(poisson, control_variates=True, mesh=mesh), num_warmup=100, num_samples=1000,
                progress_bar=False, jit_model_args=True)
    mcmc.run(jax.random.key(2), Xg, yg)
    w = np.asarray(mcmc.get_samples()["w"].addressable_data(0), np.float64)
    # a summary only: 10⁴ draws as JSON would fill the pipe the parent reads after the other process
    # reads of other sizes than the model's S (the SG steps' S/2 a device, the centre's blocks), and
    # how many of them reach outside this process's rows
    own = [r for r in read if r[2] != s]
    print("RESULT" + json.dumps(dict(process=jax.process_index(), local_rows=[rows.start, rows.stop],
                                     mean=w.mean(0).tolist(), sd=w.std(0).tolist(), head=w[:20].tolist(),
                                     step_reads=len([r for r in own if r[2] == s // 2]), reads=len(own),
                                     outside=len([r for r in own if r[0] < rows.start or r[1] >= rows.stop]))))
""")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _two_processes(*extra, worker=WORKER):
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, "-c", worker, str(i), str(port), *extra], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=240)
            assert proc.returncode == 0, stderr[-3000:]
            outs.append(json.loads(next(x for x in stdout.splitlines() if x.startswith("RESULT"))[len("RESULT"):]))
    finally:
        for proc in procs:
            proc.kill()
    return outs


def test_two_processes_each_with_half_the_rows():
    """Each process holds rows of its own half only; both return the same 200 draws (samples come
    back on every process), whose mean is within 0.5 posterior sd of the exact mean (one data pass
    per draw, ESS ≳ 60: MCSE ≤ 0.13 sd, so 0.5 sd fails by chance with probability < 10⁻³ per
    coordinate) and whose sd is within 35 % (the sd's relative error at ESS 60 is ≈ 9 %, plus
    ConstantSGD's own ≤ 10 % on this Gaussian). Bounded: each process has 240 s."""
    outs = _two_processes()
    assert sorted(o["process"] for o in outs) == [0, 1] and all(o["devices"] == 2 for o in outs)
    assert sorted(tuple(o["local_rows"]) for o in outs) == [(0, 200), (200, 400)]
    w0, w1 = (np.asarray(o["w"]) for o in outs)
    np.testing.assert_array_equal(w0, w1)
    assert outs[0]["passes"] == outs[1]["passes"] > 0
    n, d = 400, 3
    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, d)) * np.array([1.0, 2.0, 3.0])
    t = X @ rng.normal(size=d) + rng.normal(size=n)
    cov = np.linalg.inv(np.eye(d) + X.T @ X)
    mean = cov @ X.T @ t
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(w0.mean(0) - mean) < 0.5 * sd), (w0.mean(0), mean, sd)
    assert np.all(np.abs(w0.std(0) / sd - 1) < 0.35), w0.std(0) / sd


@pytest.mark.slow  # two pairs of processes (about 2 min in CI); the streamed control-variate test below
# checks each process's own-row reads in the suite
def test_two_processes_stream_their_own_rows_of_one_file(tmp_path):
    """Both processes open the same .npy files (``numpyro_sgd.stream``: memory-mapped, never read
    whole). Under ``mesh=`` each device's minibatch rows (S/2 = 10 a step) are read by the process
    that owns the device, so process p's step reads lie in its own half of the rows; and the draws,
    the same on both processes, are those of the run whose processes hold their halves as device
    arrays (the same minibatch law and arithmetic)."""
    n, d = 400, 3
    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, d)) * np.array([1.0, 2.0, 3.0])
    t = X @ rng.normal(size=d) + rng.normal(size=n)
    np.save(tmp_path / "X.npy", X.astype(np.float32))
    np.save(tmp_path / "t.npy", t.astype(np.float32))
    streamed = {o["process"]: o for o in _two_processes(str(tmp_path))}
    in_memory = {o["process"]: o for o in _two_processes()}
    assert streamed[0]["step_reads"] == [[False, False]] and streamed[1]["step_reads"] == [[True, True]], streamed
    np.testing.assert_array_equal(streamed[0]["w"], streamed[1]["w"])
    np.testing.assert_allclose(streamed[0]["w"], in_memory[0]["w"], rtol=1e-5, atol=1e-6)


def _poisson_laplace(n=100_000, d=10):
    """The Laplace approximation (mode, sds) of CV_WORKER's Poisson regression, in float64."""
    rng = np.random.default_rng(1)
    X = (rng.normal(size=(n, d)) / np.sqrt(d)).astype(np.float32).astype(np.float64)
    y = rng.poisson(np.exp(X @ (0.5 * rng.normal(size=d)))).astype(np.float64)
    w = np.zeros(d)
    for _ in range(30):  # Newton on the log posterior (prior N(0, 1))
        mu = np.exp(X @ w)
        w = w + np.linalg.solve(X.T @ (X * mu[:, None]) + np.eye(d), X.T @ (y - mu) - w)
    mu = np.exp(X @ w)
    return w, np.sqrt(np.diag(np.linalg.inv(X.T @ (X * mu[:, None]) + np.eye(d))))


# in CI the streamed case (the reduction across processes, and each process reading its own rows);
# arrays held by each process (make_array_from_process_local_data) run with -m slow, and under
# ConstantSGD in test_two_processes_each_with_half_the_rows
@pytest.mark.parametrize("streamed", [pytest.param(False, marks=pytest.mark.slow), True])
def test_control_variates_in_two_processes_match_the_laplace_posterior(streamed, tmp_path):
    """``SGLD(model, control_variates=True, mesh=mesh)`` in two processes (issue 58), each holding
    its half of a Poisson regression's 10⁵ rows (D = 10): the centre's passes are reduced across
    the processes, and both processes return the same 1,000 draws, whose means are within 0.15
    posterior sd of the Laplace mode and sds within 15 % of its sds. Measured: 0.078 sd at most
    (one process: 0.085 sd, the same coordinate, so a shared offset, the posterior's skew or the
    kernel's own bias, not the processes); with ESS ≳ 500 the Monte Carlo error of a mean is
    ≤ 0.045 sd, so 0.15 sd fails by chance with probability < 10⁻³ per coordinate.

    ``streamed``: both processes open the same ``.npy`` files (``numpyro_sgd.stream``), and each
    reads only its own half of the rows for the SG steps (S/2 rows a device) and for every block of
    the centre's full-data passes. (At ``init`` each process also reads a few minibatches of S rows
    from anywhere in the files: the initial point's trace and potential, which are not sharded.)"""
    args = ()
    if streamed:
        n, d = 100_000, 10
        rng = np.random.default_rng(1)
        X = (rng.normal(size=(n, d)) / np.sqrt(d)).astype(np.float32)
        np.save(tmp_path / "X.npy", X)
        np.save(tmp_path / "y.npy", rng.poisson(np.exp(X @ (0.5 * rng.normal(size=d)))).astype(np.float32))
        args = (str(tmp_path),)
    outs = _two_processes(*args, worker=CV_WORKER)
    if streamed:
        assert all(o["step_reads"] >= 1_000 and o["reads"] > o["step_reads"] and o["outside"] == 0 for o in outs), outs
    assert sorted(tuple(o["local_rows"]) for o in outs) == [(0, 50_000), (50_000, 100_000)]
    for key in ("mean", "sd", "head"):
        np.testing.assert_array_equal(outs[0][key], outs[1][key])
    mode, sd = _poisson_laplace()
    mean, draws_sd = np.asarray(outs[0]["mean"]), np.asarray(outs[0]["sd"])
    assert np.all(np.abs(mean - mode) < 0.15 * sd), (mean - mode) / sd
    assert np.all(np.abs(draws_sd / sd - 1) < 0.15), draws_sd / sd
