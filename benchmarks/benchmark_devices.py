"""Throughput of ConstantSGD-full with the rows on 1 device, on 2 devices of one process
(``mesh=``, forced host devices) and on 2 processes under ``jax.distributed`` (gloo, localhost).

Bayesian logistic regression, N rows × D features (float32, simulated with a fixed seed),
S = N/100 (or each of ``--s``), one chain, ``jit_model_args=True``. Each configuration runs in its own subprocess
(``XLA_FLAGS`` must be set before JAX starts). It times ``MCMC.run`` with 20 warmup iterations and
A draws (one data pass per draw): the time a user waits, compilation included. Then, from the
post-warmup state, it compiles one loop of ``--passes`` calls of the kernel's ``sample`` (one
data pass each), runs it once untimed and once timed: the cost of a data pass in the sampling
phase, free of compilation and warmup. Printed as a Markdown table.

    python benchmarks/benchmark_devices.py                       # N = 200,000, D = 10
    python benchmarks/benchmark_devices.py --n 1000000 --d 50 --passes 50
    python benchmarks/benchmark_devices.py --n 1000000 --d 50 --s 1000 10000 100000 --modes 1dev 2proc
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

WORKER = textwrap.dedent(r"""
    import json, sys, time
    mode, n, d, draws, port, process_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
        sys.argv[5], int(sys.argv[6])
    passes, s = int(sys.argv[7]), int(sys.argv[8])
    import jax
    if mode == "2proc":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                                   process_id=process_id, initialization_timeout=120)
    import numpy as np, numpyro, numpyro.distributions as dist
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from numpyro.infer import MCMC
    from numpyro_sgd import ConstantSGD
    from numpyro_sgd.datasets import process_rows

    rng = np.random.default_rng(0)
    X = (rng.normal(size=(n, d)) / np.sqrt(d)).astype(np.float32)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-X @ rng.normal(size=d)))).astype(np.float32)

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=s) as i:
            numpyro.sample("y", dist.Bernoulli(logits=X[i] @ w), obs=y[i])

    mesh = None
    if mode != "1dev":
        mesh = Mesh(np.array(jax.devices()), ("data",))
        sharding = NamedSharding(mesh, P("data"))
        rows = process_rows(n) if mode == "2proc" else slice(0, n)
        X, y = (jax.make_array_from_process_local_data(sharding, a[rows], a.shape) for a in (X, y))
    mcmc = MCMC(ConstantSGD(model, preconditioner="full", mesh=mesh), num_warmup=20, num_samples=draws,
                progress_bar=False, jit_model_args=True)
    start = time.perf_counter()
    mcmc.run(jax.random.key(1), X, y)
    jax.block_until_ready(mcmc.last_state)
    user = time.perf_counter() - start
    # the sampling phase alone: `passes` calls of the kernel's sample (one data pass each) in one
    # compiled loop from the post-warmup state, compiled first, then timed
    kernel, state = mcmc.sampler, mcmc.last_state
    loop = jax.jit(lambda st, X, y: jax.lax.fori_loop(0, passes, lambda i, s: kernel.sample(s, (X, y), {}), st))
    compiled = loop.lower(state, X, y).compile()
    jax.block_until_ready(compiled(state, X, y))
    start = time.perf_counter()
    jax.block_until_ready(compiled(state, X, y))
    per_pass = (time.perf_counter() - start) / passes
    print("RESULT" + json.dumps(dict(devices=jax.device_count(), process=jax.process_index(), user=user,
                                     per_pass=per_pass)))
""")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(mode, n, d, draws, passes, s):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    if mode == "2dev":
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    port = str(_free_port())
    count = 2 if mode == "2proc" else 1
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, mode, str(n), str(d), str(draws), port, str(i),
                               str(passes), str(s)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(count)]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=1800)
        if proc.returncode:
            raise RuntimeError(f"{mode}: worker failed:\n{stderr[-2000:]}")
        outs.append(json.loads(next(x for x in stdout.splitlines() if x.startswith("RESULT"))[len("RESULT"):]))
    return outs[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--draws", type=int, default=100, help="A: draws of the user's run (one data pass each)")
    parser.add_argument("--passes", type=int, default=100, help="data passes of the timed sampling loop")
    parser.add_argument("--modes", nargs="+", default=["1dev", "2dev", "2proc"])
    parser.add_argument("--s", type=int, nargs="+", default=None,
                        help="subsample sizes S (in all; each process draws S/2 under mesh=), default N/100; "
                             "several values find the S at which two processes beat one")
    args = parser.parse_args()
    sizes = args.s or [args.n // 100]
    print(f"N = {args.n:,}, D = {args.d}, S = {', '.join(f'{s:,}' for s in sizes)}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d')}\n")
    print(f"| S | rows on | devices | wall, 20 warmup + {args.draws} draws (s) | s per data pass (sampling) | "
          "ms per SG step | speed vs 1 device (same S) |")
    print("|---|---|---|---|---|---|---|")
    for s in sizes:
        base = None
        for mode in args.modes:
            out = run(mode, args.n, args.d, args.draws, args.passes, s)
            base = out["per_pass"] if base is None else base
            label = {"1dev": "1 device", "2dev": "2 devices, 1 process (mesh=)",
                     "2proc": "2 processes, jax.distributed + gloo (mesh=)"}[mode]
            print(f"| {s:,} | {label} | {out['devices']} | {out['user']:.1f} | {out['per_pass']:.4f} | "
                  f"{1e3 * out['per_pass'] * s / args.n:.3f} | {base / out['per_pass']:.2f}× |", flush=True)

if __name__ == "__main__":
    main()
