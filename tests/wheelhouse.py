"""The project's wheel and its base install, built once per run for the tests that need a device-side install.

:func:`wheelhouse` builds ``edgesdk-*.whl`` from the checkout and downloads the wheels of its
base requirements beside it (``pip download``, from pip's own cache after the first run), so a
venv can install it offline (``pip install --no-index --find-links``). :func:`device_venv` is a
fresh venv with that base install only. Both are file-locked caches (:mod:`tests.shared_cache`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared_cache import shared_dir

__all__ = ["wheelhouse", "project_wheel", "device_venv"]

ROOT = Path(__file__).resolve().parents[1]


def _build(folder: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(folder), str(ROOT)], check=True,
                   timeout=600)
    (wheel,) = folder.glob("edgesdk-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(folder), str(wheel)], check=True,
                   timeout=600)


def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the project's wheel and every wheel its base install needs."""
    return shared_dir(tmp_path_factory, "wheelhouse", _build)


def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout."""
    (wheel,) = wheelhouse(tmp_path_factory).glob("edgesdk-*.whl")
    return wheel


def device_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel's base install only (what ``pip install edgesdk`` gives a device)."""
    house = wheelhouse(tmp_path_factory)

    def build(folder: Path) -> None:
        venv = folder / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(house),
                        str(project_wheel(tmp_path_factory))], check=True, timeout=600)

    return shared_dir(tmp_path_factory, "device-venv", build) / "venv"
