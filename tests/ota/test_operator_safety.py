"""What an operator relies on from the server: immutable versions, error classes as HTTP codes, no temp paths in
errors, no parsing of oversized device reports, no rollout to devices that run the version, logged transitions."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import tarfile

import paho.mqtt.client as mqtt
import pytest
from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.errors import ConflictError, EdgeSDKError, NotFoundError, SignatureError
from edgesdk.fleet.admin_client import AdminClient
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import RolloutPolicy
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
            # Retained, as devices publish their state: it reaches the server however late its subscription lands.
            client.publish("edgesdk/devices/rogue/state", huge, qos=1, retain=True).wait_for_publish(5)
            client.publish("edgesdk/devices/honest/state", json.dumps({"status": "online", "group": "cams"}).encode(),
                           qos=1, retain=True).wait_for_publish(5)
            wait_for(lambda: server.db.device("honest") is not None, what="the small state to register")
        assert server.db.device("rogue") is None
        assert any("state from device rogue" in r.getMessage() and f"{len(huge)}-byte" in r.getMessage()
                   for r in caplog.records), caplog.text
    finally:
        client.loop_stop()
        client.disconnect()


@pytest.fixture
def api(broker, start_server):
    """The admin HTTP API of an in-process server: (server, url)."""
    running = start_server(broker.url, token="s3cret")
    return running.ota, running.url


def test_the_api_keeps_versions_immutable_and_answers_with_error_classes(api, bundles, keys, tmp_path):
    from tests.ota.conftest import make_bundle

    server, url = api
    client = AdminClient(url, "s3cret")
    assert client.upload(pack_bundle(bundles["1.0.0"])) == {"name": "digits", "version": "1.0.0", "stored": True}
    assert client.upload(pack_bundle(bundles["1.0.0"])) == {"name": "digits", "version": "1.0.0", "stored": False}
    impostor = make_bundle(tmp_path / "impostor", "1.0.0", keys, seed=99)
    with pytest.raises(ConflictError) as conflict:
        client.upload(pack_bundle(impostor))
    stored, given = (hashlib.sha256((b / "manifest.json").read_bytes()).hexdigest() for b in (bundles["1.0.0"], impostor))
    assert "409" in str(conflict.value) and f"stored {stored}, given {given}" in str(conflict.value)
    assert "higher --version" in str(conflict.value)
    with pytest.raises(NotFoundError, match="404"):
        client.rollout("r-nope")
    with pytest.raises(NotFoundError, match="404"):
        client.act("r-nope", "promote")
    with pytest.raises(NotFoundError, match="no measurement"):  # a server-side subclass maps by its status
        client.measurement("m-nope")
    with pytest.raises(EdgeSDKError, match="must increase and end at 100%"):
        # Raw JSON: the typed client cannot build this policy, the API must refuse it too.
        client._json("POST", "/api/rollouts", {"name": "digits", "version": "1.0.0", "group": "cams",
                                               "policy": {"canary": 0.1, "waves": [1.0, 0.5]}})
    assert server.db.rollouts() == []


def test_the_token_file_comes_from_the_environment_and_its_absence_says_where_it_is(api, tmp_path, monkeypatch):
    _, url = api
    for name in ("EDGESDK_TOKEN", "EDGESDK_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    missing = CliRunner().invoke(cli, ["devices", "--server", url])
    assert missing.exit_code == 1
    assert "admin.token beside its --db" in missing.output and "--token-file PATH" in missing.output
    (tmp_path / "admin.token").write_text("s3cret\n")
    found = CliRunner().invoke(cli, ["devices", "--server", url, "--json"],
                               env={"EDGESDK_TOKEN_FILE": str(tmp_path / "admin.token")})
    assert found.exit_code == 0 and json.loads(found.stdout)["devices"] == [], found.output


def test_devices_at_the_version_are_not_targeted_and_transitions_are_logged(broker, make_server, make_agent,
                                                                              bundles, caplog):
    server = make_server(broker.url)
    for version in ("1.0.0", "3.0.0-bad"):
        server.upload(pack_bundle(bundles[version]))
    first = make_agent("cam0", broker.url)
    wait_for(lambda: server.db.devices("cams"), what="cam0 registered")
    now = RolloutPolicy(analysis=False, canary=1.0, waves=(), health_window_s=0)
    with caplog.at_level(logging.INFO, logger="edgesdk.ota_server.server"):
        done = server.start_rollout("digits", "1.0.0", "cams", now)
        wait_for(lambda: server.status(done).state == "completed", what="first rollout")
        with pytest.raises(ConflictError, match="already installed on all 1 devices of group 'cams'"):
            server.start_rollout("digits", "1.0.0", "cams", now)
        make_agent("cam1", broker.url)
        wait_for(lambda: len(server.db.devices("cams")) == 2, what="cam1 registered")
        second = server.start_rollout("digits", "1.0.0", "cams", now)
        assert [t.device_id for t in server.status(second).targets] == ["cam1"]
        wait_for(lambda: server.status(second).state == "completed", what="cam1 updated")
        bad = server.start_rollout("digits", "3.0.0", "cams", RolloutPolicy(analysis=False, canary=0.5, waves=(1.0,),
                                                                             health_window_s=0, auto_promote=False))
        wait_for(lambda: server.status(bad).state == "aborted", what="the bad canary to abort")
    assert first.current_version() == ("digits", "1.0.0")
    said = [r.getMessage() for r in caplog.records]
    for rollout_id in (done, second, bad):
        assert any(f"rollout {rollout_id} started" in m for m in said), said
        assert any(f"rollout {rollout_id}: stage 1 sent" in m for m in said), said
    assert any(f"rollout {done} completed" in m for m in said) and any(f"rollout {bad} aborted" in m for m in said)


def test_promote_is_logged(broker, make_server, make_agent, bundles, caplog):
    server = make_server(broker.url)
    server.upload(pack_bundle(bundles["1.0.0"]))
    for i in range(2):
        make_agent(f"cam{i}", broker.url)
    wait_for(lambda: len(server.db.devices("cams")) == 2, what="devices registered")
    policy = RolloutPolicy(analysis=False, canary=0.5, waves=(1.0,), health_window_s=0, auto_promote=False)
    with caplog.at_level(logging.INFO, logger="edgesdk.ota_server.server"):
        rollout_id = server.start_rollout("digits", "1.0.0", "cams", policy)
        wait_for(lambda: server.status(rollout_id).targets[0].status == "committed", what="the canary")
        server.promote(rollout_id)
        wait_for(lambda: server.status(rollout_id).state == "completed", what="completion")
    said = [r.getMessage() for r in caplog.records]
    assert any(f"rollout {rollout_id} promoted by operator to stage 2" in m for m in said), said
    assert any(f"rollout {rollout_id}: stage 2 sent" in m for m in said), said
