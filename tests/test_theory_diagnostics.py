"""Theory formulas and the Gaussian KL, against closed forms."""

import numpy as np
import pytest

from numpyro_sgd import gaussian_kl, lyapunov_covariance


def test_lyapunov_scalar_closed_forms():
    """1-D: continuous Σ = p q / (2a); discrete Σ = p² q / (2 p a − p² a²)."""
    p, a, q = 0.1, 2.0, 3.0
    assert lyapunov_covariance(p, [[a]], [q])[0, 0] == pytest.approx(p * q / (2 * a))
    discrete = p**2 * q / (2 * p * a - (p * a) ** 2)
    assert lyapunov_covariance(p, [[a]], [q], discrete=True)[0, 0] == pytest.approx(discrete)


def test_lyapunov_solves_its_equations():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((4, 4))
    a = m @ m.T + 4 * np.eye(4)
    q = np.cov(rng.standard_normal((50, 4)), rowvar=False)
    p = 0.05 * np.diag(rng.uniform(0.5, 2, 4))
    sig = lyapunov_covariance(p, a, q)
    np.testing.assert_allclose(p @ a @ sig + sig @ a @ p, p @ q @ p, atol=1e-12)
    sig_d = lyapunov_covariance(np.diag(p), a, q, discrete=True)
    b = np.eye(4) - p @ a
    np.testing.assert_allclose(b @ sig_d @ b.T + p @ q @ p, sig_d, atol=1e-12)


def test_full_optimum_gives_the_posterior_in_continuous_time():
    """Mandt Thm. 2: with A = (S/N) Q (Fisher = Hessian), P = 2 Q⁻¹ gives Σ = A⁻¹."""
    rng = np.random.default_rng(1)
    m = rng.standard_normal((3, 3))
    q = m @ m.T + np.eye(3)
    a = 0.01 * q
    sig = lyapunov_covariance(2 * np.linalg.inv(q), a, q)
    np.testing.assert_allclose(sig, np.linalg.inv(a), rtol=1e-8)


def test_gaussian_kl_closed_forms():
    # 1-D: KL(N(0,1) || N(1,4)) = log 2 + (1 + 1)/8 − 1/2
    assert gaussian_kl((0.0, 1.0), (1.0, 4.0)) == pytest.approx(np.log(2) + 2 / 8 - 0.5)
    # 2-D, diagonal: sum of 1-D terms
    kl = gaussian_kl(([0.0, 0.0], np.diag([1.0, 2.0])), ([1.0, -1.0], np.diag([2.0, 1.0])))
    one = 0.5 * (1 / 2 + 1 / 2 - 1 + np.log(2))
    two = 0.5 * (2 + 1 - 1 + np.log(0.5))
    assert kl == pytest.approx(one + two)
    # identical Gaussians, correlated
    cov = np.array([[1.0, 0.9], [0.9, 1.0]])
    assert gaussian_kl(([1.0, 2.0], cov), ([1.0, 2.0], cov)) == pytest.approx(0.0, abs=1e-12)
    # asymmetry
    assert gaussian_kl((0.0, 1.0), (0.0, 2.0)) != pytest.approx(gaussian_kl((0.0, 2.0), (0.0, 1.0)))


def test_gaussian_kl_from_draws():
    """Draws of shape (chains, draws, D) are flattened and fitted; with 200k draws the fitted KL
    is within its bias (≈ 5/n) plus 5 sd of the exact one."""
    rng = np.random.default_rng(2)
    cov = np.array([[2.0, 0.5], [0.5, 1.0]])
    draws = rng.multivariate_normal([1.0, 0.0], cov, size=(4, 50_000))
    exact = gaussian_kl(([1.0, 0.0], cov), ([0.0, 0.0], np.eye(2)))
    assert gaussian_kl(draws, ([0.0, 0.0], np.eye(2))) == pytest.approx(exact, abs=0.02)
    assert gaussian_kl(draws, ([1.0, 0.0], cov)) < 1e-3


def test_gaussian_kl_errors():
    with pytest.raises(ValueError, match="dimensions differ"):
        gaussian_kl(([0.0], [[1.0]]), ([0.0, 0.0], np.eye(2)))
    with pytest.raises(ValueError, match="at least 2 draws"):
        gaussian_kl(np.zeros((1, 2)), ([0.0, 0.0], np.eye(2)))
