"""Dataset loaders on small files written here in the official formats (never the shared data)."""

import gzip
import hashlib
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from numpyro_sgd import datasets
from numpyro_sgd.datasets import (
    DATA_ENV_VAR,
    default_data_dir,
    load_covtype,
    load_mnist,
    load_protein_casp,
    load_skin_segmentation,
    load_wine_quality,
    read_idx,
    unit_length_columns,
    verify_sha256,
)

WINE_HEADER = [
    "fixed acidity", "volatile acidity", "citric acid", "residual sugar", "chlorides", "free sulfur dioxide",
    "total sulfur dioxide", "density", "pH", "sulphates", "alcohol", "quality",
]


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    """The loaders must not see a data folder configured outside the test."""
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)


def _write(path, text, newline="\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.replace("\n", newline).encode())
    return path


# ---------------------------------------------------------------------------- Wine
def write_wine(root, rng, n=5, color="white"):
    X = np.round(rng.uniform(0, 50, (n, 11)), 3)
    y = rng.integers(3, 10, n)
    lines = [";".join(f'"{h}"' for h in WINE_HEADER)]
    lines += [";".join([*(repr(float(v)) for v in row), str(int(q))]) for row, q in zip(X, y)]
    _write(root / "wine_quality" / f"winequality-{color}.csv", "\n".join(lines) + "\n")
    return X, y


def test_wine_parses_values_and_shapes(tmp_path, rng):
    X_true, y_true = write_wine(tmp_path, rng)
    X, y = load_wine_quality(tmp_path)
    assert X.shape == (5, 11) and y.shape == (5,)
    assert X.dtype == np.float64 and y.dtype == np.float64
    np.testing.assert_array_equal(X, X_true)
    np.testing.assert_array_equal(y, y_true.astype(float))


def test_wine_red_reads_the_red_file(tmp_path, rng):
    write_wine(tmp_path, rng, n=5, color="white")
    X_red, _ = write_wine(tmp_path, rng, n=3, color="red")
    X, _ = load_wine_quality(tmp_path, color="red")
    np.testing.assert_array_equal(X, X_red)


def test_wine_bad_color_and_bad_header(tmp_path, rng):
    with pytest.raises(ValueError, match="color must be 'white' or 'red'"):
        load_wine_quality(tmp_path, color="rose")
    _write(tmp_path / "wine_quality" / "winequality-white.csv", "a;b;c\n1;2;3\n")
    with pytest.raises(ValueError, match="expected 12 ';'-separated columns"):
        load_wine_quality(tmp_path)


def test_wine_short_row(tmp_path, rng):
    write_wine(tmp_path, rng)
    path = tmp_path / "wine_quality" / "winequality-white.csv"
    path.write_text(path.read_text() + "1;2;3\n")
    with pytest.raises(ValueError, match="data row 6: expected 12 fields, got 3"):
        load_wine_quality(tmp_path)


def test_missing_file_names_path_and_fix(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="winequality-white.csv") as err:
        load_wine_quality(tmp_path)
    assert str(tmp_path) in str(err.value) and "data_dir" in str(err.value)
    # without data_dir the message points to the environment variable
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=DATA_ENV_VAR) as err:
        load_skin_segmentation()
    assert str(tmp_path / "nowhere" / "skin_segmentation" / "Skin_NonSkin.txt") in str(err.value)


# ---------------------------------------------------------------------------- Protein (CASP)
def write_casp(root, rng, n=4):
    data = np.round(rng.uniform(0, 1e4, (n, 10)), 4)
    lines = ["RMSD," + ",".join(f"F{i}" for i in range(1, 10))]
    lines += [",".join(repr(float(v)) for v in row) for row in data]
    path = _write(root / "protein_casp" / "CASP.csv", "\n".join(lines) + "\n", newline="\r\n")
    assert b"\r\n" in path.read_bytes()
    return data


def test_casp_default_drops_f9_and_crlf(tmp_path, rng):
    data = write_casp(tmp_path, rng)
    X, y = load_protein_casp(tmp_path)
    assert X.shape == (4, 8) and y.shape == (4,)
    np.testing.assert_array_equal(X, data[:, 1:9])
    np.testing.assert_array_equal(y, data[:, 0])


def test_casp_feature_selection(tmp_path, rng):
    data = write_casp(tmp_path, rng)
    X_all, _ = load_protein_casp(tmp_path, features="all")
    np.testing.assert_array_equal(X_all, data[:, 1:])
    X_sel, _ = load_protein_casp(tmp_path, features=["F9", "F2"])
    np.testing.assert_array_equal(X_sel, data[:, [9, 2]])
    with pytest.raises(ValueError, match=r"unknown feature columns \['F10'\]"):
        load_protein_casp(tmp_path, features=["F1", "F10"])
    with pytest.raises(ValueError, match="use None"):
        load_protein_casp(tmp_path, features="most")
    with pytest.raises(ValueError, match="features is empty"):
        load_protein_casp(tmp_path, features=[])


# ---------------------------------------------------------------------------- Skin
def write_skin(root, rng, n=6):
    bgr = rng.integers(0, 256, (n, 3))
    labels = np.array([1, 2, 2, 1, 2, 2][:n])
    lines = ["\t".join(str(int(v)) for v in (*row, lab)) for row, lab in zip(bgr, labels)]
    _write(root / "skin_segmentation" / "Skin_NonSkin.txt", "\n".join(lines) + "\n", newline="\r\n")
    return bgr, labels


def test_skin_values_and_label_mapping(tmp_path, rng):
    bgr, labels = write_skin(tmp_path, rng)
    X, y = load_skin_segmentation(tmp_path)
    assert X.shape == (6, 3) and X.dtype == np.float64
    np.testing.assert_array_equal(X, bgr.astype(float))
    # label 1 (skin) -> 1, label 2 (non-skin) -> 0
    np.testing.assert_array_equal(y, np.where(labels == 1, 1.0, 0.0))


def test_skin_rejects_unknown_label(tmp_path):
    _write(tmp_path / "skin_segmentation" / "Skin_NonSkin.txt", "1\t2\t3\t1\n4\t5\t6\t3\n", newline="\r\n")
    with pytest.raises(ValueError, match=r"labels \[3\]"):
        load_skin_segmentation(tmp_path)


# ---------------------------------------------------------------------------- MNIST
def idx_bytes(array, magic):
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes()


def write_mnist(root, rng, prefix="train", n=3, n_labels=None):
    images = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, n if n_labels is None else n_labels).astype(np.uint8)
    folder = root / "mnist"
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
        f.write(idx_bytes(images, 2051))
    with gzip.open(folder / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(idx_bytes(labels, 2049))
    return images, labels


def test_mnist_parses_idx(tmp_path, rng):
    images, labels = write_mnist(tmp_path, rng)
    test_images, test_labels = write_mnist(tmp_path, rng, prefix="t10k", n=2)
    X, y = load_mnist(tmp_path)
    assert X.shape == (3, 28, 28) and X.dtype == np.uint8 and y.dtype == np.int64
    np.testing.assert_array_equal(X, images)
    np.testing.assert_array_equal(y, labels)
    Xt, yt = load_mnist(tmp_path, split="test", normalize=True)
    assert Xt.dtype == np.float64
    np.testing.assert_array_equal(Xt, test_images / 255.0)
    np.testing.assert_array_equal(yt, test_labels)
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        load_mnist(tmp_path, split="valid")


def test_idx_wrong_magic(tmp_path):
    path = tmp_path / "bad.gz"
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">IIII", 2052, 1, 28, 28) + bytes(784))
    with pytest.raises(ValueError, match="magic number 2052; expected 2051"):
        read_idx(path)


def test_idx_size_mismatch(tmp_path):
    path = tmp_path / "short.gz"
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">IIII", 2051, 2, 28, 28) + bytes(784 + 5))
    with pytest.raises(ValueError, match=r"declares dimensions \(2, 28, 28\) \(1568 bytes\) but holds 789"):
        read_idx(path)


def test_idx_not_gzip(tmp_path):
    path = tmp_path / "plain.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="cannot read"):
        read_idx(path)


def test_mnist_count_mismatch_and_swapped_files(tmp_path, rng):
    write_mnist(tmp_path, rng, n=3, n_labels=2)
    with pytest.raises(ValueError, match="has 3 images but .* has 2 labels"):
        load_mnist(tmp_path)
    images, labels = write_mnist(tmp_path, rng)
    folder = tmp_path / "mnist"
    with gzip.open(folder / "train-labels-idx1-ubyte.gz", "wb") as f:
        f.write(idx_bytes(images, 2051))
    with pytest.raises(ValueError, match="magic number 2051 .* expected 2049"):
        load_mnist(tmp_path)


# ---------------------------------------------------------------------------- Covertype
def test_covtype_parses(tmp_path, rng):
    X_true = rng.integers(0, 4000, (3, 54))
    y_true = np.array([1, 7, 4])
    text = "\n".join(",".join(str(int(v)) for v in (*row, c)) for row, c in zip(X_true, y_true)) + "\n"
    (tmp_path / "covtype").mkdir()
    with gzip.open(tmp_path / "covtype" / "covtype.data.gz", "wt") as f:
        f.write(text)
    X, y = load_covtype(tmp_path)
    assert X.shape == (3, 54) and X.dtype == np.float64 and y.dtype == np.int64
    np.testing.assert_array_equal(X, X_true.astype(float))
    np.testing.assert_array_equal(y, y_true)


def test_covtype_missing_says_where_and_checksum(tmp_path):
    with pytest.raises(FileNotFoundError, match=datasets.KNOWN_SHA256["covtype/covtype.data.gz"]) as err:
        load_covtype(tmp_path)
    assert str(tmp_path / "covtype") in str(err.value)


def test_covtype_bad_class(tmp_path):
    (tmp_path / "covtype").mkdir()
    with gzip.open(tmp_path / "covtype" / "covtype.data.gz", "wt") as f:
        f.write(",".join(["1"] * 54 + ["8"]) + "\n")
    with pytest.raises(ValueError, match="classes outside 1..7"):
        load_covtype(tmp_path)


# ---------------------------------------------------------------------------- checksums
def test_verify_sha256(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(3000))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert verify_sha256(path, digest.upper()) == digest
    with pytest.raises(ValueError, match="expected 00"):
        verify_sha256(path, "00" * 32)


def test_loader_verify_rejects_a_different_file(tmp_path, rng):
    write_wine(tmp_path, rng)
    load_wine_quality(tmp_path)  # no verification by default
    with pytest.raises(ValueError, match="replace it with the official file"):
        load_wine_quality(tmp_path, verify=True)


# ---------------------------------------------------------------------------- data folder
def test_default_data_dir_order(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path / "custom"))
    assert default_data_dir() == (tmp_path / "custom").resolve()
    monkeypatch.delenv(DATA_ENV_VAR)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert default_data_dir() == (tmp_path / "shared" / "data").resolve()
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")  # ../shared/data does not exist from here
    repo_root = Path(datasets.__file__).resolve().parent.parent
    assert default_data_dir() == (repo_root / ".." / "shared" / "data").resolve()


def test_loader_uses_env_var(tmp_path, rng, monkeypatch):
    bgr, _ = write_skin(tmp_path, rng)
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))
    X, _ = load_skin_segmentation()
    np.testing.assert_array_equal(X, bgr.astype(float))


# ---------------------------------------------------------------------------- rescaling
def test_unit_length_columns(rng):
    X = rng.normal(3.0, 2.0, (50, 4)) * np.array([1.0, 10.0, 1e3, 1e-3])
    Z = unit_length_columns(X)
    np.testing.assert_allclose(np.linalg.norm(Z, axis=0), 1.0, rtol=1e-13)
    # a rescaling per column: the ratio to the input is constant within each column
    ratio = Z / X
    np.testing.assert_allclose(ratio, np.broadcast_to(ratio[0], X.shape), rtol=1e-13)
    assert np.all(ratio > 0)


def test_unit_length_columns_errors():
    with pytest.raises(ValueError, match=r"columns \[1\] have zero"):
        unit_length_columns(np.array([[1.0, 0.0], [2.0, 0.0]]))
    with pytest.raises(ValueError, match="must be 2-D"):
        unit_length_columns(np.ones(3))
