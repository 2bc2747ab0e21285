"""Control-variate gradients about a centre near the mode, and that centre.

With a centre θ̂ and the full-data gradient ∇U(θ̂), computed once, the minibatch gradient

    ∇Û_cv(θ) = ∇U(θ̂) + ∇Û_B(θ) − ∇Û_B(θ̂)
             = ∇U(θ̂) + (N/S) Σ_{i∈B} [∇u_i(θ) − ∇u_i(θ̂)] + ∇u_0(θ) − ∇u_0(θ̂)

(u_i = −log p(x_i | θ), u_0 the prior's part; Baker, Fearnhead, Fox & Nemeth 2019, Eq. 5 and
Alg. 2 (SGLD-CV); Brosse, Durmus & Moulines 2018, Sec. 3 (FP: "fixed point")) is unbiased for
∇U(θ), and its noise is (N²/S) Cov_i[∇u_i(θ) − ∇u_i(θ̂)] = O(N²/S · ‖θ − θ̂‖² · Var_i ∇²u_i):
at the posterior's scale, ‖θ − θ̂‖ = O(N^-½), it does not grow with N (ref. 1, Thm. 1), where the
plain minibatch gradient's noise (N²/S) Cov_i ∇u_i grows like N²/S.

* :func:`full_potential_and_grad`: U(θ) and ∇U(θ) in one streamed pass over the rows, in blocks
  of ``chunk_size`` (no N × D intermediate).
* :func:`newton_centre`: θ̂ from a start near the mode (the end of the noise warmup) by Newton
  steps with the full-data gradient and the Hessian estimated on a fixed set of rows, a step
  shortened when the gradient at its end says it overshot (or is not finite); one data pass per
  evaluated point.
* :class:`ControlVariateOracle`: the oracle whose ``grad`` is ∇Û_cv; both gradients of a step are
  taken on the same gathered rows (one vmap over θ and θ̂).
* :func:`control_variate_noise`: the covariance of ∇Û_cv at points a posterior sd from θ̂, and how
  far ∇U is from linear there, which set the step size of the kernels that use it.

**References:**

1. *Control variates for stochastic gradient MCMC*, J. Baker, P. Fearnhead, E. B. Fox,
   C. Nemeth, Statistics and Computing 29 (2019), Eq. 5, Alg. 2, Thm. 1.
2. *The promises and pitfalls of stochastic gradient Langevin dynamics*, N. Brosse, A. Durmus,
   E. Moulines, NeurIPS 2018, Sec. 3.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random

from ..model.oracle import grad_and_hessian
from ..numerics.linalg import cho_solve, cholesky, inv
from ..numerics.preconditioners import psd_part, regularized_cholesky
from ..numerics.row_blocks import FULL_PASS_ROWS, sum_over_row_blocks
from ..protocol import mean_over_chains
from .adapted import with_adapted

__all__ = ["Centre", "ControlState", "unset_control", "ControlVariateOracle", "full_potential_and_grad",
           "newton_centre", "control_variate_noise", "fixed_rows", "curvature_at", "curvature_rows",
           "CURVATURE_ROWS", "MAX_NEWTON_STEPS", "NEWTON_TOLERANCE", "NEWTON_ROWS", "NEWTON_RADIUS", "check_single_plate",
           "NONLINEARITY_WARN", "PRIOR_PULL_WARN", "off_gaussian_message", "centre_and_noise", "start_at_the_centre",
           "with_control_variate_gradients", "with_control_variates"]

#: rows of the fixed sets the Hessian at the centre and the measure of the control-variate noise
#: are taken on (two independent sets): the Hessian's relative error in a direction is about
#: √(D/rows), which is, at large steps, the relative error of the sampled variance along it
CURVATURE_ROWS = 65_536
#: seeds of the two fixed row sets (apart from the chains' key streams and from each other)
CURVATURE_SEED, NOISE_SEED = 7_919, 104_729
#: the most Newton steps from the end of the noise warmup to the centre (each at least one
#: full-data pass): near the mode Newton converges quadratically up to the error of the estimated
#: Hessian (relative O(√(D/rows))), so two to four steps usually reach the tolerance
MAX_NEWTON_STEPS = 20
#: the Newton decrement ∇Uᵀ H⁻¹ ∇U at which the centre is close enough: a tenth of a posterior sd
#: from the mode. The control-variate noise grows with the distance of the chain from θ̂, so it
#: only needs to be inside the posterior's bulk; the integrators are exact for any centre of the
#: Gaussian part (the offset is a constant gradient term)
NEWTON_TOLERANCE = 0.01
#: rows of the Hessian of each Newton step (the final Hessian at θ̂ takes :data:`CURVATURE_ROWS`)
NEWTON_ROWS = 4_096
#: the longest first Newton step, in posterior sds (λ, the square root of the Newton decrement):
#: none. At N = 10⁷ the noise warmup ends about 100 sds from the mode (S = 1,000, D = 50), and a
#: trust region of 30 sds that doubles took one pass more there (logistic and Poisson regressions:
#: 6 passes a chain, 5 with full steps; the same 4 at 10⁶). A full step to a point where an exp
#: link overflows, or past the minimum, is shortened (:func:`newton_centre`), one pass each
NEWTON_RADIUS = float("inf")


class Centre(NamedTuple):
    """The point the control variates are taken about, with the full-data potential there."""

    #: θ̂ (flat, unconstrained)
    position: jnp.ndarray
    #: U(θ̂), all N rows
    potential_energy: jnp.ndarray
    #: ∇U(θ̂), all N rows
    grad: jnp.ndarray
    #: λ² = ∇U(θ̂)ᵀ H⁻¹ ∇U(θ̂), the Newton decrement where :func:`newton_centre` stopped: below
    #: :data:`NEWTON_TOLERANCE` when it converged (NaN before the centre is found)
    decrement: jnp.ndarray = jnp.nan


class ControlState(NamedTuple):
    """A kernel's control-variate state, set at the end of warmup (``control`` of its state)."""

    #: the centre θ̂ with U and ∇U there (:class:`Centre`)
    centre: Centre
    #: δ of :func:`control_variate_noise`: how far ∇U is from linear over a posterior sd
    nonlinearity: jnp.ndarray
    #: full-data passes the centre took (:func:`newton_centre`), beside the SG steps' passes; vectorized
    #: chains share one centre, and each chain's state holds its passes (made once for all)
    passes: jnp.ndarray
    #: whether the chain has been moved to the centre (done once, before the first sampling block:
    #: the warmup's last point may be far out, where the control variates' noise is large)
    moved: jnp.ndarray
    #: the largest entry of Lᵀ ∇U₀(θ̂) in size: the prior's force at the centre in posterior sds
    #: (L Lᵀ = H⁻¹, U₀ the prior and Jacobian terms), large where the data push the mode far
    #: against the prior along a direction they hardly curve (:data:`PRIOR_PULL_WARN`)
    prior_pull: jnp.ndarray = jnp.nan


def unset_control(theta):
    """The :class:`ControlState` before warmup has found the centre (NaN: a step taken with it is
    rejected, never sampled)."""
    nan = jnp.full((), jnp.nan, theta.dtype)
    return ControlState(Centre(jnp.full_like(theta, jnp.nan), nan, jnp.full_like(theta, jnp.nan), nan), nan,
                        jnp.zeros((), theta.dtype), jnp.ones((), bool), nan)


def check_single_plate(name, potential):
    """Raise unless the model has one subsample plate (a streamed full-data pass walks one)."""
    if len(potential.plates) != 1:
        raise ValueError(
            f"{name}: control_variates=True needs the model's data in one subsample plate (its full-data "
            f"gradient at the centre is streamed over that plate's rows); this model has {len(potential.plates)}: "
            f"{[p.name for p in potential.plates]}. Subsample one plate, or use control_variates=False.")


def fixed_rows(oracle, rows, seed):
    """``{plate: int32[m·S]}``: m = ⌈rows/S⌉ minibatches drawn by the oracle's law with the fixed
    key ``seed``, joined as the oracle joins them (on a mesh, each device's rows in its block;
    their potential is scaled by N/(m·S): an unbiased estimate of U)."""
    return oracle.fixed_batch(rows, seed, max_batches=None)


def curvature_rows(oracle):
    """Rows of the Hessian at the centre and of the noise measure: :data:`CURVATURE_ROWS`, or N
    (drawn by the oracle's law) when N is smaller, but at least the Newton steps' 4,096."""
    return int(min(CURVATURE_ROWS, max(NEWTON_ROWS, oracle.num_data)))


def curvature_at(oracle, theta, rows=CURVATURE_ROWS):
    """∇²U(θ) estimated on a fixed set of about ``rows`` rows (unbiased; D forward-mode passes)."""
    batch = fixed_rows(oracle, rows, CURVATURE_SEED)
    return grad_and_hessian(lambda t: oracle.potential_energy(t, batch), theta)[1]


def full_potential_and_grad(oracle, theta, chunk_size=FULL_PASS_ROWS):
    """(U(θ), ∇U(θ)) over every row of the model's one subsample plate, in blocks of about
    ``chunk_size`` rows: Σ_c (K_c/N) Û_{K_c}(θ) for blocks K_c (each block's potential carries the
    prior and the scale N/K_c, so the weights K_c/N sum the prior once and every row once). On a
    mesh every block takes ``chunk_size``/k rows of each of the k devices' own shards
    (``oracle.shard_rows``), so each device reads only its rows and one all-reduce sums a block.
    Memory O(chunk_size · D)."""
    (plate,) = oracle.plates
    n, k = plate.size, oracle.num_shards

    def block(start, size):
        pe, grad = oracle.potential_and_grad(theta, oracle.shard_rows(start, size))
        return pe * (k * size / n), grad * (k * size / n)

    return sum_over_row_blocks(block, n // k, max(1, chunk_size // k))


def newton_centre(oracle, theta, max_steps=MAX_NEWTON_STEPS, tolerance=NEWTON_TOLERANCE, chunk_size=FULL_PASS_ROWS,
                  rows=NEWTON_ROWS, radius=NEWTON_RADIUS):
    """The centre θ̂ (:class:`Centre`) from ``theta``: damped Newton steps θ ← θ − s H⁻¹ ∇U(θ),
    ∇U on all rows (:func:`full_potential_and_grad`), H the Hessian of the potential on a fixed
    set of about ``rows`` rows (unbiased for ∇²U), until the Newton decrement λ² = ∇Uᵀ H⁻¹ ∇U
    (the squared distance to the mode in posterior sds, near it) is below ``tolerance``, or after
    ``max_steps``.

    The step length s starts at min(1, R/λ): a step moves at most R posterior sds, R = ``radius``
    at first (a trust region; by default none, :data:`NEWTON_RADIUS`), doubled after a
    step that needed no shortening and halved after one that did. Whether it overshot is
    read from the full-data gradient at the candidate, which the next step needs anyway: along
    the step, φ(s) = U(θ − s d) has φ'(0) = −λ², and a candidate with φ'(s) > λ²/2 (past the
    minimum by more than the strong Wolfe condition with c₂ = ½ allows; Nocedal & Wright 2006,
    Eq. 3.7) or a non-finite value is shortened to the secant's zero of φ' (kept within
    [0.1 s, 0.9 s]) and evaluated again. Potentials are not compared: at large N their rounding
    (U ~ N in float32) exceeds the decrease λ²/2 near the mode. One data pass per evaluated point,
    and one at the start; the returned potential and gradient are θ̂'s.

    :return: ``(Centre, data passes)``; ``Centre.decrement`` is the last λ² (NaN when no finite
        point was found along a step).
    """
    batch = fixed_rows(oracle, rows, CURVATURE_SEED)
    dtype = theta.dtype

    def direction_at(position, grad):
        hessian = grad_and_hessian(lambda t: oracle.potential_energy(t, batch), position)[1]
        direction = cho_solve(regularized_cholesky(hessian), grad)
        return direction, grad @ direction

    def not_done(carry):
        step, _, _, _, _, decrement, _, _ = carry
        return (step < max_steps) & (decrement > tolerance)

    def newton_step(carry):
        step, position, pe, grad, direction, decrement, region, passes = carry

        def evaluate(scale, count):
            pe_c, grad_c = full_potential_and_grad(oracle, position - scale * direction, chunk_size)
            return scale, pe_c, grad_c, count + 1

        def overshot(search):
            scale, pe_c, grad_c, count = search
            finite = jnp.isfinite(pe_c) & jnp.all(jnp.isfinite(grad_c))
            return (count < 10) & (~finite | (grad_c @ direction < -0.5 * decrement))

        def shorten(search):
            scale, pe_c, grad_c, count = search
            slope = grad_c @ direction  # −φ'(s); λ² at s = 0
            secant = scale * decrement / (decrement - slope)
            finite = jnp.isfinite(pe_c) & jnp.all(jnp.isfinite(grad_c)) & jnp.isfinite(secant)
            return evaluate(jnp.where(finite, jnp.clip(secant, 0.1 * scale, 0.9 * scale), 0.1 * scale), count)

        first = evaluate(jnp.minimum(1.0, region / jnp.sqrt(decrement)).astype(dtype), jnp.zeros((), dtype))
        scale, pe_c, grad_c, count = lax.while_loop(overshot, shorten, first)
        ok = jnp.isfinite(pe_c) & jnp.all(jnp.isfinite(grad_c))
        position = jnp.where(ok, position - scale * direction, position)
        pe, grad = jnp.where(ok, pe_c, pe), jnp.where(ok, grad_c, grad)
        direction, new_decrement = direction_at(position, grad)
        region = jnp.where(count > 1, 0.5 * region, 2.0 * region)
        # no finite point along the step: the search ends where it was (its decrement reported as NaN)
        return (step + 1, position, pe, grad, direction, jnp.where(ok, new_decrement, jnp.nan), region,
                passes + count)

    pe, grad = full_potential_and_grad(oracle, theta, chunk_size)
    direction, decrement = direction_at(theta, grad)
    init = (jnp.zeros((), jnp.int32), theta, pe, grad, direction, decrement, jnp.asarray(radius, dtype),
            jnp.ones((), dtype))
    _, position, pe, grad, _, decrement, _, passes = lax.while_loop(not_done, newton_step, init)
    return Centre(position, pe, grad, decrement), passes


class ControlVariateOracle:
    """A :class:`~numpyro_sgd.MinibatchOracle` whose gradients are the control-variate
    estimate about ``centre`` (ref. 1, Eq. 5): ``grad(rng_key, θ)`` draws a minibatch B by the
    oracle's law and returns (U(θ̂) + Û_B(θ) − Û_B(θ̂), ∇U(θ̂) + ∇Û_B(θ) − ∇Û_B(θ̂), indices).
    Both minibatch terms are one vmapped evaluation over (θ, θ̂): the rows of B are gathered once.
    A step costs 2S per-datum gradients (``batch_size``). Everything else is the wrapped oracle's."""

    def __init__(self, oracle, centre):
        self._oracle, self.centre = oracle, centre

    def __getattr__(self, name):
        return getattr(self._oracle, name)

    @property
    def batch_size(self):
        """Per-datum gradients of one control-variate gradient: S at θ and S at θ̂."""
        return 2 * self._oracle.batch_size

    def potential_and_grad(self, theta, indices):
        """The control-variate (Û, ∇Û) on ``indices``."""
        pair = jnp.stack([theta, self.centre.position])
        pes, grads = jax.vmap(lambda t: self._oracle.potential_and_grad(t, indices))(pair)
        return self.centre.potential_energy + pes[0] - pes[1], self.centre.grad + grads[0] - grads[1]

    def grad(self, rng_key, theta):
        """Draw a minibatch; return the control-variate ``(Û, ∇Û)`` at θ and the indices."""
        indices = self._oracle.draw(rng_key)
        return (*self.potential_and_grad(theta, indices), indices)


def control_variate_noise(oracle, centre, scale, rng_key, num_points=8, rows=CURVATURE_ROWS):
    """What sets a control-variate kernel's step: at ``num_points`` points θ_k = θ̂ + L ψ_k,
    ψ_k ~ N(0, I), where L Lᵀ = ``scale`` ``scale``ᵀ is the posterior's covariance (Laplace at θ̂,
    from :func:`curvature_at`), on a fixed set of about ``rows`` rows independent of the Hessian's
    (per-example gradients ∇Û_i, each N-scaled):

    * ``noise``: Q_cv = (1/S) Cov_i[∇Û_i(θ_k) − ∇Û_i(θ̂)], averaged over k: the covariance of one
      control-variate minibatch gradient (S rows, with replacement) a posterior sd from θ̂;
    * ``nonlinearity``: δ = max_k ‖Lᵀ(∇U(θ_k) − ∇U(θ̂)) − ψ_k‖ / ‖ψ_k‖, with ∇U(θ_k) − ∇U(θ̂)
      estimated on the fixed rows and its sampling noise (the trace of Lᵀ Q L at those rows)
      taken out of the squared norm: how far the gradient is from the Gaussian's over a
      posterior sd (0 for a Gaussian posterior whose Hessian L⁻ᵀ L⁻¹ is the one estimated; the
      Hessian's own sampling error counts here, as it should: the kernel integrates exactly the
      Gaussian of the estimated Hessian, and its error along a direction is that direction's).

    :param scale: L, (D, D) lower factor or (D,) diagonal, in θ's units.
    :return: ``(noise, nonlinearity)``: Q_cv of θ (D, D) and δ (scalar).
    """
    batch = fixed_rows(oracle, rows, NOISE_SEED)
    (plate,) = oracle.plates
    num_rows, s = batch[plate.name].shape[0], float(plate.subsample_size)
    d = centre.position.shape[0]
    dtype = centre.position.dtype
    apply = (lambda v: scale @ v) if scale.ndim == 2 else (lambda v: scale * v)
    apply_t = (lambda v: scale.T @ v) if scale.ndim == 2 else (lambda v: scale * v)
    _, _, (at_centre,) = oracle.per_example_grads(centre.position, batch)
    psi = random.normal(rng_key, (num_points, d), dtype)

    def at(p):
        _, _, (rows_k,) = oracle.per_example_grads(centre.position + apply(p), batch)
        diff = rows_k - at_centre
        mean = jnp.mean(diff, axis=0)
        cov = (diff - mean).T @ (diff - mean) / (num_rows - 1)
        # the fixed rows' mean difference estimates ∇U(θ_k) − ∇U(θ̂) with covariance cov/num_rows
        residual = apply_t(mean) - p
        noise_of_mean = jnp.trace(_express(cov, scale)) / num_rows
        return cov / s, jnp.maximum(residual @ residual - noise_of_mean, 0.0) / (p @ p)

    covs, ratios = lax.map(at, psi)
    return jnp.mean(covs, axis=0), jnp.sqrt(jnp.max(ratios))


#: δ (:func:`control_variate_noise`) above which the end of warmup warns that the posterior is
#: far from Gaussian over a posterior sd: twice the variance error the default steps allow
#: (τ = 0.1). Measured on N = 5,000, D = 4 (2 chains): Gaussian and logistic regressions 0.05–0.06
#: (every control-variate kernel within 0.07 sd of NUTS); separated classes 0.27 (SGLD's
#: exponential step 0.15 sd off); a Laplace likelihood (a kink at every datum) 9,300 (SGLD's
#: exponential step 25 sd off with sds 600× too large, SGHMC's sds 5–15× too small)
NONLINEARITY_WARN = 0.2
#: ``ControlState.prior_pull`` above which the end of warmup warns that the data push the centre
#: against the prior along a direction they hardly curve (the mode is at the edge of what the data
#: determine): one posterior sd. Measured (N = 2,000–10⁵, D = 4): a logistic regression whose
#: classes one predictor separates 4.2–16 (its coefficient 0.2–0.3 sd off with every control-
#: variate kernel, the posterior skewed); Gaussian, logistic and Laplace regressions ≤ 0.34
PRIOR_PULL_WARN = 1.0


def off_gaussian_message(name, control, alternatives):
    """The end-of-warmup warning's text for a control-variate kernel whose centre did not converge,
    whose data push the centre against the prior (:data:`PRIOR_PULL_WARN`) or whose posterior is
    far from Gaussian over a posterior sd (δ > :data:`NONLINEARITY_WARN`),
    from ``control`` (a :class:`ControlState`, NumPy, any leading chain axis); "" otherwise.
    ``alternatives`` names what to use instead."""
    delta = float(np.nanmax(np.asarray(control.nonlinearity, float)))
    decrement = float(np.max(np.asarray(control.centre.decrement, float)))  # NaN: no finite point along a step
    passes = float(np.nanmax(np.asarray(control.passes, float)))
    causes = []
    if not decrement <= NEWTON_TOLERANCE:
        causes.append(
            f"the Newton steps to the centre stopped after {passes:.0f} data passes without converging (Newton "
            f"decrement {decrement:.3g} > {NEWTON_TOLERANCE}: the centre is not the mode the control variates "
            "assume)")
    pull = float(np.nanmax(np.asarray(control.prior_pull, float)))
    if pull > PRIOR_PULL_WARN:
        causes.append(
            f"the data push the centre against the prior by {pull:.3g} posterior sds along a direction they hardly "
            "curve (the mode is at the edge of what the data determine, and the posterior skewed there)")
    if delta > NONLINEARITY_WARN:
        causes.append(
            f"the full-data gradient departs from the Gaussian's by δ = {delta:.3g} of its size over one posterior sd "
            f"from the centre (above {NONLINEARITY_WARN}: the posterior is far from Gaussian there)")
    if not causes:
        return ""
    return (f"{name}: control_variates=True: {' and '.join(causes)}. The control variates' curvature and steps "
            "assume a near-Gaussian posterior about a mode the data determine; here expect biased means and sds "
            "(seen: a Laplace or other non-smooth likelihood, data that separate the classes of a logistic "
            f"regression, a mode on the boundary of the support). Use {alternatives}, and check the run against "
            "a run without control variates.")


def _express(matrix, scale):
    """Lᵀ M L for a (D, D) M and L (D, D) or (D,) diagonal."""
    if scale.ndim == 1:
        return matrix * jnp.outer(scale, scale)
    return scale.T @ matrix @ scale


# ---------------------------------------------------------------------------- the wiring of a kernel
def centre_and_noise(theta, state, oracle, full, law):
    """The end of warmup of a control-variate kernel: (state with ``control`` set, the
    control-variate gradient's noise Q_cv, the Hessian's positive part at the centre), both (D, D)
    with ``full`` else their diagonals (see
    :func:`~numpyro_sgd.adaptation.default_steps.with_default_steps`); ``law``: the sampling minibatch law."""
    # one centre for all vectorized chains, from the mean of where their warmups ended: control
    # variates are unbiased about any centre, and the chains' Newton passes are then made once
    centre, passes = newton_centre(oracle, mean_over_chains(theta))
    hessian = psd_part(curvature_at(oracle, centre.position, curvature_rows(oracle)))
    # the posterior's scale at the centre (Laplace), where the noise and the non-linearity are measured
    scale = cholesky(inv(hessian)) if full else 1.0 / jnp.sqrt(jnp.diagonal(hessian))
    noise, nonlinearity = control_variate_noise(oracle, centre, scale, random.key(0), rows=curvature_rows(oracle))
    (plate,) = oracle.plates  # the law's noise factor within each of the k shards (one off a mesh)
    noise = noise * law.noise_factor(plate.size // oracle.num_shards, plate.subsample_size // oracle.num_shards)
    # the prior's force at the centre in posterior sds, |Lᵀ ∇U₀(θ̂)|: how far the data pushed the mode
    # against the prior along a direction the prior's curvature shares (control_variates.PRIOR_PULL_WARN)
    prior_grad = jax.grad(oracle.prior_potential)(centre.position)
    pull = jnp.max(jnp.abs(scale.T @ prior_grad if full else scale * prior_grad))
    state = with_adapted(state, control=ControlState(centre, nonlinearity, passes, jnp.zeros((), bool), pull))
    return state, (noise if full else jnp.diagonal(noise)), (hessian if full else jnp.diagonal(hessian))

def start_at_the_centre(theta, state):
    """Before the first sampling block, the chain moves to the centre θ̂ (the mode, where the
    control variates' noise is smallest and sampling starts in the posterior's bulk)."""
    control = state.adapted.control
    theta = jnp.where(control.moved, theta, control.centre.position)
    return theta, with_adapted(state, control=control._replace(moved=jnp.ones((), bool)))

def with_control_variate_gradients(step):
    """``step`` given the oracle of control-variate gradients about ``state.adapted.control.centre``."""

    def wrapped(rng_key, i, theta, state, oracle):
        return step(rng_key, i, theta, state, ControlVariateOracle(oracle, state.adapted.control.centre))

    return wrapped


def with_control_variates(algorithm):
    """The algorithm with control-variate gradients about the centre set at the end of warmup
    (:func:`centre_and_noise`, in ``state.adapted.control``): every sampling step's oracle is a
    :class:`ControlVariateOracle` about θ̂, and the first sampling block starts at θ̂. The one
    place a kernel's sampling is wired to its control variates."""
    return algorithm._replace(sample_step=with_control_variate_gradients(algorithm.sample_step),
                              start_block=start_at_the_centre)
