"""Santa (annealed) against Adam and SGD with momentum: MAP of a Bayesian neural network on MNIST.

Chen, Carlson, Gan, Li & Carin, *Bridging the Gap between Stochastic Gradient MCMC and Stochastic
Optimization* (AISTATS 2016) train feed-forward networks on MNIST (e.g. 400–400 and 800 hidden
units, supplement Fig. 4) and compare Santa's learning curves with SGD-momentum, Adam, RMSprop,
etc. This example repeats that comparison on a scaled-down problem that runs in minutes on two
CPU cores:

* **data**: MNIST from the local idx files (:func:`numpyro_sgd.datasets.load_mnist`, no download):
  a fixed random subset of ``--n-train`` (default 10,000) of the 60,000 training images (subset
  drawn with ``numpy.random.default_rng(0)``), evaluated on the official 10,000 test images.
  Pixels are scaled to [0, 1] (the usual MNIST preprocessing; a per-pixel standardisation would
  blow up the nearly constant border pixels). 10 classes.
* **model** (a NumPyro model with a subsample plate): one hidden layer of ``--hidden`` (default
  100) tanh units, a softmax output, every weight and bias with an N(0, 1) prior,
  y_n ~ Categorical(softmax(W₂ tanh(W₁ x_n + b₁) + b₂)); 79,510 parameters at the defaults.
  Non-convex (hidden-unit permutations and sign flips alone give 100! · 2¹⁰⁰ equivalent modes).
* **objective**: the MAP objective U(θ)/N = NumPyro's potential (negative log joint) per datum,
  minimised on minibatches of S = 100 drawn with replacement: exactly the objective and the
  minibatches of :func:`numpyro_sgd.map_estimate`.
* **optimisers** (all run with the same number of SG steps T = passes · N / S, i.e. equal data
  passes; for a given seed they see the same initial point and the same minibatch sequence):

  - *Santa-E*: :func:`numpyro_sgd.santa` exactly as :func:`~numpyro_sgd.map_estimate` configures
    it by default: Euler scheme (Alg. 6/7), σ = 0.999, λ = 1e-8, thermostat C = g₁ (the package
    default), β_t = N t^0.5, exploration for the first T/2 steps, refinement for the rest.
  - *Santa-S*: the same with ``scheme="splitting"`` (symmetric splitting, Alg. 4/5). Added when
    Santa-E diverged at every η (before the package's α₀ cap; see "Finding" below), so Santa gets
    two grids where the other methods get one.
  - *Adam*: ``optax.adam(lr)`` (β₁ = 0.9, β₂ = 0.999, ε = 1e-8).
  - *SGD-momentum*: ``optax.sgd(lr, momentum=0.9)``.

  Tuning budget: a grid of 4 learning rates per method (``GRIDS``; for Santa the grid is over η);
  no other hyper-parameter is tuned. The grids come from one pilot run (1 seed, 10 passes) with
  the same 6-point grid size for every method (Santa η 1e-6 … 1e-1 by factors of 10, Adam 1e-4 …
  3e-2 and SGD-momentum 0.003 … 1 by factors of ~3), after which each method's grid is the 4
  consecutive pilot values with the pilot's best in the interior, the extra value on the side of
  the pilot's second best (Santa-E took Santa-S's grid). The reported best value per method is the
  one with the lowest final full-data training objective (mean over seeds), the quantity the
  optimisers minimise; test metrics are reported at that value.
* **initialisation** (the same for all methods, per seed): W ~ N(0, 1/fan_in), b = 0. (The
  package's default ``init_to_uniform`` draws weights in (−2, 2), which saturates tanh units fed
  784 pixels.)
* **seeds**: ``--seeds`` (default 3); a seed fixes the initial point, the minibatch sequence and
  Santa's noise. Tables give mean ± sd over seeds.

Finding: on this model 110 pixels are 0 in every training image, so their weights feel only the
prior (|f̃/N| = |w|/N ≈ 1e-8 … 1e-5) and their RMSprop factor g = (λ + √v)^(−1/2) reaches ~1e4
(λ = 1e-8, the paper's value). (1) Before the package capped the automatic thermostat
α₀ = √η g₁ at 1, α₀ ≫ 2 there and the Euler update u ← (1 − α) u − … diverged within the first
pass at every η (1e-7 … 1e-1); that is how the cap was found. (2) With the cap both schemes run,
but the annealed noise √(2 g η^{3/2}/β_t) and the first step g u₀ throw those weights far out,
and with the thermostat setpoint η/β_t ≈ 0 (annealing from β = N) little pulls them back: the
prior term ½‖θ‖²/N dominates Santa's objective at the larger η, so the best η is the smallest
(1e-5), which fits the data slowly. Santa does not beat Adam or SGD-momentum on this problem in
15 passes; the paper's networks are larger and trained longer, and their λ is not stated.

Implementation: the runs of one method go through one jitted, vmapped ``lax.scan`` over the
(learning rate, seed) lanes, one pass (``--eval-every``) at a time, with the full-data objective
recorded in between; one compilation serves all methods (``lax.switch`` on a method index shared
by the lanes). Adam and SGD-momentum are the optax transformations themselves, built inside the
vmapped function with a traced learning rate. Santa needs a traced η and noise seed, which
:func:`numpyro_sgd.santa` (a closure over Python constants) cannot take, so the loop calls the
package's own ``santa_init`` / :func:`~numpyro_sgd.kernels.santa.santa_step` exactly as
:func:`numpyro_sgd.santa` does. The loop is checked against the package: for seed 0 and each
method's best learning rate, ``map_estimate(model, key, X, y, optimizer=<santa(η, seed=0, ...) |
optax.adam(lr) | optax.sgd(lr, momentum=0.9)>, num_steps=T, init_params=θ₀)`` is run and its final
parameters are compared with the loop's (``--no-check`` skips this).

Reported per method (best learning rate): the final full-data training objective U(θ)/N (less the
constant (D/2N) log 2π of the N(0, 1) priors), its likelihood part (training NLL), the training
accuracy, the test loss (mean negative log predictive density of the MAP's plug-in predictive
p(y | x, θ̂)) and the test accuracy; all grid points in the markdown file; the learning curves
(mean over seeds) in a PNG.

Run (measured on 2 CPU cores shared with other jobs: the default about 7 minutes, 414–428 s, of
which Santa-S's 12 runs take ~170 s, Adam's and SGD-momentum's ~90 s each (Santa's update, 79,510
Gaussian draws and ~30 element-wise operations per step, costs more than the gradient here), the
map_estimate check
~25 s and the compilation ~13 s when not cached in ``.jax_cache``; ``--quick`` about 1 minute)::

    python benchmarks/santa_nonconvex.py                  # 15 passes, 3 seeds -> docs/results/santa_nonconvex*
    python benchmarks/santa_nonconvex.py --quick          # 3 passes, 1 seed, no check -> examples/output/
    python benchmarks/santa_nonconvex.py --passes 40 --seeds 5 --out /tmp/santa

Output: the tables (printed), ``santa_nonconvex_results.md`` and ``santa_nonconvex.png`` in
``--out`` (default ``docs``; with ``--quick`` ``examples/output/santa_nonconvex``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from jax import random

from numpyro_sgd import SubsampledPotential, map_estimate, polynomial_annealing
from numpyro_sgd.datasets import DATA_ENV_VAR, default_data_dir, load_mnist
from numpyro_sgd.kernels import santa
from numpyro_sgd.kernels.santa import santa_init, santa_step

# reruns skip most of the compilation (the cache folder is git-ignored)
jax.config.update("jax_compilation_cache_dir", os.environ.get(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".jax_cache")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

METHODS = ("Santa-E", "Santa-S", "Adam", "SGD-momentum")
#: Santa's integrators: Euler (Alg. 6/7, the package default) and symmetric splitting (Alg. 4/5)
SCHEMES = {"Santa-E": "euler", "Santa-S": "splitting"}
#: learning-rate grids (Santa: η; Adam, SGD-momentum: the optax learning rate)
GRIDS = {
    "Santa-E": (1e-5, 1e-4, 1e-3, 1e-2),
    "Santa-S": (1e-5, 1e-4, 1e-3, 1e-2),
    "Adam": (1e-3, 3e-3, 1e-2, 3e-2),
    "SGD-momentum": (0.03, 0.1, 0.3, 1.0),
}
SANTA_SIGMA, SANTA_DAMPING, SANTA_POWER = 0.999, 1e-8, 0.5
MOMENTUM = 0.9


# ---------------------------------------------------------------------------- data and model
def load_data(data_dir, n_train):
    """A fixed random subset of the MNIST training images and the official test set, pixels in [0, 1]."""
    x_all, y_all = load_mnist(data_dir, split="train", normalize=True)
    x_test, y_test = load_mnist(data_dir, split="test", normalize=True)
    if not 0 < n_train <= x_all.shape[0]:
        raise ValueError(f"--n-train must lie in 1..{x_all.shape[0]}, got {n_train}.")
    pick = np.sort(np.random.default_rng(0).choice(x_all.shape[0], n_train, replace=False))

    def flat(x):
        return jnp.asarray(x.reshape(x.shape[0], -1), jnp.float32)

    return (flat(x_all[pick]), jnp.asarray(y_all[pick], jnp.int32),
            flat(x_test), jnp.asarray(y_test, jnp.int32))


def mlp_logits(p, x):
    return jnp.tanh(x @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]


def make_model(hidden, num_classes, subsample_size):
    """One-hidden-layer tanh BNN with N(0, 1) priors and a subsampled categorical likelihood."""

    def model(X, y):
        d = X.shape[1]
        p = {
            "W1": numpyro.sample("W1", dist.Normal(0.0, 1.0).expand([d, hidden]).to_event(2)),
            "b1": numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1)),
            "W2": numpyro.sample("W2", dist.Normal(0.0, 1.0).expand([hidden, num_classes]).to_event(2)),
            "b2": numpyro.sample("b2", dist.Normal(0.0, 1.0).expand([num_classes]).to_event(1)),
        }
        with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
            numpyro.sample("y", dist.Categorical(logits=mlp_logits(p, X[idx])), obs=y[idx])

    return model


def init_params(key, d, hidden, num_classes):
    """W ~ N(0, 1/fan_in), b = 0 (the same starting point for every optimiser of a seed)."""
    k1, k2 = random.split(key)
    return {
        "W1": random.normal(k1, (d, hidden), jnp.float32) / np.sqrt(d),
        "b1": jnp.zeros(hidden, jnp.float32),
        "W2": random.normal(k2, (hidden, num_classes), jnp.float32) / np.sqrt(hidden),
        "b2": jnp.zeros(num_classes, jnp.float32),
    }


def seed_keys(seed):
    """(initialisation key, run key); map_estimate splits the run key into its minibatch keys."""
    k_init, k_run = random.split(random.key(seed))
    return k_init, k_run


# ---------------------------------------------------------------------------- optimisers
def package_optimizer(method, lr, seed, num_data, num_steps):
    """The optimizer as one passes it to :func:`map_estimate` (used by the check)."""
    if method.startswith("Santa"):
        return santa(float(lr), num_data=1.0, decay=SANTA_SIGMA, damping=SANTA_DAMPING,
                     beta_schedule=polynomial_annealing(SANTA_POWER, scale=num_data), burnin=num_steps // 2,
                     integrator=SCHEMES[method], seed=seed)
    if method == "Adam":
        return optax.adam(float(lr))
    return optax.sgd(float(lr), momentum=MOMENTUM)


def make_trainer(potential, num_steps):
    """``init(theta, lr, seed)`` and ``chunk(theta, states, keys, lr, seed, method, X, y)``, both
    jitted and vmapped over lanes (learning rate, seed); ``method`` (an index into ``METHODS``) is
    shared by all lanes of a call, so ``lax.switch`` runs only that optimiser's update, and one
    compilation serves every method.

    Santa is :func:`numpyro_sgd.santa` with a traced η and seed: the same keys (``k_init, k_noise =
    split(key(seed))``, noise key ``fold_in(k_noise, count)``), the same ``santa_init`` /
    ``santa_step`` calls, β_t = N t^0.5, exploration while t ≤ T/2. Adam and SGD-momentum are the
    optax transformations, built with a traced learning rate.
    """
    n = potential.num_data
    schedule = polynomial_annealing(SANTA_POWER, scale=n)
    burnin = num_steps // 2

    def init(theta, lr, seed):
        k_init, _ = random.split(random.key(seed))
        return (santa_init(k_init, theta, lr), optax.adam(lr).init(theta),
                optax.sgd(lr, momentum=MOMENTUM).init(theta))

    def chunk(theta, states, keys, lr, seed, method, X, y):
        _, k_noise = random.split(random.key(seed))
        adam, sgdm = optax.adam(lr), optax.sgd(lr, momentum=MOMENTUM)

        def santa_update(scheme):
            def update(grad, theta, states):
                state = states[0]
                t = state.count + 1
                delta, state = santa_step(random.fold_in(k_noise, state.count), grad, state, lr, schedule(t),
                                          t <= burnin, decay=SANTA_SIGMA, damping=SANTA_DAMPING, num_data=1.0,
                                          scheme=scheme)
                return delta, (state, states[1], states[2])

            return update

        def adam_update(grad, theta, states):
            delta, state = adam.update(grad, states[1], theta)
            return delta, (states[0], state, states[2])

        def sgdm_update(grad, theta, states):
            delta, state = sgdm.update(grad, states[2], theta)
            return delta, (states[0], states[1], state)

        branches = {"Santa-E": santa_update("euler"), "Santa-S": santa_update("splitting"), "Adam": adam_update,
                    "SGD-momentum": sgdm_update}

        def step(carry, key):
            theta, states = carry
            # exactly map_estimate's step: Û_S on a with-replacement minibatch, divided by N
            _, grad = potential.potential_and_grad(theta, potential.draw_indices(key, "with_replacement"), (X, y))
            delta, states = jax.lax.switch(method, [branches[m] for m in METHODS], grad / n, theta, states)
            return (theta + delta, states), None

        (theta, states), _ = jax.lax.scan(step, (theta, states), keys)
        return theta, states

    return (jax.jit(jax.vmap(init)),
            jax.jit(jax.vmap(chunk, in_axes=(0, 0, 0, 0, 0, None, None, None))))


def make_metrics(potential, offset):
    """Per lane: objective U/N − offset, training NLL and accuracy, test NLPD and accuracy."""
    n = potential.num_data

    def objective(theta, X, y):
        return potential.full_potential(theta, (X, y)) / n - offset

    def metrics(theta, X, y, X_test, y_test):
        p = potential.view.unravel(theta)

        def nlpd_acc(x, t):
            logits = mlp_logits(p, x)
            logp = jax.nn.log_softmax(logits)
            nlpd = -jnp.mean(jnp.take_along_axis(logp, t[:, None], axis=1))
            return nlpd, jnp.mean(jnp.argmax(logits, axis=1) == t)

        train_nll, train_acc = nlpd_acc(X, y)
        test_nlpd, test_acc = nlpd_acc(X_test, y_test)
        return jnp.stack([objective(theta, X, y), train_nll, train_acc, test_nlpd, test_acc])

    return (jax.jit(jax.vmap(objective, in_axes=(0, None, None))),
            jax.jit(jax.vmap(metrics, in_axes=(0, None, None, None, None))))


# ---------------------------------------------------------------------------- reporting
def mean_sd(values, fmt):
    values = np.asarray(values, float)
    if not np.all(np.isfinite(values)):
        return f"diverged ({int(np.sum(~np.isfinite(values)))}/{values.size})"
    if values.size == 1:
        return format(values[0], fmt)
    return f"{format(values.mean(), fmt)} ± {format(values.std(ddof=1), fmt)}"


def score(final_losses):
    """Selection score of a grid point: the mean final training objective (inf if any seed diverged)."""
    final_losses = np.asarray(final_losses, float)
    return float(final_losses.mean()) if np.all(np.isfinite(final_losses)) else np.inf


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passes", type=int, default=None, help="data passes per run (default 15; --quick 3)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per grid point (default 3; --quick 1)")
    ap.add_argument("--quick", action="store_true", help="3 passes, 1 seed, no map_estimate check")
    ap.add_argument("--eval-every", type=int, default=1, help="passes between full-data evaluations (default 1)")
    ap.add_argument("--n-train", type=int, default=10_000, help="training images (default 10,000)")
    ap.add_argument("--hidden", type=int, default=100, help="hidden tanh units (default 100)")
    ap.add_argument("--batch-size", type=int, default=100, help="minibatch size S (default 100)")
    ap.add_argument("--data", default=None, help=f"folder holding mnist/ (default: ${DATA_ENV_VAR})")
    ap.add_argument("--out", default=None, help="output folder (default docs; --quick: examples/output/...)")
    ap.add_argument("--no-check", action="store_true", help="skip the map_estimate check")
    ap.add_argument("--grid", action="append", default=[], metavar="METHOD=LR,LR,...",
                    help=f"replace a method's learning-rate grid (methods: {', '.join(METHODS)}); repeatable")
    args = ap.parse_args(argv)
    grids = dict(GRIDS)
    for spec in args.grid:
        name, _, values = spec.partition("=")
        if name not in METHODS or not values:
            ap.error(f"--grid {spec!r}: expected METHOD=LR,LR,... with METHOD one of {', '.join(METHODS)}")
        grids[name] = tuple(float(v) for v in values.split(","))
    passes = args.passes if args.passes is not None else (3 if args.quick else 15)
    num_seeds = args.seeds if args.seeds is not None else (1 if args.quick else 3)
    check = not (args.no_check or args.quick)
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "output", "santa_nonconvex") if args.quick else os.path.join(here, "..", "docs", "results")
    out = args.out or default_out
    if passes < 1 or num_seeds < 1 or args.eval_every < 1 or passes % args.eval_every:
        ap.error("--passes, --seeds, --eval-every must be >= 1 and --eval-every must divide --passes")
    t_start = time.time()

    X, y, X_test, y_test = load_data(args.data or default_data_dir(), args.n_train)
    n, d = X.shape
    num_classes = 10
    S = args.batch_size
    if n % S:
        ap.error(f"--batch-size must divide --n-train ({n}) so that a pass is a whole number of steps")
    chunk = n // S * args.eval_every
    num_chunks = passes // args.eval_every
    num_steps = num_chunks * chunk
    model = make_model(args.hidden, num_classes, S)
    potential = SubsampledPotential.from_model(model, (X, y), {}, kernel_name="santa_nonconvex")
    # U/N − offset = (Σ_n −log p(y_n | x_n, θ) + ½‖θ‖²)/N: the N(0, 1) normalising constants removed
    offset = potential.dim * 0.5 * np.log(2 * np.pi) / n
    print(f"MNIST subset: N = {n} training, {X_test.shape[0]} test images, D = {d} pixels; BNN {d}-{args.hidden}-"
          f"{num_classes} (tanh), {potential.dim} parameters; S = {S}, {passes} passes = {num_steps} steps; "
          f"{num_seeds} seed(s); {os.cpu_count()} CPU core(s), backend {jax.default_backend()}")

    # lanes of one method: every (learning rate, seed); the same initial points and minibatch keys for all methods
    inits = {s: potential.view.ravel(init_params(seed_keys(s)[0], d, args.hidden, num_classes))
             for s in range(num_seeds)}
    init_v, chunk_v = make_trainer(potential, num_steps)
    objective_v, metrics_v = make_metrics(potential, offset)
    lanes, curves, finals, thetas, wall = [], [], [], [], {}
    compile_s = None
    for mi, m in enumerate(METHODS):
        lane = [(m, lr, s) for lr in grids[m] for s in range(num_seeds)]
        theta = jnp.stack([inits[s] for _, _, s in lane])
        lrs = jnp.asarray([lr for _, lr, _ in lane], jnp.float32)
        seeds = jnp.asarray([s for _, _, s in lane], jnp.int32)
        # map_estimate(model, k_run, ...) draws its minibatch keys as split(split(k_run)[1], T)
        keys = jnp.stack([random.split(random.split(seed_keys(s)[1])[1], num_steps) for _, _, s in lane])
        states = init_v(theta, lrs, seeds)
        if compile_s is None:
            t0 = time.time()
            chunk_v.lower(theta, states, keys[:, :chunk], lrs, seeds, mi, X, y).compile()
            compile_s = time.time() - t0
        t0 = time.time()
        curve = [np.asarray(objective_v(theta, X, y))]
        for c in range(num_chunks):
            theta, states = chunk_v(theta, states, keys[:, c * chunk:(c + 1) * chunk], lrs, seeds, mi, X, y)
            curve.append(np.asarray(objective_v(theta, X, y)))
            if not np.any(np.isfinite(curve[-1])):  # every lane diverged: stop early
                curve += [np.full(len(lane), np.nan)] * (num_chunks - 1 - c)
                break
        wall[m] = time.time() - t0
        lanes += lane
        curves.append(np.stack(curve, axis=1))
        finals.append(np.asarray(metrics_v(theta, X, y, X_test, y_test)))
        thetas.append(theta)
        print(f"  {m}: {len(lane)} runs in {wall[m]:.0f} s")
    curves, metrics, thetas = np.concatenate(curves), np.concatenate(finals), jnp.concatenate(thetas)
    print(f"compilation {compile_s:.0f} s")

    # ------------------------------------------------------------------ grid and best per method
    def select(m, lr):
        return [i for i, (mm, ll, _) in enumerate(lanes) if mm == m and ll == lr]

    best = {}
    for m in METHODS:
        scores = {lr: score(metrics[select(m, lr), 0]) for lr in grids[m]}
        best[m] = min(scores, key=scores.get) if np.isfinite(min(scores.values())) else None

    def row(m, lr, mark=""):
        v = metrics[select(m, lr)]
        bad = ~np.isfinite(v[:, 0])
        if bad.any():  # a non-finite θ: no meaningful accuracy either
            return f"| {m} | {lr:g} |" + f" diverged ({bad.sum()}/{bad.size}) |" * 5 + mark
        cells = [mean_sd(v[:, 0], ".4f"), mean_sd(v[:, 1], ".4f"), mean_sd(100 * v[:, 2], ".2f"),
                 mean_sd(v[:, 3], ".4f"), mean_sd(100 * v[:, 4], ".2f")]
        return f"| {m} | {lr:g} | " + " | ".join(cells) + f" |{mark}"

    head = ("| method | learning rate | train objective | train NLL | train acc. (%) | test NLPD | test acc. (%) |\n"
            "| --- | --- | --- | --- | --- | --- | --- |")
    table = "\n".join([head] + [row(m, best[m]) if best[m] is not None else
                                f"| {m} | all {len(grids[m])} diverged | | | | | |" for m in METHODS])
    grid_table = "\n".join([head] + [row(m, lr, " **best**" if lr == best[m] else "")
                                     for m in METHODS for lr in grids[m]])
    edge = [m for m in METHODS if best[m] is not None and best[m] in (grids[m][0], grids[m][-1])]
    diverged = []
    for m in METHODS:
        for lr in grids[m]:
            c = curves[select(m, lr)]
            bad = ~np.isfinite(c)
            if bad.any():  # first evaluation (in passes) at which each diverged seed was non-finite
                first = [int(np.argmax(b)) * args.eval_every for b in bad if b.any()]
                diverged.append(f"{m} lr {lr:g}: {len(first)}/{c.shape[0]} seed(s) diverged (non-finite by pass "
                                f"{', '.join(map(str, first))})")
    print(f"\nBest learning rate per method (lowest mean final training objective), after {passes} passes, "
          f"mean ± sd over {num_seeds} seed(s):\n")
    print(table)
    print("\nAll grid points:\n")
    print(grid_table)
    for line in diverged:
        print("  " + line)
    if edge:
        print(f"Note: the best learning rate lies at the edge of the grid for {', '.join(edge)}.")

    # ------------------------------------------------------------------ check against map_estimate
    check_lines = []
    if check:
        print("\nCheck: map_estimate(model, key, X, y, optimizer=..., num_steps=T, init_params=θ₀), seed 0, each "
              "method's best learning rate, against the loop's final parameters:")
        for m in METHODS:
            if best[m] is None:
                continue
            i = next(i for i in select(m, best[m]) if lanes[i][2] == 0)
            t0 = time.time()
            est = map_estimate(model, seed_keys(0)[1], X, y, num_steps=num_steps,
                               optimizer=package_optimizer(m, best[m], 0, n, num_steps),
                               init_params=potential.view.unravel(inits[0]))
            flat = potential.view.ravel(est)
            loss = float(objective_v(flat[None], X, y)[0])
            loop_theta = thetas[i]
            diff = float(jnp.max(jnp.abs(flat - loop_theta)))
            line = (f"{m} (lr {best[m]:g}): map_estimate objective {loss:.5f}, loop {metrics[i, 0]:.5f}; "
                    f"max |Δθ| = {diff:.2e} (max |θ| = {float(jnp.max(jnp.abs(loop_theta))):.2f}); "
                    f"{time.time() - t0:.0f} s")
            print("  " + line)
            check_lines.append(line)

    # ------------------------------------------------------------------ learning curves
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    x_pass = np.arange(num_chunks + 1) * args.eval_every
    colors = dict(zip(METHODS, ("C1", "C3", "C0", "C2")))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    finite = curves[np.isfinite(curves)]
    for m in METHODS:
        for lr in grids[m]:
            c = curves[select(m, lr)]
            ok = np.all(np.isfinite(c), axis=0)
            is_best = lr == best[m]
            axes[1].plot(x_pass[ok], c[:, ok].mean(axis=0), color=colors[m], lw=2 if is_best else 0.8,
                         alpha=1 if is_best else 0.5, marker=None if np.all(ok) else "x",
                         label=m if lr == grids[m][0] else None)
        if best[m] is None:
            continue
        c = curves[select(m, best[m])]
        axes[0].plot(x_pass, c.mean(axis=0), color=colors[m], lw=2, label=f"{m} (lr {best[m]:g})")
        if c.shape[0] > 1:
            axes[0].fill_between(x_pass, c.min(axis=0), c.max(axis=0), color=colors[m], alpha=0.2)
    for ax in axes:
        ax.axvline(num_steps // 2 * S / n, color="0.5", ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("data passes")
        ax.set_ylabel("training objective U(θ)/N − (D/2N) log 2π")
        ax.grid(alpha=0.3, which="both")
    top = np.nanmax([curves[select(m, best[m])][:, 1] for m in METHODS if best[m] is not None])
    axes[0].set_ylim(finite.min() / 1.3, top * 1.3)
    axes[0].set_title(f"best learning rate per method: mean over {num_seeds} seed(s), band min–max; "
                      "dashed: Santa's exploration ends", fontsize=9)
    axes[1].set_ylim(finite.min() / 1.3, min(finite.max(), 100) * 1.3)
    axes[1].set_title("every grid point (thick: best; x: some seed non-finite, stops)", fontsize=9)
    axes[0].legend()
    axes[1].legend(fontsize=8)
    fig.suptitle(f"MAP of a BNN {d}-{args.hidden}-{num_classes} on {n} MNIST images, S = {S}, full-data objective",
                 fontsize=10)
    fig.tight_layout()
    png = os.path.join(out, "santa_nonconvex.png")
    fig.savefig(png, dpi=110)
    runtime = time.time() - t_start
    print(f"\nwrote {png}; total runtime {runtime:.0f} s")

    cmd = " ".join(["python benchmarks/santa_nonconvex.py"] + (sys.argv[1:] if argv is None else list(argv)))
    timing = ", ".join(f"{m} {wall[m]:.0f} s" for m in METHODS)
    md = [
        "# Santa vs Adam vs SGD-momentum: MAP of a Bayesian neural network on MNIST",
        "",
        f"Command: `{cmd}`  ",
        f"Runtime: {runtime:.0f} s in all, on {os.cpu_count()} CPU cores shared with other jobs (compilation "
        f"{compile_s:.0f} s; training, (grid size × {num_seeds}) runs per method, vmapped: {timing}).",
        "",
        f"Problem: {n} MNIST training images (a fixed random subset of the 60,000), the official "
        f"{X_test.shape[0]} test images, pixels in [0, 1]; BNN {d}-{args.hidden}-{num_classes} (tanh hidden layer, "
        f"softmax output), N(0, 1) priors on all {potential.dim} weights and biases. MAP objective U(θ)/N "
        f"(NumPyro's potential per datum), minibatches of S = {S} drawn with replacement (map_estimate's); every "
        f"run takes {num_steps} SG steps = {passes} data passes, from the same initial point for a given seed "
        "(W ~ N(0, 1/fan_in), b = 0) and with the same minibatch sequence. All choices: the docstring of "
        "`benchmarks/santa_nonconvex.py`.",
        "",
        "Optimisers: Santa-E = `santa(η, schedule=polynomial_annealing(0.5, scale=N), burnin=T // 2)` (Euler, "
        "Alg. 6/7, σ = 0.999, λ = 1e-8: map_estimate's default optimizer); Santa-S = the same with "
        "`scheme=\"splitting\"` (Alg. 4/5); Adam = `optax.adam(lr)`; SGD-momentum = `optax.sgd(lr, momentum=0.9)`. "
        "Learning-rate grids: "
        + "; ".join(f"{m} {', '.join(f'{v:g}' for v in grids[m])}" for m in METHODS)
        + ". Best = lowest mean final training objective.",
        "",
        f"## Best learning rate per method (after {passes} passes; mean ± sd over {num_seeds} seed(s))",
        "",
        table,
        "",
        "Columns: train objective = U(θ)/N − (D/2N) log 2π = (Σ_n −log p(y_n | x_n, θ) + ½‖θ‖²)/N on the full "
        "training set at the end (the MAP objective without the prior's normalising constant); train NLL = its "
        "likelihood part −(1/N) Σ_n log p(y_n | x_n, θ̂) (the rest is the prior term ½‖θ̂‖²/N); test NLPD = "
        "−(1/N_test) Σ log p(y | x, θ̂) (the MAP's plug-in predictive); accuracies of argmax p(y | x, θ̂).",
        "",
        "## All grid points",
        "",
        grid_table,
        "",
    ]
    md += [f"* {line}" for line in diverged] + ([""] if diverged else [])
    if edge:
        md += [f"The best learning rate lies at the edge of the grid for {', '.join(edge)}.", ""]
    if check_lines:
        md += ["## Check against `map_estimate`", "",
               "`map_estimate(model, key, X, y, optimizer=..., num_steps=T, init_params=θ₀)` (seed 0, best learning "
               "rate, the package's `santa(...)` for Santa) against the example's vmapped loop (which records the "
               "learning curves):", ""]
        md += [f"* {line}" for line in check_lines] + [""]
    md += ["## Learning curves", "", "![learning curves](santa_nonconvex.png)", ""]
    md_path = os.path.join(out, "santa_nonconvex_results.md")
    with open(md_path, "w") as f:
        f.write("\n".join(md))
    print(f"wrote {md_path}")


if __name__ == "__main__":
    main()
