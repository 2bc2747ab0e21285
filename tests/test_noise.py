"""Noise-covariance estimators and the preconditioner formulas, alone, against closed forms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_sgd.minibatch.law import law_of
from numpyro_sgd.model.discovery import PlateInfo
from numpyro_sgd.numerics.noise import discrete_time_correction, noise_estimator
from numpyro_sgd.numerics.preconditioners import kl_optimal_preconditioner

D, S, STEPS = 4, 20, 500
COV = np.array([[2.0, 0.6, 0.0, 0.3], [0.6, 1.0, 0.2, 0.0], [0.0, 0.2, 0.5, 0.1], [0.3, 0.0, 0.1, 3.0]])
MEAN = np.array([1.0, -2.0, 0.5, 0.0])


def _run(method, full):
    """Feed STEPS minibatches of S per-example gradients ~ N(MEAN, COV) to the estimator."""
    est = noise_estimator(method, (S,), D, full=full)
    chol = np.linalg.cholesky(COV)
    keys = jax.random.split(jax.random.key(0), STEPS)

    def step(state, key):
        g = MEAN + jax.random.normal(key, (S, D)) @ chol.T
        return est.update(state, (g,), True), None

    state, _ = jax.lax.scan(step, est.init(jnp.float64), keys)
    (q,) = est.final(state)
    return np.asarray(q), int(state.count)


@pytest.mark.parametrize("method, n_eff", [("minibatch", STEPS * (S - 1)), ("pooled", STEPS * S - 1), ("eq25", STEPS)])
def test_estimators_recover_known_covariance(method, n_eff):
    """Q = Cov/S. A sample covariance from n_eff draws has sd √((Σ_ii Σ_jj + Σ_ij²)/n_eff)
    per entry (Wishart); 5 sd per entry."""
    q, count = _run(method, full=True)
    assert count == STEPS
    sd = np.sqrt((np.outer(np.diag(COV), np.diag(COV)) + COV**2) / n_eff) / S
    np.testing.assert_array_less(np.abs(q - COV / S), 5 * sd)


@pytest.mark.parametrize("method", ["minibatch", "pooled", "eq25"])
def test_diagonal_estimator_equals_diagonal_of_full(method):
    q_full, _ = _run(method, full=True)
    q_diag, _ = _run(method, full=False)
    assert q_diag.shape == (D,)
    np.testing.assert_allclose(q_diag, np.diag(q_full), rtol=1e-10)


def test_inactive_updates_leave_the_state_unchanged():
    est = noise_estimator("minibatch", (S,), D)
    s0 = est.init(jnp.float64)
    s1 = est.update(s0, (jnp.ones((S, D)),), False)
    assert int(s1.count) == 0
    np.testing.assert_array_equal(s1.second[0], s0.second[0])


def test_unknown_estimator():
    with pytest.raises(ValueError, match="unknown noise estimator 'x'"):
        noise_estimator("x", (S,), D)


def test_discrete_time_correction():
    plates = (PlateInfo("data", 1000, 100),)
    q = (jnp.eye(3),)
    assert float(discrete_time_correction(q, plates)) == pytest.approx(2 * 1000 / 1100)
    f = (1000 - 100) / 999
    assert float(discrete_time_correction(q, plates, law_of("without_replacement").noise_factor)) == pytest.approx(2 / (f + 0.1))


def test_kl_optimal_preconditioners_closed_form():
    q = jnp.array([[4.0, 1.0], [1.0, 2.0]])
    n, s = 1000, 10
    p, eps = kl_optimal_preconditioner("full", q, 2.0, num_data=n, batch_size=s)
    np.testing.assert_allclose(p, 2 * np.linalg.inv(np.asarray(q)), rtol=1e-8)
    assert float(eps) == pytest.approx(2 * s / n)  # Eq. 20: H = (2S/N) C⁻¹
    p, _ = kl_optimal_preconditioner("diag", q, 2.0, num_data=n, batch_size=s)
    np.testing.assert_allclose(p, [0.5, 1.0])
    p, eps = kl_optimal_preconditioner("scalar", q, 2.0, num_data=n, batch_size=s)
    assert float(p) == pytest.approx(2 * 2 / 6.0)  # c D / Tr Q
    assert float(eps) == pytest.approx(float(p) * n)
    p, _ = kl_optimal_preconditioner("sqrt", q, 2.0, num_data=n, batch_size=s)
    root = np.sqrt([4.0, 2.0])
    np.testing.assert_allclose(p, 2 * 2 / root.sum() / root)


@pytest.mark.parametrize("kind, expected", [("diag", [0.5, 1.0]), ("full", None), ("sqrt", None), ("scalar", None)])
def test_kl_optimal_preconditioner_in_float32_at_large_n(kind, expected):
    """Without x64 and with N ≥ 46,341, N² is no int32: P = (ε/N) B must still be computed
    (a regression: N = 100,000 raised an OverflowError) and agree with float64 to float32 accuracy."""
    q = np.array([[4.0, 1.0], [1.0, 2.0]])
    n, s = 10_000_000, 1000
    want, _ = kl_optimal_preconditioner(kind, jnp.asarray(q), 2.0, num_data=n, batch_size=s)
    with jax.enable_x64(False):
        got, _ = kl_optimal_preconditioner(kind, jnp.asarray(q, jnp.float32), 2.0, num_data=n, batch_size=s)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)  # a few float32 ulps
    if expected is not None:
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)


def test_user_step_size_in_mandt_units():
    """H = ε B with C = S Q / N² per datum; P = H / N."""
    q = jnp.array([4.0, 2.0])
    n, s, eps = 1000, 10, 0.01
    c_datum = s * np.asarray(q) / n**2
    p, e = kl_optimal_preconditioner("diag", q, step_size=eps, num_data=n, batch_size=s)
    np.testing.assert_allclose(p, eps / c_datum / n)
    assert float(e) == pytest.approx(eps)
    p, e = kl_optimal_preconditioner("sqrt", q, step_size=eps, num_data=n, batch_size=s)
    np.testing.assert_allclose(p, eps / np.sqrt(c_datum) / n)
    p, _ = kl_optimal_preconditioner("scalar", q, step_size=eps, num_data=n, batch_size=s)
    assert float(p) == pytest.approx(eps / n)


def test_full_preconditioner_is_scale_invariant():
    """Badly scaled Q = S R S (diagonal spanning 10¹⁶, as in posteriordb's kidiq): in the
    scaled coordinates S P Q S⁻¹ = c (R + δI)⁻¹ R ≈ c I; a jitter relative to the mean
    diagonal would swamp the small coordinates (entry 0 would be off by a factor ~10⁹)."""
    rng = np.random.default_rng(0)
    m = rng.standard_normal((4, 4))
    corr = m @ m.T + 0.1 * np.eye(4)
    scales = np.diag([1e-4, 1.0, 1e2, 1e4])
    q = jnp.asarray(scales @ corr @ scales)
    p, _ = kl_optimal_preconditioner("full", q, 2.0, num_data=100, batch_size=10)
    scaled = scales @ np.asarray(p) @ np.asarray(q) @ np.linalg.inv(scales)
    np.testing.assert_allclose(scaled, 2 * np.eye(4), atol=1e-6)
