"""The centre of the control variates for group latents: the likelihood's gradient and its
block-arrowhead Hessian over every row in one pass, and streamed Newton steps to the mode.

For a model with global latents β and group latents a_g (:mod:`~numpyro_sgd.model.groups`),
U(θ) = L(θ) + U₀(θ; φ): the likelihood L reads the data, the prior U₀ (with the Jacobians) the
hyperparameters φ and no data. A pass over the rows in blocks gives ∇L(θ) and ∇²L(θ)·v for the
D_g + d_l probes v of :func:`~numpyro_sgd.numerics.arrowhead.probes` (one linearisation of the
block's gradient, its tangent map applied to each probe), hence the whole arrowhead ∇²L(θ), exact,
in memory O(D_g² + G d_l D_g). U₀'s gradient and arrowhead Hessian cost no data.

:func:`group_newton` takes damped Newton steps θ ← θ − s H⁻¹ ∇U(θ) with H = ∇²L(θ) + ∇²U₀(θ),
factored by the Schur complement on the global block, one pass per evaluated point, until the
Newton decrement λ² = ∇Uᵀ H⁻¹ ∇U is below a tolerance (the rule of
:func:`~numpyro_sgd.adaptation.control_variates.newton_centre`: a trust region of R posterior
sds, a candidate past the minimum along the step (the strong Wolfe condition with c₂ = ½, read
from its gradient) shortened, Nocedal & Wright 2006, Eq. 3.7). The centre keeps ∇L(θ̂) and
∇²L(θ̂), which do not depend on φ: φ has no observed child. With no group coordinates and many
global ones, whose D_g probes cost D_g gradients a row, the search's directions read ∇²L from a
subset of the rows (:func:`direction_rows`), and a search whose centre the draws use reads it
from every row at the point it stops: one more iteration of its loop.
"""

from __future__ import annotations

from operator import itemgetter
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ..numerics.arrowhead import SMALL_GLOBAL, Arrowhead, factor, from_probes, probes
from ..numerics.row_blocks import block_size
from ..protocol import self_guarded

__all__ = ["GroupCentre", "unset_group_centre", "likelihood_pass", "prior_part", "first_stride", "direction_rows",
           "group_newton", "GROUP_PASS_ROWS", "GROUP_NEWTON_STEPS", "GROUP_NEWTON_TOLERANCE",
           "FIRST_PHASE_ROWS_PER_GROUP", "FIRST_PHASE_TOLERANCE", "GROUP_NEWTON_RADIUS",
           "DIRECTION_ROWS_PER_COORDINATE"]

#: rows per block of the centre's passes: every block's gradient is a vector over all G groups,
#: so larger blocks than a flat model's (:data:`~numpyro_sgd.numerics.row_blocks.FULL_PASS_ROWS`)
#: keep the O(G) work per block below the rows' own
GROUP_PASS_ROWS = 65_536
#: the most evaluated points (data passes) of :func:`group_newton`
GROUP_NEWTON_STEPS = 20
#: the Newton decrement at which the centre is close enough (a tenth of a posterior sd)
GROUP_NEWTON_TOLERANCE = 0.01
#: rows per group coordinate of the first phase's passes (:func:`first_stride`)
FIRST_PHASE_ROWS_PER_GROUP = 8
#: the Newton decrement on the first phase's rows at which :func:`group_newton` goes on with all rows
FIRST_PHASE_TOLERANCE = 1.0
#: the longest first Newton step, in posterior sds: none. A start drawn by the init strategy can
#: be 10⁴ posterior sds from the mode (σ of a linear mixed model at a tenth of its value), where a
#: trust region that doubles needs ten passes more than full steps; full Newton steps move log σ
#: by about ½ per pass from there, and a step to a non-finite point or past the minimum is shortened
GROUP_NEWTON_RADIUS = float("inf")
#: rows per global coordinate the search's Newton directions read ∇²L from, where θ has no group
#: coordinates and many global ones (:func:`direction_rows`)
DIRECTION_ROWS_PER_COORDINATE = 32


@self_guarded
class GroupCentre(NamedTuple):
    """The centre θ̂ of the control variates for group latents, with the likelihood there. The
    search accepts finite points only, so the driver's guard leaves it alone
    (:func:`~numpyro_sgd.protocol.self_guarded`)."""

    #: θ̂ (flat, unconstrained)
    position: jnp.ndarray
    #: ∇L(θ̂), all rows (no prior)
    lik_grad: jnp.ndarray
    #: ∇²L(θ̂), all rows (no prior), block-arrowhead
    lik_hessian: Arrowhead
    #: λ² where the Newton steps stopped (NaN: no finite point)
    decrement: jnp.ndarray
    #: data passes the Newton steps took (0 from a call where no search was due)
    passes: jnp.ndarray


def unset_group_centre(theta, layout):
    """The :class:`GroupCentre` before it is found (NaN)."""
    nan = jnp.full((), jnp.nan, theta.dtype)
    d_g, (g, d_l) = layout.global_index.shape[0], layout.local_index.shape
    hessian = Arrowhead(jnp.full((d_g, d_g), jnp.nan, theta.dtype), jnp.full((d_g, g, d_l), jnp.nan, theta.dtype),
                        jnp.full((d_l, g, d_l), jnp.nan, theta.dtype))
    return GroupCentre(jnp.full_like(theta, jnp.nan), jnp.full_like(theta, jnp.nan), hessian, nan,
                       jnp.zeros((), theta.dtype))


def prior_part(oracle, theta, layout, cross=True):
    """(∇U₀(θ), ∇²U₀(θ) as an :class:`~numpyro_sgd.numerics.arrowhead.Arrowhead`): the prior and
    Jacobian terms, no data. The blocks are read apart, as forward-over-reverse products in the
    global coordinates β (D_g of them: A and B) and in the group coordinates a (d_l of them, each
    moving the k-th coordinate of every group at once: C), each already in the block's layout. A
    prior that does not couple β and a (``cross`` False, as
    :func:`~numpyro_sgd.model.groups.check_one_group_per_row` finds) has B = 0, which is then not
    computed: no (D_g, G, d_l) work at all (reading every block from whole-θ products took 4× as
    long at G = 10⁵)."""
    beta, a = layout.split(theta)

    def u(b, x):
        return oracle.prior_potential(layout.join(b, x))

    grad_beta, grad_a = jax.grad(u, (0, 1))(beta, a)
    basis = jnp.eye(beta.shape[0], dtype=theta.dtype)

    def along_beta(partial):  # ∂/∂β of ∂U₀/∂(β or a), one row per global coordinate
        return jax.vmap(lambda e: jax.jvp(lambda b: jax.grad(u, partial)(b, a), (beta,), (e,))[1])(basis)

    def along_a(k):  # ∂/∂a_{·k} of ∂U₀/∂a: column k of every group's block at once
        return jax.jvp(lambda x: jax.grad(u, 1)(beta, x), (a,), (jnp.zeros_like(a).at[:, k].set(1.0),))[1]

    glob = along_beta(0)
    cross = along_beta(1) if cross else jnp.zeros((beta.shape[0], *a.shape), theta.dtype)
    local = (jnp.stack([along_a(k) for k in range(a.shape[1])]) if a.shape[1]
             else jnp.zeros((0, *a.shape), theta.dtype))  # no group latents (a shrinkage regression)
    return layout.join(grad_beta, grad_a), Arrowhead.symmetrised(glob, cross, local)


def likelihood_pass(oracle, theta, layout, stride=1, block_rows=GROUP_PASS_ROWS, curvature_rows=None,
                    every_row=True):
    """(∇L(θ), ∇²L(θ)) over the rows of the one subsample plate, in blocks of about ``block_rows``
    rows (:func:`~numpyro_sgd.numerics.row_blocks.block_size`; each device's own rows on a mesh, as
    :func:`~numpyro_sgd.adaptation.control_variates.full_potential_and_grad`), with the memory of
    one block (a running sum). Every block's likelihood (:meth:`~numpyro_sgd.SubsampledPotential.likelihood`:
    no prior, which would cancel in rounding) carries the scale N/K; weighted K/N over all blocks
    they sum every row once.

    ``stride`` (a Python int) > 1 takes every stride-th block only, weighted equally (an
    unbiased estimate of L from 1/stride of the rows; the rows left after the last whole block
    are skipped): the cheap passes of :func:`group_newton`'s first phase.

    ``curvature_rows`` (a Python int; default None: ∇²L from the pass's rows) reads ∇²L from
    about that many of the pass's rows (whole blocks spread over the pass, or, where that is under
    a block, the pass's first rows: rows in random order make either an unbiased estimate), and ∇L
    from all of them, unless ``every_row`` (a traced bool) asks for ∇²L from every row of the
    data: a loop over pieces whose count is traced, so a search that needs the exact ∇²L only at
    its last point pays a whole pass there and nowhere else (under ``vmap`` too).

    :return: ``(∇L, ∇²L as an Arrowhead, the fraction of a data pass read)``.
    """
    (plate,) = oracle.plates
    n, k = plate.size, oracle.num_shards
    size = block_size(n // k, max(1, block_rows // k))
    num_full, rest = divmod(n // k, size)
    probe = probes(layout, theta.dtype)
    whole = stride == 1
    used = max(num_full // stride, 1)

    def block(start, rows, weight, curvature=True):
        rows = oracle.shard_rows(start, rows)
        grad = jax.grad(lambda t: weight * oracle.likelihood_energy(t, rows))
        if not curvature:
            return grad(theta)
        value, tangent = jax.linearize(grad, theta)
        return value, jax.vmap(tangent)(probe)

    def over_blocks(count, step, rows, weight, curvature=True, first=0):
        # the gather's start moves with the loop's counter, so XLA cannot hoist a block out of a
        # loop that runs no iteration (a pass at a point fixed outside it would run every call)
        shapes = jax.eval_shape(lambda: block(jnp.zeros((), jnp.int32), rows, weight, curvature))
        zero = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
        return lax.fori_loop(0, count, lambda b, acc: jax.tree.map(
            jnp.add, acc, block(first + b * step, rows, weight, curvature)), zero)

    weight = k * size / n if whole else 1.0 / used
    sampled = curvature_rows is not None
    total = over_blocks(used, stride * size, size, weight, not sampled)
    if rest and whole:  # the rows after the last whole block, in a whole pass only
        total = jax.tree.map(jnp.add, total, block(jnp.asarray(num_full * size, jnp.int32), rest, k * rest / n,
                                                   not sampled))
    read = jnp.asarray(1.0 if whole else used * size * k / n, theta.dtype)
    if sampled:  # ∇L from the pass's rows, ∇²L from pieces spread over them, or from every row
        grad = total
        piece = max(1, min(size, -(-curvature_rows // k)))  # rows a shard of one piece
        pieces = min(used, -(-curvature_rows // (piece * k)))  # more than one only where a piece is a block
        spread = (used // pieces) * stride * size
        num_pieces, left = divmod(n // k, piece)
        count = jnp.where(every_row, num_pieces, pieces)
        _, products = over_blocks(count, jnp.where(every_row, piece, spread), piece,
                                  jnp.where(every_row, k * piece / n, 1.0 / pieces).astype(theta.dtype))
        if left:  # the rows after the last whole piece, where every row is read
            products = products + over_blocks(jnp.where(every_row, 1, 0), left, left, k * left / n,
                                              first=num_pieces * piece)[1]
        read = read + jnp.where(every_row, 1.0, pieces * piece * k / n).astype(theta.dtype)
    else:
        grad, products = total
    return grad, from_probes(layout, products), read


def direction_rows(num_rows, layout):
    """The rows :func:`group_newton`'s Newton directions read ∇²L from: all (None) where θ has
    group coordinates (each group's block needs its own rows) or at most
    :data:`~numpyro_sgd.numerics.arrowhead.SMALL_GLOBAL` global ones; otherwise
    :data:`DIRECTION_ROWS_PER_COORDINATE` per global coordinate, where that is under half the rows.
    A shrinkage regression's p coefficients cost p Hessian-vector products a row (103 s a pass over
    10⁶ rows at p = 10³, against 1.4 s for the gradient). An estimate from 32 p rows is off by
    about (p / 32 p)^½ = 18 % in relative norm, which makes Newton's convergence linear at about
    that rate; it is not kept where the draws use the centre: group_sgld's Eq. 1 is unbiased only
    with the full-data ∇²L(θ̂)."""
    d_g = layout.global_index.shape[0]
    if layout.local_index.size or d_g <= SMALL_GLOBAL:
        return None
    rows = DIRECTION_ROWS_PER_COORDINATE * d_g
    return rows if 2 * rows < num_rows else None


def first_stride(num_rows, layout, block_rows=GROUP_PASS_ROWS):
    """The stride of :func:`group_newton`'s first phase: every stride-th block holds about
    max(2 blocks, :data:`FIRST_PHASE_ROWS_PER_GROUP` rows per group coordinate) rows; 1 (no first
    phase) when that is most of the rows."""
    blocks = max(1, num_rows // block_rows)
    wanted = max(2 * block_rows, FIRST_PHASE_ROWS_PER_GROUP * layout.local_index.size)
    stride = blocks // max(1, -(-wanted // block_rows))
    return stride if stride >= 3 else 1


def group_newton(oracle, theta, layout, active, previous=None, from_afar=True, final=True,
                 max_steps=GROUP_NEWTON_STEPS, tolerance=GROUP_NEWTON_TOLERANCE, radius=GROUP_NEWTON_RADIUS):
    """The :class:`GroupCentre` from ``theta`` by damped Newton steps (module docstring), the
    first at ``theta``; where ``active`` is False, ``previous`` (default: unset) as it is, with
    ``passes`` 0: the loops then stop at once, so under ``vmap`` the chains that need no centre
    cost nothing, and a caller that searches only now and then selects nothing afterwards.

    Two phases: from a start far out (the init strategy's), Newton steps on every
    :func:`first_stride`-th block of rows (an unbiased estimate of L from a fraction of the rows)
    until their decrement is below :data:`FIRST_PHASE_TOLERANCE`, then on all rows until λ² ≤
    ``tolerance``; each phase at most ``max_steps`` evaluations. The phases are two loops with a
    fixed set of rows each, so that under ``vmap`` (the vectorized chains) every chain reads the
    same rows at once. ``passes`` counts the rows read, in data passes.

    ``from_afar`` False skips the first phase: from a draw of the chain (the search at the end of
    warmup) it moved to the mode of the subset's rows, whose group coordinates sit further from the
    full data's mode than the draw (at N = 10⁶, G = 10⁴: λ² 7.5·10⁴ after 4 cheap passes), and the
    full passes then took as many steps as from the draw itself.

    Where :func:`direction_rows` reads the directions' ∇²L from a subset of the rows (no group
    coordinates, many global ones), a search whose centre is ``final`` (a traced bool: the centre
    the draws use) takes one more iteration where it stops, at the point it stopped at, that reads
    ∇²L and λ² from every row (and goes on if λ² is then above ``tolerance``); a search whose
    centre serves warmup only (burn-in) keeps the estimate. Inside the loop, not after it: a pass at
    a point the loop does not change would be hoisted out of it by XLA and run at every step."""
    dtype = theta.dtype
    (plate,) = oracle.plates
    stride = first_stride(plate.size // oracle.num_shards, layout)
    sampled = direction_rows(plate.size, layout)

    def newton(point, lik_grad, lik_hessian):
        prior_grad, prior_hessian = prior_part(oracle, point, layout)
        grad = lik_grad + prior_grad
        direction = factor(lik_hessian + prior_hessian, saddle_free=True).solve(layout, grad)
        return grad, direction, grad @ direction

    def phase(carry, stride, tolerance, go, finish=False):
        def searching(carry):
            n, evaluated, *_, decrement, _, _, _ = carry
            return (n < max_steps) & (~evaluated | (decrement > tolerance))

        def finishing(carry):  # the point where the search stopped, its ∇²L not yet from every row
            if finish is False:  # a static no: the loop as it was
                return jnp.zeros((), bool)
            n, evaluated, *_, decrement, _, _, exact = carry
            return (finish & evaluated & jnp.isfinite(decrement) & ~exact & ~searching(carry)
                    & (n <= max_steps + 1))

        def keep_going(carry):
            return go & (searching(carry) | finishing(carry))

        def body(carry):
            last = finishing(carry)
            n, evaluated, position, lik_grad, lik_hessian, direction, decrement, region, passes, exact = carry
            scale = jnp.minimum(1.0, region / jnp.sqrt(decrement))
            point = jnp.where(evaluated & ~last, position - scale * direction, position)
            lik_grad_c, lik_hessian_c, read = likelihood_pass(oracle, point, layout, stride, curvature_rows=sampled,
                                                              every_row=last)
            grad_c, direction_c, decrement_c = newton(point, lik_grad_c, lik_hessian_c)
            finite = jnp.isfinite(decrement_c) & jnp.all(jnp.isfinite(grad_c))
            overshot = evaluated & ~last & (grad_c @ direction < -0.5 * decrement)
            accept = finite & ~overshot

            def pick(new, old):
                return jax.tree.map(lambda a, b: jnp.where(accept, a, b), new, old)

            position, lik_grad, lik_hessian, direction = pick((point, lik_grad_c, lik_hessian_c, direction_c),
                                                              (position, lik_grad, lik_hessian, direction))
            # no finite point at the start: stop with a NaN decrement (the chain's steps are then rejected)
            decrement = jnp.where(accept, decrement_c, jnp.where(evaluated, decrement, jnp.nan))
            # after a shortened step the region is a quarter of that step's length (in posterior sds)
            region = jnp.where(evaluated & ~accept, 0.25 * scale * jnp.sqrt(decrement),
                               jnp.where(evaluated & ~last, 2.0 * region, region))
            exact = jnp.where(accept, last, exact)  # read only where finish (sampled directions)
            return (n + 1, jnp.ones((), bool), position, lik_grad, lik_hessian, direction, decrement, region,
                    passes + read, exact)

        return lax.while_loop(keep_going, body, carry)

    previous = unset_group_centre(theta, layout) if previous is None else previous

    def start(position, lik_grad, lik_hessian, decrement, passes):
        return (jnp.zeros((), jnp.int32), jnp.zeros((), bool), position, lik_grad, lik_hessian,
                jnp.zeros_like(theta), decrement, jnp.asarray(radius, dtype), passes, jnp.zeros((), bool))

    carry = start(jnp.where(active, theta, previous.position), previous.lik_grad, previous.lik_hessian,
                  previous.decrement, jnp.zeros((), dtype))
    if stride > 1:
        carry = start(*itemgetter(2, 3, 4, 6, 8)(phase(carry, stride, FIRST_PHASE_TOLERANCE, active & from_afar)))
    finish = False if sampled is None else jnp.asarray(final, bool)
    _, _, position, lik_grad, lik_hessian, _, decrement, _, passes, _ = phase(carry, 1, tolerance, active, finish)
    return GroupCentre(position, lik_grad, lik_hessian, decrement, passes)
