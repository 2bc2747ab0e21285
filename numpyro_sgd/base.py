"""One :class:`~numpyro.infer.mcmc.MCMCKernel` driver for every stochastic-gradient algorithm.

An algorithm is a :class:`SGAlgorithm`: pure functions built once from the facts of the traced
model (a :class:`~numpyro_sgd.potential.SubsampledPotential`: plates, N, S, D) that act on one
chain,

* ``init(rng_key, theta, num_warmup_steps) -> state``
* ``sample_step(rng_key, step, theta, state, oracle) -> (theta, state, info)``
* optional ``warmup_step`` of the same form (None: warmup is burn-in),
* optional ``end_warmup(theta, state, oracle) -> state`` (freeze what warmup adapted),
* ``block``, a :class:`SampleBlock`: the SG steps per returned sample,
* optional ``start_block`` / ``end_block`` around each returned sample's steps (IASG: a sample
  summarises its block),

where ``theta`` is the flat unconstrained position, ``oracle`` a
:class:`~numpyro_sgd.potential.MinibatchOracle` (indices, minibatch potentials and gradients) and
``info`` a :class:`StepInfo` (the step's potential, per-datum gradient evaluations and the indices
of the minibatch that moved θ). A user can run them in their own ``lax.scan``
(:meth:`SGKernel.algorithm` returns the algorithm and an oracle; see its example).

The driver :class:`SGKernel` does the rest, the same for every algorithm: model tracing and
validation, initial values, vectorized chains, ``steps_per_sample`` SG steps per returned
sample in one compiled loop, data-pass counting, rejection of non-finite steps, constraining,
progress-bar text and pickling. A kernel class only validates its arguments and builds its
algorithm (``_build``).

**Key streams** (one chain): :meth:`SGKernel.init` splits the chain key into
``key, k_init, k_state, k_shuffle, k_pe`` (initial point, ``algorithm.init``, warmup shuffling,
the initial potential); every SG step then does ``key, k_step = split(key)`` and passes
``k_step`` to the algorithm's step.

**The lean step.** A rejected step (non-finite potential or position, a constrained position
outside the open support, e.g. σ = exp(log σ) rounded to 0.0, or a non-finite changed state)
keeps the old position and state and is counted. Only what the step changed is
checked and selected: a state leaf the step returns unchanged (the same traced value, e.g. a
frozen preconditioner or the warmup state during sampling) is read, never re-checked or copied.
"""

from __future__ import annotations

import math
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import find_stack_level, is_prng_key

from .checks import (  # noqa: F401 - the constants are re-exported
    CONSTANT_DATA_WARN_BYTES,
    FULL_DATA_CHECK_MIN_N,
    RELAXATION_WARN_FACTOR,
    TINY_N,
    check_data,
    check_problem_size,
    warn_constant_data,
    warn_full_data_steps,
    warn_hyper_candidates,
    warn_short_blocks,
    warn_short_run,
)
from .potential import (
    MIN_STEPS_PER_PASS,
    SUBSAMPLE_METHODS,
    AllRows,
    MinibatchOracle,
    SubsampledPotential,
    as_jax_args,
    is_tracer,
    resolve_cluster_sizes,
    split_arrays,
)
from .protocol import SampleBlock, SGAlgorithm, SGState, StepInfo
from .sharding import DataParallelOracle, check_mesh
from .streaming import check_memmaps, streamed_leaves, streamed_sources
from .validation import check_init_params, check_int, check_positive  # noqa: F401 - re-exported

__all__ = ["SGState", "SGKernel", "SGWrapper", "SGAlgorithm", "SampleBlock", "StepInfo", "MinibatchOracle", "is_positive_scalar",
           "pick_chain"]


def is_positive_scalar(value):
    """True for a finite real number > 0 given as a Python, NumPy or 0-d JAX scalar (not a bool)."""
    if isinstance(value, bool) or callable(value) or np.ndim(value) != 0:
        return False
    try:
        value = float(value)
    except (TypeError, ValueError):
        return False
    return bool(np.isfinite(value) and value > 0)


def pick_chain(state, chain=0):
    """The fields of a (possibly vectorized) :class:`SGState` or kernel state for one chain."""
    vectorized = jnp.ndim(state.i) > 0 if hasattr(state, "i") else False
    return jax.tree.map(lambda x: x[chain], state) if vectorized else state


def _python_scalars(model_args, model_kwargs):
    """Positions and names of the Python scalar model arguments (e.g. a ``subsample_size``)."""
    scalar = (int, float, bool, str)
    return ({i: v for i, v in enumerate(model_args) if isinstance(v, scalar)},
            {k: v for k, v in model_kwargs.items() if isinstance(v, scalar)})


#: warmup budget in data passes when the kernel chooses ``steps_per_sample`` (the noise warmup
#: needs 10–20 passes on the problems of the tests and examples; see docs/performance.md)
DEFAULT_WARMUP_PASSES = 20

#: XLA options that make XLA:CPU compile a program several times faster. The legacy loop
#: emitters (``xla_cpu_use_fusion_emitters=False``) compile a fusion faster than the MLIR fusion
#: emitters and run it about as fast; without LLVM optimisation
#: (``xla_backend_optimization_level=0``) compiling is faster again, but the code runs slower, so
#: that is used only for the program that runs once (the initial point). Measured on the 2-core
#: CPU, a 3-parameter regression: warmup program 3.3–3.9 s → 2.3–2.5 s (emitters), 0.7 s (both);
#: init program 1.2 s → 0.3 s (both). Options this jaxlib does not know are left out (jax 0.12
#: has no ``xla_cpu_use_fusion_emitters``).
QUICK_COMPILE = {"init": {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 0},
                 "warmup": {"xla_cpu_use_fusion_emitters": False}}
_SUPPORTED_OPTIONS = {}


def _quick_compile_options(program):
    """``compiler_options`` for ``jax.jit`` of the driver's one-per-run ``program`` ("init",
    "warmup") on the CPU backend (None elsewhere: the options are XLA:CPU's)."""
    if jax.default_backend() != "cpu":
        return None
    options = {}
    for name, value in QUICK_COMPILE[program].items():
        if name not in _SUPPORTED_OPTIONS:
            try:  # one tiny compilation per option and process
                jax.jit(lambda x: x + 1, compiler_options={name: value})(np.float32(0.0))
                _SUPPORTED_OPTIONS[name] = True
            except Exception:  # noqa: BLE001 - XLA refuses an option it does not know
                _SUPPORTED_OPTIONS[name] = False
        if _SUPPORTED_OPTIONS[name]:
            options[name] = value
    return options or None



def _count_grad_evals(state, evals):
    """Add ``evals`` per-datum gradient evaluations to the data-pass count (exact, no int overflow)."""
    rem = state.grad_evals_in_pass + evals
    return state._replace(data_passes_done=state.data_passes_done + rem // state.num_data,
                          grad_evals_in_pass=rem % state.num_data)


def _finite(x, before=None):
    """Whether a float array is finite (given ``before``: whether no entry *became* non-finite)."""
    if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
        return jnp.array(True)
    ok = jnp.isfinite(x) if before is None else jnp.isfinite(x) | ~jnp.isfinite(before)
    return jnp.all(ok)


def _guard(ok, new_state, old_state):
    """Per leaf: the old value where the step was rejected, but only for leaves the step changed."""
    new_leaves, treedef = jax.tree.flatten(new_state)
    old_leaves = jax.tree.leaves(old_state)
    out = [n if n is o else jnp.where(ok, n, o) for n, o in zip(new_leaves, old_leaves)]
    return jax.tree.unflatten(treedef, out)


def _changed_finite(new_state, old_state):
    checks = [_finite(n, o) for n, o in zip(jax.tree.leaves(new_state), jax.tree.leaves(old_state)) if n is not o]
    return jnp.all(jnp.stack(checks)) if checks else jnp.array(True)


def _calling_mcmc(max_frames=10):
    """The ``numpyro.infer.MCMC`` that called :meth:`SGKernel.init`, or None (a kernel initialised
    by hand). NumPyro's ``MCMC`` calls ``kernel.init`` without saying, nor how many samples follow
    (NumPyro 0.22 gives the kernel no hook for it); it is found on the call stack (its ``self``)."""
    from numpyro.infer import MCMC

    frame = sys._getframe(2)
    for _ in range(max_frames):
        if frame is None:
            break
        caller = frame.f_locals.get("self")
        if isinstance(caller, MCMC):
            return caller
        frame = frame.f_back
    return None


def _calling_mcmc_shows_progress():
    """Whether the ``numpyro.infer.MCMC`` that called :meth:`SGKernel.init` shows a progress bar."""
    mcmc = _calling_mcmc()
    return mcmc is not None and bool(mcmc.progress_bar)


class ProgressText(str):
    """A progress-bar postfix rendered when it is displayed, not when it is set.

    tqdm stores ``str(postfix)`` and draws ``", " + postfix`` (or formats it) at each refresh:
    this ``str`` subclass keeps itself through ``str()`` and renders at those two operations, so
    reading device values costs one sync per drawn frame instead of one per sample.
    """

    def __new__(cls, render):
        obj = super().__new__(cls, "…")
        obj._render = render
        return obj

    def __str__(self):
        return self

    def __radd__(self, other):
        return other + self._render()

    def __format__(self, spec):
        return format(self._render(), spec)

    def __contains__(self, item):
        return item in self._render()

    def __repr__(self):
        return repr(self._render())

    def __bool__(self):
        return True


class SGKernel(MCMCKernel):
    """The driver of every stochastic-gradient algorithm (see the module docstring).

    A kernel subclasses it, validates its own arguments in ``__init__`` and implements
    ``_build(potential) -> SGAlgorithm``; nothing else.

    :param model: a NumPyro model with at least one ``numpyro.plate(name, N, subsample_size=S)``.
    :param steps_per_sample: SG steps per returned sample, run inside one compiled loop. Default
        (None): the algorithm's relaxation time, ⌈N/S⌉ SG steps (one data pass) for the kernels
        that adapt to the gradient noise (ConstantSGD, SGFS; their KL-optimal chain forgets its
        start in about one pass, so ``num_samples`` counts nearly independent draws), 1 for the
        others. ConstantSGD with the full preconditioner measures its own relaxation time at the
        end of warmup and takes more steps when the model is misspecified
        (:func:`~numpyro_sgd.noise.relaxation_steps`; read it from
        ``mcmc.last_state.kernel_state.steps_per_sample``). An ``int`` fixes it; a value far
        below the relaxation time warns at ``init`` (the ESS is then about
        num_samples × steps_per_sample × S/N, not num_samples).
    :param float warmup_passes: the warmup budget in data passes, spread over MCMC's
        ``num_warmup`` iterations (⌈warmup_passes · N/S / num_warmup⌉ SG steps each, at least
        one). Default (None): ``DEFAULT_WARMUP_PASSES`` when ``steps_per_sample`` is the
        kernel's relaxation time; otherwise (an explicit ``steps_per_sample``, or a kernel with
        no relaxation time such as SGLD) a warmup iteration takes ``steps_per_sample`` SG steps,
        as a sampling iteration does.
    :param str subsample: how sampling-phase minibatches are drawn, ``"with_replacement"``
        (default) or ``"without_replacement"`` (see ``numpyro_sgd.potential.SUBSAMPLE_METHODS``).
    :param str warmup_subsample: how warmup minibatches are drawn; defaults to ``subsample``;
        ``"shuffle"`` (epoch-wise reshuffling) is allowed here only, since it biases the
        stationary law.
    :param init_strategy: NumPyro init strategy for the unconstrained initial values.
    :param subsample_size: minibatch size S to use instead of the one the model's plate declares
        (an int for every subsample plate, or ``{plate name: S}``); the N/S scaling follows. Lets
        you pick the throughput-optimal S without editing the model (see docs/performance.md). ``"auto"``:
        the kernel picks S from N and the backend (:func:`~numpyro_sgd.potential.choose_subsample_size`:
        10⁴ on a CPU, 10⁵ on a GPU, at most N/10; N/100 for IASG); it does so too for a model whose
        data plate declares no subsample_size (NumPyro's one model for NUTS and SG).
    :param mesh: a ``jax.sharding.Mesh`` over which the data rows are split (``None``: one device).
        Each device then draws its S/k minibatch rows among its own N/k rows and the step
        all-reduces one D-vector (:mod:`numpyro_sgd.sharding`); pass the data sharded along
        ``mesh_axis`` (``jax.device_put(X, NamedSharding(mesh, P("data")))``) and run
        ``MCMC(..., jit_model_args=True)`` so that they stay where they are.
    :param str mesh_axis: the mesh axis the rows are split over.
    :param int cluster_size: with ``subsample="with_replacement"``, draw each minibatch as S/B
        clusters of B consecutive rows (the *cluster law*,
        :func:`~numpyro_sgd.potential.cluster_indices`: unbiased whatever the order of the rows,
        its noise estimated from the cluster sums) instead of S random rows. Default (None): B
        from :func:`~numpyro_sgd.potential.choose_cluster_size` (1, random rows, unless the data
        the plate indexes exceed 64 MiB; then clusters of about 32 KiB, which a CPU reads several
        times faster than random rows), falling back to random rows with a warning when the rows
        look ordered. ``1``: random rows; an int B that divides S: clusters of B.
    """

    sample_field = "z"
    #: whether ``mesh=`` is supported (False for kernels that draw indices by their own rule)
    supports_mesh = True
    #: whether the cluster law is supported (False for kernels that draw indices by their own rule)
    supports_clusters = True
    #: fewest SG steps per data pass when the kernel picks S (``subsample_size="auto"``)
    min_steps_per_pass = MIN_STEPS_PER_PASS

    def __init__(self, model, *, steps_per_sample=None, subsample="with_replacement",
                 warmup_subsample=None, init_strategy=init_to_uniform, subsample_size=None, warmup_passes=None,
                 mesh=None, mesh_axis="data", cluster_size=None):
        name = type(self).__name__
        if not callable(model):
            raise TypeError(f"{name}: `model` must be a NumPyro model (a callable), got {type(model).__name__}.")
        check_int(name, "steps_per_sample", steps_per_sample, allow_none=True,
                  what="an integer >= 1 or None (the kernel's relaxation time, one data pass for ConstantSGD/SGFS)")
        warmup_passes = check_positive(
            name, "warmup_passes", warmup_passes, allow_none=True,
            what=f"a positive number of data passes or None (default {DEFAULT_WARMUP_PASSES})")
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
        self._steps_per_sample_option = None if steps_per_sample is None else int(steps_per_sample)
        self._steps_per_sample = self._steps_per_sample_option or 1  # resolved when the model is traced
        self._warmup_passes = warmup_passes
        self._warmup_steps_per_iteration = self._steps_per_sample
        self._subsample = subsample
        self._warmup_subsample = warmup_subsample
        self._init_strategy = init_strategy
        if subsample_size is not None and not (isinstance(subsample_size, str) and subsample_size == "auto"):
            sizes = subsample_size if isinstance(subsample_size, dict) else {None: subsample_size}
            what = "an integer >= 1 or a dict {plate name: integer}"
            sizes = {k: check_int(name, "subsample_size", v, what=what) for k, v in sizes.items()}
            subsample_size = sizes if isinstance(subsample_size, dict) else sizes[None]
        self._subsample_size = subsample_size
        if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
            raise TypeError(f"{name}: mesh must be a jax.sharding.Mesh (e.g. Mesh(jax.devices(), ('data',))), got "
                            f"{type(mesh).__name__}.")
        if mesh is not None and not self.supports_mesh:
            raise ValueError(f"{name}: mesh= is not supported: this kernel draws its minibatch indices by its own "
                             "rule, which a per-device stratified draw would change.")
        self._mesh, self._mesh_axis = mesh, mesh_axis
        if cluster_size is not None:
            check_int(name, "cluster_size", cluster_size, what="an integer >= 1 dividing subsample_size, or None")
            if cluster_size > 1 and (not self.supports_clusters or subsample != "with_replacement"):
                why = ("this kernel draws its minibatch indices by its own rule" if not self.supports_clusters else
                       f"subsample={subsample!r} draws rows")
                raise ValueError(f"{name}: cluster_size={cluster_size} is not supported here: {why}. "
                                 "Leave cluster_size out (random rows).")
        self._cluster_size = cluster_size
        self._per_data = {}  # what was found in the data: {what: (key, arrays kept alive, value)}
        self._hyper_warned = False
        self._potential = None
        self._run_args = ((), {})
        self._static_args = ({}, {})
        self._algorithm = None
        self._sample_fn = None
        self._init_program = None
        self._warmup_program = None
        self._cost_checked = None  # the model arguments fixed_step_cost was checked for
        self._data_checked = None  # the model arguments found finite where the likelihood reads them

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

    @property
    def control_variates(self):
        """Whether the kernel's gradients are control variates about a centre it computes at the
        end of warmup (:mod:`numpyro_sgd.control_variates`)."""
        return bool(getattr(self, "_options", {}).get("control_variates", False))

    @property
    def default_fields(self):
        return ("z", "diverging")

    def _traced(self, value):
        if self._potential is None:
            raise RuntimeError(f"{type(self).__name__}: call MCMC.run (or kernel.init) first.")
        return value

    @property
    def potential(self):
        """The :class:`~numpyro_sgd.potential.SubsampledPotential` built by :meth:`init`."""
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
        return dict(steps_per_sample=self._steps_per_sample_option, subsample=self._subsample,
                    warmup_subsample=self._warmup_subsample, init_strategy=self._init_strategy,
                    subsample_size=self._subsample_size, warmup_passes=self._warmup_passes,
                    mesh=self._mesh, mesh_axis=self._mesh_axis, cluster_size=self._cluster_size)

    def build(self, potential, *, adapt_steps_per_sample=True):
        """The kernel's :class:`SGAlgorithm` for a traced model: what the kernel's own driver runs,
        and what a wrapper (SGWithinGibbs, VariationalEM) composes.

        :param potential: the :class:`~numpyro_sgd.potential.SubsampledPotential` to sample.
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
        state["_init_program"] = None
        state["_warmup_program"] = None
        state["_cost_checked"] = None
        state["_data_checked"] = None
        state["_per_data"] = {}  # holds the data arrays: found again at the next init
        return state

    def _own_algorithm(self, potential):
        """The algorithm the driver runs: :meth:`build`, choosing the steps per sample unless the
        user fixed them."""
        return self.build(potential, adapt_steps_per_sample=self._steps_per_sample_option is None)

    def _get_algorithm(self):
        if self._algorithm is None:
            self._algorithm = self._own_algorithm(self.potential)
        return self._algorithm

    def algorithm(self, rng_key, *model_args, **model_kwargs):
        """Trace the model and return ``(algorithm, oracle, theta0)`` to run the steps by hand.

        ``algorithm`` is the kernel's :class:`SGAlgorithm`, ``oracle`` a
        :class:`~numpyro_sgd.potential.MinibatchOracle` bound to the model arguments
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
        oracle = MinibatchOracle(self.potential, model_args, model_kwargs, self._subsample)
        theta = self.potential.initial_params(random.split(rng_key, 5)[1], model_args, model_kwargs,
                                              self._init_strategy)
        return self._get_algorithm(), oracle, theta

    # ------------------------------------------------------------------ protocol
    def _setup(self, rng_key, model_args, model_kwargs):
        self._potential = SubsampledPotential.from_model(
            self._model, model_args, model_kwargs, rng_key=rng_key,
            init_strategy=self._init_strategy, kernel_name=type(self).__name__, subsample_size=self._subsample_size,
            min_steps_per_pass=self.min_steps_per_pass,
        )
        if self.supports_clusters and self._subsample == "with_replacement":
            # the minibatch law, decided once per data (arrays by identity) and plates; with mesh=
            # each device draws its S/k rows as clusters among its own N/k
            # (a mesh without the axis is refused by check_mesh, with its own message, later)
            shards = 1 if self._mesh is None else dict(self._mesh.shape).get(self._mesh_axis, 1)
            sizes = self._once_per_data("cluster sizes", model_args, model_kwargs, self._potential.plates,
                                        lambda: resolve_cluster_sizes(self._potential, model_args, model_kwargs,
                                                                      self._cluster_size, type(self).__name__, shards))
            self._potential = self._potential.with_cluster_sizes(sizes)
        self._algorithm = alg = self._own_algorithm(self._potential)
        if alg.block.summarises and self._steps_per_sample_option is not None:
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
        if self._steps_per_sample_option is not None:
            return self._steps_per_sample_option
        if state is not None and block.chosen is not None:
            return jnp.max(block.chosen(state.kernel_state))
        return block.steps or 1

    def _warmup_steps(self, num_warmup):
        """SG steps per warmup iteration: the ``warmup_passes`` budget spread over ``num_warmup``
        iterations, or ``steps_per_sample`` (a summarising block such as IASG's window; no
        ``warmup_passes`` with an explicit ``steps_per_sample`` or an algorithm without a
        relaxation time; a traced ``num_warmup``)."""
        passes, block = self._warmup_passes, self._algorithm.block
        if passes is None and self._steps_per_sample_option is None and block.steps and not block.summarises:
            passes = DEFAULT_WARMUP_PASSES
        if block.summarises or passes is None or is_tracer(num_warmup) or num_warmup < 1:
            return self._steps_per_sample
        total = math.ceil(passes * self._potential.steps_per_pass)
        return max(1, math.ceil(total / num_warmup))

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        check_memmaps(type(self).__name__, model_args, model_kwargs, _calling_mcmc())
        model_args, model_kwargs = streamed_leaves((model_args, model_kwargs))
        if self._mesh is not None and is_tracer(rng_key):  # NumPyro's chain_method="parallel" (pmap)
            raise ValueError(
                f"{type(self).__name__}: mesh= splits the data rows over the mesh's devices, and "
                "chain_method='parallel' would put one chain on each device as well (JAX then reports a "
                "'Context mesh ... should match the mesh of sharding' error at the model's indexing). Use "
                "chain_method='vectorized' (every chain on every device, each with its own rows' gradients) "
                "or 'sequential' with mesh=, or drop mesh= to run parallel chains."
            )
        vectorized = not is_prng_key(rng_key)
        if not isinstance(num_warmup, int) and not is_tracer(num_warmup):
            num_warmup = int(num_warmup)
        algorithm = self._setup(rng_key[0] if vectorized else rng_key, model_args, model_kwargs)
        if not is_tracer((model_args, model_kwargs)):  # not under pmap (chain_method="parallel")
            self._run_args = (model_args, model_kwargs)
            self._static_args = _python_scalars(model_args, model_kwargs)
        potential = self._potential
        if self._mesh is not None:
            check_mesh(type(self).__name__, self._mesh, self._mesh_axis, potential, self._subsample,
                       self._warmup_subsample)
        name = type(self).__name__
        check_problem_size(name, potential)
        warn_short_blocks(name, algorithm, self._steps_per_sample)
        wrapped = isinstance(self, SGWrapper)
        if not is_tracer((model_args, model_kwargs)) and not getattr(self, "_hyper_warned", False) and not wrapped:
            self._hyper_warned = True
            warn_hyper_candidates(name, potential, self._model, model_args, model_kwargs)
        if not is_tracer((model_args, model_kwargs)):
            key = split_arrays(model_args, model_kwargs)[2]
            if self._cost_checked != key:
                self._cost_checked = key
                warn_full_data_steps(name, potential, model_args, model_kwargs)
        self._warmup_steps_per_iteration = self._warmup_steps(num_warmup)
        num_warmup_steps = num_warmup * self._warmup_steps_per_iteration
        if not is_tracer(num_warmup_steps) and num_warmup_steps >= 2**31:
            raise ValueError(
                f"{type(self).__name__}: num_warmup × SG steps per warmup iteration = {num_warmup_steps:,} warmup "
                "steps, beyond the int32 step counter (2³¹ − 1); lower num_warmup, steps_per_sample or "
                "warmup_passes."
            )
        if init_params is not None:
            if hasattr(init_params, "z"):  # numpyro ParamInfo
                init_params = init_params.z
            missing = set(potential.view.names) - set(init_params)
            if missing:
                raise ValueError(
                    f"{type(self).__name__}: init_params lacks the latent sites {sorted(missing)}; "
                    "give unconstrained values for every latent site."
                )
            if not is_tracer(init_params):
                init_params = check_init_params(type(self).__name__, init_params, potential.view,
                                                rng_key.shape[0] if vectorized else None)

        def init_one(key, z0, model_args, model_kwargs):
            key, k_init, k_state, k_shuffle, k_pe = random.split(key, 5)
            if z0 is None:
                theta = potential.initial_params(k_init, model_args, model_kwargs, self._init_strategy)
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

        init_chains = jax.vmap(init_one, in_axes=(0, 0, None, None)) if vectorized else init_one
        state = self._compiled_init(init_chains, rng_key, init_params, model_args, model_kwargs, num_warmup_steps)
        if not is_tracer((state.z, model_args, model_kwargs)):
            arrays, _, key = split_arrays(model_args, model_kwargs)
            if self._data_checked != key:
                check_data(name, self, state, vectorized, arrays + [r.source for r in streamed_sources(model_args)],
                           model_args, model_kwargs)
                self._data_checked = key
        if not is_tracer(state.potential_energy) and not np.isfinite(np.asarray(state.potential_energy)).all():
            raise ValueError(
                f"{type(self).__name__}: the potential is not finite at the initial point; check the "
                "model (e.g. data outside the likelihood's support) or pass another init_strategy / "
                "init_params."
            )
        state = self._warmup(state, num_warmup, model_args, model_kwargs)
        self._warn_short_run(state, num_warmup)
        self._sample_fn = self.sample
        return state

    def _warn_short_run(self, state, num_warmup):
        """At the end of warmup, for an algorithm that predicts its autocorrelation time from the
        steps warmup chose (``SampleBlock.relaxation``: the Langevin kernels' default steps), warn
        when the calling ``MCMC``'s ``num_samples`` are too few for it (``checks.warn_short_run``).
        It reads the post-warmup state, so Python waits for warmup to finish before NumPyro
        compiles the sampling loop (no overlap of the two); the other kernels pay nothing."""
        relaxation = self._get_algorithm().block.relaxation
        if relaxation is None or is_tracer((state.kernel_state, num_warmup)) or num_warmup == 0:
            return
        mcmc = _calling_mcmc()
        if mcmc is None:
            return
        # per-chain times, or checks.PredictedRelaxation with the cause (all NaN: no noise estimate,
        # too short a warmup, which the noise warmup has said; nothing more is said)
        warn_short_run(type(self).__name__, relaxation(state.kernel_state), mcmc.num_samples, self._block_steps())

    def _compiled_init(self, init_chains, rng_key, init_params, model_args, model_kwargs, num_warmup_steps):
        """``init_chains(rng_key, init_params, model_args, model_kwargs)`` as one compiled program.

        Run op by op, the initial point, potential and kernel state cost dozens of small XLA
        compilations (measured: 3.4 s at D = 50, two chains; one program: 1 s). The array
        arguments are passed in, never XLA constants. The program is kept for the next
        :meth:`init` with the same arguments (arrays by identity; they are kept alive with it),
        the same number of chains and the same ``num_warmup_steps`` and ``init_params`` structure. Under ``pmap``
        (``chain_method="parallel"``) it is simply called: it is traced already.
        """
        if is_tracer((rng_key, init_params, model_args, model_kwargs)):
            return init_chains(rng_key, init_params, model_args, model_kwargs)
        arrays, rebuild, key = split_arrays(model_args, model_kwargs)
        key = (key, num_warmup_steps, jax.tree.structure(init_params), jnp.shape(rng_key))  # shape: chains
        if self._init_program is None or self._init_program[0] != key:
            program = jax.jit(lambda rng_key, init_params, arrays: init_chains(rng_key, init_params, *rebuild(arrays)),
                              compiler_options=_quick_compile_options("init"))
            self._init_program = (key, program, arrays)
        return self._init_program[1](rng_key, init_params, arrays)

    def postprocess_fn(self, model_args, model_kwargs):
        potential = self.potential
        model_kwargs = {} if model_kwargs is None else model_kwargs

        def postprocess(z):
            model_args_, model_kwargs_ = self._static(model_args, model_kwargs)
            return potential.constrain(potential.view.ravel(z), model_args_, model_kwargs_)

        return postprocess

    # ------------------------------------------------------------------ transition
    def _oracle(self, state, model_args, model_kwargs, method, num_warmup_steps=None):
        if self._mesh is not None:
            return DataParallelOracle(self._mesh, self._mesh_axis, self.potential, model_args, model_kwargs, method,
                                      state.i, random.wrap_key_data(state.shuffle_key),
                                      num_warmup_steps=num_warmup_steps)
        return MinibatchOracle(self.potential, model_args, model_kwargs, method, state.i,
                               random.wrap_key_data(state.shuffle_key), num_warmup_steps=num_warmup_steps)

    def _transition(self, state, theta, step, num_warmup_steps, model_args, model_kwargs, step_fn, method):
        """One SG step of one chain on the carry ``(state, theta)``: the algorithm proposes, the
        driver guards (only what changed) and accounts. ``step`` and ``num_warmup_steps`` are the
        SG step count (``state.i``) and the warmup length, passed apart so that they stay
        unbatched under the vmap over chains (the oracle carries them to the algorithm)."""
        potential = self.potential
        key, k_step = random.split(state.rng_key)
        oracle = self._oracle(state._replace(i=step), model_args, model_kwargs, method, num_warmup_steps)
        new_theta, ks, info = step_fn(k_step, step, theta, state.kernel_state, oracle)
        ok = (jnp.isfinite(info.potential_energy) & _finite(new_theta) & potential.constrained_in_support(new_theta)
              & _changed_finite(ks, state.kernel_state))
        state = _count_grad_evals(state, info.num_grad_evals)._replace(
            i=state.i + 1,
            potential_energy=jnp.where(ok, info.potential_energy, state.potential_energy),
            num_divergences=state.num_divergences + (~ok),
            first_divergence=jnp.where((state.first_divergence < 0) & ~ok, state.i, state.first_divergence),
            diverging=state.diverging | ~ok,
            kernel_state=_guard(ok, ks, state.kernel_state),
            rng_key=key,
        )
        return state, jnp.where(ok, new_theta, theta)

    def _static(self, model_args, model_kwargs):
        """Python scalars among the model arguments stay Python scalars: with
        ``MCMC(..., jit_model_args=True)`` NumPyro passes every argument into its compiled loop,
        where an int such as a ``subsample_size`` argument would become a tracer that
        ``numpyro.plate`` cannot use. The values are those of the run's :meth:`init`."""
        model_args, model_kwargs = streamed_leaves((model_args, model_kwargs))
        positions, names = self._static_args
        model_args = tuple(positions[i] if i in positions and is_tracer(a) else a for i, a in enumerate(model_args))
        model_kwargs = {k: names[k] if k in names and is_tracer(v) else v for k, v in model_kwargs.items()}
        return model_args, model_kwargs

    def _plain_burn_in(self):
        """Whether warmup is sampling under another name: the algorithm's warmup is burn-in
        (:attr:`SGAlgorithm.burn_in`), and a warmup iteration is a sampling iteration (same
        minibatch law and number of steps). Then NumPyro's warmup iterations simply sample, in the
        one compiled program; otherwise warmup runs inside :meth:`init` (``_warmup``)."""
        return (self._get_algorithm().burn_in and self._warmup_subsample == self._subsample
                and self._warmup_steps_per_iteration == self._steps_per_sample)

    def _iteration(self, state, model_args, model_kwargs, warmup):
        """One MCMC iteration of every chain: ``warmup_steps_per_iteration`` warmup steps (the
        iteration that ends warmup freezes what it adapted, ``end_warmup``), or
        ``steps_per_sample`` sampling steps, in one compiled loop; then the algorithm's
        ``end_block``. Only the phase asked for is traced.

        ``num_warmup_steps`` is a multiple of the warmup block, so a block never straddles the
        end of warmup. Inside the block the flat θ is carried (not the dict ``z``).
        """
        alg = self._get_algorithm()
        view = self.potential.view
        vectorized = jnp.ndim(state.i) > 0
        over_chains = jax.vmap if vectorized else (lambda f: f)
        # every chain is at the same SG step: passing it unbatched keeps an algorithm's
        # `lax.cond` on the step (SGFS's refresh) a branch under vmap, not a select of both
        i = state.i[0] if vectorized else state.i
        w = state.num_warmup_steps[0] if vectorized else state.num_warmup_steps

        def block(step_fn, method, steps):
            def chain(s, theta):
                def body(t, carry):
                    return self._transition(*carry, i + t, w, model_args, model_kwargs, step_fn, method)

                if isinstance(steps, int) and steps == 1:
                    return body(0, (s, theta))
                return lax.fori_loop(0, steps, body, (s, theta))

            return chain

        def end_warmup(s, theta):
            oracle = self._oracle(s, model_args, model_kwargs, self._subsample)
            return s._replace(kernel_state=alg.end_warmup(theta, s.kernel_state, oracle)), theta

        state = state._replace(diverging=jnp.zeros_like(state.diverging))
        sampling = state.i >= state.num_warmup_steps
        theta = over_chains(view.ravel)(state.z)
        if alg.start_block is not None:
            theta, ks = over_chains(alg.start_block)(theta, state.kernel_state)
            state = state._replace(kernel_state=ks)
        if warmup:
            k = self._warmup_steps_per_iteration
            state, theta = over_chains(block(alg.step(warmup=True), self._warmup_subsample, k))(state, theta)
            if alg.end_warmup is not None:
                state, theta = lax.cond(i + k >= w, over_chains(end_warmup), lambda *c: c, state, theta)
        else:
            k = self._block_steps(state)
            state, theta = over_chains(block(alg.sample_step, self._subsample, k))(state, theta)
        if alg.end_block is not None:
            def end_block(s, theta, sampling):
                return self._end_block(s, theta, sampling, model_args, model_kwargs)

            state, theta = over_chains(end_block)(state, theta, sampling)
        return state._replace(z=over_chains(view.unravel)(theta))

    def _warmup(self, state, num_warmup, model_args, model_kwargs):
        """Run the ``num_warmup`` warmup iterations inside :meth:`init`, as a program of their own.

        NumPyro compiles the kernel's :meth:`sample` into one loop over warmup and sampling
        iterations (and compiles it again for each of ``mcmc.warmup`` and ``mcmc.run``), so a
        :meth:`sample` that could warm up would carry every warmup step, ``end_warmup`` and its
        curvature estimates into each of those programs. Here warmup is compiled once, and the
        returned state passes NumPyro's warmup iterations through unchanged
        (``idle_iterations``): the program NumPyro compiles holds only the sampling step, the
        rejection guard and the counters. The program is kept for the next :meth:`init` with the
        same arguments. When the calling ``MCMC`` shows a progress bar, warmup runs in about 20
        calls of the same program with a bar of its own. Under ``pmap``
        (``chain_method="parallel"``) the loop is part of NumPyro's traced init.
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
            if self._warmup_program is None or self._warmup_program[0] != key:
                def program(state, num_iterations, arrays):
                    args, kwargs = rebuild(arrays)
                    return lax.fori_loop(0, num_iterations, lambda _, s: self._iteration(s, args, kwargs, True),
                                         state)

                self._warmup_program = (key, jax.jit(program, compiler_options=_quick_compile_options("warmup")),
                                        arrays)
            program = self._warmup_program[1]
            if _calling_mcmc_shows_progress() and num_warmup > 1:
                state = self._warmup_with_progress(program, state, num_warmup, arrays)
            else:
                state = program(state, np.int32(num_warmup), arrays)
        if is_tracer((state.idle_iterations, num_warmup)):
            return state._replace(idle_iterations=jnp.full_like(state.idle_iterations, num_warmup))
        # from NumPy: an eager jnp.full_like (or jnp.asarray) would be one more XLA compilation per run
        idle = np.full(np.shape(state.idle_iterations), num_warmup, np.asarray(state.idle_iterations).dtype)
        return state._replace(idle_iterations=jax.device_put(idle))

    def _warmup_with_progress(self, program, state, num_warmup, arrays, calls=20):
        from tqdm.auto import tqdm

        size = -(-num_warmup // calls)
        with tqdm(total=num_warmup, desc="warmup", dynamic_ncols=True) as bar:
            done = 0
            while done < num_warmup:
                n = min(size, num_warmup - done)
                state = program(state, np.int32(n), arrays)
                done += n
                bar.set_postfix_str(str(self.get_diagnostics_str(state)), refresh=False)
                bar.update(n)
        return state

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

    def _end_block(self, state, theta, sampling, model_args, model_kwargs):
        oracle = self._oracle(state, model_args, model_kwargs, self._subsample)
        key, theta, ks, evals = self._get_algorithm().end_block(state.rng_key, theta, state.kernel_state, oracle,
                                                                sampling)
        return _count_grad_evals(state, evals)._replace(kernel_state=ks, rng_key=key), theta

    # ------------------------------------------------------------------ reporting
    def get_diagnostics_str(self, state):
        """Progress-bar text for ``state``, rendered only when the bar is drawn.

        NumPyro hands the bar a new text after every returned sample; reading the state forces a
        device sync, which would stall the dispatch of every sample. The text returned here is a
        ``ProgressText`` that reads the state when tqdm draws the bar (at most every 0.1 s,
        and once more when the bar closes), so the final line shows the final state.
        """
        if jnp.ndim(state.i) > 0:
            return ""

        def render():
            text = f"{float(state.data_passes):.3g} passes, {int(state.num_divergences)} divergences"
            describe = self._get_algorithm().describe
            extra = describe(state.kernel_state) if describe is not None else ""
            return f"{text}, {extra}" if extra else text

        return ProgressText(render)

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


class SGWrapper(SGKernel):
    """A kernel that runs another kernel's algorithm inside its own (:class:`~numpyro_sgd.SGWithinGibbs`,
    :class:`~numpyro_sgd.VariationalEM`).

    It samples ``model`` (the wrapped kernel's model, or a handler around it) with the wrapped
    kernel's driver options overridden by ``options``, and uses only the wrapped kernel's public
    :meth:`~SGKernel.build` and :attr:`~SGKernel.driver_options`. A wrapper cannot wrap another
    wrapper.

    :param str name: the wrapper's name in error messages.
    :param SGKernel kernel: the wrapped kernel, built on the model.
    :param model: the model the wrapper samples (default: ``kernel.subsampled_model``).
    :param options: :class:`SGKernel` options overriding the wrapped kernel's.
    """

    def __init__(self, kernel, *, model=None, **options):
        name = type(self).__name__
        if not isinstance(kernel, SGKernel) or isinstance(kernel, SGWrapper):
            raise TypeError(
                f"{name}: `kernel` must be a numpyro_sgd sampling kernel built on the model, e.g. "
                f"{name}(ConstantSGD(model)), not a wrapper (the numpyro_sgd kernels SGWithinGibbs and VariationalEM "
                f"wrap one); got {type(kernel).__name__}."
            )
        self.supports_clusters = kernel.supports_clusters  # the wrapped kernel's own index rule, if any
        super().__init__(kernel.subsampled_model if model is None else model, **{**kernel.driver_options, **options})
        self._inner = kernel

    @property
    def inner_kernel(self):
        """The wrapped kernel."""
        return self._inner

    def inner_algorithm(self, potential):
        """The wrapped kernel's algorithm on ``potential``, as the bare kernel would run it except
        that the wrapper's driver takes the steps per sample (:meth:`SGKernel.build`)."""
        return self._inner.build(potential, adapt_steps_per_sample=False)
