"""Durable file writes: a file is either whole under its final name or absent.

Every writer in edgesdk (bundles, the device store, converter outputs) goes through
these, so "no half-written file is ever loaded" is implemented once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["fsync_dir", "fsync_file", "write_atomic", "atomic_path", "atomic_dir"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (a rename is durable only after this)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file's data and metadata to disk (its directory entry needs :func:`fsync_dir`)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextmanager
def atomic_path(path: str | os.PathLike[str], mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync it and rename it over ``path``."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", dir=final.parent)
    os.fchmod(fd, mode)  # mkstemp makes 0600
    os.close(fd)
    try:
        yield Path(tmp)
        fsync_file(tmp)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` through :func:`atomic_path` and return ``path``."""
    with atomic_path(path, mode) as tmp:
        tmp.write_bytes(data)
    return Path(path)


@contextmanager
def atomic_dir(path: str | os.PathLike[str], mode: int = 0o755) -> Iterator[Path]:
    """Yield an empty staging directory beside ``path``; on success rename it to ``path``.

    The caller writes (and fsyncs) the files; entries are flushed before and after the
    rename. On any error the staging directory is removed and ``path`` never appears.
    The directory gets ``mode`` (mkdtemp makes 0700, which would hide a model store's slots
    from an app running as another user).
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield staging
        os.chmod(staging, mode)
        fsync_dir(staging)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fsync_dir(final.parent)
