"""The server's per-device report limits: token buckets, states that wait instead of vanishing, flood reports."""

from __future__ import annotations

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.ota_server.devices.report_guard import ReportGuard, ReportLimits


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _guard(**limits):
    clock, refused = Clock(), []
    return ReportGuard(ReportLimits(**limits), on_refused=refused.append, clock=clock), clock, refused


def test_events_pass_a_burst_then_the_rate_and_each_device_has_its_own_bucket():
    guard, clock, refused = _guard(event_burst=5, event_per_s=2.0)
    assert [guard.admit("cam0", "event") for _ in range(7)] == [True] * 5 + [False] * 2
    assert guard.admit("cam1", "event")  # another device is not held back by cam0's flood
    clock.now += 1.0  # two more tokens
    assert [guard.admit("cam0", "need") for _ in range(3)] == [True, True, False]
    assert refused == ["event", "event", "need"]
    clock.now += 60.0  # a quiet device refills to its burst, no further
    assert sum(guard.admit("cam0", "event") for _ in range(10)) == 5


def test_a_state_over_the_limit_waits_and_only_the_newest_is_read():
    guard, clock, refused = _guard(state_burst=2, state_per_s=1.0)
    assert guard.admit_state("cam0", "t", b"s1") and guard.admit_state("cam0", "t", b"s2")
    assert not guard.admit_state("cam0", "t", b"s3")
    assert not guard.admit_state("cam0", "t", b"s4")  # replaces s3, which is never read
    assert refused == ["state"]
    assert guard.due() == []  # no token yet
    clock.now += 0.5
    # A state arriving while one waits joins the wait even if a token came back: the newest wins, in order.
    assert not guard.admit_state("cam0", "t", b"s5")
    clock.now += 0.5
    assert guard.due() == [("t", b"s5")]
    assert guard.deferred == {} and guard.due() == []


def test_a_flood_is_reported_once_per_period_with_what_was_refused():
    guard, clock, _ = _guard(event_burst=1, event_per_s=0.001, state_burst=1, state_per_s=0.001, report_every_s=60.0)
    guard.admit("cam0", "event")
    for _ in range(3):
        guard.admit("cam0", "event")
    guard.admit_state("cam0", "t", b"1")
    guard.admit_state("cam0", "t", b"2")
    guard.admit_state("cam0", "t", b"3")  # replaces 2
    clock.now += 5
    (report,) = guard.flood_reports()
    assert report == ("cam0", {"state": 1, "event": 3, "need": 0, "measurement": 0}, 5.0)
    guard.admit("cam0", "need")
    assert list(guard.flood_reports()) == []  # within the period: summed into the next report
    clock.now += 60
    assert list(guard.flood_reports()) == [("cam0", {"state": 0, "event": 0, "need": 1, "measurement": 0}, 60.0)]
    assert list(guard.flood_reports()) == []  # nothing refused since


def test_quiet_devices_are_forgotten_when_the_table_is_full_but_a_waiting_state_is_kept():
    guard, clock, _ = _guard(state_burst=1, state_per_s=1.0, max_devices=2)
    assert guard.admit_state("a", "ta", b"1")
    assert not guard.admit_state("a", "ta", b"2")  # waits
    assert guard.admit_state("b", "tb", b"1")
    clock.now += 10  # both buckets full again
    assert guard.admit_state("c", "tc", b"1")  # table full: b (quiet, nothing waiting) is forgotten
    assert set(guard._states) == {"a", "c"}
    assert guard.due() == [("ta", b"2")]


@pytest.mark.parametrize("field, value", [("state_burst", 0), ("event_per_s", 0.0), ("report_every_s", -1.0),
                                          ("max_devices", 0)])
def test_limits_that_would_refuse_everything_are_refused(field, value):
    with pytest.raises(EdgeSDKError, match=f"ReportLimits.{field}="):
        ReportLimits(**{field: value})


def test_only_events_chunk_requests_and_measurement_results_are_admitted_by_kind():
    guard, _, _ = _guard()
    with pytest.raises(EdgeSDKError, match="kind='state' must be 'event', 'need' or 'measurement'"):
        guard.admit("cam0", "state")


def test_a_measurement_result_from_a_device_with_none_running_is_not_parsed(tmp_path, caplog):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from edgesdk.fleet.protocol import Topics
    from edgesdk.ota_server.devices.measurements import Measurements
    from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB

    db = FleetDB(tmp_path / "fleet.db")
    db.upsert_devices([DeviceState("cam0", "cams", "online", "digits", "1.0.0", (), 1.0)])
    measurements = Measurements(lambda topic, payload: None, Ed25519PrivateKey.generate(), db)
    measurements.request("cam0", b"an archive", "latency", 10)
    garbage = b"{" * 100_000  # parsing this fails, loudly
    with caplog.at_level("WARNING"):
        measurements.on_result(Topics.measurements("cam1"), garbage)  # cam1 has no measurement: dropped unread
        assert caplog.messages == []
        measurements.on_result(Topics.measurements("cam0"), garbage)  # cam0 has one running: read, and refused
    assert any("ignoring measurement message" in m for m in caplog.messages)
    db.close()


def test_a_device_flooding_measurement_results_is_read_only_as_far_as_its_bucket(tmp_path, monkeypatch):
    """Issue 60: results (up to 32 MiB each) bypassed the rate guard; they share the device's event bucket."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from edgesdk.fleet.protocol import Topics
    from edgesdk.ota_server.devices import measurements as module
    from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB

    guard, _, refused = _guard(event_burst=3, event_per_s=0.001)
    parsed = []
    real_parse = module.parse_result
    monkeypatch.setattr(module, "parse_result", lambda payload, limit: (parsed.append(1), real_parse(payload, limit))[1])
    db = FleetDB(tmp_path / "fleet.db")
    db.upsert_devices([DeviceState("cam0", "cams", "online", "digits", "1.0.0", (), 1.0)])
    measurements = module.Measurements(lambda topic, payload: None, Ed25519PrivateKey.generate(), db,
                                       admit=lambda device: guard.admit(device, "measurement"))
    measurements.request("cam0", b"an archive", "latency", 10)
    for _ in range(20):
        measurements.on_result(Topics.measurements("cam0"), b"{" * 1000)
    assert len(parsed) == 3 and refused == ["measurement"] * 17
    db.close()
