"""A conversion's output directory, replaced whole or not at all.

The conversion writes into a staging directory beside ``out``; only when it succeeded do its
``variants/`` and ``bundle/`` replace ``out``'s (an older conversion there is removed afterwards),
so an interrupted or failed run never leaves half a bundle where a device tool would load it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from edgesdk.converters.arguments import OUTPUTS
from edgesdk.files import fsync_dir

__all__ = ["staged_output", "moved_paths"]


@contextlib.contextmanager
def staged_output(out: Path) -> Iterator[Path]:
    """A staging directory beside ``out``; on success its ``variants/`` and ``bundle/`` replace ``out``'s."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.converting-{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        yield staging
        _replace_outputs(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _replace_outputs(staging: Path, out: Path) -> None:
    """Move the finished conversion into ``out``; an older one there (``force``) is removed only afterwards."""
    if not out.exists():
        os.replace(staging, out)
        fsync_dir(out.parent)
        return
    replaced = out.parent / f".{out.name}.replaced-{os.getpid()}-{secrets.token_hex(4)}"
    replaced.mkdir()
    try:
        for entry in OUTPUTS:
            if (out / entry).exists():
                os.replace(out / entry, replaced / entry)
            if (staging / entry).exists():
                os.replace(staging / entry, out / entry)
        fsync_dir(out)
    finally:
        shutil.rmtree(replaced, ignore_errors=True)


def moved_paths(value: Any, old: Path, new: Path) -> Any:
    """``value`` (a report and what it holds) with paths and messages under ``old`` pointing under ``new``."""
    if isinstance(value, Path):
        return new / value.relative_to(old) if value.is_relative_to(old) else value
    if isinstance(value, str):
        return value.replace(str(old), str(new))
    if isinstance(value, (tuple, list)):
        return type(value)(moved_paths(v, old, new) for v in value)
    if isinstance(value, Mapping):
        return {k: moved_paths(v, old, new) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: moved_paths(getattr(value, f.name), old, new) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value
