"""The driver's compiled programs: XLA options that compile the programs run once per ``init``
(the initial point, warmup) several times faster, and the cache that keeps each program with the
arguments it was compiled for.
"""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["QUICK_COMPILE", "quick_compile_options", "ProgramCache"]


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


def quick_compile_options(program):
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


class ProgramCache:
    """One compiled program of a kind (``"init"`` or ``"warmup"``, for
    :func:`quick_compile_options`), kept with the key it was compiled for and the arrays that key
    names by identity (held alive while the program is kept). The kernel keeps one of each kind for
    its next ``init`` with the same arguments; pickling drops it."""

    def __init__(self, kind):
        self.kind = kind
        self.entry = None

    def get(self, key, make, arrays):
        """The program for ``key``: the kept one, or ``jax.jit(make())`` compiled and kept."""
        if self.entry is None or self.entry[0] != key:
            self.entry = (key, jax.jit(make(), compiler_options=quick_compile_options(self.kind)), arrays)
        return self.entry[1]

    def __getstate__(self):
        return {"kind": self.kind, "entry": None}
