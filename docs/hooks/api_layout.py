"""MkDocs hook: mkdocstrings reads edgesdk in its installed layout.

pyproject.toml's ``package-dir`` installs ``converters/``, ``ota_server/`` and ``device_profiles/`` inside the
``edgesdk`` package; the editable install does it with an import hook that griffe (mkdocstrings' static reader),
like every static tool, cannot follow, so ``edgesdk.converters.convert`` would not be found. As
``scripts/typecheck.py`` does for mypy, this builds a tree of symbolic links with the installed layout (in a
temporary folder, one per build, so two builds never share one) and points mkdocstrings at it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[2]
#: Source folder -> its name inside the installed edgesdk package (pyproject.toml's package-dir).
MAPPED = {"converters": "converters", "ota_server": "ota_server", "device_profiles": "device_profiles"}
_trees: list[Path] = []


def link_tree() -> Path:
    """A new folder holding ``edgesdk/``: each entry of the source's edgesdk/ plus the mapped folders, as links."""
    tree = Path(tempfile.mkdtemp(prefix="edgesdk-docs-api-"))
    package = tree / "edgesdk"
    package.mkdir()
    for entry in (ROOT / "edgesdk").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder, inside in MAPPED.items():
        (package / inside).symlink_to(ROOT / folder)
    _trees.append(tree)
    return tree


@event_priority(100)  # before mkdocstrings reads its handler options
def on_config(config: Any) -> Any:
    """Point the Python handler at a fresh link tree (``mkdocs serve`` rebuilds: the last build's tree goes)."""
    on_shutdown()
    handlers = config.plugins["mkdocstrings"].config.handlers
    handlers.setdefault("python", {})["paths"] = [str(link_tree())]
    return config


def on_shutdown() -> None:
    """Remove the link trees this process made."""
    while _trees:
        shutil.rmtree(_trees.pop(), ignore_errors=True)
