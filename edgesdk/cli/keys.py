"""``edgesdk keys`` (generate; the fleet's root of trust: init, rotate, revoke, sign-root, show), ``sign``, ``verify``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from edgesdk.fleet.key_ceremony import CeremonyResult


@click.group()
def keys() -> None:
    """Manage Ed25519 signing keys and the fleet's root of trust."""


@keys.command("generate")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True)
@click.option("--name", default="edgesdk", show_default=True, help="Files are NAME.key and NAME.pub.")
def generate(out_dir: str, name: str) -> None:
    """Write a new key pair (the private key readable by you only)."""
    from edgesdk.runtime.signing import generate_keypair, key_id, load_public_key

    private, public = generate_keypair(out_dir, name)
    click.echo(f"private key: {private}\npublic key:  {public}\nkey id:      {key_id(load_public_key(public))}")


def _role_numbers(values: tuple[str, ...], what: str) -> dict[str, int]:
    """``("root=2", "bundles=2")`` -> ``{"root": 2, "bundles": 2}``."""
    numbers = {}
    for value in values:
        role, _, number = value.partition("=")
        if not number.isdigit():
            raise click.BadParameter(f"{value!r}: write ROLE=N, e.g. root=2", param_hint=what)
        numbers[role] = int(number)
    return numbers


def _write_result(result: CeremonyResult, out: str) -> None:
    from edgesdk.errors import TrustError
    from edgesdk.files import write_atomic

    write_atomic(out, result.document)
    if result.missing:
        raise TrustError(f"wrote {out} (root v{result.version}), but devices will refuse it until it has "
                         f"{'; '.join(result.missing)}: each holder adds theirs with `edgesdk keys sign-root {out} "
                         "--key KEY`")
    click.echo(f"wrote {out}: root v{result.version}, signed by the thresholds of the old and the new root keys, as "
               "devices require")


_EXPIRES = click.option("--expires", default="365d", show_default=True, help="How long the new root is valid.")
_SIGNERS = click.option("--sign-with", "signers", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
                        help="A root private key to sign with (repeat; the old and the new root thresholds must be met).")


@keys.command("init")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Writes OUT/root.json and OUT/keys/ROLE-N.key|.pub.")
@click.option("--keys", "key_counts", multiple=True, metavar="ROLE=N",
              help="Keys per role (root, bundles, commands, timestamp); default 1 each.")
@click.option("--threshold", "thresholds", multiple=True, metavar="ROLE=K",
              help="Signatures a role needs (k of its n keys); default 1.")
@_EXPIRES
def init(out_dir: str, key_counts: tuple[str, ...], thresholds: tuple[str, ...], expires: str) -> None:
    """Create a fleet's root of trust: keys for every role and root.json version 1 (provision devices with it)."""
    from edgesdk.fleet.key_ceremony import init_fleet
    from edgesdk.fleet.records import parse_duration

    root, private = init_fleet(out_dir, _role_numbers(key_counts, "--keys"), _role_numbers(thresholds, "--threshold"),
                               parse_duration(expires))
    click.echo(f"wrote {root} (v1)")
    for role, paths in private.items():
        click.echo(f"  {role:<9} {', '.join(str(p) for p in paths)}")
    click.echo("keep the root keys offline; give the commands key to the server and the bundles keys to whoever "
               "signs models")


@keys.command("rotate")
@click.argument("root", type=click.Path(exists=True, dir_okay=False))
@click.option("--role", required=True, type=click.Choice(["root", "bundles", "commands", "timestamp"]))
@click.option("--add", "added", multiple=True, type=click.Path(exists=True, dir_okay=False), help="A public key to add.")
@click.option("--remove", "removed", multiple=True, metavar="KEYID", help="A key id to remove from the role.")
@click.option("--threshold", type=int, help="The role's new threshold (default: unchanged).")
@_SIGNERS
@_EXPIRES
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where the next root version goes.")
def rotate(root: str, role: str, added: tuple[str, ...], removed: tuple[str, ...], threshold: int | None,
           signers: tuple[str, ...], expires: str, out: str) -> None:
    """Write the next root version with ROLE's keys changed (exit 27 while it lacks signatures devices require)."""
    from pathlib import Path

    from edgesdk.fleet import key_ceremony
    from edgesdk.fleet.records import parse_duration
    from edgesdk.runtime.signing import load_private_key, load_public_key

    result = key_ceremony.rotate(Path(root).read_bytes(), role, [load_private_key(k) for k in signers],
                                 [load_public_key(k) for k in added], removed, threshold, parse_duration(expires))
    _write_result(result, out)


@keys.command("revoke")
@click.argument("root", type=click.Path(exists=True, dir_okay=False))
@click.option("--key-id", "revoked", required=True, help="The key id to remove from every role.")
@_SIGNERS
@_EXPIRES
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where the next root version goes.")
def revoke(root: str, revoked: str, signers: tuple[str, ...], expires: str, out: str) -> None:
    """Write the next root version without a key (a stolen or departed one) in any role."""
    from pathlib import Path

    from edgesdk.fleet import key_ceremony
    from edgesdk.fleet.records import parse_duration
    from edgesdk.runtime.signing import load_private_key

    result = key_ceremony.revoke(Path(root).read_bytes(), revoked, [load_private_key(k) for k in signers],
                                 parse_duration(expires))
    _write_result(result, out)


@keys.command("sign-root")
@click.argument("root", type=click.Path(exists=True, dir_okay=False))
@click.option("--key", "key_files", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="A root private key whose signature to add (repeat).")
def sign_root(root: str, key_files: tuple[str, ...]) -> None:
    """Add signatures to a root document (the next holder of a key ceremony)."""
    from pathlib import Path

    from edgesdk.files import write_atomic
    from edgesdk.fleet.key_ceremony import describe, sign_more

    document = sign_more(Path(root).read_bytes(), key_files)
    write_atomic(root, document)
    click.echo(f"{root}: signed by {', '.join(describe(document)['signed_by'])}")  # type: ignore[arg-type]


@keys.command("publish")
@click.argument("roots", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--broker", required=True, help="mqtt://HOST:PORT or mqtts://HOST:PORT")
@click.option("--credentials", type=click.Path(exists=True, dir_okay=False),
              help="The server's broker credentials JSON (it may write edgesdk/#).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA certificate for mqtts://.")
def publish(roots: tuple[str, ...], broker: str, credentials: str | None, ca_file: str | None) -> None:
    """Publish root versions to the fleet, retained on edgesdk/trust/root/N: devices take them as a chain."""
    from pathlib import Path

    from edgesdk.fleet.protocol import Topics
    from edgesdk.fleet.transport import MqttTransport, load_credentials
    from edgesdk.fleet.trust import parse_root

    documents = [Path(r).read_bytes() for r in roots]
    versions = [parse_root(d)[0].version for d in documents]  # a malformed file is refused before anything is sent
    username, password = load_credentials(credentials) if credentials else (None, None)
    transport = MqttTransport(broker, client_id="edgesdk-keys-publish", username=username, password=password,
                              ca_file=ca_file)
    try:
        for version, document in sorted(zip(versions, documents)):
            transport.publish(Topics.root(version), document, retain=True)
            transport.confirm_access()
            click.echo(f"published root v{version} on {Topics.root(version)} (retained)")
    finally:
        transport.close()


@keys.command("show")
@click.argument("root", type=click.Path(exists=True, dir_okay=False))
def show(root: str) -> None:
    """Print a root's version, expiry, each role's keys and threshold, and its signers (JSON)."""
    import json
    from pathlib import Path

    from edgesdk.fleet.key_ceremony import describe

    click.echo(json.dumps(describe(Path(root).read_bytes()), indent=2))


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--key", required=True, type=click.Path(exists=True, dir_okay=False), help="Ed25519 private key (PEM).")
@click.option("--rollback-floor", metavar="VERSION", default=None,
              help="Write this floor into the manifest first: devices that install this release refuse versions of "
                   "the model below it afterwards. Set it with the first signature.")
def sign(bundle: str, key: str, rollback_floor: str | None) -> None:
    """Check BUNDLE's hashes and add a signature of its manifest (beside the signatures already there)."""
    from edgesdk.runtime.bundle import sign_bundle, signers
    from edgesdk.runtime.signing import load_private_key

    signed = sign_bundle(bundle, load_private_key(key), rollback_floor=rollback_floor)
    floor = f", rollback floor {signed.manifest.rollback_floor}" if signed.manifest.rollback_floor else ""
    click.echo(f"signed {signed.path} ({signed.manifest.name} {signed.manifest.version}{floor}) with key "
               f"{', '.join(signed.signed_by)}; signed by: {', '.join(signers(signed.path))}")


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--pub", type=click.Path(exists=True, dir_okay=False), help="Public key; without it only hashes are checked.")
def verify(bundle: str, pub: str | None) -> None:
    """Check BUNDLE's manifest, file hashes and (with --pub) its signature."""
    from edgesdk.runtime.bundle import read_bundle
    from edgesdk.runtime.signing import load_public_key

    checked = read_bundle(bundle, public_key=load_public_key(pub) if pub else None, require_signature=bool(pub))
    m = checked.manifest
    signer = f", signed by {', '.join(checked.signed_by)}" if checked.signed_by else ", hashes only (no key given)"
    click.echo(f"OK: {m.name} {m.version} ({m.variant}, {m.model_format.value}) for {m.target_profile}{signer}")
