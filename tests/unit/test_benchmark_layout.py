"""benchmarks/ by subject (issue 40): a subject's folder imports its own modules, benchmarks/shared/ and the modules
still directly under benchmarks/, never another subject's; benchmarks/shared/ imports no subject. Read from the
source (AST), lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _folders() -> set[str]:
    return {p.name for p in BENCHMARKS.iterdir() if p.is_dir() and any(p.glob("*.py"))}


def _folders_imported(path: Path, folders: set[str]) -> set[str]:
    """The benchmarks/ folders ``path`` imports from (``benchmarks.fleet.chaos_run``, ``from benchmarks import fleet``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[0] == "benchmarks" and len(parts) > 1 and parts[1] in folders:
                found.add(parts[1])
    return found


def test_a_subject_imports_only_itself_and_shared_and_shared_imports_no_subject():
    folders = _folders()
    assert {"shared", "fleet", "converter", "security"} <= folders, folders
    crossing = {}
    for folder in folders:
        allowed = {"shared"} if folder == "shared" else {folder, "shared"}
        for path in sorted((BENCHMARKS / folder).glob("*.py")):
            if wrong := _folders_imported(path, folders) - allowed:
                crossing[str(path.relative_to(BENCHMARKS))] = sorted(wrong)
    assert not crossing, f"move what two subjects use to benchmarks/shared/: {crossing}"


def test_the_check_sees_imports_across_folders():
    folders = _folders()
    assert _folders_imported(BENCHMARKS / "security" / "security.py", folders) == {"security", "shared"}
