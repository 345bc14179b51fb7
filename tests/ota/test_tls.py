"""MQTT over TLS: mosquitto with a certificate, server and agent on mqtts:// pinning the CA."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edgesdk.errors import TransferError
from edgesdk.fleet.archive import pack_bundle
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.fleet.transport import MqttTransport
from edgesdk.ota_server.broker import LocalMosquitto, free_port
from tests.ota.conftest import wait_for


def _certificates(folder):
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgesdk test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False).sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "server.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.TraditionalOpenSSL,
                                                          serialization.NoEncryption()))
    return folder


@pytest.fixture
def tls_broker(tmp_path):
    certs = _certificates(tmp_path / "certs")
    port = free_port()
    broker = LocalMosquitto(tmp_path / "broker", port=port, conf_lines=[
        f"listener {port} 127.0.0.1", "allow_anonymous true", "persistence false",
        f"cafile {certs / 'ca.pem'}", f"certfile {certs / 'server.pem'}", f"keyfile {certs / 'server.key'}"])
    yield f"mqtts://127.0.0.1:{port}", str(certs / "ca.pem")
    broker.stop()


def test_rollout_over_tls(tls_broker, make_server, make_agent, bundles):
    url, ca = tls_broker
    server = make_server(url, ca_file=ca)
    agent = make_agent("cam0", url, ca_file=ca)
    wait_for(lambda: server.db.device("cam0"), what="device over TLS")
    server.upload(pack_bundle(bundles["1.0.0"]))
    rollout = server.start_rollout("digits", "1.0.0", "cams", RolloutPolicy(analysis=False, canary=1.0, waves=(1.0,),
                                                                             health_window_s=0))
    wait_for(lambda: server.status(rollout).state != "running", what="rollout")
    assert server.status(rollout).state == "completed" and agent.current_version() == ("digits", "1.0.0")


# paho-mqtt leaves the socket of a failed TLS handshake for the garbage collector; not ours to close.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_broker_certificate_from_another_ca_is_refused(tls_broker, tmp_path):
    url, _ = tls_broker
    other = _certificates(tmp_path / "other")
    with pytest.raises(TransferError, match="no connection"):
        MqttTransport(url, client_id="doubter", ca_file=str(other / "ca.pem"), connect_timeout=2)


def test_an_agent_that_requires_tls_refuses_a_plain_broker_and_works_over_tls(tls_broker, make_server, make_agent,
                                                                              tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from edgesdk.agent.config import AgentConfig
    from edgesdk.errors import BrokerError

    # Eavesdropping: a device told to require TLS never talks plain MQTT, whatever broker URL it is given.
    with pytest.raises(BrokerError, match=r"broker mqtt://127.0.0.1:1883 is not TLS and this agent requires TLS"):
        AgentConfig("cam9", "cams", "mqtt://127.0.0.1:1883", tmp_path / "store", require_tls=True)
    cli = subprocess.run([str(Path(sys.executable).parent / "edgesdk"), "agent", "--device-id", "cam9", "--group",
                          "cams", "--broker", "mqtt://127.0.0.1:1883", "--store", str(tmp_path / "store"),
                          "--allow-unsigned", "--require-tls"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 21 and "requires TLS" in cli.stderr
    url, ca = tls_broker
    server = make_server(url, ca_file=ca)
    make_agent("cam0", url, ca_file=ca, require_tls=True)
    wait_for(lambda: server.db.device("cam0"), what="the device over TLS")
