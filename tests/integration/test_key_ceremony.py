"""The key ceremony from the CLI: a fleet's first root, a rotation signed in turn by two holders, a revocation,
and a device's trust store following every step (issue 23, part 1)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgesdk.errors import SignatureError, TrustError
from edgesdk.fleet import key_ceremony
from edgesdk.fleet.trust import TrustStore, parse_root
from edgesdk.runtime.signing import key_id, load_private_key, load_public_key

EDGESDK = [str(Path(sys.executable).parent / "edgesdk")]


def edgesdk(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EDGESDK, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=60)


def show(path: Path, cwd: Path) -> dict:
    result = edgesdk("keys", "show", path, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_init_rotate_in_turn_and_revoke_from_the_cli_and_a_device_follows(tmp_path):
    made = edgesdk("keys", "init", "--out", "fleet", "--keys", "root=3", "--threshold", "root=2", "--keys", "bundles=2",
                   "--threshold", "bundles=2", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    fleet = tmp_path / "fleet"
    v1 = show(fleet / "root.json", tmp_path)
    assert v1["version"] == 1 and v1["roles"]["root"]["threshold"] == 2 and len(v1["roles"]["root"]["keyids"]) == 3
    assert len(v1["signed_by"]) == 3
    device = TrustStore(tmp_path / "device" / "trust")
    device.provision((fleet / "root.json").read_bytes())

    # The bundles key 1 leaks: rotate in a new one. The first holder signs; devices would refuse it yet.
    assert edgesdk("keys", "generate", "--out", "new", "--name", "bundles-3", cwd=tmp_path).returncode == 0
    leaked = key_id(load_public_key(fleet / "keys" / "bundles-1.pub"))
    rotated = edgesdk("keys", "rotate", fleet / "root.json", "--role", "bundles", "--add", "new/bundles-3.pub",
                      "--remove", leaked, "--sign-with", fleet / "keys" / "root-1.key", "--out", "root.v2.json",
                      cwd=tmp_path)
    assert rotated.returncode == 27, rotated.stderr
    assert "devices will refuse it until it has 1 more signature(s) by the root keys of v1" in rotated.stderr
    assert "edgesdk keys sign-root root.v2.json --key KEY" in rotated.stderr
    with pytest.raises(SignatureError, match="1 valid signature of the 2 required"):
        device.update([(tmp_path / "root.v2.json").read_bytes()])
    signed = edgesdk("keys", "sign-root", "root.v2.json", "--key", fleet / "keys" / "root-2.key", cwd=tmp_path)
    assert signed.returncode == 0, signed.stderr
    v2 = device.update([(tmp_path / "root.v2.json").read_bytes()])
    assert v2.version == 2 and leaked not in v2.keyset("bundles").keys

    # A model signed by the leaked key and the other old bundles key no longer reaches the threshold.
    data = b"manifest of a model the attacker signed"
    leaked_key, other = (load_private_key(fleet / "keys" / f"bundles-{i}.key") for i in (1, 2))
    with pytest.raises(SignatureError, match="1 valid signature of the 2 required"):
        v2.keyset("bundles").verify(data, [(leaked, leaked_key.sign(data)),
                                           (key_id(other.public_key()), other.sign(data))], "bundle")

    # Root key 3's holder leaves: revoke it, signed by the other two at once.
    departed = key_id(load_public_key(fleet / "keys" / "root-3.pub"))
    revoked = edgesdk("keys", "revoke", "root.v2.json", "--key-id", departed, "--sign-with", fleet / "keys" / "root-1.key",
                      "--sign-with", fleet / "keys" / "root-2.key", "--out", "root.v3.json", cwd=tmp_path)
    assert revoked.returncode == 0, revoked.stderr
    v3 = device.update([(tmp_path / "root.v3.json").read_bytes()])
    assert v3.version == 3 and departed not in v3.keys
    assert sorted(p.name for p in device.directory.iterdir()) == ["root.1.json", "root.2.json", "root.json"]


def test_a_second_init_and_unknown_roles_are_refused(tmp_path):
    assert edgesdk("keys", "init", "--out", "fleet", cwd=tmp_path).returncode == 0
    again = edgesdk("keys", "init", "--out", "fleet", cwd=tmp_path)
    assert again.returncode == 27 and "a fleet's root is made once, then rotated" in again.stderr
    unknown = edgesdk("keys", "init", "--out", "other", "--keys", "firmware=2", cwd=tmp_path)
    assert unknown.returncode == 27 and "unknown role(s) ['firmware']" in unknown.stderr


@pytest.fixture
def fleet(tmp_path):
    root_path, private = key_ceremony.init_fleet(tmp_path / "fleet", {"root": 2, "bundles": 2},
                                                 {"root": 2, "bundles": 2})
    return root_path.read_bytes(), {role: [load_private_key(p) for p in paths] for role, paths in private.items()}


def test_a_rotation_that_leaves_a_role_below_its_threshold_is_refused_with_the_fix(fleet):
    document, private = fleet
    bundles = parse_root(document)[0].roles["bundles"].keyids
    with pytest.raises(TrustError, match="role bundles would have 1 key.*threshold 2.*add keys"):
        key_ceremony.rotate(document, "bundles", private["root"], remove=[bundles[0]])
    with pytest.raises(TrustError, match="role bundles of v1 has no key 0000"):
        key_ceremony.rotate(document, "bundles", private["root"], remove=["0000"])


def test_revoking_a_key_a_role_cannot_spare_says_to_rotate_a_replacement_in_first(fleet):
    document, private = fleet
    commands = parse_root(document)[0].roles["commands"].keyids[0]
    with pytest.raises(TrustError, match=r"leaves role commands 0 key\(s\) .* --role commands --add NEW.pub"):
        key_ceremony.revoke(document, commands, private["root"])


def test_a_rotation_signed_only_by_outsiders_lists_every_missing_signature(fleet):
    document, _ = fleet
    result = key_ceremony.rotate(document, "commands", [Ed25519PrivateKey.generate()], threshold=1)
    assert result.version == 2 and len(result.missing) == 2
    assert result.missing[0].startswith("2 more signature(s) by the root keys of v1")


def test_publish_sends_every_root_version_retained_and_refuses_a_malformed_one(tmp_path):
    from edgesdk.fleet.protocol import Topics
    from edgesdk.fleet.transport import MqttTransport
    from edgesdk.ota_server.broker import LocalMosquitto

    root_path, private = key_ceremony.init_fleet(tmp_path / "fleet", {}, {})
    root_keys = [load_private_key(p) for p in private["root"]]
    v2 = key_ceremony.rotate(root_path.read_bytes(), "commands", root_keys, threshold=1)
    (tmp_path / "root.v2.json").write_bytes(v2.document)
    (tmp_path / "bad.json").write_text("{}")
    broker = LocalMosquitto(tmp_path / "broker")
    try:
        refused = edgesdk("keys", "publish", "bad.json", "--broker", broker.url, cwd=tmp_path)
        assert refused.returncode == 27 and "root metadata is malformed" in refused.stderr
        published = edgesdk("keys", "publish", "root.v2.json", root_path, "--broker", broker.url, cwd=tmp_path)
        assert published.returncode == 0, published.stderr
        assert published.stdout.splitlines() == [f"published root v1 on {Topics.root(1)} (retained)",
                                                 f"published root v2 on {Topics.root(2)} (retained)"]
        received: dict[str, bytes] = {}
        reader = MqttTransport(broker.url, client_id="device-like")
        reader.subscribe(Topics.ALL_ROOTS, lambda topic, payload: received.__setitem__(topic, payload))
        deadline = time.monotonic() + 10
        while len(received) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        reader.close()
        assert received == {Topics.root(1): root_path.read_bytes(), Topics.root(2): v2.document}
    finally:
        broker.stop()
