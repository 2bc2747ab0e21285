"""The coordinates the default steps run in: the warmup's curvature basis θ = θ̂ + L φ with
Lᵀ A L = N I (:class:`CurvatureBasis`), and an oracle and a step expressed in it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from ..numerics.linalg import solve_triangular
from ..numerics.preconditioners import apply_preconditioner, regularized_cholesky

__all__ = ["CurvatureBasis", "identity_basis", "curvature_basis", "OracleInBasis", "step_in_basis"]


class CurvatureBasis(NamedTuple):
    """Coordinates φ with θ = L φ and L Lᵀ = N A⁻¹, A the curvature of U the noise warmup
    estimated: in them the curvature per datum, A/N, is about I, so one step size suits every
    direction.

    A Langevin step run in φ is the step preconditioned by the constant M = L Lᵀ = N A⁻¹ in θ
    (θ ← θ − (ε/2) M ∇U + N(0, ε M) for SGLD): a linear change of variables, so the dynamics stay
    exact in the small-step limit (their stationary law is still the posterior), while the slowest
    direction relaxes in about as many steps as the fastest instead of λ_max/λ_min times more.
    The factor N gives φ the per-datum scale the papers' defaults assume (Santa's RMSprop damping
    and thermostat are not scale-free); the step rules of SGLD and SGHMC do not depend on it.
    """

    #: L, (D, D) or a (D,) diagonal: θ = L φ
    scale: jnp.ndarray
    #: L⁻¹, same shape: φ = L⁻¹ θ
    inverse: jnp.ndarray

    def express(self, matrix):
        """Lᵀ M L: a curvature or noise covariance M of θ, (D, D) or (D,) diagonal, in φ (a (D,)
        diagonal stays diagonal with a diagonal L)."""
        scale = self.scale
        if scale.ndim == 1:
            return matrix * (scale**2 if matrix.ndim == 1 else jnp.outer(scale, scale))
        full = matrix if matrix.ndim == 2 else jnp.diag(matrix)
        return scale.T @ full @ scale


def identity_basis(theta, full):
    """The basis before warmup has estimated A (and for ``preconditioner="scalar"``)."""
    one = jnp.eye(theta.shape[0], dtype=theta.dtype) if full else jnp.ones_like(theta)
    return CurvatureBasis(one, one)


def curvature_basis(curvature, full, num_data):
    """The :class:`CurvatureBasis` of A (``full``: A/N = C Cᵀ and L = C⁻ᵀ; else the diagonal,
    L = diag(a/N)^{−½}). Where A is not positive definite (a direction neither the data nor the
    prior constrains) or not finite, the identity basis (the unpreconditioned kernel)."""
    curvature = curvature / float(num_data)
    if full:
        matrix = curvature if curvature.ndim == 2 else jnp.diag(curvature)
        chol = regularized_cholesky(matrix)
        eye = jnp.eye(matrix.shape[0], dtype=matrix.dtype)
        basis = CurvatureBasis(solve_triangular(chol, eye, lower=True).T, chol.T)
    else:
        root = jnp.sqrt(jnp.diagonal(curvature) if curvature.ndim == 2 else curvature)
        basis = CurvatureBasis(1.0 / root, root)
    ok = jnp.all(jnp.isfinite(basis.scale)) & jnp.all(jnp.isfinite(basis.inverse))
    identity = identity_basis(jnp.zeros(curvature.shape[0], curvature.dtype), full)
    return CurvatureBasis(*(jnp.where(ok, b, i) for b, i in zip(basis, identity)))


class OracleInBasis:
    """The oracle of the coordinates φ (θ = L φ): ``grad(rng_key, φ)`` is (Û_S, Lᵀ ∇Û_S(L φ),
    indices). Only what the Langevin steps call is offered, so a step that needs more fails loudly
    instead of mixing coordinates."""

    def __init__(self, oracle, basis, at=None):
        # at = (φ, θ): the step's starting point in both coordinates, so that a gradient there (the
        # first of most steps) does not map φ back to θ again
        self._oracle, self._basis, self._at = oracle, basis, at

    @property
    def batch_size(self):
        return self._oracle.batch_size

    def grad(self, rng_key, phi):
        known = self._at is not None and phi is self._at[0]
        theta = self._at[1] if known else apply_preconditioner(self._basis.scale, phi)
        pe, grad, indices = self._oracle.grad(rng_key, theta)
        scale = self._basis.scale
        return pe, (scale.T @ grad if scale.ndim == 2 else scale * grad), indices


def step_in_basis(step):
    """``step`` run in the coordinates of ``state.adapted.basis``: φ = L⁻¹ θ, one step of φ with the
    oracle of φ, θ = L φ (the momenta and other state of the step stay in φ)."""

    def wrapped(rng_key, i, theta, state, oracle):
        basis = state.adapted.basis
        phi = apply_preconditioner(basis.inverse, theta)
        phi, state, info = step(rng_key, i, phi, state, OracleInBasis(oracle, basis, at=(phi, theta)))
        return apply_preconditioner(basis.scale, phi), state, info

    return wrapped
