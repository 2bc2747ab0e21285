"""Iterate-averaging stochastic gradient sampler (Mandt, Hoffman & Blei 2017, Sec. 5.2, Alg. 1).

Algorithm (Mandt et al. 2017, Sec. 5.2, Alg. 1):

    warmup   reach the mode region and estimate the curvature A (Fisher = Hessian, A5) from
             the gradient noise, as :class:`~numpyro_sgd.ConstantSGD` does; fix ε (and H)
    sample   repeat T = N/S times:  θ_t = θ_{t−1} − ε H ĝ_S(θ_{t−1})        (Alg. 1, SGD step)
             return μ = (1/T) Σ_{t'<T} θ_{t−t'}                               (Alg. 1, average)

One returned sample is one window: T SG steps in one compiled loop (the algorithm's ``window``),
N per-datum gradients. ``start_block`` restarts the window's sums from the last iterate,
``end_block`` returns their mean.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
from numpyro.util import find_stack_level

from ..adaptation.noise_warmup import WarmupState, noise_warmup, pop_warmup_options, warmup_step_of
from ..driver.kernel import SGKernel
from ..minibatch.law import law_of
from ..numerics.linalg import cho_solve, eigvalsh
from ..numerics.noise import fisher_curvature
from ..numerics.preconditioners import apply_preconditioner, regularized_cholesky, resolve_preconditioner
from ..numerics.theory import averaged_variance_shortfall, iasg_validity, iterate_average_covariance
from ..protocol import SampleBlock, SGAlgorithm, StepInfo, pick_chain
from ..validation import check_choice, check_int, check_number, check_positive

__all__ = ["IASG", "IASGState", "ValidityWarning", "iasg", "default_step_product"]

IASG_PRECONDITIONERS = ("auto", "scalar", "diag", "full")


def default_step_product(error, window):
    """The u = ε λ_min in (0, 1] at which the exact shortfall of the averaged variance
    (:func:`~numpyro_sgd.numerics.theory.averaged_variance_shortfall`, the discrete form of Eq. 46)
    equals ``error`` for a window of T steps; u ≈ 1/(error·T) for long windows (Eq. 46), and
    u → 1 (a Newton-like step, no shortfall at all) when T is short."""
    if not 0 < error < 1:
        raise ValueError(f"window_error must lie in (0, 1), got {error}.")
    lo, hi = 0.0, 1.0  # the shortfall decreases from 1 to 0 on (0, 1]
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if averaged_variance_shortfall(mid, window) > error else (lo, mid)
    return hi


class IASGState(NamedTuple):
    """State of the :func:`iasg` algorithm (one chain)."""

    #: P = (ε/N) H of θ ← θ − P ∇Û_S: () without preconditioner, (D,) diag, (D, D) full
    preconditioner: jnp.ndarray
    #: ε in Mandt's units (θ ← θ − ε H ĝ_S, ĝ_S = ∇Û_S / N)
    step_size: jnp.ndarray
    #: user override of ε (NaN: the default of :class:`IASG`)
    user_step_size: jnp.ndarray
    #: curvature estimate A_U ≈ Σ_p (S_p/N_p) Q_p + ∇²U_prior (A5), (D, D) or its diagonal (D,)
    curvature: jnp.ndarray
    #: smallest eigenvalue of H A (A = A_U / N) at the end of warmup
    eig_min: jnp.ndarray
    #: largest eigenvalue of H A at the end of warmup
    eig_max: jnp.ndarray
    #: estimated gradient-noise covariance Q of ∇Û_S, frozen after warmup
    noise_cov: jnp.ndarray
    #: the last SGD iterate (the chain continues from it; the sample field holds the average)
    iterate: jnp.ndarray
    #: Σ of the iterates of the current window
    iterate_sum: jnp.ndarray
    #: how many iterates ``iterate_sum`` holds
    num_averaged: jnp.ndarray
    #: warmup state (see :mod:`numpyro_sgd.adaptation.noise_warmup`)
    warmup: WarmupState


class ValidityWarning:
    """The host callback ``(eps, eig_min, eig_max, window)`` of the end of warmup: a Python warning
    when ε and T fall outside Eq. 46–47, once until :meth:`rearm` (the builder re-arms it, i.e.
    once per run; every chain and every re-freeze of a run calls it).

    A compiled program can outlive the algorithm that was traced into it (MCMC reuses it for the
    next run), so a kernel creates one instance and hands it to every build. It holds plain
    Python values only (it pickles).
    """

    def __init__(self, name, window_error, user_step_size):
        self.name, self.window_error, self.user_step_size = name, window_error, user_step_size
        self.warned = False

    def rearm(self):
        self.warned = False

    def __call__(self, eps, lo, hi, window):
        import numpy as np

        if self.warned:
            return
        eps, lo, hi = float(np.max(eps)), float(np.min(lo)), float(np.max(hi))
        if not (np.isfinite(eps) and np.isfinite(lo) and np.isfinite(hi) and lo > 0):
            return
        v = iasg_validity(eps, int(np.max(window)), lo, hi)
        limit = max(2 * self.window_error, 0.1)
        problems = []
        if v["stability"] >= 2:
            problems.append(f"ε λ_max = {v['stability']:.3g} ≥ 2: the SGD iterates diverge (Eq. 47); lower step_size "
                            f"below {2 / hi:.3g}")
        elif v["stiff_error"] < -limit:
            problems.append(f"ε λ_max = {v['stability']:.3g}: the samples' variance along the stiffest direction is "
                            f"about {-100 * v['stiff_error']:.0f} % too large; lower step_size towards {1 / hi:.3g}")
        if v["window_error"] > limit:
            problems.append(
                f"ε T λ_min = {v['window_product']:.3g}: the samples' variance along the least-constrained "
                f"direction is about {100 * v['window_error']:.0f} % too small (Eq. 46; condition number "
                f"λ_max/λ_min = {hi / lo:.3g} vs T = {v['window']}). "
                + ("Increase step_size (below 2/λ_max) or use the default" if self.user_step_size
                   else "Use preconditioner='full' (H ≈ A⁻¹) or more data per window")
            )
        if problems:
            self.warned = True
            warnings.warn(f"{self.name}: step size ε = {eps:.3g} and window T = {v['window']} are outside the "
                          "validity window of Mandt et al. Eq. 46–47: " + "; ".join(problems) + ".", stacklevel=2)


def _resolve_window(potential, window, window_error, step_size, name):
    """T (default ⌈N/S⌉) and the u* = ε λ_min of the default ε, warning where the averaging
    theory does not apply (a short window) or the samples are not posterior draws (T ≠ N/S)."""
    n, s = potential.num_data, potential.batch_size
    one_pass = potential.steps_per_pass
    t = window or one_pass
    step_product = default_step_product(window_error, t)
    if step_size is None and step_product > 0.25:
        warnings.warn(
            f"{name}: the window T = {t} is short (N = {n}, S = {s}): "
            f"a {100 * window_error:.0g} % variance shortfall needs ε λ ≈ {step_product:.2f}, "
            "far outside the small-step regime (A1–A4) the averaging theory assumes; on non-Gaussian "
            "posteriors expect biased means and sds (the iterates spread over T × the posterior). "
            "IASG needs N/S ≫ 20 × the condition number (Eq. 47): use a smaller subsample_size, "
            "or ConstantSGD(model, preconditioner='full') for small data sets.",
            stacklevel=find_stack_level(),
        )
    if window is not None and window != one_pass:
        warnings.warn(
            f"{name}: window={window} averages T·S = {window * s} per-datum "
            f"gradients per sample, not N = {n}: the samples' covariance is "
            f"N/(T S) = {n / (window * s):.3g} × the posterior's (Mandt et al. Eq. 44). Use window={one_pass} "
            "(the default) for posterior samples.",
            stacklevel=find_stack_level(),
        )
    return t, step_product


def iasg(potential, *, step_size=None, window=None, preconditioner="auto", window_error=0.05, check_validity=True,
         subsample="with_replacement", name="IASG", validity_warning=None, **warmup_options):
    """The IASG algorithm (:class:`IASG`) for a traced model.

    Its block (:class:`~numpyro_sgd.SampleBlock`) is the resolved window of T SG steps, and a
    returned sample summarises it (``summarises=True``): ``start_block`` restarts the window from
    the last iterate and ``end_block`` returns the window's mean, so the iterates themselves are
    not samples.

    :param potential: the :class:`~numpyro_sgd.model.potential.SubsampledPotential` (plates, N, S, D).
    :param float step_size: ε (None: the default rule of :class:`IASG`).
    :param int window: T (None: ⌈N/S⌉).
    :param preconditioner: ``"scalar"`` (H = I), ``"diag"``, ``"full"`` or ``"auto"`` (a given ε is
        Alg. 1's, for H = I: ``"scalar"``; otherwise :func:`~numpyro_sgd.numerics.preconditioners.resolve_preconditioner`).
    :param float window_error: target variance shortfall along λ_min for the default ε.
    :param bool check_validity: warn (host callback) at the end of warmup outside Eq. 46–47.
    :param validity_warning: the ``ValidityWarning`` to call (re-armed here); default a new one.
    :param kwargs: the warmup options of :func:`~numpyro_sgd.adaptation.noise_warmup.noise_warmup`.
    :return: :class:`~numpyro_sgd.SGAlgorithm`.
    """
    t, step_product = _resolve_window(potential, window, window_error, step_size, name)
    # a user ε is the ε of Alg. 1 (H = I); an estimated ε comes with the estimated H
    preconditioner = ("scalar" if step_size is not None and preconditioner == "auto"
                      else resolve_preconditioner(preconditioner, potential.dim))
    full = preconditioner != "diag"
    warmup = noise_warmup(potential, full, name, **warmup_options)
    n = potential.num_data
    # Alg. 1 as written (a given ε, H = I) needs no warmup estimate: usable with num_warmup=0
    given = step_size is not None and preconditioner == "scalar"
    warn_validity = None
    if check_validity:
        warn_validity = validity_warning or ValidityWarning(name, window_error, step_size is not None)
        warn_validity.rearm()  # once per build, i.e. per run

    def init(rng_key, theta, num_warmup_steps):
        d, dtype = theta.shape[0], theta.dtype
        nan = jnp.asarray(jnp.nan, dtype)
        shape = {"scalar": (), "diag": (d,), "full": (d, d)}[preconditioner]
        noise_shape = (d, d) if full else (d,)
        with warnings.catch_warnings():
            if given:  # nothing is estimated: a short warmup is no problem
                warnings.simplefilter("ignore")
            ws = warmup.init(theta, num_warmup_steps)
        return IASGState(
            preconditioner=jnp.full(shape, step_size / n if given else jnp.nan, dtype),
            step_size=jnp.asarray(step_size, dtype) if given else nan,
            user_step_size=jnp.asarray(jnp.nan if step_size is None else step_size, dtype),
            curvature=jnp.zeros(noise_shape, dtype), eig_min=nan, eig_max=nan,
            noise_cov=jnp.zeros(noise_shape, dtype), iterate=theta, iterate_sum=jnp.zeros_like(theta),
            num_averaged=jnp.zeros((), jnp.int32), warmup=ws,
        )

    warmup_step = warmup_step_of(warmup)

    def end_warmup(theta, state, oracle):
        summary = warmup.final(state.warmup, theta, oracle)
        # A5: the likelihood Hessian of plate p is its Fisher N_p C_p = (S_p/N_p) Q_p
        curvature = fisher_curvature(summary, potential.plates)
        a = curvature / n  # Mandt's A (Hessian of the average loss)
        if preconditioner == "scalar":
            eig = eigvalsh(a)
            h = jnp.ones((), a.dtype)
        elif preconditioner == "diag":
            eig = jnp.ones_like(a)  # diag(A)⁻¹ A with a diagonal A estimate
            h = 1.0 / a
        else:
            eig = jnp.ones(a.shape[0], a.dtype)
            h = cho_solve(regularized_cholesky(a), jnp.eye(a.shape[0], dtype=a.dtype))
        lo, hi = jnp.min(eig), jnp.max(eig)
        default = jnp.minimum(step_product / lo, 1.0 / hi)  # ε = min(u*/λ_min, 1/λ_max)
        eps = default if step_size is None else state.user_step_size
        if warn_validity is not None:  # a host callback: JAX then skips its persistent compilation cache
            jax.debug.callback(warn_validity, eps, lo, hi, t)
        return state._replace(preconditioner=(eps / n * h).astype(a.dtype), step_size=jnp.asarray(eps, a.dtype),
                              curvature=curvature, eig_min=lo, eig_max=hi, noise_cov=summary.noise)

    def sample_step(rng_key, step, theta, state, oracle):
        pe, grad, indices = oracle.grad(rng_key, theta)
        theta = theta - apply_preconditioner(state.preconditioner, grad)  # Alg. 1, SGD step
        state = state._replace(iterate_sum=state.iterate_sum + theta, num_averaged=state.num_averaged + 1)
        return theta, state, StepInfo(pe, oracle.batch_size, indices, True)

    def start_block(theta, state):
        """A window starts from the last SGD iterate (θ, the sample field, holds the last average)."""
        return state.iterate, state._replace(iterate_sum=jnp.zeros_like(state.iterate_sum),
                                             num_averaged=jnp.zeros_like(state.num_averaged))

    def end_block(rng_key, theta, state, oracle, sampling):
        """The sample is the mean of the window's iterates (Alg. 1); a warmup sample is the last iterate."""
        count = jnp.maximum(state.num_averaged, 1)
        mean = jnp.where(sampling & (state.num_averaged > 0), state.iterate_sum / count, theta)
        return rng_key, mean, state._replace(iterate=theta), jnp.zeros((), jnp.int32)

    return SGAlgorithm(init, sample_step, warmup_step=warmup_step, end_warmup=end_warmup,
                       block=SampleBlock(steps=t, summarises=True), start_block=start_block,
                       end_block=end_block, describe=lambda state: f"ε {float(state.step_size):.3g}")


class IASG(SGKernel):
    """Iterate-averaged constant SGD as a posterior sampler (IASG).

    **References:**

    1. *Stochastic Gradient Descent as Approximate Bayesian Inference*, S. Mandt, M. D. Hoffman,
       D. M. Blei, JMLR 18 (2017): Sec. 5.2, Alg. 1 (sampler), Eq. 43–45 and App. F / Eq. 66–72
       (covariance of the averages), Eq. 46–47 (validity window), Eq. 42 (preconditioning).

    =========================  ==========================================================
    paper                      here
    =========================  ==========================================================
    ε (θ ← θ − ε ĝ_S)          ``step_size`` (default below); ĝ_S = ∇Û_S / N
    T = N/S                    ``window`` (default ⌈N/S⌉, N and S summed over plates)
    H ≈ A⁻¹ (Sec. 5.2, end)    ``preconditioner``: ``"scalar"`` (H = I, Alg. 1), ``"diag"``, ``"full"``, ``"auto"``
    A = BBᵀ (A5)               A_U estimated in warmup from the gradient noise + prior Hessian
    =========================  ==========================================================

    Each returned sample is the mean of T consecutive SGD iterates (non-overlapping windows),
    computed inside one compiled loop; the chain itself continues from the last iterate. A
    sample therefore costs T·S ≈ N per-datum gradients (``data_passes`` grows by one per
    sample), and ``num_warmup`` / ``num_samples`` of :class:`~numpyro.infer.MCMC` count windows
    (data passes), not SG steps.

    **Why it samples.** Under A1–A5 one SGD iterate has covariance ε/(2S)·I (Eq. 43) and the
    mean of T of them has covariance D = A⁻¹/(ST) minus a finite-window term (Eq. 44); with
    T = N/S this is the posterior A_U⁻¹ up to the relative shortfall (1 − e^{−x})/x along
    each eigendirection, x = ε T λ (Eq. 45–46). Preconditioning with H leaves the long-window
    covariance unchanged (Eq. 42) and replaces λ by the eigenvalues of HA, which makes the
    window condition easy to meet on ill-conditioned posteriors (Eq. 47).

    **Default step size.** From the curvature estimated at the end of warmup (A_U ≈ Fisher +
    prior Hessian, i.e. A5), ε = min(u*/λ_min, 1/λ_max) with λ the eigenvalues of HA and u*
    chosen so that the exact discrete-time shortfall of the averaged variance along λ_min
    (:func:`~numpyro_sgd.numerics.theory.averaged_variance_shortfall`; Eq. 46 for small ε) is
    ``window_error`` (default 5 %: u* T ≈ 20 for long windows). The cap 1/λ_max is half the
    stability limit 2/λ_max of Eq. 47 and exact (no shortfall) along λ_max. If the cap binds,
    Eq. 47 cannot be met (condition number too large for N/S) and a warning says so with the
    numbers; ``preconditioner="full"`` (λ ≈ 1) is the remedy the paper proposes. A user
    ``step_size`` is checked the same way (ε λ_max ≥ 2 diverges; 1 < ε λ_max < 2 makes the
    stiff directions too wide). The warnings are raised at the end of warmup (Python warnings
    from the compiled run); :meth:`validity` returns the numbers.

    .. note:: **Mean bias on non-Gaussian posteriors.** The iterates spread over ε T λ / 2 ×
       the posterior variance along each eigendirection (Eq. 43): ≈ 10× along λ_min at the
       default, and κ = λ_max/λ_min times more along λ_max without a preconditioner. Their
       stationary mean solves E[∇U(θ)] = 0 over that wider law, so the skewness that separates
       the posterior mean from the mode is amplified by the spread. Measured on the quickstart
       logistic regression (N = 10⁵, D = 9, κ ≈ 11): largest absolute mean error 0.7–0.8 posterior sd
       without a preconditioner, 0.15–0.2 sd with ``preconditioner="full"`` (spread 10× in
       every direction) or with ``window_error=0.2`` (smaller ε, 20 % narrower samples).
       ``validity()["stiff_spread"]`` reports ε T λ_max / 2.

    .. note:: The averaged samples have the *sandwich* covariance A⁻¹ C A⁻¹ / N (Eq. 40/42
       with Σ from the true noise C), which equals the posterior covariance A⁻¹/N when the
       Fisher equals the Hessian (A5). A prior that is strong relative to the data, or a
       misspecified likelihood, makes the samples narrower or wider than the posterior
       along the affected directions (no SG tuning can change this: Polyak–Juditsky).
       :meth:`predicted_covariance` computes the exact prediction from the full-data Hessian.

    **Units of** ``step_size``. Mandt et al.'s ε of Alg. 1, a learning rate on the average loss L = U/N: θ ← θ
    − ε H ∇L̂ = θ − (ε/N) H ∇Û_S, H = I with ``preconditioner="scalar"``. Default: the window-error rule
    below.

    :param model: NumPyro model with a subsample plate.
    :param float step_size: ε in Mandt's units (optional; default above).
    :param int window: T, SG steps averaged per sample (default ⌈N/S⌉: one data pass). Another
        window scales the samples' covariance by N/(T S) (Eq. 44); a warning says so.
    :param str preconditioner: ``"auto"`` (default: ``"scalar"`` when ``step_size`` is given, the ε of
        Alg. 1; else ``"full"`` up to D = 1000 and ``"diag"`` above), ``"scalar"`` (H = I: the paper's
        Alg. 1), ``"diag"`` (H = diag(A)⁻¹ from the
        diagonal noise estimate, O(S·D) warmup) or ``"full"`` (H = A⁻¹, Cholesky; D × D noise
        estimate in warmup). Without a preconditioner the full noise is estimated too (for λ_min
        and λ_max); with ``"diag"`` only the diagonal is, so the validity check sees scales
        but not correlations.
    :param float window_error: target variance shortfall along λ_min for the default ε (0.05).
    :param bool check_validity: warn at the end of warmup when ε, T fall outside Eq. 46–47
        (default True). The check is a host callback inside the compiled loop, which keeps JAX
        from caching the compiled program on disk (≈ 20 s of compilation per run); pass False
        and call :meth:`validity` after the run to avoid it. With ``num_warmup=0`` (a given ε)
        nothing is estimated, so nothing is checked and :meth:`validity` returns NaN.
    :param kwargs: warmup options of :func:`~numpyro_sgd.adaptation.noise_warmup.noise_warmup` and
        :class:`~numpyro_sgd.driver.kernel.SGKernel` (``subsample``, ``warmup_subsample``,
        ``init_strategy``); ``steps_per_sample`` is the window and cannot be given.

    .. doctest::

        >>> import jax, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from numpyro_sgd import IASG
        >>> y = jax.random.bernoulli(jax.random.key(1), 0.3, (2000,))
        >>> def logistic(y, batch=20):  # T = N/S = 100 SG steps are averaged per sample
        ...     logit = numpyro.sample("logit", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=batch) as idx:
        ...         numpyro.sample("y", dist.Bernoulli(logits=logit), obs=y[idx])
        >>> mcmc = MCMC(IASG(logistic), num_warmup=10, num_samples=1000, progress_bar=False)
        >>> mcmc.run(jax.random.key(0), y, extra_fields=("data_passes",))
        >>> sd = float(mcmc.get_samples()["logit"].std())  # posterior sd ≈ 1/√(N p (1 − p)) ≈ 0.049
        >>> bool(0.04 < sd < 0.058), float(mcmc.get_extra_fields()["data_passes"][-1])
        (True, 1010.0)
    """

    #: with ``subsample_size="auto"``, S ≤ N/100: a window of at least 100 steps per data pass
    min_steps_per_pass = 100

    def __init__(self, model, *, step_size=None, window=None, preconditioner="auto", window_error=0.05,
                 check_validity=True,
                 **kwargs):
        if "steps_per_sample" in kwargs:
            raise TypeError("IASG: steps_per_sample is the averaging window; pass window=T instead.")
        check_choice("IASG", "preconditioner", preconditioner, IASG_PRECONDITIONERS)
        step_size = check_positive("IASG", "step_size", step_size, "a positive float or None (default rule)",
                                   allow_none=True)
        window = check_int("IASG", "window", window, allow_none=True,
                           what="an integer >= 1 (SG steps averaged per sample; default N/S)")
        window_error = check_number("IASG", "window_error", window_error)
        self._warmup_options = pop_warmup_options("IASG", kwargs, True)
        super().__init__(model, **kwargs)
        default_step_product(window_error, 1)  # validates window_error before any compute
        self._options = dict(step_size=step_size, window=window, preconditioner=preconditioner,
                             window_error=window_error, check_validity=bool(check_validity),
                             validity_warning=ValidityWarning("IASG", window_error, step_size is not None))

    def _build(self, potential, adapt_steps_per_sample=True):
        return iasg(potential, **self._options, subsample=self._driver.subsample, **self._warmup_options)

    # ------------------------------------------------------------------ theory
    def validity(self, state, chain=0):
        """The numbers of Mandt et al. Eq. 46–47 for the frozen ε, T and estimated curvature.

        :return: dict with ``step_size`` ε, ``window`` T, ``eig_min`` / ``eig_max`` (of HA,
            estimated), ``stability`` ε λ_max (< 2 required), ``window_product`` x = ε T λ_min,
            ``window_error_eq46`` (1 − e^{−x})/x, and the exact discrete-time shortfalls of the
            averaged variance along λ_min (``window_error``) and λ_max (``stiff_error``,
            negative: too wide), under A5 (:func:`~numpyro_sgd.numerics.theory.iasg_validity`).
        """
        ks = pick_chain(state, chain).kernel_state
        return iasg_validity(float(ks.step_size), self.steps_per_sample, float(ks.eig_min), float(ks.eig_max))

    def predicted_covariance(self, state, *model_args, at=None, chain=0, discrete=True, **model_kwargs):
        """Covariance of the samples predicted from the frozen P and Q and the exact Hessian.

        The exact law of the average of T iterates of the linear recursion
        (:func:`~numpyro_sgd.numerics.theory.iterate_average_covariance`; ``discrete=False``: the
        continuous-time Eq. 71 of Mandt et al., Eq. 44/45 under A5), with A_U the Hessian of the
        full-data potential at ``at`` (default: the chain's current average).

        :return: (D, D) NumPy array in the order of ``self.potential.view.names``.
        """
        import numpy as np

        one = pick_chain(state, chain)
        ks = one.kernel_state
        potential = self.potential
        hessian = potential.full_hessian(one.z if at is None else at, model_args, model_kwargs)
        noise = np.asarray(ks.noise_cov)
        noise = noise * law_of(self._driver.subsample).noise_factor(potential.num_data, potential.batch_size)
        return iterate_average_covariance(np.asarray(ks.preconditioner), hessian, noise, self.steps_per_sample,
                                          discrete=discrete)
