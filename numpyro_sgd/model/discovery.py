"""From a NumPyro model to what the kernels need: one trace that finds the latent sites, the
subsample plates and their observed sites (:func:`discover`), the NumPyro handlers that set a
plate's indices or mask its sites, the flat layout of θ (:class:`FlatView`), and the checks made
on the way (plate sizes against the data, supports, tracer errors in the model's Python).
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify
from numpyro import handlers
from numpyro.distributions.constraints import real
from numpyro.primitives import Messenger

from ..data.model_args import split_arrays
from ..data.streaming import PAST_THE_DATA, streamed_sources
from ..validation import check_param_values
from .replay import evaluate


class PlateInfo(NamedTuple):
    """A subsample plate of the model."""

    name: str
    #: number of data points N in the plate
    size: int
    #: minibatch size S
    subsample_size: int
    #: B: minibatches are S/B clusters of B consecutive rows
    #: (:func:`~numpyro_sgd.minibatch.with_replacement.cluster_indices`); 1: random rows
    cluster_size: int = 1


class AllRows(Messenger):
    """Every subsample plate of the model set to all of its rows, at the size the plate declares
    in this call (``numpyro.plate(name, N, subsample_size=S)`` gets the indices ``arange(N)`` of
    this call's N), so the model evaluates the full data it is given, whatever data an earlier
    ``init`` traced."""

    def process_message(self, msg):
        if msg["type"] != "plate":
            return
        size, subsample_size = msg["args"]
        if subsample_size is not None and subsample_size != size:
            # concrete even inside a jit (ArviZ's export traces the model under one): NumPy data
            # cannot be indexed by a tracer
            with jax.ensure_compile_time_eval():
                msg["value"] = jnp.arange(size)
            msg["args"] = (size, size)


class SetPlateIndices(Messenger):
    """Substitute indices into subsample plates and keep NumPyro's N/len(idx) scaling.

    ``indices=None`` is the discovery mode: every subsample plate is validated, recorded into
    ``self.found`` and given the indices ``arange(S)`` (a valid minibatch, no O(N) draw).
    Setting ``msg["args"]`` as well as ``msg["value"]`` avoids NumPyro's warning that the
    substituted length differs from the declared subsample_size (e.g. for one index).
    """

    def __init__(self, fn=None, indices=None, promote=None, name="numpyro_sgd"):
        self.indices = indices
        self.name = name
        self.promote = {} if promote is None else promote
        self.found = {}
        #: {name: size} of the plates that do not subsample (discovery mode), and those of them
        #: that declare subsample_size = size
        self.full_plates, self.declared_full = {}, []
        super().__init__(fn)

    def postprocess_message(self, msg):
        # discovery: a numpyro.param outside its constraint is refused before the model uses it
        if self.indices is None and msg["type"] == "param":
            check_param_values(self.name, {msg["name"]: msg["value"]},
                               {msg["name"]: msg["kwargs"].get("constraint", real)})

    def process_message(self, msg):
        if msg["type"] != "plate":
            return
        size, subsample_size = msg["args"]
        name = msg["name"]
        if self.indices is None and subsample_size is not None and (
                isinstance(subsample_size, (bool, np.bool_)) or not isinstance(subsample_size, (int, np.integer))):
            raise ValueError(
                f"numpyro_sgd: plate '{name}' has subsample_size={subsample_size!r} ({type(subsample_size).__name__}), "
                f"not an integer; declare numpyro.plate('{name}', {size}, subsample_size=S) with an int S"
                + (f", e.g. subsample_size={int(subsample_size)}." if isinstance(subsample_size, float)
                   and subsample_size.is_integer() else ".")
            )
        if self.indices is None:
            if (subsample_size is None or subsample_size == size) and name in self.promote:
                subsample_size = min(self.promote[name], size)  # the kernel's S for a full plate
                msg["args"] = (size, subsample_size)
            if subsample_size is None or subsample_size == size:
                self.full_plates[name] = int(size)
                if subsample_size is not None:
                    self.declared_full.append(name)
                return
            if not 1 <= subsample_size <= size:
                raise ValueError(
                    f"numpyro_sgd: plate '{name}' has subsample_size={subsample_size} but "
                    f"size={size}; use 1 <= subsample_size <= size, e.g. "
                    f"numpyro.plate('{name}', {size}, subsample_size={min(100, size)})."
                )
            self.found[name] = PlateInfo(name, int(size), int(subsample_size))
            msg["value"] = jnp.arange(subsample_size)
        elif name in self.indices:
            idx = self.indices[name]
            msg["value"] = idx
            msg["args"] = (size, idx.shape[0])


class MaskPlateSites(Messenger):
    """Mask (drop from the log density) every sample site inside the given plates, or with
    ``outside`` every site outside them (the constraint Jacobians included: NumPyro adds them as
    factor sites where their latent is)."""

    def __init__(self, fn=None, plate_names=(), outside=False):
        self.plate_names = set(plate_names)
        self.outside = outside
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and (any(f.name in self.plate_names for f in msg["cond_indep_stack"])
                                        != self.outside):
            msg["fn"] = msg["fn"].mask(False)


class FlatView:
    """Ravel a dict of arrays into one vector and back, with static (picklable) shapes."""

    def __init__(self, example):
        self.names = tuple(sorted(example))
        self.shapes = tuple(tuple(np.shape(example[k])) for k in self.names)
        self.sizes = tuple(int(np.prod(s, dtype=int)) for s in self.shapes)
        self.dim = sum(self.sizes)

    def ravel(self, params):
        return jnp.concatenate([jnp.ravel(params[k]) for k in self.names])

    def unravel(self, flat):
        out, start = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes):
            out[name] = jnp.reshape(flat[start : start + size], shape)
            start += size
        return out


def site_plates(site, plate_names):
    return [f.name for f in site["cond_indep_stack"] if f.name in plate_names]


@contextlib.contextmanager
def quiet_callback_errors():
    """JAX logs a failing host callback at ERROR level before raising; the plate check expects one."""
    logger = logging.getLogger("jax._src.callback")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


#: what a row index of an N-row data array may be, on every path (the words of every message):
#: a streamed array raises at the read, and the driver's init program checks JAX arrays at every
#: plate's first and last index (:func:`index_probe`), where JAX alone would clamp
INDEX_RULE = "Every path indexes as NumPy does: a row i of an N-row array needs -N <= i < N"


def _probe_indices(potential):
    """``{plate: [0, 0, …, N − 1]}``: every subsample plate's first and last index, in a minibatch
    of the plate's S rows (the shape the potential is traced at anyway: no trace of its own)."""
    return {q.name: jnp.zeros(q.subsample_size, jnp.int32).at[-1].set(q.size - 1) for q in potential.plates}


def index_probe(potential, model_args, model_kwargs):
    """JAX's index checks (``checkify``) on the minibatch potential at every plate's first and last
    index (:func:`_probe_indices`): the ``checkify`` error, to be read on the host by
    :func:`raise_index_error`. Traceable: the driver evaluates it inside its compiled init
    program, so that it costs no program of its own. Returns ``(error, potential)``: a caller
    inside a program keeps the potential as an output, so that a streamed array's reads (whose
    reader raises on its own) are not dropped as unused."""
    return checkify.checkify(potential.potential, errors=checkify.index_checks)(
        jnp.zeros(potential.dim), _probe_indices(potential), model_args, model_kwargs)


def checked_run(run, potential, model_args, model_kwargs):
    """``run()``'s first output, a program that also returns :func:`index_probe`'s ``(error,
    potential)``, once the probe is read: an index past the data raises
    (:func:`raise_index_error`), from JAX's index checks or from a streamed read."""
    with quiet_callback_errors():
        try:
            out, (error, probed) = run()
            jax.block_until_ready(probed)  # where a streamed read past the data fails
            message = error.get()
        except Exception as e:  # a streamed read past the data (the native reader, the callback)
            message = past_the_data(e)
            if message is None:
                raise
    raise_index_error(potential, message, model_args, model_kwargs)
    return out


def past_the_data(error):
    """The words of a streamed read past the data in an exception (StreamedRows.gather, the native
    reader), or None when ``error`` is something else."""
    found = re.search(rf"row -?\d+ {PAST_THE_DATA} \d+ rows", str(error))
    return found.group(0) if found else None


def raise_index_error(potential, message, model_args, model_kwargs):
    """Raise the ValueError for an out-of-range index of the data (``message``: JAX's index check,
    or :func:`past_the_data`'s words; nothing when empty): a plate larger than the data it indexes,
    or an index the model shifts past them (``X[idx + 1]``), named with :data:`INDEX_RULE`."""
    if not message:
        return
    arrays = split_arrays(model_args, model_kwargs)[0]
    lengths = [d for a in arrays for d in np.shape(a)[:1]] + [len(r) for r in streamed_sources((model_args,
                                                                                              model_kwargs))]
    message = message.strip().rstrip(".")
    read = re.search(r"with size (\d+)|data with (\d+) rows", message)  # the length of the array read past
    limit = int(next(g for g in read.groups() if g)) if read else max(lengths, default=None)
    larger = [p for p in potential.plates if limit is not None and p.size > limit]
    if larger:
        p = larger[0]
        raise ValueError(
            f"{potential.kernel_name}: plate '{p.name}' has size {p.size}, but the data it indexes are shorter "
            f"({message}): minibatch indices up to {p.size - 1} would read past the data, which "
            f"JAX clamps silently. Declare the plate with the data's length, e.g. "
            f"numpyro.plate('{p.name}', X.shape[0], subsample_size=...)."
        )
    ends = ", ".join(f"'{q.name}': 0 and {q.size - 1}" for q in potential.plates)
    raise ValueError(
        f"{potential.kernel_name}: the model reads its data outside their rows at the plates' first and last "
        f"indices ({ends}): {message}. {INDEX_RULE}, a streamed array raises, and JAX would clamp such "
        "an index silently (the last row read again). Index the data with the plate's own indices (X[idx]); "
        "to read a neighbouring row, take it modulo the length (X[(idx + 1) % N]) or pass it as its own column."
    )


def check_plate_sizes(potential, model_args, model_kwargs):
    """Raise when a subsample plate is larger than the data it indexes: its indices would run
    past the data, and JAX clamps out-of-range gathers silently (the last row repeated).

    Cheap first: a plate no larger than some dimension of an array argument (or than a streamed
    argument's rows), and no larger than any streamed argument, passes; the driver's init
    program then checks the plates' ends (:func:`index_probe`). Otherwise (a larger plate, or
    data closed over by the model) :func:`index_probe` is evaluated here, before any compute.
    """
    arrays = split_arrays(model_args, model_kwargs)[0]
    streams = streamed_sources((model_args, model_kwargs))
    largest = max([d for a in arrays for d in np.shape(a)] + [len(r) for r in streams], default=0)
    if all(p.size <= largest and all(len(r) >= p.size for r in streams) for p in potential.plates):
        return
    with warnings.catch_warnings(), quiet_callback_errors():
        warnings.simplefilter("ignore")
        try:
            message = index_probe(potential, model_args, model_kwargs)[0].get()
        except Exception as e:  # a streamed read past the data (StreamedRows.gather)
            message = past_the_data(e)
            if message is None:
                raise
    raise_index_error(potential, message, model_args, model_kwargs)


def in_open_support(transform, u):
    """All of ``transform(u)`` finite, in the codomain, and strictly inside its bounds."""
    v = transform(u)
    support = transform.codomain
    ok = jnp.all(jnp.isfinite(v)) & jnp.all(support.check(v))
    lower, upper = getattr(support, "lower_bound", None), getattr(support, "upper_bound", None)
    if lower is not None:
        ok = ok & jnp.all(v > lower)
    if upper is not None:
        ok = ok & jnp.all(v < upper)
    return ok


#: what JAX raises when a model turns a traced value into a NumPy array or a Python value
TRACER_ERRORS = (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError,
                 jax.errors.TracerIntegerConversionError)


def explain_tracer_errors(model, kernel_name):
    """``model``, re-raising JAX's tracer-conversion errors with the likely cause and the fix.

    The kernel traces the model with its array arguments (compiled init,
    ``jit_model_args=True``, ``chain_method="parallel"``) and always with traced minibatch
    indices; NUTS traces a model without subsample plates only with concrete data, so NumPy or
    Python logic on the data that works there fails here with a jaxpr dump.
    """
    def explained(*args, **kwargs):
        try:
            return model(*args, **kwargs)
        except TRACER_ERRORS as err:
            raise TypeError(
                f"{kernel_name}: the model calls NumPy or Python on a value the sampler traces "
                f"({type(err).__name__}): its array arguments and the plate's minibatch indices are JAX tracers "
                "here, so e.g. len(np.unique(group)), int(x.max()) or a NumPy array closed over by the model and "
                "indexed with the plate's indices cannot run; compute such sizes outside the model and pass them "
                "as Python ints (n_groups=len(np.unique(group))), and use jnp, or pass the data as model "
                "arguments, for array operations."
            ) from err

    return explained


def discover(model, model_args, model_kwargs, rng_key, init_strategy, kernel_name, promote=None):
    """Trace ``model`` once in discovery mode: ``(trace, finder)`` (``finder.found``: its subsample
    plates; ``promote``: full plates to treat as subsampled with the given S).

    The trace runs as one compiled program (:func:`replay`), not op by op: run eagerly, each
    operation of the model compiles an XLA program of its own for the data's shapes (about 17 for
    a GLM, 0.6–0.8 s on a 2-core CPU at a new N, more on a GPU). The program returns every sample
    and param site's value, and every support or param constraint that depends on a traced value,
    so the trace given back holds concrete arrays wherever the caller reads values; the
    distributions in it (``site["fn"]``) are for their static facts only (support type,
    discreteness). NumPyro's argument validation still checks constants (it evaluates them at
    trace time).
    """
    finder = SetPlateIndices(promote=promote, name=kernel_name)
    traced = handlers.trace(handlers.substitute(handlers.seed(finder(explain_tracer_errors(model, kernel_name)),
                                                              rng_key), substitute_fn=init_strategy))
    arrays, rebuild, _ = split_arrays(model_args, model_kwargs)
    box = {}

    def program(arrays):
        args, kwargs = rebuild(arrays)
        box["trace"] = tr = traced.get_trace(*args, **kwargs)
        out = {}
        for name, site in tr.items():
            if site["type"] in ("sample", "param"):
                out[(name, "value")] = site["value"]
            support = declared_support(site)  # latent sites only, as from_model reads them
            if support is not None and any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(support)):
                out[(name, "support")] = support
        return out

    try:
        # traced here; compiled once per distinct program (a second run, or a new MCMC on the same
        # model and shapes, compiles nothing new)
        closed, out_shape = jax.make_jaxpr(program, return_shape=True)(arrays)
        concrete = jax.tree.unflatten(jax.tree.structure(out_shape), evaluate(closed, arrays))
        tr = box["trace"]
        for (name, what), value in concrete.items():
            tr[name]["value" if what == "value" else "_concrete_support"] = value
        return tr, finder
    except NotImplementedError as e:  # pragma: no cover - unusual user distributions
        raise ValueError(f"{kernel_name}: could not trace the model: {e}") from e
    except ValueError as e:
        sizes = {p.subsample_size for p in finder.found.values()} | {p.size for p in finder.found.values()}
        if not (str(e).startswith("Incompatible shapes for broadcasting") and finder.found
                and any(str(n) in str(e) for n in sizes)):
            raise
        plates = ", ".join(f"'{p.name}' (N = {p.size}, subsample_size = {p.subsample_size})"
                           for p in finder.found.values())
        raise ValueError(
            f"{kernel_name}: a site inside the subsample plate {plates} has a shape that does not broadcast with "
            f"the plate's minibatch ({e}): the model uses all N rows of its data inside the plate instead of "
            "the minibatch. Index every data array by the plate's indices: `with numpyro.plate('data', N, "
            "subsample_size=S) as idx: numpyro.sample('obs', dist.Normal(X[idx] @ w, sigma), obs=y[idx])` "
            "(or numpyro.subsample(y, event_dim=0))."
        ) from e


def declared_support(site):
    """A param site's constraint (``real`` if it declares none) or a latent sample site's
    support, as the model declared it (traced leaves where it depends on traced values); None
    for any other site."""
    if site["type"] == "param":
        return site["kwargs"].get("constraint", real)
    if site["type"] == "sample" and not site.get("is_observed"):
        return site["fn"].support
    return None


def discovered_support(site):
    """A latent site's support, or a param site's constraint, from :func:`discover`'s trace
    (concrete where it was traced)."""
    return site["_concrete_support"] if "_concrete_support" in site else declared_support(site)


def unindexed_observations(trace, promote, full_plates):
    """Observed sites in a promoted plate whose value still holds all N rows along the plate's
    dimension (``obs=y`` instead of ``obs=y[idx]``): substituting a minibatch cannot work."""
    out = []
    for name, site in trace.items():
        if site["type"] != "sample" or not site.get("is_observed"):
            continue
        for frame in site["cond_indep_stack"]:
            shape = np.shape(site["value"])
            if (frame.name in promote and len(shape) >= -frame.dim
                    and shape[frame.dim] == full_plates[frame.name] != promote[frame.name]):
                out.append(name)
    return out


def plates_to_promote(trace, full_plates, subsample_size, kernel_name):
    """``{plate: S}`` for a model none of whose plates subsamples: the plates the kernel's
    ``subsample_size`` names (a dict), or the one plate holding observed sites (an int)."""
    if isinstance(subsample_size, dict):
        unknown = sorted(set(subsample_size) - set(full_plates))
        if unknown:
            raise ValueError(f"{kernel_name}: subsample_size names {unknown}, which are not plates of the model "
                             f"(those are {sorted(full_plates)}).")
        return dict(subsample_size)
    observed = sorted({f.name for site in trace.values() if site["type"] == "sample" and site.get("is_observed")
                       for f in site["cond_indep_stack"] if f.name in full_plates})
    if len(observed) != 1:
        raise ValueError(
            f"{kernel_name}: no plate of the model subsamples, and subsample_size={subsample_size} does not say "
            f"which to subsample: the plates holding observed sites are {observed or 'none'}. Pass "
            "subsample_size={plate name: S}, or declare numpyro.plate(name, N, subsample_size=S) in the model."
        )
    return {observed[0]: subsample_size}


def override_subsample_sizes(plates, subsample_size, kernel_name):
    """The plates with the kernel's ``subsample_size`` in place of the model's (see ``from_model``)."""
    if subsample_size is None or not plates:
        return plates
    names = [p.name for p in plates]
    sizes = subsample_size if isinstance(subsample_size, dict) else {name: subsample_size for name in names}
    unknown = sorted(set(sizes) - set(names))
    if unknown:
        raise ValueError(f"{kernel_name}: subsample_size names {unknown}, which are not subsample plates of the "
                         f"model (those are {names}); declare numpyro.plate(name, N, subsample_size=S) in the model.")
    out = []
    for p in plates:
        s = sizes.get(p.name, p.subsample_size)
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 1 <= s <= p.size:
            raise ValueError(f"{kernel_name}: subsample_size={s!r} for plate '{p.name}' must be an integer in "
                             f"[1, {p.size}] (the plate's size N).")
        out.append(p._replace(subsample_size=int(s)))
    return tuple(out)
