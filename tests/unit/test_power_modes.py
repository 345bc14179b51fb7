"""Power modes applied on the board (issue 38, item 4): recorded sysfs trees copied under tmp_path, a stand-in nvpmodel.

The recorded trees (tests/data/boards) keep the files detection reads; ``_board`` adds the writable cpufreq and
hotplug attributes the kernel lays out beside them: ``cpufreq/policyN`` named after its first CPU, with
``related_cpus``, ``scaling_governor``, ``scaling_max_freq``, ``cpuinfo_max_freq`` and the governors on offer, and
``cpuN/online`` for every CPU but cpu0 (which boards do not let go offline). The tests run as root here, so "not
permitted" is a file without a write bit (what a sysfs attribute the kernel refuses to change looks like) or
``os.access`` answering no (a user that is not root).
"""

from __future__ import annotations

import logging
import shutil
import stat
import sys
from pathlib import Path

import pytest

from edgesdk.errors import ProfileError
from edgesdk.runtime import power_modes
from edgesdk.runtime.power_modes import apply_power_mode
from edgesdk.runtime.profile_json import profile_to_dict
from edgesdk.runtime.profiles import load_profile, profile_from_dict

BOARDS = Path(__file__).resolve().parents[1] / "data" / "boards"
GOVERNORS = "conservative ondemand userspace powersave performance schedutil"
#: Each board's cpufreq policies: first CPU -> (its CPUs, cpuinfo_max_freq in kHz), as the kernel exposes them.
POLICIES = {
    "raspberry-pi-4": {0: ([0, 1, 2, 3], 1800000)},
    "rk3588": {0: ([0, 1, 2, 3], 1800000), 4: ([4, 5], 2400000), 6: ([6, 7], 2400000)},
    "jetson-orin-nano": {0: ([0, 1, 2, 3], 1510400), 4: ([4, 5], 1510400)},
}


@pytest.fixture(autouse=True)
def _fresh_log_memory(monkeypatch):
    monkeypatch.setattr(power_modes, "_told", set())


def _board(tmp_path: Path, board: str) -> Path:
    """A copy of the board's recorded sys tree with its writable cpufreq and hotplug attributes; returns the root."""
    root = tmp_path / "sys"
    shutil.copytree(BOARDS / board / "sys", root)
    cpu = root / "devices" / "system" / "cpu"
    for first, (cpus, top) in POLICIES[board].items():
        policy = cpu / "cpufreq" / f"policy{first}"
        policy.mkdir(parents=True)
        for name, value in (("related_cpus", " ".join(map(str, cpus))), ("scaling_governor", "ondemand"),
                            ("scaling_max_freq", str(top)), ("cpuinfo_max_freq", str(top)),
                            ("scaling_available_governors", GOVERNORS)):
            (policy / name).write_text(value + "\n")
    for core in sorted(c for cpus, _ in POLICIES[board].values() for c in cpus)[1:]:
        (cpu / f"cpu{core}" / "online").write_text("1\n")
    return root


def _read(root: Path, rel: str) -> str:
    return (root / "devices" / "system" / "cpu" / rel).read_text().strip()


def test_pi4_powersave_takes_two_cores_offline_caps_the_clock_and_sets_schedutil(tmp_path):
    root = _board(tmp_path, "raspberry-pi-4")
    result = apply_power_mode(load_profile("raspberry-pi-4"), "power", str(root))
    assert result.applied and result.power_mode == "powersave" and result.reason is None
    assert [_read(root, f"cpu{c}/online") for c in (1, 2, 3)] == ["1", "0", "0"]
    assert _read(root, "cpufreq/policy0/scaling_governor") == "schedutil"
    assert _read(root, "cpufreq/policy0/scaling_max_freq") == "1000000"  # the mode's 1.0 GHz cap
    cpu = root / "devices" / "system" / "cpu"
    assert result.changed == (str(cpu / "cpufreq/policy0/scaling_governor"),
                              str(cpu / "cpufreq/policy0/scaling_max_freq"), str(cpu / "cpu2/online"),
                              str(cpu / "cpu3/online"))


def test_pi4_performance_brings_the_cores_back_before_pinning_the_clock(tmp_path):
    root = _board(tmp_path, "raspberry-pi-4")
    profile = load_profile("raspberry-pi-4")
    apply_power_mode(profile, "powersave", str(root))
    result = apply_power_mode(profile, "latency", str(root))
    assert result.applied and result.power_mode == "performance"
    assert [_read(root, f"cpu{c}/online") for c in (1, 2, 3)] == ["1", "1", "1"]
    assert _read(root, "cpufreq/policy0/scaling_governor") == "performance"
    assert [Path(p).parent.name for p in result.changed] == ["cpu2", "cpu3", "policy0", "policy0"]
    assert _read(root, "cpufreq/policy0/scaling_max_freq") == "1800000"  # the cap lifted back to its clock


def test_rk3588_efficiency_sets_only_the_little_clusters_policy(tmp_path):
    root = _board(tmp_path, "rk3588")
    result = apply_power_mode(load_profile("rk3588"), "efficiency", str(root))
    assert result.applied
    assert _read(root, "cpufreq/policy0/scaling_governor") == "schedutil"
    assert _read(root, "cpufreq/policy0/scaling_max_freq") == "1800000"
    assert _read(root, "cpufreq/policy4/scaling_governor") == "ondemand"  # the big cores are not this mode's
    assert _read(root, "cpufreq/policy6/scaling_governor") == "ondemand"
    performance = apply_power_mode(load_profile("rk3588"), "performance", str(root))
    assert performance.applied  # the big cluster spans two clock domains: both get the governor
    assert [_read(root, f"cpufreq/policy{p}/scaling_governor") for p in (4, 6)] == ["performance", "performance"]


def test_a_read_only_attribute_leaves_the_board_alone_and_logs_the_commands_once(tmp_path, caplog):
    root = _board(tmp_path, "raspberry-pi-4")
    governor = root / "devices/system/cpu/cpufreq/policy0/scaling_governor"
    governor.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    profile = load_profile("raspberry-pi-4")
    with caplog.at_level(logging.WARNING, logger="edgesdk.runtime.power_modes"):
        result = apply_power_mode(profile, "powersave", str(root))
        again = apply_power_mode(profile, "powersave", str(root))
    assert not result.applied and not again.applied
    assert result.reason == f"{governor} is read-only (mode 444: the kernel lets no one write it)"
    assert [_read(root, f"cpu{c}/online") for c in (2, 3)] == ["1", "1"], "nothing is written when one file refuses"
    assert result.changed == ()
    cpu = root / "devices/system/cpu"
    assert result.commands == (f"echo schedutil | sudo tee {governor}",
                               f"echo 1000000 | sudo tee {cpu}/cpufreq/policy0/scaling_max_freq",
                               f"echo 0 | sudo tee {cpu}/cpu2/online", f"echo 0 | sudo tee {cpu}/cpu3/online")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"echo schedutil | sudo tee {governor}" in warnings[0] and "not applied" in warnings[0]
    assert result.as_dict()["power_mode_applied"] is False


def test_a_user_that_may_not_write_sysfs_gets_the_commands(tmp_path, monkeypatch):
    root = _board(tmp_path, "raspberry-pi-4")
    monkeypatch.setattr(power_modes.os, "access", lambda path, mode: False)  # what a non-root user is told
    result = apply_power_mode(load_profile("raspberry-pi-4"), "powersave", str(root))
    assert not result.applied and "is not writable by this user" in (result.reason or "")
    assert _read(root, "cpufreq/policy0/scaling_governor") == "ondemand"


def _stand_in_nvpmodel(tmp_path: Path, monkeypatch, exit_code: int = 0) -> Path:
    """An ``nvpmodel`` on PATH that records its arguments (and fails with ``exit_code`` when it is not 0)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "nvpmodel.argv"
    script = bin_dir / "nvpmodel"
    script.write_text(f"#!{sys.executable}\nimport sys\nopen({str(record)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                      f"print('NVPM ERROR: failed to set power mode') if {exit_code} else None\nsys.exit({exit_code})\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return record


def test_a_jetson_mode_runs_nvpmodel_with_its_id_and_writes_no_cpufreq_file(tmp_path, monkeypatch):
    root = _board(tmp_path, "jetson-orin-nano")
    record = _stand_in_nvpmodel(tmp_path, monkeypatch)
    result = apply_power_mode(load_profile("jetson-orin-nano"), "power", str(root))
    assert result.applied and result.power_mode == "7w" and result.changed == ("nvpmodel",)
    assert record.read_text() == "-m 1\n"
    assert result.settings == {"nvpmodel": "1"}
    assert _read(root, "cpu5/online") == "1" and _read(root, "cpufreq/policy0/scaling_max_freq") == "1510400"
    assert apply_power_mode(load_profile("jetson-orin-nano"), "latency", str(root)).applied
    assert record.read_text() == "-m 1\n-m 0\n"


def test_a_jetson_without_nvpmodel_reports_and_logs_the_command(tmp_path, monkeypatch, caplog):
    root = _board(tmp_path, "jetson-orin-nano")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with caplog.at_level(logging.WARNING, logger="edgesdk.runtime.power_modes"):
        result = apply_power_mode(load_profile("jetson-orin-nano"), "7w", str(root))
    assert not result.applied and result.reason.startswith("nvpmodel is not on PATH")
    assert result.commands == ("sudo nvpmodel -m 1",)
    assert "sudo nvpmodel -m 1" in caplog.text


def test_a_failing_nvpmodel_is_reported_with_what_it_said(tmp_path, monkeypatch):
    root = _board(tmp_path, "jetson-orin-nano")
    record = _stand_in_nvpmodel(tmp_path, monkeypatch, exit_code=1)
    result = apply_power_mode(load_profile("jetson-orin-nano"), "15w", str(root))
    assert not result.applied and record.read_text() == "-m 0\n"
    assert result.reason.endswith("-m 0 exited 1: NVPM ERROR: failed to set power mode")


def test_a_mode_the_profile_does_not_declare_is_not_applied(tmp_path):
    profile = profile_from_dict({**profile_to_dict(load_profile("raspberry-pi-4")), "power_modes": [
        profile_to_dict(load_profile("raspberry-pi-4"))["power_modes"][0]]})
    result = apply_power_mode(profile, "power", str(_board(tmp_path, "raspberry-pi-4")))
    assert not result.applied and result.power_mode is None
    assert result.reason == "profile 'raspberry-pi-4' declares no power mode for 'power'"


def test_the_shipped_profiles_carry_nvpmodel_ids_and_governors_that_survive_a_round_trip():
    orin, nano = load_profile("jetson-orin-nano"), load_profile("jetson-nano")
    assert {m.name: m.nvpmodel for m in orin.power_modes} == {"15w": 0, "7w": 1}
    assert {m.name: m.nvpmodel for m in nano.power_modes} == {"maxn": 0, "5w": 1}
    assert {m.name: m.governor for m in load_profile("raspberry-pi-5").power_modes} == {
        "performance": "performance", "powersave": "schedutil"}
    assert {m.name: m.governor for m in load_profile("rk3588").power_modes} == {
        "performance": "performance", "efficiency": "schedutil"}
    for profile in (orin, nano, load_profile("rk3588")):
        assert profile_from_dict(profile_to_dict(profile), origin=profile.origin) == profile


@pytest.mark.parametrize(("change", "message"), [
    ({"governor": "turbo"}, "governor 'turbo' is not a cpufreq governor; use one of ['performance'"),
    ({"nvpmodel": -1}, "nvpmodel must be an id >= 0 (`nvpmodel -q --verbose` lists them), got -1"),
    ({"nvpmodel": "1"}, "nvpmodel"),
])
def test_a_bad_governor_or_nvpmodel_id_is_refused_naming_it(change, message):
    data = profile_to_dict(load_profile("jetson-orin-nano"))
    data["power_modes"][1].update(change)
    with pytest.raises(ProfileError, match="power_modes\\[1\\]") as caught:
        profile_from_dict(data, origin="orin.yaml")
    assert message in str(caught.value)


def test_a_runtime_asked_to_apply_its_power_mode_does_and_says_so(tmp_path, digits_onnx):
    from edgesdk.runtime.runtime import Runtime

    root = _board(tmp_path, "raspberry-pi-4")
    with Runtime(digits_onnx, profile="raspberry-pi-4", mode="power", apply_power_mode=True, sysfs_root=str(root)) as rt:
        assert rt.info.power_mode_applied is True and rt.power is not None and rt.power.power_mode == "powersave"
    assert _read(root, "cpu3/online") == "0" and _read(root, "cpufreq/policy0/scaling_governor") == "schedutil"
    with Runtime(digits_onnx, profile="raspberry-pi-4", mode="latency", sysfs_root=str(root)) as rt:
        assert rt.info.power_mode_applied is None and rt.power is None  # off by default: nothing touched
    assert _read(root, "cpu3/online") == "0"
