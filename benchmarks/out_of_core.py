"""Data on disk, read in place: a logistic regression in ``.npy`` files opened with
``mmap_mode="r"``, sampled without loading them, against one sequential NumPy read of the files.

What runs (one process, in this order)
--------------------------------------
1. The data: X (N, D) float32 ~ N(0, I/D) and y ~ Bernoulli(σ(X w)), written to ``--dir`` in
   blocks (never held whole) unless the files are there, rows i.i.d. (so in random order).
2. The reference: the float64 Laplace approximation at the full-data mode
   (``benchmark_scaling.laplace``, Newton over row blocks of the memmaps), kept next to the files.
3. The read baseline: ``X[a:b].sum(0)`` over blocks of the memmap, twice (the first fills the page
   cache), then ``--repeats`` timed reads; the median is "one sequential read".
4. The runs, each as its documentation recommends, with the memmaps as the model arguments and
   NumPyro's default ``jit_model_args=False``:

   * ``ConstantSGD-full``: ``ConstantSGD(model)``, the plate at S = 10,000, 1 chain, 20 warmup and
     ``--draws`` draws (the large-N workflow of ``docs/workflow.md``);
   * ``SGLD-CV``: ``SGLD(model, control_variates=True)``, S = 1,000, 2 vectorized chains, 500
     warmup and 1,000 draws of one SG step each.

   Reported for each: compile seconds (``CompileClock``), the warmup call and the sampling call
   apart, the data passes of each (``SGState.data_passes``, and the centre's passes), the
   sampling seconds per data pass against one sequential read, the end-to-end wall, min bulk
   ESS, the largest mean error (posterior sds) and sd error against the reference, and the peak
   anonymous memory (``RssAnon``, sampled every 10 ms) above what the process held before the
   run, against the data's bytes.

    python benchmarks/out_of_core.py --n 20000000 --dir /tmp/ooc20m --breakdown     # 1.6 GB on disk
    python benchmarks/out_of_core.py --n 100000000 --dir /tmp/ooc100m --kernels SGLD-CV   # 8 GB
    python benchmarks/out_of_core.py --in-memory --n 2000000 --d 50     # peak memory, data in RAM
    python benchmarks/out_of_core.py --n 20000000 --dir /tmp/ooc20m --shards --kernels   # X as shards
    python benchmarks/out_of_core.py --n 20000000 --dir /tmp/ooc20m --cold --kernels     # page cache dropped
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from benchmark_scaling import laplace, make_model
from benchmark_throughput import CompileClock
from numpy.lib.format import open_memmap
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC

from numpyro_sgd import SGLD, ConstantSGD, stream

BLOCK = 1 << 20


def rss_anon_gib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


class PeakAnon:
    """The largest ``RssAnon`` seen while the block runs (a thread reads it every 10 ms)."""

    def __enter__(self):
        self.base = self.peak = rss_anon_gib()
        self._stop = threading.Event()

        def watch():
            while not self._stop.wait(0.01):
                self.peak = max(self.peak, rss_anon_gib())

        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon_gib())

    @property
    def growth(self):
        return self.peak - self.base


def write_data(directory, n, d, seed=0):
    """X.npy and y.npy in ``directory``, generated and written block by block."""
    os.makedirs(directory, exist_ok=True)
    px, py = os.path.join(directory, "X.npy"), os.path.join(directory, "y.npy")
    if os.path.exists(px) and os.path.exists(py):
        X = np.load(px, mmap_mode="r")
        if X.shape == (n, d):
            return px, py
    rng = np.random.default_rng(seed)
    w_true = rng.normal(0.0, 1.0, d)
    X = open_memmap(px, mode="w+", dtype=np.float32, shape=(n, d))
    y = open_memmap(py, mode="w+", dtype=np.float32, shape=(n,))
    for a in range(0, n, BLOCK):
        b = min(n, a + BLOCK)
        block = rng.standard_normal((b - a, d), dtype=np.float32) / np.float32(np.sqrt(d))
        X[a:b] = block
        y[a:b] = rng.random(b - a) < 1.0 / (1.0 + np.exp(-(block @ w_true)))
    X.flush()
    y.flush()
    del X, y
    return px, py


def reference(directory, X, y):
    path = os.path.join(directory, "laplace.npz")
    if os.path.exists(path):
        ref = np.load(path)
        return ref["mean"], ref["cov"], None
    start = time.perf_counter()
    mean, cov, info = laplace("logistic", X, y)
    np.savez(path, mean=mean, cov=cov)
    return mean, cov, time.perf_counter() - start


def read_once(X):
    """One sequential NumPy read of X: the column sums over blocks of rows."""
    total = np.zeros(X.shape[1], np.float64)
    for a in range(0, X.shape[0], BLOCK):
        total += X[a:a + BLOCK].sum(0)
    return total


def sequential_read(X, repeats):
    def once():
        start = time.perf_counter()
        read_once(X)
        return time.perf_counter() - start

    once(), once()  # page cache
    return float(np.median([once() for _ in range(repeats)]))


def drop_page_cache(*memmaps):
    """Drop the memmaps' files from the OS page cache: this process's page-table entries first
    (``madvise(MADV_DONTNEED)``), then the file's cached pages (``posix_fadvise(DONTNEED)``, which
    Linux honours for clean pages no process maps). On a virtual machine the host may still
    cache the file: "cold" is then the guest's page cache dropped."""
    import mmap

    for m in memmaps:
        base = m
        while not isinstance(base, mmap.mmap):
            base = base.base
        base.madvise(mmap.MADV_DONTNEED)
        fd = os.open(m.filename, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold(X, y, read_s, repeats):
    """Cold reads: the page cache dropped (:func:`drop_page_cache`) before each of one
    sequential read of X, one sampling pass of ConstantSGD-full (a run of one draw, about one
    pass, from a warmed-up state; the same run warm for comparison) and one pass of the
    hand-written loop with the native reader (:func:`hand_written_pass`); medians of
    ``repeats``."""
    from numpyro_sgd.minibatch.policy import choose_cluster_size

    def timed(fn, drop):
        seconds = []
        for _ in range(repeats):
            if drop:
                drop_page_cache(X, y)
            start = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - start)
        return float(np.median(seconds))

    run = warmed_runner((X, y))

    def one_draw():
        run(1, jax.random.key(1))

    one_draw()  # compiles
    b = choose_cluster_size(X.shape[0], 10_000, X.shape[1], X.shape[1] * X.itemsize + y.itemsize)
    loop = hand_written_pass(X, y, b, "native", repeats=0, program=True)
    cold_read = timed(lambda: read_once(X), True)
    warm_run, cold_run = timed(one_draw, False), timed(one_draw, True)
    warm_loop, cold_loop = timed(loop, False), timed(loop, True)
    print(f"cold, the page cache dropped before each (median of {repeats}): one sequential read of X {cold_read:.2f} s "
          f"(warm {read_s:.2f} s); ConstantSGD-full, a run of one draw (about one pass) from a warmed-up state, "
          f"{cold_run:.2f} s (warm {warm_run:.2f} s, {cold_run / cold_read:.2f}× the cold read); the hand-written loop "
          f"with the native reader, one pass {cold_loop:.2f} s (warm {warm_loop:.2f} s, "
          f"{cold_loop / cold_read:.2f}× the cold read)", flush=True)


def accuracy(draws, mean, cov):
    """min bulk ESS, max |mean error| in posterior sds, max relative sd error (draws: chains × draws × D)."""
    sd = np.sqrt(np.diag(cov))
    flat = draws.reshape(-1, draws.shape[-1])
    ess = float(np.min(effective_sample_size(draws)))
    return ess, float(np.max(np.abs(flat.mean(0) - mean) / sd)), float(np.max(np.abs(flat.std(0) / sd - 1)))


def run(name, data, clock, key, draws):
    model = make_model("logistic")
    if name == "ConstantSGD-full":
        kernel, s, chains, num_warmup, num_samples = ConstantSGD(model), 10_000, 1, 20, draws
    else:
        kernel, s, chains, num_warmup, num_samples = SGLD(model, control_variates=True), 1_000, 2, 500, 1_000
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=chains,
                chain_method="vectorized", progress_bar=False)
    with PeakAnon() as memory:
        c0, t0 = clock.seconds, time.perf_counter()
        mcmc.warmup(key, *data, subsample_size=s)
        jax.block_until_ready(mcmc.post_warmup_state)
        c1, t1 = clock.seconds, time.perf_counter()
        warm_passes = float(np.sum(np.asarray(mcmc.post_warmup_state.data_passes)))
        mcmc.run(key, *data, subsample_size=s)
        out = jax.block_until_ready(mcmc.get_samples(group_by_chain=True)["w"])
        c2, t2 = clock.seconds, time.perf_counter()
    state = mcmc.last_state
    passes = float(np.sum(np.asarray(state.data_passes)))
    control = getattr(state.kernel_state, "control", None)
    centre = float(np.sum(np.asarray(control.passes))) if control is not None else 0.0
    return dict(name=name, draws=np.asarray(out), compile_s=c2 - c0, warmup_s=t1 - t0 - (c1 - c0),
                sampling_s=t2 - t1 - (c2 - c1), wall_s=t2 - t0, warmup_passes=warm_passes,
                sampling_passes=passes - warm_passes, centre_passes=centre, anon_growth_gib=memory.growth,
                anon_base_gib=memory.base)


def warmed_runner(data, jit_args=False):
    """``run(num_samples, key)``: ConstantSGD-full (S = 10,000, 1 chain) sampling ``num_samples``
    draws (about one pass each) from one warmed-up state, until its draws are ready; its first
    call compiles."""
    mcmc = MCMC(ConstantSGD(make_model("logistic")), num_warmup=2, num_samples=1, progress_bar=False,
                jit_model_args=jit_args)
    mcmc.warmup(jax.random.key(0), *data, subsample_size=10_000)
    warm = jax.block_until_ready(mcmc.post_warmup_state)

    def run(num_samples, key):
        mcmc.num_samples = num_samples
        mcmc.post_warmup_state = warm
        mcmc.run(key, *data, subsample_size=10_000)
        jax.block_until_ready(mcmc.get_samples())

    return run


def marginal_pass(data, jit_args, repeats=3):
    """Seconds per sampling data pass of ConstantSGD-full (:func:`warmed_runner`): runs of 3 and
    6 draws from the same warmed-up state, compile excluded; median of differences."""
    run = warmed_runner(data, jit_args)
    seconds = {3: [], 6: []}
    for rep in range(repeats + 1):
        for k in seconds:
            start = time.perf_counter()
            run(k, jax.random.key(rep))
            if rep:  # the first round compiles
                seconds[k].append(time.perf_counter() - start)
    return (float(np.median(seconds[6])) - float(np.median(seconds[3]))) / 3


def hand_written_pass(X, y, cluster_size, reader, repeats=3, program=False):
    """Seconds per data pass of a hand-written ``lax.scan`` loop doing what ConstantSGD-full's
    sampling step does at its core (S = 10,000 rows in clusters of ``cluster_size``, the logistic
    gradient, θ ← θ − ε ∇), its rows read by ``reader``: ``"device"``, gathered by XLA from JAX
    arrays in device memory; ``"callback"``, one host callback that reads X's rows and y's
    (``np.take`` of each memmap), as the kernel's callback reader does
    (:func:`numpyro_sgd.data.streaming.one_read_per_plate`); ``"native"``, the kernel's native reader
    (:func:`numpyro_sgd.data.native.read_rows`, one custom call per array). ``program=True``: the
    compiled loop as a function of nothing (one pass), compiled without reading the data."""
    from numpyro_sgd.data import native
    from numpyro_sgd.minibatch.with_replacement import cluster_indices

    n, d, s = X.shape[0], X.shape[1], 10_000
    data = (jnp.asarray(X), jnp.asarray(y)) if reader == "device" else ()  # arguments, not XLA constants

    def rows(idx, data):
        if reader == "device":
            return data[0][idx], data[1][idx]
        if reader == "native":
            return native.read_rows([X], idx, "X"), native.read_rows([y], idx, "y")
        specs = (jax.ShapeDtypeStruct((s, d), jnp.float32), jax.ShapeDtypeStruct((s,), jnp.float32))
        return jax.pure_callback(lambda i: (np.take(X, i, axis=0), np.take(y, i)), specs, idx)

    def step(w, key, data):
        Xb, yb = rows(cluster_indices(key, s, n, cluster_size), data)
        return w - 1e-7 * (n / s) * (Xb.T @ (jax.nn.sigmoid(Xb @ w) - yb)), None

    loop = jax.jit(lambda w, keys, data: jax.lax.scan(lambda w, k: step(w, k, data), w, keys)[0])
    keys = jax.random.split(jax.random.key(0), n // s)
    if program:
        compiled = loop.lower(jnp.zeros(d), keys, data).compile()
        return lambda: compiled(jnp.zeros(d), keys, data).block_until_ready()
    loop(jnp.zeros(d), keys, data).block_until_ready()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        loop(jnp.zeros(d), keys, data).block_until_ready()
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds))


def breakdown(X, y, read_s):
    """Where a streamed pass's time goes: the marginal pass of the same kernel on the memmaps read
    by the native reader (the default) and by the host callback (``stream(X, reader="callback")``),
    and on JAX arrays in device memory; the same three against a hand-written loop
    (:func:`hand_written_pass`); an empty host callback in a compiled loop; and the host gathers
    of the callback runs (``StreamedRows.gather``, timed inside them: seconds per call, per array)."""
    from numpyro_sgd.data.streaming import StreamedRows
    from numpyro_sgd.minibatch.policy import choose_cluster_size

    b = choose_cluster_size(X.shape[0], 10_000, X.shape[1], X.shape[1] * X.itemsize + y.itemsize)
    hand = {reader: hand_written_pass(X, y, b, reader) for reader in ("native", "callback", "device")}
    timed_gather, spent = StreamedRows.gather, {}

    def gather(self, idx):
        start = time.perf_counter()
        out = timed_gather(self, idx)
        total, calls = spent.get(self.ndim, (0.0, 0))
        spent[self.ndim] = (total + time.perf_counter() - start, calls + 1)
        return out

    kernel = {"native": marginal_pass((X, y), False)}
    StreamedRows.gather = gather
    try:
        kernel["callback"] = marginal_pass((stream(X, reader="callback"), stream(y, reader="callback")), False)
    finally:
        StreamedRows.gather = timed_gather
    kernel["device"] = marginal_pass((jnp.asarray(X), jnp.asarray(y)), True)
    steps = X.shape[0] // 10_000
    loop = jax.jit(lambda k: jax.lax.scan(lambda c, i: (c + jax.pure_callback(
        lambda j: np.float32(0), jax.ShapeDtypeStruct((), jnp.float32), i), None), 0.0,
        jax.random.randint(k, (5_000,), 0, 10))[0])
    loop(jax.random.key(0)).block_until_ready()
    start = time.perf_counter()
    loop(jax.random.key(1)).block_until_ready()
    callback = (time.perf_counter() - start) / 5_000
    per_call = {ndim: total / calls for ndim, (total, calls) in spent.items()}
    for reader, what in (("native", "read by the native reader (one custom call per array)"),
                         ("callback", "read by one host callback"), ("device", "in device memory")):
        print(f"{reader:>8}: the rows {what}: ConstantSGD-full, S = 10,000 ({steps:,} steps), {kernel[reader]:.3f} s "
              f"a sampling pass ({kernel[reader] / read_s:.2f}× one read); a hand-written lax.scan loop of the same "
              f"step's core (B = {b}), {hand[reader]:.3f} s ({hand[reader] / read_s:.2f}× one read); the kernel "
              f"against the loop {kernel[reader] / hand[reader]:.2f}×", flush=True)
    print(f"the callback reader costs {1e6 * (kernel['callback'] - kernel['native']) / steps:.0f} µs more a step than "
          f"the native one: an empty host callback in a compiled loop {1e6 * callback:.0f} µs, and its host gathers "
          f"{1e6 * per_call.get(2, float('nan')):.0f} µs for X's rows and {1e6 * per_call.get(1, float('nan')):.0f} µs "
          "for y's (both in one callback a step).", flush=True)


def shards_pass(directory, X, y, read_s, rows=1_000_000):
    """The marginal sampling pass of ConstantSGD-full with X as a directory of ``.npy`` shards of
    ``rows`` rows (written once, from the memmap, next to the files), read by the native reader
    and by the host callback, against the single file."""
    from numpyro_sgd import open_shards

    d = Path(directory) / "X_shards"
    if not d.is_dir():
        d.mkdir()
        for k, a in enumerate(range(0, X.shape[0], rows)):
            np.save(d / f"{k:04d}.npy", np.asarray(X[a:a + rows]))
    for part in open_shards(d).source.arrays:  # into the page cache, as the single file is
        np.asarray(part).sum()
    single = marginal_pass((X, y), False)
    for reader in ("auto", "callback"):
        shards = open_shards(d, reader=reader)
        seconds = marginal_pass((shards, y), False)
        print(f"X as {len(shards.source.arrays)} shards of {rows:,} rows, read by the "
              f"{'native reader' if shards.native else 'host callback'}: ConstantSGD-full, a sampling pass "
              f"{seconds:.3f} s ({seconds / read_s:.2f}× one read; the single file {single:.3f} s, "
              f"{single / read_s:.2f}×)", flush=True)


#: XLA:CPU's loop emitters for every program of the process (jaxlib versions that still have
#: them): compiling NumPyro's sampling loop with the MLIR fusion emitters holds 60–80 MB more
LOOP_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def in_memory(args):
    """Peak anonymous memory of ConstantSGD-full (20 warmup + 50 draws, S = 10,000) on in-memory
    data, above what the process held before the data were made (JAX initialised): a NumPy array
    streamed from host memory (``stream(X)``, ``jit_model_args=False``: one copy, the user's)
    against the same data moved to JAX arrays (``jit_model_args=True``, the NumPy copy then
    dropped: the device copy and what NumPyro's loop adds), the NumPy arrays given as they are
    to NumPyro's defaults (``--mode numpy``: the kernel reads arrays of 32 MiB or more in place,
    ``model_args.AUTO_STREAM_BYTES``) and JAX arrays given to NumPyro's defaults (``--mode
    constants``: closed over by the loop as constants, a warning names the two fixes; what NumPy
    arrays cost before the kernels read them in place). One mode per process (``--mode``);
    ``--mode nuts`` runs NumPyro's NUTS on the full-data model and JAX arrays instead, for the
    part of the memory that does not grow with N. Where the jaxlib has XLA:CPU's loop emitters,
    the stream is run a second time with them for every program (:data:`LOOP_EMITTERS`)."""
    if args.mode is None:
        import subprocess
        import sys

        from numpyro_sgd.numerics.compilation import quick_compile_options

        runs = [("stream", {}), ("device", {}), ("numpy", {}), ("constants", {})]
        if "xla_cpu_use_fusion_emitters" in (quick_compile_options("warmup") or {}):  # XLA:CPU has loop emitters
            flags = (os.environ.get("XLA_FLAGS", "") + " " + LOOP_EMITTERS).strip()
            runs.append(("stream", {"XLA_FLAGS": flags}))
        for mode, env in runs:
            subprocess.run([sys.executable, __file__, "--in-memory", "--mode", mode, "--n", str(args.n),
                            "--d", str(args.d), "--dtype", args.dtype, "--order", args.order], check=True,
                           env={**os.environ, **env})
        return
    jax.jit(lambda x: x + 1)(1.0)
    base = rss_anon_gib()
    rng = np.random.default_rng(0)
    dtype = np.dtype(args.dtype)  # float64: JAX narrows it to float32 (the native reader as it copies a row)
    X = rng.standard_normal((args.n, args.d), dtype=dtype) / dtype.type(np.sqrt(args.d))
    y = (rng.random(args.n) < 1 / (1 + np.exp(-(X @ rng.normal(size=args.d))))).astype(dtype)
    if args.order == "F":  # what pandas' DataFrame.to_numpy() gives
        X = np.asfortranarray(X)
    gib = (X.nbytes + y.nbytes) / 2**30
    with PeakAnon() as memory:
        start = time.perf_counter()
        if args.mode == "numpy":  # what a user who passes NumPy arrays to NumPyro's defaults gets
            data, jit_args, label = (X, y), False, "NumPy arrays, NumPyro's default jit_model_args=False"
        elif args.mode == "constants":
            data, jit_args, label = (jnp.asarray(X), jnp.asarray(y)), False, "JAX arrays, jit_model_args=False"
            del X, y
        elif args.mode == "stream":
            data, jit_args, label = (stream(X), stream(y)), False, "stream(X), stream(y) from host memory"
            if LOOP_EMITTERS in os.environ.get("XLA_FLAGS", ""):
                label += f", XLA_FLAGS={LOOP_EMITTERS}"
        else:
            data, jit_args = (jnp.asarray(X), jnp.asarray(y)), True
            label = "JAX arrays, jit_model_args=True" + (", NumPyro's NUTS" if args.mode == "nuts" else "")
            del X, y
        if args.mode == "nuts":  # the full-data model (subsample_size=None): the constant part, for scale
            from numpyro.infer import NUTS

            mcmc = MCMC(NUTS(make_model("logistic")), num_warmup=20, num_samples=50, progress_bar=False,
                        jit_model_args=True)
            mcmc.run(jax.random.key(0), *data)
        else:
            mcmc = MCMC(ConstantSGD(make_model("logistic")), num_warmup=20, num_samples=50, progress_bar=False,
                        jit_model_args=jit_args)
            mcmc.run(jax.random.key(0), *data, subsample_size=10_000)
        jax.block_until_ready(mcmc.get_samples())
        seconds = time.perf_counter() - start
    peak = memory.peak - base
    layout = ", Fortran order" if args.order == "F" else ""
    print(f"in-memory data, N = {args.n:,}, D = {args.d}, {dtype}{layout}, {gib:.2f} GiB: {label}: {seconds:.1f} s; "
          "peak RssAnon "
          f"{peak:.2f} GiB above the process before the data = {peak / gib:.2f}× the data ({peak - gib:.2f} GiB "
          "beyond one copy)", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20_000_000)
    parser.add_argument("--d", type=int, default=20)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                        help="--in-memory: the arrays' dtype")
    parser.add_argument("--order", choices=["C", "F"], default="C",
                        help="--in-memory: X in C or Fortran order (pandas' to_numpy())")
    parser.add_argument("--dir", default="/tmp/numpyro_sgd_out_of_core")
    parser.add_argument("--kernels", nargs="*", default=["ConstantSGD-full", "SGLD-CV"])
    parser.add_argument("--draws", type=int, default=300, help="ConstantSGD-full's draws (about one pass each)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--breakdown", action="store_true", help="also time a streamed pass against device memory")
    parser.add_argument("--shards", action="store_true", help="also time a pass with X as a directory of shards")
    parser.add_argument("--cold", action="store_true", help="also time a read and a pass with the page cache dropped")
    parser.add_argument("--in-memory", action="store_true")
    parser.add_argument("--mode", choices=["stream", "device", "numpy", "constants", "nuts"], default=None,
                        help="--in-memory: one mode")
    args = parser.parse_args(argv)
    if args.in_memory:
        return in_memory(args)
    px, py = write_data(args.dir, args.n, args.d)
    X, y = np.load(px, mmap_mode="r"), np.load(py, mmap_mode="r")
    gib = (X.nbytes + y.nbytes) / 2**30
    print(f"data: {args.dir}, N = {args.n:,}, D = {args.d}, {gib:.2f} GiB on disk (X and y, float32)", flush=True)
    mean, cov, seconds = reference(args.dir, X, y)
    print("reference: float64 Laplace " + ("(cached)" if seconds is None else f"({seconds:.1f} s)"), flush=True)
    read_s = sequential_read(X, args.repeats)
    print(f"one sequential NumPy read of X from the page cache: {read_s:.2f} s (median of {args.repeats})", flush=True)
    clock = CompileClock()
    if args.breakdown:
        breakdown(X, y, read_s)
    if args.shards:
        shards_pass(args.dir, X, y, read_s)
    if args.cold:
        cold(X, y, read_s, args.repeats)
    for name in args.kernels:
        r = run(name, (X, y), clock, jax.random.key(0), args.draws)
        ess, mean_err, sd_err = accuracy(r["draws"], mean, cov)
        per_pass = r["sampling_s"] / r["sampling_passes"] if r["sampling_passes"] else float("nan")
        ok = ess >= 100 and mean_err <= 0.15 and sd_err <= 0.10
        print(f"{name}: compile {r['compile_s']:.1f} s; warmup {r['warmup_s']:.1f} s "
              f"({r['warmup_passes']:.1f} SG passes"
              + (f" and the centre's {r['centre_passes']:.0f} full-data passes" if r["centre_passes"] else "")
              + f"); sampling {r['sampling_s']:.1f} s ({r['sampling_passes']:.1f} passes, {per_pass:.2f} s per pass = "
              f"{per_pass / read_s:.2f}× one sequential read); end to end {r['wall_s']:.1f} s. min bulk ESS {ess:.0f}, "
              f"max |mean error| {mean_err:.3f} sd, max sd error {100 * sd_err:.1f} %: "
              + ("accurate" if ok else "NOT accurate")
              + f". Peak RssAnon {r['anon_growth_gib']:.2f} GiB above the {r['anon_base_gib']:.2f} GiB before the run "
              f"= {r['anon_growth_gib'] / gib:.3f}× the data's {gib:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
