"""The driver: one :class:`~numpyro.infer.mcmc.MCMCKernel`, :class:`SGKernel`, for every
stochastic-gradient algorithm (an :class:`~numpyro_sgd.protocol.SGAlgorithm`; the protocol and the
key streams are in :mod:`numpyro_sgd.protocol` and docs/internals.md).

:class:`SGKernel` traces the model, checks it and the data, builds the algorithm, initialises the
chains, runs warmup as a program of its own, and then ``steps_per_sample`` SG steps per returned
sample in one compiled loop, with data-pass counting and the rejection of non-finite steps. A
kernel class only validates its own arguments and builds its algorithm (``_build``).
:class:`~numpyro_sgd.SGWrapper` (:mod:`numpyro_sgd.driver.wrapper`) runs another kernel's algorithm inside its own.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import find_stack_level, is_prng_key

from ..data.model_args import (
    as_jax_args,
    is_tracer,
    python_scalars,
    restore_scalars,
    setup_with_streams,
    should_read_in_place,
    split_arrays,
    streamed_leaves,
)
from ..data.streaming import check_memmaps
from ..minibatch import policy
from ..minibatch.law import check_laws, law_of
from ..minibatch.policy import MIN_STEPS_PER_PASS, resolve_cluster_sizes
from ..model.discovery import AllRows, checked_run, index_probe
from ..model.oracle import MinibatchOracle
from ..model.potential import SubsampledPotential
from ..model.sharding import refuse_parallel_chains
from ..numerics.compilation import full_precision_matmuls, warmup_options_kind
from ..protocol import initial_state
from ..validation import (
    DEFAULT_WARMUP_PASSES,
    check_step_counter,
    driver_options,
    resolve_init_params,
)
from .init_checks import (
    InitChecks,
    warn_constant_data,
    warn_off_gaussian,
    warn_short_run,
)
from .loop import iteration, oracle_factory
from .programs import ProgramCache, return_compiler_memory
from .progress import calling_mcmc, calling_mcmc_shows_progress, progress_text, run_with_progress

__all__ = ["SGKernel"]


class SGKernel(MCMCKernel):
    """The driver of every stochastic-gradient algorithm (see the module docstring).

    A kernel subclasses it, validates its own arguments in ``__init__`` and implements
    ``_build(potential) -> SGAlgorithm``; nothing else.

    :param model: a NumPyro model with at least one ``numpyro.plate(name, N, subsample_size=S)``.
    :param options: the driver's options, ``steps_per_sample``, ``warmup_passes``, ``subsample``,
        ``warmup_subsample``, ``init_strategy``, ``subsample_size``, ``mesh``, ``mesh_axis`` and
        ``cluster_size``: see :class:`~numpyro_sgd.validation.DriverOptions`.
    """

    sample_field = "z"
    #: whether ``mesh=`` is supported (False for kernels that draw indices by their own rule)
    supports_mesh = True
    #: whether the cluster law is supported (False for kernels that draw indices by their own rule)
    supports_clusters = True
    #: whether the kernel runs another kernel's algorithm inside its own (:class:`~numpyro_sgd.SGWrapper`)
    is_wrapper = False
    #: fewest SG steps per data pass when the kernel picks S (``subsample_size="auto"``)
    min_steps_per_pass = MIN_STEPS_PER_PASS

    def __init__(self, model, *, steps_per_sample=None, subsample="with_replacement",
                 warmup_subsample=None, init_strategy=init_to_uniform, subsample_size=None, warmup_passes=None,
                 mesh=None, mesh_axis="data", cluster_size=None):
        name = type(self).__name__
        if not callable(model):
            raise TypeError(f"{name}: `model` must be a NumPyro model (a callable), got {type(model).__name__}.")
        self._model = model
        subsample, warmup_subsample = check_laws(name, subsample, warmup_subsample)
        self._driver = driver_options(
            name, self.supports_mesh, self.supports_clusters, steps_per_sample=steps_per_sample, subsample=subsample,
            warmup_subsample=warmup_subsample, init_strategy=init_strategy, subsample_size=subsample_size,
            warmup_passes=warmup_passes, mesh=mesh, mesh_axis=mesh_axis, cluster_size=cluster_size,
            law_clusters=law_of(subsample).clusters)
        self._steps_per_sample = self._driver.steps_per_sample or 1  # resolved when the model is traced
        self._warmup_steps_per_iteration = self._steps_per_sample
        self._per_data = {}  # what was found in the data: {what: (key, arrays kept alive, value)}
        self._potential = None
        self._run_args = ((), {})
        self._static_args = ({}, {})
        self._in_memory = False  # init read large in-memory NumPy arguments in place (stream_in_memory)
        self._algorithm = None
        self._sample_fn = None
        self._init_program = ProgramCache("init")
        self._warmup_program = ProgramCache("warmup")
        self._checks = InitChecks()

    # ------------------------------------------------------------------ what a kernel provides
    def _build(self, potential, adapt_steps_per_sample=True):
        """The kernel's :class:`SGAlgorithm` for the traced model (override; see :meth:`build`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ public facts
    @property
    def model(self):
        """The model as consumers of a fitted kernel (ArviZ, ``Predictive``) should see it.

        Before :meth:`init` it is the user's model. After it, every subsample plate is set to
        all of its N indices, so ``az.from_numpyro(mcmc)`` and
        ``numpyro.infer.log_likelihood(kernel.model, samples, *args)`` evaluate the full data
        (the pointwise log-likelihood has N columns) instead of failing on a plate that has no
        random key. N is the size the plate declares with the arguments it is called with, so a run
        exported after the kernel was re-initialised on other data still gets its own N columns.
        The kernel itself samples the user's model (:attr:`subsampled_model`).
        """
        if self._potential is None:
            return self._model
        return AllRows(self._model)

    @property
    def subsampled_model(self):
        """The user's model, with its subsample plates."""
        return self._model

    #: whether the kernel's gradients are control variates about a centre it computes at the end
    #: of warmup (:mod:`numpyro_sgd.adaptation.control_variates`); a kernel that takes
    #: ``control_variates=`` sets it in its ``__init__``
    control_variates = False

    @property
    def default_fields(self):
        return ("z", "diverging")

    def _traced(self, value):
        if self._potential is None:
            raise RuntimeError(f"{type(self).__name__}: call MCMC.run (or kernel.init) first.")
        return value

    @property
    def potential(self):
        """The :class:`~numpyro_sgd.model.potential.SubsampledPotential` built by :meth:`init`."""
        return self._traced(self._potential)

    @property
    def steps_per_sample(self):
        """SG steps per returned sample (the default and IASG's window are known once the model
        is traced); for an algorithm that chooses them at the end of warmup (ConstantSGD-full),
        the smallest it may take."""
        return self._steps_per_sample

    @property
    def warmup_steps_per_iteration(self):
        """SG steps per warmup iteration of the last :meth:`init` (see ``warmup_passes``)."""
        return self._warmup_steps_per_iteration

    @property
    def run_args(self):
        """``(model_args, model_kwargs)`` of the last :meth:`init` (the last ``MCMC.run``)."""
        return self._traced(self._run_args)

    @property
    def is_initialized(self):
        """Whether :meth:`init` has traced the model (``potential`` is available)."""
        return self._potential is not None

    @property
    def driver_options(self):
        """The options of :class:`SGKernel` this kernel was built with (``steps_per_sample``,
        ``subsample``, ``warmup_subsample``, ``init_strategy``, ``subsample_size``,
        ``warmup_passes``, ``mesh``, ``cluster_size``; None where the kernel chooses), e.g. for a
        wrapper to pass on."""
        return self._driver._asdict()

    def build(self, potential, *, adapt_steps_per_sample=True):
        """The kernel's :class:`SGAlgorithm` for a traced model: what the kernel's own driver runs,
        and what a wrapper (SGWithinGibbs, VariationalEM) composes.

        :param potential: the :class:`~numpyro_sgd.model.potential.SubsampledPotential` to sample.
        :param bool adapt_steps_per_sample: whether the algorithm may choose the SG steps per
            returned sample at the end of warmup (``SampleBlock.chosen``: ConstantSGD with
            the full preconditioner measures its relaxation time, at the cost of a Hessian). The
            driver passes False when the user fixed ``steps_per_sample``; a wrapper passes False,
            since its own driver takes the steps per sample and it re-runs ``end_warmup`` as its
            outer variables move. Kernels that never choose them ignore it.
        """
        return self._build(potential, adapt_steps_per_sample=adapt_steps_per_sample)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_sample_fn"] = None
        state["_algorithm"] = None  # rebuilt from the potential on demand (holds closures)
        state["_init_program"] = ProgramCache("init")
        state["_warmup_program"] = ProgramCache("warmup")
        state["_checks"] = InitChecks(hyper_warned=self._checks.hyper_warned)
        state["_per_data"] = {}  # holds the data arrays: found again at the next init
        return state

    def _own_algorithm(self, potential):
        """The algorithm the driver runs: :meth:`build`, choosing the steps per sample unless the
        user fixed them."""
        return self.build(potential, adapt_steps_per_sample=self._driver.steps_per_sample is None)

    def _get_algorithm(self):
        if self._algorithm is None:
            self._algorithm = self._own_algorithm(self.potential)
        return self._algorithm

    def algorithm(self, rng_key, *model_args, **model_kwargs):
        """Trace the model and return ``(algorithm, oracle, theta0)`` to run the steps by hand.

        ``algorithm`` is the kernel's :class:`SGAlgorithm`, ``oracle`` a
        :class:`~numpyro_sgd.MinibatchOracle` bound to the model arguments
        (sampling-phase minibatch law) and ``theta0`` a flat initial point drawn as
        :meth:`init` draws it. With the key streams of the module docstring, a hand-written
        loop gives the draws of ``MCMC`` for the same key (while no step is rejected):

        .. doctest::

            >>> import jax, numpyro, numpyro.distributions as dist
            >>> from numpyro_sgd import SGLD
            >>> times = jax.random.exponential(jax.random.key(1), (1000,)) / 2.0  # rate 2
            >>> def waiting(times):
            ...     log_rate = numpyro.sample("log_rate", dist.Normal(0, 3))
            ...     with numpyro.plate("data", times.shape[0], subsample_size=50) as idx:
            ...         numpyro.sample("t", dist.Exponential(jax.numpy.exp(log_rate)), obs=times[idx])
            >>> alg, oracle, theta = SGLD(waiting, step_size=1e-4).algorithm(jax.random.key(0), times)
            >>> state = alg.init(jax.random.key(1), theta, 0)
            >>> def step(carry, key):
            ...     theta, state = carry
            ...     theta, state, info = alg.sample_step(key, 0, theta, state, oracle)
            ...     return (theta, state), theta
            >>> _, draws = jax.lax.scan(step, (theta, state), jax.random.split(jax.random.key(2), 500))
            >>> mle = float(jax.numpy.log(1000 / times.sum()))  # posterior sd of log_rate ≈ 1/√1000
            >>> bool(abs(draws[100:, 0].mean() - mle) < 0.1)
            True
        """
        model_args, model_kwargs = as_jax_args((model_args, model_kwargs))
        self._setup(rng_key, model_args, model_kwargs)
        oracle = MinibatchOracle(self.potential, model_args, model_kwargs, self._driver.subsample)
        theta = self.potential.initial_params(random.split(rng_key, 5)[1], model_args, model_kwargs,
                                              self._driver.init_strategy)
        return self._get_algorithm(), oracle, theta

    # ------------------------------------------------------------------ protocol
    def _setup(self, rng_key, model_args, model_kwargs):
        self._potential = SubsampledPotential.from_model(
            self._model, model_args, model_kwargs, rng_key=rng_key, init_strategy=self._driver.init_strategy,
            kernel_name=type(self).__name__, subsample_size=self._driver.subsample_size,
            min_steps_per_pass=self.min_steps_per_pass,
        )
        if self.supports_clusters and law_of(self._driver.subsample).clusters:
            # the minibatch law, decided once per data (arrays by identity) and plates; with mesh=
            # each device draws its S/k rows as clusters among its own N/k
            # (a mesh without the axis is refused by check_mesh, with its own message, later)
            shards = 1 if self._driver.mesh is None else dict(self._driver.mesh.shape).get(self._driver.mesh_axis, 1)
            sizes = self._once_per_data("cluster sizes", model_args, model_kwargs, self._potential.plates,
                                        lambda: resolve_cluster_sizes(self._potential, model_args, model_kwargs,
                                                                      self._driver.cluster_size, type(self).__name__,
                                                                      shards))
            self._potential = self._potential.with_cluster_sizes(sizes)
        self._algorithm = alg = self._own_algorithm(self._potential)
        if alg.block.summarises and self._driver.steps_per_sample is not None:
            raise ValueError(
                f"{type(self).__name__}: a returned sample of this algorithm summarises a block of "
                f"{alg.block.steps} SG steps (IASG: the window's mean), so steps_per_sample cannot be "
                "set; leave it out (IASG: pass window=T)."
            )
        self._steps_per_sample = self._block_steps()
        return alg

    def _once_per_data(self, what, model_args, model_kwargs, plates, find):
        """``find()``, computed once per data: kept under ``what`` for the next :meth:`init` with
        the same model arguments (arrays by identity, kept alive with the entry) and ``plates``;
        dropped on pickling."""
        arrays, _, key = split_arrays(model_args, model_kwargs)
        entry = self._per_data.get(what)
        if entry is None or entry[0] != (key, plates):
            entry = self._per_data[what] = ((key, plates), arrays, find())
        return entry[2]

    def _block_steps(self, state=None):
        """SG steps per returned sample, decided here only, from ``SGAlgorithm.block``
        (:class:`SampleBlock`): a summarising block's own length; else the user's
        ``steps_per_sample``; else, in the sampling phase of ``state``, the steps the algorithm
        chose at the end of warmup (a traced count, one for all chains, which share the step
        counter); else the algorithm's relaxation time; else 1."""
        block = self._get_algorithm().block
        if block.summarises:
            return block.steps
        if self._driver.steps_per_sample is not None:
            return self._driver.steps_per_sample
        if state is not None and block.chosen is not None:
            return jnp.max(block.chosen(state.kernel_state))
        return block.steps or 1

    def _warmup_steps(self, num_warmup):
        """SG steps per warmup iteration: the ``warmup_passes`` budget spread over ``num_warmup``
        iterations, or ``steps_per_sample`` (a summarising block such as IASG's window; no
        ``warmup_passes`` with an explicit ``steps_per_sample`` or an algorithm without a
        relaxation time; a traced ``num_warmup``)."""
        passes, block = self._driver.warmup_passes, self._algorithm.block
        if passes is None and self._driver.steps_per_sample is None and block.steps and not block.summarises:
            passes = DEFAULT_WARMUP_PASSES
        if block.summarises or passes is None or is_tracer(num_warmup) or num_warmup < 1:
            return self._steps_per_sample
        total = math.ceil(passes * self._potential.steps_per_pass)
        return max(1, math.ceil(total / num_warmup))

    @full_precision_matmuls
    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        check_memmaps(type(self).__name__, model_args, model_kwargs, calling_mcmc())
        return_compiler_memory()  # the sampling program's compile is next (NumPyro's)
        refuse_parallel_chains(type(self).__name__, self._driver.mesh, is_tracer(rng_key))
        vectorized = not is_prng_key(rng_key)
        if not isinstance(num_warmup, int) and not is_tracer(num_warmup):
            num_warmup = int(num_warmup)
        self._in_memory = should_read_in_place(self._driver.mesh, rng_key, calling_mcmc())
        algorithm, (model_args, model_kwargs) = setup_with_streams(
            (model_args, model_kwargs), self._in_memory, policy.CLUSTER_MIN_DATA_BYTES,
            lambda args, kwargs: self._setup(rng_key[0] if vectorized else rng_key, args, kwargs))
        if not is_tracer((model_args, model_kwargs)):  # not under pmap (chain_method="parallel")
            self._run_args = (model_args, model_kwargs)
            self._static_args = python_scalars(model_args, model_kwargs)
        potential = self._potential
        self._checks.before_init(self, algorithm, model_args, model_kwargs, wrapped=self.is_wrapper)
        self._warmup_steps_per_iteration = self._warmup_steps(num_warmup)
        num_warmup_steps = num_warmup * self._warmup_steps_per_iteration
        check_step_counter(type(self).__name__, num_warmup_steps)
        init_params = resolve_init_params(type(self).__name__, init_params, potential.view,
                                          rng_key.shape[0] if vectorized else None)

        def init_one(key, z0, model_args, model_kwargs):
            return initial_state(potential, algorithm, key, z0, model_args, model_kwargs, num_warmup_steps,
                                 self._driver.init_strategy)

        init_chains = jax.vmap(init_one, in_axes=(0, 0, None, None)) if vectorized else init_one
        state = self._compiled_init(init_chains, rng_key, init_params, model_args, model_kwargs, num_warmup_steps)
        self._checks.data(self, state, vectorized, model_args, model_kwargs)
        state = self._warmup(state, num_warmup, model_args, model_kwargs)
        self._warn_short_run(state, num_warmup)
        self._sample_fn = self.sample
        return state

    def _warn_short_run(self, state, num_warmup):
        """At the end of warmup: a control-variate kernel's centre and curvature
        (``checks.warn_off_gaussian``), and, when the algorithm predicts its autocorrelation time
        (``SampleBlock.relaxation``), too few ``num_samples`` of the calling ``MCMC``
        (``checks.warn_short_run``). Python then waits for warmup before NumPyro compiles."""
        if is_tracer((state.kernel_state, num_warmup)) or num_warmup == 0:
            return
        if self.control_variates:
            warn_off_gaussian(type(self).__name__, state.kernel_state.adapted.control)
        relaxation, mcmc = self._get_algorithm().block.relaxation, calling_mcmc()
        if relaxation is not None and mcmc is not None:
            warn_short_run(type(self).__name__, relaxation(state.kernel_state), mcmc.num_samples, self._block_steps())

    def _compiled_init(self, init_chains, rng_key, init_params, model_args, model_kwargs, num_warmup_steps):
        """``init_chains(rng_key, init_params, model_args, model_kwargs)`` as one compiled program,
        with JAX's index checks of the potential at the plates' ends (``discovery.index_probe``:
        an index past the data, ``X[idx + 1]``, is refused here, where JAX would clamp it).

        Run op by op, the initial point, potential and kernel state cost dozens of small XLA
        compilations (measured: 3.4 s at D = 50, two chains; one program: 1 s). The arrays are
        passed in, never XLA constants. The program is kept for the next :meth:`init` with the
        same arguments (arrays by identity, kept alive with it), chains, ``num_warmup_steps`` and
        ``init_params`` structure. Under ``pmap`` (``chain_method="parallel"``) it is simply called.
        """
        if is_tracer((rng_key, init_params, model_args, model_kwargs)):
            return init_chains(rng_key, init_params, model_args, model_kwargs)
        arrays, rebuild, key = split_arrays(model_args, model_kwargs)
        key = (key, num_warmup_steps, jax.tree.structure(init_params), jnp.shape(rng_key))  # shape: chains
        potential = self._potential

        def program(rng_key, init_params, arrays):
            args, kwargs = rebuild(arrays)
            return init_chains(rng_key, init_params, args, kwargs), index_probe(potential, args, kwargs)

        compiled = self._init_program.get(key, lambda: program, arrays)
        return checked_run(lambda: compiled(rng_key, init_params, arrays), potential, model_args, model_kwargs)

    def postprocess_fn(self, model_args, model_kwargs):
        potential = self.potential
        model_kwargs = {} if model_kwargs is None else model_kwargs

        def postprocess(z):
            model_args_, model_kwargs_ = self._static(model_args, model_kwargs)
            return potential.constrain(potential.view.ravel(z), model_args_, model_kwargs_)

        return full_precision_matmuls(postprocess)

    # ------------------------------------------------------------------ transition
    def _static(self, model_args, model_kwargs):
        """The model arguments as this run's :meth:`init` saw them (:func:`~numpyro_sgd.data.model_args.restore_scalars`)."""
        return restore_scalars(streamed_leaves((model_args, model_kwargs), self._in_memory), self._static_args)

    def _plain_burn_in(self):
        """Whether warmup is sampling under another name: the algorithm's warmup is burn-in
        (:attr:`SGAlgorithm.burn_in`), and a warmup iteration is a sampling iteration (same
        minibatch law and number of steps). Then NumPyro's warmup iterations simply sample, in the
        one compiled program; otherwise warmup runs inside :meth:`init` (``_warmup``)."""
        return (self._get_algorithm().burn_in and self._driver.warmup_subsample == self._driver.subsample
                and self._warmup_steps_per_iteration == self._steps_per_sample)

    @full_precision_matmuls
    def _iteration(self, state, model_args, model_kwargs, warmup):
        """One MCMC iteration of every chain (:func:`~numpyro_sgd.driver.loop.iteration`)."""
        oracle = oracle_factory(self.potential, model_args, model_kwargs, self._driver.mesh, self._driver.mesh_axis)
        return iteration(self._get_algorithm(), self.potential, oracle, state, warmup,
                         warmup_steps=self._warmup_steps_per_iteration, sample_steps=self._block_steps,
                         subsample=self._driver.subsample, warmup_subsample=self._driver.warmup_subsample)

    def _warmup(self, state, num_warmup, model_args, model_kwargs):
        """Run the ``num_warmup`` warmup iterations inside :meth:`init`, as a program of their own.

        NumPyro compiles :meth:`sample` into one loop over warmup and sampling iterations (once
        for each of ``mcmc.warmup`` and ``mcmc.run``); a :meth:`sample` that warmed up would carry
        every warmup step and ``end_warmup`` into each. Here warmup is compiled once (kept for the
        next :meth:`init` with the same arguments), and the returned state passes NumPyro's warmup
        iterations through (``idle_iterations``). With a progress bar, warmup runs in about 20
        calls of the program with a bar of its own. Under ``pmap`` it is part of NumPyro's init.
        """
        if self._plain_burn_in() or (not is_tracer(num_warmup) and num_warmup == 0):
            return state
        if is_tracer((state, model_args, model_kwargs)):
            state = lax.fori_loop(0, num_warmup, lambda _, s: self._iteration(s, model_args, model_kwargs, True),
                                  state)
        else:
            arrays, rebuild, key = split_arrays(model_args, model_kwargs)
            key = (key, self._warmup_steps_per_iteration, jax.tree.structure(state),
                   tuple((jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(state)))
            def loop(state, num_iterations, arrays):
                args, kwargs = rebuild(arrays)
                return lax.fori_loop(0, num_iterations, lambda _, s: self._iteration(s, args, kwargs, True), state)

            # a control-variate warmup reads a bounded number of passes (its noise warmup, the
            # centre's Newton steps); another kernel's warmup can be thousands of SG steps
            options = warmup_options_kind(arrays) if self.control_variates else "warmup"
            program = self._warmup_program.get(key, lambda: loop, arrays, options)
            if calling_mcmc_shows_progress() and num_warmup > 1:
                state = run_with_progress(program, state, num_warmup, arrays, self.get_diagnostics_str)
            else:
                state = program(state, np.int32(num_warmup), arrays)
        if is_tracer((state.idle_iterations, num_warmup)):
            return state._replace(idle_iterations=jnp.full_like(state.idle_iterations, num_warmup))
        # from NumPy: an eager jnp.full_like (or jnp.asarray) would be one more XLA compilation per run
        idle = np.full(np.shape(state.idle_iterations), num_warmup, np.asarray(state.idle_iterations).dtype)
        return state._replace(idle_iterations=jax.device_put(idle))

    @full_precision_matmuls
    def sample(self, state, model_args, model_kwargs):
        """One MCMC iteration: ``steps_per_sample`` SG steps in one compiled loop, or, for the
        ``num_warmup`` iterations after a warmup that ran inside :meth:`init`, the state as it is
        (``idle_iterations``). Only the sampling phase is traced (``_warmup``)."""
        model_args, model_kwargs = self._static(model_args, {} if model_kwargs is None else model_kwargs)
        warn_constant_data(type(self).__name__, model_args, model_kwargs)
        if self._plain_burn_in():
            return self._iteration(state, model_args, model_kwargs, False)
        vectorized = jnp.ndim(state.i) > 0
        idle = state.idle_iterations[0] if vectorized else state.idle_iterations

        def pass_through(s):
            return s._replace(idle_iterations=s.idle_iterations - 1, diverging=jnp.zeros_like(s.diverging))

        return lax.cond(idle > 0, pass_through, lambda s: self._iteration(s, model_args, model_kwargs, False), state)

    # ------------------------------------------------------------------ reporting
    def get_diagnostics_str(self, state):
        """Progress-bar text for ``state``, rendered only when the bar is drawn
        (``numpyro_sgd.driver.progress.progress_text``)."""
        return progress_text(state, self._get_algorithm().describe)

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
