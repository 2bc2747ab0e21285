"""The minibatch-law registry (``numpyro_sgd.minibatch.law``): the package's laws are found by
name, unknown names are refused with the list, and a new law is one class, as in its own file:
``Stratified`` below, defined here, is usable by ``subsample=`` at once and passes every protocol
test of ``tests/test_mcmc_conformance.py`` and a check of its posterior.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import test_mcmc_conformance as conformance
from jax import random
from numpyro.infer import MCMC

from numpyro_sgd import SGLD, ConstantSGD
from numpyro_sgd.minibatch.law import MinibatchLaw, law_names, law_of
from numpyro_sgd.minibatch.with_replacement import uniform_indices


class Stratified(MinibatchLaw):
    """S/2 i.i.d. uniform rows from each half of the rows (an even N and S): every row has
    probability S/N per step, so the N/S-scaled minibatch gradient is unbiased."""

    name = "stratified_halves"

    def draw(self, rng_key, plates, step=None, shuffle_key=None):
        return {p.name: self.draw_shard(random.fold_in(rng_key, j), p.size, p.subsample_size)
                for j, p in enumerate(plates)}

    def draw_shard(self, rng_key, rows, size, cluster_size=1):
        half = rows // 2
        low, high = uniform_indices(rng_key, size // 2, half, 0), uniform_indices(rng_key, size // 2, half, 1)
        return jnp.concatenate([low, half + high])


def test_the_package_laws_are_registered_by_name():
    assert law_names() == ("with_replacement", "without_replacement", "shuffle", *law_names()[3:])
    assert law_names(sampling=True)[:2] == ("with_replacement", "without_replacement")
    assert "shuffle" not in law_names(sampling=True)
    assert law_of("without_replacement").noise_factor(101, 11) == pytest.approx(0.9)


def test_an_unknown_law_is_refused_with_the_laws_there_are():
    model = conformance.model
    with pytest.raises(ValueError, match=r"subsample='stratified' is not a minibatch law; use one of .*'with_replacement'"):
        SGLD(model, subsample="stratified")
    with pytest.raises(ValueError, match="'shuffle' is allowed only as warmup_subsample"):
        SGLD(model, subsample="shuffle")


def test_a_new_law_draws_what_it_says():
    idx = np.asarray(jax.vmap(lambda k: law_of("stratified_halves").draw_shard(k, 500, 24))(
        random.split(random.key(0), 2000)))
    assert idx.shape == (2000, 24) and np.all(idx[:, :12] < 250) and np.all(idx[:, 12:] >= 250)
    counts = np.bincount(idx.ravel(), minlength=500)
    expected = 2000 * 24 / 500
    assert np.max(np.abs(counts - expected) / np.sqrt(expected)) < 5  # every row equally likely


PROTOCOL = [name for name, f in inspect.getmembers(conformance, inspect.isfunction)
            if name.startswith("test_") and "make" in inspect.signature(f).parameters]


@pytest.mark.parametrize("test_name", PROTOCOL)
def test_a_new_law_passes_the_protocol_tests(test_name, capsys):
    def make(m, **kw):
        return SGLD(m, step_size=1e-4, subsample="stratified_halves", **kw)

    test = getattr(conformance, test_name)
    parameters = inspect.signature(test).parameters
    if "chain_method" in parameters:
        test(make, 5, "vectorized", True)
    else:
        test(make, 5, **({"capsys": capsys} if "capsys" in parameters else {}))


def test_a_new_law_samples_the_posterior():
    """A conjugate normal mean (σ = 1 known, prior N(0, 10²)), N = 2,000 rows in random order,
    S = 100. ConstantSGD-full's draws, 4 chains × 500 (ESS ~1,500): the mean within 0.25
    posterior sd (5 standard errors of the mean) and the sd within 15 % (4 standard errors of an
    sd at that ESS plus the kernel's own O(S/N) error). (On rows whose halves differ, stratifying
    removes the between-halves spread from the minibatch noise, which the noise warmup measures
    as i.i.d. rows': a law whose noise is not f times that of i.i.d. rows, ``noise_factor``, needs
    an estimator of its own.)"""
    n = 2_000
    y = 1.0 + random.normal(random.key(1), (n,))

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("data", y.shape[0], subsample_size=100) as idx:
            numpyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])

    precision = n + 1e-2
    post_mean, post_sd = float(jnp.sum(y)) / precision, precision ** -0.5
    mcmc = MCMC(ConstantSGD(model, preconditioner="full", subsample="stratified_halves"), num_warmup=100,
                num_samples=500, num_chains=4, chain_method="vectorized", progress_bar=False)
    mcmc.run(random.key(2), y)
    mu = np.asarray(mcmc.get_samples()["mu"])
    assert abs(mu.mean() - post_mean) < 0.25 * post_sd, (mu.mean(), post_mean, post_sd)
    assert abs(mu.std() / post_sd - 1) < 0.15, (mu.std(), post_sd)
