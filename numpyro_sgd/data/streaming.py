"""Data read where they lie: rows of a memory-mapped file, a directory of ``.npy`` shards or any
row-sliceable array, gathered on the host for each minibatch.

A NumPy memmap (``np.load(path, mmap_mode="r")``) passed as a model argument is wrapped in a
:class:`StreamedRows` by the kernel, and so is a large in-memory NumPy array on the CPU
(:func:`~numpyro_sgd.data.model_args.stream_in_memory`); :func:`stream` wraps one by hand (a shard directory, a zarr
or HDF5 array, or an in-memory NumPy array that should not be copied to the device). The model is
unchanged: under the subsample plate it indexes ``X[idx]``, and that index becomes a read of the
minibatch's rows into the compiled step: on the CPU, for a NumPy source (memmap or in-memory),
one XLA custom call per array (:mod:`~numpyro_sgd.data.native`, no Python on the way); otherwise one
host callback (:func:`jax.pure_callback`) for the plate's arrays. With the cluster law
(:func:`~numpyro_sgd.minibatch.with_replacement.cluster_indices`) those rows are a few runs of consecutive rows,
which is what a page cache or a disk serves fastest. The full-data passes (the data check at
init, the control-variate centre, ``loo_subsample`` and the log-likelihood in blocks) index the
same way, block by block, so no program ever holds all N rows: memory is O(minibatch) on the
device and O(page cache) on the host.

A :class:`StreamedRows` is a JAX pytree with no leaves, so it passes through ``jax.jit``,
``MCMC(..., jit_model_args=True)`` and ``vmap`` as a static value and is never converted to an
array.
"""

import contextlib
import contextvars
import itertools
import mmap
import os
import time
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import native
from .native import row_contiguous, rows_local

__all__ = ["StreamedRows", "stream", "open_shards", "streamed_sources", "check_memmaps", "one_read_per_plate",
           "wrap_memmap", "FileStamp", "file_stamps", "check_files", "FILE_CHECK_SECONDS"]

_SERIAL = itertools.count()

#: the words of :meth:`StreamedRows.gather`'s error for a row past the data (read by the plate check)
PAST_THE_DATA = "asked of data with"
#: what that error says of it (the native reader's words too)
OUT_OF_RANGE = "a row index i of an N-row array needs -N <= i < N"

#: while a potential is traced: ``{id(idx): (idx, {id(array): rows})}``, the rows of a plate's
#: streamed arrays already read for the plate's indices ``idx`` (:func:`one_read_per_plate`)
_PLATE_READS = contextvars.ContextVar("numpyro_sgd_plate_reads", default=None)


@contextlib.contextmanager
def one_read_per_plate(indices, sizes, tree):
    """While the model is traced inside this block, the streamed arrays of ``tree`` (the model
    arguments) with a plate's N rows are read for that plate's minibatch ``indices[name]`` in one
    host callback, issued here; the model's ``X[idx]``, ``y[idx]`` then take their part. A host
    callback has a fixed cost (about 35 µs on a 2-core CPU), so one per plate instead of one per
    array: a hand-written loop reading X's and y's rows took 0.59 s a pass with one callback and
    0.68 s with two (N = 2·10⁷, D = 20, S = 10⁴). An array of the plate's length that the model
    does not index is read too (a wasted read, never a wrong one); where nothing uses the read,
    XLA drops it.

    :param dict indices: ``{plate name: indices}``; :param dict sizes: ``{plate name: N}``.
    """
    sources = streamed_sources(tree)
    reads = {}
    for name, idx in indices.items():
        group = list({id(a): a for a in sources if a.shape[0] == sizes.get(name) and not a.native}.values())
        if len(group) > 1 and jnp.issubdtype(jnp.result_type(idx), jnp.integer):
            rows = _read_together(group, _from_the_end(jnp.asarray(idx), sizes[name]))
            reads[id(idx)] = (idx, {id(a): r for a, r in zip(group, rows)})
    token = _PLATE_READS.set({**(_PLATE_READS.get() or {}), **reads})
    try:
        yield
    finally:
        _PLATE_READS.reset(token)


def _from_the_end(idx, n):
    """NumPy's rule for row indices: a negative one counts from the end (-N … -1 are rows 0 … N−1);
    what is still outside [0, N) is refused by the reader, never clamped or read past the data."""
    n = jnp.asarray(n, idx.dtype)
    return jnp.where((idx < 0) & (idx >= -n), idx + n, idx)


def _read_together(arrays, idx):
    """The rows ``idx`` of each of ``arrays`` (:class:`StreamedRows`), by one host callback (the
    one way a streamed array is read inside a program)."""
    specs = tuple(jax.ShapeDtypeStruct(idx.shape + a.shape[1:], a.dtype) for a in arrays)
    return jax.pure_callback(lambda i: tuple(a.gather(i) for a in arrays), specs, idx, vmap_method="expand_dims")


class FileStamp(NamedTuple):
    """A memory-mapped file as a run found it: what a later check compares with (``check_files``)."""

    #: the file's path
    path: str
    #: its size in bytes, modification time (ns) and inode number
    size: int
    mtime_ns: int
    inode: int
    #: the bytes the file must hold for the mapping to be read (the mapped range's end)
    needed: int


#: the native reader and the host callback compare a streamed file with its stamp at most this
#: often while a run reads it (a stat of each file; a step takes 0.1–1 ms)
FILE_CHECK_SECONDS = 0.01


def _mapping_end(array):
    """The end, in bytes from the start of the file, of the mapping a NumPy memmap reads (None for
    an array that maps no file)."""
    base = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    if base is None:
        return None
    offset = int(getattr(array, "offset", 0) or 0)
    try:
        return offset - offset % mmap.ALLOCATIONGRANULARITY + len(base)
    except ValueError:  # a closed mapping
        return None


def _stamp(array):
    path = getattr(array, "filename", None)
    end = _mapping_end(array) if path else None
    if end is None:
        return None
    st = os.stat(path)
    return FileStamp(os.fspath(path), st.st_size, st.st_mtime_ns, st.st_ino, end)


def file_stamps(source):
    """The :class:`FileStamp` of every memory-mapped file behind ``source`` (a memmap, the shards
    of :func:`open_shards`; none for an in-memory array, zarr or HDF5), taken now."""
    parts = source.arrays if isinstance(source, _Shards) else [source]
    return tuple(stamp for stamp in map(_stamp, parts) if stamp is not None)


def _changed(stamp):
    """What changed in the file of ``stamp`` since it was taken ("" when nothing did)."""
    try:
        st = os.stat(stamp.path)
    except OSError as e:
        return f"it can no longer be read ({e.strerror})"
    if st.st_ino != stamp.inode:
        return "another file now has its path (it was replaced)"
    if st.st_size < stamp.needed:
        return f"it is {st.st_size:,} bytes, shorter than the {stamp.needed:,} mapped (it was truncated)"
    if st.st_size != stamp.size:
        return f"its size went from {stamp.size:,} to {st.st_size:,} bytes"
    if st.st_mtime_ns != stamp.mtime_ns:
        return "it was written to (its modification time changed)"
    return ""


def check_files(stamps, name, when="since the run opened it"):
    """Raise a ValueError naming the first file of ``stamps`` that changed (:func:`_changed`) and the fix."""
    for stamp in stamps:
        why = _changed(stamp)
        if why:
            raise ValueError(
                f"{name}: the file {stamp.path} changed {when}: {why}. Its rows are no longer the ones the run "
                "read, and a memory-mapped file that shrinks kills the process that reads it (SIGBUS). Open it "
                "again (np.load(path, mmap_mode='r')) and pass the new array; to change the data while a run "
                "reads them, write a new file and keep the old one, or run from a copy.")


def _check_source(source, name):
    shape = getattr(source, "shape", None)
    dtype = getattr(source, "dtype", None)
    if shape is None or dtype is None or not hasattr(source, "__getitem__"):
        raise TypeError(f"{name}: {type(source).__name__} is not an array: a streamed source needs shape, dtype "
                        "and row slicing (a NumPy memmap, a zarr or HDF5 array, a directory of .npy files).")
    if len(shape) == 0:
        raise ValueError(f"{name}: a streamed source needs at least one dimension (rows); got a scalar.")
    dtype = np.dtype(dtype)
    if dtype.kind not in "biuf":
        raise ValueError(
            f"{name}: the file's dtype {dtype} is not a number type a JAX model can take (bool, integers, "
            "floats); convert it once, e.g. np.save(path, np.asarray(X, dtype=np.float32)), and pass the new file.")
    if isinstance(source, np.memmap) and not rows_local(source):
        # a file whose row is spread over all of it (in memory any layout is read, row by row)
        order = "Fortran-order" if source.flags.f_contiguous else "non-contiguous"
        raise ValueError(
            f"{name}: the array is {order} (strides {source.strides} for shape {source.shape}): a row is not "
            "one run of bytes, so every minibatch row would be read from all over the file. Write it in C "
            "order once: np.save(path, np.ascontiguousarray(X)), and open that file with mmap_mode='r'.")
    return tuple(int(d) for d in shape), dtype


class StreamedRows:
    """An (N, ...) array whose rows are read from ``source`` on the host when a traced index asks.

    ``X[idx]`` with a traced (or JAX) integer ``idx`` is ``source[idx]`` as an array of
    ``idx.shape + X.shape[1:]``, read by the native reader (:func:`~numpyro_sgd.data.native.read_rows`)
    or one :func:`jax.pure_callback` (a ``vmap`` over chains gathers all chains' rows in one
    call); further indices in the same subscript (``X[idx, 0]``) apply to that block. A static
    subscript (``X[:, 0]``, ``X[10:20]``) of a NumPy source is again streamed (a view, nothing is
    read); of another source it is read. Anything that would need every row at once
    (``jnp.asarray(X)``, ``X @ w``) raises: index the rows first.

    :param source: an object with ``shape``, ``dtype`` and NumPy-style row indexing (NumPy arrays
        and memmaps, :func:`open_shards`, zarr and h5py arrays); a memmap's rows must each lie
        within their own bytes (C order, not a Fortran-order file), an in-memory array may have
        any layout.
    :param str name: what error messages call it.
    :param str reader: ``"auto"`` (default): the rows of a NumPy source are read by the native
        reader (:mod:`~numpyro_sgd.data.native`, an XLA custom call) on the CPU, which narrows 64-bit
        rows as JAX does without x64, the others by a host callback; ``"callback"``: always the
        host callback.
    """

    def __init__(self, source, name="stream", reader="auto"):
        if reader not in ("auto", "callback"):
            raise ValueError(f"{name}: reader must be 'auto' or 'callback'; got {reader!r}.")
        self.shape, self._source_dtype = _check_source(source, name)
        self.source = source
        self.name = name
        self.reader = reader
        self.dtype = jax.dtypes.canonicalize_dtype(self._source_dtype)
        self._serial = next(_SERIAL)
        self.origin = source  # the array the user gave (stream_in_memory may read a copy of it in C order)
        #: the memory-mapped files behind the rows as they were when wrapped (:class:`~numpyro_sgd.data.streaming.FileStamp`)
        self.files = file_stamps(source)
        check_files(self.files, name, "since it was memory-mapped")
        self._checked = 0.0  # when the callback reader last compared the files with their stamps

    @property
    def native(self):
        """Whether a traced ``X[idx]`` is read by the native reader (:func:`~numpyro_sgd.data.native.can_read`)."""
        return self.reader == "auto" and native.can_read(self._parts(), self.dtype)

    def _parts(self):
        """The NumPy arrays whose stacked rows are this array's (the native reader's parts), or []."""
        if isinstance(self.source, np.ndarray):
            return [self.source]
        return list(self.source.arrays) if isinstance(self.source, _Shards) else []

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape)))
    nbytes = property(lambda self: self.size * self._source_dtype.itemsize)

    def __len__(self):
        return self.shape[0]

    def __setstate__(self, state):  # unpickled: a serial of this process's own (see __repr__)
        self.__dict__.update(state)
        self._serial = next(_SERIAL)

    def __repr__(self):  # unique: a traced program's text names its callback, and equal text is reused
        return (f"StreamedRows#{self._serial}(shape={self.shape}, dtype={self._source_dtype}, "
                f"source={type(self.source).__name__})")

    def gather(self, idx):
        """``source[idx]`` on the host, for an integer array ``idx`` of any shape."""
        if self.files and time.monotonic() - self._checked > FILE_CHECK_SECONDS:
            check_files(self.files, self.name)
            self._checked = time.monotonic()
        idx = np.asarray(idx)
        flat = idx.reshape(-1).astype(np.int64, copy=False)
        n = self.shape[0]
        if flat.size and (flat.min() < 0 or flat.max() >= n):  # __getitem__ counted negative ones from the end
            bad = int(flat.max()) if flat.max() >= n else int(flat.min())
            raise IndexError(f"{self.name}: row {bad} {PAST_THE_DATA} {n} rows ({OUT_OF_RANGE})")
        if isinstance(self.source, np.ndarray):
            # np.take copies a source whose rows are not contiguous whole before it gathers (a
            # Fortran-order matrix: N·D values for S rows); indexing reads only the rows
            rows = np.take(self.source, flat, axis=0) if row_contiguous(self.source) else self.source[flat]
        else:
            rows = self._read_runs(flat)
        return np.asarray(rows, dtype=self.dtype).reshape(idx.shape + self.shape[1:])

    def _read_runs(self, flat):
        """Rows ``flat`` of a non-NumPy source, read as sorted runs of consecutive rows (one slice
        each: what zarr, HDF5 and shards serve fastest), then put back in the asked order."""
        order = np.argsort(flat, kind="stable")
        ordered = flat[order]
        unique, inverse = np.unique(ordered, return_inverse=True)
        breaks = np.flatnonzero(np.diff(unique) != 1) + 1
        runs = [self.source[int(r[0]):int(r[-1]) + 1] for r in np.split(unique, breaks)] if unique.size else []
        block = np.concatenate([np.asarray(r) for r in runs]) if runs else np.empty((0,) + self.shape[1:])
        out = np.empty((flat.size,) + self.shape[1:], block.dtype)
        out[order] = block[inverse]
        return out

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        rows, rest = key[0], key[1:]
        if isinstance(rows, (jax.Array, np.ndarray)) and not isinstance(rows, StreamedRows):
            if not jnp.issubdtype(jnp.result_type(rows), jnp.integer):
                raise IndexError(f"{self.name}: rows are indexed by integers; got {jnp.result_type(rows)}")
            idx = jnp.asarray(rows)
            read = (_PLATE_READS.get() or {}).get(id(rows))
            if read is None:
                idx = _from_the_end(idx, self.shape[0])
            if read is not None and read[0] is rows and id(self) in read[1]:
                out = read[1][id(self)]  # read with the plate's other arrays (one_read_per_plate)
            elif self.native:
                out = native.read_rows(self._parts(), idx, self.name, self.dtype, self.files)
            else:
                (out,) = _read_together([self], idx)
            return out[(slice(None),) * idx.ndim + rest] if rest else out
        if isinstance(self.source, np.ndarray):
            view = self.source[key]
            if np.ndim(view) >= 1 and not isinstance(rows, (int, np.integer)):
                out = StreamedRows(view, self.name, self.reader)
                out.files = self.files  # a view reads the parent's mapping: the stamps the run took
                return out
            return jnp.asarray(view)
        return jnp.asarray(np.asarray(self.source[key]))

    def block(self, offset, rows, axis=None):
        """Rows ``offset … offset + rows − 1`` as an array of ``rows`` rows, read only where
        indexed. ``offset`` may be traced: under ``mesh=`` each device's block of the data plate
        (``lax.axis_index(axis) · N/k``), so that a device reads only its own share of the file.

        ``axis``: the ``shard_map`` axis the block varies over. The rows read are typed as varying
        over it (``lax.pcast``): JAX types a ``pure_callback``'s result inside a ``shard_map`` as
        the same on every device, and then differentiates through it wrongly (a gradient of
        [0.056, 0.059, 0.061] for the exact [0.676, 0.684, 0.693] in a ten-line program, jax 0.10
        and 0.12; the value is right)."""
        return _Block(self, offset, rows, axis)

    def _refuse(self, use):
        """The TypeError for a use of every row at once: ``use`` says what the model did."""
        name = self.__dict__.get("name", "stream")
        shape = self.__dict__.get("shape", ("?",))
        return TypeError(
            f"{name}: the model uses all {shape[0]:,} rows of a streamed array at once ({use}); a streamed array "
            "(a memory-mapped file, numpyro_sgd.stream(...), or a large NumPy array read in place) is read one "
            "minibatch at a time. Index it with the plate's indices first (with numpyro.plate('data', N, "
            "subsample_size=S) as idx: ... X[idx] ...), or compute what needs every row once outside the model, "
            "with NumPy, and pass it as an argument of its own (x_mean = X.mean(0); model(X, y, x_mean)).")

    def __getattr__(self, attr):
        # only for what the class does not define: an ndarray method or property is a whole-array use
        if not attr.startswith("_") and hasattr(np.ndarray, attr):
            raise self._refuse(f"X.{attr}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")


def _whole(use):
    def refuse(self, *_, **__):
        raise self._refuse(use)

    return refuse


StreamedRows.__array__ = StreamedRows.__jax_array__ = _whole("converted to an array: np.asarray(X), jnp.asarray(X)")
for _op, _use in (("matmul", "X @ ..."), ("rmatmul", "... @ X"), ("add", "X + ..."), ("radd", "... + X"),
                  ("mul", "X * ..."), ("rmul", "... * X"), ("sub", "X - ..."), ("rsub", "... - X"),
                  ("truediv", "X / ..."), ("rtruediv", "... / X"), ("pow", "X ** ..."), ("neg", "-X"),
                  ("abs", "abs(X)"), ("iter", "iterated: for row in X"), ("lt", "X < ..."), ("le", "X <= ..."),
                  ("gt", "X > ..."), ("ge", "X >= ...")):
    setattr(StreamedRows, f"__{_op}__", _whole(_use))


class _Block(StreamedRows):
    """:meth:`StreamedRows.block`: row i is row ``offset + i`` of ``parent``."""

    def __init__(self, parent, offset, rows, axis=None):
        self.__dict__.update(parent.__dict__)
        self.parent, self.offset, self.axis = parent, offset, axis
        self.shape = (int(rows),) + parent.shape[1:]

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        rows, rest = key[0], key[1:]
        if isinstance(rows, (jax.Array, np.ndarray)):
            out = self.parent[(jnp.asarray(rows) + self.offset,) + rest]
            return out if self.axis is None else jax.lax.pcast(out, self.axis, to="varying")
        if isinstance(rows, slice) and rows == slice(None):
            return _Block(self.parent[key], self.offset, self.shape[0], self.axis) if rest else self
        raise TypeError(f"{self.name}: under mesh= a streamed array is indexed by the plate's indices (X[idx], "
                        f"X[idx, j], X[:, j]); got the subscript {key!r}.")


for _cls in (StreamedRows, _Block):
    jax.tree_util.register_pytree_node(_cls, lambda s: ((), s), lambda s, _: s)


def blocks_of(tree, offset, rows, num_rows, axis=None):
    """``tree`` (model arguments) with each :class:`StreamedRows` of ``num_rows`` rows replaced by
    its :meth:`~StreamedRows.block` ``(offset, rows, axis)``."""
    def block(x):
        return x.block(offset, rows, axis) if isinstance(x, StreamedRows) and x.shape[0] == num_rows else x

    return jax.tree.map(block, tree, is_leaf=lambda x: isinstance(x, StreamedRows))


class _Shards:
    """The row-wise concatenation of ``.npy`` files of equal row shape and dtype, each memory-mapped."""

    def __init__(self, paths, arrays):
        self.paths = paths
        self.arrays = arrays
        self.offsets = np.cumsum([0] + [a.shape[0] for a in arrays])
        self.shape = (int(self.offsets[-1]),) + arrays[0].shape[1:]
        self.dtype = arrays[0].dtype

    def __getitem__(self, key):
        if isinstance(key, tuple):
            rows, rest = key[0], key[1:]
            return self[rows][(slice(None),) + rest]
        if isinstance(key, (int, np.integer)):
            k = int(np.searchsorted(self.offsets, key, side="right")) - 1
            return self.arrays[k][key - self.offsets[k]]
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step != 1:
                return self[np.arange(start, stop, step)]
            parts = []
            for k, a in enumerate(self.arrays):
                lo, hi = max(start, self.offsets[k]), min(stop, self.offsets[k + 1])
                if lo < hi:
                    parts.append(a[lo - self.offsets[k]:hi - self.offsets[k]])
            return np.concatenate(parts) if parts else np.empty((0,) + self.shape[1:], self.dtype)
        idx = np.asarray(key)
        shard = np.searchsorted(self.offsets, idx, side="right") - 1
        out = np.empty(idx.shape + self.shape[1:], self.dtype)
        for k in np.unique(shard):
            where = shard == k
            out[where] = self.arrays[k][idx[where] - self.offsets[k]]
        return out


def open_shards(directory, name=None, reader="auto"):
    """A :class:`StreamedRows` over every ``.npy`` file of ``directory`` (in name order), stacked
    by rows; each file is memory-mapped, none is read whole. ``reader``: see :class:`StreamedRows`.

    :raises ValueError: when the directory holds no ``.npy`` file, or files whose row shape or
        dtype differ (naming the first file that differs).
    """
    paths = sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".npy"))
    name = name or f"open_shards({directory!r})"
    if not paths:
        raise ValueError(f"{name}: no .npy files in {directory}; write the shards with "
                         "np.save(f'{i:05d}.npy', rows).")
    arrays = [np.load(p, mmap_mode="r") for p in paths]
    for p, a in zip(paths[1:], arrays[1:]):
        if a.shape[1:] != arrays[0].shape[1:] or a.dtype != arrays[0].dtype:
            raise ValueError(
                f"{name}: shard {os.path.basename(p)} has rows of shape {a.shape[1:]} and dtype {a.dtype}, but "
                f"{os.path.basename(paths[0])} has {arrays[0].shape[1:]} and {arrays[0].dtype}: every shard must "
                "hold the same columns; rewrite the odd shards.")
    for p, a in zip(paths, arrays):
        _check_source(a, f"{name}: shard {os.path.basename(p)}")
    return StreamedRows(_Shards(paths, arrays), name, reader)


def stream(source, name=None, reader="auto"):
    """``source`` as a :class:`StreamedRows`: a memmap, any row-sliceable array (zarr, h5py, NumPy in
    host memory), a ``.npy`` path (memory-mapped) or a directory of ``.npy`` shards
    (:func:`open_shards`). A :class:`StreamedRows` is returned as it is. ``reader``: see
    :class:`StreamedRows` (``"callback"`` turns the native reader off for this source).

    Pass the result as the model argument in place of the array; the model indexes it as before::

        X = numpyro_sgd.stream("/data/X.npy")     # or np.load(path, mmap_mode="r"), wrapped by the kernel
        mcmc.run(key, X, y)
    """
    if isinstance(source, StreamedRows):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isdir(path):
            return open_shards(path, name, reader)
        return StreamedRows(np.load(path, mmap_mode="r"), name or f"stream({path!r})", reader)
    return StreamedRows(source, name or "stream", reader)


#: ``id(memmap)`` → the :class:`StreamedRows` :func:`wrap_memmap` made for it, while something (a
#: kernel's kept run arguments or programs) holds it: later entry points then read the same
#: wrapper, hence the same compiled programs; nothing is stored on the user's memmap
_MEMMAP_ROWS = weakref.WeakValueDictionary()


def wrapped_rows(array):
    """The :class:`StreamedRows` :func:`wrap_memmap` made for this memmap, or None."""
    rows = _MEMMAP_ROWS.get(id(array))
    return rows if rows is not None and rows.source is array else None


def wrap_memmap(array):
    """The memmap's :class:`StreamedRows`, made once while it is in use (:data:`_MEMMAP_ROWS`)."""
    rows = wrapped_rows(array)
    if rows is None:
        rows = _MEMMAP_ROWS[id(array)] = StreamedRows(array, f"memory-mapped argument of shape {array.shape}")
    return rows


def streamed_sources(tree):
    """The :class:`StreamedRows` inside ``tree`` (model arguments)."""
    return [x for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, StreamedRows))
            if isinstance(x, StreamedRows)]


def check_memmaps(name, model_args, model_kwargs, mcmc):
    """Raise before any compute when memmaps among the model arguments would be copied whole:
    ``MCMC(..., jit_model_args=True)`` passes every argument into NumPyro's compiled loop, which
    converts a memmap to one device array (the whole file, and its loop keeps another copy).
    A :class:`StreamedRows` (:func:`stream`) has no array leaves and passes either way. Each
    memmap is checked for what the streamed reader needs (:func:`_check_source`), and every
    memory-mapped file, wrapped or not, against its stamp (:func:`check_files`: a file truncated
    since an earlier run of the same array would kill this one with SIGBUS at its first read)."""
    memmaps = [x for x in jax.tree.leaves((model_args, model_kwargs)) if isinstance(x, np.memmap)]
    for m in memmaps:
        label = f"{name}: memory-mapped argument of shape {m.shape}"
        _check_source(m, label)
        wrapped = wrapped_rows(m)
        check_files(file_stamps(m) if wrapped is None else wrapped.files, label)
    for rows in streamed_sources((model_args, model_kwargs)):
        check_files(rows.files, f"{name}: {rows.name}")
    if memmaps and mcmc is not None and getattr(mcmc, "_jit_model_args", False):
        size = sum(m.nbytes for m in memmaps)
        raise ValueError(
            f"{name}: MCMC(..., jit_model_args=True) would copy the memory-mapped arguments ({size / 2**30:.2f} GiB) "
            "whole into NumPyro's compiled loop. Wrap them, X = numpyro_sgd.stream(X), which reads minibatch "
            "rows in place with either setting, or use MCMC's default jit_model_args=False.")
