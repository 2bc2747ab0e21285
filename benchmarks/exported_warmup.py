"""What a cache of lowered programs could save a warm process: an experiment, not a package feature.

The run of ``benchmarks/persistent_cache.py --kernel SGLD-CV`` (``SGLD(model, control_variates=True)``,
logistic regression, D = 50, S = 1,000, 500 + 1,000 iterations, 2 vectorized chains,
``jit_model_args=True``) in fresh processes that share JAX's persistent compilation cache, by two
routes:

* ``plain``: as users run it; a warm process traces and lowers every program again, and JAX's cache
  skips only XLA's compile.
* ``exported``: the kernel's warmup program (noise warmup, Newton centre, curvature, noise measure)
  is exported with ``jax.export`` by the first process and, in later processes, called from the
  export (deserialised, wrapped in one ``jax.jit``), so it is neither traced nor lowered again. The
  hook replaces ``numpyro_sgd.driver.programs.ProgramCache.get`` for the ``"warmup"`` kind; nothing
  checks that the export still matches the kernel, the model and the data's shapes, which is why
  this is not in the package.

Each route runs ``--warm`` + 2 processes after one cold process (the exported route's first warm
process compiles the program that calls the export, once, so it is not counted). Printed per
process: the wall of ``mcmc.run`` (data already in memory), JAX's trace, lower and compile seconds,
and the first three posterior means (both routes give the same draws up to float rounding: the
exported program is compiled without the driver's compile options).

    python benchmarks/exported_warmup.py --n 1000000

Needs ``flatbuffers`` (JAX's serialisation of exports): ``pip install flatbuffers``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time


def child(args):
    import jax

    jax.config.update("jax_compilation_cache_dir", os.path.join(args.cache, "xla"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    import jax.numpy as jnp
    import numpy as np
    from jax import export
    from numpyro.infer import MCMC

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from overhead import Clock, Counted, simulate

    from numpyro_sgd import SGLD
    from numpyro_sgd.driver import programs

    X, y = simulate(args.n, args.d)
    jnp.zeros(3).block_until_ready()
    path = os.path.join(args.cache, "warmup.exported")
    get = programs.ProgramCache.get

    def exported_get(self, key, make, arrays, options=None):
        if self.kind != "warmup":
            return get(self, key, make, arrays, options)
        if os.path.exists(path):  # a later process: call the export
            with open(path, "rb") as f:
                blob, out_tree = pickle.load(f)
            exported = export.deserialize(blob)
            call = jax.jit(lambda *leaves: exported.call(*leaves))
            return lambda *a: jax.tree.unflatten(out_tree, call(*jax.tree.leaves(a)))
        loop, program = make(), get(self, key, make, arrays, options)  # the first process: run as usual,
        # then export the same function

        def run(*a):
            leaves, tree = jax.tree.flatten(a)
            out = program(*a)
            flat = jax.jit(lambda *leaves: jax.tree.leaves(loop(*jax.tree.unflatten(tree, leaves))))
            with open(path, "wb") as f:
                pickle.dump((export.export(flat)(*leaves).serialize(), jax.tree.structure(out)), f)
            return out

        return run

    if args.route == "exported":
        programs.ProgramCache.get = exported_get
    clock = Clock()
    t0 = time.perf_counter()
    mcmc = MCMC(SGLD(Counted(args.d, args.s), control_variates=True), num_warmup=500, num_samples=1000,
                num_chains=2, chain_method="vectorized", jit_model_args=True, progress_bar=False)
    mcmc.run(jax.random.key(0), X, y)
    w = np.asarray(jax.block_until_ready(mcmc.get_samples()["w"]))
    wall = time.perf_counter() - t0
    print("RESULT" + json.dumps(dict(wall=wall, **{k: v for k, v in clock.read().items() if k != "programs"},
                                     means=w.mean(0)[:3].tolist())))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=50)
    ap.add_argument("--s", type=int, default=1_000)
    ap.add_argument("--warm", type=int, default=2, help="warm processes measured per route")
    ap.add_argument("--route", choices=("plain", "exported"))
    ap.add_argument("--cache")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    print(f"SGLD(model, control_variates=True), logistic N = {args.n:,}, D = {args.d}, S = {args.s:,}")
    print("| route | process | wall s | trace s | lower s | compile s | means[:3] |")
    print("|---|---|---|---|---|---|---|")
    for route in ("plain", "exported"):
        with tempfile.TemporaryDirectory() as cache:
            runs = ["cold"] + (["warm (compiles the call of the export)"] if route == "exported" else [])
            runs += [f"warm {i + 1}" for i in range(args.warm)]
            for label in runs:
                cmd = [sys.executable, __file__, "--child", "--route", route, "--cache", cache,
                       "--n", str(args.n), "--d", str(args.d), "--s", str(args.s)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                r = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT"))[6:])
                means = ", ".join(f"{m:.6f}" for m in r["means"])
                print(f"| {route} | {label} | {r['wall']:.2f} | {r['trace']:.2f} | {r['lower']:.2f} | "
                      f"{r['compile']:.2f} | {means} |", flush=True)


if __name__ == "__main__":
    main()
