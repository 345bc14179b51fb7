"""A poisoned device report (issue 36) over the real broker and server: refused and counted, and the reports of
every other device keep being written (before, one state with ``"model": {"x": 1}`` or a root version of 2**70
stopped the fleet's ingest for good)."""

from __future__ import annotations

import json

from edgesdk.fleet.protocol import Topics
from edgesdk.fleet.transport import MqttTransport
from tests.ota.conftest import wait_for


def _refused(server, kind: str, reason: str) -> float:
    text = server.metrics.render()[0].decode()
    (line,) = [x for x in text.splitlines()
               if x.startswith(f'edgesdk_ota_reports_refused_total{{kind="{kind}",reason="{reason}"}}')]
    return float(line.split()[-1])


def test_poisoned_states_between_good_ones_are_refused_and_the_good_ones_stored(broker, make_server):
    server = make_server(broker.url)
    device = MqttTransport(broker.url, client_id="devices")
    try:
        def state(name: str, **fields) -> None:
            body = {"status": "online", "group": "lab", "model": "digits", "version": "1.0.0", "slots": [], **fields}
            device.publish(Topics.state(name), json.dumps(body).encode())

        state("cam0")
        state("evil1", model={"x": 1})
        state("evil2", trust={"root_version": 2**70, "stale": False})
        device.publish(Topics.events("evil1"), json.dumps({"event": "failed", "deployment_id": {"x": 1}}).encode())
        device.publish(Topics.need("evil1"), json.dumps({"transfer_id": "t", "chunks": [2**40]}).encode())
        state("cam1", version="2.0.0")
        wait_for(lambda: server.db.device("cam1") is not None, what="the good state after the poisoned ones")
        assert server.ingest.flush(), "ingest is stuck"
        assert server.db.device("cam0").version == "1.0.0" and server.db.device("cam1").version == "2.0.0"
        assert server.db.device("evil1") is None and server.db.device("evil2") is None
        assert _refused(server, "state", "type") == 1 and _refused(server, "state", "range") == 1
        assert _refused(server, "event", "type") == 1 and _refused(server, "need", "range") == 1
        # ... and it keeps flowing: a later state of a good device is written too.
        state("cam0", version="2.0.0")
        wait_for(lambda: server.db.device("cam0").version == "2.0.0", what="cam0's next state")
        assert server.ingest.dropped == 0  # nothing malformed reached the store
    finally:
        device.close()
