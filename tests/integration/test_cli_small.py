"""Small CLI behaviours: verify on an unsigned bundle, bench on a bundle directory, server without its extras."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.signing import generate_keypair
from tests.ota.conftest import make_bundle


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
