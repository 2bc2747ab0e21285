"""Subsampled potentials for any NumPyro model.

Every kernel in this package sees the model only through :class:`SubsampledPotential`. It is
built once per ``MCMC.run`` from one trace of the user's model and then provides, for a flat
vector ``theta`` of the unconstrained global latents (notation of Mandt et al. 2017):

* ``draw_indices(key)``: fresh minibatch indices for every subsample plate, in O(S);
* ``potential_and_grad(theta, idx)``: the minibatch potential
  Û_S(θ) = −log p(θ) − Σ_plates (N/S) Σ_{n∈S} log p(x_n | θ) and its gradient (NumPyro's own
  plate scaling N/S is used: the indices are substituted into the plate, which then scales);
* ``per_example_grads(theta, idx)``: Û_S, ∇Û_S and, per plate, the S × D matrix of
  single-example potential gradients ∇Û_{[n]} (the plate substituted with the one index n, so
  NumPyro scales it by N/1). Their mean is ∇Û_S exactly and their covariance over n is
  N² Cov_n[∇ log p(x_n|θ)], the per-plate gradient noise (``noise.py``);
* ``full_potential(theta)``: the full-data potential U(θ) (plate set to all N indices).

The plate never draws its own indices (that costs O(N) per step in NumPyro's Fisher–Yates
shuffle); the kernel draws them and substitutes them.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.distributions.constraints import real
from numpyro.distributions.transforms import IdentityTransform
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import constrain_fn, potential_energy

from ..data.model_args import as_jax_args, split_arrays
from ..data.streaming import one_read_per_plate
from ..minibatch.law import law_of
from ..minibatch.policy import MIN_STEPS_PER_PASS, choose_subsample_size
from ..validation import check_model_args
from .discovery import (
    FlatView,
    MaskPlateSites,
    SetPlateIndices,
    check_plate_sizes,
    discover,
    discovered_support,
    explain_tracer_errors,
    in_open_support,
    override_subsample_sizes,
    plates_to_promote,
    site_plates,
    unindexed_observations,
)
from .replay import evaluate, replay

__all__ = ["SubsampledPotential"]


# ---------------------------------------------------------------------------- index draws


class SubsampledPotential:
    """The subsampled potential of a NumPyro model whose data plates subsample.

    Built by :meth:`from_model`, which traces the model once and raises a clear
    ``ValueError`` at once (before any sampling) for models the package cannot handle.

    :param model: the NumPyro model.
    :param tuple plates: :class:`PlateInfo` of every subsample plate.
    :param view: (``FlatView``) the layout of the flat unconstrained vector θ.
    :param dict param_values: values of ``numpyro.param`` sites (held fixed, as NUTS does).
    :param dict observed: plate name -> names of observed sites inside it.
    :param tuple plate_deterministic: deterministic sites inside a subsample plate (they depend
        on the minibatch and are not returned by :meth:`constrain`).
    :param str kernel_name: name used in error messages.
    :param dict transforms: site name -> transform from unconstrained space to the support.
    :param dict param_constraints: ``numpyro.param`` name -> its constraint (``real`` if none).
    """

    def __init__(self, model, plates, view, param_values, observed, plate_deterministic, kernel_name,
                 transforms=None, param_constraints=None):
        self.model = model
        self.plates = tuple(plates)
        self.view = view
        self.param_values = param_values
        self.observed = observed
        self.plate_deterministic = tuple(plate_deterministic)
        self.kernel_name = kernel_name
        self.transforms = {} if transforms is None else transforms
        self.param_constraints = {k: real for k in param_values} if param_constraints is None else param_constraints
        self._jaxprs = {}  # see _traced_once
        self._derived = {}  # see derived

    def _replace(self, **changes):
        """A new potential with some constructor fields changed (its traced programs are its own)."""
        fields = dict(model=self.model, plates=self.plates, view=self.view, param_values=self.param_values,
                      observed=self.observed, plate_deterministic=self.plate_deterministic,
                      kernel_name=self.kernel_name, transforms=self.transforms,
                      param_constraints=self.param_constraints)
        return type(self)(**{**fields, **changes})

    def restricted(self, names):
        """The potential of the same model over the latent sites ``names`` only.

        θ then holds those sites; every other latent site must be given, constrained, in the
        ``params`` of each call (it is substituted into the model as a ``numpyro.param`` value
        is), e.g. the hyperparameters φ that :class:`~numpyro_sgd.SGWithinGibbs` holds fixed
        while its inner kernel moves z: Û_S(z; φ) is the model's potential with φ substituted.

        :param names: latent site names (a subset of ``view.names``).
        """
        unknown = sorted(set(names) - set(self.view.names))
        if unknown:
            raise ValueError(f"{self.kernel_name}: restricted() names {unknown}, which are not latent sites "
                             f"of the model (those are {list(self.view.names)}).")
        shapes = dict(zip(self.view.names, self.view.shapes))
        view = FlatView({n: np.zeros(shapes[n]) for n in names})
        return self._replace(view=view, transforms={k: t for k, t in self.transforms.items() if k in view.names})

    def with_model(self, model):
        """The same potential (sites, plates, layout of θ) evaluated on ``model``, a handler-wrapped
        version of this potential's model that keeps its sites (e.g. one that rescales them)."""
        return self._replace(model=model)

    def with_cluster_sizes(self, sizes):
        """The same potential whose plates draw clusters of ``sizes[plate name]`` consecutive rows
        (:func:`~numpyro_sgd.minibatch.with_replacement.cluster_indices`; a plate not named keeps its cluster size)."""
        plates = tuple(p._replace(cluster_size=int(sizes.get(p.name, p.cluster_size))) for p in self.plates)
        return self._replace(plates=plates)

    def derived(self, key, make):
        """``make(self)``, built once per ``key`` and kept with this potential: a potential that an
        oracle derives at every step's trace (the data-parallel oracle's rescaled local potential)
        then keeps its traced programs instead of tracing the model again each time."""
        if key not in self._derived:
            self._derived[key] = make(self)
        return self._derived[key]

    def __getstate__(self):  # the traced programs are rebuilt on first use after unpickling
        state = dict(self.__dict__)
        state["_jaxprs"] = {}
        state["_derived"] = {}
        return state

    def _traced_once(self, name, fn, *tree):
        """``fn(*tree)``, with the model traced once per argument signature.

        The first call with a given signature (tree structure, the array leaves' shapes and
        dtypes, the other leaves' values) traces ``fn`` (and so the model) into a jaxpr; every
        later call, under any transformation (``grad``, ``vmap``, ``jit``, ``checkify``),
        evaluates that jaxpr and never calls the model again. A jaxpr that closed over a value
        of an enclosing trace is used once and not kept.
        """
        leaves, treedef = jax.tree.flatten(tree)
        is_array = [isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves]
        arrays = [leaf for leaf, a in zip(leaves, is_array) if a]
        key = (name, treedef, tuple(jax.typeof(leaf) if a else leaf for leaf, a in zip(leaves, is_array)))
        try:
            entry = self._jaxprs.get(key)
        except TypeError:  # an unhashable static argument: trace as NumPyro would
            return fn(*tree)
        if entry is None:
            def flat(*values):
                it = iter(values)
                return fn(*jax.tree.unflatten(treedef, [next(it) if a else leaf for leaf, a in zip(leaves, is_array)]))

            closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(*arrays)
            entry = (closed, jax.tree.structure(out_shape), replay(closed.jaxpr))
            if not any(isinstance(c, jax.core.Tracer) for c in closed.consts):
                self._jaxprs[key] = entry
        closed, out_tree, replayed = entry
        return jax.tree.unflatten(out_tree, evaluate(closed, arrays, replayed))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, model, model_args=(), model_kwargs=None, *, rng_key=None,
                   init_strategy=init_to_uniform, kernel_name="numpyro_sgd", subsample_size=None,
                   min_steps_per_pass=MIN_STEPS_PER_PASS):
        """Trace ``model`` once, discover its subsample plates and sites, and validate it.

        ``subsample_size`` (an int for every subsample plate, or ``{plate name: S}``) replaces the
        minibatch size the model declares; NumPyro's plate then scales by N/S of the indices the
        kernel substitutes, so the potential stays unbiased. ``"auto"``, or None for a model none
        of whose plates subsamples, gives each plate
        :func:`~numpyro_sgd.minibatch.policy.choose_subsample_size` of its N
        (``min_steps_per_pass``: the kernel's fewest SG steps per data pass).
        """
        model_kwargs = {} if model_kwargs is None else model_kwargs
        check_model_args(kernel_name, model_args, model_kwargs)
        # NumPy data become JAX arrays, as in every later trace: under pmap (chain_method="parallel")
        # the plate's indices are tracers, which a NumPy array cannot be indexed with
        model_args, model_kwargs = as_jax_args((model_args, model_kwargs))
        rng_key = random.key(0) if rng_key is None else rng_key
        promote = {}
        tr, finder = discover(model, model_args, model_kwargs, rng_key, init_strategy, kernel_name)
        implicit = None

        def auto(n):
            return choose_subsample_size(n, min_steps_per_pass=min_steps_per_pass)

        if subsample_size is None and not finder.found and not finder.declared_full and finder.full_plates:
            # the NumPyro one-model pattern with no S anywhere: the kernel picks S for the one plate
            # holding observed sites (if there is no such plate, the error below names the fix)
            try:
                plates_to_promote(tr, finder.full_plates, "auto", kernel_name)
                implicit = subsample_size = "auto"
            except ValueError:
                pass
        if subsample_size == "auto" and finder.found:
            subsample_size = {name: min(auto(p.size), p.size - 1) for name, p in finder.found.items()}
        if not finder.found and subsample_size is not None:
            # the model's plates do not subsample (NumPyro's `subsample_size=None` pattern, one
            # model for NUTS and SG): the kernel's subsample_size says which plate to subsample
            promote = plates_to_promote(tr, finder.full_plates, subsample_size, kernel_name)
            promote = {k: (auto(finder.full_plates[k]) if v == "auto" else v) for k, v in promote.items()}
            fix = ("Index the data with the plate's indices, `with numpyro.plate(name, N, subsample_size="
                   "subsample_size) as idx: ... X[idx] ... obs=y[idx]`, so that a minibatch can be substituted.")
            try:
                promoted = discover(model, model_args, model_kwargs, rng_key, init_strategy, kernel_name, promote)
                unindexed = unindexed_observations(promoted[0], promote, finder.full_plates)
                if unindexed:
                    raise ValueError(f"observed site(s) {unindexed} keep all N rows of the plate")
            except ValueError as e:
                if not implicit:
                    raise ValueError(f"{kernel_name}: subsampling plate(s) {sorted(promote)} (declared without "
                                     f"subsample_size) failed: {e}. {fix}") from e
                promote = {}  # the kernel's own choice of S: the model is not written for it (error below)
            else:
                tr, finder = promoted
        plates = override_subsample_sizes(tuple(finder.found.values()),
                                           None if subsample_size == "auto" else subsample_size, kernel_name)
        if not plates and finder.declared_full and finder.declared_full[0] in promote:
            name = finder.declared_full[0]
            raise ValueError(
                f"{kernel_name}: subsample_size={promote[name]} is at least the size N = {finder.full_plates[name]} "
                f"of plate '{name}', so every step would be a full-data gradient (full-batch gradient descent or "
                "Langevin) with no minibatch noise to estimate. Use NUTS for full-batch sampling, or a "
                "subsample_size below N."
            )
        if not plates and finder.declared_full:
            name = finder.declared_full[0]
            raise ValueError(
                f"{kernel_name}: plate '{name}' declares subsample_size equal to its size "
                f"N = {finder.full_plates[name]}, so every step would be a full-data gradient with no minibatch "
                "noise to estimate. Use NUTS for full-batch sampling, or a subsample_size below N (in the plate "
                "or as the kernel's subsample_size=S)."
            )
        if not plates:
            raise ValueError(
                f"{kernel_name}: the model has no subsample plate; wrap the likelihood in "
                "numpyro.plate('data', N, subsample_size=S) so that the kernel can draw "
                "minibatches (or give the kernel subsample_size=S for a plate declared without one; "
                "use NUTS for full-batch sampling)."
            )
        names = {p.name for p in plates}
        latent, params, observed, plate_det = {}, {}, {p.name: [] for p in plates}, []
        param_constraints = {}
        for name, site in tr.items():
            if site["type"] == "param":
                params[name] = site["value"]
                param_constraints[name] = discovered_support(site)
                continue
            in_plates = site_plates(site, names)
            if site["type"] == "deterministic":
                if in_plates:
                    plate_det.append(name)
                continue
            if site["type"] != "sample":
                continue
            if len(in_plates) > 1:
                raise ValueError(
                    f"{kernel_name}: site '{name}' is inside two subsample plates "
                    f"{in_plates}; the kernel subsamples each plate independently, so a site "
                    "may lie in at most one of them. Subsample only the outer plate."
                )
            if site["is_observed"]:
                if in_plates:
                    observed[in_plates[0]].append(name)
                continue
            if in_plates:
                raise ValueError(
                    f"{kernel_name}: latent site '{name}' is inside the subsample plate "
                    f"'{in_plates[0]}'; local latent variables are not supported by "
                    "stochastic-gradient kernels. Marginalise it out, or move it out of the "
                    "plate (make it a global latent)."
                )
            if site["fn"].support.is_discrete:
                raise ValueError(
                    f"{kernel_name}: latent site '{name}' is discrete; stochastic-gradient "
                    "kernels need continuous latents. Marginalise it out (e.g. with "
                    "numpyro.contrib.funsor enumeration inside a NUTS model) or make it "
                    "continuous."
                )
            latent[name] = site
        if not latent:
            raise ValueError(f"{kernel_name}: the model has no continuous latent sample site to sample.")
        unconstrained = {
            k: biject_to(discovered_support(s)).inv(s["value"]) for k, s in latent.items()
        }
        view = FlatView(unconstrained)
        obs = {k: tuple(v) for k, v in observed.items()}
        transforms = {k: biject_to(discovered_support(s)) for k, s in latent.items()}
        potential = cls(model, plates, view, params, obs, plate_det, kernel_name, transforms, param_constraints)
        check_plate_sizes(potential, model_args, model_kwargs)
        return potential

    # ------------------------------------------------------------------ basic facts
    @property
    def dim(self):
        """D, the dimension of the unconstrained latent vector θ."""
        return self.view.dim

    @property
    def num_data(self):
        """Σ over subsample plates of N (the denominator of a data pass)."""
        return sum(p.size for p in self.plates)

    @property
    def batch_size(self):
        """Σ over subsample plates of S (per-datum gradients per minibatch gradient)."""
        return sum(p.subsample_size for p in self.plates)

    @property
    def steps_per_pass(self):
        """⌈N/S⌉: SG steps per data pass."""
        return -(-self.num_data // self.batch_size)

    def initial_params(self, rng_key, model_args=(), model_kwargs=None, init_strategy=init_to_uniform):
        """Unconstrained initial θ (flat) for one chain, following ``init_strategy``."""
        model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
        idx = {p.name: jnp.arange(p.subsample_size) for p in self.plates}
        # substitute must be outside seed so that the init strategy finds the seeded key
        m = handlers.substitute(
            handlers.seed(SetPlateIndices(self._with_params(), indices=idx), rng_key),
            substitute_fn=init_strategy,
        )
        tr = handlers.trace(m).get_trace(*model_args, **model_kwargs)
        z = {k: biject_to(tr[k]["fn"].support).inv(tr[k]["value"]) for k in self.view.names}
        return self.view.ravel(z)

    # ------------------------------------------------------------------ indices
    def draw_indices(self, rng_key, method="with_replacement", step=None, shuffle_key=None):
        """Minibatch indices ``{plate: int32[S]}`` in O(S) per plate, drawn by the minibatch law
        ``method`` (:mod:`numpyro_sgd.minibatch.law`):

        ``"with_replacement"`` draws S i.i.d. uniform indices (:func:`~numpyro_sgd.minibatch.with_replacement.uniform_indices`),
        or, for a plate with ``cluster_size`` B > 1, S/B i.i.d. uniform clusters of B consecutive
        rows (:func:`~numpyro_sgd.minibatch.with_replacement.cluster_indices`).
        ``"without_replacement"`` draws S i.i.d. indices and redraws the duplicates until
        there are none (expected S²/(2N) redraws); the law of the set is invariant under
        permutations of the data, so it is the uniform law over S-subsets.
        ``"shuffle"`` takes positions ``step*S ... step*S + S - 1`` of a pseudo-random
        permutation of the data that changes every epoch (a keyed Feistel permutation with
        cycle walking, evaluated only at the S positions: no O(N) permutation is stored).
        """
        return law_of(method).draw(rng_key, self.plates, step, shuffle_key)

    # ------------------------------------------------------------------ potentials
    def _with_params(self, params=None):
        values = dict(self.param_values)
        if params is not None:
            values.update(params)
        model = explain_tracer_errors(self.model, self.kernel_name)
        return handlers.substitute(model, data=values) if values else model

    def potential(self, theta, indices, model_args=(), model_kwargs=None, params=None):
        """Û at flat θ with the plates substituted by ``indices`` (NumPyro's N/len(idx) scale).

        The model is traced once per shape of the arguments (``_traced_once``)."""
        model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
        return self._traced_once("potential", self._potential, theta, indices, model_args, model_kwargs, params)

    def _potential(self, theta, indices, model_args, model_kwargs, params):
        model = SetPlateIndices(self._with_params(params), indices=indices)
        sizes = {p.name: p.size for p in self.plates}
        with warnings.catch_warnings(), one_read_per_plate(indices, sizes, (model_args, model_kwargs)):
            warnings.simplefilter("ignore", UserWarning)
            return potential_energy(model, model_args, model_kwargs, self.view.unravel(theta))

    def potential_and_grad(self, theta, indices, model_args=(), model_kwargs=None, params=None):
        """(Û_S(θ), ∇Û_S(θ)) for one minibatch."""
        return jax.value_and_grad(self.potential)(theta, indices, model_args, model_kwargs, params)

    def fixed_step_cost(self, model_args=(), model_kwargs=None):
        """How many data points' worth of work a minibatch gradient does whatever S is.

        XLA's cost analysis (flops) of the lowered ∇Û_S at two minibatch sizes, one row and S
        (every plate at once; nothing is compiled or run; the model traces are those the sampler
        uses anyway) gives cost(s) = a + b s; the result is a / b,
        the S-independent work in units of one datum's. A well-written model scores about the
        prior's cost (a few data points); one that computes on all N rows every step (e.g. a
        predictor ``mu = X @ w`` indexed as ``mu[idx]`` inside the plate) scores about N.
        Returns None where the cost analysis is unavailable.
        """
        arrays, rebuild, _ = split_arrays(model_args, {} if model_kwargs is None else model_kwargs)
        abstract = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in arrays]
        theta = jax.ShapeDtypeStruct((self.dim,), jnp.result_type(float))

        def flops(scale):
            idx = {p.name: jax.ShapeDtypeStruct((1 if scale == 1 else min(p.size, p.subsample_size),), jnp.int32)
                   for p in self.plates}
            fn = jax.jit(lambda th, i, arr: self.potential_and_grad(th, i, *rebuild(arr)))
            cost = fn.lower(theta, idx, abstract).cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            return (float(cost["flops"]) if cost and "flops" in cost else None), sum(v.shape[0] for v in idx.values())

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (f1, n1), (f2, n2) = flops(1), flops(2)
        except Exception:  # noqa: BLE001 - an advisory check; the sampler reports real failures
            return None
        if f1 is None or f2 is None or n2 == n1 or f2 <= f1:
            return None
        per_datum = (f2 - f1) / (n2 - n1)
        return max(0.0, f1 - per_datum * n1) / per_datum

    def per_example_grads(self, theta, indices, model_args=(), model_kwargs=None, params=None):
        """Û_S(θ), ∇Û_S(θ) and a tuple (one per plate) of S × D single-example gradients.

        For plate p the row n is ∇Û with plate p substituted by the single index n (scale N_p)
        and the other plates at their minibatch. The rows average to ∇Û_S and their covariance
        over n is N_p² Cov_n[∇ log p(x_n | θ)]. One vmapped pass (about 1.0–1.3× the cost of
        the minibatch gradient for one plate); with several plates each plate costs S_p
        minibatch-of-the-others evaluations.
        """
        vg = jax.value_and_grad(self.potential)
        pots, grads = [], []
        for p in self.plates:
            def single(i, _p=p):
                idx = dict(indices)
                idx[_p.name] = i[None]
                return vg(theta, idx, model_args, model_kwargs, params)

            pot_p, grad_p = jax.vmap(single)(indices[p.name])
            pots.append(jnp.mean(pot_p))
            grads.append(grad_p)
        # Every plate's rows average to the same minibatch gradient; use the first plate's.
        return pots[0], jnp.mean(grads[0], axis=0), tuple(grads)

    def prior_potential(self, theta, model_args=(), model_kwargs=None, params=None):
        """The potential without its likelihood: −log p(θ) − log|J| (sites in the plates masked)."""
        model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
        return self._traced_once("prior", self._prior_potential, theta, model_args, model_kwargs, params)

    def _prior_potential(self, theta, model_args, model_kwargs, params):
        idx = {p.name: jnp.arange(p.subsample_size) for p in self.plates}
        model = MaskPlateSites(SetPlateIndices(self._with_params(params), indices=idx),
                                plate_names=[p.name for p in self.plates])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return potential_energy(model, model_args, model_kwargs, self.view.unravel(theta))

    def likelihood(self, theta, indices, model_args=(), model_kwargs=None, params=None):
        """Û_S(θ) without its prior and Jacobian terms: the sites inside the subsample plates, with
        the plates substituted by ``indices`` (NumPyro's N/len(idx) scale), so that ``potential``
        = ``likelihood`` + :meth:`prior_potential` with neither computed from the other. Taking the
        prior off the potential instead loses the likelihood to rounding where the prior's
        curvature dwarfs it: a horseshoe's 1/(τλ_j)² reaches 10¹² for a null coefficient, where
        float32 keeps a likelihood curvature of 10⁵ to ±2¹⁶ (measured: a centre whose ∇²L held 0
        and 2²⁰ on its diagonal for XᵀX's 10⁵, and a chain stuck at σ = 3.6 against 1.0)."""
        model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
        return self._traced_once("likelihood", self._likelihood, theta, indices, model_args, model_kwargs, params)

    def _likelihood(self, theta, indices, model_args, model_kwargs, params):
        model = MaskPlateSites(SetPlateIndices(self._with_params(params), indices=indices),
                               plate_names=[p.name for p in self.plates], outside=True)
        sizes = {p.name: p.size for p in self.plates}
        with warnings.catch_warnings(), one_read_per_plate(indices, sizes, (model_args, model_kwargs)):
            warnings.simplefilter("ignore", UserWarning)
            return potential_energy(model, model_args, model_kwargs, self.view.unravel(theta))

    def full_indices(self):
        return {p.name: jnp.arange(p.size) for p in self.plates}

    def full_potential(self, theta, model_args=(), model_kwargs=None, params=None):
        """U(θ) on all the data (every plate set to all its N indices, scale 1)."""
        return self.potential(theta, self.full_indices(), model_args, model_kwargs, params)

    def full_hessian(self, at, model_args=(), model_kwargs=None, params=None):
        """∇²U at ``at`` (flat θ or a dict of unconstrained values) on all the data, as NumPy (D, D)."""
        theta = self.view.ravel(at) if isinstance(at, dict) else jnp.asarray(at)
        return np.asarray(jax.hessian(self.full_potential)(theta, model_args, model_kwargs, params))

    # ------------------------------------------------------------------ constraining
    def constrained_in_support(self, theta):
        """Whether θ maps to constrained values inside the open support: finite (exp(log σ) does
        not overflow) and off its boundary (exp(log σ) does not underflow to σ = 0.0; a sigmoid
        does not round to 0 or 1), so that no returned draw sits where the density is 0 or ∞.

        Uses the support transforms found at init (cheap, O(D), no model evaluation); a support
        that depends on other latents is checked with its transform at the initial point.
        """
        z = self.view.unravel(theta)
        checks = [in_open_support(t, z[k]) for k, t in self.transforms.items()
                  if not isinstance(t, IdentityTransform)]  # θ itself is checked by the caller
        return jnp.all(jnp.stack(checks)) if checks else jnp.array(True)

    def constrain(self, theta, model_args=(), model_kwargs=None, params=None):
        """Latent sites in their support plus global deterministic sites, from flat θ.

        Deterministic sites inside a subsample plate depend on the minibatch and are left
        out; use :class:`numpyro.infer.Predictive` with the samples to get them.
        """
        model_args, model_kwargs = as_jax_args((model_args, {} if model_kwargs is None else model_kwargs))
        return self._traced_once("constrain", self._constrain, theta, model_args, model_kwargs, params)

    def _constrain(self, theta, model_args, model_kwargs, params):
        idx = {p.name: jnp.arange(p.subsample_size) for p in self.plates}
        model = SetPlateIndices(self._with_params(params), indices=idx)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            out = constrain_fn(model, model_args, model_kwargs, self.view.unravel(theta),
                               return_deterministic=True)
        return {k: v for k, v in out.items() if k not in self.plate_deterministic}


