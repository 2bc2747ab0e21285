"""The minibatch laws, by name: what ``subsample=`` and ``warmup_subsample=`` take.

A law is a :class:`MinibatchLaw` subclass: how it draws a step's rows (``draw``), how each device
draws its share of them under ``mesh=`` (``draw_shard``), the factor its noise covariance takes
relative to i.i.d. rows (``noise_factor``), and what it allows. Subclassing registers it under its
``name``; the package's laws live one per file beside this one, in a module of that name
(``with_replacement.py``, ``without_replacement.py``, ``shuffle.py``), which :func:`law_of`
imports on first use. A new law is one such file.
"""

from __future__ import annotations

import importlib

__all__ = ["MinibatchLaw", "law_of", "law_names", "check_laws"]

#: name → law (one instance of each :class:`MinibatchLaw` subclass)
_LAWS = {}
#: the package's own laws, each in the module ``numpyro_sgd.minibatch.<name>``
BUILT_IN = ("with_replacement", "without_replacement", "shuffle")


class MinibatchLaw:
    """How a step's minibatch rows are drawn.

    Subclasses set :attr:`name` and implement :meth:`draw`; defining one registers an instance.
    """

    #: the name ``subsample=`` and ``warmup_subsample=`` take
    name = None
    #: whether sampling may use it (False: warmup only, the law biases the stationary law)
    for_sampling = True
    #: whether a draw depends on the SG step and a shuffle key (not on the step's key alone)
    needs_step = False
    #: whether each device can draw its share of the rows among its own (``mesh=``)
    on_mesh = True
    #: whether a plate's minibatch may be clusters of consecutive rows (``cluster_size``)
    clusters = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name is not None:
            _LAWS[cls.name] = cls()

    def draw(self, rng_key, plates, step=None, shuffle_key=None):
        """``{plate: int32[S]}``: one step's rows of every plate (``plates``: the potential's
        :class:`~numpyro_sgd.PlateInfo` tuple); ``step`` and ``shuffle_key`` when
        :attr:`needs_step`."""
        raise NotImplementedError

    def draw_shard(self, rng_key, rows, size, cluster_size=1):
        """``int32[size]``: one device's share, ``size`` of its ``rows`` rows (local numbers)."""
        raise NotImplementedError(f"subsample={self.name!r} has no draw per device (mesh=)")

    def noise_factor(self, num_rows, size):
        """f: the covariance of the minibatch gradient of ``size`` rows out of ``num_rows`` is f
        times that of ``size`` i.i.d. rows (1 unless the law says otherwise)."""
        return 1.0


def law_of(name):
    """The registered law called ``name``; a ``ValueError`` naming the laws there are otherwise."""
    if name not in _LAWS and name in BUILT_IN:
        importlib.import_module(f"{__package__}.{name}")
    if not isinstance(name, str) or name not in _LAWS:
        for built_in in BUILT_IN:
            importlib.import_module(f"{__package__}.{built_in}")
        raise ValueError(f"unknown minibatch law {name!r}; the laws are {law_names()}.")
    return _LAWS[name]


def law_names(sampling=False):
    """The registered laws' names (``sampling``: only those sampling may use), built-in first."""
    for built_in in BUILT_IN:
        importlib.import_module(f"{__package__}.{built_in}")
    names = BUILT_IN + tuple(n for n in _LAWS if n not in BUILT_IN)
    return tuple(n for n in names if _LAWS[n].for_sampling or not sampling)


def check_laws(name, subsample, warmup_subsample):
    """Validate a kernel's ``subsample`` and ``warmup_subsample`` (None: ``subsample``) before any
    compute; returns both names. A law that biases the stationary law (``for_sampling=False``) is
    refused for sampling and allowed for warmup."""
    try:
        law = law_of(subsample)
    except ValueError:
        raise ValueError(f"{name}: subsample={subsample!r} is not a minibatch law; use one of "
                         f"{law_names(sampling=True)}.") from None
    if not law.for_sampling:
        raise ValueError(
            f"{name}: subsample={subsample!r} is not supported for sampling; use one of {law_names(sampling=True)}. "
            f"{subsample!r} is allowed only as warmup_subsample: it makes consecutive gradients anticorrelated and "
            "shrinks the stationary spread.")
    warmup_subsample = subsample if warmup_subsample is None else warmup_subsample
    try:
        law_of(warmup_subsample)
    except ValueError:
        raise ValueError(f"{name}: warmup_subsample must be one of {law_names()}, got {warmup_subsample!r}.") from None
    return subsample, warmup_subsample
