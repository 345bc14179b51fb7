"""The type checker sees real types in all three wings, and the wings depend on each other only one way."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TYPECHECK = [sys.executable, str(ROOT / "scripts" / "typecheck.py")]
WINGS = ("edgesdk.converters", "edgesdk.ota_server")


def test_a_planted_type_error_in_either_wing_is_caught(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from edgesdk.converters.config import QuantizationConfig\n"
                     "from edgesdk.ota_server.rollout import RolloutPolicy\n"
                     "a: int = QuantizationConfig()\n"
                     "b: int = RolloutPolicy()\n")
    result = subprocess.run([*TYPECHECK, str(probe)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout
    assert 'expression has type "QuantizationConfig", variable has type "int"' in result.stdout, result.stdout
    assert 'expression has type "RolloutPolicy", variable has type "int"' in result.stdout, result.stdout


def test_the_package_check_covers_every_module_of_the_three_wings():
    result = subprocess.run(TYPECHECK, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout
    checked = int(re.search(r"(\d+) source files", result.stdout).group(1))
    modules = sum(1 for folder in ("edgesdk", "converters", "ota_server") for _ in (ROOT / folder).rglob("*.py"))
    assert checked >= modules, (checked, modules)


def _imports(path: Path, top_level_only: bool) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def test_the_device_core_never_imports_the_converter_or_server_wing():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}"
                 for path in (ROOT / "edgesdk").rglob("*.py") if "cli" not in path.relative_to(ROOT).parts
                 for line, name in _imports(path, top_level_only=False) if name.startswith(WINGS)]
    assert not offenders, offenders


def test_the_cli_imports_the_wings_only_inside_commands():
    # `edgesdk --help` and a device's `edgesdk agent` must not pay for (or need) the wings' dependencies.
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}"
                 for path in (ROOT / "edgesdk" / "cli").rglob("*.py")
                 for line, name in _imports(path, top_level_only=True) if name.startswith(WINGS)]
    assert not offenders, offenders
