"""Commands bound to their device (edgesdk.fleet.command_scope), the expiry a device with a root requires, and the
chunk service answering only a transfer's targets; real Ed25519 keys, no broker."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgesdk.errors import SignatureError, TransferError, TrustError
from edgesdk.fleet.command_scope import Binder, CommandTargetError
from edgesdk.fleet.protocol import ArchiveInfo, Command, _seal, parse_command, sign_command, sign_measure_command
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.ota_server.devices.chunks import ChunkDistributor
from edgesdk.ota_server.rollouts.stage_sender import StageSender
from edgesdk.runtime.signing import KeySet

KEY = Ed25519PrivateKey.generate()
PUB = KEY.public_key()
INFO = ArchiveInfo.of(b"x" * 10_000, chunk_size=4096)


def _to(device: str, group: str = "cams") -> SimpleNamespace:
    return SimpleNamespace(device_id=device, group=group)


def _deploy(device: str | None = None, group: str = "cams", **fields) -> bytes:
    return sign_command(KEY, type="deploy", deployment_id="r1", transfer_id="r1-w0", name="digits", version="2.0.0",
                        group=group, archive=INFO, device=device, **fields)


def test_a_bound_command_is_taken_by_its_device_only_and_says_which_device_it_is_for():
    envelope = _deploy("cam01")
    command = parse_command(envelope, PUB, to=_to("cam01"), strict=True)
    assert isinstance(command, Command) and command.device == "cam01" and command.group == "cams"
    with pytest.raises(CommandTargetError, match="command r1 is for device 'cam01' of group 'cams' and reached "
                                                 "'cam02' of group 'cams'; refused"):
        parse_command(envelope, PUB, to=_to("cam02"))
    assert issubclass(CommandTargetError, TransferError)
    assert parse_command(envelope, PUB).device == "cam01", "without a recipient, the binding is read and not compared"


def test_a_rollback_for_one_group_bound_to_its_device_is_refused_by_a_device_of_another_group():
    rollback = sign_command(KEY, type="rollback", deployment_id="r9", transfer_id="r9-w0", name="digits",
                            version="1.0.0", group="canary", rollback=True, device="c1")
    with pytest.raises(CommandTargetError, match="'c1' of group 'canary' and reached 'p1' of group 'prod'"):
        parse_command(rollback, PUB, to=_to("p1", "prod"), strict=True)


def test_an_unbound_command_for_another_group_is_refused_and_a_device_with_a_root_refuses_any_unbound_one():
    legacy = _deploy(group="canary")
    with pytest.raises(CommandTargetError, match="command r1 is for group 'canary' and reached 'p1' of group 'prod'"):
        parse_command(legacy, PUB, to=_to("p1", "prod"))
    assert parse_command(legacy, PUB, to=_to("c1", "canary")).device is None, "a pinned key takes earlier servers'"
    with pytest.raises(CommandTargetError, match="names no device, and 'c1' .* holds a root of trust"):
        parse_command(legacy, PUB, to=_to("c1", "canary"), strict=True)


def test_a_device_the_server_moved_follows_a_command_bound_to_it_for_its_new_group(caplog):
    with caplog.at_level(logging.WARNING):
        command = parse_command(_deploy("cam0", group="lobby"), PUB, to=_to("cam0", "cams"), strict=True)
    assert command.group == "lobby" and "restart the agent with --group lobby" in caplog.text


def test_a_signed_command_whose_group_is_no_group_name_is_refused_before_it_is_followed(caplog):
    """The fuzz run's finding: a bound command naming a list as its group was "followed" (the
    target check logged the whole hostile value as the group to restart with) and only refused
    after; the group is now checked first."""
    hostile = [[], {"": -702, "P": None}] * 200
    with caplog.at_level(logging.WARNING), pytest.raises(TransferError, match="group .* must be"):
        parse_command(_deploy("cam0", group=hostile), PUB, to=_to("cam0", "cams"), strict=True)
    assert "restart the agent" not in caplog.text


def test_a_binding_spliced_onto_another_manifest_or_signed_by_another_key_is_refused():
    ours, other = json.loads(_deploy("cam01")), json.loads(_deploy(group="cams", reverts="1.0.0"))
    spliced = {**other, "binding": ours["binding"], "binding_signature": ours["binding_signature"]}
    with pytest.raises(SignatureError, match="not the one it came with; it was spliced"):
        parse_command(json.dumps(spliced).encode(), PUB, to=_to("cam01"))
    forged = json.loads(Binder(Ed25519PrivateKey.generate(), _deploy()).bind("cam02"))
    with pytest.raises(SignatureError, match="OTA command binding: signature does not verify"):
        parse_command(json.dumps({**ours, "binding": forged["binding"],
                                  "binding_signature": forged["binding_signature"]}).encode(), PUB, to=_to("cam02"))
    with pytest.raises(SignatureError, match="binding .* is malformed"):
        parse_command(json.dumps({**ours, "binding": "!!"}).encode(), PUB, to=_to("cam01"))
    with pytest.raises(TransferError, match="can be bound to a device once"):
        Binder(KEY, _deploy("cam01"))


def test_the_binding_verifies_with_the_commands_role_and_is_the_same_bytes_each_time():
    keyset = KeySet.of([PUB])
    binder = Binder(KEY, _deploy())
    assert binder.bind("cam01") == binder.bind("cam01") != binder.bind("cam02")
    assert parse_command(binder.bind("cam01"), keyset, to=_to("cam01"), strict=True).device == "cam01"


def test_measure_commands_name_their_device():
    envelope = sign_measure_command(KEY, measurement_id="m1", transfer_id="m1", archive=INFO, mode="latency", runs=3,
                                    device="rk1")
    assert parse_command(envelope, PUB, to=_to("rk1"), strict=True).device == "rk1"
    with pytest.raises(CommandTargetError, match="command m1 is for device 'rk1' and reached 'rk2' of group 'cams'"):
        parse_command(envelope, PUB, to=_to("rk2"))


def test_a_device_with_a_root_refuses_a_command_without_expiry_and_a_pinned_key_device_takes_it():
    manifest = {"type": "deploy", "deployment_id": "d0", "transfer_id": "t0", "name": "digits", "version": "1.0.0",
                "group": "cams", "rollback": False, "issued_at": time.time(), "archive": INFO.to_json()}
    unexpiring = Binder(KEY, _seal(KEY, manifest)).bind("cam0")
    with pytest.raises(TrustError, match="command d0 carries no expires_at; a device holding a root of trust refuses"):
        parse_command(unexpiring, PUB, to=_to("cam0"), strict=True)
    assert parse_command(unexpiring, PUB, to=_to("cam0")).deployment_id == "d0"
    assert parse_command(_seal(KEY, manifest), PUB, to=_to("cam0")).deployment_id == "d0", "legacy: unbound too"
    with pytest.raises(TrustError, match="expired"):
        parse_command(_deploy("cam0", ttl_s=1), PUB, to=_to("cam0"), strict=True, now=time.time() + 5)


def _chunks(authorize=None):
    sent: list[str] = []
    data = bytes(range(256)) * 40
    service = ChunkDistributor(lambda name, version: (data, ArchiveInfo.of(data, 4096)), lambda t, p: sent.append(t),
                               repeat_s=0.0)
    service.authorize = authorize
    service.open("r1-w0", "digits", "2.0.0")
    return service, sent


def test_the_chunk_service_answers_a_transfers_targets_only_and_logs_one_refusal(caplog):
    service, sent = _chunks(authorize=lambda device, transfer: False)
    service.allow("r1-w0", ["cam0"])
    with caplog.at_level(logging.WARNING):
        assert service.serve("cam9", "r1-w0", [0, 1]) and service.serve("cam8", "r1-w0", [2])
    assert sent == [] and service.refused == 2
    assert caplog.text.count("refusing chunks of transfer r1-w0") == 1
    assert service.serve("cam0", "r1-w0", [1]) and sent == ["edgesdk/devices/cam0/chunks/r1-w0/1"]
    service.close("r1-w0")
    service.allow("r1-w0", ["cam9"])  # a closed transfer is left alone
    service.open("r1-w0", "digits", "2.0.0")
    assert service.serve("cam9", "r1-w0", [0]) and service.refused == 3


def test_the_chunk_service_asks_the_store_once_for_a_device_it_was_not_told_of():
    asked: list[tuple[str, str]] = []
    service, sent = _chunks(authorize=lambda device, transfer: asked.append((device, transfer)) or device == "late")
    for _ in range(3):
        service.serve("late", "r1-w0", [0])
    assert asked == [("late", "r1-w0")] and len(sent) == 3 and service.refused == 0


def test_the_stage_sender_binds_each_device_and_names_the_transfers_targets_from_the_store():
    published: list[tuple[str, bytes]] = []
    rows = {("r1", "cam0"): 0, ("r1", "cam1"): 1, ("r1", "cam2"): 0}
    db = SimpleNamespace(
        slots=lambda ids, column="slots": {d: () for d in ids},
        targets_of=lambda rollout, ids: {d: SimpleNamespace(device_id=d, stage=rows[(rollout, d)], artifact=None)
                                         for d in ids if (rollout, d) in rows})
    service, _ = _chunks()
    repo = SimpleNamespace(chunk_table=lambda name, version: None)
    metrics = SimpleNamespace(command_sent=lambda n=1: None, command_resent=lambda n=1: None)
    sender = StageSender(db, repo, service, KEY, lambda t, p: published.append((t, p)), metrics,  # type: ignore[arg-type]
                         lambda: 0, lambda: 0, threading.Event())
    rollout = SimpleNamespace(id="r1", rollback=False, model="digits", version="2.0.0", group="cams",
                              policy=RolloutPolicy())
    sender.resend(rollout, 0, ["cam0", "cam2"])  # type: ignore[arg-type]
    envelopes = dict(published)
    assert {t: parse_command(p, PUB).device for t, p in envelopes.items()} == {
        "edgesdk/devices/cam0/cmd": "cam0", "edgesdk/devices/cam2/cmd": "cam2"}
    manifests = {base64.b64decode(json.loads(p)["manifest"]) for p in envelopes.values()}
    assert len(manifests) == 1, "one manifest, signed once, for the whole stage"
    assert {parse_command(p, PUB).judge_s for p in envelopes.values()} == {300 + 60 + 120}, \
        "a judged rollout's devices report fast until their stage's latest verdict"
    assert sender.is_target("cam0", "r1-w0") and not sender.is_target("cam1", "r1-w0")
    assert sender.is_target("cam1", "r1-w1") and sender.is_target("cam1", "r1-rb")
    assert not sender.is_target("cam9", "r1-rb") and not sender.is_target("cam0", "m1")
    assert service.authorize == sender.is_target
    assert service.serve("cam2", "r1-w0", [0]) and service.refused == 0, "named when its command went out"
    assert service.serve("cam1", "r1-w0", [0]) and service.refused == 1, "a target of another stage"
