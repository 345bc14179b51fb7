"""Rollback protection against the commands key (issue 36, part 5): a release signed with a rollback floor stops
every later command, however validly signed, from taking the device below it; real agents over a real mosquitto."""

from __future__ import annotations

from edgesdk.runtime.bundle import read_bundle, sign_bundle
from tests.ota.conftest import FAST, make_bundle, wait_for


def _finished(server, rollout_id):
    wait_for(lambda: server.status(rollout_id).state != "running", timeout=60, what=f"rollout {rollout_id}")
    return server.status(rollout_id)


def test_a_signed_rollback_below_the_floor_is_refused_above_it_taken_and_the_floor_survives_a_restart(
        tmp_path, broker, make_server, make_agent, bundles, keys):
    server = make_server(broker.url)
    agent = make_agent("cam0", broker.url, keep_slots=3)
    wait_for(lambda: server.db.device("cam0"), what="device")
    v25 = make_bundle(tmp_path / "v25", "2.5.0", keys, seed=2)
    sign_bundle(v25, keys["converter"], rollback_floor="2.0.0")  # the bundles key signs the floor
    assert read_bundle(v25, public_key=keys["converter_pub"], require_signature=True).manifest.rollback_floor == "2.0.0"
    for path in (bundles["1.0.0"], bundles["2.0.0"], v25):
        server.repo.add(path)
    for version in ("1.0.0", "2.0.0", "2.5.0"):
        assert _finished(server, server.start_rollout("digits", version, "cams", FAST)).state == "completed"
    assert agent.current_version() == ("digits", "2.5.0")
    last = server.db.release("cams").rollout_id
    wait_for(lambda: agent.state()["rollback_floors"] == {"digits": {"floor": "2.0.0", "set_by": "2.5.0"}},
             what="the floor in the device's state")

    # The commands key (the server's) signs a rollback to 1.0.0, a slot the device holds: refused, the model stays.
    refused = _finished(server, server.rollback(last, to_version="1.0.0"))
    (target,) = refused.targets
    assert target.status in ("rejected", "failed"), target
    assert "below the rollback floor: digits 1.0.0 is below 2.0.0, the floor set by the signed release digits 2.5.0" \
        in (target.reason or ""), target
    assert agent.current_version() == ("digits", "2.5.0") and agent.store.has_slot("digits-1.0.0")
    assert any(e["event"] == "rejected" and "rollback floor" in e["reason"] for e in agent.events)

    # At the floor is allowed.
    back = _finished(server, server.rollback(last, to_version="2.0.0"))
    assert back.state == "completed" and agent.current_version() == ("digits", "2.0.0")

    # A restarted agent keeps the floor (2.0.0 carries none: the floor is never lowered).
    agent.stop()
    wait_for(lambda: server.db.device("cam0").status == "offline", what="the stopped agent's last word")
    again = make_agent("cam0", broker.url, keep_slots=3)
    assert again.state()["rollback_floors"] == {"digits": {"floor": "2.0.0", "set_by": "2.5.0"}}
    # The server must see the restarted device online before the push, else its target is deferred, not refused.
    wait_for(lambda: (d := server.db.device("cam0")).status == "online" and d.version == "2.0.0",
             what="the restarted device's report")
    refused_again = _finished(server, server.rollback(back.id, to_version="1.0.0"))
    (target,) = refused_again.targets
    assert "below the rollback floor" in (target.reason or ""), target
    assert again.current_version() == ("digits", "2.0.0")
