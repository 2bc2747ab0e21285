"""The driver's compiled programs: the cache that keeps each program with the arguments it was
compiled for (compiled with :func:`~numpyro_sgd.numerics.compilation.quick_compile_options`), and
the compiler's freed memory handed back to the OS.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import jax
from jax import monitoring

from ..numerics.compilation import quick_compile_options

__all__ = ["ProgramCache", "TRIM_AFTER_COMPILE_S", "return_compiler_memory"]


class ProgramCache:
    """One compiled program of a kind (``"init"`` or ``"warmup"``, for
    :func:`quick_compile_options`), kept with the key it was compiled for and the arrays that key
    names by identity (held alive while the program is kept). The kernel keeps one of each kind for
    its next ``init`` with the same arguments; pickling drops it."""

    def __init__(self, kind):
        self.kind = kind
        self.entry = None

    def get(self, key, make, arrays, options=None):
        """The program for ``key``: the kept one, or ``jax.jit(make())`` compiled and kept, with
        the :data:`~numpyro_sgd.numerics.compilation.QUICK_COMPILE` options of ``options``
        (default: this cache's kind)."""
        if self.entry is None or self.entry[0] != key:
            options = quick_compile_options(options or self.kind)
            self.entry = (key, jax.jit(make(), compiler_options=options), arrays)
        return self.entry[1]

    def __getstate__(self):
        return {"kind": self.kind, "entry": None}


#: an XLA compilation at least this long (seconds) is followed by ``malloc_trim(0)``
#: (:func:`return_compiler_memory`); a short one frees too little to be worth the call
TRIM_AFTER_COMPILE_S = 2.0
_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_TRIM = {"registered": False, "fn": None}


def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library, another OS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl and other C libraries have no malloc_trim
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def _after_compile(event, duration, **_):
    if event == _BACKEND_COMPILE_EVENT and duration >= TRIM_AFTER_COMPILE_S and _TRIM["fn"] is not None:
        _TRIM["fn"](0)


def return_compiler_memory():
    """After each long XLA compilation in this process (the sampling program's), hand the heap
    memory the compiler freed back to the OS: glibc's ``malloc_trim(0)``, from a
    ``jax.monitoring`` listener registered once (a kernel's ``init`` calls this); a no-op
    without glibc.

    XLA:CPU's compiler (LLVM) allocates many small blocks, which glibc keeps in its arenas when
    they are freed, so the resident memory stays at the compiler's peak while the program runs,
    and what the run allocates comes on top. Measured on the 2-core CPU: a hand-written
    ``lax.scan`` program of the linear mixed model kept 0.27 GiB after compiling, 0.07 GiB after
    the trim (0.1 s); the linear mixed model at N = 10⁷, G = 10⁵ through
    ``SGWithinGibbs(SGLD(model, control_variates=True))`` (``hierarchical_scale.py
    --no-reference --no-group-draws``) peaked at 2.01 GiB resident without the trim and 1.57 GiB
    with it, since the run's own peak (NumPyro's copy of the model arguments at the end of the run)
    then no longer sits on top of the compiler's. It changes no result.
    """
    if not _TRIM["registered"]:
        _TRIM["registered"] = True
        _TRIM["fn"] = _malloc_trim()
        if _TRIM["fn"] is not None:
            monitoring.register_event_duration_secs_listener(_after_compile)
