"""The model's traced program, evaluated as one jitted call: a cache of jitted replays of
jaxprs keyed by their text, and the choice between a nested call and inlining (several devices).
"""

from __future__ import annotations

import jax
from jax._src import core as _jax_core  # only for under_a_trace
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun


def under_a_trace():
    """Whether JAX is staging a program (jit, pmap, shard_map, scan ...) rather than running ops
    one by one (eagerly, or under an eager vmap/grad). JAX has no public query for this; where
    its private one is missing, the answer is "yes", which keeps the inlined evaluation."""
    query = getattr(_jax_core, "unsafe_am_i_under_a_jit", None)
    return True if query is None else bool(query())


_REPLAYS = {}


_REPLAYS_KEPT = 32


def replay(jaxpr):
    """A jitted ``(consts, *args) -> outputs`` evaluating ``jaxpr``, shared by equal programs.

    Called op by op (NumPyro applies the vmapped ``postprocess_fn`` to the initial state for the
    shapes of its sample buffers), a jaxpr would cost one XLA compilation per operation; jitted
    it is one program, and under an enclosing trace a nested call (:func:`evaluate`). The
    kernel traces its model afresh at each ``init``, so the program is looked up by the jaxpr's
    text (with the constants as arguments, equal text is the same computation): a second run
    compiles nothing new.
    """
    key = str(jaxpr)
    fn = _REPLAYS.get(key)
    if fn is None:
        fn = jax.jit(lambda consts, *args: jaxpr_as_fun(ClosedJaxpr(jaxpr, consts))(*args))
        if len(_REPLAYS) >= _REPLAYS_KEPT:
            _REPLAYS.pop(next(iter(_REPLAYS)))
        _REPLAYS[key] = fn
    return fn


def evaluate(closed, arrays, replayed=None):
    """The outputs of the closed jaxpr ``closed`` on ``arrays``, as a call of one jitted program
    (``replayed``, else :func:`replay`'s).

    Where JAX runs op by op, that is one compiled program instead of one per operation. Inside a
    trace it is a nested call, which XLA inlines: JAX then differentiates, batches and lowers the
    model's jaxpr once per kind of use (its ``jvp``/``vmap`` rules for a jitted call keep their
    results for the same jaxpr) instead of going through it equation by equation at every use,
    and a kernel's step uses the potential many times (gradient, per-example gradients, noise
    moments, curvature). With several devices (``mesh=``, ``chain_method="parallel"``,
    ``jax.distributed``) the jaxpr is inlined as it is instead: there a nested jit meets JAX's
    sharding rules (pmap's per-chain mesh against the data's).
    """
    if jax.device_count() > 1 and under_a_trace():
        return jaxpr_as_fun(closed)(*arrays)
    return (replayed or replay(closed.jaxpr))(closed.consts, *arrays)
