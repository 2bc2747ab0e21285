"""Which XLA options to compile the control-variate warmup program with: ``anchors.py``'s SGLD-CV
run (logistic regression, N rows × D = 50 held on the device, S = 1,000, 2 vectorized chains, 500
warmup + 1,000 steps) repeated in one process with different ``compiler_options`` for the warmup
program (``numerics.compilation.QUICK_COMPILE_GPU`` / ``QUICK_COMPILE`` patched, JAX's caches
cleared between runs), each scored against the float64 Laplace reference. Reported per variant:
the warmup program's compile seconds, warmup and centre seconds, the sampling loop's compile,
the end-to-end wall, min bulk ESS and the errors.

    python benchmarks/warmup_compile_options.py --n 10000000
"""

from __future__ import annotations

import argparse
import time

import anchors
import jax
import jax.numpy as jnp
from benchmark_scaling import laplace, make_model, simulate
from benchmark_throughput import CompileClock

from numpyro_sgd.numerics import compilation

GPU_VARIANTS = {
    "autotune 0 (default)": {"xla_gpu_autotune_level": 0},
    "autotune 0, no LLVM optimisation": {"xla_gpu_autotune_level": 0, "xla_backend_optimization_level": 0},
    "autotune 0, no expensive LLVM passes": {"xla_gpu_autotune_level": 0, "xla_llvm_disable_expensive_passes": True},
    "autotune 0, both": {"xla_gpu_autotune_level": 0, "xla_backend_optimization_level": 0,
                         "xla_llvm_disable_expensive_passes": True},
}
CPU_VARIANTS = {
    "loop emitters, no LLVM optimisation (N·D ≤ 10⁸)": dict(compilation.QUICK_COMPILE["init"]),
    "loop emitters (N·D > 10⁸)": dict(compilation.QUICK_COMPILE["warmup"]),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    args = ap.parse_args()
    gpu = jax.default_backend() != "cpu"
    table = compilation.QUICK_COMPILE_GPU if gpu else compilation.QUICK_COMPILE
    variants = GPU_VARIANTS if gpu else CPU_VARIANTS
    X, y, _ = simulate("logistic", args.n, 50, 0)
    reference = laplace("logistic", X, y)[:2]
    data = (jnp.asarray(X), jnp.asarray(y))
    model = make_model("logistic")
    anchors.CLOCK = CompileClock()
    print(f"logistic regression, N = {args.n:,}, D = 50, {jax.devices()[0].device_kind}", flush=True)
    print("| warmup program's options | its compile s | warmup + centre s | sampling loop compile s | wall s | "
          "min bulk ESS | max mean err (sd) | max sd err |\n|---|---|---|---|---|---|---|---|", flush=True)
    for name, options in variants.items():
        table["init"] = table["warmup"] = options
        compilation._SUPPORTED_OPTIONS.clear()
        jax.clear_caches()
        t0 = time.perf_counter()
        draws, _ = anchors.run_sgld_cv(model, data, jax.random.key(0), args.n)
        wall = time.perf_counter() - t0
        ess, err, sd_err = anchors.score(draws, reference)
        s = anchors.SPLIT
        s.pop("mcmc", None), s.pop("kernel", None), s.pop("data", None)
        print(f"| {name} | {s['compile_warmup_s']:.1f} | {s['warmup_s']:.2f} | {s['compile_sampling_s']:.1f} | "
              f"{wall:.1f} | {ess:,.0f} | {err:.3f} | {sd_err:.3f} |", flush=True)


if __name__ == "__main__":
    main()
