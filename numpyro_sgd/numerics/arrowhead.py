"""Block-arrowhead symmetric matrices: the Hessian of a random-effects model.

With θ = (β, a_1, …, a_G), β the D_g global coordinates and a_g the d_l coordinates of group g,
and every row of the data reading β and one group's a_g, the Hessian of the potential is::

    H = [[A,    B_1ᵀ … B_Gᵀ],          A   (D_g × D_g)   the global block
         [B_1,  C_1        ],          B_g (d_l × D_g)   group g × global
         [ ⋮         ⋱     ],          C_g (d_l × d_l)   group g
         [B_G,          C_G]]

(zero between two groups). It is stored in that form, O(D_g² + G d_l D_g + G d_l²), never as a
dense (D_g + G d_l)² matrix, and factored with the Schur complement on the global block
(Golub & Van Loan, *Matrix Computations*, 4th ed., Sec. 4.2.9 and 4.5.2)::

    L_g = chol(C_g),   W_g = L_g⁻¹ B_g,   S = A − Σ_g W_gᵀ W_g,   L_S = chol(S),

so that H = L Lᵀ with L = [[blockdiag(L_g), 0], [Wᵀ, L_S]] (groups first). Solves and draws of
N(0, H⁻¹) = L⁻ᵀ ξ cost O(G d_l D_g + D_g²); the factor O(G d_l² D_g + D_g³).

:func:`from_probes` reads the whole of H from D_g + d_l Hessian-vector products (the compressed
Hessian of Curtis, Powell & Reid 1974, for this sparsity): e_j for each global coordinate gives
the global block's column j and every B_g's column j; the probe with ones on every group's k-th
coordinate gives every C_g's column k, since no two groups share a row.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .linalg import cholesky, eigh, solve_triangular

__all__ = ["GroupLayout", "Arrowhead", "ArrowheadFactor", "probes", "from_probes", "factor", "SMALL_GLOBAL"]

#: the largest global block D_g that :func:`factor` repairs by eigendecomposition and whose Schur
#: complement's Gram is unrolled; beyond it (a regression's coefficients read whole, D_g in the
#: hundreds or thousands) an O(D_g³) eigendecomposition at every step would cost more than the
#: step's rows (1.4 s at D_g = 1000 on 2 CPU cores, against 15 ms for a Cholesky factor)
SMALL_GLOBAL = 64
#: the fewest group columns M of W for which :func:`_gram` unrolls its row products: below it the
#: matrix product is as fast (0.80 against 0.69 ms for D_g = 11, M = 10⁴, 2 chains) and compiles in
#: 0.03 s against 0.5 s for each unrolled copy; at M = 10⁵ the products take 5.8 ms to its 10.2
UNROLLED_GRAM_COLUMNS = 32_768


class GroupLayout(NamedTuple):
    """Where the global and the group coordinates sit in the flat θ (NumPy, static)."""

    #: (D_g,) indices of the global coordinates
    global_index: np.ndarray
    #: (G, d_l) indices of group g's d_l coordinates
    local_index: np.ndarray

    @property
    def num_groups(self):
        return int(self.local_index.shape[0])

    @property
    def dim(self):
        return int(self.global_index.shape[0] + self.local_index.size)

    def _runs(self):
        """θ as consecutive runs ``(start, stop, kind, columns)``: ``kind`` "global" (columns of
        the global vector) or "local" (a (G, k) block of group columns, row-major by group), so
        that :meth:`split` and :meth:`join` are slices and reshapes, not gathers and scatters
        (a scatter over 10⁵ groups costs milliseconds on a CPU); None when θ is not laid out so
        (the layouts of :func:`~numpyro_sgd.model.groups.group_layout` always are)."""
        owner = np.full(self.dim, -1, np.int64)
        owner[self.global_index] = np.arange(self.global_index.shape[0])
        runs, start = [], 0
        while start < self.dim:
            if owner[start] >= 0:
                stop = start
                while stop < self.dim and owner[stop] >= 0 and owner[stop] - owner[start] == stop - start:
                    stop += 1
                runs.append((start, stop, "global", (int(owner[start]), int(owner[stop - 1]) + 1)))
            else:
                g, k = np.unravel_index(np.flatnonzero(self.local_index.reshape(-1) == start)[0], self.local_index.shape)
                width = 1
                g_count = self.num_groups
                while k + width < self.local_index.shape[1] and self.local_index[0, k + width] == self.local_index[0, k] + width:
                    width += 1
                block = self.local_index[:, k:k + width]
                if g != 0 or not np.array_equal(block.reshape(-1), np.arange(start, start + g_count * width)):
                    return None  # not laid out in blocks: split and join gather and scatter
                stop = start + g_count * width
                runs.append((start, stop, "local", (int(k), int(k + width))))
            start = stop
        return tuple(runs)

    def split(self, v):
        """(v's global part (D_g,), its group part (G, d_l)) of a flat v."""
        runs = self._runs()
        if runs is None:
            return v[self.global_index], v[self.local_index]
        glob = [(cols, v[a:b]) for a, b, kind, cols in runs if kind == "global"]
        local = [(cols, v[a:b].reshape(self.num_groups, cols[1] - cols[0])) for a, b, kind, cols in runs
                 if kind == "local"]
        glob = [x for _, x in sorted(glob, key=lambda t: t[0])]
        local = [x for _, x in sorted(local, key=lambda t: t[0])]
        empty = jnp.zeros((0,), v.dtype)
        return ((jnp.concatenate(glob) if glob else empty),
                jnp.concatenate(local, axis=1) if local else jnp.zeros(self.local_index.shape, v.dtype))

    def join(self, glob, local):
        """The flat vector whose :meth:`split` is (``glob``, ``local``)."""
        runs = self._runs()
        if runs is None:
            return jnp.zeros(self.dim, glob.dtype).at[self.global_index].set(glob).at[self.local_index].set(local)
        parts = [glob[cols[0]:cols[1]] if kind == "global" else local[:, cols[0]:cols[1]].reshape(-1)
                 for _, _, kind, cols in runs]
        return jnp.concatenate(parts)


class Arrowhead(NamedTuple):
    """A symmetric block-arrowhead matrix (see the module docstring), stored probe-major: the
    group axis G next to last, so that every operation runs over contiguous (G,) vectors and the
    cross products are dense (D_g × G d_l) matrix products (on a CPU a group-major (G, d_l, D_g)
    layout took 3× longer to factor at G = 10⁵)."""

    #: A (D_g, D_g)
    glob: jnp.ndarray
    #: B (D_g, G, d_l): B[j, g, k] = H[(g, k), j]
    cross: jnp.ndarray
    #: C (d_l, G, d_l): C[k, g, k'] = H[(g, k'), (g, k)]
    local: jnp.ndarray

    @classmethod
    def symmetrised(cls, glob, cross, local):
        """The arrowhead with A and every C_g replaced by their symmetric parts (blocks read from
        Hessian-vector products are symmetric up to rounding)."""
        return cls(0.5 * (glob + glob.T), cross, 0.5 * (local + jnp.swapaxes(local, 0, 2)))

    def __add__(self, other):
        return Arrowhead(self.glob + other.glob, self.cross + other.cross, self.local + other.local)

    def matvec(self, layout, v):
        """H v for a flat v."""
        vg, vl = layout.split(v)
        cross = self.cross.reshape(self.cross.shape[0], vl.size)  # (D_g, G d_l)
        out_g = self.glob @ vg + cross @ vl.reshape(-1)
        out_l = (vg @ cross).reshape(vl.shape) + sum(self.local[k] * vl[:, k:k + 1] for k in range(vl.shape[1]))
        return layout.join(out_g, out_l)


def probes(layout, dtype):
    """The D_g + d_l probe vectors of :func:`from_probes`, (D_g + d_l, dim)."""
    d_g, d_l = layout.global_index.shape[0], layout.local_index.shape[1]
    out = np.zeros((d_g + d_l, layout.dim), dtype)
    out[np.arange(d_g), layout.global_index] = 1.0
    for k in range(d_l):
        out[d_g + k, layout.local_index[:, k]] = 1.0
    return jnp.asarray(out)


def from_probes(layout, products):
    """The :class:`Arrowhead` H from ``products`` = H·probes (rows: H applied to each of
    :func:`probes`), exact when H has the arrowhead sparsity; symmetrised."""
    d_g = layout.global_index.shape[0]
    glob_rows, local_rows = jax.vmap(layout.split)(products)  # (P, D_g), (P, G, d_l)
    glob, local = glob_rows[:d_g], local_rows[d_g:]
    return Arrowhead.symmetrised(glob, local_rows[:d_g], local)


def _small_cholesky(c):
    """Lower Cholesky factors L[i, j] (d, d, G) of G small (d, d) blocks c (d, G, d), unrolled
    over d (elementwise over G: no batched LAPACK call, see :mod:`~numpyro_sgd.numerics.linalg`);
    NaN where a block is not positive definite."""
    d = c.shape[0]
    if d == 0:
        return jnp.zeros((0, 0, c.shape[1]), c.dtype)
    cols = [[None] * d for _ in range(d)]
    for j in range(d):
        diag = c[j, :, j] - sum(cols[j][k] ** 2 for k in range(j))
        cols[j][j] = jnp.sqrt(jnp.where(diag > 0, diag, jnp.nan))
        for i in range(j + 1, d):
            cols[i][j] = (c[j, :, i] - sum(cols[i][k] * cols[j][k] for k in range(j))) / cols[j][j]
    zero = jnp.zeros_like(c[0, :, 0])
    return jnp.stack([jnp.stack([cols[i][j] if j <= i else zero for j in range(d)]) for i in range(d)])


def _lower_solve(l, b):
    """L_g⁻¹ b_g for G lower blocks l (d, d, G) and b (…, G, d), unrolled."""
    rows = []
    for i in range(l.shape[0]):
        rows.append((b[..., i] - sum(l[i, k] * rows[k] for k in range(i))) / l[i, i])
    return jnp.stack(rows, -1) if rows else jnp.zeros(b.shape, b.dtype)


def _upper_solve(l, b):
    """L_g⁻ᵀ b_g for G lower blocks l (d, d, G) and b (G, d), unrolled."""
    d = l.shape[0]
    rows = [None] * d
    for i in reversed(range(d)):
        rows[i] = (b[:, i] - sum(l[k, i] * rows[k] for k in range(i + 1, d))) / l[i, i]
    return jnp.stack(rows, -1) if rows else jnp.zeros(b.shape, b.dtype)


def _gram(w):
    """w wᵀ for a wide w (D_g, M), M ≫ D_g, as its D_g (D_g + 1) / 2 distinct row products (on a
    CPU one fused pass over w: half the time of the (D_g × M)(M × D_g) product at M = 10⁵) while
    D_g ≤ :data:`SMALL_GLOBAL` and M ≥ :data:`UNROLLED_GRAM_COLUMNS`, a matrix product otherwise
    (the unrolled products' program grows as D_g², and compiles slower than it runs at small M)."""
    if w.shape[0] > SMALL_GLOBAL or w.shape[1] < UNROLLED_GRAM_COLUMNS:
        return w @ w.T
    upper = np.triu_indices(w.shape[0])
    values = jnp.stack([jnp.sum(w[i] * w[j]) for i, j in zip(*upper)]) if upper[0].size else jnp.zeros(0, w.dtype)
    gram = jnp.zeros((w.shape[0],) * 2, w.dtype).at[upper].set(values)
    return gram + jnp.triu(gram, 1).T


class ArrowheadFactor(NamedTuple):
    """H = L Lᵀ of an :class:`Arrowhead` (see the module docstring)."""

    #: chol(C_g), L_g[i, j] at [i, j, g], (d_l, d_l, G)
    local: jnp.ndarray
    #: W_g = L_g⁻¹ B_g as a (D_g, G d_l) matrix
    cross: jnp.ndarray
    #: chol(S), (D_g, D_g)
    schur: jnp.ndarray

    def _forward(self, layout, r):
        """y = L⁻¹ r (split into its local (G, d_l) and global (D_g,) parts)."""
        r_g, r_l = layout.split(r)
        y_l = _lower_solve(self.local, r_l)
        return y_l, solve_triangular(self.schur, r_g - self.cross @ y_l.reshape(-1), lower=True)

    def _backward(self, layout, y_l, y_g):
        """x = L⁻ᵀ y as a flat vector."""
        x_g = solve_triangular(self.schur.T, y_g, lower=False)
        return layout.join(x_g, _upper_solve(self.local, y_l - (x_g @ self.cross).reshape(y_l.shape)))

    def solve(self, layout, r):
        """H⁻¹ r."""
        return self._backward(layout, *self._forward(layout, r))

    def sample(self, layout, noise):
        """L⁻ᵀ ξ for ξ = ``noise`` ~ N(0, I) (flat): a draw of N(0, H⁻¹)."""
        noise_g, noise_l = layout.split(noise)
        return self._backward(layout, noise_l, noise_g)


def _cholesky_or_diagonal(s, jitter):
    """chol(S + jitter |diag S|), or, where S is not positive definite, the factor of the
    diagonal matrix |diag S| (a crude repair that costs O(D), for the large global blocks of the
    sampling steps, whose Hessian at the centre is positive definite: an eigendecomposition, or
    a second Cholesky factor, at every step would cost more than the step's rows)."""
    diag = jnp.abs(jnp.diagonal(s))
    first = cholesky(s + jnp.diag(jitter * diag), symmetrize=False)
    fallback = jnp.diag(jnp.sqrt(jnp.maximum(diag, jitter * jnp.max(diag))))
    return jnp.where(jnp.all(jnp.isfinite(first)), first, fallback)


def _factor_groups(matrix, jitter):
    """(L_g, W) of :func:`factor`: each group block, Gershgorin-shifted where it is not positive
    definite, and W_g = L_g⁻¹ B_g."""
    dtype = matrix.glob.dtype
    d_l = matrix.local.shape[0]
    eye = jnp.eye(d_l, dtype=dtype)[:, None, :]  # (d_l, 1, d_l)
    diag = jnp.stack([matrix.local[k, :, k] for k in range(d_l)])  # (d_l, G)
    radius = jnp.sum(jnp.abs(matrix.local), axis=0).T - jnp.abs(diag)  # (d_l, G)
    scale = jnp.max(jnp.abs(diag), axis=0)
    shift = jnp.maximum(0.0, jnp.max(radius - diag + jitter * scale, axis=0))  # (G,)
    local = matrix.local + jitter * eye * diag[:, :, None]
    l_local = _small_cholesky(local)
    failed = ~jnp.all(jnp.isfinite(l_local), axis=(0, 1))
    l_local = jnp.where(failed, _small_cholesky(local + shift[:, None] * eye), l_local)
    d_g, g = matrix.cross.shape[:2]
    return l_local, _lower_solve(l_local, matrix.cross).reshape(d_g, g * d_l)


def factor(matrix, jitter=None, saddle_free=None):
    """:class:`ArrowheadFactor` of a symmetric :class:`Arrowhead` made positive definite where it
    is not (far from a mode, a likelihood's Hessian can be indefinite): a group block that is not is
    shifted by what its Gershgorin discs need to lie right of 0, and the Schur complement's eigenvalues are
    taken in absolute value (the saddle-free Newton step of Dauphin et al. 2014 on the global
    block); a positive definite group block is kept as it is. A jitter
    relative to each diagonal entry (default 10 ε of the dtype, as
    :func:`~numpyro_sgd.numerics.preconditioners.regularized_cholesky`) is added. A Schur
    complement larger than :data:`SMALL_GLOBAL` is factored by Cholesky, replaced by its
    diagonal's absolute values where it is not positive definite (``_cholesky_or_diagonal``),
    unless ``saddle_free`` (default: D_g ≤ :data:`SMALL_GLOBAL`) asks for the eigendecomposition
    at any size: Newton steps far from the mode need it; sampling steps at the centre, whose
    Hessian is positive definite, do not. With no groups the
    Schur complement is the global block itself."""
    dtype = matrix.glob.dtype
    jitter = max(1e-10, 10 * float(jnp.finfo(dtype).eps)) if jitter is None else jitter
    d_l = matrix.local.shape[0]
    d_g, g = matrix.cross.shape[:2]
    if d_l and g:
        l_local, w = _factor_groups(matrix, jitter)
    else:  # no group latents: the global block alone (a shrinkage regression's coefficients)
        l_local, w = jnp.zeros((d_l, d_l, g), dtype), jnp.zeros((d_g, 0), dtype)
    schur = matrix.glob - _gram(w)
    if not (d_g <= SMALL_GLOBAL if saddle_free is None else saddle_free):
        # A is symmetrised where it is read (Arrowhead.symmetrised) and the Gram is symmetric: no
        # second averaging (see numerics.linalg.cholesky)
        return ArrowheadFactor(l_local, w, _cholesky_or_diagonal(schur, jitter))
    values, vectors = eigh(0.5 * (schur + schur.T))
    values = jnp.abs(values)
    values = jnp.maximum(values, jitter * jnp.max(values))
    return ArrowheadFactor(l_local, w, cholesky((vectors * values) @ vectors.T))
