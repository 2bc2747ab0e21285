"""The exact posterior of a linear mixed model, for the accuracy tests and benchmarks of the
control variates for group latents.

The model: y_n = x_nᵀ β + a_{g_n} + σ ε_n, a_g ~ N(0, τ²), β_j ~ N(0, ``prior_beta``²),
σ, τ ~ HalfNormal(``prior_scale``). Given (σ, τ), y is Gaussian with covariance
blockdiag_g(σ² I + τ² 11ᵀ) + X Σ_β Xᵀ; with V_g⁻¹ = (I − w_g 11ᵀ)/σ², w_g = τ²/(σ² + n_g τ²),
every term reduces to per-group sums (n_g, Σ_g x, Σ_g y) and the global XᵀX, Xᵀy, yᵀy, so
p(σ, τ | y) is exact on a grid at any N, and β | σ, τ, y and a_g | σ, τ, y are Gaussian
(Gelman et al., *Bayesian Data Analysis*, 3rd ed., Sec. 15.4). Float64 throughout.
"""

import numpy as np
from scipy.optimize import minimize


def lmm_reference(X, g, y, groups, prior_beta=5.0, prior_scale=2.0, grid=48):
    """Exact posterior moments of the LMM (float64): p(σ, τ | y) on a grid from β and a integrated
    out, then β | σ, τ, y and a_g | σ, τ, y (Gaussian) mixed over the grid. ``{site: (mean, sd)}``."""
    X, y = X.astype(np.float64), y.astype(np.float64)
    n, d = X.shape
    n_g = np.bincount(g, minlength=groups).astype(np.float64)
    s_g = np.zeros((groups, d))
    np.add.at(s_g, g, X)
    t_g = np.bincount(g, weights=y, minlength=groups)
    xtx, xty, yty = X.T @ X, X.T @ y, y @ y
    prior_prec = np.eye(d) / prior_beta**2

    def pieces(sigma, tau):
        w = tau**2 / (sigma**2 + n_g * tau**2)                     # V_g⁻¹ = (I − w 11ᵀ)/σ²
        q = (xtx - (s_g * w[:, None]).T @ s_g) / sigma**2         # Σ X_gᵀ V_g⁻¹ X_g
        b = (xty - s_g.T @ (w * t_g)) / sigma**2
        c = (yty - np.sum(w * t_g**2)) / sigma**2
        logdet_v = np.sum((n_g - 1) * np.log(sigma**2) + np.log(sigma**2 + n_g * tau**2))
        prec = q + prior_prec
        chol = np.linalg.cholesky(prec)
        mean = np.linalg.solve(prec, b)
        logml = (-0.5 * logdet_v - np.sum(np.log(np.diag(chol))) - d * np.log(prior_beta)
                 - 0.5 * (c - b @ mean))
        return logml, mean, np.linalg.inv(prec), w

    def log_post(sigma, tau):
        return pieces(sigma, tau)[0] - sigma**2 / (2 * prior_scale**2) - tau**2 / (2 * prior_scale**2)

    # a coarse search for the mode and the curvature, then a grid of ±6 sds around it
    res = minimize(lambda p: -log_post(np.exp(p[0]), np.exp(p[1])), np.log([np.std(y), 0.5]), method="Nelder-Mead",
                   options=dict(xatol=1e-6, fatol=1e-6))
    ls, lt = res.x
    h = 1e-3
    sds = []
    for k in range(2):
        e = np.eye(2)[k] * h
        f0, fp, fm = (log_post(*np.exp(res.x + s * e)) for s in (0, 1, -1))
        sds.append(1 / np.sqrt(max(-(fp - 2 * f0 + fm) / h**2, 1e-12)))
    axes = [np.linspace(c - 6 * s, c + 6 * s, grid) for c, s in zip((ls, lt), sds)]
    logw, moments = [], []
    for u in axes[0]:
        for v in axes[1]:
            sigma, tau = np.exp(u), np.exp(v)
            logml, mean, cov, w = pieces(sigma, tau)
            # grid in log space: the density of (log σ, log τ) carries the Jacobian σ τ
            logw.append(logml - (sigma**2 + tau**2) / (2 * prior_scale**2) + u + v)
            k_g = (1 / sigma**2) / (n_g / sigma**2 + 1 / tau**2)
            a_mean = k_g * (t_g - s_g @ mean)
            a_var = 1 / (n_g / sigma**2 + 1 / tau**2) + k_g**2 * np.einsum("gi,ij,gj->g", s_g, cov, s_g)
            moments.append((sigma, tau, mean, np.diag(cov), a_mean, a_var))
    logw = np.asarray(logw)
    wts = np.exp(logw - logw.max())
    wts /= wts.sum()

    def mix(index):
        m1 = sum(wk * np.asarray(mo[index]) for wk, mo in zip(wts, moments))
        return m1

    out = {}
    for name, k in (("sigma", 0), ("tau", 1)):
        m1 = mix(k)
        m2 = sum(wk * mo[k] ** 2 for wk, mo in zip(wts, moments))
        out[name] = (m1, np.sqrt(m2 - m1**2))
    for name, (km, kv) in (("beta", (2, 3)), ("a", (4, 5))):
        m1 = mix(km)
        m2 = sum(wk * (mo[kv] + mo[km] ** 2) for wk, mo in zip(wts, moments))
        out[name] = (m1, np.sqrt(m2 - m1**2))
    edge = max(wts.reshape(grid, grid)[[0, -1], :].max(), wts.reshape(grid, grid)[:, [0, -1]].max())
    out["grid_edge_weight"] = edge
    return out
