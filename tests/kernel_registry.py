"""The test suite's one list of the package's kernels.

A kernel added to ``numpyro_sgd/kernels/`` and exported by the package gets one entry here;
``tests/test_kernel_registry.py`` fails until it has one. The protocol tests
(``test_mcmc_conformance.py``), the vocabulary tests (``test_vocabulary.py``) and the arguments
walk (``test_arguments.py``) read their kernels from :data:`REGISTRY`, and
``tests/test_kernel_registry.py`` shows a 30-line toy kernel passing them through an entry alone.
"""

from typing import Callable, NamedTuple, Optional

import pytest

import numpyro_sgd as ns


class KernelEntry(NamedTuple):
    """What the suite needs to know of one kernel configuration."""

    #: the kernel's class (a wrapper's, for a wrapped configuration)
    cls: type
    #: ``(model, **driver_options) -> kernel``, with steps that keep the protocol tests' short runs
    #: (N = 500, S = 25, 60 warmup and 40 sampling SG steps) finite
    make: Callable
    #: data passes per 100 SG steps of those runs (per-datum gradients per step × 100 / N); None: S
    #: per warmup step and 2 S per sampling step (control variates, VariationalEM)
    passes: Optional[float] = 5
    #: whether the driver-only protocol checks run on it in the default (not slow) selection: the
    #: configurations that together walk every path of the shared driver
    representative: bool = False
    #: pytest marks of its parameters
    marks: tuple = ()


REGISTRY = {
    "SGLD": KernelEntry(ns.SGLD, lambda m, **kw: ns.SGLD(m, step_size=1e-4, **kw), representative=True),
    "ConstantSGD-diag": KernelEntry(ns.ConstantSGD, lambda m, **kw: ns.ConstantSGD(m, preconditioner="diag", **kw)),
    "ConstantSGD-full-momentum": KernelEntry(
        ns.ConstantSGD, lambda m, **kw: ns.ConstantSGD(m, preconditioner="full", momentum=0.5, **kw),
        representative=True),
    "SGFS-diag": KernelEntry(ns.SGFS, lambda m, **kw: ns.SGFS(m, preconditioner="diag", max_step=1e-3, **kw)),
    "PSGLD": KernelEntry(ns.PSGLD, lambda m, **kw: ns.PSGLD(m, step_size=1e-5, **kw)),
    "SGHMC": KernelEntry(ns.SGHMC, lambda m, **kw: ns.SGHMC(m, step_size=1e-3, friction=20.0, **kw)),
    # the window is IASG's steps_per_sample (a window ≠ N/S warns that the covariance is rescaled)
    "IASG-diag": KernelEntry(
        ns.IASG, lambda m, steps_per_sample=1, **kw: ns.IASG(m, window=steps_per_sample, preconditioner="diag",
                                                             check_validity=False, **kw),
        representative=True, marks=(pytest.mark.filterwarnings("ignore:IASG"),)),
    "Santa": KernelEntry(ns.Santa, lambda m, **kw: ns.Santa(m, step_size=1e-6, **kw)),
    # M = 1: two minibatch gradients per step
    "EWSG": KernelEntry(ns.EWSG, lambda m, **kw: ns.EWSG(m, step_size=1e-3, friction=20.0, **kw), 10),
    "OverdampedEWSG": KernelEntry(ns.OverdampedEWSG, lambda m, **kw: ns.OverdampedEWSG(m, step_size=1e-4, **kw), 10),
    # (M + 2) S per step and a full-data calibration every ⌈N / ((M + 1) S)⌉ = 10 steps: 15 + 10 passes
    "EWSGVR": KernelEntry(ns.EWSGVR, lambda m, **kw: ns.EWSGVR(m, step_size=1e-4, friction=20.0, **kw), 25,
                          representative=True),
    # control variates: the centre's full-data passes at the end of warmup are counted apart
    # (kernel_state.adapted.control.passes)
    "SGLD-CV": KernelEntry(ns.SGLD, lambda m, **kw: ns.SGLD(m, control_variates=True, **kw), None),
    # fits the model's param site; one more minibatch gradient (for λ) per sampling step
    "VariationalEM": KernelEntry(
        ns.VariationalEM, lambda m, **kw: ns.VariationalEM(ns.ConstantSGD(m, preconditioner="diag", **kw)), None,
        representative=True),
}

#: the wrappers: their constructor takes a kernel, not a model
WRAPPERS = (ns.VariationalEM, ns.SGWithinGibbs)


def kernel_classes(registry=REGISTRY):
    """The kernel classes of the registry (not the wrappers), each once, in registry order."""
    return list(dict.fromkeys(e.cls for e in registry.values() if e.cls not in WRAPPERS))


def params(registry=REGISTRY, driver_only=False):
    """``pytest.param(make, passes, id=name)`` for every entry; with ``driver_only`` the
    non-representative ones are marked slow (they run with ``-m slow``)."""
    return [pytest.param(e.make, e.passes, id=name,
                         marks=[*e.marks, *(() if e.representative or not driver_only else (pytest.mark.slow,))])
            for name, e in registry.items()]
