"""Detection against recorded /proc + /sys trees of real boards."""

from __future__ import annotations

import shutil

import pytest

from edgesdk.errors import ProfileError
from edgesdk.runtime.detect import detect, detect_device, read_topology
from edgesdk.runtime.profiles import RuntimeMode
from edgesdk.runtime.scheduling import plan_cores
from tests.conftest import BOARDS

ALL = frozenset(range(64))


def test_rk3588_topology_has_a55_little_and_a76_big_clusters():
    t = read_topology(BOARDS / "rk3588")
    assert (t.arch, t.model, t.mem_total_mb) == ("aarch64", "Radxa ROCK 5B", 7738)
    little, big = t.clusters
    assert (little.name, little.cores, little.microarchitecture, little.max_mhz, little.capacity) == (
        "little", (0, 1, 2, 3), "cortex-a55", 1800, 397)
    assert (big.name, big.cores, big.microarchitecture, big.max_mhz, big.capacity) == (
        "big", (4, 5, 6, 7), "cortex-a76", 2400, 1024)
    assert "rockchip,rk3588" in t.compatible


def test_rk3588_matches_its_profile_and_latency_runs_on_the_a76_cores():
    found = detect(BOARDS / "rk3588")
    assert found.profile.name == "rk3588"
    assert "rockchip,rk3588" in found.reason
    assert plan_cores(found.profile, RuntimeMode.LATENCY, available=ALL).cores == (4, 5, 6, 7)
    assert plan_cores(found.profile, RuntimeMode.POWER, available=ALL).cores == (0, 1, 2, 3)


def test_raspberry_pi_4_matches_by_device_tree_model():
    found = detect(BOARDS / "raspberry-pi-4")
    assert found.profile.name == "raspberry-pi-4"
    t = found.topology
    assert [c.microarchitecture for c in t.clusters] == ["cortex-a72"] and t.clusters[0].cores == (0, 1, 2, 3)


def test_orin_nano_matches_and_has_one_six_core_cluster():
    found = detect(BOARDS / "jetson-orin-nano")
    assert found.profile.name == "jetson-orin-nano"
    assert found.topology.clusters[0].cores == tuple(range(6))
    assert found.topology.clusters[0].max_mhz == 1510


def test_compatible_string_matches_when_the_model_string_is_unknown(tmp_path):
    board = tmp_path / "board"
    shutil.copytree(BOARDS / "rk3588", board)
    (board / "proc/device-tree/model").write_bytes(b"Some Vendor RK-Board v2\x00")
    found = detect(board)
    assert found.profile.name == "rk3588" and "compatible" in found.reason


def test_unknown_arm_board_gets_a_generic_profile_with_its_own_cores():
    found = detect(BOARDS / "unknown-arm")
    p = found.profile
    assert p.name == "generic-aarch64" and p.origin == "detected"
    assert "no shipped profile matches" in found.reason
    assert [(c.cores, c.microarchitecture, c.max_mhz) for c in p.clusters] == [((0, 1, 2, 3), "cortex-a53", 1152)]
    assert p.ram_mb == 1996 and p.model_budget_mb == 499  # the template's 25%
    power = plan_cores(p, "power", available=ALL)
    assert power.cores == (0, 1) and power.power_mode == "powersave"


def test_generic_big_little_board_gets_performance_and_efficiency_modes(tmp_path):
    board = tmp_path / "board"
    shutil.copytree(BOARDS / "rk3588", board)
    (board / "proc/device-tree/model").write_bytes(b"Mystery Board\x00")
    (board / "proc/device-tree/compatible").write_bytes(b"mystery,board\x00")
    p = detect_device(board)
    assert p.name == "generic-aarch64" and p.is_heterogeneous
    assert plan_cores(p, "latency", available=ALL).cores == (4, 5, 6, 7)
    assert plan_cores(p, "power", available=ALL).cores == (0, 1, 2, 3)


def test_this_x86_host_is_generic_x86_64_with_its_real_cpus():
    t = read_topology(BOARDS / "x86_64-host")
    assert t.arch == "x86_64" and t.model is None
    p = detect_device(BOARDS / "x86_64-host")
    assert p.name == "generic-x86_64" and p.arch == "x86_64"
    assert p.cores == tuple(c.id for c in t.cpus)
    assert p.clusters[0].cpu_part is None and p.clusters[0].max_mhz > 1000
    assert p.ram_mb > 20000 and p.model_budget_mb == 2048  # 25% of 24 GB, capped like the shipped profiles


def test_live_detection_works_on_this_machine():
    p = detect_device()
    assert p.cores and p.model_budget_mb > 0


def test_missing_cpuinfo_names_the_root(tmp_path):
    with pytest.raises(ProfileError, match="cannot read .*proc/cpuinfo"):
        read_topology(tmp_path)
