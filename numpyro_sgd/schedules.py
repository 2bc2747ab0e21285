"""Schedules: plain ``count -> value`` functions, as optax's (``optax.ScalarOrSchedule``).

Wherever a kernel accepts a rate that may vary (SGLD's ``step_size``, VariationalEM's λ rate,
Santa's annealing), it takes a float or any such callable, an optax schedule included
(``optax.polynomial_schedule``, ``optax.exponential_decay``, ...). The two the papers use and
optax lacks are defined here.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["robbins_monro", "polynomial_annealing", "as_schedule"]


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

    def schedule(count):
        return scale * (offset + jnp.asarray(count)) ** (-power)

    return schedule


def polynomial_annealing(power=0.5, scale=1.0):
    """β_t = scale · t^power (t ≥ 1 the SG step count): the "β_t = t^γ" schedule of the Santa
    experiments (Chen et al. 2016); β_t → ∞ for power > 0."""
    if not power > 0:
        raise ValueError(f"polynomial_annealing: power must be > 0 (β_t must grow), got {power}.")
    if not scale > 0:
        raise ValueError(f"polynomial_annealing: scale must be > 0, got {scale}.")
    return lambda t: scale * jnp.maximum(jnp.asarray(t, jnp.float32), 1.0) ** power


def as_schedule(value):
    """A float or a schedule as a schedule (``count -> value``)."""
    return value if callable(value) else (lambda count: value)
