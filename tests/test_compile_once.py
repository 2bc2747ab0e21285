"""Compilation: a repeated ``MCMC.run`` compiles nothing new, and large data are never compiled in
as constants without a warning.

Compilations are counted with JAX's own monitoring events (``/jax/core/compile/...``), not timed.
NumPyro turns the progress bar off when ``CI`` is set; the tests switch it back on
(``mcmc.progress_bar = True``) because the progress-bar path is the one in which NumPyro 0.22
reuses its compiled step across runs (its ``progress_bar=False`` loop is recompiled by every
``MCMC.run``, pyro-ppl/numpyro#2171, fixed after 0.22.0).
"""

import warnings

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax import monitoring
from numpyro.infer import MCMC

from numpyro_sgd import SGFS, SGLD, ConstantSGD
from numpyro_sgd.driver.init_checks import CONSTANT_DATA_WARN_BYTES

N, S = 2_000, 50
_rng = np.random.default_rng(0)
X = jnp.asarray(_rng.normal(size=(N, 3)), jnp.float32)
Y = X @ jnp.array([1.0, -0.5, 0.2]) + 0.5 * jnp.asarray(_rng.normal(size=N), jnp.float32)


def model(x, y, subsample_size):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([3]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("obs", dist.Normal(x[idx] @ w, 0.5), obs=y[idx])


class CompileCounter:
    """Counts XLA backend compilations while active."""

    def __init__(self):
        self.count, self.active = 0, False
        monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **_):
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1

    def __enter__(self):
        self.count, self.active = 0, True
        return self

    def __exit__(self, *exc):
        self.active = False


@pytest.fixture(scope="module")
def counter():
    return CompileCounter()


@pytest.mark.parametrize("kernel", [ConstantSGD, SGFS])
@pytest.mark.parametrize("jit_model_args", [False, True])
def test_repeated_runs_compile_nothing(counter, kernel, jit_model_args):
    """After the first run (which compiles), a second run with a new key (the kernel's init
    again) and a continuation from ``post_warmup_state`` compile no new program; the
    continuation returns new draws."""
    mcmc = MCMC(kernel(model, steps_per_sample=5), num_warmup=20, num_samples=10, num_chains=2,
                chain_method="vectorized", jit_model_args=jit_model_args)
    mcmc.progress_bar = True
    with counter:
        mcmc.run(jax.random.key(0), X, Y, S)
    assert counter.count > 0  # the counter sees compilations
    with counter:
        mcmc.run(jax.random.key(1), X, Y, S)
    assert counter.count == 0
    first = mcmc.get_samples()["w"]
    mcmc.post_warmup_state = mcmc.last_state
    with counter:
        mcmc.run(mcmc.post_warmup_state.rng_key, X, Y, S)
        second = mcmc.get_samples()["w"]
    assert counter.count == 0
    assert second.shape == first.shape and not np.allclose(second, first)


def test_large_closed_over_data_warns_with_the_fix():
    n = CONSTANT_DATA_WARN_BYTES // (3 * 4) + 1_000
    x = jnp.zeros((n, 3), jnp.float32)
    y = jnp.zeros(n, jnp.float32)
    mcmc = MCMC(SGLD(model, step_size=1e-6), num_warmup=0, num_samples=1, progress_bar=False)
    with pytest.warns(UserWarning, match=r"jit_model_args=True.*numpyro_sgd\.stream\(X\)"):
        mcmc.run(jax.random.key(0), x, y, S)
    mcmc = MCMC(SGLD(model, step_size=1e-6), num_warmup=0, num_samples=1, progress_bar=False, jit_model_args=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*compiled into the sampling loop.*")
        mcmc.run(jax.random.key(0), x, y, S)


def test_kept_init_program_follows_the_number_of_chains():
    """The kernel keeps its compiled init for the next run with the same arguments; a run with
    another number of chains (one chain, then two vectorized) must not reuse it."""
    kernel = ConstantSGD(model, steps_per_sample=5)
    MCMC(kernel, num_warmup=20, num_samples=5, progress_bar=False).run(jax.random.key(0), X, Y, S)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=5, num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0), X, Y, S)
    assert mcmc.get_samples(group_by_chain=True)["w"].shape == (2, 5, 3)


def _primitives(jaxpr, out=None):
    """Names of every primitive in a closed jaxpr, sub-jaxprs (loops, branches) included."""
    out = set() if out is None else out
    for eqn in jaxpr.eqns:
        out.add(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            _primitives(sub, out)
    return out


class CountedModel:
    def __init__(self):
        self.calls = 0

    def __call__(self, x, y, subsample_size):
        self.calls += 1
        model(x, y, subsample_size)


@pytest.mark.parametrize("make, warmup_only", [
    (lambda m: ConstantSGD(m, preconditioner="full"), {"cholesky", "eigh"}),
    (lambda m: SGFS(m), {"eigh"}),  # SGFS's own sampling step refactorises its online Fisher
    (lambda m: SGLD(m), {"cholesky", "eigh"}),  # default step: a noise warmup, then the step is frozen
], ids=["ConstantSGD-full", "SGFS", "SGLD"])
def test_sampling_program_holds_no_warmup_code(make, warmup_only):
    """Warmup runs inside ``init`` as a program of its own: the kernel's ``sample``, which NumPyro
    compiles for ``mcmc.run`` after ``mcmc.warmup``, holds none of warmup's linear algebra (the
    Cholesky factor of the warmup preconditioner, the Newton check's eigendecomposition), and
    ``mcmc.run`` traces the model no more (the potential's jaxprs traced in warmup are reused).
    Before warmup moved into ``init``, ``sample`` traced both phases: both primitives, and the
    model 5–7 times."""
    counted = CountedModel()
    mcmc = MCMC(make(counted), num_warmup=30, num_samples=5, num_chains=2, chain_method="vectorized",
                progress_bar=False, jit_model_args=True)
    mcmc.warmup(jax.random.key(0), X, Y, S)
    state = mcmc.post_warmup_state
    assert int(state.idle_iterations[0]) == 0 and int(state.i[0]) == int(state.num_warmup_steps[0])
    counted.calls = 0
    mcmc.run(jax.random.key(1), X, Y, S)
    assert counted.calls == 0
    kernel = mcmc.sampler
    jaxpr = jax.make_jaxpr(lambda s: kernel.sample(s, (X, Y, S), {}))(state)
    used = _primitives(jaxpr.jaxpr)
    assert not used & warmup_only, used & warmup_only
    # the warmup program does hold them (so the check can fail)
    init_state = kernel.init(jax.random.key(2), 30, None, (X, Y, S), {})
    warm = jax.make_jaxpr(lambda s: kernel._iteration(s, (X, Y, S), {}, True))(init_state)
    assert warmup_only <= _primitives(warm.jaxpr)


@pytest.mark.parametrize("make", [lambda m: ConstantSGD(m, preconditioner="full"), lambda m: SGFS(m),
                                  lambda m: SGLD(m)],
                         ids=["ConstantSGD-full", "SGFS", "SGLD"])
def test_a_run_traces_the_model_a_few_times(make):
    """A whole ``mcmc.run`` (init, warmup, sampling, NumPyro's ``postprocess_fn``) traces the model
    once per distinct use: discovery of its sites and plates, the initial point, the minibatch
    potential at S rows, at one row (the per-example gradients and the cost check), at the Newton
    check's fixed batch, the prior alone, and the constraining of the draws: 7 at most (12 before
    the potential kept its jaxprs). Every later evaluation, under grad, vmap and jit, replays a
    jaxpr; the draws are the same (the pinned-draw tests)."""
    counted = CountedModel()
    MCMC(make(counted), num_warmup=30, num_samples=5, num_chains=2, chain_method="vectorized",
         progress_bar=False, jit_model_args=True).run(jax.random.key(0), X, Y, S)
    assert 1 <= counted.calls <= 7, counted.calls


def test_a_traced_step_reuses_the_models_jaxpr_as_one_call(monkeypatch):
    """Inside a kernel's programs (one device) the model's jaxpr is a nested jitted call: JAX
    works it through once per argument signature and keeps its differentiated and batched forms,
    instead of going through the model's equations again at every use (the gradient, the
    per-example gradients, the noise moments and the Newton check's Hessian of a warmup step).
    After ``init`` (whose warmup program met every signature), tracing one more warmup iteration
    and one sampling step evaluates the jaxpr in Python no more: inlined, as it still is with
    several devices, the same traces evaluate it 4 and 1 times (measured with two forced host
    devices)."""
    import numpyro_sgd.model.replay as replay_module

    kernel = ConstantSGD(model, preconditioner="full")
    state = kernel.init(jax.random.key(2), 30, None, (X, Y, S), {})
    calls = []
    evaluate = replay_module.jaxpr_as_fun
    monkeypatch.setattr(replay_module, "jaxpr_as_fun", lambda closed: calls.append(1) or evaluate(closed))
    jax.make_jaxpr(lambda s: kernel._iteration(s, (X, Y, S), {}, True))(state)
    jax.make_jaxpr(lambda s: kernel.sample(s, (X, Y, S), {}))(state)
    assert len(calls) == 0, len(calls)


def test_warmup_iterations_pass_the_warmed_up_state_through():
    """A plain ``mcmc.run``: NumPyro's warmup iterations return the state that ``init``'s warmup
    produced (no SG step is taken in them), and the sampling iterations then take
    ``steps_per_sample`` steps each."""
    mcmc = MCMC(ConstantSGD(model, steps_per_sample=5), num_warmup=20, num_samples=4, progress_bar=False)
    mcmc.warmup(jax.random.key(0), X, Y, S, collect_warmup=True, extra_fields=("i", "idle_iterations"))
    fields = mcmc.get_extra_fields()
    steps = mcmc.sampler.warmup_steps_per_iteration * 20
    np.testing.assert_array_equal(fields["i"], np.full(20, steps))
    np.testing.assert_array_equal(fields["idle_iterations"], np.arange(19, -1, -1))
    mcmc.run(jax.random.key(1), X, Y, S, extra_fields=("i",))
    np.testing.assert_array_equal(mcmc.get_extra_fields()["i"], steps + 5 * np.arange(1, 5))


def test_op_by_op_replay_is_one_program_and_shared_by_a_new_trace(counter):
    """NumPyro applies the vmapped ``postprocess_fn`` to the initial state op by op (for the shapes
    of its sample buffers). The replayed jaxpr of the constraining map then runs as one compiled
    program, not one XLA compilation per operation, and a potential traced afresh (as each
    ``init`` does) reuses it: its values equal the model's own."""
    from numpyro_sgd import SubsampledPotential

    args = (X, Y, S)
    first = SubsampledPotential.from_model(model, args)
    theta = jnp.stack([jnp.array([0.3, -0.2, 0.1]), jnp.array([1.0, 2.0, -3.0])])
    first.constrain(theta[0], args)  # traces the model once for this signature (not counted)
    with counter:
        got = jax.vmap(lambda t: first.constrain(t, args))(theta)
    # one program (none if JAX's persistent cache holds it); op by op it was one per operation (11)
    assert counter.count <= 1
    again = SubsampledPotential.from_model(model, args)
    again.constrain(theta[0], args)
    with counter:
        got_again = jax.vmap(lambda t: again.constrain(t, args))(theta)
    assert counter.count == 0
    np.testing.assert_array_equal(np.asarray(got["w"]), np.asarray(theta))
    np.testing.assert_array_equal(np.asarray(got_again["w"]), np.asarray(theta))


def test_a_long_compile_hands_the_compilers_freed_memory_back(monkeypatch):
    """After an XLA compilation of at least ``TRIM_AFTER_COMPILE_S`` (the sampling program's), and
    only then, glibc's ``malloc_trim(0)`` runs, from the listener a kernel's ``init`` registers."""
    from numpyro_sgd.driver import programs

    if programs._malloc_trim() is None:
        pytest.skip("no glibc malloc_trim on this platform")
    MCMC(SGLD(model, step_size=1e-4), num_warmup=2, num_samples=2, progress_bar=False).run(
        jax.random.key(0), X, Y, S)
    assert programs._TRIM["registered"] and programs._TRIM["fn"] is not None
    calls = []
    monkeypatch.setitem(programs._TRIM, "fn", calls.append)
    event = "/jax/core/compile/backend_compile_duration"
    monitoring.record_event_duration_secs(event, 0.5 * programs.TRIM_AFTER_COMPILE_S)
    monitoring.record_event_duration_secs("/jax/core/compile/jaxpr_trace_duration", 10.0)
    assert calls == []
    monitoring.record_event_duration_secs(event, programs.TRIM_AFTER_COMPILE_S)
    assert calls == [0]


def test_the_warmup_over_small_data_compiles_without_llvm_optimisation(monkeypatch):
    """The warmup program takes the initial point's options (no LLVM optimisation) up to
    ``SMALL_DATA_ELEMENTS`` data elements, whose passes are then short, and the optimising ones
    above (a pass over 10⁷ × 50 rows runs about 2.5 times as long unoptimised), and whenever JAX's
    persistent compilation cache is on (this suite's conftest sets one): a later process then
    loads the program and only runs it."""
    from numpyro_sgd.numerics import compilation

    small = [np.zeros((1000, 50), np.float32), np.zeros(1000, np.float32)]
    big = [jax.ShapeDtypeStruct((compilation.SMALL_DATA_ELEMENTS // 50 + 1, 50), jnp.float32)]
    assert compilation.persistent_cache_on()
    assert compilation.warmup_options_kind(small) == "warmup"
    monkeypatch.setattr(compilation, "persistent_cache_on", lambda: False)
    assert compilation.warmup_options_kind(small) == "init"
    assert compilation.warmup_options_kind(big) == "warmup"
    assert compilation.QUICK_COMPILE["init"]["xla_backend_optimization_level"] == 0
    assert "xla_backend_optimization_level" not in compilation.QUICK_COMPILE["warmup"]
