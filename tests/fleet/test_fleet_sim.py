"""The simulated fleet (benchmarks/shared/fleet_sim.py) against a real mosquitto and a real OTA server."""

from __future__ import annotations

import json
import time

import pytest

from benchmarks.shared.fleet_sim import SimulatedFleet, SimulationError, device_role
from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.protocol import ArchiveInfo, Topics, sign_command
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.fleet.transport import MqttTransport
from tests.ota.conftest import wait_for

#: Its devices run no app: nothing to judge, so the canary analysis is off (as ``push --no-analysis``).
FAST = RolloutPolicy(analysis=False, canary=0.01, waves=(0.1, 1.0), health_window_s=0, max_failure_rate=0.05,
                     deploy_timeout_s=60)
#: The agent's patience as the OTA tests set it, so a device that missed the broadcast asks soon.
PATIENCE = {"broadcast_wait_s": 0.5, "retry_interval_s": 0.3}


def _server_with_bundles(start_server, broker, bundles):
    server = start_server(broker.url).ota
    for version in ("1.0.0", "2.0.0"):
        server.upload(pack_bundle(bundles[version]))
    return server


def _online(server, n):
    wait_for(lambda: len(server.db.devices("sim", status="online")) == n, timeout=30, what=f"{n} devices online")


def _finished(server, rollout_id):
    wait_for(lambda: server.status(rollout_id).state != "running", timeout=60, what=f"rollout {rollout_id} to end")
    return server.status(rollout_id)


def test_every_simulated_device_commits_a_staged_rollout(broker, start_server, keys, bundles):
    server = _server_with_bundles(start_server, broker, bundles)
    with SimulatedFleet(broker.url, keys["dir"] / "server.pub", 200, processes=2, **PATIENCE) as fleet:
        _online(server, 200)
        rollout = server.start_rollout("digits", "2.0.0", "sim", FAST)
        fleet.wait_versions("2.0.0", 200, timeout=60)
        r = _finished(server, rollout)
        report = fleet.stop()
    assert r.state == "completed", r.reason
    assert r.count("committed") == 200
    assert report.versions == {"2.0.0": 200}
    assert report.counts["committed"] == 200 and report.counts["accepted"] == 200, str(report.counts)
    assert report.installs == {rollout: 200} and report.updated_twice == 0
    assert report.counts["rejected"] == report.counts["chunks_rejected"] == 0
    archive_size = len(pack_bundle(bundles["2.0.0"]))
    # Every device fetched and checked the bytes (fewer went over the wire: zstd shrinks this small archive).
    assert report.counts["chunk_data_bytes"] >= 200 * archive_size > report.counts["chunk_bytes"]
    assert [p.devices for p in report.processes] == [100, 100] and all(p.cpu_s > 0 for p in report.processes)


def test_failing_share_makes_the_server_abort_and_revert(broker, start_server, keys, bundles):
    server = _server_with_bundles(start_server, broker, bundles)
    fleet = SimulatedFleet(broker.url, keys["dir"] / "server.pub", 200, fail_share=0.3, fetch=False, **PATIENCE)
    assert 30 <= len(fleet.failing) <= 90 and not fleet.silent
    with fleet.start():
        _online(server, 200)
        rollout = server.start_rollout("digits", "2.0.0", "sim", FAST)
        r = _finished(server, rollout)
        assert r.state == "aborted" and "failed" in r.reason
        assert r.count("rolled_back") >= 1 and r.stage < 2  # the last stage (most of the fleet) was never sent
        fleet.wait_versions("1.0.0", 200, timeout=30)  # the committed ones were reverted by signed rollbacks
        report = fleet.stop()
    # Read again: a device whose health check was still running at the abort reports its rollback after it.
    wait_for(lambda: server.status(rollout, targets=False).count("rolled_back") == report.counts["rolled_back"], 10,
             what="every device's rollback recorded")
    assert report.counts["commands"] < 200 and report.updated_twice == 0


def test_a_command_signed_by_another_key_is_rejected(broker, keys):
    archive = ArchiveInfo.of(b"not a real bundle" * 10)
    with SimulatedFleet(broker.url, keys["dir"] / "server.pub", 2, processes=1, fetch=False) as fleet:
        events: list[dict] = []
        watcher = MqttTransport(broker.url, client_id="test-watcher")
        try:
            watcher.subscribe(Topics.events(fleet.device_ids[0]), lambda t, p: events.append(json.loads(p)))
            watcher.confirm_access()

            def command(key, deployment):
                return sign_command(key, type="deploy", deployment_id=deployment, transfer_id=f"{deployment}-w0",
                                    name="digits", version="2.0.0", group="sim", archive=archive)

            watcher.publish(Topics.cmd(fleet.device_ids[0]), command(keys["converter"], "forged"))
            wait_for(lambda: any(e["event"] == "rejected" for e in events), timeout=10, what="a rejected event")
            assert "signature does not verify" in events[0]["reason"] and "deployment_id" not in events[0]
            assert fleet.versions() == {"1.0.0": 2}
            watcher.publish(Topics.cmd(fleet.device_ids[0]), command(keys["server"], "genuine"))
            wait_for(lambda: any(e["event"] == "committed" for e in events), timeout=10, what="the genuine commit")
            assert [e["event"] for e in events] == ["rejected", "accepted", "downloaded", "committed"]
            assert fleet.versions() == {"1.0.0": 1, "2.0.0": 1}
        finally:
            watcher.close()


def test_a_second_deployment_of_the_running_version_is_answered_committed_as_the_agent_does(broker, keys):
    """A device catching up on its group's release while the operator pushes that version again gets two
    deployments of it: the agent answers the second ``committed`` (already installed), not a refused downgrade."""
    archive = ArchiveInfo.of(b"a bundle" * 20)
    with SimulatedFleet(broker.url, keys["dir"] / "server.pub", 1, processes=1, fetch=False) as fleet:
        device, events = fleet.device_ids[0], []
        watcher = MqttTransport(broker.url, client_id="test-watcher")
        try:
            watcher.subscribe(Topics.events(device), lambda t, p: events.append(json.loads(p)))
            watcher.confirm_access()
            for deployment, version in (("first", "2.0.0"), ("again", "2.0.0"), ("older", "1.5.0")):
                watcher.publish(Topics.cmd(device), sign_command(
                    keys["server"], type="deploy", deployment_id=deployment, transfer_id=f"{deployment}-w0",
                    name="digits", version=version, group="sim", archive=archive))
                wait_for(lambda d=deployment: any(e.get("deployment_id") == d and e["event"] in ("committed", "rejected")
                                                  for e in events), timeout=10, what=f"the answer to {deployment}")
        finally:
            watcher.close()
        report = fleet.stop()
    answers = [(e["deployment_id"], e["event"], e.get("already_installed"), e.get("reason", "")[:17]) for e in events
               if e["event"] in ("committed", "rejected")]
    assert answers == [("first", "committed", None, ""), ("again", "committed", True, ""),
                       ("older", "rejected", None, "refused downgrade")]
    assert report.updated_twice == 0 and report.versions == {"2.0.0": 1}


def test_silent_devices_count_commands_and_answer_nothing(broker, keys):
    archive = ArchiveInfo.of(b"x" * 100)
    with SimulatedFleet(broker.url, keys["dir"] / "server.pub", 3, processes=1, silent_share=1.0) as fleet:
        before = fleet.snapshot()["counts"]["messages_out"]
        publisher = MqttTransport(broker.url, client_id="test-publisher")
        try:
            publisher.publish(Topics.cmd(fleet.silent[0]), sign_command(
                keys["server"], type="deploy", deployment_id="d1", transfer_id="d1-w0", name="digits",
                version="2.0.0", group="sim", archive=archive))
            wait_for(lambda: fleet.snapshot()["counts"].get("commands") == 1, timeout=10, what="the command")
        finally:
            publisher.close()
        # The device handles a message to the end before its worker answers a snapshot: nothing was sent.
        assert fleet.snapshot()["counts"]["messages_out"] == before
        assert fleet.versions() == {"1.0.0": 3}


def test_roles_are_chosen_by_id_and_disjoint():
    ids = [f"sim{i:05d}" for i in range(2000)]
    roles = [device_role(d, 0.2, 0.1) for d in ids]
    assert roles == [device_role(d, 0.2, 0.1) for d in ids]
    assert 300 <= roles.count("fail") <= 500 and 120 <= roles.count("silent") <= 280
    assert all(device_role(d, 0.0, 0.0) == "ok" for d in ids)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"devices": 0}, "devices=0"), ({"processes": 0}, "processes=0"),
    ({"fail_share": 0.7, "silent_share": 0.5}, "fail_share=0.7"), ({"connect_rate": -1.0}, "connect_rate=-1.0"),
    ({"group": "a/b"}, "'a/b'"), ({"version": "one"}, "one"),
])
def test_bad_settings_are_refused_with_the_value(keys, kwargs, named):
    settings = {"devices": 2, **kwargs}
    with pytest.raises(EdgeSDKError, match=named.replace(".", r"\.")):
        SimulatedFleet("mqtt://127.0.0.1:1", keys["dir"] / "server.pub", **settings)


def test_a_missing_key_file_is_named(tmp_path):
    with pytest.raises(SimulationError, match="nowhere.pub"):
        SimulatedFleet("mqtt://127.0.0.1:1", tmp_path / "nowhere.pub", 2)


def test_updated_twice_reads_the_devices_own_log_whatever_the_deployment_ids():
    from benchmarks.shared.fleet_sim_basics import updated_twice

    once = [[1.0, "r1", "2.0.0", "committed", False]]
    assert not updated_twice(once)
    # The same version again under another deployment id: the replay guard (by id) would not stop it.
    assert updated_twice([*once, [2.0, "r2", "2.0.0", "committed", False]])
    # Back to a version held before by a signed rollback is a restore; a failed install is no update.
    assert not updated_twice([*once, [2.0, "r2", "3.0.0", "committed", False], [3.0, "r3", "2.0.0", "committed", True]])
    assert not updated_twice([[1.0, "r1", "3.0.0", "rolled_back", False], [2.0, "r2", "3.0.0", "committed", False]])


def test_device_faults_do_what_they_say_and_the_rollout_still_completes(broker, start_server, keys, bundles):
    server = _server_with_bundles(start_server, broker, bundles)
    with SimulatedFleet(broker.url, keys["dir"] / "server.pub", 24, processes=2, **PATIENCE) as fleet:
        _online(server, 24)
        crashing, corrupted, slow, cut_off = (fleet.device_ids[i::6] for i in range(4))
        assert fleet.fault("crash", crashing, seconds=1.5) == len(crashing)
        assert fleet.fault("corrupt", corrupted, chunks=1) == len(corrupted)
        assert fleet.fault("slow", slow, seconds=30, delay_s=1.0) == len(slow)
        with pytest.raises(SimulationError, match="fault 'reboot' is not one of"):
            fleet.fault("reboot", crashing)
        rollout = server.start_rollout("digits", "2.0.0", "sim", FAST)
        # Cut off once targeted: the command or its chunks are lost with the link, the server sends again.
        assert fleet.fault("partition", cut_off, seconds=2.0) == len(cut_off)
        wait_for(lambda: server.db.device(cut_off[0]).status == "offline", timeout=10, what="the cut device's will")
        r = _finished(server, rollout)
        # A device cut off when its stage went out is deferred, and commits as a late target once back.
        # Late targets are chased every few seconds by the reconciler; on a loaded 2-core CI host the 24 simulated
        # devices, the broker and the server share the cores with other tests' conversions, so the wait is generous
        # and a miss says where each target stood.
        try:
            wait_for(lambda: server.status(rollout, targets=False).count("committed") == 24, timeout=150,
                     what="the cut-off devices' late commits")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {server.status(rollout, targets=False).counts}") from None
        r = server.status(rollout, targets=False)
        report = fleet.stop()
    assert r.state == "completed" and r.count("committed") == 24, (r.reason, r.counts)
    assert report.counts["crashes"] == len(crashing)  # each died in its install, and finished it on restart
    assert report.counts["chunks_rejected"] >= len(corrupted)  # a flipped byte fails the signed hash
    assert report.counts["reconnects"] == 0  # partitions and crashes reconnect on their own schedule, not on_lost
    # Whatever happened, each device's own log holds exactly one install of 2.0.0.
    assert {d: [(v, o) for _, _, v, o, _ in log] for d, log in report.install_log.items()} == {
        d: [("2.0.0", "committed")] for d in fleet.device_ids}
    assert set(report.final.values()) == {"2.0.0"}


def test_heal_ends_a_partition_early_per_device_and_connects_are_logged(broker, keys):
    with SimulatedFleet(broker.url, keys["dir"] / "server.pub", 3, processes=1, fetch=False) as fleet:
        healed, held, untouched = fleet.device_ids
        assert fleet.fault("partition", [healed, held], seconds={healed: 3600.0, held: 3600.0}) == 2
        cut_at = time.time()
        assert fleet.fault("heal", [healed, held], seconds={healed: 0.2, held: 7200.0}) == 2  # never later
        time.sleep(1.5)
        report = fleet.stop()
    assert len(report.connect_log[untouched]) == 1 and len(report.connect_log[held]) == 1
    first, again = report.connect_log[healed]
    assert first < cut_at < again < cut_at + 1.5
    assert report.device_chunk_bytes == {}  # fetch=False: no chunk was received
