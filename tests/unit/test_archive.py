"""Verify, then unpack (issue 36): an archive's manifest is checked before a byte of it is written, and only the
regular files it lists are written, at their signed sizes and hashes. Hostile archives are built by hand
(benchmarks/security/security_archives.py) around a real bundle's signed manifest."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from benchmarks.security.security_archives import disk_bytes, gnu_sparse, member, pax_sparse, signed_parts, tar
from edgesdk.agent.store import ModelStore
from edgesdk.errors import BundleError, SignatureError, TransferError
from edgesdk.fleet.archive import MAX_META_BYTES, pack_bundle, pack_signed, unpack_bundle
from edgesdk.fleet.measurement import pack_measurement, unpack_measurement
from edgesdk.runtime.bundle import sign_bundle
from edgesdk.runtime.signing import KeySet, generate_keypair, load_private_key
from edgesdk.testing import random_mlp, write_mlp_onnx
from tests.ota.conftest import make_bundle

MODEL = "model.onnx"


@pytest.fixture(scope="module")
def signers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("archive-keys")
    for name in ("ci", "release", "commands"):
        generate_keypair(folder, name)
    return {name: load_private_key(folder / f"{name}.key") for name in ("ci", "release", "commands")}


@pytest.fixture(scope="module")
def bundles_role(signers) -> KeySet:
    """What a device's root asks of bundles here: two of CI and the release manager."""
    return KeySet.of([signers["ci"].public_key(), signers["release"].public_key()], threshold=2)


@pytest.fixture(scope="module")
def parts(tmp_path_factory, signers) -> dict[str, bytes]:
    """The members of a bundle archive signed by both bundles keys."""
    folder = tmp_path_factory.mktemp("archive-bundle")
    bundle = make_bundle(folder / "b", "1.0.0", {"converter": signers["ci"]})
    sign_bundle(bundle, signers["release"])
    return signed_parts(pack_bundle(bundle))


def _archive(tmp_path: Path, *members: bytes) -> Path:
    path = tmp_path / "archive.tar"
    path.write_bytes(tar(*members))
    return path


def _with_model(parts: dict[str, bytes], model_member: bytes, *extra: bytes) -> list[bytes]:
    return [*(member(n, d) for n, d in parts.items() if n != MODEL), model_member, *extra]


def _refused(tmp_path: Path, archive: Path, keys, error=BundleError, match: str = "") -> Path:
    """Unpack ``archive`` expecting a refusal; the target must not exist afterwards (nothing was written)."""
    target = tmp_path / "out"
    with pytest.raises(error, match=match):
        unpack_bundle(archive, target, keys)
    assert not target.exists()
    return target


def test_a_good_bundle_unpacks_with_its_manifest_and_signatures(tmp_path, parts, bundles_role):
    manifest = unpack_bundle(_archive(tmp_path, *(member(n, d) for n, d in parts.items())), tmp_path / "out",
                             bundles_role)
    assert (manifest.name, manifest.version) == ("digits", "1.0.0")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == parts


def test_a_gnu_sparse_member_is_refused_with_nothing_written(tmp_path, parts, bundles_role):
    # The header claims a 1 TiB file; the signed size is the model's, and the stored bytes are those too.
    archive = _archive(tmp_path, *_with_model(parts, gnu_sparse(MODEL, parts[MODEL], 1024**4)))
    assert archive.stat().st_size < 64 * 1024
    with tarfile.open(archive) as check:  # tarfile itself calls it a file, and a huge one
        sparse = check.getmember(MODEL)
        assert sparse.isfile() and sparse.size == 1024**4
    _refused(tmp_path, archive, bundles_role, match="'model.onnx' is a GNU sparse file, not a regular file")
    _refused(tmp_path, archive, None, match="GNU sparse file")  # a development device refuses it just the same
    assert disk_bytes(tmp_path) == {"allocated": archive.stat().st_blocks * 512, "apparent": archive.stat().st_size}


def test_a_pax_sparse_member_is_refused(tmp_path, parts, bundles_role):
    archive = _archive(tmp_path, *_with_model(parts, pax_sparse(MODEL, parts[MODEL], 64 * 1024**2)))
    _refused(tmp_path, archive, bundles_role, match="'model.onnx' is a pax sparse file")


@pytest.mark.parametrize(("kind", "what"), [(tarfile.SYMTYPE, "a symbolic link"), (tarfile.LNKTYPE, "a hard link"),
                                            (tarfile.CHRTYPE, "a character device"),
                                            (tarfile.BLKTYPE, "a block device"), (tarfile.FIFOTYPE, "a fifo"),
                                            (tarfile.DIRTYPE, "a directory")])
def test_links_devices_fifos_and_directories_are_refused(tmp_path, parts, bundles_role, kind, what):
    archive = _archive(tmp_path, *_with_model(parts, member(MODEL, kind=kind, link="/etc/passwd")))
    _refused(tmp_path, archive, bundles_role, match=f"'model.onnx' is {what}, not a regular file")


def test_an_undeclared_extra_file_is_refused_before_any_write(tmp_path, parts, bundles_role):
    archive = _archive(tmp_path, *_with_model(parts, member(MODEL, parts[MODEL]), member("extra.bin", b"x" * 4096)))
    _refused(tmp_path, archive, bundles_role, match="'extra.bin' is not listed in the signed manifest of digits 1.0.0")


def test_a_listed_file_missing_from_the_archive_is_refused(tmp_path, parts, bundles_role):
    archive = _archive(tmp_path, *(member(n, d) for n, d in parts.items() if n != MODEL))
    _refused(tmp_path, archive, bundles_role, match="lists 'model.onnx' but the archive has no such member")


def test_a_member_larger_than_its_signed_size_is_refused_before_writing(tmp_path, parts, bundles_role):
    archive = _archive(tmp_path, *_with_model(parts, member(MODEL, parts[MODEL] + bytes(1024**2))))
    _refused(tmp_path, archive, bundles_role, SignatureError,
             match=f"'model.onnx' is {len(parts[MODEL]) + 1024**2} bytes in its header but {len(parts[MODEL])} in the "
                   "signed manifest")


def test_a_duplicate_member_is_refused(tmp_path, parts, bundles_role):
    archive = _archive(tmp_path, *_with_model(parts, member(MODEL, parts[MODEL]), member(MODEL, parts[MODEL])))
    _refused(tmp_path, archive, bundles_role, match="'model.onnx' appears twice")


@pytest.mark.parametrize("signatures", ["one of two", "none", "commands key"])
def test_a_manifest_below_the_bundles_threshold_writes_nothing(tmp_path, parts, bundles_role, signers, signatures):
    members = [member(n, d) for n, d in parts.items() if n != "signature.json"]
    document = json.loads(parts["signature.json"])
    if signatures == "one of two":
        members.append(member("signature.json", json.dumps({"signatures": document["signatures"][:1]}).encode()))
    elif signatures == "commands key":
        from edgesdk.fleet.archive import signature_document

        members.append(member("signature.json", signature_document(parts["manifest.json"], [signers["commands"]])))
    match = "is not signed" if signatures == "none" else (
        f"{1 if signatures == 'one of two' else 0} valid signatures? of the 2 required")
    _refused(tmp_path, _archive(tmp_path, *members), bundles_role, SignatureError, match=match)
    # Through the store: no slot, and no staging directory left behind either.
    store = ModelStore(tmp_path / "store")
    with pytest.raises(SignatureError):
        store.unpack_slot("digits-1.0.0", tmp_path / "archive.tar", bundles_role)
    assert list(store.slots.iterdir()) == []


def test_a_tampered_file_is_refused_and_what_was_written_is_removed(tmp_path, parts, bundles_role):
    tampered = bytearray(parts[MODEL])
    tampered[-1] ^= 0xFF  # same size, other bytes: found only by hashing while writing
    archive = _archive(tmp_path, *_with_model(parts, member(MODEL, bytes(tampered))))
    _refused(tmp_path, archive, bundles_role, SignatureError, match="'model.onnx': sha256 .* does not match the manifest's")
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(SignatureError):
        unpack_bundle(archive, existing, bundles_role)
    assert list(existing.iterdir()) == []  # the health file written before the model, and the partial model: gone


def test_oversized_metadata_and_headers_are_refused_unread(tmp_path, parts, bundles_role):
    big = {**parts, "manifest.json": b" " * (MAX_META_BYTES + 1)}
    _refused(tmp_path, _archive(tmp_path, *(member(n, d) for n, d in big.items())), bundles_role,
             match=f"over the {MAX_META_BYTES}-byte cap")
    huge_pax = member("health_check.npz", parts["health_check.npz"], pax={"comment": "x" * (2 * MAX_META_BYTES)})
    _refused(tmp_path, _archive(tmp_path, huge_pax, *(member(n, d) for n, d in parts.items()
                                                      if n != "health_check.npz")),
             bundles_role, match="more than .* bytes of pax or long-name data")


def test_a_truncated_archive_is_refused_naming_it(tmp_path, parts, bundles_role):
    whole = tar(*(member(n, d) for n, d in parts.items()))
    (tmp_path / "archive.tar").write_bytes(whole[: len(whole) // 2])
    _refused(tmp_path, tmp_path / "archive.tar", bundles_role, match="not a complete uncompressed tar")


def test_a_measurement_archive_needs_the_threshold_and_its_manifest(tmp_path, signers, bundles_role, parts):
    model = write_mlp_onnx(random_mlp([4, 3]), tmp_path / "m.onnx")
    evaluation = {"input": np.ones((2, 4), np.float32)}
    good = tmp_path / "good.tar"
    good.write_bytes(pack_measurement(model, evaluation, [signers["ci"], signers["release"]]))
    assert unpack_measurement(good, tmp_path / "ok", bundles_role) == (tmp_path / "ok" / "m.onnx",
                                                                         tmp_path / "ok" / "evaluation.npz")
    commands_only = tmp_path / "commands.tar"
    commands_only.write_bytes(pack_measurement(model, evaluation, [signers["commands"]]))
    with pytest.raises(SignatureError, match="the measurement archive of m.onnx: 0 valid signatures of the 2"):
        unpack_measurement(commands_only, tmp_path / "no", bundles_role)
    assert not (tmp_path / "no").exists()
    # A signed manifest that lists something else than one model and its evaluation data is refused unwritten.
    odd = tmp_path / "odd.tar"
    odd.write_bytes(pack_signed("measurement", {"m.onnx": model, "run.sh": b"#!/bin/sh\n"},
                                [signers["ci"], signers["release"]]))
    with pytest.raises(TransferError, match=r"lists \['m.onnx', 'run.sh'\]"):
        unpack_measurement(odd, tmp_path / "odd", bundles_role)
    assert not (tmp_path / "odd").exists()
    # A signed bundle is not a measurement archive (and the other way round): the manifests say what they are.
    bundle = _archive(tmp_path, *(member(n, d) for n, d in parts.items()))
    with pytest.raises(BundleError, match="not a measurement manifest"):
        unpack_measurement(bundle, tmp_path / "x", bundles_role)
    with pytest.raises(BundleError, match="manifest is missing field 'name'"):
        unpack_bundle(good, tmp_path / "y", bundles_role)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_pack_bundle_packs_only_the_manifest_its_signatures_and_the_files_it_lists(tmp_path, signers):
    bundle = make_bundle(tmp_path / "b", "1.0.0", {"converter": signers["ci"]})
    (bundle / "notes.txt").write_text("not part of the bundle")
    packed = signed_parts(pack_bundle(bundle))
    assert sorted(packed) == ["health_check.npz", "manifest.json", MODEL, "signature.json"]
    (bundle / MODEL).unlink()
    (bundle / MODEL).symlink_to(bundle / "notes.txt")
    with pytest.raises(BundleError, match="model.onnx: the bundle's manifest lists it but it is not a regular file"):
        pack_bundle(bundle)
