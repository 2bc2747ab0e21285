"""The kernel registry (``tests/kernel_registry.py``) holds every kernel the package exports, and a
new kernel needs nothing but its file, its export and one registry entry to pass the protocol tests.

``ToySGLD`` below is such a kernel, written as a user of the package would write one: a subclass
of :class:`~numpyro_sgd.SGKernel` whose ``_build`` returns an
:class:`~numpyro_sgd.SGAlgorithm`. Its one registry entry runs it through every protocol test of
``tests/test_mcmc_conformance.py`` (two chains both ways, determinism, continuation and pickling,
warmup then run, steps per sample, ``print_summary`` and ArviZ, the progress text).
"""

import inspect

import jax
import jax.numpy as jnp
import pytest
import test_mcmc_conformance as conformance
from jax import random
from kernel_registry import REGISTRY, WRAPPERS, KernelEntry, params

import numpyro_sgd
from numpyro_sgd import SGAlgorithm, SGKernel, StepInfo
from numpyro_sgd.validation import check_step_size


class ToySGLD(SGKernel):
    """SGLD with a fixed step (Welling & Teh 2011, Eq. 4): θ ← θ − (ε/2) ∇Û_S(θ) + √ε ξ."""

    def __init__(self, model, *, step_size, **kwargs):
        super().__init__(model, **kwargs)
        self._step_size = check_step_size("ToySGLD", step_size)

    def _build(self, potential, adapt_steps_per_sample=True):
        eps = self._step_size

        def init(rng_key, theta, num_warmup_steps):
            return ()  # no state of its own

        def step(rng_key, i, theta, state, oracle):
            key_batch, key_noise = random.split(rng_key)
            pe, grad, indices = oracle.grad(key_batch, theta)
            noise = random.normal(key_noise, theta.shape, theta.dtype)
            return theta - 0.5 * eps * grad + jnp.sqrt(eps) * noise, state, StepInfo(
                pe, oracle.batch_size, indices, True)

        return SGAlgorithm(init, step)


TOY = {"ToySGLD": KernelEntry(ToySGLD, lambda m, **kw: ToySGLD(m, step_size=1e-4, **kw), representative=True)}

#: the protocol tests of the conformance file, each a function of (make, passes[, fixtures])
PROTOCOL = [name for name, f in inspect.getmembers(conformance, inspect.isfunction)
            if name.startswith("test_") and "make" in inspect.signature(f).parameters]


def test_every_exported_kernel_is_registered():
    exported = [getattr(numpyro_sgd, n) for n in numpyro_sgd.__all__]
    kernels = [c for c in exported if inspect.isclass(c) and issubclass(c, SGKernel)
               and not inspect.isabstract(c) and c not in (SGKernel, numpyro_sgd.SGWrapper)]
    registered = {e.cls for e in REGISTRY.values()} | set(WRAPPERS)
    assert [c.__name__ for c in kernels if c not in registered] == []


def test_the_protocol_tests_are_found():
    assert {"test_two_chains", "test_continuation_pickling_and_diagnostics_string",
            "test_print_summary_and_arviz"} <= set(PROTOCOL)


@pytest.mark.parametrize("test_name", PROTOCOL)
def test_a_new_kernel_passes_the_protocol_tests_from_its_registry_entry(test_name, capsys):
    (toy,) = params(TOY)
    make, passes = toy.values
    test = getattr(conformance, test_name)
    fixtures = {"capsys": capsys} if "capsys" in inspect.signature(test).parameters else {}
    if "chain_method" in inspect.signature(test).parameters:
        for method, bar in (("vectorized", True), ("sequential", False)):
            test(make, passes, method, bar)
    else:
        test(make, passes, **fixtures)
    jax.clear_caches()
