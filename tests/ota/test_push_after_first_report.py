"""A push right after a device's first report counts that device: the server writes the reports it holds before it
decides, without waiting out the ingest writer's linger (with the state still queued, the group read as having no
device: CI of the fleet guide, whose push follows the agent's start)."""

from __future__ import annotations

from edgesdk.fleet.archive import pack_bundle
from tests.ota.conftest import wait_for


def test_a_push_right_after_a_device_first_reported_is_accepted(broker, start_server, make_agent, bundles):
    server = start_server(broker.url, ingest_linger_s=8.0, ingest_quiet_s=None).ota  # reports wait for the push
    server.upload(pack_bundle(bundles["2.0.0"]))
    make_agent("cam0", broker.url)
    wait_for(lambda: server.ingest.pending >= 1, timeout=30, what="the agent's first state, received and queued")
    assert server.db.devices("cams") == [], "the state is still queued, not written"
    rollout_id = server.start_rollout("digits", "2.0.0", "cams")  # waits at most 5 s for the writer, not its 8 s
    assert [t.device_id for t in server.status(rollout_id).targets] == ["cam0"]
