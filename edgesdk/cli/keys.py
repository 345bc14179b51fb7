"""``edgesdk keys generate``, ``edgesdk sign``, ``edgesdk verify``."""

from __future__ import annotations

import click


@click.group()
def keys() -> None:
    """Manage Ed25519 signing keys."""


@keys.command("generate")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True)
@click.option("--name", default="edgesdk", show_default=True, help="Files are NAME.key and NAME.pub.")
def generate(out_dir: str, name: str) -> None:
    """Write a new key pair (the private key readable by you only)."""
    from edgesdk.runtime.signing import generate_keypair, key_id, load_public_key

    private, public = generate_keypair(out_dir, name)
    click.echo(f"private key: {private}\npublic key:  {public}\nkey id:      {key_id(load_public_key(public))}")


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--key", required=True, type=click.Path(exists=True, dir_okay=False), help="Ed25519 private key (PEM).")
def sign(bundle: str, key: str) -> None:
    """Check BUNDLE's hashes and sign its manifest."""
    from edgesdk.runtime.bundle import sign_bundle
    from edgesdk.runtime.signing import load_private_key

    signed = sign_bundle(bundle, load_private_key(key))
    click.echo(f"signed {signed.path} ({signed.manifest.name} {signed.manifest.version}) with key {signed.signed_by}")


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--pub", type=click.Path(exists=True, dir_okay=False), help="Public key; without it only hashes are checked.")
def verify(bundle: str, pub: str | None) -> None:
    """Check BUNDLE's manifest, file hashes and (with --pub) its signature."""
    from edgesdk.runtime.bundle import read_bundle
    from edgesdk.runtime.signing import load_public_key

    checked = read_bundle(bundle, public_key=load_public_key(pub) if pub else None, require_signature=bool(pub))
    m = checked.manifest
    signer = f", signed by {checked.signed_by}" if checked.signed_by else ", hashes only (no key given)"
    click.echo(f"OK: {m.name} {m.version} ({m.variant}, {m.model_format.value}) for {m.target_profile}{signer}")
