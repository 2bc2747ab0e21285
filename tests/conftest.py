"""Shared fixtures: float64, a persistent compilation cache, and exact reference problems."""

import gc
import os
import subprocess
import sys

# XLA:CPU compiles the suite's many small programs without LLVM's optimisation passes. A test's
# time is almost all compilation (its programs run for milliseconds), and these options change
# how fast the machine code is, not what it computes: tests/test_pinned_draws.py, whose pins were
# written with XLA's defaults, passes under them at its 1e-9 relative tolerance on every CI run.
# Measured (tests/test_pinned_draws.py -k "ConstantSGD or SGLD", 26 tests, one process, cold
# cache): 115 s with the defaults, 87 s with these. The docs' doctests (a separate pytest run
# that does not read this file), the examples and the benchmarks run with XLA's defaults. Set
# XLA_FLAGS with an optimisation level of your own to override.
_QUICK = ["--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true"]
_LEGACY = "--xla_cpu_use_fusion_emitters=false"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *_QUICK]).strip()
    # XLA:CPU's older loop emitters, where the installed jaxlib has them (0.10 does, 0.12 does not),
    # compile a fusion faster than its default emitters (the package already asks for them for its
    # warmup program, base.QUICK_COMPILE); here they serve NumPyro's sampling loop and every other
    # program. Measured (one process, interleaved, 3 repeats, a 2-chain run of
    # tests/test_mcmc_conformance.py's model): ConstantSGD full 3.71 → 3.10 s, IASG 3.59 → 2.96 s,
    # SGLD 2.14 → 1.57 s. XLA stops at start-up on a flag it does not know, so a child process is
    # asked first (no XLA may start in this one before XLA_FLAGS is final; pytest-xdist's workers
    # inherit the flags and ask nothing).
    _probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, timeout=300,
                            env={**os.environ, "XLA_FLAGS": f"{os.environ['XLA_FLAGS']} {_LEGACY}",
                                 "JAX_PLATFORMS": "cpu"})
    if _probe.returncode == 0:
        os.environ["XLA_FLAGS"] += " " + _LEGACY

# the suite's shared modules (kernel_registry.py, pinned_draws.py) import by name: with
# --import-mode=importlib no test folder is on sys.path but this one
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402  (after XLA_FLAGS: read when JAX starts its CPU client)
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
import pytest  # noqa: E402

numpyro.enable_x64()
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".jax_cache")),
)
# every program goes to the persistent cache, however quickly it compiled: the suite builds many
# kernels whose programs are identical (the same model, options and shapes in several tests), and a
# new kernel object re-traces but then reads the compiled program from disk instead of compiling it
# (measured: 12 % less time on a third of tests/test_mcmc_conformance.py with a cold cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


#: set in the child process that runs a test marked ``runs_compiled_code``
_CHILD = "NUMPYRO_SGD_TEST_CHILD"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked ``runs_compiled_code`` spends its time running its programs, not compiling
    them, and the quick compile options above make that code slower (the cluster-law test on
    sorted rows: 34 s with them, 10 s with XLA's defaults, one process each). It runs in a child
    pytest process with XLA's default optimisation instead; its outcome and output are this one's."""
    if pyfuncitem.get_closest_marker("runs_compiled_code") is None or os.environ.get(_CHILD):
        return None
    quick = tuple(f.split("=")[0] for f in (*_QUICK, _LEGACY))
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(quick)]
    flags.append("--xla_backend_optimization_level=3")
    env = {**os.environ, _CHILD: "1", "XLA_FLAGS": " ".join(flags)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", pyfuncitem.nodeid],
                          cwd=pyfuncitem.config.rootpath, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"in a child process with XLA's default optimisation:\n{done.stdout[-6000:]}{done.stderr[-2000:]}",
                    pytrace=False)
    return True


def _memory_mappings():
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: no such limit to watch
        return 0


@pytest.fixture(autouse=True)
def _release_compiled_code():
    """Drop JAX's compiled executables once the process holds many memory mappings.

    Each XLA:CPU executable keeps its own memory mappings; a single pytest process that compiles
    the whole suite's samplers grows past the kernel's ``vm.max_map_count`` (65,530) and then
    crashes inside an XLA compilation (SIGSEGV/SIGABRT, seen twice in CI after about 750 s;
    measured: 37,000 mappings half-way through the conformance module alone). After any test
    that leaves more than 20,000, the caches are cleared (later tests recompile what they need;
    the persistent cache makes most of that a disk read).
    """
    yield
    if _memory_mappings() > 20_000:
        jax.clear_caches()
        gc.collect()


class ConjugateLinearRegression:
    """y = X w + ε, ε ~ N(0, σ²) with σ known, prior w ~ N(0, τ² I): the posterior is exact.

    Features are correlated (AR(1) correlation ``rho`` between neighbouring columns) and have
    unequal scales ``scales``, so scalar, diagonal and full preconditioners differ.
    """

    def __init__(self, n=20_000, d=6, s=200, rho=0.8, scales=None, noise=1.0, prior_scale=1.0, seed=0):
        rng = np.random.default_rng(seed)
        scales = np.linspace(1.0, 3.0, d) if scales is None else np.asarray(scales, float)
        corr = rho ** np.abs(np.subtract.outer(np.arange(d), np.arange(d)))
        chol = np.linalg.cholesky(corr)
        self.X = (rng.standard_normal((n, d)) @ chol.T) * scales
        self.w_true = rng.standard_normal(d)
        self.y = self.X @ self.w_true + noise * rng.standard_normal(n)
        self.n, self.d, self.s, self.noise, self.prior_scale = n, d, s, noise, prior_scale
        precision = np.eye(d) / prior_scale**2 + self.X.T @ self.X / noise**2
        self.post_cov = np.linalg.inv(precision)
        self.post_mean = self.post_cov @ (self.X.T @ self.y) / noise**2
        self.hessian = precision  # A_U, constant

    def model(self, X, y=None):
        w = numpyro.sample("w", dist.Normal(0, self.prior_scale).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=self.s) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ w, self.noise), obs=y[idx])

    @property
    def args(self):
        return (self.X, self.y)

    def noise_cov(self, w=None):
        """Exact Q = N² Cov_n[∇ log p(y_n|w)] / S at ``w`` (default: the posterior mean)."""
        w = self.post_mean if w is None else w
        r = (self.y - self.X @ w) / self.noise**2
        g = self.n * r[:, None] * self.X  # single-example potential gradient, minus the prior part
        return np.cov(g, rowvar=False, bias=True) / self.s


@pytest.fixture(scope="session")
def linreg():
    return ConjugateLinearRegression()


@pytest.fixture(scope="session")
def small_linreg():
    return ConjugateLinearRegression(n=2_000, d=3, s=50, rho=0.5, seed=1)


@pytest.fixture(scope="session")
def wide_linreg():
    """D = 40: a problem where warmup refreshes its moments on every 3rd step only."""
    return ConjugateLinearRegression(n=20_000, d=40, s=200, rho=0.5, seed=2)


@pytest.fixture(scope="session")
def make_linreg():
    """:class:`ConjugateLinearRegression` itself, for tests that need their own sizes or scales."""
    return ConjugateLinearRegression
