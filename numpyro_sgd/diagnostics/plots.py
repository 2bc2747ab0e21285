"""Plots of runs against a reference (matplotlib, an optional extra).
"""

from __future__ import annotations

import math

import numpy as np

from .compare import fit_gaussian, run_labels
from .runs import (
    draws_of,
    site_arrays,
    transforms_from,
)

__all__ = ["plot_marginals", "plot_ellipses", "plot_convergence"]


# ---------------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _styles(names):
    """``{name: dict(color=..., linestyle=...)}``: a colour of its own for each of up to 20 runs
    (matplotlib's tab20, the dark shade of each pair first), then the colours again dashed."""
    import matplotlib

    colors = matplotlib.colormaps["tab20"].colors
    order = list(colors[0::2]) + list(colors[1::2])
    return {name: dict(color=order[k % 20], linestyle=("-", "--", ":")[(k // 20) % 3])
            for k, name in enumerate(names)}


def _legend_beside(fig, axes):
    """One legend for the figure, to the right of its panels, so that it hides none of them."""
    handles = {}
    for ax in np.ravel(axes):
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize=7, frameon=False)


def plot_marginals(runs, reference, path, *, names=None, max_params=12, bins=60):
    """Marginal densities of every run overlaid on the reference's, one panel per scalar
    parameter (constrained scale); saved as PNG at ``path``."""
    plt = _pyplot()
    names = names or sorted(site_arrays(reference))
    ref = draws_of(reference, names).reshape(-1, sum(1 for _ in run_labels(reference, names)))
    labels = run_labels(reference, names)[:max_params]
    cols = min(4, len(labels))
    rows = math.ceil(len(labels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols + 2.2, 2.6 * rows), squeeze=False, layout="constrained")
    styles = _styles(runs)
    for j, label in enumerate(labels):
        ax = axes.flat[j]
        lo, hi = np.quantile(ref[:, j], [0.001, 0.999])
        pad = 0.5 * (hi - lo)
        edges = np.linspace(lo - pad, hi + pad, bins)
        ax.hist(ref[:, j], edges, density=True, color="0.8", label="reference")
        for name, run in runs.items():
            x = draws_of(run, names).reshape(-1, ref.shape[1])[:, j]
            counts, _ = np.histogram(x, edges)
            if counts.sum() == 0:  # entirely outside the reference's range: say so in the legend
                ax.plot([], [], label=f"{name} (off range)", **styles[name])
                continue
            ax.hist(x, edges, density=True, histtype="step", lw=1.3, label=name, **styles[name])
        ax.set_title(label, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    _legend_beside(fig, axes)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

def _ellipse(mean, cov, nsd=2.0, n=200):
    vals, vecs = np.linalg.eigh(cov)
    t = np.linspace(0, 2 * np.pi, n)
    circle = np.stack([np.cos(t), np.sin(t)])
    return (mean[:, None] + vecs @ (nsd * np.sqrt(np.maximum(vals, 0))[:, None] * circle)).T

def plot_ellipses(runs, reference, path, *, names=None, transforms=None):
    """2-sd covariance ellipses of every run and of the reference in the plane spanned by the
    reference's smallest and largest principal directions, unconstrained and centred on the
    reference mean (the view of Mandt et al. Fig. 1); saved as PNG at ``path``."""
    plt = _pyplot()
    transforms = transforms_from(runs, transforms)
    if isinstance(reference, (tuple, list)) and len(reference) == 2:
        m_ref, c_ref = fit_gaussian(reference)
        names = names or sorted(site_arrays(next(iter(runs.values()))))
    else:
        names = names or sorted(site_arrays(reference))
        m_ref, c_ref = fit_gaussian(draws_of(reference, names, transforms, unconstrained=True))
    vals, vecs = np.linalg.eigh(c_ref)
    basis = np.stack([vecs[:, 0], vecs[:, -1]], axis=1)  # smallest, largest
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    styles = _styles(runs)
    e = _ellipse(np.zeros(2), basis.T @ c_ref @ basis)
    ax.fill(e[:, 0], e[:, 1], color="0.85", label="reference")
    for name, run in runs.items():
        m, c = fit_gaussian(draws_of(run, names, transforms, unconstrained=True))
        e = _ellipse(basis.T @ (m - m_ref), basis.T @ c @ basis)
        ax.plot(e[:, 0], e[:, 1], lw=1.4, label=name, **styles[name])
    ax.set_xlabel(f"smallest principal direction (sd {np.sqrt(vals[0]):.3g})")
    ax.set_ylabel(f"largest principal direction (sd {np.sqrt(vals[-1]):.3g})")
    ax.set_title("2-sd ellipses, unconstrained scale")
    _legend_beside(fig, ax)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

def plot_convergence(curves, path, *, ylabel="KL(q ‖ reference)", logx=True, logy=True):
    """A metric against data passes, one line per run: ``curves`` maps a name to
    ``(data_passes, values)``; saved as PNG at ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4), layout="constrained")
    styles = _styles(curves)
    for name, (x, y) in curves.items():
        ax.plot(x, y, marker="o", ms=3, lw=1.3, label=name, **styles[name])
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("data passes (per-datum gradients / N)")
    ax.set_ylabel(ylabel)
    _legend_beside(fig, ax)
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
