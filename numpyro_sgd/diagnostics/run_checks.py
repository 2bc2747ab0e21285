"""End-of-run checks of a stochastic-gradient run (:func:`check_run`): rejected steps, R-hat, the
full-data gradient at the draws, the spread of the draws against the curvature, the offset of
the mean from the mode, and the hints that name a fix.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.util import find_stack_level

from ..numerics.row_blocks import FULL_PASS_ROWS, sum_over_row_blocks
from .runs import kernel_of, run_model_args

__all__ = ["check_run"]


#: :func:`check_run` thresholds: split R-hat above, bulk ESS below, mode offset (sds) above
RHAT_MAX, ESS_MIN, MODE_OFFSET_MAX = 1.1, 10.0, 3.0


#: check 5 of :func:`check_run`: the draws' sd along some direction is more than this factor
#: wider, or narrower, than the posterior's curvature at their mean gives (Laplace)
SPREAD_FACTOR_MAX = 2.0


#: and it runs up to this dimension (D forward-mode passes over a few thousand rows)
SPREAD_CHECK_MAX_DIM = 200


def is_sg_run(run):
    from ..driver.kernel import SGKernel

    return isinstance(getattr(run, "sampler", None), SGKernel) and getattr(run, "_states", None) is not None


def _unconstrained_draws(kernel, samples):
    """{site: (chains, draws, d)} unconstrained draws of the latent sites, from constrained samples."""
    potential = kernel.potential
    out = {}
    for name in potential.view.names:
        value = jnp.asarray(samples[name])
        transform = potential.transforms.get(name)
        u = transform.inv(value) if transform is not None else value
        out[name] = np.asarray(u, np.float64).reshape(value.shape[:2] + (-1,))
    return out


def _full_gradient(kernel, theta, model_args, model_kwargs, params, chunk_size=FULL_PASS_ROWS):
    """∇U(θ) on all the data: one plate of N > ``chunk_size`` rows is summed in blocks as
    Σ_c (K_c/N) ∇Û_{K_c}(θ) (each block's potential carries the prior and the scale N/K_c), so no
    N-sized intermediate is built."""
    potential = kernel.potential
    plates = potential.plates
    if len(plates) != 1 or plates[0].size <= chunk_size:
        return jax.grad(potential.full_potential)(theta, model_args, model_kwargs, params)
    (plate,) = plates

    def grad_at(start, size):
        idx = {plate.name: start + jnp.arange(size)}
        return jax.grad(potential.potential)(theta, idx, model_args, model_kwargs, params) * (size / plate.size)

    return sum_over_row_blocks(grad_at, plate.size, chunk_size)


def _worst(stat, draws, pick):
    """(site, flat index, value) of the coordinate where ``stat`` is worst (``pick``: argmax/argmin)."""
    best = None
    for name, x in draws.items():
        values = np.asarray(stat(x), np.float64).reshape(-1)
        values = np.where(np.isfinite(values), values, -np.inf if pick is np.argmin else np.inf)
        j = int(pick(values))
        if best is None or (values[j] < best[2] if pick is np.argmin else values[j] > best[2]):
            best = (name, j, float(values[j]))
    return best


def _statistic(value):
    """A diagnostic's value as text; a non-finite one (a coordinate with no variance within a
    chain half, where R-hat and ESS divide by zero) says so instead of printing inf."""
    if np.isfinite(value):
        return f"{value:.3g}"
    return "undefined (the coordinate has no variance within a chain half: the chain did not move)"


def _coordinate(draws, name, j):
    return name if draws[name].shape[-1] == 1 else f"{name}[{j}]"


def check_run(mcmc, *, gradient=True, warn=True):
    """End-of-run checks of a numpyro_sgd run; each failed check gives a warning that names the
    problem and what to try. Returns the list of messages (empty: every check passed).

    NumPyro's ``MCMC.run`` gives the kernel no call after its last sample (and a host callback in
    the step would cost a sync per step and keep XLA's compilation cache from storing the loop),
    so these checks run here; :func:`to_arviz` and :func:`compare` run the cheap ones (all but
    ``gradient``) on every numpyro_sgd run they are given. The checks:

    1. *Rejected steps*: SG steps whose potential, gradient or new state was non-finite, or whose
       constrained value left the open support, were not taken (``mcmc.last_state.num_divergences``).
    2. *Not stationary*: split R-hat (Gelman et al. 2013, Sec. 11.4; every chain split in halves,
       so one chain that drifts is caught) above 1.1 on an unconstrained coordinate.
    3. *Frozen directions*: bulk ESS below 10 (or no variance at all) on a coordinate: the chain
       hardly moved in that direction, e.g. a badly scaled posterior under a scalar or diagonal
       preconditioner.
    4. *Away from the mode* (``gradient=True``, one full-data gradient per chain): at each chain's
       mean θ̄ of unconstrained draws with covariance Σ, the full-data gradient g = ∇U(θ̄) ≈ A(θ̄ − θ*)
       near a Gaussian mode, and with Σ ≈ A⁻¹, δ = (gᵀΣg)^½ is the distance of θ̄ from the mode in
       posterior sds; δ > 3 flags a chain that settled away from the posterior (e.g. a warmup that
       did not reach the mode). Skewed posteriors put the mean O(skewness) sds from the mode, far
       below 3.
    5. *Spread against curvature* (``gradient=True``, D ≤ 200): with Σ the draws' covariance
       (pooled over chains) and H ≈ ∇²U(θ̄) estimated on a fixed minibatch of a few thousand
       rows, the eigenvalues of Σ H are the squared sd ratios of the draws to the Laplace
       approximation (1 for a Gaussian posterior; large-N posteriors are close to Gaussian, the
       Bernstein–von Mises regime these kernels are for). A ratio above 2 or below 1/2 flags
       draws much wider (a step size whose minibatch noise inflates the variance) or much
       narrower (a direction frozen by the preconditioner) than the posterior.

    :param mcmc: a finished ``numpyro.infer.MCMC`` run of a numpyro_sgd kernel.
    :param bool gradient: run check 4 (one data pass per chain, computed in chunks).
    :param bool warn: also issue each message as a ``UserWarning``.
    :return: list of str.
    """
    kernel = kernel_of(mcmc, "check_run")
    name = type(kernel).__name__
    state = mcmc.last_state
    messages = []
    rejected = int(np.sum(np.asarray(state.num_divergences)))
    if rejected:
        steps = int(np.sum(np.asarray(state.i)))
        first = np.asarray(state.first_divergence).reshape(-1)
        first = int(first[first >= 0].min()) if np.any(first >= 0) else -1
        messages.append(
            f"{name}: {rejected} of {steps} SG steps were rejected (first at step {first}): a non-finite "
            "potential, gradient or state, or a constrained value on the edge of its support. Each repeats "
            "the previous draw, so the chain mixes less than it seems. Try a longer warmup, init_params near "
            "the mode, or a smaller step (step_size / target_inflation). Many rejections on a model with "
            "local scale latents (hierarchical scales, horseshoe) mean a funnel that a constant-rate kernel "
            "cannot represent: sample those scales with SGWithinGibbs or use NUTS (docs/robustness.md).")
    samples = mcmc.get_samples(group_by_chain=True)
    draws = _unconstrained_draws(kernel, samples)
    num_draws = next(iter(draws.values())).shape[1] if draws else 0
    if num_draws >= 4:
        from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

        with np.errstate(all="ignore"):  # no variance or overflowing draws: said in words (_statistic)
            site, j, rhat = _worst(split_gelman_rubin, draws, np.argmax)
            ess_worst = _worst(effective_sample_size, draws, np.argmin)
        if not rhat <= RHAT_MAX:
            messages.append(
                f"{name}: split R-hat {_statistic(rhat)} > {RHAT_MAX} for {_coordinate(draws, site, j)} "
                "(unconstrained): "
                "the chain drifts between the halves of the run, or the chains sit in different places, so "
                "the draws are not yet from a stationary law and their means and sds are biased. Try a longer "
                "warmup (warmup_passes), predictors rescaled to unit scale (warmup's first phase moves in absolute "
                "units; keep warmup_newton=True, the default), or init_params near the mode." + _gibbs_hint(kernel))
        site, j, ess = ess_worst
        if not ess >= ESS_MIN:
            messages.append(
                f"{name}: bulk ESS {_statistic(ess)} < {ESS_MIN:g} for {_coordinate(draws, site, j)} "
                "(unconstrained): the "
                "chain hardly moves in this direction (a direction the preconditioner leaves frozen, or a run "
                "shorter than its relaxation time), so estimates along it are unreliable. Try "
                "preconditioner='full', a longer run (num_samples, steps_per_sample), or rescaled predictors.")
        if gradient:
            for check, label in ((_mode_offset_messages, "mode-offset check (4)"),
                                 (_spread_messages, "spread-against-curvature check (5)")):
                messages += _guarded(check, label, kernel, mcmc, state, draws, name)
    if warn:
        for message in messages:
            warnings.warn(message, UserWarning, stacklevel=find_stack_level())
    return messages


def _guarded(check, label, kernel, mcmc, state, draws, name):
    """``check(...)``'s messages, or, when it cannot run on this model or run (it raised, e.g. a
    distribution's argument check at a draws' mean outside a dependent support such as
    ``b ~ Uniform(0, a)``), one message naming the check and why it was skipped: ``check_run``
    never raises on a run it cannot judge, and its other checks still run."""
    try:
        with np.errstate(all="ignore"):  # non-finite values are reported in the messages
            return check(kernel, mcmc, state, draws, name)
    except Exception as err:  # noqa: BLE001 - any failure of a check is reported, not raised
        reason = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        return [f"{name}: check_run's {label} was skipped: it could not be evaluated on this model and run "
                f"({reason}). The run is not judged by this check; compare with NUTS on a subset of the data, "
                "or look at the draws' trace plots."]


def _spread_messages(kernel, mcmc, state, draws, name):
    """Check 5 of :func:`check_run` (the draws' covariance against the inverse Hessian at their mean)."""
    from ..model.oracle import MinibatchOracle

    potential = kernel.potential
    if getattr(kernel, "hyperparameters", None) is not None or potential.dim > SPREAD_CHECK_MAX_DIM:
        return []
    names = potential.view.names
    if set(names) != set(draws):  # a wrapper whose draws hold sites the potential does not
        return []
    model_args, model_kwargs = run_model_args(mcmc, mcmc.get_samples(group_by_chain=True), name="check_run")
    flat = np.concatenate([draws[k] for k in names], axis=-1)
    x = flat.reshape(-1, flat.shape[-1])
    cov = np.atleast_2d(np.cov(x, rowvar=False))
    oracle = MinibatchOracle(potential, model_args, model_kwargs)
    theta = jnp.asarray(x.mean(0), jnp.result_type(float))  # float32 unless x64 is on
    hessian = np.asarray(oracle.hessian_estimate(theta), np.float64)
    try:
        root = np.linalg.cholesky(cov + 1e-300 * np.eye(len(cov)))
    except np.linalg.LinAlgError:
        return []  # a degenerate covariance: the bulk-ESS check has already named it
    values, vectors = np.linalg.eigh(root.T @ (0.5 * (hessian + hessian.T)) @ root)
    if not np.all(np.isfinite(values)) or values[0] <= 0:
        return []  # no positive-definite curvature at the mean: the Laplace comparison does not apply
    ratios = np.sqrt(values)  # the draws' sd over the Laplace sd along each direction
    messages = []
    for ratio, vector in ((ratios[-1], vectors[:, -1]), (ratios[0], vectors[:, 0])):
        if 1.0 / SPREAD_FACTOR_MAX <= ratio <= SPREAD_FACTOR_MAX:
            continue
        j = int(np.argmax(np.abs(root @ vector)))
        site, offset = _site_of(draws, names, j)
        wide = ratio > 1
        messages.append(
            f"{name}: the draws' sd is {ratio:.3g}× the posterior's along a direction led by "
            f"{_coordinate(draws, site, offset)} (unconstrained; Laplace approximation from the Hessian at "
            "the draws' mean): the draws are " + (
                "too wide, e.g. a step size whose minibatch noise inflates the variance. Leave step_size unset "
                "(the default keeps the inflation at target_inflation) or lower it." if wide else
                "too narrow, e.g. a direction the preconditioner leaves frozen or a run shorter than its "
                "relaxation time. Try preconditioner='full' or a longer run."))
    return messages


def _site_of(draws, names, j):
    """(site, index within the site) of flat coordinate ``j``."""
    for name in names:
        size = draws[name].shape[-1]
        if j < size:
            return name, j
        j -= size
    raise IndexError(j)


def _mode_offset_messages(kernel, mcmc, state, draws, name):
    model_args, model_kwargs = run_model_args(mcmc, mcmc.get_samples(group_by_chain=True), name="check_run")
    flat = np.concatenate([draws[k] for k in kernel.potential.view.names], axis=-1)  # (chains, draws, D)
    hyperparameters = getattr(kernel, "hyperparameters", None)
    messages = []
    for c in range(flat.shape[0]):
        x = flat[c]
        params = None
        if hyperparameters is not None:
            params = hyperparameters(state if np.ndim(state.i) == 0 else jax.tree.map(lambda v, c=c: v[c], state))
        g = np.asarray(_full_gradient(kernel, jnp.asarray(x.mean(0)), model_args, model_kwargs, params), np.float64)
        cov = np.cov(x, rowvar=False).reshape(x.shape[1], x.shape[1]) if x.shape[1] <= 2000 else None
        if not np.all(np.isfinite(g)):
            messages.append(
                f"{name}: the full-data gradient at chain {c}'s mean is not finite, so its distance from the mode "
                "cannot be measured: the mean of the draws lies where the model's density is zero or undefined "
                "(e.g. outside a dependent support such as b ~ Uniform(0, a), or after rejected steps). Look at "
                "the draws of each site; try init_params near the mode or a longer warmup (warmup_passes).")
            continue
        offset = math.sqrt(max(float(g @ cov @ g) if cov is not None else float(np.sum(g**2 * x.var(0))), 0.0))
        if not offset <= MODE_OFFSET_MAX:
            messages.append(
                f"{name}: chain {c}'s mean is {offset:.3g} posterior sds from the mode (full-data gradient at "
                "the mean, in units of the draws' covariance): the chain settled away from the posterior, "
                "e.g. after a warmup that did not reach the mode. Try a longer warmup (warmup_passes), "
                "predictors rescaled to unit scale (keep warmup_newton=True, the default), or init_params near "
                "the mode."
                + _gibbs_hint(kernel))
    return messages


def _gibbs_hint(kernel):
    """The causes to name first for SGWithinGibbs: data far from unit scale (the group latents
    start on the unit scale, the hyperparameters are drawn given them and collapse, and a
    collapsed group scale pins the latents; measured on the OSIC-shaped model in ml), and too few
    rows of each group per minibatch (2.8 per group: group sds up to 20× NUTS's, mode offsets of
    7 and 170 sds)."""
    from ..kernels.gibbs import SGWithinGibbs

    if not isinstance(kernel, SGWithinGibbs):
        return ""
    hint = (" With SGWithinGibbs, first put the outcome (not only the predictors) on unit scale: the group "
            "latents start on the unit scale, the hyperparameters are drawn given latents that have not yet "
            "reached the data, and a collapsed group scale pins them there (docs/results/hierarchical.md).")
    if kernel.group_warning is not None:  # the group-size cause applies: init found it
        hint += (" Groups with too few rows per minibatch also give this (init warned: "
                 + kernel.group_warning.removeprefix("SGWithinGibbs: ") + ")")
    return hint
