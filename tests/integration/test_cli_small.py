"""Small CLI behaviours: verify on an unsigned bundle, bench on a bundle directory, server without its extras."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.errors import TransferError
from edgesdk.fleet.admin_client import AdminClient
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.transport import MqttTransport
from edgesdk.ota_server.broker import embedded_broker_for, free_port
from edgesdk.runtime.signing import generate_keypair
from tests.ota.conftest import make_bundle, wait_for


def _run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_verify_on_an_unsigned_bundle_says_it_is_not_signed_and_how_to_sign(tmp_path):
    private, public = generate_keypair(tmp_path / "keys", "me")
    bundle = make_bundle(tmp_path / "b", "1.0.0", {"converter": None})
    result = _run("verify", str(bundle), "--pub", str(public))
    assert result.exit_code != 0
    assert "the bundle is not signed" in result.output and "edgesdk sign BUNDLE --key KEY" in result.output
    assert "public key" not in result.output

    signed = _run("sign", str(bundle), "--key", str(private))
    assert signed.exit_code == 0, signed.output
    verified = _run("verify", str(bundle), "--pub", str(public))
    assert verified.exit_code == 0 and verified.output.startswith("OK: digits 1.0.0"), verified.output


def test_bench_accepts_a_bundle_directory_and_uses_its_power_mode(tmp_path):
    bundle = make_bundle(tmp_path / "b", "1.0.0", {"converter": None})
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["target"]["power_mode"] = "power"
    (bundle / "manifest.json").write_text(json.dumps(manifest))  # unsigned: no hash covers the manifest
    result = CliRunner().invoke(cli, ["bench", str(bundle), "--profile", "rk3588", "--runs", "3", "--warmup", "1",
                                      "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{"):])
    assert report["runs"] == 3 and report["info"]["model"] == str(bundle / "model.onnx")
    assert report["info"]["mode"] == "power" and report["info"]["power_mode"] == "efficiency"


EDGESDK = str(Path(sys.executable).parent / "edgesdk")
# Makes the named top-level modules unimportable, as if the [server] extra were not installed.
_BLOCKER = """
import os, sys
_blocked = set(os.environ["EDGESDK_TEST_BLOCK"].split(","))
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Blocker())
"""


def _server_without(tmp_path: Path, blocked: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "shim").mkdir(exist_ok=True)
    (tmp_path / "shim" / "sitecustomize.py").write_text(_BLOCKER)
    key, _ = generate_keypair(tmp_path / "keys", "server")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shim"), "EDGESDK_TEST_BLOCK": blocked}
    return subprocess.run([EDGESDK, "server", "--repo", str(tmp_path / "repo"), "--db", str(tmp_path / "fleet.db"),
                           "--key", str(key), "--allow-unsigned", *args],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("blocked, args, names", [("starlette", ["--broker", "mqtt://127.0.0.1:1"], "starlette"),
                                                  ("amqtt", ["--embedded-broker"], "amqtt")])
def test_server_without_its_extra_prints_the_install_hint(tmp_path, blocked, args, names):
    done = _server_without(tmp_path, blocked, *args)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"({names} not installed)" in errors[0], done.stderr
    assert "pip install 'edgesdk[server]'" in errors[0]
    assert not (tmp_path / "fleet.db").exists(), "nothing is started or written before the check"


def test_embedded_broker_listens_on_the_port_of_broker_and_the_server_logs_at_info(tmp_path):
    key, _ = generate_keypair(tmp_path / "keys", "server")
    port, http_port = free_port(), free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen([EDGESDK, "server", "--broker", f"mqtt://127.0.0.1:{port}", "--embedded-broker",
                                   "--repo", str(tmp_path / "repo"), "--db", str(tmp_path / "fleet.db"), "--key",
                                   str(key), "--allow-unsigned", "--http",
                                   f"127.0.0.1:{http_port}", "--token", "s3cret"], stdout=log, stderr=log)
    try:
        wait_for(lambda: "admin API" in log_path.read_text() or server.poll() is not None, what="edgesdk server")
        assert server.poll() is None, log_path.read_text()
        assert f"embedded MQTT broker on mqtt://127.0.0.1:{port}" in log_path.read_text()
        device = MqttTransport(f"mqtt://127.0.0.1:{port}", client_id="probe")
        wait_for(lambda: device.connected, what="a client connected to the embedded broker")
        device.close()

        client = AdminClient(f"http://127.0.0.1:{http_port}", "s3cret")
        client.upload(pack_bundle(make_bundle(tmp_path / "b", "1.0.0", {"converter": None})))
        wait_for(lambda: "INFO edgesdk.ota_server.server: stored bundle digits 1.0.0" in log_path.read_text(),
                 what="the server's INFO log")
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_the_embedded_broker_takes_a_loopback_mqtt_address_only():
    for url in ("mqtts://127.0.0.1:8883", "mqtt://0.0.0.0:1883"):
        with pytest.raises(TransferError, match="loopback only"):
            embedded_broker_for(url)
    broker = embedded_broker_for(None)  # no --broker: a free port
    try:
        with pytest.raises(TransferError, match=f"cannot listen on 127.0.0.1:{broker.port}.*free port"):
            embedded_broker_for(broker.url)
    finally:
        broker.stop()


@pytest.mark.parametrize("value, says", [("0s", "'0s' must be a positive duration, e.g. 5s"),
                                         ("soon", "'soon' is not a duration")])
def test_a_reconcile_interval_that_is_not_a_positive_duration_is_refused_before_the_server_starts(tmp_path, value,
                                                                                                  says):
    private, _ = generate_keypair(tmp_path / "keys", "server")
    result = _run("server", "--broker", "mqtt://127.0.0.1:1", "--repo", str(tmp_path / "repo"), "--db",
                  str(tmp_path / "fleet.db"), "--key", str(private), "--reconcile-every", value)
    assert result.exit_code != 0 and says in result.output, result.output
    assert not (tmp_path / "fleet.db").exists(), "nothing was started"
