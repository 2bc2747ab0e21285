"""Progress: the ``numpyro.infer.MCMC`` that called the kernel (found on the call stack), the
progress-bar text rendered only when the bar is drawn, and warmup's own bar.
"""

from __future__ import annotations

import sys

import numpy as np

__all__ = ["calling_mcmc", "calling_mcmc_shows_progress", "ProgressText", "progress_text", "run_with_progress",
           "SKIPPED_WARMUP"]


def calling_mcmc(max_frames=12):
    """The ``numpyro.infer.MCMC`` that called :meth:`SGKernel.init`, or None (a kernel initialised
    by hand). NumPyro's ``MCMC`` calls ``kernel.init`` without saying, nor how many samples follow
    (NumPyro 0.22 gives the kernel no hook for it); it is found on the call stack (its ``self``)."""
    from numpyro.infer import MCMC

    frame = sys._getframe(2)
    for _ in range(max_frames):
        if frame is None:
            break
        caller = frame.f_locals.get("self")
        if isinstance(caller, MCMC):
            return caller
        frame = frame.f_back
    return None


def calling_mcmc_shows_progress():
    """Whether the ``numpyro.infer.MCMC`` that called :meth:`SGKernel.init` shows a progress bar."""
    mcmc = calling_mcmc()
    return mcmc is not None and bool(mcmc.progress_bar)


class ProgressText(str):
    """A progress-bar postfix rendered when it is displayed, not when it is set.

    tqdm stores ``str(postfix)`` and draws ``", " + postfix`` (or formats it) at each refresh:
    this ``str`` subclass keeps itself through ``str()`` and renders at those two operations, so
    reading device values costs one sync per drawn frame instead of one per sample.
    """

    def __new__(cls, render):
        obj = super().__new__(cls, "…")
        obj._render = render
        return obj

    def __str__(self):
        return self

    def __radd__(self, other):
        return other + self._render()

    def __format__(self, spec):
        return format(self._render(), spec)

    def __contains__(self, item):
        return item in self._render()

    def __repr__(self):
        return repr(self._render())

    def __bool__(self):
        return True


#: the progress-bar text while NumPyro's loop runs the warmup iterations that the kernel already
#: ran as a program of its own (with a bar of its own, above NumPyro's)
SKIPPED_WARMUP = "warmup ran above, in its own program: these iterations skip it"


def progress_text(state, describe):
    """Progress-bar text for ``state``, rendered only when the bar is drawn: NumPyro hands the bar
    a new text after every returned sample, and reading the state forces a device sync that would
    stall the dispatch of every sample; a :class:`ProgressText` reads it when tqdm draws the bar (at
    most every 0.1 s, and once more when the bar closes), so the final line shows the final state.
    ``describe``: the algorithm's ``describe`` (or None), text about its kernel state (one chain's;
    with vectorized chains the passes per chain only)."""
    vectorized = np.ndim(state.i) > 0

    def render():
        if int(np.max(getattr(state, "idle_iterations", 0))) > 0:
            return SKIPPED_WARMUP
        if vectorized:
            return f"{float(np.mean(state.data_passes)):.3g} passes per chain"
        text = f"{float(state.data_passes):.3g} passes, {int(state.num_divergences)} divergences"
        extra = describe(state.kernel_state) if describe is not None else ""
        return f"{text}, {extra}" if extra else text

    return ProgressText(render)


def run_with_progress(program, state, num_warmup, arrays, text, calls=20):
    """``program(state, n, arrays)`` run in about ``calls`` pieces of ``num_warmup`` iterations with
    a tqdm bar of its own, whose postfix is ``text(state)``."""
    from tqdm.auto import tqdm

    size = -(-num_warmup // calls)
    with tqdm(total=num_warmup, desc="warmup (adapting the steps)", dynamic_ncols=True) as bar:
        done = 0
        while done < num_warmup:
            n = min(size, num_warmup - done)
            state = program(state, np.int32(n), arrays)
            done += n
            bar.set_postfix_str(str(text(state)), refresh=False)
            bar.update(n)
    return state
