"""Size limits that keep the house walkable (issue 22): a module holds one job, a class in the agent one role."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("edgesdk", "converters", "ota_server", "benchmarks", "tests", "scripts", "examples")
MAX_MODULE_LINES = 500
MAX_AGENT_CLASS_LINES = 250


def _modules():
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these by job: {long}"


def test_no_class_of_the_agent_is_over_250_lines():
    long = {}
    for path in (ROOT / "edgesdk" / "agent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (size := node.end_lineno - node.lineno + 1) > MAX_AGENT_CLASS_LINES:
                long[f"{path.relative_to(ROOT)}:{node.name}"] = size
    assert not long, f"give a job of these its own module: {long}"


def test_the_limits_see_every_module():
    assert len(_modules()) > 250 and ROOT / "edgesdk" / "agent" / "agent.py" in _modules()
