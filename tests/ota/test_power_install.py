"""The agent applies an installed bundle's power mode (--apply-power-mode) and reports it; the server keeps the field."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.agent import Installer, ModelStore
from edgesdk.agent.config import AgentConfig
from edgesdk.agent.energy_account import NoEnergy
from edgesdk.agent.power_keeper import PowerModeKeeper
from edgesdk.agent.state_report import device_state
from edgesdk.errors import ReportError
from edgesdk.fleet.reports import parse_state
from edgesdk.runtime import power_modes
from edgesdk.runtime.profiles import load_profile
from tests.ota.conftest import make_bundle

BOARDS = Path(__file__).resolve().parents[1] / "data" / "boards"


def _pi4_sysfs(tmp_path: Path) -> Path:
    """The Pi 4's recorded tree plus its one cpufreq policy and hotplug files (see tests/unit/test_power_modes.py)."""
    root = tmp_path / "sys"
    shutil.copytree(BOARDS / "raspberry-pi-4" / "sys", root)
    policy = root / "devices/system/cpu/cpufreq/policy0"
    policy.mkdir(parents=True)
    for name, value in (("related_cpus", "0 1 2 3"), ("scaling_governor", "ondemand"), ("scaling_max_freq", "1800000"),
                        ("cpuinfo_max_freq", "1800000")):
        (policy / name).write_text(value + "\n")
    for core in (1, 2, 3):
        (root / f"devices/system/cpu/cpu{core}/online").write_text("1\n")
    return root


def _installed(tmp_path: Path, keys: dict, sysfs: Path) -> tuple[AgentConfig, ModelStore, PowerModeKeeper, Installer]:
    bundle = make_bundle(tmp_path / "v1", "1.0.0", keys, seed=1, profile="raspberry-pi-4")  # planned for "latency"
    store = ModelStore(tmp_path / "store")
    store.add_slot("digits-1.0.0", lambda tmp: shutil.copytree(bundle, tmp, dirs_exist_ok=True))
    config = AgentConfig(device_id="pi1", group="lab", broker="mqtt://127.0.0.1:1", store=tmp_path / "store",
                         sysfs_root=str(sysfs), apply_power_mode=True)
    keeper = PowerModeKeeper(load_profile("raspberry-pi-4"), config.sysfs_root)
    return config, store, keeper, Installer(store, None, power=keeper)


def test_a_committed_install_puts_the_board_in_the_bundles_mode_and_the_state_says_so(tmp_path, keys):
    sysfs = _pi4_sysfs(tmp_path)
    config, store, keeper, installer = _installed(tmp_path, keys, sysfs)
    assert device_state(config, store, None, NoEnergy("none"), power=keeper)["power_mode_applied"] is None
    assert installer.install("digits-1.0.0").event == "committed"
    governor = sysfs / "devices/system/cpu/cpufreq/policy0/scaling_governor"
    assert governor.read_text() == "performance"  # the bundle's "latency" is served by the Pi 4's performance mode
    state = device_state(config, store, None, NoEnergy("none"), power=keeper)
    assert state["power_mode_applied"] is True
    assert state["power_mode"]["name"] == "performance" and state["power_mode"]["changed"] == [str(governor)]
    report = parse_state("pi1", json.dumps(state).encode())  # the server keeps both fields for the console
    assert report.details["power_mode_applied"] is True and report.details["power_mode"]["name"] == "performance"


def test_where_sysfs_refuses_the_state_reports_false_with_the_reason_and_commands(tmp_path, keys, monkeypatch):
    monkeypatch.setattr(power_modes, "_told", set())
    sysfs = _pi4_sysfs(tmp_path)
    governor = sysfs / "devices/system/cpu/cpufreq/policy0/scaling_governor"
    governor.chmod(stat.S_IRUSR)
    config, store, keeper, installer = _installed(tmp_path, keys, sysfs)
    assert installer.install("digits-1.0.0").event == "committed", "a mode not applied never fails the install"
    state = device_state(config, store, None, NoEnergy("none"), power=keeper)
    assert state["power_mode_applied"] is False
    assert state["power_mode"]["reason"].startswith(f"{governor} is read-only")
    assert state["power_mode"]["commands"] == [f"echo performance | sudo tee {governor}"]
    assert parse_state("pi1", json.dumps(state).encode()).details["power_mode_applied"] is False


def test_a_restarted_agent_applies_the_committed_bundles_mode_again(tmp_path, keys):
    sysfs = _pi4_sysfs(tmp_path)
    _, store, keeper, installer = _installed(tmp_path, keys, sysfs)
    installer.install("digits-1.0.0")
    governor = sysfs / "devices/system/cpu/cpufreq/policy0/scaling_governor"
    governor.write_text("ondemand\n")  # a reboot resets cpufreq
    Installer(store, None, power=keeper).recover()
    assert governor.read_text() == "performance"


def test_the_server_refuses_a_power_mode_applied_that_is_not_a_boolean():
    with pytest.raises(ReportError, match="power_mode_applied 'yes' must be true, false or null") as caught:
        parse_state("pi1", json.dumps({"status": "online", "power_mode_applied": "yes"}).encode())
    assert (caught.value.reason, caught.value.field) == ("type", "power_mode_applied")


def test_the_agent_command_takes_apply_power_mode(monkeypatch, tmp_path):
    from edgesdk.cli.agent import agent

    seen = {}

    class Stop(Exception):
        pass

    def fake_managed(**kwargs):
        raise Stop()

    import edgesdk.agent.config as config_module

    original = config_module.AgentConfig

    def capture(**kwargs):
        seen.update(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(config_module, "AgentConfig", capture)
    monkeypatch.setattr("edgesdk.agent.managed.ManagedRuntime", fake_managed)
    result = CliRunner().invoke(agent, ["--device-id", "pi1", "--group", "lab", "--broker", "mqtt://127.0.0.1:1",
                                        "--store", str(tmp_path / "s"), "--allow-unsigned", "--apply-power-mode"])
    assert isinstance(result.exception, Stop), result.output
    assert seen["apply_power_mode"] is True
