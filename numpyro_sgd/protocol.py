"""The protocol between the driver and the algorithms: :class:`SGAlgorithm` (what an algorithm
provides, with :class:`SampleBlock`), :class:`StepInfo` (what one of its steps reports) and
:class:`SGState` (the driver's per-chain state). The bottom of the package's layering: it imports nothing of the package, so
the algorithms, the warmup adapter and the driver (:mod:`numpyro_sgd.driver.kernel`) all import it.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

__all__ = ["SampleBlock", "SGAlgorithm", "SGState", "StepInfo", "count_grad_evals", "finite", "guard",
           "changed_finite", "self_guarded", "initial_state", "pick_chain", "CHAINS", "mean_over_chains"]

#: the name of the vectorized chains' axis in the driver's loop (``jax.vmap(..., axis_name=CHAINS)``,
#: :func:`numpyro_sgd.driver.loop.iteration`)
CHAINS = "chains"


def mean_over_chains(x):
    """The mean of ``x`` over the vectorized chains, one value for all of them (unbatched, so what
    is computed from it is computed once), inside the driver's loop; ``x`` itself for one chain,
    for sequential chains and under ``pmap``."""
    try:
        return jax.lax.pmean(x, CHAINS)
    except NameError:  # no vectorized chains here
        return x


class StepInfo(NamedTuple):
    """What one algorithm step reports besides its new position and state."""

    #: minibatch potential Û_S at the point where the gradient was taken
    potential_energy: jnp.ndarray
    #: per-datum gradient evaluations the step used (data-pass accounting)
    num_grad_evals: jnp.ndarray
    #: ``{plate: indices}`` of the minibatch whose gradient moved θ
    indices: dict
    #: whether θ moved on the gradient of the one minibatch ``indices``, drawn by the oracle's
    #: law (a Python bool): a wrapper may then reuse that minibatch (VariationalEM's λ-step,
    #: Mandt Eq. 26). False when the step drew several minibatches or chose one by its own rule
    #: (EWSG's index chain).
    one_minibatch: bool


class SampleBlock(NamedTuple):
    """How many SG steps make one returned sample, and what the sample is: the one field of
    :class:`SGAlgorithm` the driver reads the steps per sample from (``SGKernel._block_steps``).

    The driver takes, in this order: ``steps`` when the sample summarises the block (the user
    cannot change it); the user's ``steps_per_sample``; in the sampling phase, ``chosen``; then
    ``steps``; then 1.
    """

    #: SG steps one returned sample needs: the relaxation time of the sampled chain (about N/S
    #: for the KL-optimal kernels) or, for a summarising block, its length (IASG's window T);
    #: None: unknown (1 step, and a warmup iteration takes as many steps as a sampling one)
    steps: Optional[int] = None
    #: ``state -> int32``: the steps per sample the algorithm chose at the end of warmup (at
    #: least ``steps``; ConstantSGD-full measures its relaxation time); None: ``steps``
    chosen: Optional[Callable] = None
    #: whether a returned sample summarises its block (IASG: the mean of the window's iterates):
    #: the block's length is then the algorithm's, and its iterates are not posterior draws, so a
    #: wrapper that needs draws (VariationalEM's λ-step, SGWithinGibbs's φ given z) takes one
    #: returned sample instead or refuses the algorithm
    summarises: bool = False
    #: ``kernel_state -> float`` (NumPy, on the host, any leading chain axis), or a
    #: :class:`~numpyro_sgd.adaptation.relaxation.PredictedRelaxation` (the times and a sentence naming their
    #: cause): the integrated autocorrelation time, in SG steps, that the steps chosen at the end
    #: of warmup predict for the slowest direction (the Langevin kernels' default steps,
    #: ConstantSGD's scalar, diagonal and sqrt preconditioners); the driver warns at the end of
    #: warmup when the run is too short for it. None: not predicted (kernels whose steps per
    #: sample are their relaxation time, which ``steps`` and ``chosen`` already say)
    relaxation: Optional[Callable] = None

    def through(self, inner):
        """This block for a wrapper whose kernel state holds the wrapped algorithm's state at
        ``inner(state)``: ``chosen`` and ``relaxation`` read that state."""

        def compose(read):
            return None if read is None else (lambda state: read(inner(state)))

        return self._replace(chosen=compose(self.chosen), relaxation=compose(self.relaxation))


class SGAlgorithm(NamedTuple):
    """A stochastic-gradient algorithm as pure per-chain functions (see the module docstring).

    ``docs/internals.md`` lists every field with the reason it exists.
    """

    #: ``(rng_key, theta, num_warmup_steps) -> state``: the algorithm's state of one chain
    init: Callable
    #: ``(rng_key, step, theta, state, oracle) -> (theta, state, StepInfo)``: one sampling step
    sample_step: Callable
    #: the same for a warmup step; None: warmup is burn-in, the sampling step run before the
    #: draws are kept (see :attr:`burn_in`)
    warmup_step: Optional[Callable] = None
    #: ``(theta, state, oracle) -> state``: freeze what warmup adapted (None: nothing is adapted)
    end_warmup: Optional[Callable] = None
    #: the SG steps per returned sample (:class:`SampleBlock`)
    block: SampleBlock = SampleBlock()
    #: ``(theta, state) -> (theta, state)`` before the steps of one returned sample
    start_block: Optional[Callable] = None
    #: ``(rng_key, theta, state, oracle, sampling) -> (rng_key, theta, state, num_grad_evals)``
    #: after them: the returned θ (IASG: the window's average) and state; ``sampling`` tells if
    #: the block was a sampling block; an ``end_block`` that draws random numbers splits
    #: ``rng_key`` and returns the key to continue with
    end_block: Optional[Callable] = None
    #: ``state -> str``: kernel-specific progress-bar text
    describe: Optional[Callable] = None

    @property
    def burn_in(self):
        """Whether warmup adapts nothing: no warmup step of its own, nothing frozen at its end and
        no steps per sample chosen there. The driver then runs warmup as sampling iterations in
        NumPyro's one compiled loop, instead of as a program of its own inside ``init``."""
        return self.warmup_step is None and self.end_warmup is None and self.block.chosen is None

    def step(self, warmup):
        """The step of the phase: ``warmup_step`` in warmup (the sampling step if it is None)."""
        return self.warmup_step if warmup and self.warmup_step is not None else self.sample_step


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
    #: number of warmup SG steps (``num_warmup`` × the warmup steps per iteration, see
    #: :class:`SGKernel`'s ``warmup_passes``)
    num_warmup_steps: jnp.ndarray
    #: key of the warmup shuffling permutation (``warmup_subsample="shuffle"``)
    shuffle_key: jnp.ndarray
    #: the algorithm's own state (step sizes, preconditioner, momentum, warmup estimators, ...)
    kernel_state: NamedTuple
    rng_key: jnp.ndarray
    #: MCMC iterations still to pass through unchanged: warmup runs inside :meth:`SGKernel.init`
    #: (its own compiled program), so NumPyro's ``num_warmup`` warmup iterations return the
    #: post-warmup state as it is (0 once they are done, and for a burn-in-only warmup)
    idle_iterations: jnp.ndarray

    @property
    def data_passes(self):
        """Data passes so far: per-datum gradient evaluations / N (exact, no int overflow)."""
        return self.data_passes_done + self.grad_evals_in_pass / self.num_data

    @property
    def num_grad_evals(self):
        """Per-datum gradient evaluations so far (as a float, to avoid int32 overflow)."""
        return self.data_passes_done * 1.0 * self.num_data + self.grad_evals_in_pass


# ---------------------------------------------------------------------------- the driver's guards
def count_grad_evals(state, evals):
    """Add ``evals`` per-datum gradient evaluations to the data-pass count (exact, no int overflow)."""
    rem = state.grad_evals_in_pass + evals
    return state._replace(data_passes_done=state.data_passes_done + rem // state.num_data,
                          grad_evals_in_pass=rem % state.num_data)


def finite(x, before=None):
    """Whether a float array is finite (given ``before``: whether no entry *became* non-finite)."""
    if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
        return jnp.array(True)
    ok = jnp.isfinite(x) if before is None else jnp.isfinite(x) | ~jnp.isfinite(before)
    return jnp.all(ok)


_SELF_GUARDED = []


def self_guarded(cls):
    """Class decorator: parts of an algorithm's state of this (pytree) type are validated by the
    algorithm itself, and the driver neither checks them nor rolls them back when a step is
    rejected. For large state that a step may rebuild but that has its own acceptance rule (the
    centre of the control variates for group latents: a rejected SG step does not undo a centre
    search, and checking and selecting its O(G D_g) curvature at every step cost a quarter of the
    step at G = 10⁵)."""
    _SELF_GUARDED.append(cls)
    return cls


def _flat(state):
    return jax.tree.flatten(state, is_leaf=lambda x: isinstance(x, tuple(_SELF_GUARDED)))


def _guarded_by_driver(leaf):
    return not isinstance(leaf, tuple(_SELF_GUARDED))


def guard(ok, new_state, old_state):
    """Per leaf: the old value where the step was rejected, but only for leaves the step changed
    (and not for :func:`self_guarded` parts, taken as the step returns them)."""
    new_leaves, treedef = _flat(new_state)
    old_leaves = _flat(old_state)[0]
    out = [n if n is o or not _guarded_by_driver(n) else jnp.where(ok, n, o) for n, o in zip(new_leaves, old_leaves)]
    return jax.tree.unflatten(treedef, out)


def changed_finite(new_state, old_state):
    """Whether no leaf the step changed became non-finite (:func:`self_guarded` parts not read)."""
    checks = [finite(n, o) for n, o in zip(_flat(new_state)[0], _flat(old_state)[0])
              if n is not o and _guarded_by_driver(n)]
    return jnp.all(jnp.stack(checks)) if checks else jnp.array(True)


def initial_state(potential, algorithm, rng_key, z0, model_args, model_kwargs, num_warmup_steps, init_strategy):
    """One chain's :class:`SGState` at the start: θ from ``init_strategy`` (or the unconstrained
    ``z0``), its minibatch potential, the algorithm's state, zero counters. The chain key splits
    into ``key, k_init, k_state, k_shuffle, k_pe`` (initial point, ``algorithm.init``, warmup
    shuffling, the initial potential); every SG step then splits ``key, k_step = split(key)``."""
    from jax import random

    key, k_init, k_state, k_shuffle, k_pe = random.split(rng_key, 5)
    if z0 is None:
        theta = potential.initial_params(k_init, model_args, model_kwargs, init_strategy)
    else:
        theta = potential.view.ravel(z0)
    pe = potential.potential(theta, potential.draw_indices(k_pe), model_args, model_kwargs)
    zero = jnp.zeros((), jnp.int32)
    return SGState(
        i=zero, z=potential.view.unravel(theta), potential_energy=pe,
        data_passes_done=zero, grad_evals_in_pass=zero,
        num_data=jnp.asarray(potential.num_data, jnp.int32),
        num_divergences=zero, first_divergence=zero - 1, diverging=jnp.array(False),
        num_warmup_steps=jnp.asarray(num_warmup_steps, jnp.int32),
        shuffle_key=random.key_data(k_shuffle),
        kernel_state=algorithm.init(k_state, theta, num_warmup_steps), rng_key=key, idle_iterations=zero,
    )


def pick_chain(state, chain=0):
    """The fields of a (possibly vectorized) :class:`SGState` or kernel state for one chain."""
    vectorized = jnp.ndim(state.i) > 0 if hasattr(state, "i") else False
    return jax.tree.map(lambda x: x[chain], state) if vectorized else state
