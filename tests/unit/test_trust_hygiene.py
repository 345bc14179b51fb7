"""Freshness and root hygiene (issue 36, part 6): the rollback floor's carrier, a timestamp dropped when its keys
rotate, timestamp versions from the fleet store's counter, and bounded waiting roots."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgesdk.agent.trust_keeper import TrustKeeper
from edgesdk.errors import BundleError
from edgesdk.fleet.trust import (
    MAX_PENDING_ROOT_BYTES,
    MAX_PENDING_ROOTS,
    MAX_ROOTS_AHEAD,
    ROLES,
    new_root,
    new_timestamp,
    parse_timestamp,
    sign_metadata,
    trust_root,
)
from edgesdk.runtime.bundle import read_bundle, sign_bundle, signers
from edgesdk.runtime.signing import key_id
from tests.unit.test_trust import YEAR, keys, root_doc


@pytest.fixture
def fleet():
    return {"root": keys(2), "bundles": keys(2), "commands": keys(1), "timestamp": keys(1)}


def _keeper(tmp_path: Path, fleet) -> TrustKeeper:
    (tmp_path / "root.json").write_bytes(root_doc(fleet))
    return TrustKeeper(tmp_path / "trust", tmp_path / "root.json", "cam0")


def _stamp(version: int, key, expires: float | None = None) -> bytes:
    return sign_metadata(new_timestamp(version, expires or time.time() + 60, 1, {}), [key])


# the rollback floor's carrier ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_bundle(tmp_path_factory):
    from tests.ota.conftest import make_bundle

    ci = Ed25519PrivateKey.generate()
    return make_bundle(tmp_path_factory.mktemp("b") / "v2", "2.0.0", {"converter": ci}, seed=2)


def test_the_floor_is_written_before_the_first_signature_and_refused_once_others_signed(tmp_path, plain_bundle):
    import shutil

    ci, release = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    bundle = tmp_path / "b"
    shutil.copytree(plain_bundle, bundle)
    (bundle / "signature.json").unlink()
    signed = sign_bundle(bundle, ci, rollback_floor="1.5.0")
    assert signed.manifest.rollback_floor == "1.5.0"
    assert json.loads((bundle / "manifest.json").read_bytes())["rollback_floor"] == "1.5.0"
    sign_bundle(bundle, release)  # the second signer signs the same bytes, floor included
    from edgesdk.runtime.signing import KeySet
    both = KeySet.of([ci.public_key(), release.public_key()], 2)
    assert read_bundle(bundle, public_key=both, require_signature=True).manifest.rollback_floor == "1.5.0"
    # Changing the floor now would void the release manager's signature: refused, nothing written.
    before = (bundle / "manifest.json").read_bytes()
    with pytest.raises(BundleError, match=rf"already signed by .*{key_id(release.public_key())}.*set --rollback-floor "
                                          "with the first signature"):
        sign_bundle(bundle, ci, rollback_floor="2.0.0")
    assert (bundle / "manifest.json").read_bytes() == before and len(signers(bundle)) == 2
    # A floor above the release itself could never be met.
    fresh = tmp_path / "c"
    shutil.copytree(plain_bundle, fresh)
    (fresh / "signature.json").unlink()
    with pytest.raises(BundleError, match=r"rollback_floor '3.0.0' must be a version at or below the bundle's own "
                                          r"'2.0.0'"):
        sign_bundle(fresh, ci, rollback_floor="3.0.0")


def test_the_cli_signs_with_a_floor(tmp_path, plain_bundle):
    import shutil

    from click.testing import CliRunner

    from edgesdk.cli import cli
    from edgesdk.runtime.signing import generate_keypair

    generate_keypair(tmp_path, "ci")
    bundle = tmp_path / "b"
    shutil.copytree(plain_bundle, bundle)
    (bundle / "signature.json").unlink()
    result = CliRunner().invoke(cli, ["sign", str(bundle), "--key", str(tmp_path / "ci.key"), "--rollback-floor",
                                       "2.0.0"])
    assert result.exit_code == 0, result.output
    assert "rollback floor 2.0.0" in result.output
    assert read_bundle(bundle).manifest.rollback_floor == "2.0.0"


# the floor on the device ------------------------------------------------------------------------------------

def test_a_damaged_floors_file_refuses_rather_than_lifting_the_floors(tmp_path):
    from edgesdk.agent.admission import below_floor
    from edgesdk.agent.rollback_floor import FLOORS_FILE
    from edgesdk.agent.store import ModelStore
    from edgesdk.fleet.protocol import parse_command, sign_command

    store = ModelStore(tmp_path / "store")
    key = Ed25519PrivateKey.generate()
    command = parse_command(sign_command(key, type="rollback", deployment_id="d1", transfer_id="d1", name="digits",
                                         version="1.0.0", group="cams", rollback=True), key.public_key())
    assert below_floor(command, store) is None  # no floor yet
    (store.root / FLOORS_FILE).write_text('{"digits": {"floor": ')
    assert "rollback_floors.json is damaged" in below_floor(command, store)


# freshness -----------------------------------------------------------------------------------------------------

def test_rotating_the_timestamp_keys_drops_the_held_timestamp_so_a_lower_honest_version_is_taken(tmp_path, fleet):
    keeper = _keeper(tmp_path, fleet)
    stolen = fleet["timestamp"][0]
    assert keeper.receive_timestamp(_stamp(10**15, stolen)) is None  # the thief's sky-high version
    assert keeper.timestamp.version == 10**15
    honest_before = _stamp(5, stolen)
    assert keeper.receive_timestamp(honest_before) is None and keeper.timestamp.version == 10**15  # shadowed
    # Root v2 rotates the timestamp role to a new key (other roles unchanged).
    fleet2 = {**fleet, "timestamp": keys(1)}
    assert keeper.receive(root_doc(fleet2, version=2, signers=fleet["root"])) is None
    assert keeper.root.version == 2 and keeper.timestamp is None
    assert not (tmp_path / "trust" / "timestamp.json").exists() and keeper.stale()
    assert keeper.receive_timestamp(_stamp(6, fleet2["timestamp"][0])) is None
    assert keeper.timestamp.version == 6 and not keeper.stale()
    # A restarted agent holds the honest one, and the thief's old one is refused (its key is gone).
    again = TrustKeeper(tmp_path / "trust", None, "cam0")
    assert again.timestamp is not None and again.timestamp.version == 6
    assert "timestamp v1000000000000000: 0 valid signatures" in again.receive_timestamp(_stamp(10**15, stolen))


def test_a_root_that_keeps_the_timestamp_keys_keeps_the_timestamp(tmp_path, fleet):
    keeper = _keeper(tmp_path, fleet)
    assert keeper.receive_timestamp(_stamp(7, fleet["timestamp"][0])) is None
    fleet2 = {**fleet, "commands": keys(1)}
    assert keeper.receive(root_doc(fleet2, version=2, signers=fleet["root"])) is None
    assert keeper.root.version == 2 and keeper.timestamp is not None and keeper.timestamp.version == 7


def test_timestamp_versions_come_from_the_shared_counter_whatever_each_replicas_clock_says(tmp_path, fleet):
    from edgesdk.ota_server.devices.freshness import TimestampPublisher
    from edgesdk.ota_server.store.fleet_db import FleetDB

    path = tmp_path / "fleet.db"
    first, second = FleetDB(path), FleetDB(path)
    start = first.counter("timestamp_version")
    assert start is not None and abs(start - time.time() * 1000) < 600_000  # seeded above clock-derived versions
    published: list[bytes] = []
    on_time = TimestampPublisher(first, lambda t, doc, retain: published.append(doc), fleet["timestamp"][0], 1,
                                 every_s=10, expires_s=30, clock=time.time)
    a_day_ahead = TimestampPublisher(second, lambda t, doc, retain: published.append(doc), fleet["timestamp"][0], 1,
                                     every_s=10, expires_s=30, clock=lambda: time.time() + 86400)
    for publisher in (on_time, a_day_ahead, on_time, a_day_ahead):
        publisher._due = 0
        assert publisher.tick() is not None
    root = trust_root(root_doc(fleet))
    versions = [parse_timestamp(doc, root).version for doc in published]
    assert versions == [start + 1, start + 2, start + 3, start + 4]  # the clock a day ahead changed nothing
    first.close()
    # A replica taking over (a new process on the same store) goes on from the shared number.
    third = FleetDB(path)
    successor = TimestampPublisher(third, lambda t, doc, retain: published.append(doc), fleet["timestamp"][0], 1,
                                   every_s=10, expires_s=30)
    successor.tick()
    assert parse_timestamp(published[-1], root).version == start + 5
    # Two replicas drawing at once never get the same number.
    drawn: list[int] = []
    lock = threading.Lock()

    def draw(db):
        for _ in range(50):
            value = db.next_timestamp_version()
            with lock:
                drawn.append(value)

    threads = [threading.Thread(target=draw, args=(db,)) for db in (second, third)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(drawn) == list(range(start + 6, start + 106))
    second.close()
    third.close()


# waiting roots -------------------------------------------------------------------------------------------------

def _hostile_root(version: int, own: list[Ed25519PrivateKey], pad: int = 0) -> bytes:
    """A root of the attacker's own keys (signed by them: it passes its own threshold, never the chain)."""
    signed = new_root(version, time.time() + YEAR, {role: ([k.public_key() for k in own], 1) for role in ROLES})
    if pad:
        signed["padding"] = "x" * pad
    return sign_metadata(signed, own)


def test_four_hundred_hostile_roots_hold_at_most_eight_documents_and_the_real_chain_still_applies(tmp_path, fleet):
    keeper = _keeper(tmp_path, fleet)
    attacker = keys(1)
    refusals = [keeper.receive(_hostile_root(v, attacker)) for v in range(3, 403)]
    unsigned = sign_metadata(new_root(5, time.time() + YEAR, {r: ([k.public_key() for k in attacker], 1)
                                                              for r in ROLES}), [])
    refusals.append(keeper.receive(unsigned))
    assert len(keeper._pending) <= MAX_PENDING_ROOTS
    held = sum(len(d) for d in keeper._pending.values())
    assert held <= MAX_PENDING_ROOTS * MAX_PENDING_ROOT_BYTES and held < 64 * 1024, held
    assert all(v - 1 <= MAX_ROOTS_AHEAD for v in keeper._pending)
    assert sum(r is not None for r in refusals) >= 400 - MAX_PENDING_ROOTS
    assert any("versions ahead of the v1 this device holds" in (r or "") for r in refusals)
    assert "0 valid signatures" in refusals[-1]  # the unsigned one is not held
    assert not any(p.name.startswith("pending") for p in (tmp_path / "trust").iterdir())  # nothing on disk
    # The fleet's own v2 and v3 arrive: each applies, and the attacker's next version waiting behind it is refused
    # by the chain (not signed by the fleet's root keys) and dropped.
    assert "root metadata v3 (by the root keys of v2): 0 valid signatures" in keeper.receive(root_doc(fleet, version=2))
    assert keeper.root.version == 2 and 3 not in keeper._pending
    assert "root metadata v4 (by the root keys of v3)" in keeper.receive(root_doc(fleet, version=3))
    assert keeper.root.version == 3 and trust_root((tmp_path / "trust" / "root.json").read_bytes()).version == 3


def test_a_far_ahead_an_oversized_and_a_ninth_waiting_root_are_refused_with_the_reason(tmp_path, fleet):
    keeper = _keeper(tmp_path, fleet)
    far = root_doc(fleet, version=2 + MAX_ROOTS_AHEAD)
    assert f"is {MAX_ROOTS_AHEAD + 1} versions ahead of the v1 this device holds" in keeper.receive(far)
    big = _hostile_root(3, keys(1), pad=MAX_PENDING_ROOT_BYTES)
    assert f"over the {MAX_PENDING_ROOT_BYTES}-byte limit for a version waiting" in keeper.receive(big)
    for version in range(4, 4 + MAX_PENDING_ROOTS):
        assert keeper.receive(root_doc(fleet, version=version)) is None
    ninth = root_doc(fleet, version=4 + MAX_PENDING_ROOTS)
    assert f"{MAX_PENDING_ROOTS} later versions (the most a device holds) already wait" in keeper.receive(ninth)
    # A nearer one makes room: the farthest waiting version goes.
    assert keeper.receive(root_doc(fleet, version=3)) is None
    assert sorted(keeper._pending) == list(range(3, 3 + MAX_PENDING_ROOTS))
    assert keeper.receive(root_doc(fleet, version=2)) is None
    assert keeper.root.version == 2 + MAX_PENDING_ROOTS and not keeper._pending


def test_an_unreadable_manifest_of_the_committed_release_fails_closed(tmp_path):
    """Issue 60: the floor failed open when the committed slot's manifest could not be read (the floor it carries
    unknown): now its own version holds, so nothing below what the device committed runs; newer releases do."""
    from edgesdk.agent.admission import below_floor
    from edgesdk.agent.store import ModelStore, StoreState
    from edgesdk.fleet.protocol import parse_command, sign_command

    store = ModelStore(tmp_path / "store")
    (store.slots / "digits-2.0.0").mkdir(parents=True)
    (store.slots / "digits-2.0.0" / "manifest.json").write_text('{"name": "digits", "vers')  # torn
    store.save_state(StoreState(committed="digits-2.0.0"))
    key = Ed25519PrivateKey.generate()

    def rollback(version: str, name: str = "digits"):
        return parse_command(sign_command(key, type="rollback", deployment_id=f"d{version}", transfer_id=f"d{version}",
                                          name=name, version=version, group="cams", rollback=True), key.public_key())

    refusal = below_floor(rollback("1.0.0"), store)
    assert refusal is not None and "digits 1.0.0 is below 2.0.0" in refusal and "cannot be read" in refusal
    assert below_floor(rollback("2.0.0"), store) is None and below_floor(rollback("2.1.0"), store) is None
    assert below_floor(rollback("1.0.0", name="other"), store) is None  # another model's floor is its own
