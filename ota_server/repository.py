"""The versioned model repository: ``<repo>/<model>/<version>/`` bundle directories.

Like TF Serving's layout, one directory per version. Uploaded bundles are verified
(manifest, hashes, and the signature when a signer key is configured; unsigned bundles
are refused unless the development flag is set) and copied in atomically. A version
policy keeps the newest ``keep_latest`` versions of each model plus pinned and in-use ones.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from edgesdk.bundle import Manifest, parse_version, read_bundle, safe_name
from edgesdk.errors import BundleError, SignatureError
from edgesdk.ota import ArchiveInfo, pack_bundle, unpack_bundle

__all__ = ["ModelRepository"]


class ModelRepository:
    def __init__(self, root: str | os.PathLike[str], keep_latest: int = 5, signer_key: Any = None,
                 allow_unsigned: bool = False, chunk_size: int = 256 * 1024) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep_latest, self.signer_key, self.allow_unsigned = keep_latest, signer_key, allow_unsigned
        self.chunk_size = chunk_size
        self._archives: dict[tuple[str, str], tuple[bytes, ArchiveInfo]] = {}
        self._lock = threading.Lock()

    def _check(self, bundle_dir: Path) -> Manifest:
        if self.signer_key is None and not self.allow_unsigned:
            raise SignatureError("the server has no bundle signer key configured; start it with --bundle-key, or "
                                 "--allow-unsigned for development")
        bundle = read_bundle(bundle_dir, public_key=self.signer_key, require_signature=not self.allow_unsigned)
        return bundle.manifest

    def add(self, bundle_dir: str | os.PathLike[str]) -> Manifest:
        """Verify a bundle directory and store it as ``<model>/<version>``."""
        manifest = self._check(Path(bundle_dir))
        target = self.root / safe_name(manifest.name, "model name") / manifest.version
        with self._lock:
            if target.exists():
                raise BundleError(f"{manifest.name} {manifest.version} is already in the repository; bump the version")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{manifest.version}.", dir=target.parent))
            try:
                for path in Path(bundle_dir).iterdir():
                    shutil.copy2(path, tmp / path.name)
                read_bundle(tmp)
                os.replace(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return manifest

    def add_archive(self, data: bytes) -> Manifest:
        """Store a bundle uploaded as a tar archive (as ``edgesdk push`` sends it)."""
        with tempfile.TemporaryDirectory(prefix="edgesdk-upload-") as tmp:
            archive = Path(tmp) / "bundle.tar"
            archive.write_bytes(data)
            try:
                unpack_bundle(archive, Path(tmp) / "bundle")
            except (OSError, EOFError, ValueError) as exc:
                raise BundleError(f"upload is not a bundle archive ({exc}); send the tar `edgesdk push` makes") from exc
            except Exception as exc:  # tarfile.ReadError and friends
                if isinstance(exc, BundleError):
                    raise
                raise BundleError(f"upload is not a bundle archive ({exc})") from exc
            return self.add(Path(tmp) / "bundle")

    def models(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def versions(self, name: str) -> list[str]:
        folder = self.root / safe_name(name, "model name")
        if not folder.is_dir():
            return []
        versions = [p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
        return sorted(versions, key=parse_version)

    def path(self, name: str, version: str) -> Path:
        path = self.root / safe_name(name, "model name") / version
        if not (path / "manifest.json").is_file():
            raise BundleError(f"{name} {version} is not in the repository; known versions: {self.versions(name)}")
        return path

    def manifest(self, name: str, version: str) -> Manifest:
        return read_bundle(self.path(name, version)).manifest

    def archive(self, name: str, version: str) -> tuple[bytes, ArchiveInfo]:
        """The bundle as the tar the devices receive, with its chunk hashes (cached)."""
        key = (name, version)
        with self._lock:
            if key not in self._archives:
                path = self.path(name, version)
                read_bundle(path)  # a bundle changed on disk after upload is caught here, and again on devices
                data = pack_bundle(path)
                self._archives[key] = (data, ArchiveInfo.of(data, self.chunk_size))
            return self._archives[key]

    # version policy ------------------------------------------------------------------------
    def _pins_path(self, name: str) -> Path:
        return self.root / safe_name(name, "model name") / ".pins.json"

    def pins(self, name: str) -> set[str]:
        path = self._pins_path(name)
        return set(json.loads(path.read_text())) if path.exists() else set()

    def pin(self, name: str, version: str, pinned: bool = True) -> None:
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
                    self._archives.pop((name, version), None)
                    removed.append((name, version))
        return removed
