"""Loaders for the benchmark datasets of the reference papers, from local files only.

Nothing here downloads anything. Every loader reads the official file format from a local
folder ``data_dir`` that holds one sub-folder per dataset::

    data_dir/
        wine_quality/winequality-white.csv, winequality-red.csv
        protein_casp/CASP.csv
        skin_segmentation/Skin_NonSkin.txt
        mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
        covtype/covtype.data.gz            (optional)

``data_dir=None`` means :func:`default_data_dir`. A missing file raises
:class:`FileNotFoundError` naming the path that was tried and how to point the loader
elsewhere; a malformed file raises :class:`ValueError` naming the file and the problem.

Datasets (used by Mandt, Hoffman & Blei 2017, Sec. 6.1 / Table 1, and by Li, Wang, Zha & Tao,
EWSG, Sec. 5):

* UCI Wine Quality (Cortez et al. 2009): :func:`load_wine_quality`;
* UCI Physicochemical Properties of Protein Tertiary Structure (Rana 2013): :func:`load_protein_casp`;
* UCI Skin Segmentation (Bhatt & Dhall 2009): :func:`load_skin_segmentation`;
* MNIST (LeCun et al. 1998): :func:`load_mnist`;
* UCI Covertype (Blackard 1998): :func:`load_covtype`.

Checksums are verified only on request (``verify=True``), since hashing costs as much as
reading the file.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import os
import struct
from pathlib import Path

import numpy as np

__all__ = [
    "DATA_ENV_VAR",
    "shuffle_rows",
    "shuffle_to",
    "default_data_dir",
    "verify_sha256",
    "read_idx",
    "load_wine_quality",
    "load_protein_casp",
    "load_skin_segmentation",
    "load_mnist",
    "load_covtype",
    "unit_length_columns",
    "process_rows",
    "load_process_rows",
]

#: environment variable that overrides the default data folder
DATA_ENV_VAR = "NUMPYRO_SGD_DATA"

#: published sha256 of the official files (the ``SHA256SUMS`` files published with the data; for
#: ``CASP.csv`` no official checksum exists and the value is that of the checked local copy)
KNOWN_SHA256 = {
    "wine_quality/winequality-white.csv": "76c3f809815c17c07212622f776311faeb31e87610d52c26d87d6e361b169836",
    "wine_quality/winequality-red.csv": "4a402cf041b025d4566d954c3b9ba8635a3a8a01e039005d97d6a710278cf05e",
    "protein_casp/CASP.csv": "712d2759f8113622a3ba93a47e451397147df946111f6ffdd8c655385d564aef",
    "skin_segmentation/Skin_NonSkin.txt": "e30c0a845385dcc95a45c45ed263465674a49638e98ef740afd520769c7714a4",
    "mnist/train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "mnist/train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "mnist/t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "mnist/t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    "covtype/covtype.data.gz": "614360d0257557dd1792834a85a1cdebfadc3c4f30b011d56afee7ffb5b15771",
}

_IDX_MAGIC = {2051: ("images", 3), 2049: ("labels", 1)}


# ---------------------------------------------------------------------------- locating files
def default_data_dir():
    """The folder that holds the dataset sub-folders, when ``data_dir`` is not given.

    The first of these that applies:

    1. ``$NUMPYRO_SGD_DATA`` if the environment variable is set (even if the folder does not
       exist: the loaders then say so);
    2. in a development checkout, the project's data folder beside the working directory, if it
       exists;
    3. the same folder beside the repository root, whether or not it exists.

    Users pass ``data_dir`` (a folder they downloaded the files to) or set the variable.

    :return: a :class:`pathlib.Path` (absolute, resolved).
    """
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    from_cwd = Path.cwd() / ".." / "shared" / "data"
    if from_cwd.is_dir():
        return from_cwd.resolve()
    repo_root = Path(__file__).resolve().parent.parent
    return (repo_root / ".." / "shared" / "data").resolve()


def _dataset_file(data_dir, relative, loader):
    """``data_dir / relative`` after checking that it exists (else a FileNotFoundError that says how to fix it)."""
    base = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    path = base / relative
    if not path.is_file():
        how = (
            f"pass data_dir= (the folder that contains '{Path(relative).parts[0]}/') or set "
            f"${DATA_ENV_VAR}" if data_dir is None
            else f"check data_dir={str(data_dir)!r}: it must contain '{relative}'"
        )
        raise FileNotFoundError(f"{loader}: dataset file not found: {path}; {how}.")
    return path


def verify_sha256(path, expected):
    """Raise ``ValueError`` unless the sha256 of the file ``path`` is ``expected`` (hex).

    Reads the file in 1 MiB blocks.

    :param path: file to check.
    :param str expected: the expected hex digest (case-insensitive).
    :return: the digest (str) when it matches.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    got = digest.hexdigest()
    if got != expected.strip().lower():
        raise ValueError(
            f"verify_sha256: {path} has sha256 {got}, expected {expected}; the file is corrupt, "
            "truncated or a different version: replace it with the official file."
        )
    return got


def _maybe_verify(path, relative, verify):
    if verify:
        verify_sha256(path, KNOWN_SHA256[relative])


# ---------------------------------------------------------------------------- Wine Quality
def load_wine_quality(data_dir=None, color="white", verify=False):
    """UCI Wine Quality (Cortez et al. 2009): 11 physico-chemical features and the quality score.

    Reads ``wine_quality/winequality-{color}.csv``: ``;``-separated, one header line with quoted
    column names, the target ``quality`` (an integer score) in the last column.

    :param data_dir: folder containing ``wine_quality/`` (default :func:`default_data_dir`).
    :param str color: ``"white"`` (4,898 wines, used by Mandt et al. 2017, Sec. 6.1) or ``"red"`` (1,599).
    :param bool verify: check the file's published sha256 first.
    :return: ``(X, y)``: float64 arrays of shape (n, 11) and (n,) (quality as float).
    """
    if color not in ("white", "red"):
        raise ValueError(f"load_wine_quality: color must be 'white' or 'red', got {color!r}.")
    relative = f"wine_quality/winequality-{color}.csv"
    path = _dataset_file(data_dir, relative, "load_wine_quality")
    _maybe_verify(path, relative, verify)
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter=";"))
    if not rows:
        raise ValueError(f"load_wine_quality: {path} is empty.")
    header = [h.strip() for h in rows[0]]
    if len(header) != 12 or header[-1] != "quality":
        raise ValueError(
            f"load_wine_quality: {path} has header {header}; expected 12 ';'-separated columns ending with "
            "'quality' (the UCI winequality-*.csv format)."
        )
    data = _rows_to_float(rows[1:], 12, path, "load_wine_quality")
    return data[:, :11], data[:, 11]


def _rows_to_float(rows, ncols, path, loader):
    """Rows of strings -> float64 array, skipping blank lines, with a clear error for a bad row."""
    rows = [r for r in rows if any(field.strip() for field in r)]
    for i, r in enumerate(rows):
        if len(r) != ncols:
            raise ValueError(f"{loader}: {path}, data row {i + 1}: expected {ncols} fields, got {len(r)}.")
    if not rows:
        raise ValueError(f"{loader}: {path} has no data rows.")
    try:
        return np.array(rows, dtype=np.float64)
    except ValueError as e:
        raise ValueError(f"{loader}: {path} contains a non-numeric value ({e}).") from e


# ---------------------------------------------------------------------------- Protein (CASP)
_CASP_DEFAULT_FEATURES = tuple(f"F{i}" for i in range(1, 9))


def load_protein_casp(data_dir=None, features=None, verify=False):
    """UCI Physicochemical Properties of Protein Tertiary Structure (``CASP.csv``, Rana 2013).

    Reads ``protein_casp/CASP.csv``: comma-separated with a header ``RMSD,F1,...,F9`` (CRLF line
    endings are fine); the target is ``RMSD``.

    .. note:: The file has 9 features, but Mandt et al. (2017, Sec. 6.1) report "8 features" and
       do not say which one they dropped. The default keeps ``F1``–``F8`` and drops ``F9``, as
       the common public loaders do (``df.iloc[:, 1:9]``); pass ``features="all"`` for all nine.

    :param data_dir: folder containing ``protein_casp/`` (default :func:`default_data_dir`).
    :param features: ``None`` (``F1``–``F8``), ``"all"`` (``F1``–``F9``) or a sequence of column
        names from the header, in the order wanted.
    :param bool verify: check the file's sha256 (that of the checked local copy) first.
    :return: ``(X, y)``: float64 arrays of shape (45730, len(features)) and (45730,).
    """
    if features is None:
        features = _CASP_DEFAULT_FEATURES
    elif isinstance(features, str):
        if features != "all":
            raise ValueError(
                f"load_protein_casp: features={features!r}; use None (F1-F8), 'all' (F1-F9) or a "
                "list of column names such as ['F1', 'F2']."
            )
        features = None  # resolved from the header
    else:
        features = tuple(features)
        if not features:
            raise ValueError("load_protein_casp: features is empty; give at least one column name, e.g. ['F1'].")
    relative = "protein_casp/CASP.csv"
    path = _dataset_file(data_dir, relative, "load_protein_casp")
    _maybe_verify(path, relative, verify)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"load_protein_casp: {path} is empty.")
    header = [h.strip() for h in rows[0]]
    if "RMSD" not in header:
        raise ValueError(f"load_protein_casp: {path} has no 'RMSD' column (header {header}).")
    available = [h for h in header if h != "RMSD"]
    if features is None:
        features = tuple(available)
    unknown = [f for f in features if f not in available]
    if unknown:
        raise ValueError(f"load_protein_casp: unknown feature columns {unknown}; the file has {available}.")
    data = _rows_to_float(rows[1:], len(header), path, "load_protein_casp")
    cols = [header.index(f) for f in features]
    return data[:, cols], data[:, header.index("RMSD")]


# ---------------------------------------------------------------------------- Skin segmentation
def load_skin_segmentation(data_dir=None, verify=False):
    """UCI Skin Segmentation (Bhatt & Dhall 2009): B, G, R values and a skin / non-skin label.

    Reads ``skin_segmentation/Skin_NonSkin.txt``: tab-separated integers ``B G R label`` without
    a header (CRLF line endings are fine), label 1 = skin, 2 = non-skin.

    :param data_dir: folder containing ``skin_segmentation/`` (default :func:`default_data_dir`).
    :param bool verify: check the file's published sha256 first.
    :return: ``(X, y)``: float64 arrays of shape (n, 3) (columns B, G, R in 0..255) and (n,),
        with ``y = 1.0`` for skin (label 1) and ``0.0`` for non-skin (label 2).
    """
    relative = "skin_segmentation/Skin_NonSkin.txt"
    path = _dataset_file(data_dir, relative, "load_skin_segmentation")
    _maybe_verify(path, relative, verify)
    try:
        data = np.loadtxt(path, dtype=np.int64, ndmin=2)
    except ValueError as e:
        raise ValueError(f"load_skin_segmentation: {path} is not a table of integers ({e}).") from e
    if data.shape[0] == 0 or data.shape[1] != 4:
        raise ValueError(
            f"load_skin_segmentation: {path} has shape {data.shape}; expected 4 columns (B, G, R, label)."
        )
    labels = data[:, 3]
    bad = np.setdiff1d(np.unique(labels), [1, 2])
    if bad.size:
        raise ValueError(f"load_skin_segmentation: {path} has labels {bad.tolist()}; expected only 1 (skin) and 2.")
    return data[:, :3].astype(np.float64), (labels == 1).astype(np.float64)


# ---------------------------------------------------------------------------- MNIST (IDX)
def read_idx(path):
    """Read an IDX file (gzip'd if the name ends in ``.gz``) of unsigned bytes.

    The header is a big-endian magic number (2051 for images with 3 dimensions, 2049 for labels
    with 1 dimension: two zero bytes, the data type 0x08 = unsigned byte, the number of
    dimensions) followed by one big-endian uint32 per dimension.

    :return: a uint8 array with the dimensions of the header.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"read_idx: cannot read {path} ({e}); is it a complete gzip'd IDX file?") from e
    if len(raw) < 4:
        raise ValueError(f"read_idx: {path} is too short ({len(raw)} bytes) to hold an IDX header.")
    (magic,) = struct.unpack(">I", raw[:4])
    if magic not in _IDX_MAGIC:
        raise ValueError(
            f"read_idx: {path} has magic number {magic}; expected 2051 (images) or 2049 (labels) "
            "for an MNIST IDX file of unsigned bytes."
        )
    ndim = _IDX_MAGIC[magic][1]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"read_idx: {path} ends inside its header ({len(raw)} < {header} bytes).")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != expected:
        raise ValueError(
            f"read_idx: {path} declares dimensions {dims} ({expected} bytes) but holds "
            f"{len(raw) - header} data bytes; the file is truncated or corrupt."
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_mnist(data_dir=None, split="train", normalize=False, verify=False):
    """MNIST handwritten digits (LeCun et al. 1998) from the four original gzip'd IDX files.

    :param data_dir: folder containing ``mnist/`` (default :func:`default_data_dir`).
    :param str split: ``"train"`` (60,000 images) or ``"test"`` (10,000, the ``t10k-*`` files).
    :param bool normalize: return float64 pixels in [0, 1] instead of uint8 in 0..255.
    :param bool verify: check the files' published sha256 first.
    :return: ``(images, labels)``: images of shape (n, 28, 28), uint8 (or float64 with
        ``normalize=True``), and int64 labels 0..9 of shape (n,).
    """
    if split not in ("train", "test"):
        raise ValueError(f"load_mnist: split must be 'train' or 'test', got {split!r}.")
    prefix = "train" if split == "train" else "t10k"
    arrays = []
    for kind, magic in (("images-idx3", 2051), ("labels-idx1", 2049)):
        relative = f"mnist/{prefix}-{kind}-ubyte.gz"
        path = _dataset_file(data_dir, relative, "load_mnist")
        _maybe_verify(path, relative, verify)
        arr = read_idx(path)
        want_ndim = _IDX_MAGIC[magic][1]
        if arr.ndim != want_ndim:
            found = 2051 if arr.ndim == 3 else 2049
            raise ValueError(
                f"load_mnist: {path} has IDX magic number {found} ({_IDX_MAGIC[found][0]}); expected "
                f"{magic} ({_IDX_MAGIC[magic][0]}). Are the images and labels files swapped?"
            )
        arrays.append((path, arr))
    (img_path, images), (lab_path, labels) = arrays
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"load_mnist: {img_path} has {images.shape[0]} images but {lab_path} has {labels.shape[0]} labels."
        )
    if labels.size and labels.max() > 9:
        raise ValueError(f"load_mnist: {lab_path} has a label {int(labels.max())} > 9.")
    images = images.astype(np.float64) / 255.0 if normalize else images.copy()
    return images, labels.astype(np.int64)


# ---------------------------------------------------------------------------- Covertype
def load_covtype(data_dir=None, verify=False):
    """UCI Covertype (Blackard 1998): 54 cartographic features and the forest cover type 1..7.

    Reads ``covtype/covtype.data.gz`` (the UCI file: 581,012 rows of 55 comma-separated integers,
    no header; 54 features then the class). The file is not shipped; put the official
    ``covtype.data.gz`` (sha256 ``614360d0…15771``, see ``KNOWN_SHA256``) into
    ``data_dir/covtype/``. Nothing is downloaded.

    :param data_dir: folder containing ``covtype/`` (default :func:`default_data_dir`).
    :param bool verify: check the file's published sha256 first.
    :return: ``(X, y)``: float64 features of shape (n, 54) and int64 classes 1..7 of shape (n,).
    """
    relative = "covtype/covtype.data.gz"
    base = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    path = base / relative
    if not path.is_file():
        raise FileNotFoundError(
            f"load_covtype: {path} not found. Covertype is not shipped: place the official UCI file "
            f"covtype.data.gz (11,240,707 bytes, sha256 {KNOWN_SHA256[relative]}) in {base / 'covtype'}, "
            f"or pass data_dir= / set ${DATA_ENV_VAR} to the folder that contains 'covtype/'."
        )
    _maybe_verify(path, relative, verify)
    try:
        with gzip.open(path, "rt") as f:
            data = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"load_covtype: cannot parse {path} ({e}); expected gzip'd comma-separated integers.") from e
    if data.shape[0] == 0 or data.shape[1] != 55:
        raise ValueError(f"load_covtype: {path} has shape {data.shape}; expected 55 columns (54 features, class).")
    y = data[:, 54]
    if y.min() < 1 or y.max() > 7:
        raise ValueError(f"load_covtype: {path} has classes outside 1..7 (min {y.min()}, max {y.max()}).")
    return data[:, :54].astype(np.float64), y.copy()


# ---------------------------------------------------------------------------- preprocessing
def unit_length_columns(X):
    """Rescale every feature column of ``X`` to unit Euclidean length: X[:, k] / ‖X[:, k]‖₂.

    Mandt et al. (2017), Sec. 6.1, write "We rescaled the feature to unit length" for the
    Table 1 experiments. The sentence does not say along which axis; this function implements
    the per-feature reading (each column, i.e. one feature over all N data points, gets norm 1),
    with no centering (the paper mentions none). After it Xᵀ X has a unit diagonal.

    :param X: array of shape (N, D).
    :return: float64 array of the same shape.

    .. doctest::

        >>> import numpy as np
        >>> Z = unit_length_columns(np.array([[3.0, 1.0], [4.0, 1.0]]))
        >>> np.linalg.norm(Z, axis=0).round(12).tolist()
        [1.0, 1.0]
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"unit_length_columns: X must be 2-D (N, D), got shape {X.shape}.")
    norms = np.linalg.norm(X, axis=0)
    zero = np.flatnonzero(~(norms > 0) | ~np.isfinite(norms))
    if zero.size:
        raise ValueError(
            f"unit_length_columns: columns {zero.tolist()} have zero or non-finite length and cannot be "
            "rescaled; drop them first."
        )
    return X / norms


# ---------------------------------------------------------------------------- row order
def shuffle_rows(*arrays, seed=0, chunk_rows=1 << 16):
    """The arrays with their rows in one common random order (one new copy of each).

    The kernels' default minibatch law at large N reads clusters of consecutive rows
    (:func:`~numpyro_sgd.minibatch.with_replacement.cluster_indices`); its noise is that of random rows only when
    the rows are in random order, and a kernel that finds them ordered (sorted by the response, a
    time stamp, a group) warns and draws random rows instead. Shuffle once, before the run::

        X, y = shuffle_rows(X, y, seed=0)

    :param arrays: arrays (NumPy, memory-mapped or JAX) with the same number of rows N.
    :param int seed: seed of the permutation.
    :param int chunk_rows: rows copied at a time from a memory-mapped source.
    :return: a tuple of NumPy arrays (one array for one input).
    """
    if not arrays:
        raise ValueError("shuffle_rows: pass at least one array.")
    n = np.shape(arrays[0])[0] if np.ndim(arrays[0]) else None
    if n is None or any(np.ndim(a) == 0 or np.shape(a)[0] != n for a in arrays):
        raise ValueError(f"shuffle_rows: every array needs the same number of rows; got shapes "
                         f"{[np.shape(a) for a in arrays]}.")
    order = np.random.default_rng(seed).permutation(n)
    out = []
    for a in arrays:
        if isinstance(a, np.memmap):  # read in sorted chunks of the target order (no N-sized temporary)
            dest = np.empty(a.shape, a.dtype)
            for start in range(0, n, chunk_rows):
                dest[start:start + chunk_rows] = a[order[start:start + chunk_rows]]
            out.append(dest)
        else:
            out.append(np.asarray(a)[order])
    return out[0] if len(out) == 1 else tuple(out)


def shuffle_to(src, dst, *, seed=0, memory_bytes=1 << 30, chunk_rows=1 << 16):
    """Write the rows of the ``.npy`` file(s) ``src`` in one random order to new ``.npy`` file(s)
    ``dst``, in bounded memory (about ``memory_bytes`` plus a chunk), never holding a file whole.

    The streamed kernels read clusters of consecutive rows, whose noise is that of random rows only
    when the file is in random order (a file sorted by time, label or group makes the kernel warn
    and fall back to random rows, which read slower). Two passes over the data (Sanders' scatter
    shuffle): each row goes to one of K = ⌈bytes / memory_bytes⌉ temporary buckets, uniformly
    and independently; each bucket is then read whole, permuted uniformly and appended. The
    result is a uniformly random permutation, the same for every file of ``src``::

        shuffle_to(["X.npy", "y.npy"], ["X_shuffled.npy", "y_shuffled.npy"], seed=0)

    :param src: a path, or a list of paths of arrays with the same number of rows.
    :param dst: the new path(s), as many as ``src``; the bucket files go to a temporary folder
        beside the first.
    :return: the number of buckets used.
    """
    import shutil
    import tempfile

    srcs = [src] if isinstance(src, (str, os.PathLike)) else list(src)
    dsts = [dst] if isinstance(dst, (str, os.PathLike)) else list(dst)
    if len(srcs) != len(dsts) or not srcs:
        raise ValueError(f"shuffle_to: give as many destinations as sources; got {len(srcs)} and {len(dsts)}.")
    arrays = [np.load(p, mmap_mode="r") for p in srcs]
    n = arrays[0].shape[0] if arrays[0].ndim else None
    if n is None or any(a.ndim == 0 or a.shape[0] != n for a in arrays):
        raise ValueError("shuffle_to: every file needs the same number of rows; got shapes "
                         f"{[a.shape for a in arrays]}.")
    row_bytes = sum(a.dtype.itemsize * int(np.prod(a.shape[1:])) for a in arrays)
    buckets = max(1, -(-n * row_bytes // int(memory_bytes)))
    rng = np.random.default_rng(seed)
    tmp = tempfile.mkdtemp(prefix="shuffle_to_", dir=os.path.dirname(os.path.abspath(dsts[0])))
    try:
        files = [[open(os.path.join(tmp, f"{i}_{j}.bin"), "wb") for j in range(buckets)] for i in range(len(arrays))]
        counts = np.zeros(buckets, np.int64)
        for start in range(0, n, chunk_rows):
            labels = rng.integers(0, buckets, min(chunk_rows, n - start))
            counts += np.bincount(labels, minlength=buckets)
            for a, out in zip(arrays, files):
                rows = np.ascontiguousarray(a[start:start + chunk_rows])
                for j in range(buckets):
                    rows[labels == j].tofile(out[j])
        for out in files:
            for f in out:
                f.close()
        targets = [np.lib.format.open_memmap(p, mode="w+", dtype=a.dtype, shape=a.shape) for p, a in zip(dsts, arrays)]
        position = 0
        for j in range(buckets):
            order = rng.permutation(int(counts[j]))
            for i, (a, t) in enumerate(zip(arrays, targets)):
                block = np.fromfile(os.path.join(tmp, f"{i}_{j}.bin"), a.dtype).reshape((-1,) + a.shape[1:])
                t[position:position + counts[j]] = block[order]
            position += int(counts[j])
        for t in targets:
            t.flush()
        del targets
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return buckets


# ---------------------------------------------------------------------------- one process's rows
def process_rows(num_rows, process_index=None, process_count=None):
    """The contiguous block of rows this process holds when ``num_rows`` rows are split evenly
    over the processes of a ``jax.distributed`` run, in the order of a mesh built from
    ``jax.devices()`` (one device per process, or the same number each).

    :param int num_rows: N, divisible by the process count.
    :param process_index: and ``process_count``: default ``jax.process_index()`` and ``jax.process_count()``.
    :return: ``slice(p·N/P, (p+1)·N/P)``.
    """
    import jax

    p = jax.process_index() if process_index is None else process_index
    count = jax.process_count() if process_count is None else process_count
    if num_rows % count:
        raise ValueError(f"process_rows: {num_rows} rows do not split evenly over {count} processes; trim or pad "
                         "the data to a multiple of the process count.")
    per = num_rows // count
    return slice(p * per, (p + 1) * per)


def load_process_rows(path, mesh, axis="data", dtype=None):
    """A global ``jax.Array`` of the ``.npy`` file ``path``, sharded along ``axis`` of ``mesh``, of
    which this process reads only its own rows (:func:`process_rows`; the file is memory-mapped, so
    the other processes' rows are never read). Every process calls it with the same arguments.

    :param path: a ``.npy`` file of shape (N, ...), N divisible by the process count.
    :param mesh: the ``jax.sharding.Mesh`` of the run (``SGKernel(..., mesh=mesh)``).
    :param dtype: convert the local rows to this dtype (e.g. ``np.float32``); default: the file's.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    data = np.load(path, mmap_mode="r")
    local = np.ascontiguousarray(data[process_rows(data.shape[0])], dtype=dtype)
    return jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec(axis)), local, data.shape)
