"""A hand-written ``lax.scan`` baseline for ``hierarchical_scale.py --problem lmm --baseline``: the
same algorithm as ``SGWithinGibbs(SGLD(model, control_variates=True))`` on the linear mixed model,
written for this one model in plain JAX, with nothing of the package (no model tracing, no
checks, no guards, no adaptation), so that its compile and run times bound from below what the
package's route could take.

The model (``hierarchical_scale.make_model("lmm")``): y = X β + a_g + σ ε, β_j ~ N(0, 5²),
a_g ~ N(0, τ²), σ, τ ~ HalfNormal(2). θ = (β, log σ | a): 11 global coordinates and one per group.
Per chain:

    centre     20 Newton steps on all rows at τ₀ (blocks of rows; the Hessian as the arrowhead
               [A C; Cᵀ diag(D)], from 12 Hessian-vector products per block)
    each step  θ ← the exponential-integrator step of the control-variate gradient about the
               centre, preconditioned by the arrowhead (group_sgld's Eqs. 1–2, h = 1);
               log τ ← 4 random-walk Metropolis steps on p(τ | a) (no data)
    end of     6 Newton steps from θ at the current τ
    warmup

The 1-d τ update is Metropolis here, not NUTS: a lower bound on the cost, not the same kernel.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random

PRIOR_BETA, PRIOR_SCALE = 5.0, 2.0
BLOCK_ROWS = 65_536
NEWTON_STEPS = 20  # from the start (undamped steps: 12 were not enough at N = 10⁵)
RECENTRE_STEPS = 6  # from the chain's point at the end of warmup
MH_STEPS = 4


def _neg_log_lik(glob, a, x, g, y, w):
    """Σ_i w_i (r_i² / (2σ²) + log σ), r = y − x β − a_g (the constant dropped)."""
    beta, log_sigma = glob[:-1], glob[-1]
    r = y - x @ beta - a[g]
    return jnp.sum(w * (0.5 * r**2 * jnp.exp(-2.0 * log_sigma) + log_sigma))


def _prior(glob, a, tau):
    """(∇U₀ over (glob, a), the diagonal of ∇²U₀ over (glob, a)); U₀ = Σβ²/(2·5²) + σ²/(2·2²)
    − log σ (its Jacobian) + Σ a² / (2τ²)."""
    beta, log_sigma = glob[:-1], glob[-1]
    s2 = jnp.exp(2.0 * log_sigma)
    grad_glob = jnp.concatenate([beta / PRIOR_BETA**2, (s2 / PRIOR_SCALE**2 - 1.0)[None]])
    hess_glob = jnp.concatenate([jnp.full_like(beta, 1 / PRIOR_BETA**2), (2 * s2 / PRIOR_SCALE**2)[None]])
    return (grad_glob, a / tau**2), (hess_glob, jnp.full_like(a, 1.0) / tau**2)


def _arrowhead(A, C, D):
    """The factor of [A C; Cᵀ diag(D)] (D > 0) by its Schur complement S = A − C D⁻¹ Cᵀ, S made
    positive definite by its eigenvalues' absolute values (saddle-free, as the package's
    factor): (D, C / D, S's eigenvectors, |eigenvalues|)."""
    W = C / D
    S = A - W @ C.T
    lam, V = jnp.linalg.eigh(0.5 * (S + S.T))
    lam = jnp.abs(lam)
    return D, W, V, jnp.maximum(lam, 1e-6 * jnp.max(lam))


def _solve(fac, rg, ra):
    D, W, V, lam = fac
    xg = V @ ((V.T @ (rg - W @ ra)) / lam)
    return xg, ra / D - W.T @ xg


def _draw(fac, zg, za):
    """L⁻ᵀ ξ with H = L Lᵀ, L = [[V Λ^{1/2}, W D^{1/2}], [0, D^{1/2}]] in (global, group) order:
    a draw of N(0, H⁻¹)."""
    D, W, V, lam = fac
    xg = V @ (zg / jnp.sqrt(lam))
    return xg, za / jnp.sqrt(D) - W.T @ xg


def make_run(n, groups, d, s, num_warmup, num_samples, step=1.0):
    num_blocks = -(-n // BLOCK_ROWS)

    def full_pass(glob, a, X, g, y):
        """(∇L, A, C, D) on all rows: the gradient and the arrowhead Hessian of the likelihood."""
        probes = (jnp.concatenate([jnp.eye(d + 1), jnp.zeros((1, d + 1))]),
                  jnp.concatenate([jnp.zeros((d + 1, groups)), jnp.ones((1, groups))]))

        def block(b, acc):
            rows = b * BLOCK_ROWS + jnp.arange(BLOCK_ROWS)
            w = (rows < n).astype(X.dtype)
            rows = jnp.minimum(rows, n - 1)
            x, gb, yb = X[rows], g[rows], y[rows]
            grad_fn = jax.grad(_neg_log_lik, (0, 1))
            grad, tangent = jax.linearize(lambda gl, aa: grad_fn(gl, aa, x, gb, yb, w), glob, a)
            cols = jax.vmap(tangent)(*probes)
            return jax.tree.map(jnp.add, acc, (grad, cols))

        zero = ((jnp.zeros_like(glob), jnp.zeros_like(a)),
                (jnp.zeros((d + 2, d + 1), glob.dtype), jnp.zeros((d + 2, groups), a.dtype)))
        (gg, ga), (cg, ca) = lax.fori_loop(0, num_blocks, block, zero)
        return (gg, ga), cg[: d + 1], ca[: d + 1], ca[d + 1]

    def newton(glob, a, tau, X, g, y, steps):
        def body(_, carry):
            glob, a, _ = carry
            lik_grad, A, C, D = full_pass(glob, a, X, g, y)
            (pg, pa), (hg, ha) = _prior(glob, a, tau)
            fac = _arrowhead(A + jnp.diag(hg), C, D + ha)
            xg, xa = _solve(fac, lik_grad[0] + pg, lik_grad[1] + pa)
            return glob - xg, a - xa, (lik_grad, A, C, D)

        init = (glob, a, full_pass(glob, a, X, g, y))
        glob, a, _ = lax.fori_loop(0, steps, body, init)
        return glob, a, full_pass(glob, a, X, g, y)  # the centre and ∇L, ∇²L there

    def log_tau_density(u, a):
        tau = jnp.exp(u)
        return -0.5 * tau**2 / PRIOR_SCALE**2 - groups * u - 0.5 * jnp.sum(a**2) / tau**2 + u

    def tau_update(key, u, a):
        scale = 2.4 / np.sqrt(2.0 * groups)

        def body(k, u):
            k1, k2 = random.split(random.fold_in(key, k))
            prop = u + scale * random.normal(k1)
            accept = jnp.log(random.uniform(k2)) < log_tau_density(prop, a) - log_tau_density(u, a)
            return jnp.where(accept, prop, u)

        return lax.fori_loop(0, MH_STEPS, body, u)

    def sg_step(key, glob, a, u, centre, X, g, y):
        cg, ca, (lg, A, C, D) = centre
        k_idx, k_noise, k_tau = random.split(key, 3)
        idx = random.randint(k_idx, (s,), 0, n)
        x, gb, yb, w = X[idx], g[idx], y[idx], jnp.full((s,), n / s, X.dtype)
        f = lambda gl, aa: _neg_log_lik(gl, aa, x, gb, yb, w)  # noqa: E731
        here = jax.grad(f, (0, 1))(glob, a)
        dg, da = glob - cg, a - ca
        there, curv = jax.jvp(jax.grad(f, (0, 1)), (cg, ca), (dg, da))
        tau = jnp.exp(u)
        (pg, pa), (hg, ha) = _prior(glob, a, tau)
        grad_g = pg + lg[0] + A @ dg + C @ da + here[0] - there[0] - curv[0]
        grad_a = pa + lg[1] + C.T @ dg + D * da + here[1] - there[1] - curv[1]
        fac = _arrowhead(A + jnp.diag(hg), C, D + ha)
        sg, sa = _solve(fac, grad_g, grad_a)
        zg, za = _draw(fac, random.normal(k_noise, glob.shape), random.normal(random.fold_in(k_noise, 1), a.shape))
        decay = np.exp(-step)
        glob = glob - (1 - decay) * sg + np.sqrt(1 - decay**2) * zg
        a = a - (1 - decay) * sa + np.sqrt(1 - decay**2) * za
        return glob, a, tau_update(k_tau, u, a)

    def chain(key, X, g, y):
        glob = jnp.concatenate([jnp.zeros(d), jnp.log(jnp.std(y))[None]])
        a, u = jnp.zeros(groups), jnp.log(jnp.asarray(1.0))
        cg, ca, moments = newton(glob, a, jnp.exp(u), X, g, y, NEWTON_STEPS)
        k_warm, k_samp = random.split(key)

        def warm(carry, k):
            glob, a, u = carry
            return sg_step(k, glob, a, u, (cg, ca, moments), X, g, y), None

        (glob, a, u), _ = lax.scan(warm, (cg, ca, u), random.split(k_warm, num_warmup))
        centre = newton(glob, a, jnp.exp(u), X, g, y, RECENTRE_STEPS)

        def sample(carry, k):
            carry = sg_step(k, *carry, centre, X, g, y)
            glob, a, u = carry
            return carry, (glob[:-1], jnp.exp(glob[-1]), jnp.exp(u), a)

        _, draws = lax.scan(sample, (glob, a, u), random.split(k_samp, num_samples))
        return dict(zip(("beta", "sigma", "tau", "a"), draws))

    return jax.jit(jax.vmap(chain, in_axes=(0, None, None, None)))


def run_scan_baseline(data, groups, s, num_warmup, num_samples, chains=2, seed=5):
    """(draws ``{site: (chains, draws, ...)}``, times): the compile (trace, lower, compile) and the
    run of one program, and their sum (the wall a user of this script waits)."""
    X, g, y = data
    n, d = X.shape
    keys = random.split(random.key(seed), chains)
    t0 = time.perf_counter()
    compiled = make_run(n, groups, d, s, num_warmup, num_samples).lower(keys, X, g, y).compile()
    t1 = time.perf_counter()
    draws = jax.block_until_ready(compiled(keys, X, g, y))
    t2 = time.perf_counter()
    # counted as the route counts them, summed over the chains: a search reads all rows once before
    # its steps, once per step and once at its end; a step's gradients at θ and at the centre
    centre = chains * (NEWTON_STEPS + RECENTRE_STEPS + 4)
    sg = chains * (num_warmup + num_samples) * 2 * s / n
    return draws, dict(compile_s=t1 - t0, sampling_s=t2 - t1, wall_s=t2 - t0, centre_passes=centre, sg_passes=sg)
