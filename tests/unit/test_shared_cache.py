"""The file-locked cache behind the run-wide fixtures: built once however many processes ask, never half-built."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from tests.shared_cache import shared_dir


class _Factory:
    """The part of pytest's TempPathFactory that shared_dir reads."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def getbasetemp(self) -> Path:
        return self.base


def _ask(base: str, log: str) -> str:
    def build(folder: Path) -> None:
        with open(log, "a") as f:
            f.write("built\n")
        (folder / "model.bin").write_bytes(b"x" * 1000)

    return str(shared_dir(_Factory(Path(base)), "models", build))  # type: ignore[arg-type]


def test_many_processes_asking_at_once_build_it_once(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    log = tmp_path / "log"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        folders = pool.starmap(_ask, [(str(tmp_path), str(log))] * 8)
    assert len(set(folders)) == 1 and log.read_text() == "built\n"
    assert (Path(folders[0]) / "model.bin").stat().st_size == 1000


def test_a_failed_build_leaves_nothing_used_and_the_next_ask_builds_again(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory = _Factory(tmp_path)

    def failing(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"x")
        raise RuntimeError("the build broke")

    with pytest.raises(RuntimeError, match="the build broke"):
        shared_dir(factory, "models", failing)  # type: ignore[arg-type]
    folder = shared_dir(factory, "models", lambda f: (f / "whole.bin").write_bytes(b"y"))  # type: ignore[arg-type]
    assert sorted(p.name for p in folder.iterdir()) == [".built", "whole.bin"]


def test_workers_of_one_run_share_the_folder_beside_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    worker_base = tmp_path / "popen-gw1"
    worker_base.mkdir()
    folder = shared_dir(_Factory(worker_base), "models", lambda f: None)  # type: ignore[arg-type]
    assert folder == tmp_path / "shared" / "models"
