"""The signed command envelope, archive packing and the repository's version policy."""

from __future__ import annotations

import base64
import io
import json
import tarfile

import pytest

from edgesdk.errors import BundleError, SignatureError, TransferError
from edgesdk.ota import ArchiveInfo, pack_bundle, parse_command, sign_command, unpack_bundle
from edgesdk.ota_server.repository import ModelRepository
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
    with pytest.raises(BundleError, match="already in the repository"):
        repo.add(tmp_path / "1.0.0")
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
    assert dev.add(tmp_path / "1.4.0").version == "1.4.0"
