"""A fleet that converges, against a real mosquitto with real agents: devices offline at the push, provisioned
later, asleep past their command's expiry, or claiming another group."""

from __future__ import annotations

import time

from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import RolloutPolicy, TargetStatus
from tests.ota.conftest import wait_for
from tests.ota.test_faults import _agent_process, _target

#: Canary first, then the rest; no health window; no canary analysis (these agents serve no app traffic).
STAGED = RolloutPolicy(canary=0.5, waves=(1.0,), health_window_s=0.0, max_failure_rate=0.0, analysis=False)


def _server(make_server, broker, bundles, versions=("1.0.0", "2.0.0"), **config):
    server = make_server(broker.url, **config)
    for version in versions:
        server.upload(pack_bundle(bundles[version]))
    return server


def _online(server, n, group="cams"):
    wait_for(lambda: len(server.db.devices(group, status="online")) == n, what=f"{n} devices online")


def _on(agent, version):
    return agent.current_version() == ("digits", version)


def test_an_agent_stopped_during_a_push_converges_when_it_starts_again(broker, make_server, make_agent, bundles):
    server = _server(make_server, broker, bundles)
    agents = [make_agent(f"cam{i}", broker.url) for i in range(3)]
    _online(server, 3)
    first = server.start_rollout("digits", "1.0.0", "cams", STAGED)
    wait_for(lambda: all(_on(a, "1.0.0") for a in agents), timeout=60, what="1.0.0 everywhere")
    agents[2].stop()  # off for the next push: out of coverage, rebooting, asleep
    wait_for(lambda: server.db.device("cam2").status == "offline", what="cam2's offline state")
    wait_for(lambda: server.status(first).state == "completed", what="first rollout")
    push = server.start_rollout("digits", "2.0.0", "cams", STAGED)
    wait_for(lambda: server.status(push).state == "completed", timeout=60, what="the push")
    r = server.status(push)
    assert r.deferred == 1 and _target(server, push, "cam2").status == TargetStatus.DEFERRED
    assert "1 deferred" in r.reason and r.count(TargetStatus.TIMEOUT, TargetStatus.FAILED) == 0
    assert (server.db.release("cams").version, server.db.release("cams").rollout_id) == ("2.0.0", push)

    back = make_agent("cam2", broker.url)  # the same store: it comes back on 1.0.0
    wait_for(lambda: _on(back, "2.0.0"), timeout=60, what="cam2 converging")
    wait_for(lambda: _target(server, push, "cam2").status == TargetStatus.COMMITTED, what="cam2's late commit")
    assert _target(server, push, "cam2").late
    (group,) = [g for g in server.groups_status() if g.group == "cams"]
    wait_for(lambda: [g for g in server.groups_status() if g.group == "cams"][0].converged == 3, what="counts")


def test_a_device_provisioned_after_the_push_converges_on_first_connect(broker, make_server, make_agent, bundles):
    server = _server(make_server, broker, bundles, versions=("1.0.0",))
    make_agent("cam0", broker.url)
    _online(server, 1)
    push = server.start_rollout("digits", "1.0.0", "cams", STAGED)
    wait_for(lambda: server.status(push).state == "completed", timeout=60, what="the push")
    newcomer = make_agent("cam9", broker.url)  # provisioned and switched on after the push
    wait_for(lambda: _on(newcomer, "1.0.0"), timeout=60, what="the newcomer converging")
    target = _target(server, push, "cam9")
    wait_for(lambda: _target(server, push, "cam9").status == TargetStatus.COMMITTED, what="its late commit")
    assert target.late and target.previous_version is None


def test_a_push_to_a_group_with_no_device_online_is_accepted_and_converges_as_devices_arrive(
        broker, make_server, make_agent, bundles):
    server = _server(make_server, broker, bundles, versions=("1.0.0",))
    agents = [make_agent(f"cam{i}", broker.url) for i in range(2)]
    _online(server, 2)
    for agent in agents:
        agent.stop()
    wait_for(lambda: not server.db.devices("cams", status="online"), what="every device offline")
    push = server.start_rollout("digits", "1.0.0", "cams", STAGED)  # accepted: nobody is online
    wait_for(lambda: server.status(push).state == "completed", timeout=30, what="the push")
    assert server.status(push).deferred == 2
    returned = [make_agent(f"cam{i}", broker.url) for i in range(2)]
    wait_for(lambda: all(_on(a, "1.0.0") for a in returned), timeout=60, what="both converging")


def test_a_push_to_a_group_whose_devices_are_only_provisioned_is_canaried_on_the_first_device_to_report(
        broker, make_server, make_agent, bundles):
    """Issue 58: nothing reported, so the push is planned over the provisioned devices (it used to complete empty as
    the release, and each device got it on its first report with no stage). The first agent to start is the canary,
    though planned for the second stage; the device planned for the canary, starting next, waits for the second
    stage, since the canary has its one device (its verdict waits for figures these agents do not report)."""
    server = _server(make_server, broker, bundles, versions=("1.0.0",))
    server.provision({"cam0": "cams", "cam1": "cams"}, "devices file")
    assert server.db.devices("cams") == []  # nothing reported: the push has no board to plan for
    push = server.start_rollout("digits", "1.0.0", "cams", RolloutPolicy(canary=0.5, waves=(1.0,), health_window_s=0.0))
    planned = server.status(push)
    # The engine may already have sent the canary's stage (to nobody: its device is deferred) by this read.
    assert planned.stage_sizes == (1, 2) and planned.targets_total == 2
    assert planned.count(TargetStatus.PENDING) + planned.count(TargetStatus.DEFERRED) == 2
    wait_for(lambda: server.status(push, targets=False).stage == 0, what="the canary's stage out, to nobody")
    (first,) = [t.device_id for t in planned.targets if t.stage == 1]
    (second,) = [t.device_id for t in planned.targets if t.stage == 0]
    canary = make_agent(first, broker.url)
    wait_for(lambda: _on(canary, "1.0.0"), timeout=60, what="the first device to report, canaried")
    wait_for(lambda: _target(server, push, first).status == TargetStatus.COMMITTED, what="its commit")
    assert _target(server, push, first).stage == 0 and _target(server, push, first).previous_version is None
    other = make_agent(second, broker.url)
    wait_for(lambda: server.db.device(second) is not None and not server.db.to_reconcile("cams", 10),
             what="the second device reported and passed over")
    assert other.current_version() is None and _target(server, push, second).stage == 1
    assert server.status(push, targets=False).state == "running"


def test_devices_coming_back_together_get_their_chunks_in_one_group_publish(broker, make_server, make_agent, bundles):
    """The reconciler sends a pass's late commands at once, their plan naming the chunks the devices lack; once both
    accepted (each subscribed to the group's chunk topic first), the chunks go in one publish there: not one copy
    each, and neither device asks."""
    server = _server(make_server, broker, bundles, versions=("1.0.0",), chunk_coalesce_s=5.0)
    agents = [make_agent(f"cam{i}", broker.url) for i in range(2)]
    _online(server, 2)
    for agent in agents:
        agent.stop()
    wait_for(lambda: not server.db.devices("cams", status="online"), what="every device offline")
    one_stage = RolloutPolicy(canary=1.0, waves=(), health_window_s=0.0, max_failure_rate=0.0,  # one transfer
                              analysis=False)
    push = server.start_rollout("digits", "1.0.0", "cams", one_stage)
    wait_for(lambda: server.status(push).state == "completed", timeout=30, what="the push")
    returned = [make_agent(f"cam{i}", broker.url) for i in range(2)]
    wait_for(lambda: all(_on(a, "1.0.0") for a in returned), timeout=60, what="both converging")
    assert server.chunks.coalesced == 2 and server.chunks.resent == {}, (server.chunks.coalesced,
                                                                          dict(server.chunks.resent))
    assert server.chunks.requests == 0, f"the devices asked for chunks {server.chunks.requests} times"


def test_a_device_claiming_another_group_is_refused(broker, make_server, make_agent, bundles):
    server = _server(make_server, broker, bundles, versions=("1.0.0",))
    server.provision({"cam0": "cams", "cam1": "cams"}, "devices file")
    make_agent("cam0", broker.url)
    _online(server, 1)
    intruder = make_agent("cam1", broker.url, group="canary")  # its own report names the canary group
    time.sleep(1.0)
    assert server.db.device("cam1") is None, "the report naming another group was written"
    assert server.groups.refused >= 1 and server.db.devices("canary") == []
    push = server.start_rollout("digits", "1.0.0", "cams", STAGED)
    wait_for(lambda: server.status(push).state == "completed", timeout=60, what="the push")
    assert [t.device_id for t in server.status(push).targets] == ["cam0"]
    assert intruder.current_version() is None


def test_a_transfer_begun_before_a_long_sleep_resumes_under_a_newly_signed_command(
        tmp_path, broker, make_server, keys):
    """The device slept past its command's expiry mid-download: the kept command is refused as expired, and the
    server's new signing of the same transfer is taken up from the chunks on disk, not refused as a replay."""
    from tests.ota.test_faults import _big_bundles_in, _push_and_kill_mid_transfer

    big = _big_bundles_in(tmp_path / "big", keys)
    server = make_server(broker.url, broadcast_wait_s=0.3, command_ttl_s=4.0, resend_s=1.0)
    server.upload(pack_bundle(big["1.0.0"]))
    push = _push_and_kill_mid_transfer(tmp_path, broker, keys, server, STAGED)
    wait_for(lambda: _target(server, push, "cam0").status == TargetStatus.DEFERRED, what="deferred")
    time.sleep(4.5)  # asleep past the kept command's expiry
    server.resent.clear()
    second = _agent_process(tmp_path, broker, keys, "cam0")
    try:
        wait_for(lambda: _target(server, push, "cam0").status == TargetStatus.COMMITTED, timeout=60,
                 what="the late commit")
        events = [e for e in server.db.events(device_id="cam0") if e.type in ("accepted", "rejected")]
        assert any(e.type == "rejected" and "expired" in str(e.payload.get("reason")) for e in events), events
        accepted = [e for e in events if e.type == "accepted"]
        assert accepted[-1].payload["resumed_chunks"] >= 5, "the chunks held before the sleep were fetched again"
        assert _target(server, push, "cam0").late
    finally:
        second.terminate()
        second.wait(timeout=20)


def test_moving_a_device_is_an_admin_action_that_brings_it_to_its_new_group_release(
        broker, make_server, make_agent, bundles):
    server = _server(make_server, broker, bundles)
    mover = make_agent("cam0", broker.url)
    make_agent("lobby0", broker.url, group="lobby")
    _online(server, 1)
    _online(server, 1, group="lobby")
    to_cams = server.start_rollout("digits", "1.0.0", "cams", STAGED)
    to_lobby = server.start_rollout("digits", "2.0.0", "lobby", STAGED)
    wait_for(lambda: {server.status(r).state for r in (to_cams, to_lobby)} == {"completed"}, timeout=60,
             what="both groups' releases")
    assert _on(mover, "1.0.0")
    assert server.provision({"cam0": "lobby"}) == ["cam0"]
    wait_for(lambda: _on(mover, "2.0.0"), timeout=60, what="the moved device on lobby's release")
    wait_for(lambda: _target(server, to_lobby, "cam0").status == TargetStatus.COMMITTED, what="its late commit")
    assert server.db.device("cam0").group == "lobby"
    # The command that brought it told its agent (issue 60): its --group still says cams, its reports say lobby.
    assert mover.config.group == "lobby"
    mover.stop()
    wait_for(lambda: server.db.device("cam0").status == "offline", what="its offline state recorded")
    assert server.db.device("cam0").group == "lobby" and server.groups.refused == 0


def test_a_moved_device_follows_only_its_new_groups_release(broker, make_server, make_agent, bundles):
    """Issue 60: a move was half done: the device stayed a target of its old group's running rollout, its states
    were refused until its --group changed (so its silence counted as a failure), and its agent was never told.
    Now its old group's unsent target is skipped, its states are recorded under the new group at once, the new
    group's release reaches it, and the command that brings it tells its agent the group it is in."""
    server = _server(make_server, broker, bundles)
    server.provision({"cam0": "cams", "cam1": "cams", "lobby0": "lobby"}, "devices file")
    agents = {d: make_agent(d, broker.url, group=g) for d, g in (("cam0", "cams"), ("cam1", "cams"),
                                                               ("lobby0", "lobby"))}
    _online(server, 2)
    _online(server, 1, "lobby")
    lobby_release = server.start_rollout("digits", "1.0.0", "lobby", RolloutPolicy(canary=1.0, waves=(),
                                                                                     health_window_s=0.0,
                                                                                     analysis=False))
    wait_for(lambda: server.status(lobby_release).state == "completed", timeout=60, what="lobby's release")
    held = RolloutPolicy(canary=0.5, waves=(1.0,), health_window_s=0.0, analysis=False, auto_promote=False)
    push = server.start_rollout("digits", "2.0.0", "cams", held)
    planned = server.status(push)
    (mover,) = [t.device_id for t in planned.targets if t.stage == 1]
    (canary,) = [t.device_id for t in planned.targets if t.stage == 0]
    wait_for(lambda: _on(agents[canary], "2.0.0"), timeout=60, what="the canary's install")
    assert server.provision({mover: "lobby"}) == [mover]
    moved_target = _target(server, push, mover)
    assert moved_target.status == TargetStatus.SKIPPED and "moved to group lobby" in moved_target.reason
    # Its agent still says cams: its state is recorded in lobby, and lobby's release reaches it.
    wait_for(lambda: _on(agents[mover], "1.0.0"), timeout=60, what="lobby's release on the moved device")
    wait_for(lambda: agents[mover].config.group == "lobby", what="the agent told of its group")
    assert agents[mover].store.assigned_group() == "lobby"
    assert server.db.device(mover).group == "lobby" and server.groups.refused == 0
    wait_for(lambda: _target(server, lobby_release, mover).status == TargetStatus.COMMITTED, what="its commit")
    assert _target(server, lobby_release, mover).late
    server.promote(push)
    wait_for(lambda: server.status(push).state == "completed", timeout=60, what="cams' rollout")
    assert _on(agents[mover], "1.0.0"), "the old group's next stage did not take the moved device"
    assert not [e for e in agents[mover].events if e.get("deployment_id") == push]
