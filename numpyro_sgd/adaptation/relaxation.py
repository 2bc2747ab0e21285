"""The prediction at the end of warmup: the integrated autocorrelation time of the slowest
direction under the steps warmup froze, and the cause when one is known (a direction left
frozen, a friction far below critical damping), which the driver's short-run warning names.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from ..numerics.step_rules import (
    unknown_spectrum,
)
from .adapted import with_adapted

__all__ = ["PredictedRelaxation", "FROZEN_SPREAD", "coordinate_name", "frozen_direction_cause",
           "predicted_relaxation", "LOW_FRICTION", "underdamped_cause", "with_predicted_relaxation"]


# ---------------------------------------------------------------------------- the prediction at the end of warmup
class PredictedRelaxation(NamedTuple):
    """What ``SampleBlock.relaxation`` returns when it can say why the chain is slow: the
    predicted autocorrelation times and a sentence on the cause and its fix, which
    the driver's short-run warning (``checks.warn_short_run``) puts into its text (a bare array of
    times: no such sentence)."""

    #: integrated autocorrelation time of the slowest direction, SG steps, one per chain (or a scalar)
    steps: object
    #: the cause and its fix for the slowest chain (empty: none known beyond a short run)
    cause: str = ""

#: a direction whose curvature (relaxation rate) is more than this many times below the stiffest's
#: (fastest's) is named as frozen by the frozen steps: one step size cannot serve both
FROZEN_SPREAD = 100.0

def coordinate_name(view, index):
    """``'site'`` or ``'site[i, j]'``: the unconstrained coordinate of the flat θ at ``index``
    (``view``: the potential's ravel view, names, shapes and sizes in ravel order)."""
    start = 0
    for site, shape, size in zip(view.names, view.shapes, view.sizes):
        if index < start + size:
            return site if size == 1 else f"{site}[{', '.join(map(str, np.unravel_index(index - start, shape)))}]"
        start += size
    return f"coordinate {index}"

def frozen_direction_cause(spectrum, coordinates, fix, coordinate=None):
    """The sentence of :class:`PredictedRelaxation` for frozen steps whose directions relax at rates
    (curvatures, for a Langevin step) that span more than :data:`FROZEN_SPREAD` (one chain's
    :class:`~numpyro_sgd.numerics.step_rules.Spectrum`, as floats); "" otherwise. ``coordinates`` says where
    ("of the model's coordinates (preconditioner='scalar')"), ``coordinate`` names the one the
    slowest direction lies mostly along (None: not named), and ``fix`` what to use instead."""
    lowest, highest = spectrum.lowest, spectrum.highest
    if not (np.isfinite(lowest) and np.isfinite(highest) and lowest > 0 and highest > FROZEN_SPREAD * lowest):
        return ""
    spread = highest / lowest
    along = "" if coordinate is None else f", mostly along {coordinate},"
    return (f"The frozen steps contract the directions {coordinates} at rates that span a factor {spread:.3g} "
            f"(from the warmup's curvature): the step that keeps the fastest stable leaves the slowest{along} "
            f"nearly frozen, {spread:.3g}× slower. {fix} ")

def predicted_relaxation(steps, spectrum, coordinates, fix, view=None, more=None):
    """``SampleBlock.relaxation``'s answer from per-chain ``steps`` (NumPy): a
    :class:`PredictedRelaxation` whose cause is :func:`frozen_direction_cause` for the slowest
    chain's ``spectrum`` (a :class:`~numpyro_sgd.numerics.step_rules.Spectrum` of per-chain NumPy arrays; none
    when ``fix`` is None: a spread these steps do not cause), naming the coordinate of θ it lies
    along when ``view`` (the potential's ravel view) is given, followed by ``more(chain, lowest)``
    (a kernel's own sentence, or ""). All-NaN ``steps`` (no noise estimate) are returned as they are."""
    flat = np.ravel(steps)
    if np.all(np.isnan(flat)):
        return steps
    chain = int(np.nanargmax(flat))
    one = type(spectrum)(*(np.ravel(x)[chain].item() for x in spectrum))
    named = None if view is None else coordinate_name(view, one.coordinate)
    text = "" if fix is None else frozen_direction_cause(one, coordinates, fix, named)
    return PredictedRelaxation(steps, text + ("" if more is None else more(chain, one.lowest)))


#: where a Langevin kernel's default steps run, by ``coordinates``
_COORDINATES = {"scalar": "of the model's coordinates (coordinates='scalar')"}

#: the fix :func:`~numpyro_sgd.adaptation.relaxation.frozen_direction_cause` names, by ``coordinates`` (in the
#: curvature's coordinates every curvature is N: a diagonal basis leaves only the correlations, which
#: its diagonal estimate does not see)
_FROZEN_FIX = {"scalar": "Use coordinates='auto' (the default: the steps run in the coordinates of the warmup's "
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

def with_predicted_relaxation(algorithm, potential, coordinates, time, cause=None):
    """The algorithm whose ``block.relaxation`` predicts, at the end of warmup, the integrated
    autocorrelation time of its slowest direction: the larger of ``time(kernel_state, a)`` (NumPy,
    on the host) at the smallest and the largest curvature a of ``kernel_state.adapted.spectrum`` (a
    :class:`~numpyro_sgd.numerics.step_rules.Spectrum` that ``init`` adds as unknown and the algorithm's
    ``set_steps`` sets at the end of warmup, in the coordinates the steps run in). In the
    curvature's full basis (:class:`~numpyro_sgd.adaptation.coordinates.CurvatureBasis`: Lᵀ A L = N I) every
    curvature is N, and in a diagonal basis every estimated one (its diagonal estimate sees no
    correlations: the prediction is a lower bound); in the model's coordinates
    (``coordinates="scalar"``) they spread, and a spread beyond
    :data:`~numpyro_sgd.adaptation.relaxation.FROZEN_SPREAD` is named in the warning with the coordinate the
    slowest direction lies along (:func:`~numpyro_sgd.adaptation.relaxation.predicted_relaxation`).
    ``cause(state, chain, lowest, coordinates)`` may add a kernel's own sentence
    (:func:`underdamped_cause`)."""
    where = _COORDINATES.get(coordinates, f"of the warmup's curvature (coordinates={coordinates!r})")
    view = potential.view if coordinates == "scalar" else None  # a full basis mixes θ's coordinates
    init = algorithm.init

    def init_unknown(rng_key, theta, num_warmup_steps):
        return with_adapted(init(rng_key, theta, num_warmup_steps), spectrum=unknown_spectrum(theta.dtype))

    def relaxation(state):
        spectrum = jax.tree.map(np.asarray, state.adapted.spectrum)
        steps = np.fmax(time(state, spectrum.lowest), time(state, spectrum.highest))
        more = None if cause is None else (lambda chain, lowest: cause(state, chain, lowest, where))
        return predicted_relaxation(steps, spectrum, where, _FROZEN_FIX.get(coordinates), view, more)

    block = algorithm.block._replace(relaxation=relaxation)
    return algorithm._replace(init=init_unknown, block=block)
