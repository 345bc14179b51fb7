"""The systemctl and journalctl stand-ins of the docs session do what the page relies on, and fail when the unit does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

BIN = Path(__file__).resolve().parent / "bin"


@pytest.fixture
def root(tmp_path):
    (tmp_path / "etc" / "systemd" / "system").mkdir(parents=True)
    (tmp_path / "etc" / "demo").mkdir()
    return tmp_path


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGESDK_DOC_ROOT": str(root)}
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, env=env, timeout=60)


def unit(root: Path, name: str, exec_start: str, extra: str = "") -> None:
    (root / "etc" / "systemd" / "system" / f"{name}.service").write_text(
        f"[Unit]\nDescription={name}\n\n[Service]\n{extra}ExecStart={exec_start}\n\n[Install]\nWantedBy=multi-user.target\n")


def test_a_unit_starts_with_its_environment_credentials_and_state_directory_and_its_output_is_in_the_journal(root):
    (root / "etc" / "demo" / "env").write_text("GREETING=hello\n")
    (root / "etc" / "demo" / "secret.json").write_text('{"password": "p"}')
    unit(root, "demo", "/bin/sh -c 'echo ${GREETING} ${NAME} && cat %d/secret && echo && ls -d /var/lib/demo && echo connected "
                       "&& sleep 30'",
         "Environment=NAME=cam01\nEnvironmentFile=-/etc/demo/env\nEnvironmentFile=-/etc/demo/missing\n"
         "LoadCredential=secret:/etc/demo/secret.json\nStateDirectory=demo\n")
    started = run(root, "systemctl", "enable", "--now", "demo")
    assert started.returncode == 0, started.stderr
    assert (root / "etc" / "systemd" / "system" / "multi-user.target.wants" / "demo.service").is_symlink()
    assert run(root, "systemctl", "is-active", "demo").returncode == 0
    journal = run(root, "journalctl", "-u", "demo", "-n", "5", "--no-pager").stdout.splitlines()
    assert journal == ["hello cam01", '{"password": "p"}', f"{root}/var/lib/demo", "connected"]
    run(root, "systemctl", "stop", "demo")


def test_a_unit_whose_process_exits_before_it_is_ready_fails_the_start_with_its_output(root):
    unit(root, "broken", "/bin/sh -c 'echo refused by the broker; exit 21'")
    result = run(root, "systemctl", "start", "broken")
    assert result.returncode == 1
    assert "exited with status 21" in result.stderr and "refused by the broker" in result.stderr
    assert run(root, "systemctl", "is-active", "broken").returncode == 3


def test_a_missing_unit_and_journalctl_follow_are_refused(root):
    assert "Unit nothere.service not found" in run(root, "systemctl", "start", "nothere").stderr
    follow = run(root, "journalctl", "-u", "demo", "-f")
    assert follow.returncode != 0 and "-f never ends" in follow.stderr
