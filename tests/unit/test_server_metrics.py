"""ServerMetrics: the OTA server's Prometheus series, the fleet's counts read from a real store, and GET /metrics."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.records import RolloutPolicy, RolloutState, TargetStatus
from edgesdk.ota_server.admin.metrics import ServerMetrics
from edgesdk.ota_server.broker import free_port
from edgesdk.ota_server.store.fleet_db import FleetDB


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet(request, tmp_path):
    """A real fleet store: a SQLite file, then a fresh PostgreSQL database."""
    location = str(tmp_path / "fleet.db") if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    db = FleetDB(location)
    yield db
    db.close()


def samples(metrics: ServerMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of one scrape, keyed by (sample name, labels); parsing checks the exposition format too."""
    body, _ = metrics.render()
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def series(found: dict, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def test_devices_are_counted_by_status_model_and_version(fleet):
    fleet.upsert_device("cam-1", "lab", "online", "digits", "1.0", [])
    fleet.upsert_device("cam-2", "lab", "online", "digits", "1.0", [])
    fleet.upsert_device("cam-3", "lab", "offline", "digits", "2.0", [])
    fleet.upsert_device("cam-4", "yard", "online", None, None, [])  # reported before any install
    found = samples(ServerMetrics(fleet))
    assert series(found, "edgesdk_ota_devices", status="online", model="digits", version="1.0") == 2
    assert series(found, "edgesdk_ota_devices", status="offline", model="digits", version="2.0") == 1
    assert series(found, "edgesdk_ota_devices", status="online", model="", version="") == 1
    assert sum(v for (name, _), v in found.items() if name == "edgesdk_ota_devices") == 4
    assert series(found, "edgesdk_ota_fleet_scrape_ok") == 1


def test_rollouts_are_counted_by_state_with_zero_for_states_with_none(fleet):
    metrics = ServerMetrics(fleet)  # read at scrape time: rollouts added after it was made still show
    for device in ("cam-1", "cam-2"):
        fleet.upsert_device(device, "lab" if device == "cam-1" else "yard", "online", "digits", "1.0", [])
    fleet.add_rollout("r1", "digits", "2.0", "lab", RolloutPolicy(), [[("cam-1", "1.0")]])
    fleet.add_rollout("r2", "digits", "2.0", "yard", RolloutPolicy(), [[("cam-2", "1.0")]])
    fleet.end_rollout("r1", RolloutState.COMPLETED, "every stage done")
    found = samples(metrics)
    assert {state: series(found, "edgesdk_ota_rollouts", state=state.value) for state in RolloutState} == {
        RolloutState.RUNNING: 1, RolloutState.COMPLETED: 1, RolloutState.ABORTED: 0}


def test_a_running_rollouts_devices_are_counted_by_status_and_a_finished_one_drops_out(fleet):
    for device in ("cam-1", "cam-2", "cam-3"):
        fleet.upsert_device(device, "lab", "online", "digits", "1.0", [])
    fleet.add_rollout("r1", "digits", "2.0", "lab", RolloutPolicy(), [[("cam-1", "1.0")], [("cam-2", "1.0"),
                                                                                        ("cam-3", "1.0")]])
    fleet.set_target("r1", "cam-1", TargetStatus.COMMITTED)
    found = samples(ServerMetrics(fleet))
    labels = {"rollout": "r1", "model": "digits", "version": "2.0", "group": "lab"}
    assert series(found, "edgesdk_ota_rollout_targets", **labels, status="committed") == 1
    assert series(found, "edgesdk_ota_rollout_targets", **labels, status="pending") == 2
    fleet.end_rollout("r1", RolloutState.COMPLETED, "done")
    assert not [k for k in samples(ServerMetrics(fleet)) if k[0] == "edgesdk_ota_rollout_targets"]


def test_the_energy_devices_report_is_averaged_by_version(fleet):
    from edgesdk.ota_server.store.fleet_db import DeviceState

    fleet.upsert_devices([
        DeviceState("cam-1", "lab", "online", "digits", "1.0", (), 1.0, energy_mj=40.0, avg_watts=1.5),
        DeviceState("cam-2", "lab", "online", "digits", "1.0", (), 1.0, energy_mj=50.0, avg_watts=1.7),
        DeviceState("cam-3", "lab", "online", "digits", "2.0", (), 1.0, energy_mj=30.0, avg_watts=1.4),
        DeviceState("cam-4", "lab", "online", "digits", "2.0", (), 1.0),  # a board without a sensor
        DeviceState("cam-5", "lab", "offline", "digits", "2.0", (), 1.0, energy_mj=99.0, avg_watts=9.0)])
    # A later report without energy (a state published on an install) keeps the last known figures.
    fleet.upsert_devices([DeviceState("cam-1", "lab", "online", "digits", "1.0", (), 2.0)])
    found = samples(ServerMetrics(fleet))
    assert series(found, "edgesdk_ota_energy_per_inference_mj", model="digits", version="1.0") == pytest.approx(45.0)
    assert series(found, "edgesdk_ota_device_average_watts", model="digits", version="1.0") == pytest.approx(1.6)
    assert series(found, "edgesdk_ota_devices_reporting_energy", model="digits", version="1.0") == 2
    # Offline devices are left out: version 2.0 has one reporting device.
    assert series(found, "edgesdk_ota_energy_per_inference_mj", model="digits", version="2.0") == pytest.approx(30.0)
    assert series(found, "edgesdk_ota_devices_reporting_energy", model="digits", version="2.0") == 1


def test_counters_and_the_handling_histogram_move(tmp_path):
    metrics = ServerMetrics(FleetDB(str(tmp_path / "fleet.db")))
    assert series(samples(metrics), "edgesdk_ota_commands_sent_total") == 0
    metrics.command_sent()
    metrics.command_sent(4)
    metrics.command_resent(2)
    metrics.chunk_bytes("broadcast", 65536)
    metrics.chunk_bytes("resend", 1000)
    metrics.chunk_bytes("resend", 24)
    metrics.observe_event("state", 0.0002)
    metrics.observe_event("need", 0.3)
    metrics.report_refused("event")
    metrics.report_refused("event")
    found = samples(metrics)
    assert series(found, "edgesdk_ota_commands_sent_total") == 5
    assert series(found, "edgesdk_ota_commands_resent_total") == 2
    assert series(found, "edgesdk_ota_chunk_bytes_total", kind="broadcast") == 65536
    assert series(found, "edgesdk_ota_chunk_bytes_total", kind="resend") == 1024
    bucket = "edgesdk_ota_event_handling_seconds_bucket"
    assert series(found, bucket, kind="state", le="5e-05") == 0
    assert series(found, bucket, kind="state", le="0.00025") == 1
    assert series(found, bucket, kind="need", le="0.25") == 0
    assert series(found, bucket, kind="need", le="0.5") == 1
    assert series(found, "edgesdk_ota_event_handling_seconds_count", kind="event") == 0  # shown before the first
    assert series(found, "edgesdk_ota_reports_refused_total", kind="event", reason="flood") == 2
    assert series(found, "edgesdk_ota_reports_refused_total", kind="state", reason="flood") == 0
    metrics.report_refused("state", "type")
    found = samples(metrics)
    assert series(found, "edgesdk_ota_reports_refused_total", kind="state", reason="type") == 1
    assert series(found, "edgesdk_ota_reports_refused_total", kind="state", reason="flood") == 0
    with pytest.raises(EdgeSDKError, match="reason='nope'"):
        metrics.report_refused("state", "nope")


def test_counting_from_many_threads_loses_nothing(tmp_path):
    metrics = ServerMetrics(FleetDB(str(tmp_path / "fleet.db")))

    def work() -> None:
        for _ in range(2000):
            metrics.command_sent()
            metrics.observe_event("event", 0.001)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    found = samples(metrics)
    assert series(found, "edgesdk_ota_commands_sent_total") == 8000
    assert series(found, "edgesdk_ota_event_handling_seconds_count", kind="event") == 8000


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: m.chunk_bytes("multicast", 10), r"kind='multicast' is not one of broadcast, resend"),
    (lambda m: m.observe_event("heartbeat", 0.1), r"kind='heartbeat' is not one of state, event, need"),
    (lambda m: m.report_refused("chunk"), r"kind='chunk' is not one of state, event, need"),
    (lambda m: m.observe_event("state", -0.5), r"seconds=-0.5 must be a duration >= 0"),
    (lambda m: m.observe_event("state", float("nan")), r"seconds=nan must be a duration >= 0"),
    (lambda m: m.command_sent(-1), r"command_sent\(n=-1\): n must be a whole number >= 0"),
    (lambda m: m.command_resent(1.5), r"command_resent\(n=1.5\): n must be a whole number >= 0"),
])
def test_bad_arguments_name_the_value(tmp_path, call, message):
    metrics = ServerMetrics(FleetDB(str(tmp_path / "fleet.db")))
    with pytest.raises(EdgeSDKError, match=message):
        call(metrics)


def test_a_store_that_does_not_answer_is_reported_not_raised(tmp_path, caplog):
    db = FleetDB(str(tmp_path / "fleet.db"))
    metrics = ServerMetrics(db)
    metrics.command_sent(3)
    db.close()
    found = samples(metrics)
    assert series(found, "edgesdk_ota_fleet_scrape_ok") == 0
    assert series(found, "edgesdk_ota_commands_sent_total") == 3
    assert not any(name == "edgesdk_ota_devices" for name, _ in found)
    assert "the fleet store did not answer" in caplog.text


def _get(url: str, token: str | None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["content-type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["content-type"], exc.read().decode()


def test_metrics_route_needs_the_admin_token(tmp_path):
    from edgesdk.ota_server.admin.http_api import HttpServer, create_app
    from edgesdk.ota_server.repository import ModelRepository
    from edgesdk.ota_server.server import OTAServer, ServerConfig
    from edgesdk.runtime.signing import generate_keypair, load_private_key

    db = FleetDB(str(tmp_path / "fleet.db"))
    db.upsert_device("cam-1", "lab", "online", "digits", "1.0", [])
    key_path, _ = generate_keypair(tmp_path / "keys", "server")
    server = OTAServer(ServerConfig(broker="mqtt://127.0.0.1:1"), ModelRepository(tmp_path / "repo"), db,
                       load_private_key(key_path))  # never started: /metrics needs no broker
    metrics = ServerMetrics(db)
    metrics.command_sent(7)
    with_metrics = HttpServer(create_app(server, "s3cret", metrics=metrics), port=free_port()).start()
    without = HttpServer(create_app(server, "s3cret"), port=free_port()).start()
    try:
        status, _, body = _get(f"{with_metrics.url}/metrics", None)
        assert status == 401 and "missing or wrong token" in body
        assert _get(f"{with_metrics.url}/metrics", "wrong")[0] == 401
        status, content_type, body = _get(f"{with_metrics.url}/metrics", "s3cret")
        assert status == 200 and content_type.startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(body)}
        assert families["edgesdk_ota_commands_sent"].samples[0].value == 7
        assert [s.labels for s in families["edgesdk_ota_devices"].samples] == [
            {"status": "online", "model": "digits", "version": "1.0"}]
        status, _, body = _get(f"{without.url}/metrics", "s3cret")
        assert status == 404 and "metrics are not enabled on this server" in body
    finally:
        with_metrics.stop()
        without.stop()


def test_devices_on_a_root_of_trust_are_counted_by_root_version_and_the_stale_ones_apart(fleet):
    from edgesdk.ota_server.store.fleet_db import DeviceState

    fleet.upsert_devices([
        DeviceState("a", "cams", "online", "digits", "1.0.0", (), 1.0, root_version=2, stale=False),
        DeviceState("b", "cams", "online", "digits", "1.0.0", (), 1.0, root_version=2, stale=True),
        DeviceState("c", "cams", "online", "digits", "1.0.0", (), 1.0, root_version=1, stale=True),
        DeviceState("d", "cams", "online", "digits", "1.0.0", (), 1.0),  # no root of trust: counted in neither
        DeviceState("e", "cams", "offline", None, None, (), 1.0, root_version=2, stale=True),  # offline: not counted
    ])
    found = samples(ServerMetrics(fleet))
    assert series(found, "edgesdk_ota_devices_by_root_version", root_version="2") == 2
    assert series(found, "edgesdk_ota_devices_by_root_version", root_version="1") == 1
    assert series(found, "edgesdk_ota_devices_stale") == 2
    # A device that goes offline is no longer counted.
    fleet.upsert_devices([DeviceState("b", "cams", "offline", None, None, (), 2.0)])
    assert series(samples(ServerMetrics(fleet)), "edgesdk_ota_devices_stale") == 1
