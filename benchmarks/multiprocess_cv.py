"""Control variates across processes: ``SGLD(model, control_variates=True)`` on a logistic regression
whose rows are in ``.npy`` files, in one process against two processes on this machine
(``jax.distributed`` on 127.0.0.1, gloo collectives), every process streaming the same files
(``numpyro_sgd.stream``) and reading its own rows under ``mesh=``.

What runs
---------
1. The data (``out_of_core.write_data``: X (N, D) float32 ~ N(0, I/D), y ~ Bernoulli(σ(X w))) in
   ``--dir``, unless there; the float64 Laplace reference (``out_of_core.reference``) beside them.
2. For each of ``--processes`` (default 1 and 2), in fresh processes: ``MCMC(SGLD(model,
   control_variates=True, mesh=...), num_warmup=W, num_samples=A)``, S = ``--s``, one chain,
   ``jit_model_args=False`` (streamed data are never loop arguments). Each run is timed as
   ``mcmc.warmup`` (the noise warmup, then the centre's Newton steps over full-data passes) and
   ``mcmc.run`` (sampling) apart, with the compile seconds (``CompileClock``) taken out of each
   and reported on their own; the centre's passes and the SG passes; the seconds per centre pass
   (the warmup's seconds less those of its SG steps, at the sampling rate, over its centre
   passes); and the largest mean and sd errors against the reference.

    python benchmarks/multiprocess_cv.py --n 20000000 --d 20 --dir /tmp/mpcv20m
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np

WORKER = textwrap.dedent(r"""
    import json, sys, time
    import jax
    process_id, processes, port, path, n, d, s, warmup, draws = sys.argv[1:10]
    process_id, processes, n, d, s, warmup, draws = map(int, (process_id, processes, n, d, s, warmup, draws))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if processes > 1:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=processes,
                                   process_id=process_id, initialization_timeout=120)
    sys.path.insert(0, sys.argv[10])
    import numpy as np
    from benchmark_scaling import make_model
    from benchmark_throughput import CompileClock
    from jax.sharding import Mesh
    from numpyro.infer import MCMC
    from numpyro_sgd import SGLD, stream

    clock = CompileClock()
    mesh = Mesh(np.array(jax.devices()), ("data",)) if processes > 1 else None
    data = (stream(path + "/X.npy"), stream(path + "/y.npy"))
    mcmc = MCMC(SGLD(make_model("logistic"), control_variates=True, mesh=mesh), num_warmup=warmup,
                num_samples=draws, progress_bar=False, jit_model_args=False)
    t0, c0 = time.perf_counter(), clock.seconds
    mcmc.warmup(jax.random.key(1), *data, subsample_size=s)
    jax.block_until_ready(mcmc.post_warmup_state)
    t1, c1 = time.perf_counter(), clock.seconds
    mcmc.run(jax.random.key(2), *data, subsample_size=s)
    w = mcmc.get_samples()["w"]
    w = np.asarray(w.addressable_data(0) if processes > 1 else w, np.float64)
    t2, c2 = time.perf_counter(), clock.seconds
    state = mcmc.last_state
    local = (lambda x: np.asarray(x.addressable_data(0))) if processes > 1 else np.asarray
    centre = float(np.sum(local(state.kernel_state.adapted.control.passes)))
    warm_sg = float(np.sum(local(mcmc.post_warmup_state.data_passes)))
    print("RESULT" + json.dumps(dict(
        process=process_id, wall=t2 - t0, compile=c2 - c0, warmup=t1 - t0 - (c1 - c0), sampling=t2 - t1 - (c2 - c1),
        centre_passes=centre, warmup_sg_passes=warm_sg,
        sampling_sg_passes=float(np.sum(local(state.data_passes))) - warm_sg,
        mean=w.mean(0).tolist(), sd=w.std(0).tolist())), flush=True)
""")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(processes, directory, n, d, s, warmup, draws, timeout=3600):
    """The workers' results (one dict per process) of one run with ``processes`` processes."""
    here = os.path.dirname(os.path.abspath(__file__))
    port = str(_free_port())
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    args = [str(x) for x in (processes, port, directory, n, d, s, warmup, draws, here)]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(i), *args], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(processes)]
    outs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(stderr[-3000:])
            outs.append(json.loads(next(x for x in stdout.splitlines() if x.startswith("RESULT"))[len("RESULT"):]))
    finally:
        for proc in procs:
            proc.kill()
    return outs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2_000_000)
    parser.add_argument("--d", type=int, default=20)
    parser.add_argument("--s", type=int, default=1_000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--draws", type=int, default=1_000)
    parser.add_argument("--dir", default="/tmp/mpcv")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from out_of_core import reference, write_data

    t = time.perf_counter()
    px, py = write_data(args.dir, args.n, args.d)
    print(f"data: {args.dir}, N = {args.n:,}, D = {args.d}, {(os.path.getsize(px) + os.path.getsize(py)) / 2**30:.2f} "
          f"GiB on disk ({time.perf_counter() - t:.0f} s to write or find)")
    mean, cov, took = reference(args.dir, np.load(px, mmap_mode="r"), np.load(py, mmap_mode="r"))
    sd = np.sqrt(np.diag(cov))
    print("Laplace reference: " + ("kept from an earlier run" if took is None else f"{took:.0f} s"))
    print(f"SGLD(control_variates=True), S = {args.s:,}, {args.warmup} warmup + {args.draws} draws, one chain")
    print("| processes | wall s | compile s | warmup s | sampling s | centre passes | s per centre pass | "
          "SG passes (warmup, sampling) | max mean err (sd) | max sd err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in args.processes:
        outs = run(k, args.dir, args.n, args.d, args.s, args.warmup, args.draws)
        o = outs[0]
        if any(x["mean"] != o["mean"] for x in outs):
            print(f"  {k} processes returned different draws")
        rate = o["sampling"] / max(o["sampling_sg_passes"], 1e-12)  # seconds per SG data pass
        per_pass = (o["warmup"] - rate * o["warmup_sg_passes"]) / max(o["centre_passes"], 1e-12)
        err = np.max(np.abs(np.asarray(o["mean"]) - mean) / sd)
        sde = np.max(np.abs(np.asarray(o["sd"]) / sd - 1))
        print(f"| {k} | {o['wall']:.1f} | {o['compile']:.1f} | {o['warmup']:.1f} | {o['sampling']:.1f} | "
              f"{o['centre_passes']:.1f} | {per_pass:.2f} | "
              f"{o['warmup_sg_passes']:.2f}, {o['sampling_sg_passes']:.2f} | "
              f"{err:.3f} | {100 * sde:.1f} % |", flush=True)


if __name__ == "__main__":
    main()
