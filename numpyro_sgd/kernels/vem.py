"""Variational EM / empirical Bayes with constant-rate SG sampling (Mandt et al. 2017, Sec. 3.2).

Algorithm (Mandt et al. 2017, Sec. 3.2, Eq. 26), for hyperparameters λ = the model's
``numpyro.param`` sites, on their unconstrained scale:

    each SG step t, on one minibatch S_t:
        θ_{t+1} = kernel step at λ_t            (ConstantSGD: θ − H ĝ_S(θ_t; λ_t) at ε*, Eq. 15)
        λ_{t+1} = λ_t − ρ_t ∇_λ Û_S(θ_t; λ_t)   (Eq. 26, a Robbins–Monro step: Σρ = ∞, Σρ² < ∞)

θ samples from q(θ; λ) ≈ p(θ | x, λ) at the kernel's constant rate, so the λ-steps follow
E_q[∇_λ log p(x, θ | λ)], the gradient of the evidence lower bound: the fixed point is the
type-II maximum-likelihood λ when q is the exact posterior.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax, random
from numpyro.distributions import biject_to
from numpyro.util import find_stack_level

from ..driver.wrapper import SGWrapper
from ..model.discovery import FlatView, in_open_support
from ..numerics.schedules import robbins_monro
from ..protocol import SGAlgorithm
from ..validation import check_number, check_positive

__all__ = ["VariationalEM", "VariationalEMState", "variational_em", "robbins_monro_rate"]


def robbins_monro_rate(step_size, offset=100.0, power=0.6):
    """ρ_t = ρ₀ (1 + t/t₀)^(−κ) = ρ₀ t₀^κ (t₀ + t)^(−κ): :func:`~numpyro_sgd.numerics.schedules.robbins_monro`
    with Σρ_t = ∞ and Σρ_t² < ∞ for κ ∈ (0.5, 1]."""
    return robbins_monro(step_size * offset**power, offset, power)


class VariationalEMState(NamedTuple):
    """State of the :func:`variational_em` algorithm (one chain)."""

    #: the wrapped algorithm's state
    inner: NamedTuple
    #: λ on the unconstrained scale, flattened (``VariationalEM.hyperparameters`` constrains it)
    hyper: jnp.ndarray
    #: optax state of the λ updates
    hyper_state: tuple
    #: λ-steps not taken because λ would have left the open support of its constraint (e.g.
    #: exp(log λ) overflowing to inf or underflowing to 0.0) or become non-finite
    num_hyper_rejected: jnp.ndarray


def _hyper_view(potential):
    """Layout of the flat unconstrained λ: every ``numpyro.param`` site of ``potential``."""
    constraints = potential.param_constraints
    return FlatView({k: biject_to(constraints[k]).inv(jnp.asarray(v)) for k, v in potential.param_values.items()})


def constrain_hyper(potential, hyper):
    """Flat unconstrained λ -> ``{param name: constrained value}`` for the params of ``potential``."""
    unconstrained = _hyper_view(potential).unravel(hyper)
    return {k: biject_to(potential.param_constraints[k])(v) for k, v in unconstrained.items()}


def variational_em(inner, potential, *, optimizer):
    """Variational EM around an algorithm (Mandt et al. Eq. 26): the θ-steps of ``inner`` at λ_t,
    then λ_{t+1} = λ_t + optimizer(∇_λ Û_S(θ_t; λ_t)) on the step's minibatch (``info.indices``
    when ``info.one_minibatch``, else a fresh one), where λ are the ``numpyro.param`` sites of
    ``potential`` on their unconstrained scale, starting at the model's init values.

    A λ-step whose new λ is non-finite, whose constrained value leaves the open support of its
    constraint, or whose gradient is non-finite, is not taken: λ keeps its last value, the
    optimizer state advances (so a decreasing rate keeps decreasing; not after a non-finite
    gradient), and ``num_hyper_rejected`` counts it. O(dim λ) per step.

    :param inner: ``potential -> SGAlgorithm``, the wrapped kernel's build
        (:meth:`~numpyro_sgd.SGWrapper.inner_algorithm`).
    :param potential: the model's :class:`~numpyro_sgd.model.potential.SubsampledPotential`.
    :param optimizer: optax ``GradientTransformation`` whose updates are added to λ.
    :return: :class:`~numpyro_sgd.SGAlgorithm` with state :class:`VariationalEMState`.
    """
    inner = inner(potential)
    view = _hyper_view(potential)

    def constrain(hyper):
        return constrain_hyper(potential, hyper)

    def in_support(hyper):
        """Whether every constrained λ lies inside the open support of its constraint (O(dim λ))."""
        unconstrained = view.unravel(hyper)
        checks = [in_open_support(biject_to(potential.param_constraints[k]), u) for k, u in unconstrained.items()]
        return jnp.all(jnp.stack(checks))

    def at(oracle, state):
        return oracle.with_params(constrain(state.hyper))

    def hyper_step(state, theta, indices, oracle):
        """λ ← λ − ρ_t ∇_λ Û_S(θ; λ) on ``indices`` (Eq. 26), through the optax update."""
        grad = jax.grad(lambda h: oracle.with_params(constrain(h)).potential_energy(theta, indices))(state.hyper)
        finite_grad = jnp.all(jnp.isfinite(grad))
        updates, hyper_state = optimizer.update(grad, state.hyper_state, state.hyper)
        hyper = optax.apply_updates(state.hyper, updates)
        ok = finite_grad & jnp.all(jnp.isfinite(hyper)) & in_support(hyper)
        # a rejected λ-step keeps λ (the driver would reject the θ-step of a non-finite λ, and a
        # λ on the edge of its support, e.g. exp(log λ) = inf or 0.0, poisons every later step);
        # the optimizer state advances unless the gradient itself was non-finite
        hyper_state = jax.tree.map(lambda n, o: jnp.where(finite_grad, n, o), hyper_state, state.hyper_state)
        return state._replace(hyper=jnp.where(ok, hyper, state.hyper), hyper_state=hyper_state,
                              num_hyper_rejected=state.num_hyper_rejected + (~ok))

    def init(rng_key, theta, num_warmup_steps):
        hyper = view.ravel({k: biject_to(potential.param_constraints[k]).inv(jnp.asarray(v, theta.dtype))
                            for k, v in potential.param_values.items()}).astype(theta.dtype)
        return VariationalEMState(inner.init(rng_key, theta, num_warmup_steps), hyper, optimizer.init(hyper),
                                  jnp.zeros((), jnp.int32))

    def warmup_step(rng_key, step, theta, state, oracle):
        # λ is held during warmup: the kernel optimises θ there (Adam, mode finding), and a joint
        # (θ, λ) ascent is the joint MAP, which runs off to λ → ∞ when the data are weak
        new_theta, inner_state, info = inner.step(warmup=True)(rng_key, step, theta, state.inner, at(oracle, state))
        return new_theta, state._replace(inner=inner_state), info

    def sample_step(rng_key, step, theta, state, oracle):
        new_theta, inner_state, info = inner.sample_step(rng_key, step, theta, state.inner, at(oracle, state))
        state = state._replace(inner=inner_state)
        if inner.block.summarises:
            return new_theta, state, info  # λ moves once per returned sample (end_block)
        # Eq. 26: the θ-step's minibatch and θ_t when the step used one minibatch of the oracle's
        # law; a step that used several (EWSG's index chain picks a non-uniform one) gets a fresh one
        indices = info.indices if info.one_minibatch else oracle.draw(random.fold_in(rng_key, 7))
        info = info._replace(num_grad_evals=info.num_grad_evals + oracle.batch_size)
        return new_theta, hyper_step(state, theta, indices, oracle), info

    end_warmup = None
    if inner.end_warmup is not None:
        def end_warmup(theta, state, oracle):
            return state._replace(inner=inner.end_warmup(theta, state.inner, at(oracle, state)))

    start_block = None
    if inner.start_block is not None:
        def start_block(theta, state):
            theta, inner_state = inner.start_block(theta, state.inner)
            return theta, state._replace(inner=inner_state)

    def end_block(rng_key, theta, state, oracle, sampling):
        evals = 0
        if inner.end_block is not None:
            rng_key, theta, inner_state, evals = inner.end_block(rng_key, theta, state.inner, at(oracle, state),
                                                                 sampling)
            state = state._replace(inner=inner_state)

        def per_sample(carry):
            key, state, evals = carry
            if inner.block.summarises:  # one λ-step at the returned draw, on a fresh minibatch
                key, k_idx = random.split(key)
                state = hyper_step(state, theta, oracle.draw(k_idx), oracle)
                evals = evals + oracle.batch_size
            if inner.end_warmup is not None:
                # re-tune the kernel at the current λ (the prior curvature in ConstantSGD's ε*/P and
                # SGFS's M, IASG's ε; the warmup noise estimate is kept)
                state = end_warmup(theta, state, oracle)
            return key, state, evals

        rng_key, state, evals = lax.cond(sampling, per_sample, lambda c: c, (rng_key, state, jnp.asarray(evals)))
        return rng_key, theta, state, evals

    needs_block_end = (inner.end_block is not None or inner.end_warmup is not None
                       or inner.block.summarises)

    def describe(state):
        text = inner.describe(state.inner) if inner.describe is not None else ""
        values = ", ".join(f"{k} {float(jnp.ravel(v)[0]):.3g}" for k, v in constrain(state.hyper).items())
        rejected = int(jnp.sum(state.num_hyper_rejected))
        values += f", {rejected} λ-steps rejected" if rejected else ""
        return f"{text}, {values}" if text else values

    # warmup_step always differs from sample_step (λ is held in warmup): never burn-in
    return SGAlgorithm(init, sample_step, warmup_step=warmup_step, end_warmup=end_warmup,
                       block=inner.block.through(lambda s: s.inner), start_block=start_block,
                       end_block=end_block if needs_block_end else None, describe=describe)


class VariationalEM(SGWrapper):
    """Empirical Bayes: fit the model's ``numpyro.param`` sites while ``kernel`` samples θ.

    **References:**

    1. *Stochastic Gradient Descent as Approximate Bayesian Inference*, S. Mandt, M. D. Hoffman,
       D. M. Blei, JMLR 18 (2017): Sec. 3.2 and Eq. 26 (variational EM with constant-rate SGD),
       Sec. 6.3 / Eq. 48 (experiment).

    ==========================  ===============================================================
    paper                       here
    ==========================  ===============================================================
    λ                           every ``numpyro.param`` site, updated on its unconstrained scale
                                (``biject_to(constraint)``), so constraints always hold
    ρ_t (decreasing)            ``hyper_step_size`` ρ₀, ``hyper_offset`` t₀, ``hyper_power`` κ:
                                ρ_t = ρ₀ (1 + t/t₀)^(−κ) (:func:`~numpyro_sgd.kernels.vem.robbins_monro_rate`)
    θ-step at ε*                the wrapped ``kernel`` (ConstantSGD, SGFS, IASG, SGLD, SGHMC, ...)
    ==========================  ===============================================================

    Every sampling-phase SG step the kernel moves θ with λ held fixed, then λ takes one step
    along −∇_λ Û_S(θ_t; λ_t) on the *same* minibatch and at the same θ_t (Eq. 26). If the
    kernel drew several minibatches in the step (EWSG's index chain), λ uses a fresh one. The
    λ gradient costs one more minibatch gradient (counted in ``data_passes``). Choices the
    paper leaves open:

    * λ is held at its init value during warmup. There the kernel *optimises* θ (mode finding),
      and simultaneous λ-steps would be the joint MAP of (θ, λ), which runs off to λ → ∞ when
      the data are weak (measured: the joint MAP gives λ ≈ 10⁵ where the type-II value is 6.3).
    * After every returned sample (``steps_per_sample`` SG steps) the kernel's frozen tuning is
      recomputed at the current λ from its warmup noise estimate (ConstantSGD's ε*/P and SGFS's
      M contain the prior curvature, IASG's ε): without it the chain keeps the spread tuned for
      the initial λ and λ is biased (measured −9.5 % on the weak-data problem of the tests).
    * Kernels whose iterates are not posterior draws (IASG: its draws are window averages)
      take one λ-step per returned sample, at the returned draw, on a fresh minibatch.

    **Default update.** The λ gradient is divided by the root of its running second moment
    (Adam's, β₁ = 0, β₂ = 0.99) before the Robbins–Monro rate is applied: gradients with
    respect to, e.g., a log prior precision scale with D and with N for a likelihood parameter,
    and the normalisation makes ρ₀ a step length in unconstrained units for any model (a
    bounded positive preconditioner does not change the fixed point). Pass ``hyper_optimizer``
    (any optax ``GradientTransformation`` whose updates are *added* to λ, e.g.
    ``optax.sgd(optax.polynomial_schedule(...))``) to replace it.

    **Guard.** A λ-step whose constrained λ would leave the open support of its constraint
    (exp(log λ) overflowing to inf or underflowing to 0.0, e.g. with a far too large
    ``hyper_step_size``) or become non-finite is not taken; ``kernel_state.num_hyper_rejected``
    counts such steps and :meth:`hyperparameters` warns when there are any.

    **Outputs.** ``kernel.hyperparameters(mcmc.last_state)`` returns the final λ on the
    constrained scale as a dict keyed by param name (a leading chain dimension with
    ``chain_method="vectorized"``; with ``"sequential"``/``"parallel"`` chains
    ``mcmc.last_state`` is stacked the same way). The trajectory: run with
    ``extra_fields=("kernel_state.hyper",)`` and pass
    ``mcmc.get_extra_fields(group_by_chain=True)["kernel_state.hyper"]`` to
    :meth:`hyperparameters` (any leading shape). Deterministic sites returned with the samples
    are computed with the params at their init values.

    **Units of** ``hyper_step_size``. ``hyper_step_size`` ρ₀ is a step length in λ's unconstrained units: the
    λ gradient is divided by the root of its running second moment before the Robbins–Monro rate ρ_t = ρ₀ (1 +
    t/t₀)^(−κ) is applied (default update).

    :param SGKernel kernel: a kernel of this package, constructed on the model (its algorithm is
        wrapped by :func:`variational_em`; no private attribute of it is read).
    :param float hyper_step_size: ρ₀ > 0 (default 0.05).
    :param float hyper_offset: t₀ > 0 in SG steps (default 100).
    :param float hyper_power: κ ∈ (0.5, 1] (default 0.6).
    :param hyper_optimizer: optional optax ``GradientTransformation`` replacing the default update.
    """

    def __init__(self, kernel, *, hyper_step_size=0.05, hyper_offset=100.0, hyper_power=0.6, hyper_optimizer=None):
        super().__init__(kernel)
        if getattr(kernel, "control_variates", False):
            raise ValueError(
                "VariationalEM: the kernel's control variates hold the full-data gradient at their centre for the "
                "hyperparameters of the end of warmup; the λ-steps move them, and the gradients would be biased. Use "
                "the kernel with control_variates=False inside VariationalEM.")
        check_positive("VariationalEM", "hyper_step_size", hyper_step_size, "a positive float (ρ₀)")
        check_positive("VariationalEM", "hyper_offset", hyper_offset, "a positive float (t₀)")
        if not 0.5 < check_number("VariationalEM", "hyper_power", hyper_power) <= 1:
            raise ValueError(
                f"VariationalEM: hyper_power (κ) must lie in (0.5, 1] for a Robbins–Monro schedule "
                f"(Σρ = ∞, Σρ² < ∞), got {hyper_power!r}."
            )
        if hyper_optimizer is not None and not isinstance(hyper_optimizer, optax.GradientTransformation):
            raise TypeError("VariationalEM: hyper_optimizer must be an optax GradientTransformation.")
        self._rate = (float(hyper_step_size), float(hyper_offset), float(hyper_power))
        self._hyper_optimizer = hyper_optimizer

    def _optimizer(self):  # built on demand: optax transformations hold closures and do not pickle
        if self._hyper_optimizer is not None:
            return self._hyper_optimizer
        return optax.chain(optax.scale_by_adam(b1=0.0, b2=0.99),
                           optax.scale_by_schedule(lambda t: -robbins_monro_rate(*self._rate)(t)))

    def _build(self, potential, adapt_steps_per_sample=True):
        if not potential.param_values:
            raise ValueError(
                "VariationalEM: the model has no numpyro.param site to fit. Declare each hyperparameter "
                "with numpyro.param(name, init_value, constraint=...) (e.g. a prior precision with "
                "constraints.positive), or run the kernel without VariationalEM."
            )
        return variational_em(self.inner_algorithm, potential, optimizer=self._optimizer())

    def hyperparameters(self, state_or_trace):
        """λ on the constrained scale, ``{param name: value}``.

        Given a state whose λ-steps were partly rejected (λ would have left the open support of
        its constraint, e.g. exp(log λ) = inf or 0.0: usually a ``hyper_step_size`` too large), a
        ``UserWarning`` says how many; λ is then the last accepted value.

        :param state_or_trace: a state (``mcmc.last_state``; vectorized chains give a leading
            chain dimension), an array of flattened unconstrained λ with any leading shape (the
            extra field ``"kernel_state.hyper"``), or the dict ``mcmc.get_extra_fields()`` holding
            that field.
        """
        name = "VariationalEM.hyperparameters"
        if isinstance(state_or_trace, dict):
            if "kernel_state.hyper" not in state_or_trace:
                raise TypeError(
                    f"{name}: got a dict with keys {sorted(state_or_trace)}; pass mcmc.last_state, or the λ trace "
                    "mcmc.get_extra_fields()['kernel_state.hyper'] of a run with extra_fields=('kernel_state.hyper',) "
                    "(a dict of constrained values is already λ: nothing to convert).")
            state_or_trace = state_or_trace["kernel_state.hyper"]
        if hasattr(state_or_trace, "kernel_state"):
            ks = state_or_trace.kernel_state
            if not hasattr(ks, "hyper"):
                raise TypeError(f"{name}: the state is not a VariationalEM state (its kernel_state has no λ).")
            rejected = int(np.sum(np.asarray(ks.num_hyper_rejected)))
            if rejected:
                steps = int(np.sum(np.maximum(np.asarray(state_or_trace.i) - np.asarray(
                    state_or_trace.num_warmup_steps), 0)))
                warnings.warn(
                    f"VariationalEM: {rejected} λ-steps were rejected (in {steps} sampling SG steps): λ would have "
                    "left the open support "
                    "of its constraint (e.g. exp(log λ) = inf or 0.0) or become non-finite, so λ is its last accepted "
                    "value, not a converged one. Lower hyper_step_size (ρ₀ is a step length on λ's unconstrained "
                    "scale; the default is 0.05) or pass a gentler hyper_optimizer.",
                    UserWarning, stacklevel=find_stack_level())
            state_or_trace = ks.hyper
        hyper = jnp.asarray(state_or_trace)
        lead = hyper.shape[:-1]
        flat = hyper.reshape((-1, hyper.shape[-1]))
        out = jax.vmap(lambda h: constrain_hyper(self.potential, h))(flat)
        return {k: v.reshape(lead + v.shape[1:]) for k, v in out.items()}
