"""Fixtures built once per test run, whatever the number of pytest-xdist workers: file-locked caches.

A session fixture runs once in each worker process. For what is expensive to build (trained
models, bundles, virtualenvs) that would mean building it once per worker. :func:`shared_dir`
builds it once per run instead: in a folder every worker of the run sees (beside the workers'
own temp folders), under an exclusive ``flock``; the first worker builds, the others wait and
then read what it built. A build that fails leaves no marker, so the next worker tries again
and fails the same way (a half-built folder is never used: it is removed before a retry).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

__all__ = ["shared_dir", "run_root"]

_DONE = ".built"


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder shared by every worker of this run (the run's own temp folder when there are no workers)."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's base is <run>/popen-gwN; without it, the base is the run's own folder.
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    shared = root / "shared"
    shared.mkdir(exist_ok=True)
    return shared


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``name``'s folder for this run, made by ``build(folder)`` in the first worker that asks for it."""
    root = run_root(tmp_path_factory)
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (folder / _DONE).exists():
                shutil.rmtree(folder, ignore_errors=True)  # what a failed build left
                folder.mkdir()
                build(folder)
                (folder / _DONE).touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return folder
