"""The soak part of benchmarks/security/security.py (benchmarks/security/security_soak.py) at a
small size: its counts, never its timings. A real mosquitto, the server in this process, 29
simulated devices and the hostile process; one clean and one hostile phase."""

from __future__ import annotations

from benchmarks.security.security_soak import run

#: 30 devices, 2 phases of 8 s, a state every 2 s, 2 s of warm-up, 100 hostile messages a second,
#: a reconnect every 3 s.
TINY = (30, 2, 8.0, 2.0, 2.0, 100.0, 3.0)


def test_soak_counts_the_hostile_device_and_does_no_archive_work_for_it():
    part = run(quick=True, profile=TINY)
    results, goals = part["results"], part["goals"]
    assert results["order"] == ["clean", "hostile"]
    assert goals["rollouts_completed"]["met"], results["phases"]
    assert goals["work_for_non_target"]["measured"] == 0, results["loads_by_context"]
    assert results["loads_by_context"].get("None", 0) >= 2  # the engine's stage opens are seen
    sent = results["hostile_sent"]
    assert sent["messages"] > 300 and sent["reconnects"] >= 1
    assert results["refused"].get("need/not_target", 0) > 0  # its requests reached the check
    assert results["refused"].get("need/flood", 0) > 0  # and its rate guard
    assert results["hostile_in_store"] == "outsider"
    assert results["clean"]["lag_samples"] > 0 and results["hostile"]["lag_samples"] > 0
    assert results["rss_warm_mib"] > 0 and results["rss_end_mib"] > 0
    assert results["structures_end"]["chunks.transfers"] <= 2
