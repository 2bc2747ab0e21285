"""Argument and input checks shared by the kernels (raised before any compute).

Every message names the kernel, the argument (or site, or model argument), what was given and
the fix, in one sentence (STYLE.md, "Errors"). Types follow NumPy/NumPyro: a value that is not
a number at all (a string, a list) is a ``TypeError``; a number out of range, a bool, or a
non-integral number where an integer is needed is a ``ValueError`` (as the kernels have always
raised for them). NumPy and 0-d JAX scalars are accepted and returned as Python values.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["check_choice", "check_number", "check_positive", "check_int", "check_model_args", "check_init_params",
           "check_param_values", "INTEGRATORS", "check_friction", "check_control_variates", "check_step_size"]


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


def _host_dtype_kind(value):
    """NumPy's dtype kind of a host value ("O" when NumPy cannot make one array of it)."""
    try:
        return np.asarray(value).dtype.kind
    except (TypeError, ValueError):
        return "O"


def check_init_params(name, init_params, view, num_chains):
    """``init_params`` as a dict of arrays of the unconstrained shapes of ``view`` (a leading
    dimension of ``num_chains`` when not None); lists and Python scalars are converted. Raises
    ``ValueError`` naming the site for a wrong shape or a non-finite value, ``TypeError`` for a
    value that is not numeric."""
    out = dict(init_params)
    for site, shape in zip(view.names, view.shapes):
        value = out[site]
        if not isinstance(value, jax.Array) and _host_dtype_kind(value) in "OSUV":  # never handed to JAX
            raise TypeError(f"{name}: init_params['{site}'] is not an array of numbers ({type(value).__name__}); "
                            f"give an array of shape {shape}.")
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


def is_positive_scalar(value):
    """True for a finite real number > 0 given as a Python, NumPy or 0-d JAX scalar (not a bool)."""
    if isinstance(value, bool) or callable(value) or np.ndim(value) != 0:
        return False
    try:
        value = float(value)
    except (TypeError, ValueError):
        return False
    return bool(np.isfinite(value) and value > 0)

#: warmup budget in data passes when the kernel chooses ``steps_per_sample`` (the noise warmup
#: needs 10–20 passes on the problems of the tests and examples; see docs/performance.md)
DEFAULT_WARMUP_PASSES = 20

class DriverOptions(NamedTuple):
    """The options every kernel takes (:class:`~numpyro_sgd.SGKernel`), validated once by
    ``driver_options``; None where the kernel chooses.

    :param steps_per_sample: SG steps per returned sample, run inside one compiled loop. Default
        (None): the algorithm's relaxation time, ⌈N/S⌉ SG steps (one data pass) for the kernels
        that adapt to the gradient noise (ConstantSGD, SGFS; their KL-optimal chain forgets its
        start in about one pass, so ``num_samples`` counts nearly independent draws), 1 for the
        others. ConstantSGD with the full preconditioner measures its own relaxation time at the
        end of warmup and takes more steps when the model is misspecified
        (:func:`~numpyro_sgd.numerics.step_rules.relaxation_steps`; read it from
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
        (default), ``"without_replacement"`` or any law of :mod:`numpyro_sgd.minibatch.law` allowed
        for sampling (validated by :func:`~numpyro_sgd.minibatch.law.check_laws`).
    :param str warmup_subsample: how warmup minibatches are drawn; defaults to ``subsample``;
        ``"shuffle"`` (epoch-wise reshuffling) is allowed here only, since it biases the
        stationary law.
    :param init_strategy: NumPyro init strategy for the unconstrained initial values.
    :param subsample_size: minibatch size S to use instead of the one the model's plate declares
        (an int for every subsample plate, or ``{plate name: S}``); the N/S scaling follows. Lets
        you pick the throughput-optimal S without editing the model (see docs/performance.md). ``"auto"``:
        the kernel picks S from N and the backend (:func:`~numpyro_sgd.minibatch.policy.choose_subsample_size`:
        10⁴ on a CPU, 10⁵ on a GPU, at most N/10; N/100 for IASG); it does so too for a model whose
        data plate declares no subsample_size (NumPyro's one model for NUTS and SG).
    :param mesh: a ``jax.sharding.Mesh`` over which the data rows are split (``None``: one device).
        Each device then draws its S/k minibatch rows among its own N/k rows and the step
        all-reduces one D-vector (:mod:`numpyro_sgd.model.sharding`); pass the data sharded along
        ``mesh_axis`` (``jax.device_put(X, NamedSharding(mesh, P("data")))``) and run
        ``MCMC(..., jit_model_args=True)`` so that they stay where they are.
    :param str mesh_axis: the mesh axis the rows are split over.
    :param int cluster_size: with ``subsample="with_replacement"``, draw each minibatch as S/B
        clusters of B consecutive rows (the *cluster law*,
        :func:`~numpyro_sgd.minibatch.with_replacement.cluster_indices`: unbiased whatever the order of the rows,
        its noise estimated from the cluster sums) instead of S random rows. Default (None): B
        from :func:`~numpyro_sgd.minibatch.policy.choose_cluster_size` (1, random rows, unless the data
        the plate indexes exceed 64 MiB; then clusters of about 32 KiB, which a CPU reads several
        times faster than random rows), falling back to random rows with a warning when the rows
        look ordered. ``1``: random rows; an int B that divides S: clusters of B.
    """

    steps_per_sample: object = None
    subsample: str = "with_replacement"
    warmup_subsample: str = "with_replacement"
    init_strategy: object = None
    subsample_size: object = None
    warmup_passes: object = None
    mesh: object = None
    mesh_axis: str = "data"
    cluster_size: object = None


def driver_options(name, supports_mesh, supports_clusters, *, steps_per_sample, subsample, warmup_subsample,
                   init_strategy, subsample_size, warmup_passes, mesh, mesh_axis, cluster_size, law_clusters=True):
    """:class:`DriverOptions`, each checked: a clear error naming the option and the fix.
    ``supports_mesh`` / ``supports_clusters``: whether the kernel allows ``mesh=`` and the
    cluster law (a kernel that draws its minibatch indices by its own rule allows neither);
    ``law_clusters``: whether the minibatch law ``subsample`` (already checked,
    :func:`~numpyro_sgd.minibatch.law.check_laws`) draws clusters."""
    check_int(name, "steps_per_sample", steps_per_sample, allow_none=True,
              what="an integer >= 1 or None (the kernel's relaxation time, one data pass for ConstantSGD/SGFS)")
    warmup_passes = check_positive(
        name, "warmup_passes", warmup_passes, allow_none=True,
        what=f"a positive number of data passes or None (default {DEFAULT_WARMUP_PASSES})")
    if subsample_size is not None and not (isinstance(subsample_size, str) and subsample_size == "auto"):
        sizes = subsample_size if isinstance(subsample_size, dict) else {None: subsample_size}
        what = "an integer >= 1 or a dict {plate name: integer}"
        sizes = {k: check_int(name, "subsample_size", v, what=what) for k, v in sizes.items()}
        subsample_size = sizes if isinstance(subsample_size, dict) else sizes[None]
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"{name}: mesh must be a jax.sharding.Mesh (e.g. Mesh(jax.devices(), ('data',))), got "
                        f"{type(mesh).__name__}.")
    if mesh is not None and not supports_mesh:
        raise ValueError(f"{name}: mesh= is not supported: this kernel draws its minibatch indices by its own "
                         "rule, which a per-device stratified draw would change.")
    if cluster_size is not None:
        check_int(name, "cluster_size", cluster_size, what="an integer >= 1 dividing subsample_size, or None")
        if cluster_size > 1 and not (supports_clusters and law_clusters):
            why = ("this kernel draws its minibatch indices by its own rule" if not supports_clusters else
                   f"subsample={subsample!r} draws rows")
            raise ValueError(f"{name}: cluster_size={cluster_size} is not supported here: {why}. "
                             "Leave cluster_size out (random rows).")
    return DriverOptions(None if steps_per_sample is None else int(steps_per_sample), subsample, warmup_subsample,
                         init_strategy, subsample_size, warmup_passes, mesh, mesh_axis, cluster_size)


def check_step_counter(name, num_warmup_steps):
    """Refuse a warmup longer than the int32 SG step counter holds."""
    if not isinstance(num_warmup_steps, jax.core.Tracer) and num_warmup_steps >= 2**31:
        raise ValueError(
            f"{name}: num_warmup × SG steps per warmup iteration = {num_warmup_steps:,} warmup steps, beyond the "
            "int32 step counter (2³¹ − 1); lower num_warmup, steps_per_sample or warmup_passes.")


def resolve_init_params(name, init_params, view, num_chains):
    """``init_params`` (a dict, or NumPyro's ``ParamInfo``; None: the kernel's init strategy) checked
    against the latent sites of ``view`` (:func:`check_init_params`; traced values pass as they
    are)."""
    if init_params is None:
        return None
    if hasattr(init_params, "z"):  # numpyro ParamInfo
        init_params = init_params.z
    missing = set(view.names) - set(init_params)
    if missing:
        raise ValueError(f"{name}: init_params lacks the latent sites {sorted(missing)}; give unconstrained values "
                         "for every latent site.")
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(init_params)):
        return init_params
    return check_init_params(name, init_params, view, num_chains)


# ---------------------------------------------------------------------------- validation
#: the overdamped kernels' integrators: Welling & Teh's Euler step, or the step exact for the
#: Gaussian part (:func:`~numpyro_sgd.numerics.diffusions.exponential_overdamped_langevin`)
INTEGRATORS = ("euler", "exponential")

def check_friction(name, friction):
    """Raise unless γ is a positive scalar (SGHMC and the EWSG kernels)."""
    return check_positive(name, "friction", friction, "a positive float (γ; σ² = 2γ)")

def check_control_variates(name, control_variates, integrator, step_size, coordinates, integrators=INTEGRATORS):
    """Validate ``control_variates`` and ``integrator`` (None: ``"exponential"`` with control
    variates where ``integrators`` has it, else ``"euler"``); both need the kernel's own step,
    which the end of warmup sets. Returns ``(control_variates, integrator)``."""
    if control_variates not in (True, False):
        raise TypeError(f"{name}: control_variates must be True or False, got {control_variates!r}.")
    if integrator is None:
        exponential = control_variates and coordinates != "scalar" and "exponential" in integrators
        integrator = "exponential" if exponential else "euler"
    if integrator not in integrators:
        raise ValueError(f"{name}: integrator={integrator!r}; use one of {integrators}.")
    if step_size is not None and (control_variates or integrator == "exponential"):
        raise ValueError(
            f"{name}: control_variates=True and integrator='exponential' set their step at the end of warmup (from "
            "the centre the control variates are taken about, and the noise measured there); leave step_size out.")
    if integrator == "exponential" and coordinates == "scalar":
        raise ValueError(
            f"{name}: integrator='exponential' is exact for the Gaussian of the warmup's curvature coordinates; "
            "coordinates='scalar' runs in the model's. Use coordinates='auto' (the default) or integrator='euler'.")
    return bool(control_variates), integrator


def check_step_size(name, step_size):
    """Raise unless h (or ε) is a positive scalar."""
    return check_positive(name, "step_size", step_size)
