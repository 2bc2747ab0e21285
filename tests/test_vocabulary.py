"""One vocabulary across the kernels: every argument after ``model`` (after ``kernel``
for the wrappers) is keyword-only, the removed old names are refused, one name per concept, the
top-level exports, and a units statement for ``step_size`` in every kernel's docstring.

Everything here is checked at construction: nothing is traced or sampled.
"""

import inspect

import numpyro
import numpyro.distributions as dist
import pytest
from kernel_registry import kernel_classes

import numpyro_sgd
from numpyro_sgd import (
    EWSG,
    EWSGVR,
    IASG,
    PSGLD,
    SGFS,
    SGHMC,
    SGLD,
    ConstantSGD,
    OverdampedEWSG,
    Santa,
    SGWithinGibbs,
    VariationalEM,
    robbins_monro,
    santa,
)
from numpyro_sgd.kernels.vem import robbins_monro_rate


def model(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", 100, subsample_size=10) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=None if y is None else y[idx])


#: every kernel class of the registry (tests/kernel_registry.py)
KERNELS = kernel_classes()

# the arguments that used to be positional, each given by position: Python refuses them now
POSITIONAL = [
    pytest.param(lambda: ConstantSGD(model, "full"), id="ConstantSGD-preconditioner"),
    pytest.param(lambda: SGFS(model, "diag"), id="SGFS-preconditioner"),
    pytest.param(lambda: IASG(model, 0.1), id="IASG-step_size"),
    pytest.param(lambda: SGLD(model, 1e-3), id="SGLD-step_size"),
    pytest.param(lambda: PSGLD(model, 1e-3), id="PSGLD-step_size"),
    pytest.param(lambda: SGHMC(model, 1e-2, 1.0), id="SGHMC-step_size-friction"),
    pytest.param(lambda: EWSG(model, 1e-2, 1.0), id="EWSG-step_size-friction"),
    pytest.param(lambda: OverdampedEWSG(model, 1e-3), id="OverdampedEWSG-step_size"),
    pytest.param(lambda: EWSGVR(model, 1e-2, 1.0), id="EWSGVR-step_size-friction"),
    pytest.param(lambda: Santa(model, 1e-5), id="Santa-step_size"),
    pytest.param(lambda: VariationalEM(ConstantSGD(model), 0.1), id="VariationalEM-hyper_step_size"),
    pytest.param(lambda: SGWithinGibbs(ConstantSGD(model), ["mu"]), id="SGWithinGibbs-hyper_sites"),
]


@pytest.mark.parametrize("make", POSITIONAL)
def test_arguments_after_the_model_are_keyword_only(make):
    with pytest.raises(TypeError, match="positional argument"):
        make()


@pytest.mark.parametrize("kernel_cls", KERNELS + [VariationalEM, SGWithinGibbs], ids=lambda c: c.__name__)
def test_signature_has_one_positional_parameter(kernel_cls):
    params = list(inspect.signature(kernel_cls.__init__).parameters.values())[1:]  # without self
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert positional == (["kernel"] if kernel_cls in (VariationalEM, SGWithinGibbs) else ["model"])


# the same arguments by name are accepted (construction validates them without tracing)
KEYWORDS = [
    pytest.param(lambda: ConstantSGD(model, preconditioner="full"), id="ConstantSGD"),
    pytest.param(lambda: SGFS(model, preconditioner="diag"), id="SGFS"),
    pytest.param(lambda: IASG(model, step_size=0.1, window=20, preconditioner="scalar"), id="IASG"),
    pytest.param(lambda: SGLD(model, step_size=robbins_monro(1e-3, offset=10.0, power=0.55)), id="SGLD"),
    pytest.param(lambda: PSGLD(model, step_size=1e-3, decay=0.9), id="PSGLD"),
    pytest.param(lambda: SGHMC(model, step_size=1e-2, friction=1.0), id="SGHMC"),
    pytest.param(lambda: EWSG(model, step_size=1e-2, friction=1.0, num_index_steps=2), id="EWSG"),
    pytest.param(lambda: OverdampedEWSG(model, step_size=1e-3, num_index_steps=0), id="OverdampedEWSG"),
    pytest.param(lambda: EWSGVR(model, step_size=1e-2, friction=1.0), id="EWSGVR"),
    pytest.param(lambda: Santa(model, step_size=1e-5, anneal=True, decay=0.99), id="Santa"),
    pytest.param(lambda: VariationalEM(ConstantSGD(model), hyper_step_size=0.1, hyper_offset=10.0,
                                       hyper_power=0.8), id="VariationalEM"),
    pytest.param(lambda: SGWithinGibbs(ConstantSGD(model), hyper_sites=["mu"]), id="SGWithinGibbs"),
]


@pytest.mark.parametrize("make", KEYWORDS)
def test_the_same_arguments_by_keyword_are_accepted(make):
    assert isinstance(make(), numpyro_sgd.SGKernel)


@pytest.mark.parametrize("make, name", [
    pytest.param(lambda: PSGLD(model, step_size=1e-3, alpha=0.9), "alpha", id="PSGLD-alpha"),
    pytest.param(lambda: Santa(model, step_size=1e-5, sigma=0.99), "sigma", id="Santa-sigma"),
    pytest.param(lambda: santa(1e-3, sigma=0.99), "sigma", id="santa-sigma"),
    pytest.param(lambda: VariationalEM(ConstantSGD(model), hyper_decay=0.6), "hyper_decay", id="VEM-hyper_decay"),
])
def test_removed_old_names_are_refused(make, name):
    # the package was never released with them: no FutureWarning shim, an ordinary TypeError
    with pytest.raises(TypeError, match=name):
        make()


def test_iasg_preconditioner_none_is_not_an_alias_of_scalar():
    with pytest.raises(ValueError, match="IASG: unknown preconditioner None"):
        IASG(model, preconditioner=None, step_size=0.1)


def test_hyper_power_is_the_power_of_robbins_monro():
    """VariationalEM's κ is named as ``robbins_monro``'s exponent: ρ₀ (1 + t/t₀)^(−κ) is
    ``robbins_monro(ρ₀ t₀^κ, t₀, κ)``; checked at t = 0, where ρ = ρ₀, and at t = t₀ (ρ₀ 2^(−κ))."""
    rate = robbins_monro_rate(0.05, offset=100.0, power=0.8)
    assert rate.power == 0.8 and rate.offset == 100.0
    assert float(rate(0)) == pytest.approx(0.05, rel=1e-6)
    assert float(rate(100)) == pytest.approx(0.05 * 2.0**-0.8, rel=1e-6)
    with pytest.raises(ValueError, match=r"hyper_power \(κ\) must lie in \(0.5, 1\]"):
        VariationalEM(ConstantSGD(model), hyper_power=0.5)


@pytest.mark.parametrize("name, module", [("to_arviz", "diagnostics.arviz_export"),
                                          ("compare", "diagnostics.compare"),
                                          ("check_run", "diagnostics.run_checks"),
                                          ("overdamped_ewsg", "kernels.ewsg"),
                                          ("loo_subsample", "diagnostics.loo"),
                                          ("compare_loo", "diagnostics.model_comparison")])
def test_what_users_call_is_exported_at_the_top_level(name, module):
    import importlib

    assert name in numpyro_sgd.__all__
    assert getattr(numpyro_sgd, name) is getattr(importlib.import_module(f"numpyro_sgd.{module}"), name)


def test_every_name_in_all_exists():
    missing = [name for name in numpyro_sgd.__all__ if not hasattr(numpyro_sgd, name)]
    assert missing == []
    assert len(set(numpyro_sgd.__all__)) == len(numpyro_sgd.__all__)


@pytest.mark.parametrize("kernel_cls", KERNELS, ids=lambda c: c.__name__)
def test_every_kernel_states_the_units_of_its_step_size(kernel_cls):
    assert "**Units of** ``step_size``." in kernel_cls.__doc__
