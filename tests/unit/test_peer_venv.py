"""The cached virtualenv of third-party peers (benchmarks/shared/peer_venv.py): built aside, checked, marked, swapped in."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.shared.peer_venv import PeerVenv, PeerVenvError


def venv(tmp_path: Path, check: str = "import json", requirements: tuple[str, ...] = ()) -> PeerVenv:
    return PeerVenv(tmp_path / "venvs" / "peer", requirements, check)


def leftovers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "venvs").iterdir() if p.name.startswith(".peer.building"))


def test_an_environment_is_built_once_and_checked_with_its_own_python(tmp_path):
    env = venv(tmp_path, check="import sys; assert sys.prefix != sys.base_prefix, 'not a virtualenv'")
    seconds = env.ensure(timeout_s=120, announce=lambda message: None)
    assert seconds is not None and env.installed and env.python.exists()
    assert env.info()["requirements"] == [] and env.info()["size_bytes"] > 0
    assert env.ensure(announce=lambda message: None) is None  # cached: no second build
    assert leftovers(tmp_path) == []


def test_a_changed_requirement_list_rebuilds_in_place(tmp_path):
    env = venv(tmp_path)
    env.ensure(timeout_s=120, announce=lambda message: None)
    (env.location / "stale-file").write_text("from the old build")
    changed = PeerVenv(env.location, ("pip",), env.check)  # ensurepip brings it: no download
    assert not changed.installed
    assert changed.ensure(timeout_s=300, announce=lambda message: None) is not None
    assert changed.installed and not (env.location / "stale-file").exists() and not env.installed


def test_a_failing_check_leaves_no_environment_and_says_why(tmp_path):
    env = venv(tmp_path, check="import no_such_module_here")
    with pytest.raises(PeerVenvError, match=r"failed \(exit 1\)(.|\n)*No module named 'no_such_module_here'"):
        env.ensure(timeout_s=120, announce=lambda message: None)
    assert not env.location.exists() and leftovers(tmp_path) == []


def test_named_environments_live_under_the_cache_unless_the_variable_says_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGESDK_TEST_PEER_VENV", raising=False)
    assert PeerVenv.named("mlserver-1", (), "pass", "EDGESDK_TEST_PEER_VENV").location.parts[-3:] == \
        ("edgesdk", "venvs", "mlserver-1")
    monkeypatch.setenv("EDGESDK_TEST_PEER_VENV", str(tmp_path / "elsewhere"))
    assert PeerVenv.named("mlserver-1", (), "pass", "EDGESDK_TEST_PEER_VENV").location == tmp_path / "elsewhere"
