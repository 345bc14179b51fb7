"""examples/systemd/edgesdk-agent.service parses cleanly and keeps its hardening."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "examples" / "systemd" / "edgesdk-agent.service"


def _settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", " ")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed on this host")
def test_systemd_accepts_the_unit_without_a_warning(tmp_path):
    # verify checks that ExecStart's binary exists: point it at this environment's edgesdk.
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/edgesdk/bin/edgesdk", str(Path(sys.executable).parent / "edgesdk")))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_the_unit_runs_the_agent_hardened_with_only_its_store_writable():
    s = _settings()
    assert s["DynamicUser"] == ["yes"] and s["ProtectSystem"] == ["strict"] and s["NoNewPrivileges"] == ["yes"]
    assert s["ReadWritePaths"] == ["/var/lib/edgesdk"] and s["StateDirectory"] == ["edgesdk"]
    assert s["StateDirectoryMode"] == ["0755"] and s["UMask"] == ["0022"], "the app must be able to read the store"
    assert s["Restart"] == ["on-failure"] and s["RestartPreventExitStatus"] == ["21"]
    assert "--store /var/lib/edgesdk/store" in UNIT.read_text()
