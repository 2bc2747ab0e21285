"""The minibatch law at large N: the cluster law (numpyro_sgd.minibatch.with_replacement.cluster_indices), its size
rule, its noise estimate, the ordered-data check and the stationary law of ConstantSGD under it;
and the minibatch size S the kernel picks (choose_subsample_size)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax import random
from numpyro.infer import MCMC

import numpyro_sgd.minibatch.policy as policy_module
from numpyro_sgd import EWSG, IASG, ConstantSGD
from numpyro_sgd.datasets import shuffle_rows
from numpyro_sgd.minibatch.policy import (
    choose_cluster_size,
    choose_subsample_size,
    order_design_effect,
    resolve_cluster_sizes,
)
from numpyro_sgd.minibatch.with_replacement import cluster_indices
from numpyro_sgd.model.potential import SubsampledPotential
from numpyro_sgd.numerics.noise import cluster_rows, noise_estimator


def test_cluster_indices_are_uniform_circular_runs():
    n, size, b, draws = 37, 12, 4, 4000
    idx = np.asarray(jax.vmap(lambda k: cluster_indices(k, size, n, b))(random.split(random.key(0), draws)))
    assert idx.shape == (draws, size) and idx.dtype == np.int32
    assert idx.min() >= 0 and idx.max() < n
    runs = idx.reshape(draws, size // b, b)
    assert np.all((runs - runs[..., :1]) % n == np.arange(b))  # B consecutive rows, wrapping around
    # each row is in a cluster with probability B/N whatever its position (also at the wrap): its
    # count over the draws is Binomial(draws·K, B/N) exactly
    counts = np.bincount(idx.ravel(), minlength=n)
    trials, p = draws * size // b, b / n
    z = (counts - trials * p) / np.sqrt(trials * p * (1 - p))
    assert np.max(np.abs(z)) < 4.5, z


def test_cluster_size_rule():
    # small data stay random rows; the 10⁷ × 50 float32 case gets clusters of 125 (a divisor of S)
    assert choose_cluster_size(200_000, 10_000, 20, 84) == 1
    assert choose_cluster_size(10_000_000, 10_000, 50, 204) == 125
    # each bound binds: bytes per cluster, √(D·B/N) ≤ 0.05, at least 32 clusters
    assert choose_cluster_size(10_000_000, 10_000, 50, 4000) == 8
    assert choose_cluster_size(1_000_000, 10_000, 50, 204) == 50
    assert choose_cluster_size(10_000_000, 1024, 50, 204) == 32
    assert choose_cluster_size(10_000_000, 10_000, 50, None) == 1


def test_cluster_rows_covariance_is_the_law_noise():
    # a minibatch of K = S/B clusters sums to Σ_k G_k, with covariance K·Cov[G_k] = S·Cov[u] for
    # cluster_rows' u_k = G_k/√B; the estimator's Q = Cov[u]/S is then Cov[minibatch sum]/S²,
    # compared here with that covariance over 4,000 drawn minibatches (rows with one ordered column)
    rng = np.random.default_rng(0)
    n, d, s, b = 4000, 3, 200, 10
    g = rng.standard_normal((n, d)) @ np.diag([1.0, 2.0, 0.5])
    g[:, 0] += np.repeat(rng.standard_normal(n // 50), 50)  # column 0 ordered in runs of 50
    keys = random.split(random.key(1), 4000)
    idx = np.asarray(jax.vmap(lambda k: cluster_indices(k, s, n, b))(keys))
    sums = g[idx].sum(axis=1)
    est = noise_estimator("minibatch", (s,), d, full=True, cluster_sizes=(b,))
    state = est.init(jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
    for rows in g[idx[:400]]:
        state = est.update(state, (jnp.asarray(rows, jnp.float32),))
    q = np.asarray(est.final(state)[0])
    empirical = np.cov(sums.T) / s**2
    np.testing.assert_allclose(np.diag(q), np.diag(empirical), rtol=0.15)
    assert q[0, 0] > 1.5 * np.var(g[:, 0]) / s  # the ordered column's noise is larger than random rows'
    np.testing.assert_array_equal(cluster_rows(jnp.ones((6, 2)), 1), jnp.ones((6, 2)))


def _model(X, y=None):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=1000) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])


def _regression(n=20_000, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    y = (X @ rng.standard_normal(d) + rng.standard_normal(n)).astype(np.float32)
    precision = X.T.astype(float) @ X + np.eye(d)
    mean = np.linalg.solve(precision, X.T.astype(float) @ y)
    return X, y, mean, np.linalg.inv(precision)


def test_ordered_rows_are_detected_and_the_default_falls_back(monkeypatch):
    X, y, _, _ = _regression()
    potential = SubsampledPotential.from_model(_model, (X, y))
    assert resolve_cluster_sizes(potential, (X, y), {}) == {"data": 1}  # 240 KB of data: random rows
    monkeypatch.setattr(policy_module, "CLUSTER_MIN_DATA_BYTES", 0)  # as if the data were large
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = resolve_cluster_sizes(potential, (X, y), {})["data"]
    assert chosen > 1 and 1000 % chosen == 0
    assert order_design_effect([X, y], len(y), chosen) < 1.3
    order = np.argsort(y)
    with pytest.warns(UserWarning, match=r"rows of plate 'data' look ordered.*draws random rows instead.*shuffle_rows"):
        assert resolve_cluster_sizes(potential, (X[order], y[order]), {}) == {"data": 1}
    Xs, ys = shuffle_rows(X[order], y[order], seed=1)  # the fix the warning names
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_cluster_sizes(potential, (Xs, ys), {})["data"] == chosen
    # a cluster size given by the user is kept, with the warning
    with pytest.warns(UserWarning, match="look ordered"):
        assert resolve_cluster_sizes(potential, (X[order], y[order]), {}, requested=50) == {"data": 50}


def test_the_order_check_reads_the_clusters_a_few_at_a_time():
    """The design effect is the same whether the clusters are read in one block or one at a time
    (each cluster's mean and variance kept): on rows in random order and on rows sorted by y."""
    X, y, _, _ = _regression(n=6000)
    order = np.argsort(y)
    for arrays in ([X, y], [X[order], y[order]]):
        whole = order_design_effect(arrays, len(y), 20, chunk_elements=10**9)
        assert order_design_effect(arrays, len(y), 20, chunk_elements=1) == pytest.approx(whole, rel=1e-9)
        assert order_design_effect(arrays, len(y), 20, chunk_elements=500) == pytest.approx(whole, rel=1e-9)
    assert order_design_effect([X[order], y[order]], len(y), 20) > 10  # sorted by y: about B


def test_shuffle_rows_keeps_rows_together(tmp_path):
    X = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.arange(20)
    path = tmp_path / "X.npy"
    np.save(path, X)
    Xs, ys = shuffle_rows(np.load(path, mmap_mode="r"), y, seed=3, chunk_rows=7)
    np.testing.assert_array_equal(Xs[:, 0], 2 * ys)
    assert sorted(ys.tolist()) == list(range(20)) and ys.tolist() != list(range(20))
    with pytest.raises(ValueError, match="same number of rows"):
        shuffle_rows(X, y[:5])


@pytest.mark.filterwarnings("ignore:.*look ordered")  # its data are a range: ordered on purpose
def test_cluster_size_errors_name_the_fix():
    X, y, _, _ = _regression(n=2000)
    with pytest.raises(ValueError, match=r"cluster_size=7 must divide .*S = 1000.*use one of"):
        MCMC(ConstantSGD(_model, cluster_size=7), num_warmup=0, num_samples=1).run(random.key(0), X, y)
    # with mesh= over k devices each device draws S/k rows: B must divide S/k (checked before any compute)
    pot = SubsampledPotential.from_model(_model, (X, y), {})
    with pytest.raises(ValueError, match=r"cluster_size=200 must divide .*per device \(S/2\) S = 500"):
        resolve_cluster_sizes(pot, (X, y), {}, requested=200, kernel_name="ConstantSGD", shards=2)
    assert resolve_cluster_sizes(pot, (X, y), {}, requested=250, kernel_name="ConstantSGD", shards=2) == {"data": 250}
    with pytest.raises(ValueError, match="cluster_size=4 is not supported here: this kernel draws"):
        EWSG(_model, cluster_size=4)
    with pytest.raises(ValueError, match="subsample='without_replacement' draws rows"):
        ConstantSGD(_model, cluster_size=4, subsample="without_replacement")


@pytest.mark.parametrize("ordered", [False, pytest.param(True, marks=pytest.mark.runs_compiled_code)],
                         ids=["random-order", "sorted-by-y"])
def test_cluster_law_stationary_covariance_matches_the_posterior(ordered):
    """ConstantSGD-full under the cluster law (B = 50, K = 20 clusters per minibatch) against the
    exact posterior of a conjugate regression (N = 20,000, D = 3, S = 1,000).

    Tolerances: with the noise estimated from the cluster sums the KL-optimal chain's stationary
    covariance is the posterior's up to O(S/N) (5 %·(C_B/C − 1) on sorted rows) and the
    estimate's error; had the per-row noise been used on random rows, C_B/C − 1 would be of order
    √(D·B/N) = 0.087, so half of it, 0.043, bounds the sd error we allow from the law; the Monte
    Carlo error of an sd from the run's ESS is 1/√(2·ESS) and of a mean 1/√ESS (4 of each). On rows
    sorted by y (C_B up to B·C) the law is still unbiased and its noise estimated: the same
    tolerances hold, at a lower ESS (warned, and kept since cluster_size is given).
    """
    X, y, mean, cov = _regression()
    if ordered:
        order = np.argsort(y)
        X, y = X[order], y[order]
    kernel = ConstantSGD(_model, preconditioner="full", cluster_size=50)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=1000, num_chains=2, chain_method="vectorized",
                progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(random.key(0), X, y)
    assert any("look ordered" in str(w.message) for w in caught) == ordered
    assert kernel.potential.plates[0].cluster_size == 50
    w = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    ess = float(np.min(numpyro.diagnostics.effective_sample_size(w)))
    assert ess > 200
    sd = np.sqrt(np.diag(cov))
    law = 0.5 * np.sqrt(3 * 50 / 20_000)
    mean_err = np.abs(w.reshape(-1, 3).mean(0) - mean) / sd
    sd_err = np.abs(w.reshape(-1, 3).std(0) / sd - 1)
    assert np.all(mean_err < 4 / np.sqrt(ess)), (mean_err, ess)
    assert np.all(sd_err < law + 4 / np.sqrt(2 * ess)), (sd_err, ess)


def test_subsample_size_rule():
    assert choose_subsample_size(10_000_000, "cpu") == 10_000
    assert choose_subsample_size(10_000_000, "gpu") == 100_000
    assert choose_subsample_size(1_000_000, "gpu") == 100_000
    assert choose_subsample_size(50_000, "cpu") == 5_000  # at least 10 steps per pass
    assert choose_subsample_size(50_000, "cpu", min_steps_per_pass=100) == 500
    assert choose_subsample_size(5, "cpu") == 1


def _one_model(X, y=None, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])


def test_the_kernel_picks_s_when_left_to_it():
    X, y, _, _ = _regression(n=50_000)
    s = choose_subsample_size(50_000)
    # NumPyro's one model for NUTS and SG, no S anywhere: the kernel picks it for the observed plate
    for kernel, expected in [(ConstantSGD(_one_model), s),
                             (IASG(_one_model), choose_subsample_size(50_000, min_steps_per_pass=100)),
                             (ConstantSGD(_one_model, subsample_size="auto"), s)]:
        kernel.init(random.key(0), 0, model_args=(X, y))
        assert kernel.potential.plates[0].subsample_size == expected
    # "auto" replaces an S the model declares; an int still wins
    kernel = ConstantSGD(_one_model, subsample_size="auto")
    kernel.init(random.key(0), 0, model_args=(X, y), model_kwargs={"subsample_size": 100})
    assert kernel.potential.plates[0].subsample_size == s
    kernel = ConstantSGD(_one_model, subsample_size=300)
    kernel.init(random.key(0), 0, model_args=(X, y))
    assert kernel.potential.plates[0].subsample_size == 300


def test_a_model_that_keeps_all_rows_is_named_when_s_is_given():
    def unindexed(y):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("obs", dist.Normal(mu, 1), obs=y)

    # before: "Model and guide shapes disagree at site 'obs'" from inside the first potential
    with pytest.raises(ValueError, match=r"observed site\(s\) \['obs'\] keep all N rows.*obs=y\[idx\]"):
        ConstantSGD(unindexed, subsample_size=50).init(random.key(0), 0, model_args=(jnp.zeros(2000),))
