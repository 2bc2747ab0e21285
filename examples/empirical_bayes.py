"""Mandt, Hoffman & Blei (2017), Sec. 6.3 / Fig. 6: empirical Bayes for softmax regression on MNIST.

Reproduces the hyperparameter experiment of *Stochastic Gradient Descent as Approximate Bayesian
Inference* (JMLR 18, 2017; Sec. 7.3 of the arXiv version): multinomial logistic (softmax)
regression with a normal prior of precision λ on every weight, whose negative log joint is Eq. 48

    L(θ, λ) = λ/2 Σ_dk θ_dk² − DK/2 log λ + DK/2 log 2π + Σ_n [log Σ_k exp(x_nᵀθ_k) − x_nᵀθ_{y_n}],

on MNIST read from the four IDX files (:func:`numpyro_sgd.datasets.load_mnist`, no download):

(a) the validation curve: for each λ of a log grid, the MAP θ̂(λ) (L-BFGS on the full training
    subset; the problem is convex) and its validation loss, the mean negative log-likelihood
    −log p(y_n | x_n, θ̂(λ)) per validation image (the blue curve of Fig. 6);
(b) λ chosen by variational EM with constant SGD (:class:`~numpyro_sgd.VariationalEM` wrapping
    :class:`~numpyro_sgd.ConstantSGD`): constant rate for θ, Robbins–Monro steps for λ (Eq. 26);
(c) λ chosen by BBVI: NumPyro SVI with a mean-field Gaussian guide (``AutoNormal``) on the same
    model, λ a ``numpyro.param`` optimised on the ELBO with the variational parameters.

Both selected λ are refitted by MAP and their validation losses put on the curve. The *flat
bottom* is the λ range where the validation loss is within ``--tolerance`` (default 1 %) of the
smallest loss measured (log-linear interpolation between all MAP fits: the grid and the
refits); whether a selected λ
lies in it is decided by its own refitted loss. The paired standard error of the loss
difference to the best grid λ (over the validation images) is printed alongside, to judge it.

Protocol and choices (the paper gives the model, the data set and the algorithms, nothing else):

* **data**: ``--train-size`` images (default 10,000; the paper uses all 60,000) drawn at random
  (``--seed``) from the 60,000 training images; the validation set is the official 10,000 test
  images (the paper names only the train/test split). Features: pixel / 255 in [0, 1]; no
  centring, no intercept (Eq. 48 has none: D = number of pixels). ``--pool 2`` averages 2×2
  pixel blocks (14×14 images, D = 179 features kept at 10,000 images instead of 679): a
  scaling of ours, not the paper's, chosen after the full-resolution result below (see
  "Results").
* **pixels that are 0 in every training image** are dropped (D = 784 minus about 100 at 10,000
  images). Their weights do not enter the likelihood: the MAP sets them to 0 (so the validation
  curve is unchanged) and under the exact posterior each has E[θ²] = 1/λ, which leaves the EM
  fixed point λ = DK / E[|θ|²] unchanged too. Constant SGD sees no gradient noise there, and with
  them the kernel's warmup divides 0 by 0 (see the report of this example).
* **(a) MAP**: optax L-BFGS in float32 on the full training subset, warm-started from the
  neighbouring grid point, until max |∇L| ≤ 1e-5 N (or 1,000 iterations; the final gradient is
  printed). Default grid (``--grid``): 9 values λ = 10^-1 … 10^3 in half decades.
* **(b) VEM**: ``ConstantSGD(model, preconditioner="diag", momentum=0.1)``, one chain, minibatch S =
  ``--vem-batch-size`` (50). The ``"full"`` preconditioner needs a D² noise matrix (6,790
  weights: 46 M entries, and a 6,790² Cholesky at every re-tuning), so it is out. Momentum
  because the KL-optimal rates without it are *unstable* on MNIST: a power iteration on the
  frozen preconditioner P times the Hessian A at the MAP gave ρ(PA) = 4.6 (diag) and 16.8
  (scalar) at S = 200, λ = 10, above plain SGD's limit 2 (neighbouring pixels are strongly
  correlated, which a diagonal or scalar rate ignores); the diag chain without momentum ran off
  (|θ|² → 10⁹) at S = 200 and at S = 50. Heavy-ball damping μ allows ρ(PA) < 2(2 − μ)/μ = 38 at
  μ = 0.1 and keeps the stationary law (Eq. 31). Diag rather than scalar: the scalar rate is
  3.6× further from stability and its isotropic Gaussian fits worse.
  **Why S = 50**: constant SGD spreads θ only as far as the minibatch noise pushes it, so in
  directions that the data barely constrain (combinations of correlated pixels, the softmax's
  shift θ_d· + c) its draws are too concentrated, E_q|θ|² is too small and the EM update
  λ = DK / E_q|θ|² too large. Smaller S means more noise and less of this bias, but also less
  stability: a wider chain lowers λ, which widens the chain further, and the run collapses
  (λ → 0, θ → ∞). Measured at the defaults (``docs/results/empirical_bayes_diagnostics_results.md``,
  three chain seeds each): S = 200 gives λ ≈ 120; S = 50 gives λ ≈ 26 in 3 of 3 seeds; S = 30
  gave λ = 12.5 in one seed and collapsed in two; S = 20 collapsed in all three. S = 50 is the
  smallest of these that was stable in every seed. At its λ the draws' E|θ|² equals the
  *mean-field* Laplace value |θ̂|² + Σ 1/(λ + H_ii) (diagonal Hessian), below the full
  Laplace value |θ̂|² + tr (λI + H)⁻¹; ``--laplace`` prints both.
  Warmup ``--vem-warmup`` SG steps with λ held at ``--lam-init`` (1.0), then ``--vem-steps``
  SG steps updating λ with the package's default Robbins–Monro schedule ρ_t = ρ₀ (1 + t/100)^-0.6,
  ρ₀ = ``--hyper-step-size`` (0.05, the default, not tuned). The selected λ is the geometric
  mean of the λ iterates over the second half of the sampling phase (Polyak–Ruppert averaging;
  the λ iterates fluctuate by about ±30 % at this ρ_T); the final iterate is reported too.
* **(c) BBVI**: ``AutoNormal`` (mean field, as in the paper), ``Trace_ELBO`` with one particle,
  minibatch ``--bbvi-batch-size`` (200; SVI scales the likelihood by N/S through the plate),
  optax Adam at ``--bbvi-lr`` (0.01) for the first quarter of ``--bbvi-steps`` (20,000) steps,
  then decaying exponentially to 1 % of it; λ starts at ``--lam-init``. The selected λ is the
  final one. BBVI's λ converges slowly: Adam's jitter in the 6,790 means inflates |μ|² (and so
  lowers λ) until the rate has decayed, and the mean-field EM map is close to the identity over
  λ ≈ 10–30, so λ drifts. At the default budget λ is still rising (see the λ trajectory);
  the output compares |μ|² with |θ̂(λ)|² of the MAP as a convergence check, and the
  diagnostics run uses 80,000 steps at S = 500.
* **--laplace** (diagnostic, about 3 minutes more): the Hessian H of the likelihood at the MAP
  of the best grid λ and its eigenvalues; for each grid λ the Laplace-posterior EM map
  λ ↦ DK / (|θ̂(λ)|² + tr (λI + H)⁻¹) (and its mean-field version with H's diagonal only), and
  the fixed points of both maps: the λ that EM would find with the Laplace posterior (or its
  mean-field restriction) in place of the constant-SGD draws.

Scaled down from the paper (to run in minutes on 2 cores): 10,000 of the 60,000 training
images (``--train-size``); 9 grid values (``--grid``); VEM 6,000 + 20,000 SG steps at S = 50
(about 130 data passes; ``--vem-warmup``, ``--vem-steps``); BBVI 20,000 steps at S = 200 (400
passes; ``--bbvi-steps``). ``--quick``: 3,000 images, 5 grid values, VEM 3,000 + 8,000 steps,
BBVI 4,000 steps (BBVI is then far from converged; a smoke test only).

Results (``docs/results/empirical_bayes_results.md``, ``docs/results/empirical_bayes_pool2_results.md``,
``docs/results/empirical_bayes_pool2_60k_results.md``, ``docs/results/empirical_bayes_diagnostics_results.md``):
at full resolution VEM's λ ≈ 26 lies *outside* the flat bottom (+6 % validation loss), at
14×14 (``--pool 2``) λ ≈ 1.87 lies inside it (+0.8 %, three seeds; with all 60,000 training
images λ = 0.86, +0.55 %). Why: with a diagonal preconditioner the stationary law of constant
SGD is close to the *mean-field* Gaussian (measured: its E|θ|² is at or below the mean-field
Laplace value), and the EM fixed point of a mean-field q is λ = 26.6 at full resolution
(outside) but 1.29 at 14×14 (inside); the full-covariance Laplace fixed points (6.85 and 0.71)
are inside in both. BBVI's mean-field λ at full resolution moves from 7 (unconverged, 20,000
steps) towards the mean-field value (16.5 after 80,000 steps). A full preconditioner would give
the full-covariance q but costs a D² matrix (6,790² at full resolution); at 14×14
(``--pool 2 --vem-preconditioner full --vem-batch-size 100 --vem-warmup 1000
--steps-per-sample 200``, float64) the chain collapsed (λ → 0, |θ|² → 10²⁶ and beyond) with
momentum μ = 1, 0.5 and 0.1, and with ``--prior-noise`` (ConstantSGD's ``prior_noise=True``).
What was found: at a *fixed* λ = 1 the full-preconditioned chain already ran off (|θ|² from
1.5·10⁶ after warmup to 4·10¹⁰ after 2,000 steps; Laplace value 1,942): the softmax's shift
directions θ_d· + c carry no gradient noise (P A = 2 there: no forgetting). With
``prior_noise=True`` it is stable but about 30 % too wide (|θ|² 2,100–4,400 over 2,000 steps),
and inside VEM that excess lowers λ, which widens the chain further, until it collapses.

Run (measured on 2 CPU cores shared with other jobs; the numbers of the last runs are in
``docs/results/empirical_bayes_results.md``)::

    python examples/empirical_bayes.py                 # default, about 2.5-5 minutes
    python examples/empirical_bayes.py --quick         # smoke run, about 1.5 minutes
    python examples/empirical_bayes.py --pool 2 --laplace --vem-seeds 0 1 2 --name empirical_bayes_pool2  # ~2 min
    python examples/empirical_bayes.py --pool 2 --train-size 60000 --grid 0.1 0.3 1 3 10 30 \
        --vem-batch-size 300 --vem-steps 40000 --name empirical_bayes_pool2_60k   # ~3 min
    python examples/empirical_bayes.py --laplace --vem-sweep 20 30 200 --vem-seeds 0 1 2 \\
        --bbvi-steps 80000 --bbvi-batch-size 500 --name empirical_bayes_diagnostics   # ~15 minutes

Output: the table (printed), ``docs/results/NAME_results.md`` (table, command, runtime) and
``docs/results/NAME.png`` (left: validation curve with both selected λ; right: the λ trajectories of
VEM and BBVI against data passes), NAME = ``--name`` (``empirical_bayes``); ``--out`` changes
the folder.
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
from numpyro.distributions import constraints
from numpyro.infer import MCMC, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_sgd import ConstantSGD, VariationalEM
from numpyro_sgd.datasets import load_mnist

# reruns skip most of the compilation (the cache folder is git-ignored)
jax.config.update("jax_compilation_cache_dir", os.environ.get(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".jax_cache")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

NUM_CLASSES = 10
DEFAULT_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
QUICK_GRID = (0.3, 3.0, 10.0, 30.0, 300.0)


# ---------------------------------------------------------------------------- data
def load_data(train_size, seed, data_dir=None, pool=1):
    """MNIST pixels / 255, a random training subset, the test set as validation set.

    ``pool`` > 1 averages non-overlapping ``pool`` × ``pool`` blocks of pixels (28/pool squared
    features). Features that are 0 in every image of the training subset are dropped (see
    module docstring).
    """
    x_train, y_train = load_mnist(data_dir, split="train", normalize=True)
    x_val, y_val = load_mnist(data_dir, split="test", normalize=True)
    if not 0 < train_size <= x_train.shape[0]:
        raise SystemExit(f"--train-size must lie in 1..{x_train.shape[0]}, got {train_size}.")
    rows = np.random.default_rng(seed).permutation(x_train.shape[0])[:train_size]
    if 28 % pool:
        raise SystemExit(f"--pool must divide 28, got {pool}.")

    def pooled(images):
        side = 28 // pool
        return images.reshape(images.shape[0], side, pool, side, pool).mean(axis=(2, 4)).reshape(images.shape[0], -1)

    x = pooled(x_train[rows].reshape(train_size, 28, 28))
    keep = x.max(axis=0) > 0
    x_val = pooled(x_val.reshape(x_val.shape[0], 28, 28))
    as32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    return as32(x[:, keep]), jnp.asarray(y_train[rows]), as32(x_val[:, keep]), jnp.asarray(y_val), int(keep.sum())


# ---------------------------------------------------------------------------- model (Eq. 48)
def make_model(lam_init, subsample_size):
    """The softmax regression of Eq. 48 with λ a positive ``numpyro.param`` (init ``lam_init``)."""

    def model(x, y):
        lam = numpyro.param("lam", lam_init, constraint=constraints.positive)
        theta = numpyro.sample(
            "theta", dist.Normal(0.0, 1.0 / jnp.sqrt(lam)).expand([x.shape[1], NUM_CLASSES]).to_event(2)
        )
        with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
            numpyro.sample("y", dist.Categorical(logits=x[idx] @ theta), obs=y[idx])

    return model


def per_point_nll(theta, x, y):
    """−log p(y_n | x_n, θ) for every row (softmax likelihood)."""
    logits = x @ theta
    return jax.nn.logsumexp(logits, axis=1) - jnp.take_along_axis(logits, y[:, None], axis=1)[:, 0]


# ---------------------------------------------------------------------------- (a) MAP curve
@jax.jit
def fit_map(theta0, lam, x, y):
    """argmin_θ L(θ, λ) (Eq. 48 without the θ-free terms) by L-BFGS; returns θ̂, iterations, max|∇L|."""
    tol = 1e-5 * x.shape[0]

    def objective(theta):
        return jnp.sum(per_point_nll(theta, x, y)) + 0.5 * lam * jnp.sum(theta**2)

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(objective)

    def body(carry):
        theta, state, it = carry
        value, grad = value_and_grad(theta, state=state)
        updates, state = opt.update(grad, state, theta, value=value, grad=grad, value_fn=objective)
        return optax.apply_updates(theta, updates), state, it + 1

    def cond(carry):
        _, state, it = carry
        gmax = jnp.max(jnp.abs(optax.tree.get(state, "grad")))
        return (it < 1000) & ((it == 0) | (gmax > tol))

    theta, state, it = jax.lax.while_loop(cond, body, (theta0, opt.init(theta0), 0))
    return theta, it, jnp.max(jnp.abs(jax.grad(objective)(theta)))


def map_curve(lams, x, y, x_val, y_val):
    """MAP fits from the largest λ down (warm starts); per-point validation losses of each."""
    theta = jnp.zeros((x.shape[1], NUM_CLASSES), jnp.float32)
    fits = {}
    for lam in sorted(lams, reverse=True):
        theta, it, gmax = fit_map(theta, jnp.float32(lam), x, y)
        losses = np.asarray(per_point_nll(theta, x_val, y_val), np.float64)
        fits[float(lam)] = {"theta": theta, "losses": losses, "iterations": int(it),
                            "grad_max_per_n": float(gmax) / x.shape[0]}
    return fits


def refit(lam, fits, x, y, x_val, y_val):
    """MAP at a selected λ, warm-started from the nearest grid point (in log λ)."""
    near = min(fits, key=lambda g: abs(np.log(g) - np.log(lam)))
    theta, it, gmax = fit_map(fits[near]["theta"], jnp.float32(lam), x, y)
    return {"lam": float(lam), "theta": theta, "losses": np.asarray(per_point_nll(theta, x_val, y_val), np.float64),
            "iterations": int(it), "grad_max_per_n": float(gmax) / x.shape[0]}


def flat_bottom(grid_lams, grid_loss, threshold):
    """The λ interval where the log-linearly interpolated grid curve is ≤ ``threshold``.

    Returns (lo, hi, lo_open, hi_open); *_open is True when the interval reaches the grid's end.
    """
    g = np.log(np.asarray(grid_lams))
    v = np.asarray(grid_loss)
    best = int(np.argmin(v))
    if v[best] > threshold:
        return np.nan, np.nan, False, False

    def edge(step):
        i = best
        while 0 <= i + step < len(v) and v[i + step] <= threshold:
            i += step
        if not 0 <= i + step < len(v):
            return np.exp(g[i]), True
        j = i + step  # v[i] <= threshold < v[j]: interpolate the crossing
        t = (threshold - v[i]) / (v[j] - v[i])
        return np.exp(g[i] + t * (g[j] - g[i])), False

    (lo, lo_open), (hi, hi_open) = edge(-1), edge(+1)
    return lo, hi, lo_open, hi_open


# ---------------------------------------------------------------------------- (b) VEM
def run_vem(args, x, y, seed):
    model = make_model(args.lam_init, args.vem_batch_size)
    k = args.steps_per_sample
    kernel = ConstantSGD(model, preconditioner=args.vem_preconditioner, momentum=args.vem_momentum, steps_per_sample=k,
                         prior_noise=args.prior_noise)
    vem = VariationalEM(kernel, hyper_step_size=args.hyper_step_size)
    mcmc = MCMC(vem, num_warmup=max(args.vem_warmup // k, 1), num_samples=max(args.vem_steps // k, 2),
                num_chains=1, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.key(seed), x, y, extra_fields=("kernel_state.hyper", "data_passes"))
    extra = mcmc.get_extra_fields()
    trace = np.asarray(vem.hyperparameters(extra["kernel_state.hyper"])["lam"]).reshape(-1)
    seconds = time.perf_counter() - start
    final = float(np.asarray(vem.hyperparameters(mcmc.last_state)["lam"]).reshape(-1)[-1])
    half = trace[trace.size // 2:]
    return {
        "lam": float(np.exp(np.mean(np.log(np.maximum(half, 1e-30))))),
        "lam_final": final,
        "lam_half_range": (float(half.min()), float(half.max())),
        "trace": trace,
        "passes": np.asarray(extra["data_passes"], np.float64).reshape(-1),
        "divergences": int(np.asarray(mcmc.last_state.num_divergences).sum()),
        "seconds": seconds,
        "sq_norm_theta": float(np.mean(np.sum(np.asarray(mcmc.get_samples()["theta"])[trace.size // 2:] ** 2,
                                              axis=(1, 2)))),
    }


def collapsed(v, grid):
    """Why a VEM run has no usable λ (None if it has one): the λ → 0 / θ → ∞ runaway."""
    if not np.isfinite(v["lam"]) or v["lam"] < 1e-2 * min(grid):
        return "collapsed: λ → 0 while θ ran off"
    if v["divergences"] > 0:
        return "rejected SG steps"
    return None


# ---------------------------------------------------------------------------- (c) BBVI
def run_bbvi(args, x, y, seed):
    model = make_model(args.lam_init, args.bbvi_batch_size)
    guide = AutoNormal(model)
    steps, lr = args.bbvi_steps, args.bbvi_lr
    hold = steps // 4
    schedule = optax.join_schedules(
        [optax.constant_schedule(lr), optax.exponential_decay(lr, max(steps - hold, 1), 0.01)], [hold])
    svi = SVI(model, guide, optax.adam(schedule), Trace_ELBO())
    start = time.perf_counter()
    state = svi.init(jax.random.key(seed), x, y)

    @jax.jit
    def run(state):
        def body(state, _):
            state, loss = svi.update(state, x, y)
            return state, (loss, svi.get_params(state)["lam"])

        return jax.lax.scan(body, state, None, length=steps)

    state, (losses, trace) = run(state)
    trace = np.asarray(trace, np.float64)
    seconds = time.perf_counter() - start
    params = svi.get_params(state)
    loc, scale = np.asarray(params["theta_auto_loc"]), np.asarray(params["theta_auto_scale"])
    last = trace[-max(steps // 10, 1):]
    return {
        "lam": float(trace[-1]),
        "drift": float(last[-1] / last[0] - 1),  # relative change of λ over the last 10 % of the steps
        "trace": trace,
        "passes": np.arange(1, steps + 1) * args.bbvi_batch_size / x.shape[0],
        "seconds": seconds,
        "sq_norm_theta": float(np.sum(loc**2) + np.sum(scale**2)),
        "sq_norm_loc": float(np.sum(loc**2)),
        "final_elbo_loss": float(np.mean(np.asarray(losses)[-max(steps // 20, 1):])),
    }


# ---------------------------------------------------------------------------- --laplace
def likelihood_hessian(theta, x):
    """Hessian of Σ_n −log p(y_n | x_n, θ) in θ (flattened d-major, class-minor), float64.

    Block (k, l) is Xᵀ diag(p_k (δ_kl − p_l)) X; it does not depend on y.
    """
    x = np.asarray(x, np.float64)
    logits = x @ np.asarray(theta, np.float64)
    prob = np.exp(logits - logits.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    d, k = x.shape[1], NUM_CLASSES
    hess = np.zeros((d, k, d, k))
    for a in range(k):
        for b in range(a, k):
            block = x.T @ ((prob[:, a] * ((a == b) - prob[:, b]))[:, None] * x)
            hess[:, a, :, b] = block
            hess[:, b, :, a] = block.T
    return hess.reshape(d * k, d * k)


def laplace_em(fits, best_grid, x):
    """EM map λ ↦ DK / E[|θ|²] under the Laplace approximation at each grid λ, and its fixed point.

    E[|θ|²] = |θ̂(λ)|² + tr (λI + H)⁻¹ with H the likelihood Hessian at the MAP of ``best_grid``
    (its eigenvalues, once: H hardly changes over the flat bottom); "diag" uses only H's
    diagonal (σ² = 1/(λ + H_ii), what a mean-field Gaussian can represent).
    """
    hess = likelihood_hessian(fits[best_grid]["theta"], x)
    eig = np.clip(np.linalg.eigvalsh(hess), 0.0, None)
    hdiag = np.diagonal(hess).copy()
    dk = hess.shape[0]
    lams = sorted(fits)
    table = []
    for lam in lams:
        sq = float(np.sum(np.asarray(fits[lam]["theta"], np.float64) ** 2))
        full = dk / (sq + np.sum(1.0 / (lam + eig)))
        diag = dk / (sq + np.sum(1.0 / (lam + hdiag)))
        table.append((lam, sq, float(np.sum(1.0 / (lam + eig))), full, float(np.sum(1.0 / (lam + hdiag))), diag))
    g = np.log([r[0] for r in table])

    def fixed_point(column):
        h = np.log([r[column] for r in table]) - g  # log f(λ) − log λ, decreasing through 0 at the fixed point
        for i in range(len(g) - 1):
            if h[i] >= 0 > h[i + 1]:
                return float(np.exp(g[i] + h[i] / (h[i] - h[i + 1]) * (g[i + 1] - g[i])))
        return np.nan

    return {"table": table, "fixed_point": fixed_point(3), "fixed_point_diag": fixed_point(5), "eig": eig,
            "hdiag": hdiag}


# ---------------------------------------------------------------------------- output
def plot(path, fits, lo, hi, best_loss, tol, selected, extra_marks, vem, bbvi, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lams = sorted(fits)
    loss = [fits[g]["losses"].mean() for g in lams]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    ax.plot(lams, loss, "-o", color="tab:blue", ms=4, label="MAP at λ (grid)")
    if np.isfinite(lo):
        ax.axvspan(lo, hi, color="tab:blue", alpha=0.12, label=f"flat bottom (≤ {100 * tol:g} % above min)")
    ax.axhline(best_loss * (1 + tol), color="tab:blue", lw=0.6, ls=":")
    for (name, lam, val), color in zip(selected, ("tab:red", "tab:green")):
        ax.plot([lam], [val], "o", ms=11, mfc="none", mew=2, color=color, label=f"{name}: λ = {lam:.3g}")
    for name, lam, val in extra_marks:
        ax.plot([lam], [val], "s" if name.startswith("VEM") else "D", ms=6, mfc="none", color="0.45")
        ax.annotate(name, (lam, val), textcoords="offset points", xytext=(5, -10), fontsize=7, color="0.35")
    ax.set_xscale("log")
    ax.set_xlabel("prior precision λ (L2 regularisation)")
    ax.set_ylabel("validation loss (mean NLL per image)")
    ax.set_title(f"MNIST softmax regression, N = {args.train_size:,}")
    ax.legend(fontsize=8)
    bx.plot([0.0, vem["passes"][0]], [args.lam_init] * 2, color="tab:red", lw=1, ls=":")  # warmup: λ held
    bx.plot(vem["passes"], vem["trace"], color="tab:red", lw=1, label="VEM (constant SGD, diag)")
    bx.plot(bbvi["passes"], bbvi["trace"], color="tab:green", lw=1, label="BBVI (SVI, AutoNormal)")
    if np.isfinite(lo):
        bx.axhspan(lo, hi, color="tab:blue", alpha=0.12, label="flat bottom")
    bx.axhline(vem["lam"], color="tab:red", lw=0.8, ls="--", label="VEM selected (average)")
    bx.set_yscale("log")
    bx.set_xscale("symlog", linthresh=1.0)
    bx.set_xlim(0.0, 1.05 * max(vem["passes"][-1], bbvi["passes"][-1]))
    bx.set_xlabel("data passes (VEM: dotted = warmup with λ held, then sampling)")
    bx.set_ylabel("λ")
    bx.set_title("λ trajectories")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: smaller grid, subset and budgets")
    p.add_argument("--train-size", type=int, default=None, help="training images (default 10000; quick 3000)")
    p.add_argument("--grid", type=float, nargs="+", default=None, help="λ values of the validation curve")
    p.add_argument("--tolerance", type=float, default=0.01, help="flat bottom: relative excess over the min")
    p.add_argument("--lam-init", type=float, default=1.0, help="initial λ of VEM and BBVI")
    p.add_argument("--vem-batch-size", type=int, default=50)
    p.add_argument("--vem-preconditioner", choices=("diag", "full"), default="diag",
                   help="ConstantSGD preconditioner of the VEM runs")
    p.add_argument("--prior-noise", action="store_true",
                   help="ConstantSGD(prior_noise=True): inject noise with the prior's curvature (Mandt Thm. 3)")
    p.add_argument("--vem-momentum", type=float, default=None,
                   help="momentum damping μ (default 0.1 with diag, 1.0 = none with full)")
    p.add_argument("--pool", type=int, default=1,
                   help="average pool×pool pixel blocks (2: 14×14 images; scales D down by pool²)")
    p.add_argument("--vem-warmup", type=int, default=None, help="warmup SG steps (default 6000; quick 3000)")
    p.add_argument("--vem-steps", type=int, default=None, help="sampling SG steps (default 20000; quick 8000)")
    p.add_argument("--steps-per-sample", type=int, default=50)
    p.add_argument("--hyper-step-size", type=float, default=0.05, help="ρ₀ of the λ updates")
    p.add_argument("--bbvi-batch-size", type=int, default=200)
    p.add_argument("--bbvi-steps", type=int, default=None, help="SVI steps (default 20000; quick 4000)")
    p.add_argument("--bbvi-lr", type=float, default=0.01)
    p.add_argument("--vem-sweep", type=int, nargs="*", default=[],
                   help="extra VEM runs at these minibatch sizes (rows of the table)")
    p.add_argument("--vem-seeds", type=int, nargs="+", default=None,
                   help="chain seeds of the VEM runs (default: --seed); the first is the main run")
    p.add_argument("--laplace", action="store_true",
                   help="diagnostic: Laplace-approximation EM fixed point (exact Hessian; ~3 min more)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="folder holding mnist/ (default: $NUMPYRO_SGD_DATA)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "results"))
    p.add_argument("--name", default="empirical_bayes", help="output files NAME.png and NAME_results.md")
    args = p.parse_args(argv)
    q = args.quick
    args.train_size = args.train_size or (3000 if q else 10_000)
    args.grid = sorted(set(args.grid or (QUICK_GRID if q else DEFAULT_GRID)))
    args.vem_warmup = args.vem_warmup or (3000 if q else 6000)
    args.vem_steps = args.vem_steps or (8000 if q else 20_000)
    args.bbvi_steps = args.bbvi_steps or (4000 if q else 20_000)
    args.vem_seeds = args.vem_seeds or [args.seed]
    if args.vem_preconditioner == "full":
        # the full noise matrix has the softmax's shift directions as (near-)null space: its
        # condition number is far beyond float32's Cholesky (every step was rejected in float32)
        numpyro.enable_x64()
    if args.vem_momentum is None:
        args.vem_momentum = 0.1 if args.vem_preconditioner == "diag" else 1.0
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()

    x, y, x_val, y_val, d = load_data(args.train_size, args.seed, args.data, args.pool)
    n = x.shape[0]
    print(f"MNIST: N = {n:,} training images, {x_val.shape[0]:,} validation (test) images, "
          f"D = {d} features kept (of {784 // args.pool**2}), K = {NUM_CLASSES}, {d * NUM_CLASSES:,} weights")

    # (a) the validation curve
    t = time.perf_counter()
    fits = map_curve(args.grid, x, y, x_val, y_val)
    t_grid = time.perf_counter() - t
    print(f"(a) MAP on {len(fits)} grid values: {t_grid:.0f} s")

    # (b) VEM with constant SGD (and the optional sweep over its minibatch size), (c) BBVI
    vems = {}
    main_run = (args.vem_batch_size, args.vem_seeds[0])
    sizes = [args.vem_batch_size] + [b for b in args.vem_sweep if b != args.vem_batch_size]
    for size in sizes:
        for seed in args.vem_seeds:
            v = run_vem(argparse.Namespace(**{**vars(args), "vem_batch_size": size}), x, y, seed)
            vems[size, seed] = v
            print(f"(b) VEM, S = {size}, seed {seed}: {v['seconds']:.0f} s, λ = {v['lam']:.4g} "
                  f"(final iterate {v['lam_final']:.4g}), {v['divergences']} divergences")
    vem = vems[main_run]
    bbvi = run_bbvi(args, x, y, args.seed)
    print(f"(c) BBVI: {bbvi['seconds']:.0f} s, λ = {bbvi['lam']:.4g}")

    t = time.perf_counter()
    refits = {"BBVI": refit(bbvi["lam"], fits, x, y, x_val, y_val)}
    if collapsed(vem, args.grid) is None:
        refits["VEM"] = refit(vem["lam"], fits, x, y, x_val, y_val)
        refits["VEM final iterate"] = refit(vem["lam_final"], fits, x, y, x_val, y_val)
    for key, v in vems.items():
        if key != main_run and collapsed(v, args.grid) is None:
            refits[key] = refit(v["lam"], fits, x, y, x_val, y_val)
    t_refit = time.perf_counter() - t

    grid_lams = sorted(fits)
    grid_loss = [fits[g]["losses"].mean() for g in grid_lams]
    best_grid = grid_lams[int(np.argmin(grid_loss))]

    laplace, t_laplace = None, 0.0
    if args.laplace:
        t = time.perf_counter()
        laplace = laplace_em(fits, best_grid, x)
        if np.isfinite(laplace["fixed_point"]):
            refits["Laplace"] = refit(laplace["fixed_point"], fits, x, y, x_val, y_val)
        t_laplace = time.perf_counter() - t
        print(f"--laplace: {t_laplace:.0f} s, fixed point λ = {laplace['fixed_point']:.4g}")

    best_loss = min(min(grid_loss), *(r["losses"].mean() for r in refits.values()))
    threshold = best_loss * (1 + args.tolerance)
    # the band interpolates every MAP fit measured: the grid and the refits at the selected λ
    measured = dict(zip(grid_lams, grid_loss)) | {r["lam"]: r["losses"].mean() for r in refits.values()}
    curve = sorted(measured.items())
    lo, hi, lo_open, hi_open = flat_bottom([c[0] for c in curve], [c[1] for c in curve], threshold)
    ref = fits[best_grid]["losses"]

    def row(name, lam, fit, extra=""):
        diff = fit["losses"] - ref
        se = diff.std(ddof=1) / np.sqrt(diff.size)
        val = fit["losses"].mean()
        excess = 100 * (val / best_loss - 1)
        inside = "yes" if val <= threshold else "no"
        return [name, f"{lam:.4g}", f"{val:.4f}", f"{excess:+.2f} %", f"{diff.mean():+.4f} ± {se:.4f}",
                inside, f"{fit['iterations']}", f"{fit['grad_max_per_n']:.1e}", extra]

    def vem_note(v):
        return (f"avg of 2nd half (range {v['lam_half_range'][0]:.3g}-{v['lam_half_range'][1]:.3g}); "
                f"{v['passes'][-1]:.0f} passes, {v['seconds']:.0f} s, {v['divergences']} div.")

    def vem_name(key):
        seed = f", seed {key[1]}" if len(args.vem_seeds) > 1 else ""
        noise = " + prior noise" if args.prior_noise else ""
        return f"VEM (ConstantSGD {args.vem_preconditioner}{noise}, S={key[0]}{seed})"

    header = ["λ from", "λ", "val. loss", "excess over min", "Δ vs best grid ± SE", "flat bottom",
              "L-BFGS it.", "max|∇L|/N", "notes"]
    rows = [row("grid", g, fits[g]) for g in grid_lams]
    if "VEM" in refits:
        rows.append(row(vem_name(main_run), vem["lam"], refits["VEM"], vem_note(vem)))
        rows.append(row("VEM final iterate", vem["lam_final"], refits["VEM final iterate"]))
    else:
        rows.append([vem_name(main_run), f"{vem['lam']:.3g}", "-", "-", "-", "no", "-", "-",
                     f"{collapsed(vem, args.grid)}; {vem_note(vem)}"])
    for key, v in vems.items():
        if key == main_run:
            continue
        if key in refits:
            rows.append(row(vem_name(key), v["lam"], refits[key], vem_note(v)))
        else:
            rows.append([vem_name(key), f"{v['lam']:.3g}", "-", "-", "-", "no", "-", "-",
                         f"{collapsed(v, args.grid)}; {vem_note(v)}"])
    rows.append(row("BBVI (SVI AutoNormal)", bbvi["lam"], refits["BBVI"],
                    f"final; λ changed {100 * bbvi['drift']:+.1f} % over the last 10 % of steps; "
                    f"{bbvi['passes'][-1]:.0f} passes, {bbvi['seconds']:.0f} s"))
    if "Laplace" in refits:
        rows.append(row("Laplace EM fixed point", laplace["fixed_point"], refits["Laplace"],
                        "reference: exact-Hessian Laplace posterior (--laplace)"))
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    text = "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [header] + rows)

    def edge(v, open_, side):
        return f"{side}{v:.3g}" if open_ else f"{v:.3g}"

    bottom = (f"flat bottom (val. loss ≤ {threshold:.4f} = min {best_loss:.4f} + {100 * args.tolerance:g} %): "
              f"λ ∈ [{edge(lo, lo_open, '≤ ')}, {edge(hi, hi_open, '≥ ')}] (log-linear interpolation of all MAP fits)"
              if np.isfinite(lo) else "flat bottom: no grid point within the tolerance")
    dk = d * NUM_CLASSES
    notes = [bottom,
             f"EM fixed point λ = DK / E_q|θ|² (DK = {dk}): VEM draws (2nd half) E|θ|² = {vem['sq_norm_theta']:.1f} "
             f"→ {dk / vem['sq_norm_theta']:.3g}; BBVI |μ|² + Σσ² = {bbvi['sq_norm_loc']:.1f} + "
             f"{bbvi['sq_norm_theta'] - bbvi['sq_norm_loc']:.1f} → {dk / bbvi['sq_norm_theta']:.3g}",
             f"BBVI convergence check: |μ|² = {bbvi['sq_norm_loc']:.1f} against |θ̂|² = "
             f"{float(np.sum(np.asarray(refits['BBVI']['theta'], np.float64) ** 2)):.1f} for the MAP at its λ "
             "(a converged mean-field mean is close to the MAP; a larger |μ|² is optimiser noise, which lowers λ)"]
    lap_text = ""
    if laplace is not None:
        lap_rows = [["λ", "|θ̂|²", "tr(λ+H)⁻¹", "DK/E|θ|² (Laplace)", "Σ 1/(λ+H_ii)", "DK/E|θ|² (diag)"]]
        lap_rows += [[f"{r[0]:.4g}", f"{r[1]:.1f}", f"{r[2]:.1f}", f"{r[3]:.4g}", f"{r[4]:.1f}", f"{r[5]:.4g}"]
                     for r in laplace["table"]]
        w = [max(len(r[i]) for r in lap_rows) for i in range(len(lap_rows[0]))]
        lap_text = "\n".join("  ".join(c.ljust(wi) for c, wi in zip(r, w)) for r in lap_rows)
        notes.append(f"Laplace EM map (H at the MAP of λ = {best_grid:g}): fixed point λ = "
                     f"{laplace['fixed_point']:.4g} with the exact Hessian, {laplace['fixed_point_diag']:.4g} with its "
                     "diagonal only (mean-field variances 1/(λ + H_ii)); log-linear interpolation of the table below")
        if "VEM" in refits:
            lam_v = vem["lam"]
            sq_v = float(np.sum(np.asarray(refits["VEM"]["theta"], np.float64) ** 2))
            tr_v = float(np.sum(1.0 / (lam_v + laplace["eig"])))
            mf_v = float(np.sum(1.0 / (lam_v + laplace["hdiag"])))
            notes.append(f"At the VEM λ = {lam_v:.3g}: E|θ|² = |θ̂|² + tr(λ+H)⁻¹ = {sq_v:.1f} + {tr_v:.1f} "
                         f"= {sq_v + tr_v:.1f} (Laplace, → DK/E|θ|² = {dk / (sq_v + tr_v):.3g}); |θ̂|² + Σ 1/(λ+H_ii) "
                         f"= {sq_v + mf_v:.1f} (mean field, → {dk / (sq_v + mf_v):.3g}); VEM draws "
                         f"{vem['sq_norm_theta']:.1f}")
    total = time.perf_counter() - t0
    timing = (f"runtime: total {total:.0f} s (grid {t_grid:.0f} s, VEM "
              f"{sum(v['seconds'] for v in vems.values()):.0f} s, BBVI {bbvi['seconds']:.0f} s, "
              f"refits {t_refit:.0f} s" + (f", Laplace {t_laplace:.0f} s)" if laplace is not None else ")"))
    print()
    print(text)
    print()
    print("\n".join(notes))
    if lap_text:
        print(lap_text)
    print(timing)

    png = os.path.join(args.out, f"{args.name}.png")
    extra_marks = [(f"VEM S={key[0]}", v["lam"], refits[key]["losses"].mean())
                   for key, v in vems.items() if key in refits]
    if "Laplace" in refits:
        extra_marks.append(("Laplace EM", laplace["fixed_point"], refits["Laplace"]["losses"].mean()))
    plot(png, fits, lo, hi, best_loss, args.tolerance,
         [("VEM (constant SGD)", vem["lam"], refits["VEM"]["losses"].mean() if "VEM" in refits else np.nan),
          ("BBVI", bbvi["lam"], refits["BBVI"]["losses"].mean())], extra_marks, vem, bbvi, args)
    command = "python examples/empirical_bayes.py " + " ".join(sys.argv[1:] if argv is None else argv)
    md_rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md_rows += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    md = [
        "# Empirical Bayes on MNIST (Mandt et al. 2017, Sec. 6.3 / Fig. 6)", "",
        "Written by `examples/empirical_bayes.py` (see its docstring for the protocol and the choices).", "",
        f"Command: `{command.strip()}`  ",
        f"{timing[0].upper()}{timing[1:]}, {os.cpu_count()} CPU cores  ",
        f"Data: N = {n:,} training images (seed {args.seed}), {x_val.shape[0]:,} validation (MNIST test) images, "
        f"D = {d} features ({'pixels' if args.pool == 1 else f'means of {args.pool}×{args.pool} pixel blocks'}), "
        f"{dk:,} weights  ",
        f"VEM: ConstantSGD {args.vem_preconditioner}{' + prior noise' if args.prior_noise else ''}, "
        f"momentum {args.vem_momentum}, S = {args.vem_batch_size}, "
        f"{args.vem_warmup} warmup + {args.vem_steps} sampling SG steps, ρ₀ = {args.hyper_step_size}, "
        f"λ₀ = {args.lam_init}  ",
        f"BBVI: AutoNormal, S = {args.bbvi_batch_size}, {args.bbvi_steps} steps, Adam {args.bbvi_lr} "
        f"(held for a quarter, then decaying to 1 %), λ₀ = {args.lam_init}", "",
        *md_rows, "", *(n_ + "  " for n_ in notes), "",
    ]
    if lap_text:
        md += ["Laplace EM map (`--laplace`):", "", "```", lap_text, "```", ""]
    md += [f"![validation curve and λ trajectories]({args.name}.png)", ""]
    md_path = os.path.join(args.out, f"{args.name}_results.md")
    with open(md_path, "w") as f:
        f.write("\n".join(md))
    print(f"wrote {png} and {md_path}")


if __name__ == "__main__":
    main()
