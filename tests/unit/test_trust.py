"""The root of trust (TUF-style root metadata): thresholds, rotation signed by the old and the new root keys,
revocation, rollback and expiry, and the device's store of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgesdk.errors import SignatureError, TrustError
from edgesdk.fleet.trust import (
    ROLES,
    TrustStore,
    add_signatures,
    new_root,
    parse_root,
    sign_metadata,
    trust_root,
    update_chain,
    update_root,
)
from edgesdk.runtime.signing import KeySet, key_id

YEAR = 365 * 86400


def keys(n: int) -> list[Ed25519PrivateKey]:
    return [Ed25519PrivateKey.generate() for _ in range(n)]


@pytest.fixture
def fleet():
    """Two root keys (threshold 2), two bundle keys (threshold 2), one commands key, one timestamp key."""
    return {"root": keys(2), "bundles": keys(2), "commands": keys(1), "timestamp": keys(1)}


def root_doc(fleet, version: int = 1, thresholds=None, signers=None, expires: float | None = None) -> bytes:
    thresholds = {"root": 2, "bundles": 2, "commands": 1, "timestamp": 1, **(thresholds or {})}
    signed = new_root(version, expires if expires is not None else time.time() + YEAR,
                      {role: ([k.public_key() for k in fleet[role]], thresholds[role]) for role in ROLES})
    return sign_metadata(signed, fleet["root"] if signers is None else signers)


# key sets ----------------------------------------------------------------------------------------------------

def test_a_key_set_needs_threshold_distinct_valid_signatures_of_its_own_keys():
    a, b, outsider = keys(3)
    keyset = KeySet.of([a.public_key(), b.public_key()], threshold=2)
    data = b"manifest"
    both = [(key_id(a.public_key()), a.sign(data)), (key_id(b.public_key()), b.sign(data))]
    assert set(keyset.verify(data, both, "bundle")) == {key_id(a.public_key()), key_id(b.public_key())}
    once_twice = [both[0], both[0]]
    with pytest.raises(SignatureError, match=r"bundle: 1 valid signature of the 2 required"):
        keyset.verify(data, once_twice, "bundle")
    foreign = [both[0], (key_id(outsider.public_key()), outsider.sign(data))]
    with pytest.raises(SignatureError, match=r"1 valid signature of the 2 required .*revoked or never added"):
        keyset.verify(data, foreign, "bundle")
    with pytest.raises(SignatureError, match=r"0 valid signatures"):
        keyset.verify(b"changed", both, "bundle")


@pytest.mark.parametrize("threshold", [0, 3, True])
def test_a_threshold_outside_one_to_the_key_count_is_refused(threshold):
    with pytest.raises(SignatureError, match="threshold"):
        KeySet.of([k.public_key() for k in keys(2)], threshold=threshold)


# root documents ----------------------------------------------------------------------------------------------

def test_a_new_root_lists_every_role_with_its_keys_and_threshold_and_verifies_by_its_own_root_keys(fleet):
    root = trust_root(root_doc(fleet))
    assert root.version == 1 and not root.expired()
    assert root.keyset("bundles").threshold == 2
    assert set(root.keyset("commands").keys) == {key_id(fleet["commands"][0].public_key())}
    assert set(root.roles) == set(ROLES)


def test_a_first_root_below_its_own_threshold_is_refused(fleet):
    with pytest.raises(SignatureError, match=r"root metadata v1: 1 valid signature of the 2 required"):
        trust_root(root_doc(fleet, signers=fleet["root"][:1]))


def test_signatures_are_over_canonical_json_so_reformatting_keeps_them_valid_and_editing_breaks_them(fleet):
    document = root_doc(fleet)
    reformatted = json.dumps(json.loads(document), indent=4).encode()
    assert trust_root(reformatted).version == 1
    edited = json.loads(document)
    edited["signed"]["roles"]["bundles"]["threshold"] = 1
    with pytest.raises(SignatureError, match="0 valid signatures"):
        trust_root(json.dumps(edited).encode())


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.update(signed=[]), "needs a 'signed' object"),
    (lambda d: d["signed"].update(_type="targets"), "is not root"),
    (lambda d: d["signed"].update(version=0), "version 0 must be"),
    (lambda d: d["signed"]["roles"].pop("timestamp"), "are not exactly"),
    (lambda d: d["signed"]["roles"]["root"].update(threshold=3), "threshold 3 is more than the 2 keys"),
    (lambda d: d["signed"].update(expires="next year"), "does not match format"),
])
def test_a_malformed_root_is_refused_naming_what_is_wrong(fleet, mutate, message):
    document = json.loads(root_doc(fleet))
    mutate(document)
    with pytest.raises(TrustError, match=message):
        parse_root(json.dumps(document).encode())


def test_an_oversized_root_is_refused_before_it_is_parsed():
    with pytest.raises(TrustError, match="over the 262144-byte limit"):
        parse_root(b"{" + b" " * 300_000 + b"}")


# rotation ----------------------------------------------------------------------------------------------------

def test_rotation_revokes_a_bundle_key_when_the_old_and_new_root_keys_sign(fleet):
    trusted = trust_root(root_doc(fleet))
    stolen = fleet["bundles"][0]
    fleet["bundles"] = [fleet["bundles"][1], *keys(1)]
    v2 = update_root(trusted, root_doc(fleet, version=2))
    assert key_id(stolen.public_key()) not in v2.keyset("bundles").keys
    data = b"a model signed with the stolen key and the other old key"
    with pytest.raises(SignatureError, match="1 valid signature of the 2 required"):
        v2.keyset("bundles").verify(data, [(key_id(stolen.public_key()), stolen.sign(data)),
                                           (key_id(fleet["bundles"][0].public_key()), fleet["bundles"][0].sign(data))],
                                    "bundle")


def test_a_new_root_key_set_needs_the_old_threshold_and_its_own(fleet):
    trusted = trust_root(root_doc(fleet))
    old_root_keys = fleet["root"]
    fleet["root"] = keys(2)  # replace both root keys
    only_new = root_doc(fleet, version=2, signers=fleet["root"])
    with pytest.raises(SignatureError, match=r"by the root keys of v1\): 0 valid signatures"):
        update_root(trusted, only_new)
    only_old = root_doc(fleet, version=2, signers=old_root_keys)
    with pytest.raises(SignatureError, match=r"by its own root keys\): 0 valid signatures"):
        update_root(trusted, only_old)
    both = add_signatures(only_new, old_root_keys)
    assert update_root(trusted, both).version == 2


def test_one_stolen_root_key_below_the_threshold_signs_nothing_a_device_accepts(fleet):
    trusted = trust_root(root_doc(fleet))
    attacker = keys(1)
    stolen = fleet["root"][0]
    fleet["bundles"] = attacker + keys(1)
    fleet["root"] = [stolen, *keys(1)]
    forged = root_doc(fleet, version=2, thresholds={"root": 1}, signers=[stolen])
    with pytest.raises(SignatureError, match="1 valid signature of the 2 required"):
        update_root(trusted, forged)


def test_a_rollback_or_a_replay_of_root_metadata_is_refused(fleet):
    v1 = root_doc(fleet)
    v2 = update_root(trust_root(v1), root_doc(fleet, version=2))
    with pytest.raises(TrustError, match=r"v1 is not newer than the v2 .* a rollback"):
        update_root(v2, v1)
    with pytest.raises(TrustError, match=r"v2 is not newer than the v2"):
        update_root(v2, v2.raw)


def test_a_skipped_version_is_refused_alone_and_accepted_through_the_chain(fleet):
    v1 = trust_root(root_doc(fleet))
    docs = [root_doc(fleet, version=v) for v in (2, 3, 4)]
    with pytest.raises(TrustError, match="skips versions: this device trusts v1 and takes v2 next"):
        update_root(v1, docs[2])
    steps = []
    assert update_chain(v1, reversed(docs), lambda old, new: steps.append((old.version, new.version))).version == 4
    assert steps == [(1, 2), (2, 3), (3, 4)]


def test_an_expired_root_is_still_trusted_and_says_it_expired(fleet):
    root = trust_root(root_doc(fleet, expires=time.time() - 1))
    assert root.expired() and not root.expired(now=root.expires - 10)


# the device's store ------------------------------------------------------------------------------------------

def test_the_store_keeps_every_earlier_root_and_stops_at_a_refused_step(tmp_path, fleet):
    store = TrustStore(tmp_path / "trust")
    store.provision(root_doc(fleet))
    with pytest.raises(TrustError, match="already holds root metadata"):
        store.provision(root_doc(fleet))
    good = root_doc(fleet, version=2)
    bad = root_doc(fleet, version=3, signers=fleet["root"][:1])
    with pytest.raises(SignatureError, match="root metadata v3"):
        store.update([good, bad])
    assert store.load().version == 2  # the step before the refused one was kept
    assert parse_root((tmp_path / "trust" / "root.1.json").read_bytes())[0].version == 1
    assert sorted(p.name for p in (tmp_path / "trust").iterdir()) == ["root.1.json", "root.json"]


def test_a_store_without_a_root_says_how_to_provision_it(tmp_path):
    with pytest.raises(TrustError, match="provision the device with the fleet's root.json"):
        TrustStore(tmp_path).load()


_WRITER = """
import sys
from pathlib import Path
from edgesdk.fleet.trust import TrustStore
store = TrustStore(sys.argv[1])
documents = [Path(p).read_bytes() for p in sys.argv[2:]]
store.provision(documents[0])
print("ready", flush=True)
for document in documents[1:]:  # one rotation after another: each write is one the kill may interrupt
    store.update([document])
print("done", flush=True)
"""


def test_an_agent_killed_mid_rotation_restarts_on_a_valid_root(tmp_path, fleet):
    documents = []
    for version in range(1, 61):
        path = tmp_path / f"v{version}.json"
        path.write_bytes(root_doc(fleet, version=version))
        documents.append(str(path))
    for attempt, delay in enumerate((0.02, 0.05, 0.1)):
        store_dir = tmp_path / f"trust{attempt}"
        process = subprocess.Popen([sys.executable, "-c", _WRITER, str(store_dir), *documents],
                                   stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        process.stdout.close()
        reached = TrustStore(store_dir).load().version  # whatever the kill interrupted, a valid root is there
        assert 1 <= reached <= 60
        kept = sorted(int(p.name.split(".")[1]) for p in store_dir.glob("root.*.json"))
        assert kept == list(range(1, reached)) or kept == list(range(1, reached + 1)), (reached, kept)
        assert all(parse_root(p.read_bytes())[0].version == int(p.name.split(".")[1])
                   for p in store_dir.glob("root.*.json"))
        # the device goes on from where it stopped
        assert TrustStore(store_dir).update(Path(d).read_bytes() for d in documents).version == 60


# the agent's keeper of the root ------------------------------------------------------------------------------

def test_the_keeper_applies_versions_arriving_out_of_order_and_reports_refusals(tmp_path, fleet):
    from edgesdk.agent.trust_keeper import TrustKeeper

    (tmp_path / "root.json").write_bytes(root_doc(fleet))
    refused, changed = [], []
    keeper = TrustKeeper.open(tmp_path / "trust", tmp_path / "root.json", "cam0", refused.append,
                              lambda: changed.append(keeper.root.version))
    assert keeper is not None and keeper.root.version == 1
    v2, v3 = root_doc(fleet, version=2), root_doc(fleet, version=3)
    assert keeper.receive(v3) is None and keeper.root.version == 1  # waits for v2
    assert keeper.receive(v2) is None and keeper.root.version == 3 and changed == [3]
    assert keeper.receive(v2) is None  # the retained copy of a version it went through
    forged = root_doc(fleet, version=2, expires=time.time() + 5)
    assert "rollback or forgery" in keeper.receive(forged) and refused
    short = root_doc(fleet, version=4, signers=fleet["root"][:1])
    assert "1 valid signature of the 2 required" in keeper.receive(short)
    assert keeper.root.version == 3 and keeper.state()["root_version"] == 3
    assert TrustKeeper.open(tmp_path / "elsewhere", None, "cam1", refused.append, lambda: None) is None


# freshness ---------------------------------------------------------------------------------------------------

def _timestamp(fleet, version: int, expires: float, signer=None) -> bytes:
    from edgesdk.fleet.trust import new_timestamp, targets_digest

    signed = new_timestamp(version, expires, 1, {"cams": targets_digest({"model": "digits", "version": "1.0.0"})})
    return sign_metadata(signed, [signer or fleet["timestamp"][0]])


def test_a_timestamp_verifies_by_the_timestamp_role_only(fleet):
    from edgesdk.fleet.trust import parse_timestamp

    root = trust_root(root_doc(fleet))
    stamp = parse_timestamp(_timestamp(fleet, 7, time.time() + 60), root)
    assert stamp.version == 7 and stamp.root_version == 1 and not stamp.expired() and set(stamp.targets) == {"cams"}
    with pytest.raises(SignatureError, match="timestamp v7: 0 valid signatures of the 1 required"):
        parse_timestamp(_timestamp(fleet, 7, time.time() + 60, signer=fleet["commands"][0]), root)
    with pytest.raises(TrustError, match="timestamp metadata is malformed"):
        parse_timestamp(root_doc(fleet), root)


def test_the_keeper_is_stale_without_a_timestamp_fresh_with_one_and_stale_again_when_it_expires(tmp_path, fleet):
    from edgesdk.agent.trust_keeper import TrustKeeper

    (tmp_path / "root.json").write_bytes(root_doc(fleet))
    changes = []
    keeper = TrustKeeper(tmp_path / "trust", tmp_path / "root.json", "cam0", lambda reason: None,
                         lambda: changes.append("reported"))
    now = time.time()
    assert keeper.stale() and keeper.state()["stale"] is True
    assert keeper.receive_timestamp(_timestamp(fleet, 10, now + 30)) is None
    assert not keeper.stale(now) and keeper.state()["timestamp_version"] == 10 and len(changes) == 1
    # An older timestamp (a replay) changes nothing, even one that would look fresher.
    assert keeper.receive_timestamp(_timestamp(fleet, 9, now + 3600)) is None and keeper.timestamp.version == 10
    assert len(changes) == 1  # nothing to report
    keeper.check_freshness(now + 31)
    assert keeper.stale(now + 31) and len(changes) == 2  # reported once, when it expired
    keeper.check_freshness(now + 32)
    assert len(changes) == 2
    # A restarted agent keeps the newest timestamp it had.
    again = TrustKeeper(tmp_path / "trust", None, "cam0")
    assert again.timestamp is not None and again.timestamp.version == 10


def test_the_server_publishes_growing_versions_with_each_groups_target(tmp_path, fleet):
    from edgesdk.fleet.trust import parse_timestamp, targets_digest
    from edgesdk.ota_server.devices.freshness import TimestampPublisher
    from edgesdk.ota_server.store.fleet_db import FleetDB

    db = FleetDB(tmp_path / "fleet.db")
    published = []
    clock = [1000.0]
    publisher = TimestampPublisher(db, lambda topic, doc, retain: published.append((topic, doc, retain)),
                                   fleet["timestamp"][0], root_version=1, every_s=10, expires_s=30,
                                   clock=lambda: clock[0])
    assert publisher.tick() is not None and publisher.tick() is None  # not due again yet
    clock[0] = 1000.0  # a clock that did not move cannot make the version repeat
    publisher._due = 0
    publisher.tick()
    root = trust_root(root_doc(fleet))
    stamps = [parse_timestamp(doc, root) for _, doc, _ in published]
    assert [topic for topic, _, _ in published] == ["edgesdk/trust/timestamp"] * 2 and all(r for _, _, r in published)
    assert stamps[1].version > stamps[0].version and stamps[0].expires == 1030.0
    assert stamps[0].targets == {} and targets_digest({"model": "m", "version": "1"}) != targets_digest({"model": "m"})
    db.close()


def test_a_timestamp_tells_the_time_to_a_device_whose_clock_is_not_set(tmp_path, fleet):
    """Issue 60: the ``issued`` time of the newest signed timestamp is the device's time floor; a clock before 2025
    with no timestamp refuses; a timestamp issued after it expires is malformed; an earlier server's has none."""
    from edgesdk.agent.trust_keeper import CLOCK_SET_AFTER, TrustKeeper
    from edgesdk.fleet.trust import new_timestamp, parse_timestamp

    root = trust_root(root_doc(fleet))
    issued = float(int(time.time()))
    signed = new_timestamp(3, issued + 300, 1, {}, issued=issued)
    assert parse_timestamp(sign_metadata(signed, [fleet["timestamp"][0]]), root).issued == issued
    assert parse_timestamp(_timestamp(fleet, 4, issued + 60), root).issued is None
    late = new_timestamp(5, issued, 1, {}, issued=issued + 60)
    with pytest.raises(TrustError, match="issued .* is after expires"):
        parse_timestamp(sign_metadata(late, [fleet["timestamp"][0]]), root)
    (tmp_path / "root.json").write_bytes(root_doc(fleet))
    keeper = TrustKeeper(tmp_path / "trust", tmp_path / "root.json", "cam0", lambda reason: None, lambda: None)
    with pytest.raises(TrustError, match="clock reads 1970-01-01T00:01:40Z, before 2025-01-01T00:00:00Z: it is not set"):
        keeper.command_time(100.0)
    assert keeper.command_time(CLOCK_SET_AFTER + 5) == CLOCK_SET_AFTER + 5  # a set clock, no timestamp: its own
    assert keeper.receive_timestamp(sign_metadata(signed, [fleet["timestamp"][0]])) is None
    assert keeper.command_time(100.0) == issued and keeper.command_time(issued + 9) == issued + 9
    again = TrustKeeper(tmp_path / "trust", tmp_path / "root.json", "cam0", lambda reason: None, lambda: None)
    assert again.command_time(100.0) == issued, "the floor is kept across a restart"
