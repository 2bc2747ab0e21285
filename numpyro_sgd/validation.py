"""Argument and input checks shared by the kernels (raised before any compute).

Every message names the kernel, the argument (or site, or model argument), what was given and
the fix, in one sentence (STYLE.md, "Errors"). Types follow NumPy/NumPyro: a value that is not
a number at all (a string, a list) is a ``TypeError``; a number out of range, a bool, or a
non-integral number where an integer is needed is a ``ValueError`` (as the kernels have always
raised for them). NumPy and 0-d JAX scalars are accepted and returned as Python values.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["check_choice", "check_number", "check_positive", "check_int", "check_model_args", "check_init_params",
           "check_param_values"]


def _describe(value):
    return f"{value!r} (a {type(value).__name__})"


def check_choice(name, arg, value, choices, hint=""):
    """``value`` if it is one of the strings ``choices``; else a ``ValueError`` naming ``arg``, what
    was given and every choice (``hint``: what the choices mean, appended in parentheses)."""
    if isinstance(value, str) and value in choices:
        return value
    listed = " or ".join([", ".join(repr(c) for c in choices[:-1]), repr(choices[-1])] if len(choices) > 1
                         else [repr(choices[0])])
    raise ValueError(f"{name}: unknown {arg} {value!r}; choose {listed}" + (f" ({hint})" if hint else "") + ".")


def check_number(name, arg, value, what="a number"):
    """``value`` as a Python float; ``TypeError`` naming ``arg`` unless it is a real scalar
    (Python, NumPy or 0-d JAX; a string such as ``"0.1"`` is refused, not parsed)."""
    is_array = isinstance(value, (np.ndarray, np.generic, jax.Array))
    if isinstance(value, (str, bytes)) or not (
            isinstance(value, numbers.Real) or (is_array and np.ndim(value) == 0
                                                and jnp.issubdtype(jnp.result_type(value), jnp.number))):
        raise TypeError(f"{name}: {arg} must be {what}, got {_describe(value)}; pass a number, e.g. {arg}=0.1 "
                        "(strings are not converted).")
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: {arg} must be {what}, got {value!r}.")
    return float(value)


def check_positive(name, arg, value, what="a positive float", allow_none=False):
    """``value`` as a Python float after :func:`check_number`; ``ValueError`` unless finite and > 0."""
    if value is None and allow_none:
        return None
    x = check_number(name, arg, value, what)
    if not (np.isfinite(x) and x > 0):
        raise ValueError(f"{name}: {arg} must be {what}, got {value!r}.")
    return x


def check_int(name, arg, value, minimum=1, what=None, allow_none=False):
    """``value`` as a Python int; a Python or NumPy integer >= ``minimum`` (``TypeError`` for a
    string or other non-number, ``ValueError`` for a bool, a float such as 10.0, or a smaller value)."""
    if value is None and allow_none:
        return None
    what = f"an integer >= {minimum}" if what is None else what
    check_number(name, arg, value, what)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)) \
            or value < minimum:
        hint = f"; pass {arg}={int(value)}" if isinstance(value, float) and value.is_integer() and value >= minimum \
            else ""
        raise ValueError(f"{name}: {arg} must be {what}, got {value!r}{hint}.")
    return int(value)


def _is_pandas(x):
    return type(x).__module__.split(".")[0] == "pandas" and hasattr(x, "to_numpy")


def check_model_args(name, model_args, model_kwargs):
    """Refuse pandas objects among the model arguments, naming the argument and the fix.

    A DataFrame indexed by the plate's indices (``X[idx]``) selects *columns*, and JAX cannot
    index it with traced indices, so it is refused rather than converted: ``X.to_numpy()`` says
    which array (and which dtype, e.g. for categorical or object columns) the model is given.
    """
    named = [(f"model_args[{i}]", a) for i, a in enumerate(model_args)]
    named += [(f"model_kwargs['{k}']", v) for k, v in model_kwargs.items()]
    for where, value in named:
        leaves = jax.tree.leaves(value, is_leaf=_is_pandas)
        bad = next((leaf for leaf in leaves if _is_pandas(leaf)), None)
        if bad is not None:
            raise TypeError(
                f"{name}: the model argument {where} is a pandas {type(bad).__name__}; pass an array, "
                f"e.g. df.to_numpy() or df['col'].to_numpy() (a DataFrame indexed with the plate's indices "
                "selects columns, and JAX cannot index it with traced minibatch indices).")


def check_init_params(name, init_params, view, num_chains):
    """``init_params`` as a dict of arrays of the unconstrained shapes of ``view`` (a leading
    dimension of ``num_chains`` when not None); lists and Python scalars are converted. Raises
    ``ValueError`` naming the site for a wrong shape or a non-finite value, ``TypeError`` for a
    value that is not numeric."""
    out = dict(init_params)
    for site, shape in zip(view.names, view.shapes):
        value = out[site]
        try:
            array = jnp.asarray(value)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name}: init_params['{site}'] is not an array of numbers ({type(value).__name__}); "
                            f"give an array of shape {shape}.") from err
        if not jnp.issubdtype(array.dtype, jnp.number):
            raise TypeError(f"{name}: init_params['{site}'] has dtype {array.dtype}; give numbers of shape {shape}.")
        expected = shape if num_chains is None else (num_chains, *shape)
        if array.shape != expected:
            per_chain = (f" (one value per chain: num_chains={num_chains} with chain_method='vectorized' needs "
                         f"a leading dimension of {num_chains})" if num_chains is not None else "")
            raise ValueError(
                f"{name}: init_params['{site}'] has shape {array.shape}, expected {expected}, the site's "
                f"unconstrained shape{per_chain}; give values in unconstrained space (e.g. log σ for a "
                "positive σ), as numpyro.infer.util.unconstrain_fn returns them.")
        if not bool(jnp.all(jnp.isfinite(array))):
            shown = array.tolist() if array.size <= 6 else "..."
            raise ValueError(f"{name}: init_params['{site}'] is not finite ({shown}); give finite unconstrained "
                             "values (e.g. log σ, not NaN).")
        out[site] = array
    return out


def check_param_values(name, values, param_constraints):
    """Refuse a ``numpyro.param`` whose initial value lies outside its constraint (checked where the
    value is known while a program is traced: a constant, as NumPyro's argument validation does)."""
    for site, value in values.items():
        constraint = param_constraints[site]
        try:
            with jax.ensure_compile_time_eval():
                ok = bool(jnp.all(constraint(jnp.asarray(value))))
        except Exception:  # noqa: BLE001 - a constraint that cannot check a value: nothing to report
            continue
        if not ok:
            shown = value if np.size(value) <= 6 else "an array with values"
            raise ValueError(
                f"{name}: numpyro.param site '{site}' is initialised at {shown}, outside its constraint "
                f"{constraint}; give an initial value inside it (the constraint maps the value to unconstrained "
                "space, where it would be NaN).")
