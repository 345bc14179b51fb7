"""Server-side refusals an operator relies on: no temp paths in errors, no parsing of oversized device reports."""

from __future__ import annotations

import io
import json
import logging
import tarfile

import paho.mqtt.client as mqtt
import pytest

from edgesdk.errors import EdgeSDKError, SignatureError
from edgesdk.ota import pack_bundle
from edgesdk.ota_server.server import MAX_REPORT_BYTES
from tests.ota.conftest import wait_for


def _retarred(bundle_dir, change) -> bytes:
    """The bundle's upload tar with one member's bytes changed by ``change(name, data)``."""
    source = tarfile.open(fileobj=io.BytesIO(pack_bundle(bundle_dir)))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for member in source.getmembers():
            data = change(member.name, source.extractfile(member).read())
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return out.getvalue()


def test_upload_errors_name_bundle_files_not_server_temp_paths(broker, make_server, bundles):
    server = make_server(broker.url)
    tampered = _retarred(bundles["1.0.0"], lambda name, data: data[:-1] + bytes([data[-1] ^ 1])
                         if name.endswith(".onnx") else data)
    with pytest.raises(SignatureError) as caught:
        server.upload(tampered)
    message = str(caught.value)
    assert "model.onnx" in message and "/tmp" not in message and "edgesdk-upload" not in message, message
    with pytest.raises(EdgeSDKError) as garbage:
        server.upload(b"not a tar at all" * 100)
    assert "/tmp" not in str(garbage.value) and "not a complete uncompressed tar" in str(garbage.value)


def test_oversized_device_reports_are_refused_unparsed(broker, make_server, caplog):
    server = make_server(broker.url)
    client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id="rogue")
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        huge = json.dumps({"status": "online", "group": "cams", "pad": "x" * (MAX_REPORT_BYTES + 1)}).encode()
        with caplog.at_level(logging.WARNING, logger="edgesdk.ota_server.server"):
            client.publish("edgesdk/devices/rogue/state", huge, qos=1).wait_for_publish(5)
            client.publish("edgesdk/devices/honest/state", json.dumps({"status": "online", "group": "cams"}).encode(),
                           qos=1).wait_for_publish(5)
            wait_for(lambda: server.db.device("honest") is not None, what="the small state to register")
        assert server.db.device("rogue") is None
        assert any("rogue/state" in r.getMessage() and "at most" in r.getMessage() for r in caplog.records)
    finally:
        client.loop_stop()
        client.disconnect()
