"""The Langevin steps that SGLD, SGHMC and the EWSG kernels share, their validators and
default-step rules: below the kernels that use them (:mod:`numpyro_sgd.sgld`,
:mod:`numpyro_sgd.sghmc`, :mod:`numpyro_sgd.ewsg`), so that the simple kernels do not depend on
the extension.

* :func:`sgld_step`: the overdamped step (Welling & Teh Eq. 4).
* :func:`overdamped_ewsg_update`: a minibatch (uniform, or chosen by the index chain of EWSG App. E)
  and then :func:`sgld_step`; SGLD runs it with M = 0 index steps.
* :func:`ewsg_update`: a minibatch (uniform, or EWSG Alg. 1, App. D) and then the underdamped
  Euler–Maruyama step (EWSG Eq. 3); SGHMC runs it with M = 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import random

from .diffusions import overdamped_langevin, underdamped_langevin
from .index_chain import X_ESTIMATES, select_minibatch
from .noise import curvature_spectrum, exponential_step_size, sghmc_steps, sgld_step_size, unknown_spectrum
from .theory import exponential_autocorrelation_time, langevin_autocorrelation_time
from .validation import check_positive
from .warmup import predicted_relaxation, with_default_steps

__all__ = ["INTEGRATORS", "check_control_variates", "sgld_step", "overdamped_ewsg_update", "ewsg_update", "underdamped_minibatch", "check_friction",
           "check_step_size", "with_default_overdamped_step", "with_default_underdamped_steps", "with_predicted_relaxation"]


def sgld_step(rng_key, theta, grad, step_size, temperature):
    """SGLD (Welling & Teh Eq. 4): θ ← θ − (ε_t/2) ∇Û_S(θ) + N(0, ε_t T)."""
    return overdamped_langevin(rng_key, theta, grad, step_size, temperature)


def underdamped_minibatch(rng_key, propose, num_index_steps, x_estimate, momentum, drift, step_size, sigma):
    """EWSG Alg. 1's minibatch for an underdamped step: x of Sec. 4.4 from ``drift()`` (γ r_k or Γ_k r_k)
    and n a_B = (√h/σ) ∇Û_B (Eq. 4, App. D)."""
    return select_minibatch(rng_key, propose, num_index_steps,
                            lambda: X_ESTIMATES[x_estimate](momentum, drift(), step_size, sigma),
                            jnp.sqrt(step_size) / sigma)


def ewsg_update(rng_key, theta, momentum, propose, step_size, friction, num_index_steps=1, x_estimate="momentum"):
    """One step of underdamped Langevin with the minibatch of Alg. 1 (App. D), Euler–Maruyama Eq. 3.

    The step of :class:`~numpyro_sgd.EWSG` and, with ``num_index_steps=0``, of :class:`~numpyro_sgd.SGHMC`.

    :param rng_key: key of the step: ``split(rng_key)`` gives the keys of the first minibatch and
        of the Langevin noise; the index chain uses ``fold_in(rng_key, _INDEX_CHAIN_STREAM)``.
    :param theta: θ_k (flat).
    :param momentum: r_k.
    :param propose: ``key -> (Û_B(θ_k), ∇Û_B(θ_k), ...)`` for a uniformly drawn minibatch B (the
        extra entries, e.g. its indices, are carried along).
    :param step_size: h.
    :param friction: γ (scalar).
    :param int num_index_steps: M (static).
    :param str x_estimate: a key of :data:`~numpyro_sgd.index_chain.X_ESTIMATES`.
    :return: ``(θ_{k+1}, r_{k+1}, the accepted minibatch's tuple, accepted index moves)``.
    """
    k_noise = random.split(rng_key)[1]
    sigma = jnp.sqrt(2.0 * friction)
    current, accepted = underdamped_minibatch(rng_key, propose, num_index_steps, x_estimate, momentum,
                                               lambda: friction * momentum, step_size, sigma)   # Sec. 4.4, Eq. 6
    theta, momentum = underdamped_langevin(k_noise, theta, momentum, current[1], step_size, friction)  # Eq. 3
    return theta, momentum, current, accepted


def overdamped_ewsg_update(rng_key, theta, propose, step_size, num_index_steps, temperature):
    """One overdamped Langevin step (Welling & Teh Eq. 4) with the minibatch of App. E, ε = 2h.

    The step of :class:`~numpyro_sgd.OverdampedEWSG` (temperature 1) and, with ``num_index_steps=0``, of
    :class:`~numpyro_sgd.SGLD`. ``propose`` and the keys are as in :func:`ewsg_update`; the
    index chain's weights (x = 0, n a_B = (√ε/2) ∇Û_B) assume temperature 1.

    :return: ``(θ_{k+1}, the accepted minibatch's tuple, accepted index moves)``.
    """
    k_noise = random.split(rng_key)[1]                                     # SGLD's keys
    current, accepted = select_minibatch(rng_key, propose, num_index_steps, lambda: jnp.zeros_like(theta),
                                         0.5 * jnp.sqrt(step_size))
    theta = sgld_step(k_noise, theta, current[1], step_size, temperature)  # Welling & Teh Eq. 4
    return theta, current, accepted


# ---------------------------------------------------------------------------- validation
#: the overdamped kernels' integrators: Welling & Teh's Euler step, or the step exact for the
#: Gaussian part (:func:`~numpyro_sgd.diffusions.exponential_overdamped_langevin`)
INTEGRATORS = ("euler", "exponential")

def check_friction(name, friction):
    """Raise unless γ is a positive scalar (SGHMC and the EWSG kernels)."""
    return check_positive(name, "friction", friction, "a positive float (γ; σ² = 2γ)")


def check_control_variates(name, control_variates, integrator, step_size, preconditioner, integrators=INTEGRATORS):
    """Validate ``control_variates`` and ``integrator`` (None: ``"exponential"`` with control
    variates where ``integrators`` has it, else ``"euler"``); both need the kernel's own step,
    which the end of warmup sets. Returns ``(control_variates, integrator)``."""
    if control_variates not in (True, False):
        raise TypeError(f"{name}: control_variates must be True or False, got {control_variates!r}.")
    if integrator is None:
        exponential = control_variates and preconditioner != "scalar" and "exponential" in integrators
        integrator = "exponential" if exponential else "euler"
    if integrator not in integrators:
        raise ValueError(f"{name}: integrator={integrator!r}; use one of {integrators}.")
    if step_size is not None and (control_variates or integrator == "exponential"):
        raise ValueError(
            f"{name}: control_variates=True and integrator='exponential' set their step at the end of warmup (from "
            "the centre the control variates are taken about, and the noise measured there); leave step_size out.")
    if integrator == "exponential" and preconditioner == "scalar":
        raise ValueError(
            f"{name}: integrator='exponential' is exact for the Gaussian of the warmup's curvature coordinates; "
            "preconditioner='scalar' runs in the model's. Use preconditioner='auto' (the default) or integrator='euler'.")
    return bool(control_variates), integrator


def check_step_size(name, step_size):
    """Raise unless h (or ε) is a positive scalar."""
    return check_positive(name, "step_size", step_size)


# ---------------------------------------------------------------------------- default steps
def with_default_overdamped_step(algorithm, potential, name, step_size, target_inflation, subsample, warmup_options,
                                 preconditioner="auto", control_variates=False, integrator="euler"):
    """SGLD's and overdamped EWSG's algorithm with, when ``step_size`` is None, the noise warmup and
    ε = :func:`~numpyro_sgd.noise.sgld_step_size` set at its end (T = ``state.temperature``, 1 if
    the state has none), in the coordinates ``preconditioner`` names
    (:func:`~numpyro_sgd.warmup.with_default_steps`); the algorithm itself when a step size is given."""
    if step_size is not None:
        return algorithm

    n = float(potential.num_data)

    def set_steps(state, noise, curvature):  # ε = 4τ / λ_max(Q/T + (1 + τ) A)
        if integrator == "exponential":  # the largest ε whose variance error is ≤ τ (curvature N in the basis)
            eps = exponential_step_size(noise, n, state.control.nonlinearity, target_inflation)
        else:
            eps = sgld_step_size(noise, curvature, target_inflation, getattr(state, "temperature", 1.0))
        return state._replace(step_size=eps.astype(state.step_size.dtype), spectrum=curvature_spectrum(curvature))

    algorithm = with_default_steps(algorithm, potential, name, set_steps, warmup_options, subsample, preconditioner,
                                   control_variates)
    if integrator == "exponential":
        return with_predicted_relaxation(algorithm, potential, preconditioner, lambda state, a: (
            exponential_autocorrelation_time(state.step_size, n, np.asarray(state.control.nonlinearity))))
    return with_predicted_relaxation(algorithm, potential, preconditioner,
                                     lambda state, a: langevin_autocorrelation_time(state.step_size, a))


def with_default_underdamped_steps(algorithm, potential, name, step_size, friction, target_inflation, subsample,
                                   warmup_options, preconditioner="auto", control_variates=False):
    """SGHMC's and EWSG's algorithm with, when ``step_size`` or ``friction`` is None, the noise
    warmup and the missing ones set at its end by :func:`~numpyro_sgd.noise.sghmc_steps`
    (γ = 2 √λ_max(A), h = 2τγ / λ_max(Q + 2A)), in the coordinates ``preconditioner`` names; the
    algorithm itself when both are given.

    A given friction γ alone keeps those coordinates (h is then the rule's at that γ, as without
    it): γ is a rate per unit of Langevin time, and in the curvature's coordinates every direction
    has the frequency √N, so critical damping there is 2√N whatever the model's units. A given h
    alone is a step in the model's coordinates (``preconditioner="scalar"``)."""
    if step_size is not None and friction is not None:
        return algorithm

    def set_steps(state, noise, curvature):
        h, gamma = sghmc_steps(noise, curvature, target_inflation, friction)
        h = h if step_size is None else state.step_size
        dtype = state.step_size.dtype
        return state._replace(step_size=h.astype(dtype), friction=gamma.astype(dtype),
                              spectrum=curvature_spectrum(curvature))

    if step_size is not None:
        preconditioner = "scalar"
    algorithm = with_default_steps(algorithm, potential, name, set_steps, warmup_options, subsample, preconditioner,
                                   control_variates)

    def time(state, a):  # the slower of θ's and θ²'s: an underdamped direction forgets its spread last
        return np.fmax(langevin_autocorrelation_time(state.step_size, a, state.friction),
                       langevin_autocorrelation_time(state.step_size, a, state.friction, of="square"))

    return with_predicted_relaxation(algorithm, potential, preconditioner, time, underdamped_cause)


#: where a Langevin kernel's default steps run, by ``preconditioner``
_COORDINATES = {"scalar": "of the model's coordinates (preconditioner='scalar')"}
#: the fix :func:`~numpyro_sgd.warmup.frozen_direction_cause` names, by ``preconditioner`` (in the
#: curvature's coordinates every curvature is N: a diagonal basis leaves only the correlations, which
#: its diagonal estimate does not see)
_FROZEN_FIX = {"scalar": "Use preconditioner='auto' (the default: the steps run in the coordinates of the warmup's "
                         "curvature, where every direction relaxes alike), or rescale the model's variables (e.g. "
                         "standardise the predictors) to comparable posterior sds."}
#: a given friction below this fraction of the least curved direction's critical damping is named
#: as the cause of a slow chain (its spread then forgets itself at the rate γ only)
LOW_FRICTION = 0.1


def underdamped_cause(state, chain, lowest, coordinates):
    """The sentence on a friction far below critical damping for SGHMC's and EWSG's prediction
    (``state``: the kernel state, ``chain`` the slowest chain's index, ``lowest`` its
    smallest curvature): "" unless γ < :data:`LOW_FRICTION` · 2√λ_min."""
    gamma, h = (float(np.ravel(x)[chain]) for x in (state.friction, state.step_size))
    critical = 2.0 * np.sqrt(lowest) if lowest > 0 else np.nan
    if not gamma < LOW_FRICTION * critical:
        return ""
    return (f"The friction γ = {gamma:.3g} is {critical / gamma:.3g}× below the critical damping 2√λ = {critical:.3g} "
            f"of the least curved direction {coordinates}, where it is measured: the chain oscillates, and its "
            f"spread forgets itself only at the rate γ, in about 1/(γh) = {1.0 / (gamma * h):,.0f} SG steps. "
            "Leave friction to the kernel (critical damping of the stiffest direction) or raise it. ")


def with_predicted_relaxation(algorithm, potential, preconditioner, time, cause=None):
    """The algorithm whose ``block.relaxation`` predicts, at the end of warmup, the integrated
    autocorrelation time of its slowest direction: the larger of ``time(kernel_state, a)`` (NumPy,
    on the host) at the smallest and the largest curvature a of ``kernel_state.spectrum`` (a
    :class:`~numpyro_sgd.noise.Spectrum` that ``init`` adds as unknown and the algorithm's
    ``set_steps`` sets at the end of warmup, in the coordinates the steps run in). In the
    curvature's full basis (:class:`~numpyro_sgd.basis.CurvatureBasis`: Lᵀ A L = N I) every
    curvature is N, and in a diagonal basis every estimated one (its diagonal estimate sees no
    correlations: the prediction is a lower bound); in the model's coordinates
    (``preconditioner="scalar"``) they spread, and a spread beyond
    :data:`~numpyro_sgd.warmup.FROZEN_SPREAD` is named in the warning with the coordinate the
    slowest direction lies along (:func:`~numpyro_sgd.warmup.predicted_relaxation`).
    ``cause(state, chain, lowest, coordinates)`` may add a kernel's own sentence
    (:func:`underdamped_cause`)."""
    coordinates = _COORDINATES.get(preconditioner, f"of the warmup's curvature (preconditioner={preconditioner!r})")
    view = potential.view if preconditioner == "scalar" else None  # a full basis mixes θ's coordinates
    init = algorithm.init

    def init_unknown(rng_key, theta, num_warmup_steps):
        return init(rng_key, theta, num_warmup_steps)._replace(spectrum=unknown_spectrum(theta.dtype))

    def relaxation(state):
        spectrum = jax.tree.map(np.asarray, state.spectrum)
        steps = np.fmax(time(state, spectrum.lowest), time(state, spectrum.highest))
        more = None if cause is None else (lambda chain, lowest: cause(state, chain, lowest, coordinates))
        return predicted_relaxation(steps, spectrum, coordinates, _FROZEN_FIX.get(preconditioner), view, more)

    block = algorithm.block._replace(relaxation=relaxation)
    return algorithm._replace(init=init_unknown, block=block)
