"""The signed command envelopes (deploy and measure), archive packing, measurement results, and the
repository's version policy."""

from __future__ import annotations

import base64
import io
import json
import tarfile

import numpy as np
import pytest

from edgesdk.errors import BundleError, DataError, SignatureError, TransferError
from edgesdk.fleet.archive import pack_bundle, unpack_bundle
from edgesdk.fleet.measurement import (
    decode_array,
    encode_result,
    measurement_files,
    pack_measurement,
    parse_result,
    unpack_measurement,
)
from edgesdk.fleet.protocol import ArchiveInfo, MeasureCommand, parse_command, sign_command, sign_measure_command
from edgesdk.fleet.records import RolloutPolicy
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.testing import random_mlp, write_mlp_onnx
from tests.ota.conftest import make_bundle

INFO = ArchiveInfo.of(b"x" * 1000, chunk_size=300)


def _command(keys, **changes):
    fields = dict(type="deploy", deployment_id="d1", transfer_id="t1", name="digits", version="1.2.0", group="cams",
                  archive=INFO)
    fields.update(changes)
    return sign_command(keys["server"], **fields)


def test_round_trip_with_the_pinned_key(keys):
    command = parse_command(_command(keys), keys["server_pub"])
    assert (command.type, command.version_tuple, command.archive.chunks) == ("deploy", (1, 2, 0), INFO.chunks)
    assert len(INFO.chunks) == 4 and INFO.chunk_range(3) == (900, 1000)


def test_changed_manifest_fails_the_signature(keys):
    envelope = json.loads(_command(keys))
    body = json.loads(base64.b64decode(envelope["manifest"]))
    body["version"] = "9.0.0"
    envelope["manifest"] = base64.b64encode(json.dumps(body).encode()).decode()
    with pytest.raises(SignatureError, match="signature does not verify"):
        parse_command(json.dumps(envelope).encode(), keys["server_pub"])


def test_a_command_hands_the_device_an_offload_endpoint_for_its_own_version(keys):
    assert parse_command(_command(keys), keys["server_pub"]).offload is None
    command = parse_command(_command(keys, offload_url="http://10.0.0.5:8000"), keys["server_pub"])
    assert command.offload == {"url": "http://10.0.0.5:8000", "model": "digits", "version": "1.2.0"}
    with pytest.raises(TransferError, match="must be an http:// or https:// URL"):
        _command(keys, offload_url="ftp://10.0.0.5")


def test_an_offload_endpoint_for_another_model_is_refused(keys):
    from edgesdk.fleet.protocol import _archive_dict, _seal

    body = {"type": "deploy", "deployment_id": "d1", "transfer_id": "t1", "name": "digits", "version": "1.2.0",
            "group": "cams", "rollback": False, "issued_at": 0.0, "archive": _archive_dict(INFO),
            "offload": {"url": "http://10.0.0.5:8000", "model": "other", "version": "1.2.0"}}
    with pytest.raises(TransferError, match="must name this command's model 'digits'"):
        parse_command(_seal(keys["server"], body), keys["server_pub"])


def test_unsigned_commands_need_the_development_flag(keys):
    with pytest.raises(SignatureError, match="no server public key is pinned"):
        parse_command(_command(keys), None)
    assert parse_command(_command(keys), None, allow_unsigned=True).name == "digits"


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [({"name": "../../etc"}, "not a safe name"), ({"group": "cams/#"}, "group"),
     ({"transfer_id": "a/b"}, "transfer id"), ({"version": "latest"}, "dotted integers")],
)
def test_unsafe_names_are_refused(keys, changes, pattern):
    with pytest.raises((TransferError, BundleError), match=pattern):
        parse_command(_command(keys, **changes), keys["server_pub"])


def test_archive_over_the_size_cap_is_refused_before_any_write(keys):
    with pytest.raises(TransferError, match="over the 500-byte cap"):
        parse_command(_command(keys), keys["server_pub"], max_size=500)


def test_garbage_is_not_a_command(keys):
    with pytest.raises(SignatureError, match="not a signed envelope"):
        parse_command(b"{not json", keys["server_pub"])


def test_archive_round_trip_and_hostile_members(tmp_path, keys):
    bundle = make_bundle(tmp_path / "b", "1.0.0", keys)
    data = pack_bundle(bundle)
    (tmp_path / "a.tar").write_bytes(data)
    unpack_bundle(tmp_path / "a.tar", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in bundle.iterdir())
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    (tmp_path / "evil.tar").write_bytes(evil.getvalue())
    with pytest.raises(BundleError, match="not a safe name"):
        unpack_bundle(tmp_path / "evil.tar", tmp_path / "out2")
    assert not (tmp_path / "escape.txt").exists()


def test_repository_refuses_unsigned_and_keeps_latest_pinned_and_in_use(tmp_path, keys):
    repo = ModelRepository(tmp_path / "repo", keep_latest=2, signer_key=keys["converter_pub"])
    versions = [f"1.{i}.0" for i in range(5)]
    for v in versions:
        repo.add(make_bundle(tmp_path / v, v, keys))
    assert repo.add(tmp_path / "1.0.0")[1] is False  # the identical bundle again: nothing to store
    repo.pin("digits", "1.0.0")
    removed = repo.apply_policy(in_use=[("digits", "1.1.0")])
    assert sorted(v for _, v in removed) == ["1.2.0"]
    assert repo.versions("digits") == ["1.0.0", "1.1.0", "1.3.0", "1.4.0"]
    unsigned = make_bundle(tmp_path / "unsigned", "2.0.0", {**keys, "converter": None})
    with pytest.raises(SignatureError, match="not signed"):
        repo.add(unsigned)
    no_key = ModelRepository(tmp_path / "repo2")
    with pytest.raises(SignatureError, match="no bundle signer key"):
        no_key.add(tmp_path / "1.4.0")
    dev = ModelRepository(tmp_path / "repo3", allow_unsigned=True)
    assert dev.add(tmp_path / "1.4.0")[0].version == "1.4.0"


def _measure_envelope(keys, **changes):
    """A measure command signed with the server key, fields as given (bypassing sign_measure_command's checks)."""
    from edgesdk.runtime.signing import key_id, sign

    manifest = {"type": "measure", "measurement_id": "m1", "transfer_id": "m1", "mode": "latency", "runs": 50,
                "issued_at": 0.0, "archive": INFO.to_json()}
    manifest.update(changes)
    body = json.dumps(manifest).encode()
    return json.dumps({"manifest": base64.b64encode(body).decode(), "key_id": key_id(keys["server_pub"]),
                       "signature": base64.b64encode(sign(keys["server"], body)).decode()}).encode()


def test_measure_command_round_trip(keys):
    envelope = sign_measure_command(keys["server"], measurement_id="m1", transfer_id="t1", archive=INFO,
                                    mode="power", runs=10_000)
    command = parse_command(envelope, keys["server_pub"])
    assert isinstance(command, MeasureCommand)
    assert (command.measurement_id, command.transfer_id, command.mode, command.runs) == ("m1", "t1", "power", 10_000)
    assert command.archive == INFO and command.type == "measure"


@pytest.mark.parametrize("runs", [0, -1, 10_001, 2.5, True, "50"])
def test_measure_command_with_runs_out_of_range_is_refused(keys, runs):
    with pytest.raises(TransferError, match=r"measure runs .* is out of range; ask for 1\.\.10000 timed runs"):
        parse_command(_measure_envelope(keys, runs=runs), keys["server_pub"])
    if isinstance(runs, int) and not isinstance(runs, bool):
        with pytest.raises(TransferError, match="out of range"):
            sign_measure_command(keys["server"], measurement_id="m1", transfer_id="m1", archive=INFO, mode="latency",
                                 runs=runs)


@pytest.mark.parametrize(("changes", "pattern"), [
    ({"mode": "turbo"}, "measure mode 'turbo' is unknown; use one of latency, balanced, power"),
    ({"archive": None}, "measure command without an archive"),
    ({"measurement_id": "../x"}, "measurement id"),
])
def test_measure_command_fields_are_checked(keys, changes, pattern):
    with pytest.raises(TransferError, match=pattern):
        parse_command(_measure_envelope(keys, **changes), keys["server_pub"])


def test_measurement_archive_and_result_cap_on_both_sides(tmp_path, keys):
    model = write_mlp_onnx(random_mlp([4, 3]), tmp_path / "m.onnx")
    archive = pack_measurement(model, {"input": np.ones((2, 4), np.float32)}, [keys["converter"]])
    (tmp_path / "a.tar").write_bytes(archive)
    found = unpack_measurement(tmp_path / "a.tar", tmp_path / "out", keys["converter_pub"])
    assert found == (tmp_path / "out" / "m.onnx", tmp_path / "out" / "evaluation.npz")
    assert measurement_files(tmp_path / "out") == found  # the manifest and signature are not unpacked with them
    with pytest.raises(SignatureError, match="0 valid signatures of the 1 required"):
        unpack_measurement(tmp_path / "a.tar", tmp_path / "out2", keys["server_pub"])
    assert not (tmp_path / "out2").exists()
    with pytest.raises(DataError, match="same number of samples"):
        pack_measurement(model, {"a": np.ones((2, 4)), "b": np.ones((3, 4))})
    outputs = {"probabilities": np.arange(6, dtype=np.float32).reshape(2, 3)}
    message = parse_result(encode_result("m1", "done", figures={"load_ms": 1.0}, outputs=outputs))
    np.testing.assert_array_equal(decode_array(message["outputs"]["probabilities"]), outputs["probabilities"])
    with pytest.raises(TransferError, match="over the 100-byte cap; measure with fewer evaluation samples"):
        encode_result("m1", "done", figures={}, outputs=outputs, max_size=100)
    big = encode_result("m1", "done", figures={}, outputs=outputs)
    with pytest.raises(TransferError, match="over the 100-byte cap; ignored"):
        parse_result(big, max_size=100)


def test_a_command_past_its_expiry_is_refused_and_one_from_an_earlier_server_without_one_is_taken(keys):
    import time

    from edgesdk.errors import TrustError

    envelope = _command(keys, ttl_s=60)
    issued = json.loads(base64.b64decode(json.loads(envelope)["manifest"]))
    assert issued["expires_at"] == pytest.approx(issued["issued_at"] + 60)
    assert parse_command(envelope, keys["server_pub"], now=issued["issued_at"] + 59).deployment_id == "d1"
    with pytest.raises(TrustError, match=r"command d1 issued .* expired 1 s ago; an expired command is refused"):
        parse_command(envelope, keys["server_pub"], now=issued["issued_at"] + 61)
    measure = sign_measure_command(keys["server"], measurement_id="m1", transfer_id="m1", archive=INFO,
                                   mode="latency", runs=3, ttl_s=5)
    with pytest.raises(TrustError, match="command m1 .* expired"):
        parse_command(measure, keys["server_pub"], now=time.time() + 10)
    from edgesdk.fleet.protocol import _seal

    older = _seal(keys["server"], {"type": "deploy", "deployment_id": "d0", "transfer_id": "t0", "name": "digits",
                                   "version": "1.0.0", "group": "cams", "rollback": False, "issued_at": 0.0,
                                   "archive": {"size": INFO.size, "sha256": INFO.sha256, "chunks": list(INFO.chunks),
                                               "sizes": list(INFO.sizes)}})
    assert parse_command(older, keys["server_pub"]).deployment_id == "d0"


def test_a_stage_command_is_signed_again_once_half_its_validity_has_passed(keys):
    import threading
    from types import SimpleNamespace

    from edgesdk.ota_server.rollouts.stage_sender import StageSender

    clock = [1000.0]
    sender = StageSender(None, None, None, keys["server"], lambda *a, **k: None, None, lambda: 0, lambda: 0,  # type: ignore[arg-type]
                         threading.Event(), command_ttl_s=100, clock=lambda: clock[0])
    rollout = SimpleNamespace(id="r1", rollback=True, model="digits", version="1.0.0", group="cams",
                              policy=RolloutPolicy())
    first = sender._stage_binder(rollout, 0, False, [], None).envelope  # type: ignore[arg-type]
    clock[0] += 40
    assert sender._stage_binder(rollout, 0, False, [], None).envelope == first  # type: ignore[arg-type]
    clock[0] += 20
    again = sender._stage_binder(rollout, 0, False, [], None).envelope  # type: ignore[arg-type]
    assert again != first
    manifest = json.loads(base64.b64decode(json.loads(again)["manifest"]))
    assert manifest["deployment_id"] == "r1" and manifest["expires_at"] - manifest["issued_at"] == pytest.approx(100)


def test_a_revert_names_the_version_it_undoes(keys):
    """The device refuses a revert of a version it has left (tests/unit/test_agent_parts.py), so the server's revert
    must say which version it undoes; a stage command of a rollback rollout says none."""
    import threading
    from types import SimpleNamespace

    from edgesdk.fleet.protocol import Command
    from edgesdk.ota_server.rollouts.stage_sender import StageSender

    sent: list[tuple[str, bytes]] = []
    db = SimpleNamespace(slots=lambda ids: {d: ("digits-1.0.0", "digits-5.0.0") for d in ids})
    metrics = SimpleNamespace(command_sent=lambda n=1: None)
    sender = StageSender(db, None, None, keys["server"], lambda t, p: sent.append((t, p)), metrics,  # type: ignore[arg-type]
                         lambda: 0, lambda: 0, threading.Event())
    aborted = SimpleNamespace(id="r5", rollback=False, model="digits", version="5.0.0", group="cams",
                              policy=RolloutPolicy())
    target = SimpleNamespace(device_id="cam0", previous_version="1.0.0")
    sender.send_revert(aborted, target)  # type: ignore[arg-type]
    (topic, envelope), = sent
    revert = parse_command(envelope, keys["server_pub"])
    assert isinstance(revert, Command) and topic == "edgesdk/devices/cam0/cmd"
    assert (revert.deployment_id, revert.version, revert.rollback, revert.reverts) == ("r5-rollback", "1.0.0", True,
                                                                                       "5.0.0")
    rollback_stage = sender._stage_binder(SimpleNamespace(id="r6", rollback=True, model="digits", version="1.0.0",
                                                           group="cams", policy=RolloutPolicy()), 0, False, [],
                                          None).envelope  # type: ignore[arg-type]
    assert parse_command(rollback_stage, keys["server_pub"]).reverts is None  # type: ignore[union-attr]
