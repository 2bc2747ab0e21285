"""Does splitting the rows over the cores of one CPU speed up a data pass?

A hand-written jitted ``lax.scan`` data pass of cluster minibatches (the kernels' default law at
large N: S/B clusters of B consecutive rows, logistic-regression gradient) with the rows split over
``--devices`` forced host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=k``), each
device drawing its S/k rows among its own N/k with ``shard_map`` and one all-reduce of the
D-vector per step, as ``mesh=`` does. Printed: seconds per pass for each of ``--repeats`` rounds,
and (one device only) a NumPy ``X.sum(0)`` of the same array in the same process. Run it once per
device count and compare:

    python benchmarks/host_devices.py --devices 1
    python benchmarks/host_devices.py --devices 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--n", type=int, default=10_000_000)
    p.add_argument("--d", type=int, default=50)
    p.add_argument("--s", type=int, default=10_000)
    p.add_argument("--cluster-size", type=int, default=125)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if "jax" in sys.modules:
        raise RuntimeError("run this as a script: the device count is fixed when JAX starts")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={args.devices}")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax, random
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    k, n, d, s, b = args.devices, args.n, args.d, args.s, args.cluster_size
    if n % k or s % (k * b):
        raise ValueError("--n must be a multiple of --devices and --s of devices × cluster size")
    rng = np.random.default_rng(0)
    X_host = rng.standard_normal((n, d), dtype=np.float32)
    y_host = (rng.random(n) < 0.5).astype(np.float32)
    mesh = Mesh(np.array(jax.devices()[:k]), ("d",))
    X = jax.device_put(X_host, NamedSharding(mesh, P("d")))
    y = jax.device_put(y_host, NamedSharding(mesh, P("d")))
    del X_host
    rows, per = n // k, s // k

    def local_grad(w, key, X, y):
        starts = random.randint(random.fold_in(key, lax.axis_index("d")), (per // b,), 0, rows)
        idx = lax.optimization_barrier(((starts[:, None] + jnp.arange(b)) % rows).reshape(-1))
        xb, yb = X[idx], y[idx]
        return lax.psum(xb.T @ (yb - jax.nn.sigmoid(xb @ w)), "d")

    grad = jax.shard_map(local_grad, mesh=mesh, in_specs=(P(), P(), P("d"), P("d")), out_specs=P())

    @jax.jit
    def one_pass(w, key, X, y):
        return lax.scan(lambda w, kk: (w + 1e-7 * grad(w, kk, X, y), None), w, random.split(key, n // s))[0]

    w = jnp.zeros(d, jnp.float32)
    one_pass(w, random.key(0), X, y).block_until_ready()  # compile
    X_read = np.asarray(X) if k == 1 else None  # the same buffer, read by NumPy (no copy on CPU)
    print(f"N = {n:,}, D = {d}, S = {s:,}, B = {b}, {k} host device(s), {os.cpu_count()} CPUs")
    for r in range(args.repeats):
        t = time.perf_counter()
        one_pass(w, random.key(r + 1), X, y).block_until_ready()
        line = f"pass {time.perf_counter() - t:.3f} s"
        if X_read is not None:
            t = time.perf_counter()
            X_read.sum(0)
            line += f", NumPy X.sum(0) {time.perf_counter() - t:.3f} s"
        print(line, flush=True)


if __name__ == "__main__":
    main()
