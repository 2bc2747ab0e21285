"""Sampling seconds per 1,000 effective samples of ``SGLD(model, control_variates=True)`` at
N = 10⁵, 10⁶ and 10⁷ rows: is the cost of an effective sample, after the centre, flat in N?

For each N (``benchmark_scaling.py``'s simulated GLM, float32, S = 1,000, 2 vectorized chains,
``jit_model_args=True``): one ``mcmc.run`` of 500 warmup and 1,000 draws gives the draws' min bulk
ESS; then, from its last state, runs of 5,000 and 25,000 draws, each timed three times after one
round that compiles them, interleaved. NumPyro's loop copies the data once per ``run`` call
whatever its length (about 0.2–0.5 s at 2 GB here, with page faults on fresh buffers), so the
cost of a draw is the difference of the two medians over 20,000 draws; seconds per 1,000
effective samples = that cost × 10⁶ / (ESS of 1,000 draws of both chains).

    python benchmarks/cv_cost_per_ess.py logistic          # D = 50
    python benchmarks/cv_cost_per_ess.py poisson           # D = 40
"""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from benchmark_scaling import make_model, simulate
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC

from numpyro_sgd import SGLD

SHORT, LONG = 5_000, 25_000


def main(likelihood="logistic", sizes=(100_000, 1_000_000, 10_000_000)):
    d = 50 if likelihood == "logistic" else 40
    for n in sizes:
        X, y, _ = simulate(likelihood, n, d)
        data = (jnp.asarray(X), jnp.asarray(y))
        del X, y
        kernel = SGLD(make_model(likelihood), control_variates=True)

        def mcmc(num_samples):
            return MCMC(kernel, num_warmup=500, num_samples=num_samples, num_chains=2, chain_method="vectorized",
                        jit_model_args=True, progress_bar=False)

        first = mcmc(1_000)
        first.run(jax.random.key(0), *data, subsample_size=1_000)
        ess = float(np.min(effective_sample_size(np.asarray(first.get_samples(group_by_chain=True)["w"]))))
        runs = {k: mcmc(k) for k in (SHORT, LONG)}
        times = {k: [] for k in runs}
        for rep in range(4):
            for k, run in runs.items():
                run.post_warmup_state = first.last_state
                start = time.perf_counter()
                run.run(jax.random.key(rep), *data, subsample_size=1_000)
                jax.block_until_ready(run.get_samples())
                if rep > 0:  # the first round compiles
                    times[k].append(time.perf_counter() - start)
        med = {k: float(np.median(v)) for k, v in times.items()}
        per_draw = (med[LONG] - med[SHORT]) / (LONG - SHORT)
        print(f"{likelihood} N = {n:,}: runs of {SHORT:,} and {LONG:,} draws {med[SHORT]:.3f} and {med[LONG]:.3f} s "
              f"(medians of 3); {1e3 * per_draw:.3f} ms per draw of both chains; min bulk ESS {ess:.0f} of 1,000 "
              f"draws of 2 chains: {1e6 * per_draw / ess:.3f} s per 1,000 effective samples", flush=True)
        del data, first, runs
        jax.clear_caches()


if __name__ == "__main__":
    main(*sys.argv[1:2])
