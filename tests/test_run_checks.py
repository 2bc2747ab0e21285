"""End-of-run checks (:func:`numpyro_sgd.check_run`), problem-size checks at ``init`` and the
progress bar's final line (issue 15 items 1, 5, 8, 10).

Each failing case is a run that returns a wrong answer silently on the code before these checks
(measured: the means below are hundreds to thousands of posterior sds off with zero rejected
steps); each passing case is a run whose answer is right, so that a check that fires on
everything fails here too.
"""

import re
import warnings

import jax
import numpy as np
import pytest
from numpyro.infer import MCMC

from numpyro_sgd import SGLD, ConstantSGD, check_run
from numpyro_sgd.diagnostics.arviz_export import to_arviz
from numpyro_sgd.diagnostics.compare import compare


def _run(kernel, problem, num_warmup=100, num_samples=300, init_params=None, **kw):
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mcmc.run(jax.random.key(0), *problem.args, init_params=init_params)
    return mcmc


def _mean_z(mcmc, problem):
    w = np.asarray(mcmc.get_samples()["w"])
    return np.abs(w.mean(0) - problem.post_mean) / np.sqrt(np.diag(problem.post_cov))


def test_check_run_passes_a_good_run(small_linreg):
    """ConstantSGD-full on the conjugate regression: means within 0.3 sd (checked), so no check may
    fire (R-hat ≈ 1, ESS in the hundreds, the mean within MCSE ≈ 0.06 sd of the mode)."""
    mcmc = _run(ConstantSGD(small_linreg.model, preconditioner="full"), small_linreg)
    assert np.max(_mean_z(mcmc, small_linreg)) < 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_run(mcmc) == []


def test_check_run_flags_a_chain_that_never_reached_the_mode(make_linreg):
    """Predictors in units 10⁶ times too small (posterior sds ~10⁻⁸) and SGLD at a user step that
    is stable but far too small for that scale: burn-in drifts towards the mode and sampling
    goes on drifting, with no rejected step. Every check on the draws must fire, and the
    mode-offset check must put the mean far out. (The noise warmup of ConstantSGD, SGFS and IASG
    now reaches the mode here: ``tests/test_warmup.py``.)"""
    problem = make_linreg(n=2_000, d=2, s=20, rho=0.0, scales=(1e6, 1e6), seed=3)
    mcmc = _run(SGLD(problem.model, step_size=1e-18, steps_per_sample=10), problem,
                init_params={"w": np.full(2, 1e-5, np.float32)})
    assert np.max(_mean_z(mcmc, problem)) > 100  # the silent wrong answer this test is about
    assert int(mcmc.last_state.num_divergences) == 0
    with pytest.warns(UserWarning) as record:
        messages = check_run(mcmc)
    assert [str(w.message) for w in record] == messages
    text = "\n".join(messages)
    assert "split R-hat" in text and "bulk ESS" in text and "rescaled" in text
    offset = float(re.search(r"chain 0's mean is ([0-9.e+]+) posterior sds", text).group(1))
    assert offset > 100


def test_check_run_flags_a_frozen_direction(make_linreg):
    """A scalar preconditioner on features whose scales differ 100×: the rate fits the stiff
    direction, so the other relaxes 10⁴× slower than the run (measured sd ratio 0.05). ``to_arviz``
    and ``compare`` warn the same."""
    problem = make_linreg(n=2_000, d=2, s=20, rho=0.0, scales=(1.0, 100.0), seed=4)
    mcmc = _run(ConstantSGD(problem.model, preconditioner="scalar"), problem)
    sd_ratio = np.asarray(mcmc.get_samples()["w"]).std(0) / np.sqrt(np.diag(problem.post_cov))
    assert sd_ratio.min() < 0.3
    messages = check_run(mcmc, warn=False)
    assert any(re.search(r"bulk ESS .* for w\[0\]", m) for m in messages), messages
    assert any(re.search(r"sd is 0\.[0-9]+× the posterior's .* led by w\[0\].* too narrow", m) for m in messages)
    # the exports run the same checks: the user who only calls to_arviz or compare is told too
    with pytest.warns(UserWarning, match=r"bulk ESS .* for w\[0\]"):
        to_arviz(mcmc, log_likelihood=False)
    with pytest.warns(UserWarning, match=r"bulk ESS .* for w\[0\]"):
        compare({"scalar": mcmc}, (problem.post_mean, problem.post_cov))


def test_check_run_flags_draws_wider_than_the_posterior(small_linreg):
    """SGLD at a user step 100× its default (5.3·10⁻⁷ here): stable, no rejected step, but the
    minibatch noise inflates the sds up to 3.1× (measured 1.29, 2.10, 3.10) while the means stay
    right, so R-hat, ESS and the mode offset see nothing wrong; the spread check compares the
    draws' covariance with the Hessian at their mean and names it."""
    mcmc = _run(SGLD(small_linreg.model, step_size=5e-5, steps_per_sample=5), small_linreg, num_samples=400)
    sd_ratio = np.asarray(mcmc.get_samples()["w"]).std(0) / np.sqrt(np.diag(small_linreg.post_cov))
    assert sd_ratio.max() > 2.0 and int(mcmc.last_state.num_divergences) == 0
    messages = check_run(mcmc, warn=False)
    assert any(re.search(r"sd is [0-9.]+× the posterior's .* too wide", m) for m in messages), messages


def test_check_run_reports_rejected_steps(small_linreg):
    """SGLD at a step 10³× past stability: steps are rejected; the message gives the count and names
    funnels as a cause."""
    mcmc = _run(SGLD(small_linreg.model, step_size=1.0, steps_per_sample=1), small_linreg,
                num_warmup=10, num_samples=50)
    rejected = int(mcmc.last_state.num_divergences)
    assert rejected > 0
    messages = check_run(mcmc, gradient=False, warn=False)
    assert any(f"{rejected} of " in m and "funnel" in m for m in messages), messages


@pytest.mark.parametrize("n, s, match", [(4, 2, None), (100, 99, None), (300, 100, r"N/S = 3\).*run NUTS"),
                                         (8, 2, r"N = 8 rows: too few.*NUTS")])
def test_minibatch_near_full_data_is_refused_or_warned(make_linreg, n, s, match):
    """S ≥ N/2 raises before compute (measured: means 10¹⁸ sds off at N = 4, S = 2 and
    N = 100, S = 99 without replacement); N/S < 4 warns; fewer than 100 rows warns (N = 8,
    S = 2: ConstantSGD's sd 2× too large, IASG 10¹⁹ sds off)."""
    problem = make_linreg(n=n, d=1, s=s, seed=5)
    kernel = ConstantSGD(problem.model, subsample="without_replacement")
    if match is None:
        with pytest.raises(ValueError, match=r"not a stochastic-gradient problem.*run NUTS"):
            kernel.init(jax.random.key(0), 10, None, problem.args, {})
    else:
        with pytest.warns(UserWarning, match=match):
            kernel.init(jax.random.key(0), 10, None, problem.args, {})


def test_progress_bar_final_line_shows_final_state(small_linreg, capfd, monkeypatch):
    """The bar's last line is drawn when it closes, from the final state (it used to show counts
    up to 0.3 s old: 173 passes for 200). NumPyro turns the bar off when ``CI`` is set, as it is
    in CI: unset here."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    mcmc = MCMC(ConstantSGD(small_linreg.model, preconditioner="diag", steps_per_sample=3), num_warmup=20,
                num_samples=200,
                progress_bar=True)
    mcmc.run(jax.random.key(1), *small_linreg.args)
    last = capfd.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    passes = float(mcmc.last_state.data_passes)
    assert f"{passes:.3g} passes" in last, (last, passes)


def test_check_run_reports_a_check_it_cannot_evaluate_and_runs_the_others(small_linreg, monkeypatch):
    """A gradient check that raises on some model (issue 30: NumPyro's argument check at a mean
    outside a dependent support) is reported by name, not raised, and the other checks run."""
    import numpyro_sgd.diagnostics.run_checks as run_checks

    mcmc = _run(SGLD(small_linreg.model, step_size=1.0, steps_per_sample=1), small_linreg,
                num_warmup=10, num_samples=50)

    def fails(*args, **kwargs):
        raise ValueError("Normal distribution got invalid loc parameter.")

    monkeypatch.setattr(run_checks, "_full_gradient", fails)
    messages = check_run(mcmc, warn=False)
    assert any("mode-offset check (4) was skipped" in m and "invalid loc parameter" in m for m in messages), messages
    assert any("SG steps were rejected" in m for m in messages), messages  # check 1 still ran


def test_check_run_on_a_dependent_support_model_returns_messages():
    """b ~ Uniform(0, a): the support of b moves with a. The chain's draws of b's unconstrained
    value run off to the edge and most steps are rejected; check_run must say so without raising."""
    import numpyro
    import numpyro.distributions as dist

    y = np.random.default_rng(0).normal(2.0, 1.0, 2_000)

    def model(y):
        a = numpyro.sample("a", dist.Exponential(0.2))
        b = numpyro.sample("b", dist.Uniform(0, a))
        with numpyro.plate("data", y.shape[0], subsample_size=100) as idx:
            numpyro.sample("obs", dist.Normal(b, 1.0, validate_args=True), obs=y[idx])

    mcmc = MCMC(ConstantSGD(model, preconditioner="full"), num_warmup=200, num_samples=200, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mcmc.run(jax.random.key(0), y)
        messages = check_run(mcmc, warn=False)
    assert messages and all(isinstance(m, str) and m.startswith("ConstantSGD: ") for m in messages)
    assert not any(re.search(r"\b(nan|-?inf)\b", m) for m in messages), messages  # no bare non-finite numbers
