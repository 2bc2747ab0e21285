"""What the Langevin kernels' default steps adapt in warmup, held as one sub-state of their
kernel states (``kernel_state.adapted``): the noise warmup's state, the coordinates the steps run
in, the curvature they see and the control variates' centre.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["AdaptedSteps", "with_adapted"]


class AdaptedSteps(NamedTuple):
    """The ``adapted`` field of SGLD's, pSGLD's, SGHMC's, EWSG's, OverdampedEWSG's and Santa's
    kernel states; each part is ``()`` where the kernel does not use it (given steps,
    ``coordinates="scalar"``, no control variates)."""

    #: the noise warmup's state (:class:`~numpyro_sgd.adaptation.noise_warmup.WarmupState`) while it
    #: runs with default steps
    warmup: tuple = ()
    #: the coordinates the default steps run in
    #: (:class:`~numpyro_sgd.adaptation.coordinates.CurvatureBasis`, set at the end of warmup)
    basis: tuple = ()
    #: the extremes of the curvature in those coordinates at the chosen steps
    #: (:class:`~numpyro_sgd.numerics.step_rules.Spectrum`): the predicted autocorrelation time
    spectrum: tuple = ()
    #: the centre of the control variates (:class:`~numpyro_sgd.adaptation.control_variates.ControlState`)
    control: tuple = ()


def with_adapted(state, **parts):
    """``state`` (a kernel state with an ``adapted`` field) with those parts of it replaced."""
    return state._replace(adapted=state.adapted._replace(**parts))
