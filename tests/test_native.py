"""The native row reader's cache: only a library this user built, in a folder only this user can
write, and whose bytes match the sha256 recorded when it was built, is ever loaded.

Each scenario loads the reader in a fresh process (a loaded library stays in its process), with
``NUMPYRO_SGD_CACHE`` pointing at a folder of the test's. The planted library is a harmless one
whose constructor writes a marker file when it is loaded: the marker must never appear.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from numpyro_sgd.data import native

CXX = shutil.which(os.environ.get("CXX", "c++"))
needs_compiler = pytest.mark.skipif(CXX is None, reason="no C++ compiler on this machine to build a library with")

PLANTED = r"""
#include <cstdio>
#include <cstdlib>
__attribute__((constructor)) static void planted() {
  const char* path = std::getenv("PLANTED_MARKER");
  if (path) { FILE* f = std::fopen(path, "w"); if (f) { std::fputs("loaded", f); std::fclose(f); } }
}
"""

LOAD = textwrap.dedent("""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from numpyro_sgd.data import native
        print("AVAILABLE", native.available())
    for w in caught:
        print("WARNING", str(w.message))
""")


def load_in_a_fresh_process(cache, marker):
    """``(available, [warning texts])`` of ``native.available()`` in a new process."""
    env = dict(os.environ, NUMPYRO_SGD_CACHE=str(cache), PLANTED_MARKER=str(marker))
    out = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    available = next(line for line in lines if line.startswith("AVAILABLE")).split()[1] == "True"
    return available, [line[len("WARNING "):] for line in lines if line.startswith("WARNING")]


def planted_library(path):
    """Compile the marker-writing library to ``path``."""
    source = path.with_suffix(".cc")
    source.write_text(PLANTED)
    subprocess.run([CXX, "-shared", "-fPIC", str(source), "-o", str(path)], check=True, capture_output=True)
    source.unlink()
    return path


def record(folder, key, library):
    """Write the record that names ``library`` with its true sha256 (what the reader's own build writes)."""
    digest = hashlib.sha256(library.read_bytes()).hexdigest()
    named = folder / f"row_gather-{key}-{digest}.so"
    library.rename(named)
    (folder / f"row_gather-{key}.sha256").write_text(digest)
    return named


@needs_compiler
def test_a_folder_others_can_write_is_refused_and_nothing_in_it_is_loaded(tmp_path):
    """A cache folder with mode 0777 holding a library recorded as the reader (the planted file
    under its own true hash): not loaded; the warning names the folder, its mode and the fix; the
    rows are then read by the callback (``available()`` is False)."""
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    cache.mkdir()
    record(cache, native.library_key(), planted_library(tmp_path / "planted.so"))
    cache.chmod(0o777)
    available, warned = load_in_a_fresh_process(cache, marker)
    assert not available and not marker.exists()
    assert len(warned) == 1, warned
    assert str(cache) in warned[0] and "can be written by group or others (mode 777)" in warned[0], warned
    assert "NUMPYRO_SGD_CACHE" in warned[0] and "chmod 700" in warned[0], warned


@needs_compiler
def test_a_library_that_does_not_match_its_record_is_not_loaded_and_is_rebuilt(tmp_path):
    """In a private folder: a planted library at the path the reader used to load unverified
    (``row_gather-<key>.so``), and one named by the record but with other bytes than recorded.
    Neither is loaded; the reader is compiled again once (one warning saying so), and a second
    process loads the rebuilt one with no warning."""
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    cache.mkdir(mode=0o700)
    key = native.library_key()
    planted_library(cache / f"row_gather-{key}.so")
    named = record(cache, key, planted_library(tmp_path / "planted.so"))
    (cache / f"row_gather-{key}.sha256").write_text("0" * 64)
    named.rename(cache / f"row_gather-{key}-{'0' * 64}.so")
    available, warned = load_in_a_fresh_process(cache, marker)
    assert available and not marker.exists()
    assert len(warned) == 1 and "does not match the sha256 recorded" in warned[0] and "built again" in warned[0]
    assert load_in_a_fresh_process(cache, marker) == (True, [])
    assert not marker.exists()


@needs_compiler
def test_a_corrupt_recorded_library_is_rebuilt_once(tmp_path):
    """A library whose bytes match the record but that the dynamic loader refuses (garbage, as a
    truncated write leaves): it is compiled again once, then loads."""
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    cache.mkdir(mode=0o700)
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"\x7fELF not a library")
    record(cache, native.library_key(), garbage)
    available, warned = load_in_a_fresh_process(cache, marker)
    assert available and len(warned) == 1 and "built again" in warned[0], warned


def test_a_cache_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    """A cache folder owned by another user (this process pretends to be user id 4242) is refused
    with its path; so is the shared temporary folder's ``numpyro_sgd-<uid>`` fallback when another
    user could write it, where the folder the user's own cache would be cannot be created."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("NUMPYRO_SGD_CACHE", str(cache))
    assert native.cache_dir() == cache
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    with pytest.raises(native.UnsafeCache, match=f"{cache} is owned by user id .*not by this user \\(4242\\)"):
        native.cache_dir()
    monkeypatch.undo()
    # the fallback: ~/.cache is a file (so nothing can be created under it) and the shared
    # temporary folder already holds a numpyro_sgd-<uid> that others can write
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    shared = tmp_path / "tmp"
    shared.mkdir()
    fallback = shared / f"numpyro_sgd-{os.getuid()}"
    fallback.mkdir()
    fallback.chmod(0o777)
    monkeypatch.delenv("NUMPYRO_SGD_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    with pytest.raises(native.UnsafeCache, match=f"{fallback} can be written by group or others"):
        native.cache_dir()
    fallback.chmod(0o700)
    assert native.cache_dir() == fallback
    # a new cache folder is created private
    monkeypatch.setenv("NUMPYRO_SGD_CACHE", str(tmp_path / "new" / "cache"))
    assert (native.cache_dir().stat().st_mode & 0o777) == 0o700
