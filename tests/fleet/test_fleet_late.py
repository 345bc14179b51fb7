"""The late-devices scenario of benchmarks/fleet/fleet.py (benchmarks/fleet/fleet_late.py) at a small size: its counts."""

from __future__ import annotations

from benchmarks.fleet.fleet_late import late_devices


def test_late_devices_scenario_counts_every_late_device(tmp_path, keys, bundles):
    result = late_devices(tmp_path, str(tmp_path / "fleet.db"), keys["dir"], bundles["2.0.0"], "digits", devices=40,
                          new_devices=6, window_s=3.0, idle_s=0.5, processes=2, settle_s=60.0)
    assert result["offline_at_push"] == 12 and result["joined_later"] == 6
    assert result["rollout"]["state"] == "completed" and result["rollout"]["online_committed"] == 28
    assert result["reached_release"] == 46  # every device: online at the push, back later, and joined later
    late = 12 + 6
    assert result["late_returned"] == result["late_committed_by_log"] == result["late_committed_on_server"] == late
    assert result["rollout"]["late_counts"] == {"committed": late}
    assert result["return_to_commit_s"]["n"] == late and result["return_to_commit_s_joined"]["n"] == 6
    assert result["partition_end_to_commit_s"]["n"] == 12
    assert result["updated_twice"] == 0 and result["server_warnings"] == []
    assert result["cpu"]["online"]["devices"] == 28 and result["cpu"]["late"]["devices"] == late
    assert result["cpu"]["online"]["server_cpu_s"] > 0 and result["cpu"]["late"]["server_cpu_s"] > 0
