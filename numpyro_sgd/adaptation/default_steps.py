"""The default steps of the Langevin kernels (SGLD, pSGLD, SGHMC, EWSG, OverdampedEWSG, Santa):
the noise warmup in place of burn-in, and at its end the step size (and friction) from the
noise and curvature it measured, in the coordinates that ``coordinates`` names; with control
variates, the centre, its Hessian and the control-variate noise instead.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..minibatch.law import law_of
from ..numerics.noise import fisher_curvature, sampling_noise
from ..numerics.preconditioners import psd_part, resolve_preconditioner
from ..numerics.step_rules import (
    curvature_spectrum,
    exponential_step_size,
    sghmc_steps,
    sgld_step_size,
)
from ..numerics.theory import exponential_autocorrelation_time, langevin_autocorrelation_time
from ..validation import check_choice
from .adapted import with_adapted
from .control_variates import centre_and_noise, check_single_plate, unset_control, with_control_variates
from .coordinates import curvature_basis, identity_basis, step_in_basis
from .noise_warmup import noise_warmup, warmup_step_of
from .relaxation import underdamped_cause, with_predicted_relaxation

__all__ = ["COORDINATES", "check_coordinates", "with_default_steps",
           "with_default_overdamped_step", "with_default_underdamped_steps"]


#: the ``coordinates`` values of the Langevin kernels (SGLD, pSGLD, SGHMC, EWSG, OverdampedEWSG,
#: Santa): their default steps run in the coordinates of the warmup's curvature (``"auto"``,
#: ``"full"``, ``"diag"``) or in the model's own (``"scalar"``, the papers' kernels)
COORDINATES = ("auto", "full", "diag", "scalar")

def check_coordinates(name, coordinates, steps_given):
    """Validate a Langevin kernel's ``coordinates``; return it, ``"scalar"`` when the user gave
    the step size (a step in the model's coordinates: there is then no noise warmup whose curvature
    could precondition it, or, with SGHMC's and EWSG's friction left to the kernel, that warmup
    estimates the friction in the model's coordinates). A friction given alone keeps the
    curvature's coordinates (:class:`~numpyro_sgd.SGHMC`)."""
    check_choice(name, "coordinates", coordinates, COORDINATES)
    if steps_given:
        if coordinates in ("full", "diag"):
            raise ValueError(
                f"{name}: coordinates={coordinates!r} comes from the curvature the noise warmup estimates, "
                "and a given step size skips that warmup. Leave the step size (and friction) to the kernel, or "
                "use coordinates='scalar'."
            )
        return "scalar"
    return coordinates

def with_default_steps(algorithm, potential, name, set_steps, warmup_options, subsample="with_replacement",
                       coordinates="auto", control_variates=False):
    """The algorithm with its warmup replaced by the noise warmup (:func:`~numpyro_sgd.adaptation.noise_warmup.noise_warmup`) and an
    ``end_warmup`` that sets its step size (and friction) from the estimate.

    The algorithm's state must have a ``warmup`` field (empty for a user step size), and its
    sampling step must read its step sizes from the state.

    :param algorithm: the :class:`~numpyro_sgd.SGAlgorithm` built with placeholder (NaN) steps.
    :param set_steps: ``(state, noise, curvature) -> state``: the state with the steps set from
        the sampling-phase minibatch noise f Q (:func:`~numpyro_sgd.numerics.noise.sampling_noise`) and the
        curvature A_U ≈ Σ_p (S_p/N_p) Q_p + Λ⁺ (Fisher plus the positive part of the prior's
        Hessian, :func:`~numpyro_sgd.numerics.noise.fisher_curvature`), both (D,) or (D, D). When the
        noise window averaged nothing (too short a warmup; :func:`~numpyro_sgd.adaptation.noise_warmup.noise_warmup` warns) both are
        NaN, so the steps are NaN: every SG step is then rejected and counted as a divergence,
        never sampled.
    :param dict warmup_options: from :func:`~numpyro_sgd.adaptation.noise_warmup.pop_warmup_options`.
    :param str subsample: how the sampling phase draws minibatches (the kernel's ``subsample``).
    :param str coordinates: ``"auto"``, ``"full"`` or ``"diag"``: the sampling step runs in the
        coordinates of the estimated curvature (:class:`~numpyro_sgd.adaptation.coordinates.CurvatureBasis`, kept in the state's
        ``basis`` field), and ``set_steps`` receives Q and A in those coordinates (A ≈ I);
        ``"scalar"``: in the model's coordinates, as the papers' kernels (``basis`` stays empty).

    Q is estimated in full up to D = :data:`~numpyro_sgd.numerics.preconditioners.AUTO_FULL_MAX_DIM`, above only its
    diagonal (as ``preconditioner="auto"`` of the noise-adapting kernels); a ``"full"`` basis
    estimates it in full at any D.

    With ``control_variates=True`` (:mod:`numpyro_sgd.adaptation.control_variates`) the end of warmup takes
    Newton steps from the warmup's last point to the centre θ̂ (one streamed data pass each, and
    one for ∇U(θ̂)), the curvature is the Hessian estimated at θ̂ (its positive part, on a fixed
    set of rows) instead of the Fisher, the coordinates are those of that Hessian, the noise
    ``set_steps`` receives is the control-variate gradient's, measured a posterior sd from θ̂
    (:func:`~numpyro_sgd.adaptation.control_variates.control_variate_noise`, with how far ∇U is from linear
    there in ``state.adapted.control.nonlinearity``), and every sampling step's gradient is the
    control-variate estimate (:class:`~numpyro_sgd.adaptation.control_variates.ControlVariateOracle`). The
    state needs a ``control`` field.
    """
    kind = resolve_preconditioner(coordinates, potential.dim)
    full = kind == "full" or (kind != "diag" and resolve_preconditioner("auto", potential.dim) == "full")
    in_basis = kind != "scalar"
    law = law_of(subsample)
    warmup = noise_warmup(potential, full, name, **warmup_options)

    if control_variates:
        check_single_plate(name, potential)

    def init(rng_key, theta, num_warmup_steps):
        state = with_adapted(algorithm.init(rng_key, theta, num_warmup_steps), warmup=warmup.init(theta, num_warmup_steps))
        if control_variates:
            state = with_adapted(state, control=unset_control(theta))
        return with_adapted(state, basis=identity_basis(theta, kind == "full")) if in_basis else state

    warmup_step = warmup_step_of(warmup, get=lambda s: s.adapted.warmup,
                                 put=lambda s, ws: with_adapted(s, warmup=ws))

    def end_warmup(theta, state, oracle):
        summary = warmup.final(state.adapted.warmup, theta, oracle)
        summary = summary._replace(prior_curvature=psd_part(summary.prior_curvature))
        estimated = state.adapted.warmup.noise_state.count > 0
        noise = jnp.where(estimated, sampling_noise(summary, potential.plates, law.noise_factor), jnp.nan)
        curvature = jnp.where(estimated, fisher_curvature(summary, potential.plates), jnp.nan)
        if control_variates:
            state, noise, curvature = centre_and_noise(theta, state, oracle, full, law)
        if in_basis:
            basis = curvature_basis(curvature, kind == "full", potential.num_data)
            state = with_adapted(state, basis=basis)
            noise, curvature = basis.express(noise), basis.express(curvature)
        return set_steps(state, noise, curvature)

    sample_step = step_in_basis(algorithm.sample_step) if in_basis else algorithm.sample_step
    changes = dict(init=init, warmup_step=warmup_step, end_warmup=end_warmup)
    adapted = algorithm._replace(sample_step=sample_step, **changes)  # init above reads the given algorithm's
    return with_control_variates(adapted) if control_variates else adapted

# ---------------------------------------------------------------------------- default steps
def with_default_overdamped_step(algorithm, potential, name, step_size, target_inflation, subsample, warmup_options,
                                 coordinates="auto", control_variates=False, integrator="euler"):
    """SGLD's and overdamped EWSG's algorithm with, when ``step_size`` is None, the noise warmup and
    ε = :func:`~numpyro_sgd.numerics.step_rules.sgld_step_size` set at its end (T = ``state.temperature``, 1 if
    the state has none), in the coordinates that ``coordinates`` names
    (:func:`~numpyro_sgd.adaptation.default_steps.with_default_steps`); the algorithm itself when a step size is given."""
    if step_size is not None:
        return algorithm

    n = float(potential.num_data)

    def set_steps(state, noise, curvature):  # ε = 4τ / λ_max(Q/T + (1 + τ) A)
        if integrator == "exponential":  # the largest ε whose variance error is ≤ τ (curvature N in the basis)
            eps = exponential_step_size(noise, n, state.adapted.control.nonlinearity, target_inflation)
        else:
            eps = sgld_step_size(noise, curvature, target_inflation, getattr(state, "temperature", 1.0))
        return with_adapted(state._replace(step_size=eps.astype(state.step_size.dtype)),
                            spectrum=curvature_spectrum(curvature))

    algorithm = with_default_steps(algorithm, potential, name, set_steps, warmup_options, subsample, coordinates,
                                   control_variates)
    if integrator == "exponential":
        return with_predicted_relaxation(algorithm, potential, coordinates, lambda state, a: (
            exponential_autocorrelation_time(state.step_size, n, np.asarray(state.adapted.control.nonlinearity))))
    return with_predicted_relaxation(algorithm, potential, coordinates,
                                     lambda state, a: langevin_autocorrelation_time(state.step_size, a))

def with_default_underdamped_steps(algorithm, potential, name, step_size, friction, target_inflation, subsample,
                                   warmup_options, coordinates="auto", control_variates=False):
    """SGHMC's and EWSG's algorithm with, when ``step_size`` or ``friction`` is None, the noise
    warmup and the missing ones set at its end by :func:`~numpyro_sgd.numerics.step_rules.sghmc_steps`
    (γ = 2 √λ_max(A), h = 2τγ / λ_max(Q + 2A)), in the coordinates that ``coordinates`` names; the
    algorithm itself when both are given.

    A given friction γ alone keeps those coordinates (h is then the rule's at that γ, as without
    it): γ is a rate per unit of Langevin time, and in the curvature's coordinates every direction
    has the frequency √N, so critical damping there is 2√N whatever the model's units. A given h
    alone is a step in the model's coordinates (``coordinates="scalar"``)."""
    if step_size is not None and friction is not None:
        return algorithm

    def set_steps(state, noise, curvature):
        h, gamma = sghmc_steps(noise, curvature, target_inflation, friction)
        h = h if step_size is None else state.step_size
        dtype = state.step_size.dtype
        return with_adapted(state._replace(step_size=h.astype(dtype), friction=gamma.astype(dtype)),
                            spectrum=curvature_spectrum(curvature))

    if step_size is not None:
        coordinates = "scalar"
    algorithm = with_default_steps(algorithm, potential, name, set_steps, warmup_options, subsample, coordinates,
                                   control_variates)

    def time(state, a):  # the slower of θ's and θ²'s: an underdamped direction forgets its spread last
        return np.fmax(langevin_autocorrelation_time(state.step_size, a, state.friction),
                       langevin_autocorrelation_time(state.step_size, a, state.friction, of="square"))

    return with_predicted_relaxation(algorithm, potential, coordinates, time, underdamped_cause)
