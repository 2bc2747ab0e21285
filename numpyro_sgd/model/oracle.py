"""What an algorithm step may ask of the model: :class:`MinibatchOracle` (indices, minibatch
potentials and gradients, per-example gradients, Hessian estimates), built at trace time over a
:class:`~numpyro_sgd.model.potential.SubsampledPotential` and one call's model arguments.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import random


def grad_and_hessian(fn, theta):
    """(∇fn(θ), ∇²fn(θ)) in one trace of ``fn``: the JVP of the gradient along each basis vector."""
    basis = jnp.eye(theta.shape[0], dtype=theta.dtype)
    grads, columns = jax.vmap(lambda e: jax.jvp(jax.grad(fn), (theta,), (e,)))(basis)
    return grads[0], columns


#: rows over which :meth:`MinibatchOracle.hessian_estimate` averages minibatch Hessians, and the
#: seed of the minibatches it draws
HESSIAN_ROWS = 4096


HESSIAN_SEED = 2017


class MinibatchOracle:
    """What an algorithm step may ask of the model: minibatch indices, minibatch potentials and
    gradients, per-example gradients and the prior's Hessian.

    A :class:`SubsampledPotential` bound to the model arguments of one ``sample`` call (never
    cached across calls), to how indices are drawn (``method``; ``"shuffle"`` needs the SG
    ``step`` and ``shuffle_key``) and to the values of ``numpyro.param`` sites (``params``; None:
    the model's init values). Built at trace time; it holds no state of its own.
    """

    def __init__(self, potential, model_args=(), model_kwargs=None, method="with_replacement", step=None,
                 shuffle_key=None, params=None, num_warmup_steps=None):
        self.potential = potential
        #: warmup SG steps of the run (set by the driver, the same for every chain, so that an
        #: algorithm's phase switch on it stays a branch under vmap; None: not known)
        self.num_warmup_steps = num_warmup_steps
        self.model_args = model_args
        self.model_kwargs = {} if model_kwargs is None else model_kwargs
        self.method = method
        self.step = step
        self.shuffle_key = shuffle_key
        self.params = params

    def _arguments(self):
        """The constructor arguments of this oracle (a subclass adds its own)."""
        return dict(potential=self.potential, model_args=self.model_args, model_kwargs=self.model_kwargs,
                    method=self.method, step=self.step, shuffle_key=self.shuffle_key, params=self.params,
                    num_warmup_steps=self.num_warmup_steps)

    def _variant(self, **changes):
        return type(self)(**{**self._arguments(), **changes})

    def with_params(self, params):
        """The same oracle with the ``numpyro.param`` sites set to ``params``."""
        return self._variant(params=params)

    def conditioned(self, potential, values):
        """The same oracle (model arguments, minibatch law, step; a subclass keeps its own layout,
        e.g. :class:`~numpyro_sgd.model.sharding.DataParallelOracle` its mesh) on ``potential``, a
        ``SubsampledPotential.restricted`` potential of the same model,
        with the sites it does not sample fixed at ``values`` (constrained; added to the
        ``numpyro.param`` values).

        :param potential: the restricted potential.
        :param dict values: ``{site: constrained value}`` for the sites left out of ``potential``.
        """
        params = dict(values) if self.params is None else {**self.params, **values}
        return self._variant(potential=potential, params=params)

    @property
    def batch_size(self):
        """Per-datum gradients in one minibatch gradient (Σ_p S_p)."""
        return self.potential.batch_size

    @property
    def num_data(self):
        """N = Σ_p N_p."""
        return self.potential.num_data

    @property
    def plates(self):
        return self.potential.plates

    def draw(self, rng_key):
        """Fresh minibatch indices ``{plate: int32[S]}``."""
        return self.potential.draw_indices(rng_key, self.method, self.step, self.shuffle_key)

    def potential_energy(self, theta, indices):
        """Û_S(θ) on ``indices``."""
        return self.potential.potential(theta, indices, self.model_args, self.model_kwargs, self.params)

    def likelihood_energy(self, theta, indices):
        """Û_S(θ) on ``indices`` without its prior and Jacobian terms
        (:meth:`~numpyro_sgd.SubsampledPotential.likelihood`)."""
        return self.potential.likelihood(theta, indices, self.model_args, self.model_kwargs, self.params)

    def potential_and_grad(self, theta, indices):
        """(Û_S(θ), ∇Û_S(θ)) on ``indices``."""
        return self.potential.potential_and_grad(theta, indices, self.model_args, self.model_kwargs, self.params)

    def per_example_grads(self, theta, indices):
        """Û_S, ∇Û_S and, per plate, the S × D single-example gradients
        (:meth:`~numpyro_sgd.SubsampledPotential.per_example_grads`)."""
        return self.potential.per_example_grads(theta, indices, self.model_args, self.model_kwargs, self.params)

    def prior_potential(self, theta):
        """The potential without its likelihood terms (prior and Jacobians) at θ; reads no data."""
        return self.potential.prior_potential(theta, self.model_args, self.model_kwargs, self.params)

    def prior_hessian(self, theta, diagonal=False):
        """Hessian of the potential without its likelihood terms (prior and Jacobians) at θ."""
        h = jax.hessian(self.prior_potential)(theta)
        return jnp.diagonal(h) if diagonal else h

    def fixed_batch(self, rows=HESSIAN_ROWS, seed=HESSIAN_SEED, max_batches=16):
        """Indices of m = ⌈rows/S⌉ (at most ``max_batches``; None: no cap) minibatches drawn with
        the fixed key ``seed``, joined into one minibatch of m·S_p rows per plate (the plate's
        scale becomes N_p/(m·S_p)): the same rows for every chain and every call, drawn from
        nothing of the chain's key stream, so what is estimated on them leaves a run's draws as
        they were. ``Û_B = potential_energy(θ, fixed_batch())`` is an unbiased estimate of U(θ)
        and a deterministic function of θ."""
        m = max(1, -(-rows // self.batch_size))
        m = m if max_batches is None else min(max_batches, m)
        stacked = jax.vmap(self.draw)(random.split(random.PRNGKey(seed), m))
        return self._join_batches(stacked)

    @property
    def num_shards(self):
        """k: the rows of the one subsample plate are walked as k equal shards (1 here; the
        devices of a :class:`~numpyro_sgd.model.sharding.DataParallelOracle`), see :meth:`shard_rows`."""
        return 1

    def shard_rows(self, start, size):
        """``{plate: int32[k·size]}``: rows ``start … start + size − 1`` of each of the
        :attr:`num_shards` shards of the one subsample plate (a block of a full-data pass; its
        potential is scaled by N/(k·size), so blocks weighted k·size/N sum to U). ``start`` may be
        traced, ``size`` is static."""
        (plate,) = self.plates
        return {plate.name: start + jnp.arange(size, dtype=jnp.int32)}

    def _join_batches(self, stacked):
        """``{plate: int32[m, S]}`` → ``{plate: int32[m·S]}``."""
        return {name: idx.reshape(-1) for name, idx in stacked.items()}

    def hessian_estimate(self, theta, rows=HESSIAN_ROWS):
        """∇²U(θ) estimated without a data pass: ∇²Û_B(θ) on :meth:`fixed_batch` (unbiased for ∇²U).
        Costs D forward-mode passes over m·S rows (used at the end of warmup by kernels with a
        full D × D preconditioner)."""
        batch = self.fixed_batch(rows)
        return grad_and_hessian(lambda t: self.potential_energy(t, batch), theta)[1]

    def grad(self, rng_key, theta):
        """Draw a minibatch; return ``(Û_S, ∇Û_S)`` at θ and the indices."""
        indices = self.draw(rng_key)
        return (*self.potential_and_grad(theta, indices), indices)
