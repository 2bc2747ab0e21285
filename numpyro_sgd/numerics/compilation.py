"""How the kernels' programs are compiled: XLA options for the programs that run once per
``init`` (the initial point, the model's structure checks, warmup), which then compile several
times faster (a program that runs once gains nothing from LLVM's optimisation or from autotuning),
and the precision of their matrix products.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import numpy as np

__all__ = ["QUICK_COMPILE", "QUICK_COMPILE_GPU", "SMALL_DATA_ELEMENTS", "MATMUL_PRECISION", "quick_compile_options",
           "warmup_options_kind", "persistent_cache_on", "jit_once", "matmul_precision", "full_precision_matmuls"]


#: XLA options that make XLA:CPU compile a program several times faster. The legacy loop
#: emitters (``xla_cpu_use_fusion_emitters=False``) compile a fusion faster than the MLIR fusion
#: emitters and run it about as fast; without LLVM optimisation
#: (``xla_backend_optimization_level=0``) compiling is faster again, but the code runs slower, so
#: that is used only for the programs that run once at ``init`` (the initial point, the structure
#: checks; the warmup over small data, :func:`warmup_options_kind`). Measured on the 2-core
#: CPU, a 3-parameter regression: warmup program 3.3–3.9 s → 2.3–2.5 s (emitters), 0.7 s (both);
#: init program 1.2 s → 0.3 s (both). Options this jaxlib does not know are left out (jax 0.12
#: has no ``xla_cpu_use_fusion_emitters``).
QUICK_COMPILE = {"init": {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 0},
                 "warmup": {"xla_cpu_use_fusion_emitters": False}}
#: the same for XLA:GPU: no autotuning of the matrix products' algorithms
#: (``xla_gpu_autotune_level=0``), which tries each candidate on the device at compile time.
#: Measured on an H200 (``anchors.py``, logistic regression, N = 10⁷, D = 50): the control-variate
#: warmup program compiled in 11.9 s instead of 21.7 s, its 10 centre passes ran as fast (0.5 s
#: against 0.6 s) and gave the same draws.
QUICK_COMPILE_GPU = {"init": {"xla_gpu_autotune_level": 0}, "warmup": {"xla_gpu_autotune_level": 0}}
_SUPPORTED_OPTIONS = {}


def quick_compile_options(program):
    """``compiler_options`` for ``jax.jit`` of the driver's one-per-run ``program`` ("init",
    "warmup"): :data:`QUICK_COMPILE` on the CPU backend, :data:`QUICK_COMPILE_GPU` on a GPU, None
    elsewhere."""
    backend = jax.default_backend()
    table = QUICK_COMPILE if backend == "cpu" else QUICK_COMPILE_GPU if backend in ("gpu", "cuda", "rocm") else None
    if table is None:
        return None
    options = {}
    for name, value in table[program].items():
        if name not in _SUPPORTED_OPTIONS:
            try:  # one tiny compilation per option and process
                jax.jit(lambda x: x + 1, compiler_options={name: value})(np.float32(0.0))
                _SUPPORTED_OPTIONS[name] = True
            except Exception:  # noqa: BLE001 - XLA refuses an option it does not know
                _SUPPORTED_OPTIONS[name] = False
        if _SUPPORTED_OPTIONS[name]:
            options[name] = value
    return options or None


#: data elements (all array arguments, rows × values a row) up to which a control-variate kernel's
#: warmup program (a bounded number of data passes) is compiled with the ``"init"`` options too (no
#: LLVM optimisation): its compile time then exceeds what its slower code costs. Measured on the
#: 2-core CPU, ``SGLD(model, control_variates=True)`` on a logistic regression with D = 50
#: (``anchors.py``): at N = 10⁵ the warmup program compiled in 7.7 s instead of 13.0 s and ran in
#: 2.6 s instead of 1.0 s (12.1 s to the posterior, was 16.5 s); at N = 10⁷ its 12 centre passes
#: ran in 9.5 s optimised, about 2.5 times that without. Not for other kernels, whose warmup can be
#: thousands of SG steps: ConstantSGD-full at N = 10⁵ (840 passes in all) took 22.9 s to the
#: posterior with it, 17.1 s without
SMALL_DATA_ELEMENTS = 10**8


def persistent_cache_on():
    """Whether JAX's persistent compilation cache is configured (``jax_compilation_cache_dir``):
    then a program is compiled once for every later process, and optimising it pays."""
    return bool(jax.config.jax_compilation_cache_dir)


def warmup_options_kind(arrays):
    """``"init"`` for a control-variate warmup over at most :data:`SMALL_DATA_ELEMENTS` data
    elements in ``arrays`` (the model's array arguments), else ``"warmup"``: the
    :data:`QUICK_COMPILE` entry for its warmup program (the driver asks only for a kernel with
    control variates). ``"warmup"`` too when JAX's persistent compilation cache is on: a later
    process loads the program and only runs it. Measured on the 2-core CPU,
    ``benchmarks/persistent_cache.py --kernel SGLD-CV`` at N = 10⁶, D = 50: the second process
    took 9.9 s with the unoptimised warmup program."""
    if persistent_cache_on():
        return "warmup"
    size = 0
    for x in arrays:
        shape = getattr(x, "shape", ())
        size += int(np.prod(shape)) if shape else 1
    return "init" if size <= SMALL_DATA_ELEMENTS else "warmup"


def jit_once(fn):
    """``jax.jit(fn)`` with the ``"init"`` options of :data:`QUICK_COMPILE` (of
    :data:`QUICK_COMPILE_GPU` on a GPU):
    for a program called once or a few times at ``init``, never under another trace (JAX takes
    ``compiler_options`` on a top-level ``jit`` only). Measured on the 2-core CPU at N = 10⁶, G =
    10⁴: the group-structure check compiled in 0.4 s instead of 1.3 s."""
    return jax.jit(fn, compiler_options=quick_compile_options("init"))


#: the precision of the float32 matrix products in every program a kernel traces (the model's
#: ``X @ w`` included) when the user has set none (``jax_default_matmul_precision``). JAX's default
#: on a GPU rounds their operands to TensorFloat-32 (10 mantissa bits), a relative error of about
#: 5·10⁻⁴; the posterior sd of a regression weight shrinks as N^(-1/2), so at N = 10⁷ rows that
#: rounding of ``w`` is about 0.1 posterior sd, and the centre's full-data gradient has a floor:
#: measured on an H200, logistic regression with D = 50, the Newton decrement stalled at 0.08
#: (> 0.01) for 96 passes. On the CPU the products are float32 either way.
MATMUL_PRECISION = "float32"


@contextlib.contextmanager
def matmul_precision():
    """A context in which matrix products are traced at :data:`MATMUL_PRECISION`, unless the user
    has set a precision (then that one)."""
    if jax.config.jax_default_matmul_precision is not None:  # the user's own choice stands
        yield
        return
    with jax.default_matmul_precision(MATMUL_PRECISION):
        yield


def full_precision_matmuls(method):
    """``method`` run with the matrix products it traces at :data:`MATMUL_PRECISION` (JAX
    resolves a product's precision when the product is traced, so this covers the programs the
    method compiles and the ones NumPyro compiles around it) unless the user has set one."""
    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        with matmul_precision():
            return method(*args, **kwargs)

    return wrapped
