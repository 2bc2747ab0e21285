"""The base :class:`~numpyro.infer.mcmc.MCMCKernel` shared by every stochastic-gradient kernel.

A kernel subclasses :class:`SGKernel` and supplies four pure, per-chain functions

* ``_init_kernel_state(rng_key, theta, potential, num_warmup_steps) -> NamedTuple``
* ``_warmup_update(rng_key, step, theta, kernel_state, oracle) -> (theta, kernel_state, potential, evals)``
* ``_sample_update(...)`` with the same signature (the frozen sampling dynamics)
* ``_end_warmup(kernel_state, theta, oracle) -> kernel_state`` (freeze the adapted quantities)

``oracle`` is a :class:`MinibatchOracle`: it draws indices and evaluates minibatch
potentials/gradients of the user's model; ``evals`` is the number of per-datum gradient
evaluations the update used (for data-pass accounting).

The base does everything else: model tracing and validation (:mod:`~numpyro_sgd.potential`),
initial values, vectorized chains, ``steps_per_sample`` SG steps per returned sample inside one
compiled loop, data-pass counting, rejection of non-finite steps, postprocessing to the
constrained space, diagnostics and pickling.
"""

from __future__ import annotations

import time
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import find_stack_level, is_prng_key

from .potential import SUBSAMPLE_METHODS, SubsampledPotential, _SetPlateIndices

__all__ = ["SGState", "SGKernel", "MinibatchOracle", "is_positive_scalar"]


class SGState(NamedTuple):
    """State of every stochastic-gradient kernel of this package (one chain).

    With ``chain_method="vectorized"`` every field gains a leading chain dimension.
    """

    #: number of SG steps taken (warmup included); with ``steps_per_sample=k`` a returned sample
    #: advances it by k
    i: jnp.ndarray
    #: dict of unconstrained latent values (the MCMC sample field)
    z: dict
    #: minibatch potential Û_S at the point where the last gradient was taken
    potential_energy: jnp.ndarray
    #: completed passes over the data (per-datum gradient evaluations // N)
    data_passes_done: jnp.ndarray
    #: per-datum gradient evaluations in the current pass (remainder, < N)
    grad_evals_in_pass: jnp.ndarray
    #: N = Σ over subsample plates of the plate size (a data pass is N per-datum gradients)
    num_data: jnp.ndarray
    #: number of SG steps rejected because the potential, gradient or new state was non-finite
    num_divergences: jnp.ndarray
    #: the first rejected SG step (-1 if none)
    first_divergence: jnp.ndarray
    #: whether a step since the previous returned sample was rejected
    diverging: jnp.ndarray
    #: number of warmup SG steps (``num_warmup * steps_per_sample``); a tunable, so it lives here
    num_warmup_steps: jnp.ndarray
    #: key of the warmup shuffling permutation (``warmup_subsample="shuffle"``)
    shuffle_key: jnp.ndarray
    #: the kernel's own state (step sizes, preconditioner, momentum, estimators, ...)
    kernel_state: NamedTuple
    rng_key: jnp.ndarray

    @property
    def data_passes(self):
        """Data passes so far: per-datum gradient evaluations / N (exact, no int overflow)."""
        return self.data_passes_done + self.grad_evals_in_pass / self.num_data

    @property
    def num_grad_evals(self):
        """Per-datum gradient evaluations so far (as a float, to avoid int32 overflow)."""
        return self.data_passes_done * 1.0 * self.num_data + self.grad_evals_in_pass


class MinibatchOracle:
    """What a kernel update may ask of the model: indices, minibatch potentials, gradients.

    Bound to the model arguments of the current ``sample`` call (never cached across calls).
    """

    def __init__(self, potential, model_args, model_kwargs, method, step, shuffle_key, params=None):
        self.potential = potential
        self.model_args = model_args
        self.model_kwargs = model_kwargs
        self.method = method
        self.step = step
        self.shuffle_key = shuffle_key
        self.params = params

    @property
    def batch_size(self):
        """Per-datum gradients in one minibatch gradient (Σ_p S_p)."""
        return self.potential.batch_size

    def draw(self, rng_key):
        return self.potential.draw_indices(rng_key, self.method, self.step, self.shuffle_key)

    def potential_and_grad(self, theta, indices):
        return self.potential.potential_and_grad(
            theta, indices, self.model_args, self.model_kwargs, self.params
        )

    def per_example_grads(self, theta, indices):
        return self.potential.per_example_grads(
            theta, indices, self.model_args, self.model_kwargs, self.params
        )

    def prior_hessian(self, theta, diagonal=False):
        """Hessian of the potential without its likelihood terms (prior and Jacobians) at θ."""
        h = jax.hessian(self.potential.prior_potential)(theta, self.model_args, self.model_kwargs, self.params)
        return jnp.diagonal(h) if diagonal else h

    def grad(self, rng_key, theta):
        """Draw a minibatch and return ``(Û_S, ∇Û_S)`` at ``theta``."""
        return self.potential_and_grad(theta, self.draw(rng_key))


def _all_finite(tree, before=None):
    """True if every float leaf is finite (or, given ``before``, no leaf *became* non-finite:
    NaN placeholders such as a not-yet-estimated preconditioner are allowed to stay)."""
    new = jax.tree.leaves(tree)
    old = [None] * len(new) if before is None else jax.tree.leaves(before)
    checks = [
        jnp.all(jnp.isfinite(x) | (False if y is None else ~jnp.isfinite(y)))
        for x, y in zip(new, old)
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
    ]
    return jnp.all(jnp.stack(checks)) if checks else jnp.array(True)


def is_positive_scalar(value):
    """True for a finite real number > 0 given as a Python, NumPy or 0-d JAX scalar (not a bool)."""
    if isinstance(value, bool) or callable(value) or np.ndim(value) != 0:
        return False
    try:
        value = float(value)
    except (TypeError, ValueError):
        return False
    return bool(np.isfinite(value) and value > 0)


def _is_tracer(x):
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(x))


class SGKernel(MCMCKernel):
    """Base class of the stochastic-gradient kernels (see the module docstring).

    :param model: a NumPyro model with at least one ``numpyro.plate(name, N, subsample_size=S)``.
    :param int steps_per_sample: SG steps per returned sample, run inside one compiled loop
        (cheaper Python dispatch; ``num_warmup``/``num_samples`` of MCMC count returned
        samples, so the kernel takes ``num_warmup * steps_per_sample`` warmup SG steps).
    :param str subsample: how sampling-phase minibatches are drawn, ``"with_replacement"``
        (default) or ``"without_replacement"`` (see :data:`~numpyro_sgd.potential.SUBSAMPLE_METHODS`).
    :param str warmup_subsample: how warmup minibatches are drawn; defaults to ``subsample``;
        ``"shuffle"`` (epoch-wise reshuffling) is allowed here only, since it biases the
        stationary law.
    :param init_strategy: NumPyro init strategy for the unconstrained initial values.
    """

    sample_field = "z"
    #: whether warmup differs from sampling (adaptation, then ``_end_warmup``); kernels whose
    #: warmup is plain burn-in set it to False and skip the per-sample phase switch
    _adapts = True
    #: whether every SG iterate is a draw of the sampled law (False for IASG, whose draws are
    #: window averages): wrappers that need posterior draws (VariationalEM) use the returned samples
    _iterates_are_samples = True

    def __init__(self, model, *, steps_per_sample=1, subsample="with_replacement",
                 warmup_subsample=None, init_strategy=init_to_uniform):
        name = type(self).__name__
        if not callable(model):
            raise TypeError(f"{name}: `model` must be a NumPyro model (a callable), got {type(model).__name__}.")
        if not isinstance(steps_per_sample, int) or steps_per_sample < 1:
            raise ValueError(f"{name}: steps_per_sample must be an integer >= 1, got {steps_per_sample!r}.")
        if subsample not in ("with_replacement", "without_replacement"):
            hint = (" 'shuffle' is allowed only as warmup_subsample: reshuffling per epoch makes "
                    "consecutive gradients anticorrelated and shrinks the stationary spread."
                    if subsample == "shuffle" else "")
            raise ValueError(
                f"{name}: subsample={subsample!r} is not supported for sampling; use "
                f"'with_replacement' or 'without_replacement'.{hint}"
            )
        warmup_subsample = subsample if warmup_subsample is None else warmup_subsample
        if warmup_subsample not in SUBSAMPLE_METHODS:
            raise ValueError(f"{name}: warmup_subsample must be one of {SUBSAMPLE_METHODS}, got {warmup_subsample!r}.")
        self._model = model
        self._steps_per_sample = steps_per_sample
        self._subsample = subsample
        self._warmup_subsample = warmup_subsample
        self._init_strategy = init_strategy
        self._potential = None
        self._sample_fn = None
        self._diag_time, self._diag_text = -1.0, ""

    # ------------------------------------------------------------------ protocol
    @property
    def model(self):
        """The model as consumers of a fitted kernel (ArviZ, ``Predictive``) should see it.

        Before :meth:`init` it is the user's model. After it, every subsample plate is set to
        all of its N indices, so ``az.from_numpyro(mcmc)`` and
        ``numpyro.infer.log_likelihood(kernel.model, samples, *args)`` evaluate the full data
        (the pointwise log-likelihood has N columns) instead of failing on a plate that has no
        random key. The kernel itself samples the user's model (:attr:`subsampled_model`).
        """
        if self._potential is None:
            return self._model
        return _SetPlateIndices(self._model, indices=self._potential.full_indices())

    @property
    def subsampled_model(self):
        """The user's model, with its subsample plates."""
        return self._model

    @property
    def default_fields(self):
        return ("z", "diverging")

    @property
    def potential(self):
        """The :class:`~numpyro_sgd.potential.SubsampledPotential` built by :meth:`init`."""
        if self._potential is None:
            raise RuntimeError(f"{type(self).__name__}: call MCMC.run (or kernel.init) first.")
        return self._potential

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_sample_fn"] = None
        return state

    def _check_setup(self, potential, num_warmup_steps):
        """Kernel-specific validation that needs the traced model (override)."""

    def _resolve_steps_per_sample(self, potential):
        """SG steps per returned sample once N and S are known (override; IASG: the window)."""
        return self._steps_per_sample

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        vectorized = not is_prng_key(rng_key)
        if not isinstance(num_warmup, int) and not _is_tracer(num_warmup):
            num_warmup = int(num_warmup)
        first_key = rng_key[0] if vectorized else rng_key
        self._potential = SubsampledPotential.from_model(
            self._model, model_args, model_kwargs, rng_key=first_key,
            init_strategy=self._init_strategy, kernel_name=type(self).__name__,
        )
        potential = self._potential
        self._steps_per_sample = self._resolve_steps_per_sample(potential)
        num_warmup_steps = num_warmup * self._steps_per_sample
        self._check_setup(potential, num_warmup_steps)
        if init_params is not None:
            if hasattr(init_params, "z"):  # numpyro ParamInfo
                init_params = init_params.z
            missing = set(potential.view.names) - set(init_params)
            if missing:
                raise ValueError(
                    f"{type(self).__name__}: init_params lacks the latent sites {sorted(missing)}; "
                    "give unconstrained values for every latent site."
                )

        def init_one(key, z0):
            key, k_init, k_state, k_shuffle, k_pe = random.split(key, 5)
            if z0 is None:
                theta = potential.initial_params(k_init, model_args, model_kwargs, self._init_strategy)
            else:
                theta = potential.view.ravel(z0)
            idx = potential.draw_indices(k_pe)
            pe = potential.potential(theta, idx, model_args, model_kwargs)
            ks = self._init_kernel_state(k_state, theta, potential, num_warmup_steps)
            zero = jnp.zeros((), jnp.int32)
            return SGState(
                i=zero, z=potential.view.unravel(theta), potential_energy=pe,
                data_passes_done=zero, grad_evals_in_pass=zero,
                num_data=jnp.asarray(potential.num_data, jnp.int32),
                num_divergences=zero, first_divergence=zero - 1, diverging=jnp.array(False),
                num_warmup_steps=jnp.asarray(num_warmup_steps, jnp.int32),
                shuffle_key=random.key_data(k_shuffle), kernel_state=ks, rng_key=key,
            )

        if vectorized:
            state = jax.vmap(init_one)(rng_key, init_params)
        else:
            state = init_one(rng_key, init_params)
        if not _is_tracer(state.potential_energy) and not bool(jnp.all(jnp.isfinite(state.potential_energy))):
            raise ValueError(
                f"{type(self).__name__}: the potential is not finite at the initial point; check the "
                "model (e.g. data outside the likelihood's support) or pass another init_strategy / "
                "init_params."
            )
        self._sample_fn = self.sample
        return state

    def postprocess_fn(self, model_args, model_kwargs):
        potential = self.potential
        model_kwargs = {} if model_kwargs is None else model_kwargs

        def postprocess(z):
            return potential.constrain(potential.view.ravel(z), model_args, model_kwargs)

        return postprocess

    # ------------------------------------------------------------------ transition
    def _transition(self, state, model_args, model_kwargs, update, method):
        """One SG step of one chain: ``update`` proposes, the base guards and accounts."""
        potential = self.potential
        key, k_step = random.split(state.rng_key)
        oracle = MinibatchOracle(
            potential, model_args, model_kwargs, method, state.i,
            random.wrap_key_data(state.shuffle_key), params=self._params_of(state),
        )
        theta = potential.view.ravel(state.z)
        new_theta, ks, pe, evals = update(k_step, state.i, theta, state.kernel_state, oracle)
        ok = (jnp.isfinite(pe) & _all_finite(new_theta) & potential.constrained_is_finite(new_theta)
              & _all_finite(ks, state.kernel_state))
        new_theta = jnp.where(ok, new_theta, theta)
        ks = jax.tree.map(lambda new, old: jnp.where(ok, new, old), ks, state.kernel_state)
        rem = state.grad_evals_in_pass + evals
        return state._replace(
            i=state.i + 1,
            z=potential.view.unravel(new_theta),
            potential_energy=jnp.where(ok, pe, state.potential_energy),
            data_passes_done=state.data_passes_done + rem // state.num_data,
            grad_evals_in_pass=rem % state.num_data,
            num_divergences=state.num_divergences + (~ok),
            first_divergence=jnp.where((state.first_divergence < 0) & ~ok, state.i, state.first_divergence),
            diverging=state.diverging | ~ok,
            kernel_state=ks,
            rng_key=key,
        )

    def _params_of(self, state):
        """Values of ``numpyro.param`` sites to substitute (None: the model's init values)."""
        return None

    def sample(self, state, model_args, model_kwargs):
        """``steps_per_sample`` SG steps in one compiled loop.

        The phase (warmup or sampling) is decided once per call and outside the vmap over
        chains (all chains share ``i``): warmup blocks never cost a sampling step anything and
        vice versa. ``num_warmup_steps`` is a multiple of ``steps_per_sample``, so a block never
        straddles the end of warmup; the block that ends warmup freezes the adapted quantities.
        """
        model_kwargs = {} if model_kwargs is None else model_kwargs
        vectorized = jnp.ndim(state.i) > 0
        k = self._steps_per_sample
        over_chains = jax.vmap if vectorized else (lambda f: f)

        def block(update, method):
            def chain(s):
                def step(_, s):
                    return self._transition(s, model_args, model_kwargs, update, method)

                return step(0, s) if k == 1 else lax.fori_loop(0, k, step, s)

            return over_chains(chain)

        def finalize(s):
            return self._freeze(s, model_args, model_kwargs)

        i = state.i[0] if vectorized else state.i
        w = state.num_warmup_steps[0] if vectorized else state.num_warmup_steps

        def warmup(s):
            s = block(self._warmup_update, self._warmup_subsample)(s)
            return lax.cond(i + k >= w, over_chains(finalize), lambda s: s, s)

        state = state._replace(diverging=jnp.zeros_like(state.diverging))
        sampling = state.i >= state.num_warmup_steps
        state = self._begin_block(state, model_args, model_kwargs)
        if not self._adapts and self._warmup_subsample == self._subsample:
            # warmup is plain burn-in with the sampling dynamics: no phase switch at all
            state = block(self._sample_update, self._subsample)(state)
        else:
            state = lax.cond(i < w, warmup, block(self._sample_update, self._subsample), state)
        return self._end_block(state, sampling, model_args, model_kwargs)

    def _freeze(self, state, model_args, model_kwargs):
        """``_end_warmup`` of one chain at its current point and params."""
        oracle = MinibatchOracle(self.potential, model_args, model_kwargs, self._subsample, state.i,
                                 random.wrap_key_data(state.shuffle_key), params=self._params_of(state))
        theta = self.potential.view.ravel(state.z)
        return state._replace(kernel_state=self._end_warmup(state.kernel_state, theta, oracle))

    def _begin_block(self, state, model_args, model_kwargs):
        """Prepare ``state`` (all chains) before the SG steps of one returned sample (override)."""
        return state

    def _end_block(self, state, sampling, model_args, model_kwargs):
        """Turn ``state`` after the SG steps of one returned sample into the returned state
        (override; IASG: the sample field becomes the window's average). ``sampling`` tells, per
        chain, whether the block was a sampling block."""
        return state

    # ------------------------------------------------------------------ reporting
    def _diagnostics(self, kernel_state):
        """Kernel-specific text for the progress bar (override)."""
        return ""

    def get_diagnostics_str(self, state):
        """Progress-bar text, refreshed at most every 0.3 s: reading the state forces a device
        sync, which would otherwise stall the dispatch of every returned sample."""
        now = time.monotonic()
        if jnp.ndim(state.i) > 0 or now - self._diag_time < 0.3:
            return self._diag_text
        self._diag_time = now
        text = f"{float(state.data_passes):.3g} passes, {int(state.num_divergences)} divergences"
        extra = self._diagnostics(state.kernel_state)
        self._diag_text = f"{text}, {extra}" if extra else text
        return self._diag_text

    @staticmethod
    def warn_divergences(state):
        """Raise a Python warning if any step of ``state`` (e.g. ``mcmc.last_state``) was rejected."""
        n = int(jnp.sum(state.num_divergences))
        if n:
            first = jnp.where(state.first_divergence >= 0, state.first_divergence, jnp.iinfo(jnp.int32).max)
            warnings.warn(
                f"{n} SG steps had a non-finite potential, gradient or state and were not taken "
                f"(first at step {int(jnp.min(first))}); lower the step size or check the model.",
                stacklevel=find_stack_level(),
            )
        return n
