"""Variational EM / empirical Bayes with constant-rate SG sampling (Mandt et al. 2017, Sec. 3.2).

Algorithm (ALGORITHMS.md, "Variational EM"), for hyperparameters λ = the model's
``numpyro.param`` sites, on their unconstrained scale:

    each SG step t, on one minibatch S_t:
        θ_{t+1} = kernel step at λ_t            (ConstantSGD: θ − H ĝ_S(θ_t; λ_t) at ε*, Eq. 15)
        λ_{t+1} = λ_t − ρ_t ∇_λ Û_S(θ_t; λ_t)   (Eq. 26, a Robbins–Monro step: Σρ = ∞, Σρ² < ∞)

θ samples from q(θ; λ) ≈ p(θ | x, λ) at the kernel's constant rate, so the λ-steps follow
E_q[∇_λ log p(x, θ | λ)], the gradient of the evidence lower bound: the fixed point is the
type-II maximum-likelihood λ when q is the exact posterior.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import random
from numpyro.distributions import biject_to

from .base import MinibatchOracle, SGKernel, is_positive_scalar
from .potential import _FlatView

__all__ = ["VariationalEM", "VariationalEMState", "robbins_monro_rate"]


def robbins_monro_rate(step_size, offset=100.0, decay=0.6):
    """ρ_t = ρ₀ (1 + t/t₀)^(−κ): an optax schedule with Σρ_t = ∞ and Σρ_t² < ∞ for κ ∈ (0.5, 1]."""
    return lambda count: step_size * (1.0 + count / offset) ** (-decay)


class VariationalEMState(NamedTuple):
    """Kernel state of :class:`VariationalEM` (one chain)."""

    #: the wrapped kernel's state
    inner: NamedTuple
    #: λ on the unconstrained scale, flattened (``VariationalEM.hyperparameters`` constrains it)
    hyper: jnp.ndarray
    #: optax state of the λ updates
    hyper_state: tuple


class _RecordingOracle(MinibatchOracle):
    """The oracle of the wrapped kernel, remembering the minibatches it drew (at trace time)."""

    def __init__(self, oracle):
        super().__init__(oracle.potential, oracle.model_args, oracle.model_kwargs, oracle.method, oracle.step,
                         oracle.shuffle_key, params=oracle.params)
        self.draws = []

    def draw(self, rng_key):
        indices = super().draw(rng_key)
        self.draws.append(indices)
        return indices


class VariationalEM(SGKernel):
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
    ρ_t (decreasing)            ``hyper_step_size`` ρ₀, ``hyper_offset`` t₀, ``hyper_decay`` κ:
                                ρ_t = ρ₀ (1 + t/t₀)^(−κ) (:func:`robbins_monro_rate`)
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

    **Outputs.** ``kernel.hyperparameters(mcmc.last_state)`` returns the final λ on the
    constrained scale as a dict keyed by param name (a leading chain dimension with
    ``chain_method="vectorized"``; with ``"sequential"``/``"parallel"`` chains
    ``mcmc.last_state`` is stacked the same way). The trajectory: run with
    ``extra_fields=("kernel_state.hyper",)`` and pass
    ``mcmc.get_extra_fields(group_by_chain=True)["kernel_state.hyper"]`` to
    :meth:`hyperparameters` (any leading shape). Deterministic sites returned with the samples
    are computed with the params at their init values.

    :param SGKernel kernel: a kernel of this package, constructed on the model.
    :param float hyper_step_size: ρ₀ > 0 (default 0.05).
    :param float hyper_offset: t₀ > 0 in SG steps (default 100).
    :param float hyper_decay: κ ∈ (0.5, 1] (default 0.6).
    :param hyper_optimizer: optional optax ``GradientTransformation`` replacing the default update.
    """

    def __init__(self, kernel, hyper_step_size=0.05, *, hyper_offset=100.0, hyper_decay=0.6, hyper_optimizer=None):
        if not isinstance(kernel, SGKernel) or isinstance(kernel, VariationalEM):
            raise TypeError(
                "VariationalEM: `kernel` must be a numpyro_sgd kernel built on the model, e.g. "
                f"VariationalEM(ConstantSGD(model)); got {type(kernel).__name__}."
            )
        if not is_positive_scalar(hyper_step_size):
            raise ValueError(f"VariationalEM: hyper_step_size (ρ₀) must be a positive float, got {hyper_step_size!r}.")
        if not is_positive_scalar(hyper_offset):
            raise ValueError(f"VariationalEM: hyper_offset (t₀) must be a positive float, got {hyper_offset!r}.")
        if not 0.5 < hyper_decay <= 1:
            raise ValueError(
                f"VariationalEM: hyper_decay (κ) must lie in (0.5, 1] for a Robbins–Monro schedule "
                f"(Σρ = ∞, Σρ² < ∞), got {hyper_decay!r}."
            )
        if hyper_optimizer is not None and not isinstance(hyper_optimizer, optax.GradientTransformation):
            raise TypeError("VariationalEM: hyper_optimizer must be an optax GradientTransformation.")
        super().__init__(kernel._model, steps_per_sample=kernel._steps_per_sample, subsample=kernel._subsample,
                         warmup_subsample=kernel._warmup_subsample, init_strategy=kernel._init_strategy)
        self._inner = kernel
        self._rate = (float(hyper_step_size), float(hyper_offset), float(hyper_decay))
        self._hyper_optimizer = hyper_optimizer
        self._hyper_view = None

    @property
    def inner_kernel(self):
        """The wrapped kernel."""
        return self._inner

    @property
    def _adapts(self):
        return self._inner._adapts

    def _optimizer(self):  # built on demand: optax transformations hold closures and do not pickle
        if self._hyper_optimizer is not None:
            return self._hyper_optimizer
        return optax.chain(optax.scale_by_adam(b1=0.0, b2=0.99),
                           optax.scale_by_schedule(lambda t: -robbins_monro_rate(*self._rate)(t)))

    # ------------------------------------------------------------------ setup
    def _resolve_steps_per_sample(self, potential):
        self._inner._potential = potential
        k = self._inner._resolve_steps_per_sample(potential)
        self._inner._steps_per_sample = k
        return k

    def _check_setup(self, potential, num_warmup_steps):
        if not potential.param_values:
            raise ValueError(
                "VariationalEM: the model has no numpyro.param site to fit. Declare each hyperparameter "
                "with numpyro.param(name, init_value, constraint=...) (e.g. a prior precision with "
                "constraints.positive), or run the kernel without VariationalEM."
            )
        self._inner._check_setup(potential, num_warmup_steps)
        unconstrained = {k: biject_to(potential.param_constraints[k]).inv(jnp.asarray(v))
                         for k, v in potential.param_values.items()}
        self._hyper_view = _FlatView(unconstrained)

    def _init_kernel_state(self, rng_key, theta, potential, num_warmup_steps):
        pv = potential.param_values
        hyper = self._hyper_view.ravel(
            {k: biject_to(potential.param_constraints[k]).inv(jnp.asarray(v, theta.dtype)) for k, v in pv.items()}
        ).astype(theta.dtype)
        inner = self._inner._init_kernel_state(rng_key, theta, potential, num_warmup_steps)
        return VariationalEMState(inner=inner, hyper=hyper, hyper_state=self._optimizer().init(hyper))

    # ------------------------------------------------------------------ λ
    def _constrain(self, hyper):
        unconstrained = self._hyper_view.unravel(hyper)
        return {k: biject_to(self.potential.param_constraints[k])(v) for k, v in unconstrained.items()}

    def _params_of(self, state):
        return self._constrain(state.kernel_state.hyper)

    def hyperparameters(self, state_or_trace):
        """λ on the constrained scale, ``{param name: value}``.

        :param state_or_trace: a state (``mcmc.last_state``; vectorized chains give a leading
            chain dimension) or an array of flattened unconstrained λ with any leading shape
            (the extra field ``"kernel_state.hyper"``).
        """
        hyper = state_or_trace.kernel_state.hyper if hasattr(state_or_trace, "kernel_state") else state_or_trace
        hyper = jnp.asarray(hyper)
        lead = hyper.shape[:-1]
        flat = hyper.reshape((-1, hyper.shape[-1]))
        out = jax.vmap(self._constrain)(flat)
        return {k: v.reshape(lead + v.shape[1:]) for k, v in out.items()}

    # ------------------------------------------------------------------ dynamics
    def _hyper_step(self, ks, theta, indices, oracle):
        """λ ← λ − ρ_t ∇_λ Û_S(θ; λ) on ``indices`` (Eq. 26), through the optax update."""
        potential, args, kwargs = oracle.potential, oracle.model_args, oracle.model_kwargs

        def minibatch_potential(hyper):
            return potential.potential(theta, indices, args, kwargs, self._constrain(hyper))

        grad = jax.grad(minibatch_potential)(ks.hyper)
        updates, hyper_state = self._optimizer().update(grad, ks.hyper_state, ks.hyper)
        return ks._replace(hyper=optax.apply_updates(ks.hyper, updates), hyper_state=hyper_state)

    def _warmup_update(self, rng_key, step, theta, ks, oracle):
        # λ is held during warmup: the kernel optimises θ there (Adam, mode finding), and a joint
        # (θ, λ) ascent is the joint MAP, which runs off to λ → ∞ when the data are weak
        new_theta, inner, pe, evals = self._inner._warmup_update(rng_key, step, theta, ks.inner, oracle)
        return new_theta, ks._replace(inner=inner), pe, evals

    def _sample_update(self, rng_key, step, theta, ks, oracle):
        recording = _RecordingOracle(oracle)
        new_theta, inner, pe, evals = self._inner._sample_update(rng_key, step, theta, ks.inner, recording)
        ks = ks._replace(inner=inner)
        if not self._inner._iterates_are_samples:
            return new_theta, ks, pe, evals  # λ moves once per returned sample (_end_block)
        # Eq. 26: the same minibatch and θ_t as the θ-step when the kernel drew exactly one
        indices = recording.draws[0] if len(recording.draws) == 1 else oracle.draw(random.fold_in(rng_key, 7))
        return new_theta, self._hyper_step(ks, theta, indices, oracle), pe, evals + oracle.batch_size

    def _end_warmup(self, ks, theta, oracle):
        return ks._replace(inner=self._inner._end_warmup(ks.inner, theta, oracle))

    def _inner_state(self, state):
        return state._replace(kernel_state=state.kernel_state.inner)

    def _outer_state(self, inner, state):
        return inner._replace(kernel_state=state.kernel_state._replace(inner=inner.kernel_state))

    def _begin_block(self, state, model_args, model_kwargs):
        inner = self._inner._begin_block(self._inner_state(state), model_args, model_kwargs)
        return self._outer_state(inner, state)

    def _sample_hyper_step(self, state, model_args, model_kwargs):
        """One λ-step at the returned sample (kernels whose iterates are not posterior draws)."""
        oracle = MinibatchOracle(self.potential, model_args, model_kwargs, self._subsample, state.i,
                                 random.wrap_key_data(state.shuffle_key), params=self._params_of(state))
        key, k_idx = random.split(state.rng_key)
        ks = self._hyper_step(state.kernel_state, self.potential.view.ravel(state.z), oracle.draw(k_idx), oracle)
        rem = state.grad_evals_in_pass + oracle.batch_size
        return state._replace(kernel_state=ks, rng_key=key, grad_evals_in_pass=rem % state.num_data,
                              data_passes_done=state.data_passes_done + rem // state.num_data)

    def _end_block(self, state, sampling, model_args, model_kwargs):
        inner = self._inner._end_block(self._inner_state(state), sampling, model_args, model_kwargs)
        state = self._outer_state(inner, state)
        over_chains = jax.vmap if jnp.ndim(state.i) > 0 else (lambda f: f)
        first = sampling[0] if jnp.ndim(sampling) > 0 else sampling

        def per_sample(s):
            if not self._inner._iterates_are_samples:
                s = self._sample_hyper_step(s, model_args, model_kwargs)
            # re-tune the kernel at the current λ (the prior curvature in ConstantSGD's ε*/P and
            # SGFS's M, IASG's ε; the warmup noise estimate is kept)
            return self._freeze(s, model_args, model_kwargs) if self._adapts else s

        if self._adapts or not self._inner._iterates_are_samples:
            state = jax.lax.cond(first, over_chains(per_sample), lambda s: s, state)
        return state

    def _diagnostics(self, ks):
        text = self._inner._diagnostics(ks.inner)
        values = ", ".join(f"{k} {float(jnp.ravel(v)[0]):.3g}" for k, v in self._constrain(ks.hyper).items())
        return f"{text}, {values}" if text else values
