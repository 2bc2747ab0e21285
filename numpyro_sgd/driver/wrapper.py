"""A kernel that runs another kernel's algorithm inside its own: the base of the wrappers
:class:`~numpyro_sgd.SGWithinGibbs` and :class:`~numpyro_sgd.VariationalEM`.
"""

from __future__ import annotations

from .kernel import SGKernel

__all__ = ["SGWrapper"]


class SGWrapper(SGKernel):
    """A kernel that runs another kernel's algorithm inside its own (:class:`~numpyro_sgd.SGWithinGibbs`,
    :class:`~numpyro_sgd.VariationalEM`).

    It samples ``model`` (the wrapped kernel's model, or a handler around it) with the wrapped
    kernel's driver options overridden by ``options``, and uses only the wrapped kernel's public
    :meth:`~SGKernel.build` and :attr:`~SGKernel.driver_options`. A wrapper cannot wrap another
    wrapper.

    :param str name: the wrapper's name in error messages.
    :param SGKernel kernel: the wrapped kernel, built on the model.
    :param model: the model the wrapper samples (default: ``kernel.subsampled_model``).
    :param options: :class:`SGKernel` options overriding the wrapped kernel's.
    """

    is_wrapper = True

    def __init__(self, kernel, *, model=None, **options):
        name = type(self).__name__
        if not isinstance(kernel, SGKernel) or kernel.is_wrapper:
            raise TypeError(
                f"{name}: `kernel` must be a numpyro_sgd sampling kernel built on the model, e.g. "
                f"{name}(ConstantSGD(model)), not a wrapper (the numpyro_sgd kernels SGWithinGibbs and VariationalEM "
                f"wrap one); got {type(kernel).__name__}."
            )
        self.supports_clusters = kernel.supports_clusters  # the wrapped kernel's own index rule, if any
        super().__init__(kernel.subsampled_model if model is None else model, **{**kernel.driver_options, **options})
        self._inner = kernel

    @property
    def inner_kernel(self):
        """The wrapped kernel."""
        return self._inner

    def inner_algorithm(self, potential):
        """The wrapped kernel's algorithm on ``potential``, as the bare kernel would run it except
        that the wrapper's driver takes the steps per sample (:meth:`SGKernel.build`)."""
        return self._inner.build(potential, adapt_steps_per_sample=False)
