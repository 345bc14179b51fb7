"""Type-check edgesdk as it is installed: converters/ and ota_server/ as edgesdk.converters / edgesdk.ota_server.

pyproject.toml maps the top-level folders into the ``edgesdk`` package with ``package-dir``;
the editable install resolves that with an import hook, which mypy (like every static
checker) cannot follow, so ``mypy converters`` used to see ``edgesdk.converters`` as Any.
This script builds a tree of symbolic links with the installed layout under
``build/typecheck/edgesdk`` (folders are linked whole, so new modules appear without a
rebuild) and runs ``mypy -p edgesdk`` on it, reporting paths in the source tree.

    python scripts/typecheck.py            # check the package; exit status is mypy's
    python scripts/typecheck.py FILE ...   # check other files (an example, a script) against it
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "typecheck"
#: mypy's incremental cache, kept outside TREE (which is rebuilt on every run) so a second run is warm. Its paths
#: are relative to TREE, so a copy of the checkout (tests/unit/test_typecheck.py) can start from a copy of it.
CACHE = ROOT / "build" / "mypy-cache"
#: Source folder -> where it lives inside the installed edgesdk package (as in pyproject.toml's package-dir).
MAPPED = {"converters": "converters", "ota_server": "ota_server", "device_profiles": "device_profiles"}


def link_tree() -> Path:
    """(Re)build ``build/typecheck/edgesdk``: each entry of edgesdk/ plus the mapped folders, as symlinks."""
    package = TREE / "edgesdk"
    shutil.rmtree(TREE, ignore_errors=True)
    package.mkdir(parents=True)
    for entry in (ROOT / "edgesdk").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder, inside in MAPPED.items():
        (package / inside).symlink_to(ROOT / folder)
    return package


def source_path(line: str) -> str:
    """Report ``edgesdk/converters/x.py`` (mypy's path inside the tree) as ``converters/x.py``, the file you edit."""
    for folder, inside in MAPPED.items():
        if line.startswith(f"edgesdk/{inside}/"):
            return folder + line[len(f"edgesdk/{inside}"):]
    return line


def main(files: list[str]) -> int:
    link_tree()
    targets = [str(Path(f).resolve()) for f in files] or ["-p", "edgesdk"]
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(CACHE),
               *targets]
    result = subprocess.run(command, cwd=TREE, env={**os.environ, "MYPYPATH": str(TREE)}, capture_output=True,
                            text=True)
    for line in (result.stdout + result.stderr).splitlines():
        print(source_path(line))
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
