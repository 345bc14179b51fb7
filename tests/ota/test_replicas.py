"""Several `edgesdk server --replica` processes on one PostgreSQL and one mosquitto: device reports split between
them through shared subscriptions, the admin API answers on each, and a rollout whose driving replica is killed
mid-stage is taken over within its lease and one re-send, and completes with no device installing a version twice
(by the devices' own install logs) and none lost."""

from __future__ import annotations

import json
import time
import urllib.request

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.fleet.fleet_servers import TOKEN, ServerProcess
from benchmarks.shared.fleet_sim import SimulatedFleet
from edgesdk.cli import cli
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.protocol import Topics
from edgesdk.fleet.records import RolloutPolicy, RolloutState, TargetStatus
from edgesdk.fleet.transport import MqttTransport
from edgesdk.ota_server.broker import LocalMosquitto
from tests.ota.conftest import read_retained, wait_for

DEVICES = 120
LEASE_S, RESEND_S = 2.0, 3.0  # the replicas' --lease, and ServerConfig.resend_s's default


def _events_handled(server: ServerProcess) -> float:
    request = urllib.request.Request(f"{server.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    text = urllib.request.urlopen(request, timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "edgesdk_ota_event_handling_seconds_count" and sample.labels.get("kind") == "event":
                return sample.value
    return 0.0


def test_a_killed_driver_hands_its_rollout_to_another_replica(tmp_path, keys, bundles, postgres_url):
    broker = LocalMosquitto(tmp_path / "broker", max_open_files=4096)
    servers = [ServerProcess(tmp_path, broker.url, postgres_url, keys["dir"], f"replica-{i}", replica=True,
                             lease=f"{LEASE_S:g}s") for i in range(2)]
    fleet = SimulatedFleet(broker.url, keys["dir"] / "server.pub", DEVICES, group="cams", model="digits",
                           version="1.0.0", processes=2)
    try:
        fleet.start(timeout=60)
        wait_for(lambda: all(s.client.device_page("cams", status="online", limit=1).total == DEVICES for s in servers),
                 what="every replica lists the whole fleet")
        servers[0].client.upload(pack_bundle(bundles["2.0.0"]))
        rollout_id = servers[1].client.start_rollout("digits", "2.0.0", "cams", RolloutPolicy(  # no app: no analysis
            canary=0.1, waves=(1.0,), health_window_s=0, max_failure_rate=0.0, deploy_timeout_s=120, analysis=False))

        def last_stage_sent():
            r = servers[0].client.rollout(rollout_id, limit=0)
            return r if r.stage == r.stage_count - 1 and r.driver else None

        wait_for(last_stage_sent, timeout=60, interval=0.02, what="the last stage sent")
        assert all(_events_handled(s) > 0 for s in servers), "both replicas took part of the canary's reports"
        at_kill = last_stage_sent()
        driver = next(s for s in servers if s.name == at_kill.driver)
        survivor = next(s for s in servers if s is not driver)
        driver.kill()
        killed_at = time.monotonic()
        assert driver.process.returncode == -9, "the driver was killed, not stopped"
        assert at_kill.count(TargetStatus.COMMITTED) < DEVICES, "the driver died mid-stage"

        # The survivor drives once the dead driver's lease has run out; a protocol bound (lease + one re-send +
        # 2 s for ticks and polling), not a speed figure: a replica that waited for anything else would miss it.
        wait_for(lambda: survivor.client.rollout(rollout_id, limit=0).driver == survivor.name, timeout=60,
                 interval=0.02, what="the survivor to take the rollout over")
        takeover_s = time.monotonic() - killed_at
        assert takeover_s <= LEASE_S + RESEND_S + 2.0, f"take-over after {takeover_s:.1f} s"
        wait_for(lambda: survivor.client.rollout(rollout_id, limit=0).state != RolloutState.RUNNING, timeout=90,
                 what="the rollout to end on the surviving replica")
        final = survivor.client.rollout(rollout_id, limit=0)
        assert final.state == RolloutState.COMPLETED and final.driver == survivor.name, final
        assert final.counts == {TargetStatus.COMMITTED: DEVICES}
    finally:
        report = fleet.stop()
        for s in servers:
            s.stop()
        broker.stop()
    assert report.versions == {"2.0.0": DEVICES}
    # Each device's own log: exactly one install, of 2.0.0, by this rollout (a second one under any deployment id
    # would show here, which the simulator's replay guard could not hide).
    assert {d: [(deployment, version) for _, deployment, version, _, _ in log]
            for d, log in report.install_log.items()} == {d: [(rollout_id, "2.0.0")] for d in fleet.device_ids}
    assert report.updated_twice == 0


def test_replicas_need_a_shared_postgresql_database(tmp_path, keys):
    result = CliRunner().invoke(cli, ["server", "--broker", "mqtt://127.0.0.1:1", "--repo", str(tmp_path / "repo"),
                                      "--db", str(tmp_path / "fleet.db"), "--key", str(keys["dir"] / "server.key"),
                                      "--replica"])
    assert result.exit_code == 2 and "--replica needs a PostgreSQL --db" in result.output
    result = CliRunner().invoke(cli, ["server", "--broker", "mqtt://127.0.0.1:1", "--repo", str(tmp_path / "repo"),
                                      "--db", "postgresql://edgesdk@127.0.0.1:1/fleet", "--key",
                                      str(keys["dir"] / "server.key")])
    assert result.exit_code == 2 and "--token or --token-file" in result.output


def test_when_a_replica_dies_the_others_read_the_devices_retained_states_again(tmp_path, keys, make_server,
                                                                                postgres_url):
    """Each device state reaches one replica, which acknowledges it on receipt and writes it a moment later: a
    replica killed in between takes the device's newest state with it. Its last will tells the others."""
    broker = LocalMosquitto(tmp_path / "broker", max_open_files=4096)
    try:
        survivor = make_server(broker.url, db=postgres_url, share_group="edgesdk", name="replica-a",
                               catch_up_quiet_s=0.3)
        doomed = ServerProcess(tmp_path, broker.url, postgres_url, keys["dir"], "replica-b", replica=True)
        device = MqttTransport(broker.url, client_id="cam0")
        device.publish(Topics.state("cam0"), json.dumps({"status": "online", "group": "cams", "model": "digits",
                                                         "version": "2.0.0", "slots": ["digits-2.0.0"]}).encode(),
                       retain=True)
        wait_for(lambda: (survivor.db.device("cam0") or None) and survivor.db.device("cam0").version == "2.0.0",
                 what="the state written by one replica or the other")
        # The write the dead replica never made: the store still holds the device's previous state.
        survivor.db.upsert_device("cam0", "cams", "online", "digits", "1.0.0", ["digits-1.0.0"])
        doomed.kill()
        wait_for(lambda: survivor.db.device("cam0").version == "2.0.0", timeout=30,
                 what="the survivor to read the retained state again")
        device.close()
        assert json.loads(read_retained(broker.url, Topics.server("replica-b"))) == {"status": "offline"}  # its will
        assert json.loads(read_retained(broker.url, Topics.server("replica-a"))) == {"status": "online"}
        survivor.stop()
        survivor.db.close()  # the fixture stops servers, and leaves their stores open
    finally:
        broker.stop()


def test_a_benchmark_server_whose_port_was_taken_starts_on_another(tmp_path, keys, monkeypatch):
    import socket

    import benchmarks.fleet.fleet_servers as fleet_servers

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    real = fleet_servers.free_port
    monkeypatch.setattr(fleet_servers, "free_port", lambda: next(ports, None) or real())
    broker = LocalMosquitto(tmp_path / "broker")
    server = ServerProcess(tmp_path, broker.url, str(tmp_path / "fleet.db"), keys["dir"], "port-taken")
    try:
        assert server.port != taken.getsockname()[1]
        assert "address already in use" in server.log_path.read_text()
        assert server.client.device_page("cams", limit=1).total == 0
    finally:
        server.process.terminate()
        server.process.wait(10)
        broker.stop()
        taken.close()
