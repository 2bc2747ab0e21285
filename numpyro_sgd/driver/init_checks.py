"""The driver's checks of a traced model at ``init``, as functions it calls (they raise or warn).

Each names the kernel (``name``), the plate or site, the problem and the fix. The driver
(:class:`~numpyro_sgd.SGKernel`) decides when to call them (once per kernel or per model
arguments); they hold no state.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.util import find_stack_level

from ..adaptation.control_variates import off_gaussian_message
from ..adaptation.relaxation import PredictedRelaxation
from ..data.model_args import AUTO_STREAM_BYTES, is_tracer, split_arrays
from ..data.streaming import streamed_sources
from ..model.likelihood import log_likelihood_chunks
from ..model.sharding import check_mesh
from ..model.structure import classify_sites, hyper_candidates, support_conflict

__all__ = ["check_problem_size", "warn_short_blocks", "warn_short_run", "warn_hyper_candidates", "warn_full_data_steps",
           "check_data", "warn_constant_data", "all_finite", "InitChecks"]


#: model arguments larger than this, closed over by the compiled loop, get a warning (32 MiB)
CONSTANT_DATA_WARN_BYTES = AUTO_STREAM_BYTES

#: an explicit ``steps_per_sample`` below relaxation time / this factor warns at ``init``
RELAXATION_WARN_FACTOR = 10

#: the end of warmup warns when the predicted effective sample size of the run, all chains
#: together, is below this: a mean's Monte Carlo error is then above 1/√100 = 0.1 posterior sd and
#: an sd's above 1/√200 ≈ 7 % (one standard error; twice that is common). Per chain 20 (0.22 sd)
#: left runs with sds 14–16 % off unwarned (EWSG, 1 chain, a predicted ESS near 40)
MIN_PREDICTED_ESS = 100

#: ``init`` warns for a subsample plate with fewer rows than this (not a stochastic-gradient problem)
TINY_N = 100

#: ``init`` checks that a minibatch gradient's cost shrinks with S for N at least this large
#: (:meth:`~numpyro_sgd.model.potential.SubsampledPotential.fixed_step_cost`; below, a pass is cheap)
FULL_DATA_CHECK_MIN_N = 10_000


#: ``all_finite`` reads a NumPy or streamed array in blocks of about this many elements, so that
#: its temporaries (the block read, ``np.isfinite``'s booleans) stay a few MB whatever the width:
#: blocks of 10⁶ rows held 50 MB of booleans at D = 50, and would hold 1 GB at D = 1,000
FINITE_CHECK_ELEMENTS = 1 << 22


def all_finite(array, rows=None):
    """Whether an array argument has no NaN/inf (integer arrays: True), without a full copy:
    ``rows`` rows at a time (default: about :data:`FINITE_CHECK_ELEMENTS` elements)."""
    if not jnp.issubdtype(array.dtype, jnp.inexact):
        return True
    if rows is None:
        width = math.prod(array.shape[1:]) if len(array.shape) > 1 else 1
        rows = max(1, FINITE_CHECK_ELEMENTS // max(width, 1))
    if isinstance(array, np.ndarray):
        flat = array.reshape(array.shape[0], -1) if array.ndim else array.reshape(1, 1)
        return all(np.isfinite(flat[i:i + rows]).all() for i in range(0, flat.shape[0], rows))
    if not isinstance(array, jax.Array):  # a streamed source (shards, zarr, HDF5): read in blocks of rows
        return all(np.isfinite(np.asarray(array[i:i + rows])).all() for i in range(0, array.shape[0], rows))
    return bool(_jit_all_finite(array))


#: whether every array of a pytree is finite (one program for all the leaves). Optimised: it reads
#: all the data (at 10⁷ × 50 floats 0.46 s, against 1.74 s compiled without LLVM optimisation)
_jit_all_finite = jax.jit(lambda tree: jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree)])))


def _jax_arrays_finite(arrays):
    """Whether every JAX array of ``arrays`` is finite: one program for all of them (one compile
    instead of one per shape), or one per array where they are committed to different devices."""
    if not arrays:
        return True
    try:
        return bool(_jit_all_finite(arrays))
    except ValueError:  # arrays committed to different devices cannot enter one program
        return all(bool(_jit_all_finite([a])) for a in arrays)


def warn_constant_data(name, model_args, model_kwargs):
    """Warn (at trace time) when large data would be compiled into the program as constants.

    With NumPyro's default ``MCMC(..., jit_model_args=False)`` the model arguments are closed
    over by the compiled loop: XLA embeds them in the executable and constant-folds what it
    can, so compile time grows with the data (measured: +1.3 s per ``MCMC.run`` at 40 MB,
    N = 10⁶ × 10 floats) and the data are held about four times (measured: 4.4× the data at peak,
    :mod:`numpyro_sgd.data.model_args`). ``jit_model_args=True`` passes them as
    arguments (Python scalars such as a ``subsample_size`` argument stay static).
    """
    arrays = [x for x in jax.tree.leaves((model_args, model_kwargs)) if isinstance(x, (jax.Array, np.ndarray))]
    sharded = [x for x in arrays if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
               and len(x.sharding.device_set) > 1 and not x.sharding.is_fully_replicated]
    if sharded:
        warnings.warn(
            f"{name}: model arguments sharded over {len(sharded[0].sharding.device_set)} devices are compiled "
            "into the sampling loop as constants (NumPyro's default jit_model_args=False): XLA replicates them "
            "on every device and the sharding is lost. Pass MCMC(..., jit_model_args=True) so that each device "
            "keeps its own rows.", stacklevel=find_stack_level())
    size = sum(x.nbytes for x in arrays if not isinstance(x, jax.core.Tracer))
    if size > CONSTANT_DATA_WARN_BYTES:
        warnings.warn(
            f"{name}: {size / 2**20:.0f} MB of model arguments are compiled into the sampling loop as "
            "constants (NumPyro's default jit_model_args=False), which makes every compilation slower "
            "and holds the data about four times at peak (measured 4.4×). Pass MCMC(..., jit_model_args=True) to give "
            "them to the loop as "
            "arguments, or give data the model indexes by the plate (X[idx]) as numpyro_sgd.stream(X): "
            "its rows are then read in place, and the data are held once.", stacklevel=find_stack_level())


def check_problem_size(name, potential):
    """Refuse a plate whose minibatch is half the data or more; warn below a quarter, and for
    fewer than :data:`TINY_N` rows.

    With S ≥ N/2 a minibatch gradient saves at most 2× over the full-data one, and the
    gradient-noise estimate that sets the KL-optimal rate degenerates (sampling without
    replacement, Q carries the factor (N − S)/(N − 1) → 0; with N = 4, S = 2 there are two
    rows per estimate): measured, ConstantSGD, SGFS and IASG returned means 10¹⁸–10²⁰
    posterior sds off at N = 4, S = 2 and at N = 100, S = 99.
    """
    for p in potential.plates:
        ratio = p.size / p.subsample_size
        fix = (f"run NUTS on the full data (declare plate '{p.name}' without subsample_size), or use "
               f"subsample_size <= {p.size // 4}")
        if ratio <= 2:
            raise ValueError(
                f"{name}: plate '{p.name}' subsamples S = {p.subsample_size} of N = {p.size} rows "
                f"(N/S = {ratio:.3g}): not a stochastic-gradient problem (a minibatch gradient saves at "
                f"most {ratio:.3g}× over a full-data one, and the gradient-noise estimate degenerates); "
                f"{fix}.")
        if p.size < TINY_N:
            warnings.warn(
                f"{name}: plate '{p.name}' has N = {p.size} rows: too few for the gradient-noise estimates and "
                f"the large-N approximations the SG kernels rest on (measured: N = 8, S = 2 gave an sd 2× too "
                f"large with ConstantSGD and means 10¹⁹ sds off with IASG); NUTS on all {p.size} rows is exact "
                "and fast.", UserWarning, stacklevel=find_stack_level())
        elif ratio < 4:
            warnings.warn(
                f"{name}: plate '{p.name}' subsamples S = {p.subsample_size} of N = {p.size} rows (N/S = "
                f"{ratio:.3g}): the gradient-noise estimate is poor this close to full batch and a "
                f"minibatch saves little; {fix}.", UserWarning, stacklevel=find_stack_level())


def warn_short_blocks(name, algorithm, steps_per_sample):
    """Warn when an explicit ``steps_per_sample`` is far below the relaxation time."""
    relax, k = algorithm.block.steps, steps_per_sample
    if relax is None or algorithm.block.summarises or k * RELAXATION_WARN_FACTOR >= relax:
        return
    warnings.warn(
        f"{name}: steps_per_sample={k} returns a draw every {k / relax:.2g} of the "
        f"chain's relaxation time ({relax} SG steps, one data pass of N/S): consecutive draws are "
        f"nearly copies, so the effective sample size is about num_samples × {k / relax:.2g}, not "
        "num_samples. Leave steps_per_sample unset (default: the relaxation time) or raise it.",
        UserWarning, stacklevel=find_stack_level(),
    )


def warn_off_gaussian(name, control):
    """Warn at the end of warmup when a control-variate kernel's centre did not converge or its
    posterior is far from Gaussian over a posterior sd
    (:func:`~numpyro_sgd.adaptation.control_variates.off_gaussian_message`; ``control``: the kernel state's
    :class:`~numpyro_sgd.adaptation.control_variates.ControlState`)."""
    message = off_gaussian_message(name, jax.tree.map(np.asarray, control), OFF_GAUSSIAN_ALTERNATIVES)
    if message:
        warnings.warn(message, UserWarning, stacklevel=find_stack_level())


#: what the off-Gaussian warning offers instead of a control-variate kernel
OFF_GAUSSIAN_ALTERNATIVES = ("control_variates=False (SGLD(model), or ConstantSGD(model, preconditioner='full'), whose "
                             "noise-based steps assume no Gaussian shape), or, with SGLD, integrator='euler'")


def warn_short_run(name, relaxation, num_samples, steps_per_sample):
    """Warn at the end of warmup when ``num_samples × steps_per_sample`` SG steps per chain give
    all chains together fewer than :data:`MIN_PREDICTED_ESS` effective samples at the predicted
    autocorrelation time ``relaxation``
    (SG steps, from the steps warmup chose: ``SampleBlock.relaxation``; a scalar, one per chain,
    or a :class:`PredictedRelaxation` whose cause the warning names). Returns the predicted
    effective sample size per chain of the slowest chain (None when it cannot be predicted: no
    finite positive time, as after a warmup too short to estimate the noise, which says so)."""
    cause = ""
    if isinstance(relaxation, PredictedRelaxation):
        relaxation, cause = relaxation
    times = np.asarray(relaxation, float)
    if times.size == 0 or np.all(np.isnan(times)):
        return None
    relaxation = float(np.nanmax(times))
    if not relaxation > 0:
        return None
    run = num_samples * steps_per_sample
    ess = run / relaxation
    total = float(np.sum(run / times[np.isfinite(times) & (times > 0)])) if np.all(times > 0) else ess
    if total < MIN_PREDICTED_ESS:
        chains = times.size
        needed = math.ceil(MIN_PREDICTED_ESS / chains * relaxation / max(num_samples, 1)) \
            if np.isfinite(relaxation) else None
        steps = "" if needed is None else (f" (steps_per_sample={needed:,} gives about {MIN_PREDICTED_ESS} in all)")
        warnings.warn(
            f"{name}: the steps chosen in warmup make the chain forget its state along its slowest "
            f"direction in about {relaxation:,.0f} SG steps (the integrated autocorrelation time of the "
            f"frozen dynamics), and this run takes num_samples × steps_per_sample = {num_samples:,} × "
            f"{steps_per_sample:,} = {run:,} SG steps per chain: expect an effective sample size near "
            f"{ess:.2g} per chain ({total:.2g} in all), so means off by about {1 / np.sqrt(total):.2g} posterior "
            f"sd and sds by about {100 / np.sqrt(2 * total):.0f} % (one standard error). "
            f"{cause + 'Otherwise raise' if cause else 'Raise'} num_samples or steps_per_sample{steps}, or use "
            "ConstantSGD(model, preconditioner='full'), whose draws are one relaxation time apart.",
            UserWarning, stacklevel=find_stack_level(),
        )
    return ess


def warn_hyper_candidates(name, potential, model, model_args, model_kwargs):
    """Warn once when the model has hyperparameter sites (latents whose children are latents
    only, e.g. a group scale): a constant-rate kernel fits the funnel they form poorly, and
    :class:`~numpyro_sgd.SGWithinGibbs` samples them exactly. Skipped for one latent site
    (no site can be another's parent); costs one dependency trace. ``model``: the user's model. The
    driver calls it once per kernel, and not for wrappers."""
    if len(potential.view.names) < 2:
        return
    candidates, form = classify_sites(potential, model_args, model_kwargs)[0], ""
    if not candidates and any(n.endswith("_decentered") for n in potential.view.names):
        # a LocScaleReparam(0) model: its group mean and scale are hyper sites of the centred form
        # (a reparam inside the model cannot be centred: SGWithinGibbs says so when it is built)
        try:
            candidates = hyper_candidates(model, *model_args, **model_kwargs)
        except ValueError:
            candidates = []
        form = " once its LocScaleReparam sites are centred (as SGWithinGibbs samples them)"
    if candidates:
        # SGWithinGibbs refuses a support that depends on a site of the other block: not recommended then
        conflict = None if form else support_conflict(potential, candidates, model_args, model_kwargs)
        advice = (f"Sample them exactly with SGWithinGibbs({name}(model)), or see docs/hierarchical_models.md for "
                  "the other routes." if conflict is None else
                  f"SGWithinGibbs, which samples such sites exactly, refuses this model: {conflict}")
        warnings.warn(
            f"{name}: the sites {candidates} have no observed child in a subsample plate{form} (group-level "
            f"hyperparameters, e.g. a group scale): with the group latents they form a funnel that one frozen "
            f"preconditioner fits poorly. {advice}", UserWarning, stacklevel=find_stack_level())


def warn_full_data_steps(name, potential, model_args, model_kwargs):
    """Warn when every minibatch gradient does O(N) work (the driver calls it once per model arguments)."""
    n, s = potential.num_data, potential.batch_size
    if n < FULL_DATA_CHECK_MIN_N:
        return
    fixed = potential.fixed_step_cost(model_args, model_kwargs)
    if fixed is None or fixed < max(0.1 * n, 10 * s):
        return
    warnings.warn(
        f"{name}: every minibatch gradient does work that does not shrink with S, about "
        f"{fixed:,.0f} data points' worth (N = {n:,}, S = {s:,}), so each SG step costs about "
        f"{fixed / n:.0%} of a full-data pass. The usual cause is a quantity computed from all N rows "
        "outside the plate and indexed inside it (mu = X @ w; ... mu[idx]); compute it from the "
        "minibatch inside the plate instead (X[idx] @ w).",
        UserWarning, stacklevel=find_stack_level(),
    )


def check_data(name, kernel, state, vectorized, arrays, model_args, model_kwargs):
    """Raise if the likelihood reads non-finite data (the driver calls it once per model arguments;
    ``arrays``: the array leaves of the model arguments).

    The array arguments are scanned for NaN/inf (O(data), no copy); only if some are found
    is the log-likelihood of every observed datum evaluated at the initial point (one pass,
    in chunks), so that values the model masks or never reads are allowed.
    """
    inexact = [a for a in arrays if jnp.issubdtype(a.dtype, jnp.inexact)]
    in_jax = [a for a in inexact if isinstance(a, jax.Array)]
    if _jax_arrays_finite(in_jax) and all(all_finite(a) for a in inexact if not isinstance(a, jax.Array)):
        return
    potential = kernel.potential
    z = {k: (v[0] if vectorized else v) for k, v in state.z.items()}
    values = {k: (potential.transforms[k](v) if k in potential.transforms else v)[None] for k, v in z.items()}
    for plate, idx, chunk in log_likelihood_chunks(kernel, values, model_args, model_kwargs, 100_000, batch_ndims=1):
        for site, lp in chunk.items():
            rows = idx[~np.isfinite(np.asarray(lp[0]))]
            if rows.size:
                shown = ", ".join(str(r) for r in rows[:10]) + (", ..." if rows.size > 10 else "")
                raise ValueError(
                    f"{name}: the data are not finite where the likelihood reads them: "
                    f"site '{site}' of plate '{plate}' has a non-finite log-likelihood at {rows.size} "
                    f"row(s) [{shown}] (the model arguments hold NaN or inf). Drop or impute those rows, "
                    "or mask them (numpyro.handlers.mask(mask=...) around the site, finite filler "
                    "values); every minibatch holding one would otherwise be a rejected step."
                )


class InitChecks:
    """The checks :meth:`SGKernel.init <numpyro_sgd.SGKernel.init>` makes before any compute
    (:meth:`before_init`) and on the initial state (:meth:`data`), with what they remember between
    ``init`` calls: whether the hyper-site warning was given, and the model arguments (arrays by
    identity) already checked for full-data steps and for non-finite data."""

    def __init__(self, hyper_warned=False):
        self.hyper_warned = hyper_warned
        self.cost_checked = None
        self.data_checked = None

    def before_init(self, kernel, algorithm, model_args, model_kwargs, wrapped=False):
        """The mesh, the problem's size, the steps per sample against the relaxation time, hyper
        sites a plain kernel should not sample (``wrapped``: a wrapper, which samples them its own
        way, is not warned), and full-data work inside each step."""
        name, potential, options = type(kernel).__name__, kernel.potential, kernel.driver_options
        if options["mesh"] is not None:
            check_mesh(name, options["mesh"], options["mesh_axis"], potential, options["subsample"],
                       options["warmup_subsample"])
        check_problem_size(name, potential)
        warn_short_blocks(name, algorithm, kernel.steps_per_sample)
        if is_tracer((model_args, model_kwargs)):  # under pmap (chain_method="parallel")
            return
        if not self.hyper_warned and not wrapped:
            self.hyper_warned = True
            warn_hyper_candidates(name, potential, kernel.subsampled_model, model_args, model_kwargs)
        key = split_arrays(model_args, model_kwargs)[2]
        if self.cost_checked != key:
            self.cost_checked = key
            warn_full_data_steps(name, potential, model_args, model_kwargs)

    def data(self, kernel, state, vectorized, model_args, model_kwargs):
        """:func:`check_data` once per model arguments (in memory and streamed), and a finite
        potential at the initial point."""
        if is_tracer((state.z, model_args, model_kwargs)):
            return
        arrays, _, key = split_arrays(model_args, model_kwargs)
        if self.data_checked != key:
            check_data(type(kernel).__name__, kernel, state, vectorized,
                       arrays + [r.source for r in streamed_sources((model_args, model_kwargs))], model_args,
                       model_kwargs)
            self.data_checked = key
        if not np.isfinite(np.asarray(state.potential_energy)).all():
            raise ValueError(
                f"{type(kernel).__name__}: the potential is not finite at the initial point; check the model (e.g. "
                "data outside the likelihood's support) or pass another init_strategy / init_params.")
