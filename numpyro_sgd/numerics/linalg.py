"""Dense linear algebra that never runs batched: Cholesky, triangular and Cholesky solves, the
symmetric eigendecomposition and the inverse, each of which, under
``jax.vmap`` (the vectorized chains), runs one matrix after another (a sequential ``lax.map``)
instead of as one batched LAPACK call.

Why: on the CPU, jaxlib's batched LAPACK kernels (``syevd``, ``potrf``, ``trsm``, ``getrf``, …)
split a batch whose work exceeds about 2·10⁵ flops (a 55 × 55 eigendecomposition under two
chains) into tasks on XLA's intra-op thread pool and block the calling thread until they finish.
When XLA runs two such calls at once on pool threads (independent operations of one program),
every pool thread can be waiting for tasks queued behind it: the program never finishes (seen
with jaxlib 0.10.2 on 2 cores, ``SGHMC(model, control_variates=True)`` at D = 55, 2 vectorized
chains; ``--xla_cpu_multi_thread_eigen=false`` does not help). One matrix per call stays on the
calling thread, so no call waits on the pool. The sequential map costs nothing measurable at
the sizes these run at (once per warmup refresh or at the end of warmup).

The functions are not differentiable (``custom_vmap``); none of the package's uses needs it. A
user's model is not changed: a model that factors a large matrix itself (an LKJ prior over more
than ~60 dimensions) with vectorized chains is the remaining case (``docs/robustness.md``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import lax
from jax.custom_batching import custom_vmap

__all__ = ["cholesky", "cho_solve", "solve_triangular", "eigh", "eigvalsh", "inv"]


def _one_at_a_time(fn):
    """``fn`` (positional array arguments) whose batching rule maps it over the batch sequentially."""
    wrapped = custom_vmap(fn)

    @wrapped.def_vmap
    def rule(axis_size, in_batched, *args):
        args = tuple(a if batched else jnp.broadcast_to(a, (axis_size, *jnp.shape(a)))
                     for a, batched in zip(args, in_batched))
        out = lax.map(lambda xs: wrapped(*xs), args)
        return out, jax.tree.map(lambda _: True, out)

    return wrapped


def cholesky(matrix, symmetrize=True):
    """Lower Cholesky factor of a symmetric positive definite (D, D) matrix (NaN where it is not).
    ``symmetrize=False`` reads the lower triangle only (LAPACK's), without first averaging the
    matrix with its transpose: for a matrix symmetric by construction, whose averaging XLA fuses
    with the transposes that built it (45 ms at D = 1000 on a CPU, against 13 ms for the factor)."""
    return (_cholesky if symmetrize else _cholesky_lower)(matrix)


@_one_at_a_time
def _cholesky(matrix):
    return jnp.linalg.cholesky(matrix)


@_one_at_a_time
def _cholesky_lower(matrix):
    return jnp.linalg.cholesky(matrix, symmetrize_input=False)


@_one_at_a_time
def _cho_solve(factor, rhs):
    return jsl.cho_solve((factor, True), rhs)


def cho_solve(factor, rhs):
    """A⁻¹ b from A's lower Cholesky factor; ``rhs`` (D,) or (D, K)."""
    return _cho_solve(factor, rhs)


@_one_at_a_time
def _solve_lower(matrix, rhs):
    return jsl.solve_triangular(matrix, rhs, lower=True)


@_one_at_a_time
def _solve_upper(matrix, rhs):
    return jsl.solve_triangular(matrix, rhs, lower=False)


def solve_triangular(matrix, rhs, lower):
    """T⁻¹ b for a triangular (D, D) T; ``rhs`` (D,) or (D, K)."""
    return (_solve_lower if lower else _solve_upper)(matrix, rhs)


@_one_at_a_time
def eigh(matrix):
    """``(values, vectors)`` of a symmetric (D, D) matrix, values ascending."""
    return tuple(jnp.linalg.eigh(matrix))


@_one_at_a_time
def eigvalsh(matrix):
    """The eigenvalues of a symmetric (D, D) matrix, ascending."""
    return jnp.linalg.eigvalsh(matrix)


@_one_at_a_time
def inv(matrix):
    """The inverse of a square (D, D) matrix (LU)."""
    return jnp.linalg.inv(matrix)
