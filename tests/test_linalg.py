"""Dense linear algebra never runs as one batched LAPACK call under the vectorized chains.

jaxlib's CPU LAPACK kernels split a batch into tasks on XLA's intra-op pool and block the calling
thread until they finish; two such calls running at once on pool threads can wait on each other
for ever (``numpyro_sgd.numerics.linalg``). The checks: the wrappers give jnp.linalg's values, batched or
not; under ``vmap`` their jaxpr holds no LAPACK primitive with a batch dimension; every kernel's
vmapped warmup step, end of warmup and sampling step (the programs the vectorized chains run)
hold none either, at D = 55; and, end to end in a subprocess under a timeout, every kernel that
takes ``control_variates=True`` finishes on a D = 55 logistic regression with 2 vectorized chains
(``SGHMC(model, control_variates=True)`` hung there for ever before).
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_sgd import EWSG, IASG, PSGLD, SGFS, SGHMC, SGLD, ConstantSGD, OverdampedEWSG, Santa
from numpyro_sgd.numerics import linalg

#: the primitives jaxlib lowers to LAPACK (or BLAS trsm) custom calls on the CPU
LAPACK_PRIMITIVES = {"cholesky", "eigh", "triangular_solve", "lu", "qr", "householder_product", "geqrf", "svd",
                     "eig", "schur", "hessenberg", "tridiagonal", "tridiagonal_solve"}


def batched_lapack_calls(jaxpr):
    """``[(primitive, operand shape)]`` of every LAPACK primitive in ``jaxpr`` (sub-jaxprs
    included) whose operand has more than the two matrix dimensions."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in LAPACK_PRIMITIVES:
            shape = eqn.invars[0].aval.shape
            if len(shape) > 2:
                found.append((eqn.primitive.name, shape))
        for sub in _subjaxprs(eqn):
            found += batched_lapack_calls(sub)
    return found


def _subjaxprs(eqn):
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "jaxpr") and hasattr(item, "consts"):  # ClosedJaxpr
                yield item.jaxpr
            elif hasattr(item, "eqns"):  # Jaxpr
                yield item


def spd(key, batch, d):
    a = jax.random.normal(key, (batch, d, d))
    return a @ jnp.swapaxes(a, 1, 2) + d * jnp.eye(d)


def test_the_wrappers_are_jnp_linalg_batched_or_not():
    """Each wrapper's values equal jnp.linalg's (and jax.scipy.linalg's) matrix by matrix, called
    on one matrix or mapped over a batch."""
    m = spd(jax.random.key(0), 3, 7)
    b = jax.random.normal(jax.random.key(1), (3, 7))
    chol = jnp.linalg.cholesky(m)
    pairs = [
        (jax.vmap(linalg.cholesky)(m), chol),
        (jax.vmap(linalg.cho_solve)(chol, b), jax.vmap(lambda c, v: jax.scipy.linalg.cho_solve((c, True), v))(chol, b)),
        (jax.vmap(lambda c, v: linalg.solve_triangular(c, v, lower=True))(chol, b),
         jax.vmap(lambda c, v: jax.scipy.linalg.solve_triangular(c, v, lower=True))(chol, b)),
        (jax.vmap(lambda c, v: linalg.solve_triangular(c.T, v, lower=False))(chol, b),
         jax.vmap(lambda c, v: jax.scipy.linalg.solve_triangular(c.T, v, lower=False))(chol, b)),
        (jax.vmap(linalg.eigvalsh)(m), jnp.linalg.eigvalsh(m)),
        (jax.vmap(linalg.eigh)(m)[0], jnp.linalg.eigh(m)[0]),
        (jnp.abs(jax.vmap(linalg.eigh)(m)[1]), jnp.abs(jnp.linalg.eigh(m)[1])),
        (jax.vmap(linalg.inv)(m), jnp.linalg.inv(m)),
        (linalg.cholesky(m[0]), chol[0]),
        (linalg.inv(m[0]), jnp.linalg.inv(m[0])),
    ]
    for got, want in pairs:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # an unbatched argument beside a batched one (the rule broadcasts it)
    np.testing.assert_allclose(jax.vmap(linalg.cho_solve, in_axes=(None, 0))(chol[0], b),
                               jax.vmap(lambda v: jax.scipy.linalg.cho_solve((chol[0], True), v))(b), rtol=1e-5)


def test_under_vmap_no_lapack_call_is_batched():
    """vmap (twice: chains × points) of each wrapper holds LAPACK calls on single matrices only,
    where jnp.linalg's own is one batched call (the deadlock's precondition)."""
    m = spd(jax.random.key(0), 2, 55)
    assert batched_lapack_calls(jax.make_jaxpr(jax.vmap(jnp.linalg.eigh))(m).jaxpr)
    for fn in (linalg.cholesky, linalg.eigh, linalg.eigvalsh, linalg.inv,
               lambda x: linalg.cho_solve(x, x[0]), lambda x: linalg.solve_triangular(x, x, lower=True)):
        assert batched_lapack_calls(jax.make_jaxpr(jax.vmap(fn))(m).jaxpr) == []
        assert batched_lapack_calls(jax.make_jaxpr(jax.vmap(jax.vmap(fn)))(m[None]).jaxpr) == []


N, D, S = 2_000, 55, 100
_rng = np.random.default_rng(0)
X = _rng.normal(size=(N, D)).astype(np.float32)
Y = (_rng.random(N) < 1 / (1 + np.exp(-X @ (0.3 * _rng.normal(size=D))))).astype(np.float32)


def logistic(X, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=S) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


#: every kernel whose warmup or end of warmup factors a D × D matrix (default steps, full
#: preconditioners, control variates)
FACTORING = [
    pytest.param(lambda: ConstantSGD(logistic, preconditioner="full"), id="ConstantSGD-full"),
    pytest.param(lambda: SGFS(logistic, preconditioner="full"), id="SGFS-full"),
    pytest.param(lambda: IASG(logistic, preconditioner="full", check_validity=False), id="IASG-full"),
    pytest.param(lambda: SGLD(logistic, coordinates="full"), id="SGLD"),
    pytest.param(lambda: PSGLD(logistic), id="PSGLD"),
    pytest.param(lambda: SGHMC(logistic, coordinates="full"), id="SGHMC"),
    pytest.param(lambda: Santa(logistic, coordinates="full"), id="Santa"),
    pytest.param(lambda: SGLD(logistic, control_variates=True), id="SGLD-CV"),
    pytest.param(lambda: SGHMC(logistic, control_variates=True), id="SGHMC-CV"),
    pytest.param(lambda: EWSG(logistic, control_variates=True), id="EWSG-CV"),
    pytest.param(lambda: OverdampedEWSG(logistic, control_variates=True), id="OverdampedEWSG-CV"),
]


@pytest.mark.parametrize("make", FACTORING)
def test_no_kernel_runs_a_batched_lapack_call(make):
    """The vmapped (2 chains) warmup step, end of warmup and sampling step of every factoring
    kernel, traced at D = 55, hold no batched LAPACK call."""
    algorithm, oracle, theta = make().algorithm(jax.random.key(0), jnp.asarray(X), jnp.asarray(Y))

    def chain(key, theta):
        state = algorithm.init(key, theta, 100)
        if algorithm.warmup_step is not None:
            theta, state, _ = algorithm.warmup_step(key, 0, theta, state, oracle)
        if algorithm.end_warmup is not None:
            state = algorithm.end_warmup(theta, state, oracle)
        if algorithm.start_block is not None:
            theta, state = algorithm.start_block(theta, state)
        return algorithm.sample_step(key, 1, theta, state, oracle)[:2]

    keys = jax.random.split(jax.random.key(1), 2)
    jaxpr = jax.make_jaxpr(jax.vmap(chain))(keys, jnp.stack([theta, theta]))
    assert batched_lapack_calls(jaxpr.jaxpr) == []


SCRIPT = textwrap.dedent("""
    import sys, jax, numpy as np, numpyro, numpyro.distributions as dist
    from numpyro.infer import MCMC
    import numpyro_sgd
    rng = np.random.default_rng(0)
    N, D = 5_000, 55
    X = rng.normal(size=(N, D)).astype(np.float32)
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ (0.3 * rng.normal(size=D))))).astype(np.float32)
    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([D]).to_event(1))
        with numpyro.plate("data", N, subsample_size=500) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])
    for name in sys.argv[1:]:
        kernel = getattr(numpyro_sgd, name)(model, control_variates=True)
        mcmc = MCMC(kernel, num_warmup=60, num_samples=20, num_chains=2, chain_method="vectorized",
                    progress_bar=False)
        mcmc.run(jax.random.key(0), X, y)
        print(name, bool(np.isfinite(np.asarray(mcmc.get_samples()["w"])).all()), flush=True)
""")


# in CI the default control-variate kernel; the others with -m slow (the jaxpr check above covers
# every factoring kernel in CI)
@pytest.mark.parametrize("names", [pytest.param(["SGLD"], id="SGLD"),
                                   pytest.param(["SGHMC", "EWSG", "OverdampedEWSG"], id="others",
                                                marks=pytest.mark.slow)])
def test_every_control_variate_kernel_finishes_at_d55_with_two_vectorized_chains(names):
    """End to end, on XLA:CPU's thread pool as a user runs it (its own process, so that a hang is
    a timeout of this test, not of the suite)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        out = subprocess.run([sys.executable, "-c", SCRIPT, *names], capture_output=True, text=True, timeout=420,
                             env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"a control-variate kernel did not finish in 420 s; it printed: {e.stdout!r}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [w for name in names for w in (name, "True")]
