"""docs/cli.md is generated from the click commands: it must say what the CLI says now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cli_reference.py"


def test_the_cli_reference_is_current():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "COLUMNS": "40"})
    assert result.returncode == 0, result.stderr


def test_the_reference_covers_every_command_and_subcommand():
    text = (SCRIPT.parent.parent / "docs" / "cli.md").read_text()
    for command in ("edgesdk convert", "edgesdk server mosquitto-config", "edgesdk rollout rollback", "edgesdk agent"):
        assert f"## `{command}`" in text
