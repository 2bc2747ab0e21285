"""The native row reader: a minibatch's rows copied from host NumPy arrays (a memmap, the memmaps
of a directory of ``.npy`` shards, or an in-memory array passed through
:func:`~numpyro_sgd.stream`) into the compiled step by an XLA FFI custom call
(``row_gather.cc``), with no Python on the way.

A :func:`jax.pure_callback` costs a fixed ~35 µs a call on a 2-core CPU, and its rows are copied
twice (from the page cache into a NumPy array, then into the step's buffer). The custom call
copies each run of consecutive rows (a cluster of the cluster law) once, by ``memcpy``, on XLA's
own thread. On N = 2·10⁷, D = 20 float32 rows from the page cache, with S = 10,000 rows a step,
a ConstantSGD-full sampling pass took 0.33 s with it (1.30× one sequential NumPy read of the
file) against 0.68 s with the rows read by one host callback a step (2.68×) and 0.28 s on JAX
arrays in device memory (``docs/results/out_of_core.md``).

The handler is compiled on first use, with the C++ compiler ``$CXX`` (default ``c++``) and the
XLA FFI headers that jaxlib ships (:func:`jax.ffi.include_dir`), into :func:`cache_dir`
(``$NUMPYRO_SGD_CACHE``, default ``~/.cache/numpyro_sgd``, a folder private to the user), keyed
by the source, jaxlib's version and the platform, with the sha256 of the library recorded beside
it; then verified against that record, loaded and registered for the CPU. A cached library that
is not private, or not the one recorded, is never loaded. Where it cannot be built (no
compiler, no :mod:`jax.ffi`), streamed rows are read by a host callback as before, with one
warning that says why; on an accelerator (not the CPU) too, without a warning. It reads arrays
whose row elements are evenly spaced (:func:`element_stride`: rows in C order, any view of a
matrix, a Fortran-order matrix a column at a time), in a dtype JAX keeps as it is or in one of
the 64-bit dtypes it narrows without ``jax_enable_x64`` (float64, int64 and uint64 rows become
float32, int32 and uint32 as they are copied: :data:`CASTS`); the others are read by the
callback, which converts them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["CACHE_ENV", "CASTS", "UnsafeCache", "available", "cache_dir", "can_read", "element_stride", "library_key",
           "read_rows", "row_contiguous", "rows_local"]

_TARGET = "numpyro_sgd_row_gather"
_SOURCE = Path(__file__).with_name("row_gather.cc")
#: (source dtype, result dtype) → the handler's ``convert`` code: the narrowing casts JAX applies to
#: 64-bit data without ``jax_enable_x64``, done row by row as the rows are copied
CASTS = {(np.dtype(np.float64), np.dtype(np.float32)): 1, (np.dtype(np.int64), np.dtype(np.int32)): 2,
         (np.dtype(np.uint64), np.dtype(np.uint32)): 3}
_state = {}  # "ok": bool, "why": str, "lib": the loaded library (kept alive)
_building = threading.Lock()  # one build and registration per process, whichever thread traces first


#: the environment variable that moves the compiled reader's cache folder
CACHE_ENV = "NUMPYRO_SGD_CACHE"


class UnsafeCache(RuntimeError):
    """The cache folder, or a file in it, could be written by someone else: nothing there is loaded."""


class _NotRecorded(RuntimeError):
    """A cached library that is missing or differs from its record: not loaded, built again."""


def cache_dir():
    """The folder the compiled reader is kept in: ``$NUMPYRO_SGD_CACHE`` if set, else
    ``$XDG_CACHE_HOME/numpyro_sgd`` (default ``~/.cache/numpyro_sgd``); where that cannot be
    created or written (and the variable is not set), ``<tmpdir>/numpyro_sgd-<uid>``. It is created
    with mode 0700, and used only when it is a folder owned by this user that neither group nor
    others can write (:class:`UnsafeCache` otherwise, naming the folder and the fix)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return _private_dir(Path(explicit))
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    try:
        return _private_dir(Path(root) / "numpyro_sgd")
    except UnsafeCache:
        raise
    except OSError:
        return _private_dir(Path(tempfile.gettempdir()) / f"numpyro_sgd-{_uid()}")


def _uid():
    return os.getuid() if hasattr(os, "getuid") else None


def _check_private(path, what):
    """Raise :class:`UnsafeCache` unless ``path`` (not followed if a link, and followed) is owned
    by this user and not writable by group or others."""
    uid = _uid()
    for st in (os.lstat(path), os.stat(path)):
        if uid is not None and st.st_uid != uid:
            raise UnsafeCache(f"the {what} {path} is owned by user id {st.st_uid}, not by this user ({uid})")
        if st.st_mode & 0o022:
            raise UnsafeCache(f"the {what} {path} can be written by group or others (mode {st.st_mode & 0o777:o})")


def _private_dir(path):
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.is_dir():
        raise UnsafeCache(f"the cache folder {path} is not a folder")
    _check_private(path, "cache folder")
    tempfile.NamedTemporaryFile(dir=path, delete=True).close()  # writable (OSError otherwise)
    return path


def _digest(data):
    return hashlib.sha256(data).hexdigest()


def library_key():
    """The cache key of the reader: a hash of its source, jaxlib's version and the platform."""
    import jaxlib

    return _digest(b"\0".join([_SOURCE.read_bytes(), jaxlib.__version__.encode(), platform.machine().encode(),
                               sys.platform.encode()]))[:16]


def _compile(folder, key):
    """Compile the reader into ``folder``: the library is written under a temporary name and
    renamed to ``row_gather-<key>-<its sha256>.so``, then the record ``row_gather-<key>.sha256``,
    which names it, is written the same way. Two processes compiling at once each rename complete
    files into place, so a reader of the record always finds the library it names."""
    compiler = os.environ.get("CXX", "c++")
    partial = folder / f"row_gather-{key}.{os.getpid()}.tmp"
    command = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", f"-I{jax.ffi.include_dir()}", str(_SOURCE),
               "-o", str(partial)]
    if sys.platform == "darwin":
        command.insert(1, "-undefined")
        command.insert(2, "dynamic_lookup")
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as e:  # no compiler
        raise RuntimeError(f"{compiler} could not be run ({e}); install a C++17 compiler (g++ or clang++, or "
                           "set CXX)") from None
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
    os.chmod(partial, 0o700)
    digest = _digest(partial.read_bytes())
    library = folder / f"row_gather-{key}-{digest}.so"
    os.replace(partial, library)
    record = folder / f"row_gather-{key}.sha256.{os.getpid()}.tmp"
    record.write_text(digest)
    os.replace(record, folder / f"row_gather-{key}.sha256")
    return library


def _cached(folder, key):
    """The cached library of ``key`` when its record names it and its bytes have that sha256;
    None when nothing is cached; :class:`UnsafeCache` when a file is not private; ``_NotRecorded``
    when the library is missing or does not match its record (a corrupt or foreign file)."""
    record = folder / f"row_gather-{key}.sha256"
    if not record.exists():
        return None
    _check_private(record, "record")
    digest = record.read_text().strip()
    library = folder / f"row_gather-{key}-{digest}.so"
    if not library.exists():
        raise _NotRecorded(f"{record} names {library.name}, which is missing")
    _check_private(library, "library")
    if _digest(library.read_bytes()) != digest:
        raise _NotRecorded(f"{library} does not match the sha256 recorded when it was built")
    return library


def _load():
    """Load the cached reader, verified (:func:`_cached`), compiling it when there is none. A
    cached one that fails to verify or to load is removed and compiled again, once; the second
    failure is raised."""
    folder, key = cache_dir(), library_key()
    for attempt in range(2):
        try:
            library = _cached(folder, key) or _compile(folder, key)
            return ctypes.cdll.LoadLibrary(str(library))
        except (_NotRecorded, OSError) as e:  # OSError: the dynamic loader refused the file
            if attempt:
                raise
            warnings.warn(f"numpyro_sgd: the cached native row reader was not loaded ({e}); it is built again.",
                          stacklevel=5)
            for stale in folder.glob(f"row_gather-{key}*"):
                stale.unlink(missing_ok=True)


def available():
    """Whether the native reader is built, loaded and registered (done on the first call; where
    it cannot be, warns once with the reason and returns False)."""
    if "ok" in _state:
        return _state["ok"]
    with _building:
        if "ok" not in _state:
            _build_and_register()
    return _state["ok"]


def _build_and_register():
    """Build, load and register the handler, recording in ``_state`` whether it worked and why not."""
    try:
        if not hasattr(jax, "ffi") or not hasattr(jax.ffi, "include_dir"):
            raise RuntimeError(f"jax {jax.__version__} has no jax.ffi")
        if sys.platform.startswith("win"):
            raise RuntimeError("it is built only on Linux and macOS")
        lib = _load()
        jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(lib.numpyro_sgd_row_gather), platform="cpu")
        _state.update(ok=True, lib=lib, why="")
    except Exception as e:  # any failure leaves the host-callback reader, which is always correct
        _state.update(ok=False, why=str(e))
        if isinstance(e, UnsafeCache):
            fix = (f"Remove it or make it private (chmod 700, owned by you), or set {CACHE_ENV} to a folder only "
                   "you can write.")
        elif "compiler" in str(e) or "failed:" in str(e):
            fix = "Install a C++17 compiler (g++ or clang++, or set CXX) to use it."
        else:
            fix = f"Clear its cache ({CACHE_ENV}, default ~/.cache/numpyro_sgd) to build it again."
        warnings.warn(
            f"numpyro_sgd: the native row reader is not used ({e}); streamed rows are read by a Python host "
            f"callback instead, correct but about twice as slow a data pass. {fix}", stacklevel=4)


def can_read(parts, dtype):
    """Whether the native reader can serve the rows of ``parts`` (NumPy arrays stacked by rows:
    one array, or the memmaps of a shard directory) as ``dtype`` (the dtype JAX gives them): the
    elements of a row are evenly spaced (:func:`element_stride`: rows in C order, or a matrix of
    any strides, Fortran order included), the parts agree in dtype, row shape and strides, the
    dtype is ``dtype`` or narrows to it (:data:`CASTS`), programs run on the CPU and the reader is
    built."""
    if not parts or not all(isinstance(p, np.ndarray) and p.ndim > 0 for p in parts):
        return False
    first = parts[0]
    layout = element_stride(first)
    if layout is None or any(p.dtype != first.dtype or p.shape[1:] != first.shape[1:]
                             or p.strides[0] != first.strides[0] or element_stride(p) != layout for p in parts):
        return False
    same = np.dtype(dtype) == first.dtype
    if not (same or (first.dtype, np.dtype(dtype)) in CASTS) or sum(p.shape[0] for p in parts) == 0 \
            or jax.default_backend() != "cpu":
        return False
    return available()


def row_contiguous(array):
    """Whether each row of the NumPy ``array`` is one contiguous run of bytes in C order."""
    if array.ndim <= 1:
        return True
    expected = array.dtype.itemsize
    for size, stride in zip(reversed(array.shape[1:]), reversed(array.strides[1:])):
        if size > 1 and stride != expected:
            return False
        expected *= size
    return True


def element_stride(array):
    """The bytes from one element of a row of ``array`` to the next, where a row's elements are
    evenly spaced (rows in C order, any view of a matrix, a Fortran-order matrix: N × itemsize);
    None otherwise (a non-contiguous view of three or more dimensions)."""
    if row_contiguous(array):
        return array.dtype.itemsize
    return array.strides[1] if array.ndim == 2 else None


def rows_local(array):
    """Whether each row of ``array`` lies within its own ``|strides[0]|`` bytes, so that reading a
    row touches only the pages of that row (false for a Fortran-order matrix, whose row is spread
    over the whole array)."""
    span = array.dtype.itemsize + sum(abs(st) * (n - 1)
                                      for n, st in zip(array.shape[1:], array.strides[1:]) if n > 1)
    return array.ndim <= 1 or span <= abs(array.strides[0]) or array.shape[0] <= 1


def read_rows(parts, idx, name, dtype=None, files=()):
    """The rows ``idx`` (traced integers of any shape) of ``parts`` stacked by rows (see
    :func:`can_read`), read by the native reader, as a JAX array of ``idx.shape`` + the row
    shape, in ``dtype`` (default: the parts' own; else one that :data:`CASTS` narrows them to).
    The parts' addresses are static attributes of the program: the caller keeps ``parts`` alive
    as long as the program (a :class:`~numpyro_sgd.data.streaming.StreamedRows` holds its
    source). A row outside the data is a runtime error naming it (the words of
    ``streaming.PAST_THE_DATA``). ``files``: the :class:`~numpyro_sgd.data.streaming.FileStamp` of the
    memory-mapped files behind ``parts``; a file that changed since is a runtime error naming it
    (compared at most every 10 ms, as the callback reader does)."""
    if not available():
        raise RuntimeError(f"{name}: the native row reader is not built ({_state['why']}); read the rows with "
                           "StreamedRows(..., reader='callback').")
    idx = jnp.asarray(idx)
    if idx.dtype not in (jnp.int32, jnp.int64):
        idx = idx.astype(jnp.int32)
    first = parts[0]
    dtype = first.dtype if dtype is None else np.dtype(dtype)
    convert = 0 if dtype == first.dtype else CASTS[first.dtype, dtype]
    row_bytes = first.dtype.itemsize * int(np.prod(first.shape[1:], dtype=np.int64))
    elem_stride = element_stride(first)
    call = jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct(idx.shape + first.shape[1:], dtype),
                            vmap_method="broadcast_all")
    return call(idx, bases=np.array([p.ctypes.data for p in parts], dtype=np.uint64),
                offsets=np.cumsum([0] + [p.shape[0] for p in parts], dtype=np.int64),
                stride=np.int64(first.strides[0]), row_bytes=np.int64(row_bytes),
                item_bytes=np.int64(first.dtype.itemsize), elem_stride=np.int64(elem_stride),
                convert=np.int64(convert), name=str(name), files="\n".join(f.path for f in files),
                file_stamps=np.array([(f.size, f.mtime_ns, f.inode, f.needed) for f in files],
                                     dtype=np.int64).reshape(-1))
