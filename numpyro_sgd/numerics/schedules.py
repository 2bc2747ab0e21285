"""Schedules: plain ``count -> value`` functions, as optax's (``optax.ScalarOrSchedule``).

Wherever a kernel accepts a rate that may vary (SGLD's ``step_size``, VariationalEM's λ rate,
Santa's annealing), it takes a float or any such callable, an optax schedule included
(``optax.polynomial_schedule``, ``optax.exponential_decay``, ...). The two the papers use and
optax lacks are defined here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

__all__ = ["robbins_monro", "polynomial_annealing", "as_schedule", "check_schedule", "RobbinsMonro",
           "PolynomialAnnealing", "Constant"]

#: SG steps at which :func:`check_schedule` evaluates a schedule (the run's length is not known
#: when a kernel is built; a schedule that reaches ε ≤ 0 within 10⁶ steps is refused)
CHECK_STEPS = (0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)


@dataclass(frozen=True)
class RobbinsMonro:
    """ε_t = ``scale`` (``offset`` + t)^(−``power``) as a picklable value (see :func:`robbins_monro`)."""

    scale: float
    offset: float
    power: float

    def __call__(self, count):
        return self.scale * (self.offset + jnp.asarray(count)) ** (-self.power)


@dataclass(frozen=True)
class PolynomialAnnealing:
    """β_t = ``scale`` · max(t, 1)^``power`` as a picklable value (see :func:`polynomial_annealing`)."""

    power: float
    scale: float

    def __call__(self, t):
        return self.scale * jnp.maximum(jnp.asarray(t, jnp.float32), 1.0) ** self.power


@dataclass(frozen=True)
class Constant:
    """The constant schedule t -> ``value`` (picklable)."""

    value: object

    def __call__(self, count):
        return self.value


def robbins_monro(scale, offset=1.0, power=0.55):
    """Robbins–Monro schedule ε_t = a (b + t)^(−γ) (Welling & Teh Sec. 2; Mandt et al. Eq. 26, 32).

    ``scale`` = a, ``offset`` = b > 0, ``power`` = γ ∈ (0.5, 1] (then Σ ε_t = ∞, Σ ε_t² < ∞;
    γ = 0.5 is allowed for the schedule of Mandt et al. Sec. 6.2, ε₀/√(1000 + t)). The form
    ρ₀ (1 + t/t₀)^(−κ) is ``robbins_monro(ρ₀ t₀^κ, t₀, κ)``. Evaluated in JAX's default float dtype (float64 under
    ``numpyro.enable_x64()``).
    """
    if not scale > 0:
        raise ValueError(f"robbins_monro: scale must be > 0, got {scale}.")
    if not 0 < power <= 1:
        raise ValueError(f"robbins_monro: power must lie in (0, 1], got {power}.")
    if not offset > 0:
        raise ValueError(f"robbins_monro: offset must be > 0, got {offset}.")

    return RobbinsMonro(scale, offset, power)


def polynomial_annealing(power=0.5, scale=1.0):
    """β_t = scale · t^power (t ≥ 1 the SG step count): the "β_t = t^γ" schedule of the Santa
    experiments (Chen et al. 2016); β_t → ∞ for power > 0."""
    if not power > 0:
        raise ValueError(f"polynomial_annealing: power must be > 0 (β_t must grow), got {power}.")
    if not scale > 0:
        raise ValueError(f"polynomial_annealing: scale must be > 0, got {scale}.")
    return PolynomialAnnealing(power, scale)


def as_schedule(value):
    """A float or a schedule as a schedule (``count -> value``)."""
    return value if callable(value) else Constant(value)


def check_schedule(name, argument, schedule, steps=CHECK_STEPS):
    """Refuse a rate schedule that is not finite and > 0 at the SG steps ``steps``, evaluated once
    on the host before any compute: a step size ε_t ≤ 0 freezes the chain (or runs it
    backwards) and a non-finite one makes every step from there on a rejected step.

    :param str name: the kernel, for the message. :param str argument: the argument's name.
    :param schedule: a callable ``count -> value``; a float or None is not a schedule and passes
        (the kernels check those themselves).
    :param steps: the SG steps to evaluate it at (default :data:`~numpyro_sgd.numerics.schedules.CHECK_STEPS`, 0 … 10⁶).
    :raises ValueError: naming the first step whose value is not finite and > 0.
    """
    if not callable(schedule):
        return
    for step in steps:
        value = np.asarray(schedule(jnp.asarray(step)), dtype=float)
        bad = ~(np.isfinite(value) & (value > 0))
        if np.any(bad):
            first = float(value.reshape(-1)[np.argmax(bad.reshape(-1))])
            shown = "inf" if first == math.inf else "-inf" if first == -math.inf else f"{first:.4g}"
            raise ValueError(
                f"{name}: the {argument} schedule gives ε_t = {shown} at SG step {step} (it must stay finite and "
                "> 0: ε_t ≤ 0 freezes the chain, a non-finite ε_t rejects every step from there on). Use a "
                "schedule that stays positive, e.g. robbins_monro(a, b, γ), or optax.exponential_decay(..., "
                "end_value=...) / optax.linear_schedule(..., end_value=...) with end_value > 0.")
