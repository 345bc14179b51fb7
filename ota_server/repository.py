"""The versioned model repository: ``<repo>/<model>/<version>/<profile>/`` bundle directories.

Like TF Serving's layout, one directory per version; a version (a *release*) holds one bundle
per board it was converted for, its *artifacts*, each under the device profile its manifest
targets (``raspberry-pi-5``, ``jetson-orin-nano``, ``generic-aarch64``), as an OCI index holds
one image per platform. Uploaded bundles are verified (manifest, hashes, and the signature when
a signer key is configured; unsigned bundles are refused unless the development flag is set)
and copied in atomically. A version policy keeps the newest ``keep_latest`` versions of each
model plus pinned and in-use ones.

A repository written before releases had artifacts (``<model>/<version>/manifest.json``) is
moved to the new layout when it is opened, by two renames per version.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from edgesdk.errors import BundleError, ConflictError, EdgeSDKError, NotFoundError, SignatureError
from edgesdk.fleet.archive import pack_bundle, unpack_bundle
from edgesdk.fleet.protocol import ArchiveInfo, archive_info
from edgesdk.runtime.boards import GENERIC_PREFIX
from edgesdk.runtime.bundle import Manifest, parse_version, read_bundle, safe_name
from edgesdk.runtime.tensors import signature_changes

__all__ = ["ModelRepository"]


def _manifest_sha256(bundle_dir: Path) -> str:
    """The manifest names every file's hash, so its own hash identifies the bundle's content."""
    return hashlib.sha256((bundle_dir / "manifest.json").read_bytes()).hexdigest()


class ModelRepository:
    """Signed bundles by model and version; a stored version never changes (other content is a ConflictError)."""

    def __init__(self, root: str | os.PathLike[str], keep_latest: int = 5, signer_key: Any = None,
                 allow_unsigned: bool = False, chunk_size: int | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep_latest, self.signer_key, self.allow_unsigned = keep_latest, signer_key, allow_unsigned
        #: None: content-defined chunks (edgesdk.fleet.chunking), so versions that share bytes share chunks; an int:
        #: fixed chunks of that many bytes (tests that want many small chunks).
        self.chunk_size = chunk_size
        self._lock = threading.Lock()
        #: (name, version, artifact) -> the chunk table of its archive: artifacts never change, and cutting takes
        #: ~0.1 s/MB.
        self._tables: dict[tuple[str, str, str], ArchiveInfo] = {}
        self._migrate()

    def _migrate(self) -> None:
        """Move single-bundle versions (``<model>/<version>/manifest.json``) to ``<model>/<version>/<profile>/``:
        rename the version aside, then into its new place (a crash between the two is finished on the next open)."""
        for aside in self.root.glob("*/.*.single"):
            version_dir = aside.parent / aside.name[1:].removesuffix(".single")
            version_dir.mkdir(exist_ok=True)
            os.replace(aside, version_dir / read_bundle(aside, verify_model=False).manifest.target_profile)
        for manifest in self.root.glob("*/*/manifest.json"):
            version_dir = manifest.parent
            if version_dir.name.startswith("."):
                continue
            aside = version_dir.parent / f".{version_dir.name}.single"
            os.replace(version_dir, aside)
            version_dir.mkdir()
            os.replace(aside, version_dir / read_bundle(aside, verify_model=False).manifest.target_profile)

    def _check(self, bundle_dir: Path) -> Manifest:
        if self.signer_key is None and not self.allow_unsigned:
            raise SignatureError("the server has no bundle signer key configured; start it with --bundle-key, or "
                                 "--allow-unsigned for development")
        bundle = read_bundle(bundle_dir, public_key=self.signer_key, require_signature=not self.allow_unsigned)
        return bundle.manifest

    def add(self, bundle_dir: str | os.PathLike[str]) -> tuple[Manifest, bool]:
        """Verify a bundle directory and store it as the artifact ``<model>/<version>/<target profile>``;
        ``(manifest, stored)``.

        Artifacts are immutable: the same bundle again is a no-op (``stored`` is False), a different bundle for
        a stored name, version and profile is a :class:`ConflictError`. Another board's bundle of a stored
        version joins its release, when its inputs and outputs are the release's (an app that follows the model
        must not see its signature change with the board); else a ConflictError too.
        """
        manifest = self._check(Path(bundle_dir))
        release = self.root / safe_name(manifest.name, "model name") / manifest.version
        target = release / safe_name(manifest.target_profile, "target profile")
        with self._lock:
            if target.exists():
                given, stored = _manifest_sha256(Path(bundle_dir)), _manifest_sha256(target)
                if given != stored:
                    raise ConflictError(
                        f"{manifest.name} {manifest.version} for {manifest.target_profile} is already in the "
                        f"repository with other content (manifest sha256 stored {stored}, given {given}); releases "
                        "are immutable: convert again with a higher --version")
                return manifest, False
            self._check_joins(release, manifest)
            release.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{manifest.target_profile}.", dir=release))
            try:
                for path in Path(bundle_dir).iterdir():
                    shutil.copy2(path, tmp / path.name)
                read_bundle(tmp)
                os.replace(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        self.chunk_table(manifest.name, manifest.version, manifest.target_profile)  # cut once now, not mid-rollout
        return manifest, True

    def _check_joins(self, release: Path, manifest: Manifest) -> None:
        """Refuse an artifact whose inputs or outputs differ from those of the release's other artifacts."""
        if not release.is_dir():
            return
        for other in sorted(p for p in release.iterdir() if (p / "manifest.json").is_file()):
            theirs = read_bundle(other, verify_model=False).manifest
            changes = signature_changes(theirs.inputs, theirs.outputs, manifest.inputs, manifest.outputs)
            if changes:
                raise ConflictError(
                    f"{manifest.name} {manifest.version} for {manifest.target_profile} cannot join the release: its "
                    f"inputs or outputs differ from the {theirs.target_profile} artifact's ({'; '.join(changes)}); "
                    "one release serves one model signature on every board: convert with the same inputs and "
                    "outputs, or use a higher --version")

    def add_archive(self, data: bytes) -> tuple[Manifest, bool]:
        """Store a bundle uploaded as a tar archive (as ``edgesdk push`` sends it); see :meth:`add`.

        Errors name files inside the bundle, never the server's temporary directory.
        """
        with tempfile.TemporaryDirectory(prefix="edgesdk-upload-") as tmp:
            archive = Path(tmp) / "bundle.tar"
            archive.write_bytes(data)
            try:
                try:
                    unpack_bundle(archive, Path(tmp) / "bundle")
                except (OSError, EOFError, ValueError, tarfile.TarError) as exc:
                    raise BundleError(f"upload is not a bundle archive ({exc}); send the tar `edgesdk push` makes") \
                        from None
                return self.add(Path(tmp) / "bundle")
            except EdgeSDKError as exc:
                if tmp not in str(exc):
                    raise
                raise type(exc)(str(exc).replace(f"{tmp}/bundle/", "").replace(f"{tmp}/bundle", "the bundle")
                                .replace(tmp, "the upload")) from None

    def models(self) -> list[str]:
        """The model names with at least one stored version, sorted."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def versions(self, name: str) -> list[str]:
        """The stored versions of model ``name``, lowest version first."""
        folder = self.root / safe_name(name, "model name")
        if not folder.is_dir():
            return []
        versions = [p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")
                    and any((a / "manifest.json").is_file() for a in p.iterdir())]
        return sorted(versions, key=parse_version)

    def artifacts(self, name: str, version: str) -> list[str]:
        """The target profiles ``name`` ``version`` has an artifact for, sorted ([] when it is not stored)."""
        release = self.root / safe_name(name, "model name") / version
        if not release.is_dir():
            return []
        return sorted(p.name for p in release.iterdir()
                      if not p.name.startswith(".") and (p / "manifest.json").is_file())

    def path(self, name: str, version: str, artifact: str | None = None) -> Path:
        """The bundle directory of ``name`` ``version`` for board ``artifact`` (a target profile); NotFoundError if
        it is not stored. Without ``artifact``: the release's only artifact, else the one that fits this host
        (``generic-<arch>``), else the first by name (what the server itself serves)."""
        artifacts = self.artifacts(name, version)
        if not artifacts:
            raise NotFoundError(f"{name} {version} is not in the repository; known versions: {self.versions(name)}")
        if artifact is None:
            host = f"{GENERIC_PREFIX}{platform.machine().lower()}"
            artifact = host if host in artifacts else artifacts[0]
        elif artifact not in artifacts:
            raise NotFoundError(f"{name} {version} has no artifact for {artifact}; it has {', '.join(artifacts)}: "
                                f"push a bundle converted with --profile {artifact}")
        return self.root / safe_name(name, "model name") / version / artifact

    def manifest(self, name: str, version: str, artifact: str | None = None) -> Manifest:
        """The manifest of a stored artifact (see :meth:`path`)."""
        return read_bundle(self.path(name, version, artifact)).manifest

    def archive(self, name: str, version: str, artifact: str | None = None) -> tuple[bytes, ArchiveInfo]:
        """An artifact as the tar the devices receive, with its chunk hashes.

        Built on every call (verify, pack, hash): the chunk service keeps it while a transfer
        needs it, so the repository holds no archive bytes of its own.
        """
        path = self.path(name, version, artifact)
        read_bundle(path)  # a bundle changed on disk after upload is caught here, and again on devices
        data = pack_bundle(path)
        key = (name, version, path.name)
        table = self._tables.get(key)
        if table is None or table.sha256 != hashlib.sha256(data).hexdigest():
            table = ArchiveInfo.of(data, self.chunk_size) if self.chunk_size else archive_info(data)
            with self._lock:
                self._tables[key] = table
        return data, table

    def chunk_table(self, name: str, version: str, artifact: str | None = None) -> ArchiveInfo | None:
        """The chunk table of a stored artifact's archive (built once), or None when it is not stored."""
        table = self._tables.get((name, version, artifact)) if artifact else None
        if table is not None:
            return table
        try:
            return self.archive(name, version, artifact)[1]
        except (NotFoundError, BundleError):
            return None

    # version policy ------------------------------------------------------------------------
    def _pins_path(self, name: str) -> Path:
        return self.root / safe_name(name, "model name") / ".pins.json"

    def pins(self, name: str) -> set[str]:
        """The pinned versions of model ``name`` (kept by :meth:`apply_policy` however old)."""
        path = self._pins_path(name)
        return set(json.loads(path.read_text())) if path.exists() else set()

    def pin(self, name: str, version: str, pinned: bool = True) -> None:
        """Pin (or with ``pinned=False`` unpin) a stored version."""
        self.path(name, version)
        pins = self.pins(name)
        pins = pins | {version} if pinned else pins - {version}
        self._pins_path(name).write_text(json.dumps(sorted(pins)))

    def apply_policy(self, in_use: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
        """Delete versions beyond the newest ``keep_latest`` that are neither pinned nor in use."""
        used = set(in_use)
        removed = []
        for name in self.models():
            versions = self.versions(name)
            keep = set(versions[-self.keep_latest:]) | self.pins(name) | {v for n, v in used if n == name}
            for version in versions:
                if version not in keep:
                    shutil.rmtree(self.root / name / version)
                    removed.append((name, version))
        return removed
