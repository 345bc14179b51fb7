"""The type checker sees real types in all three wings (the import rules are in test_layers.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TYPECHECK = [sys.executable, str(ROOT / "scripts" / "typecheck.py")]


#: What the type check reads: the device package, the two wings mapped into it, and the profiles' package.
CHECKED = ("edgesdk", "converters", "ota_server", "device_profiles")


def _plant(path: Path, function: str) -> int:
    """Append ``function`` (which holds a type error) to ``path``; the line of the error."""
    text = path.read_text()
    path.write_text(text + "\n\n" + function)
    return len((text + "\n\n" + function).splitlines())


def test_a_type_error_planted_in_each_wing_on_its_own_type_is_caught_where_it_was_planted(tmp_path):
    copy = tmp_path / "src"  # the planting happens in a copy: the checkout is never edited by a test
    for name in (*CHECKED, "scripts"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy)
    cache = ROOT / "build" / "mypy-cache"  # warm start: mypy re-checks the planted modules and what depends on them
    if cache.is_dir():
        shutil.copytree(cache, copy / "build" / "mypy-cache")
    converters = _plant(copy / "converters" / "board" / "power.py",
                        "def _planted(budget: PowerBudget) -> int:\n    return budget\n")
    server = _plant(copy / "ota_server" / "store" / "fleet_db.py", "def _planted(state: DeviceState) -> int:\n    return state\n")
    result = subprocess.run([sys.executable, str(copy / "scripts" / "typecheck.py")], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 1, result.stdout
    assert (f'converters/board/power.py:{converters}: error: Incompatible return value type (got "PowerBudget", expected '
            '"int")') in result.stdout, result.stdout
    assert (f'ota_server/store/fleet_db.py:{server}: error: Incompatible return value type (got "DeviceState", expected '
            '"int")') in result.stdout, result.stdout
    assert "Found 2 errors in 2 files" in result.stdout, result.stdout


def test_the_package_check_covers_exactly_every_module_of_the_three_wings():
    result = subprocess.run(TYPECHECK, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout
    checked = int(re.search(r"(\d+) source files", result.stdout).group(1))
    modules = sum(1 for folder in CHECKED for _ in (ROOT / folder).rglob("*.py"))
    assert checked == modules, (checked, modules)
