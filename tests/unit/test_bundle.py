"""Bundle format: writing, reading, hashes, signatures, and what a tampered bundle gets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk import Runtime
from edgesdk.errors import BundleError, SignatureError
from edgesdk.runtime.bundle import BundleSpec, HealthCheck, parse_version, read_bundle, sign_bundle
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.runtime.signing import generate_keypair, key_id, load_private_key, load_public_key


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    private, public = generate_keypair(tmp_path_factory.mktemp("keys"))
    return load_private_key(private), load_public_key(public)


def _write(out, model_path, digits, private_key=None, version="1.0.0"):
    spec = BundleSpec("digits", version, "fp32", "generic-x86_64", "latency",
                      health_check=HealthCheck(atol=1e-4, rtol=1e-3, max_latency_ms=50.0),
                      preprocessing={"scale": "pixel / 16"}, measured={"size_bytes": model_path.stat().st_size})
    return bundle_from_model(out, model_path, spec, {"input": digits.x_test[:1]}, private_key=private_key)


def test_round_trip_and_runtime_loads_a_bundle(tmp_path, digits_onnx, digits):
    bundle = _write(tmp_path / "b", digits_onnx, digits)
    m = bundle.manifest
    assert (m.name, m.version, m.variant, m.model_file, m.format_version) == ("digits", "1.0.0", "fp32", "model.onnx", 1)
    assert set(m.files) == {"model.onnx", "health_check.npz"} and bundle.signed_by == ()
    inputs, outputs = bundle.health_sample()
    with Runtime(tmp_path / "b", profile="generic-x86_64") as rt:
        np.testing.assert_allclose(rt.predict(inputs["input"]), outputs["probabilities"], atol=1e-6)
        assert rt.bundle is not None and rt.bundle.manifest.name == "digits"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging directory left behind"


def test_signed_bundle_verifies_with_the_right_key_only(tmp_path, digits_onnx, digits, keys):
    private, public = keys
    bundle = _write(tmp_path / "b", digits_onnx, digits, private_key=private)
    assert read_bundle(bundle.path, public_key=public, require_signature=True).signed_by == (key_id(public),)
    other_private, other_public = generate_keypair(tmp_path / "other")
    with pytest.raises(SignatureError, match=r"digits 1.0.0: 0 valid signatures of the 1 required"):
        read_bundle(bundle.path, public_key=load_public_key(other_public))


def test_unsigned_bundle_is_refused_when_a_signature_is_required(tmp_path, digits_onnx, digits, keys):
    bundle = _write(tmp_path / "b", digits_onnx, digits)
    with pytest.raises(SignatureError, match="not signed"):
        read_bundle(bundle.path, public_key=keys[1], require_signature=True)
    signed = sign_bundle(bundle.path, keys[0])
    assert signed.signed_by == (key_id(keys[1]),)


def test_model_that_does_not_match_the_manifest_hash_is_rejected(tmp_path, digits_onnx, digits_tflite, digits):
    bundle = _write(tmp_path / "b", digits_onnx, digits)
    data = bytearray((bundle.path / "model.onnx").read_bytes())
    data[-10] ^= 0xFF  # same size, one byte flipped
    (bundle.path / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(SignatureError, match="does not match the manifest"):
        read_bundle(bundle.path)
    with pytest.raises(SignatureError):
        Runtime(bundle.path, profile="generic-x86_64")


def test_truncated_model_file_is_rejected_by_size(tmp_path, digits_onnx, digits):
    bundle = _write(tmp_path / "b", digits_onnx, digits)
    data = (bundle.path / "model.onnx").read_bytes()
    (bundle.path / "model.onnx").write_bytes(data[:100])
    with pytest.raises(SignatureError, match=r"size 100 does not match.*truncated"):
        read_bundle(bundle.path)


def test_tampered_manifest_breaks_the_signature(tmp_path, digits_onnx, digits, keys):
    bundle = _write(tmp_path / "b", digits_onnx, digits, private_key=keys[0])
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    manifest["version"] = "9.9.9"
    (bundle.path / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    with pytest.raises(SignatureError, match="0 valid signatures of the 1 required"):
        read_bundle(bundle.path, public_key=keys[1])


def test_existing_output_directory_is_not_overwritten(tmp_path, digits_onnx, digits):
    (tmp_path / "b").mkdir()
    with pytest.raises(BundleError, match="already exists"):
        _write(tmp_path / "b", digits_onnx, digits)


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (lambda m: m.pop("model_file"), "missing field 'model_file'"),
        (lambda m: m.update(format_version=2), "format_version 2 is not supported"),
        (lambda m: m.update(name="../../etc"), "not a safe name"),
        (lambda m: m["files"].update({"../evil": {"sha256": "0" * 64, "size": 1}}), "not a safe name"),
        (lambda m: m.update(version="v2"), "dotted integers"),
    ],
    ids=["missing", "format", "traversal-name", "traversal-file", "version"],
)
def test_malformed_manifests_get_bundle_errors(tmp_path, digits_onnx, digits, change, pattern):
    bundle = _write(tmp_path / "b", digits_onnx, digits)
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    change(manifest)
    (bundle.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=pattern):
        read_bundle(bundle.path)


def test_truncated_manifest_json(tmp_path, digits_onnx, digits):
    bundle = _write(tmp_path / "b", digits_onnx, digits)
    text = (bundle.path / "manifest.json").read_text()
    (bundle.path / "manifest.json").write_text(text[: len(text) // 2])
    with pytest.raises(BundleError, match="not valid JSON"):
        read_bundle(bundle.path)


def test_versions_compare_numerically():
    assert parse_version("1.10.0") > parse_version("1.9.3")


def test_private_key_is_written_owner_only(tmp_path):
    private, public = generate_keypair(tmp_path)
    assert private.stat().st_mode & 0o777 == 0o600
    with pytest.raises(SignatureError, match="already exists"):
        generate_keypair(tmp_path)
    with pytest.raises(SignatureError, match="not an unencrypted PEM private key"):
        load_private_key(public)


def test_a_second_signer_adds_a_signature_and_a_threshold_of_two_needs_both(tmp_path, digits_onnx, digits, keys):
    from edgesdk.runtime.signing import KeySet

    ci, release = keys[0], load_private_key(generate_keypair(tmp_path / "release")[0])
    bundle = _write(tmp_path / "b", digits_onnx, digits, private_key=ci)
    both = KeySet.of([ci.public_key(), release.public_key()], threshold=2)
    with pytest.raises(SignatureError, match="digits 1.0.0: 1 valid signature of the 2 required"):
        read_bundle(bundle.path, public_key=both)
    sign_bundle(bundle.path, release)
    sign_bundle(bundle.path, release)  # signing twice with one key counts once
    assert set(read_bundle(bundle.path, public_key=both).signed_by) == {key_id(ci.public_key()),
                                                                        key_id(release.public_key())}
    signatures = json.loads((bundle.path / "signature.json").read_text())["signatures"]
    assert sorted(e["key_id"] for e in signatures) == sorted([key_id(ci.public_key()), key_id(release.public_key())])


def test_a_bundle_signed_in_the_earlier_single_signature_format_still_verifies(tmp_path, digits_onnx, digits, keys):
    import base64

    bundle = _write(tmp_path / "b", digits_onnx, digits)
    manifest = (bundle.path / "manifest.json").read_bytes()
    (bundle.path / "signature.json").write_text(json.dumps({
        "algorithm": "ed25519", "key_id": key_id(keys[1]), "signature": base64.b64encode(keys[0].sign(manifest)).decode()}))
    assert read_bundle(bundle.path, public_key=keys[1], require_signature=True).signed_by == (key_id(keys[1]),)
