"""The bundle format: the one contract between the converter, the OTA server and devices.

A bundle is a directory::

    manifest.json        what the model is, how it was made, its files' hashes (below)
    model.onnx|.tflite   the model
    health_check.npz     sample input + expected output for the on-device health check
    signature.json       optional: Ed25519 signature over the exact bytes of manifest.json

``manifest.json`` (``format_version`` 1) holds: ``name``, ``version`` (dotted integers,
e.g. ``"1.4.0"``; devices refuse a lower one), ``model_file``, ``model_format``,
``files`` (every other file of the bundle with ``sha256`` and ``size``),
``source_model_sha256``, ``variant``, ``quantization`` (the full config that made the
variant, or null), ``target`` (``profile``, ``power_mode``: the runtime mode, and
``threads`` when the converter planned a thread count, e.g. to meet a power budget; ``accelerator``, ``cpu`` or
the profile's accelerator the converter planned it on, with its ONNX Runtime ``provider``), ``inputs``/``outputs``
(name, shape with null for dynamic dims, dtype), ``preprocessing`` (free-form notes),
``measured`` (figures from the converter; estimates are labelled as such),
``health_check`` (``file``, ``atol``, ``rtol``, ``max_latency_ms``), ``tool``
(``edgesdk`` version), ``created_at`` (UTC, ISO 8601) and, optionally, ``rollback_floor``
(a version at or below ``version``: a device that installs this release refuses any version of
this model below the floor afterwards; set it as the bundle is signed, ``edgesdk sign BUNDLE
--key K --rollback-floor 1.2.0``, so the ``bundles`` role's signatures cover it).

Because the manifest carries every file's hash, signing the manifest bytes signs the
whole bundle. Bundles are written to a temporary sibling directory and renamed into
place, so a half-written bundle never appears under its final name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import BundleError, SignatureError
from edgesdk.files import atomic_dir, write_atomic
from edgesdk.runtime.model_file import ModelFile, ModelFormat
from edgesdk.runtime.tensors import TensorSpec

__all__ = ["FORMAT_VERSION", "FileEntry", "HealthCheck", "Manifest", "Bundle", "BundleSpec", "HealthSample",
           "write_bundle", "read_bundle", "sign_bundle", "signers", "parse_version", "MANIFEST", "SIGNATURE",
           "HEALTH_FILE"]

FORMAT_VERSION = 1
MANIFEST, SIGNATURE, HEALTH_FILE = "manifest.json", "signature.json", "health_check.npz"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def parse_version(text: str) -> tuple[int, ...]:
    """``"1.4.0"`` -> ``(1, 4, 0)``; anything else is a BundleError."""
    if not isinstance(text, str) or not re.fullmatch(r"\d+(\.\d+){0,3}", text):
        raise BundleError(f"version {text!r} must be dotted integers such as '1.4.0'")
    return tuple(int(p) for p in text.split("."))


def safe_name(value: str, what: str) -> str:
    """Names from a manifest become file and directory names: no separators, no '..'."""
    if not isinstance(value, str) or not _SAFE_NAME.match(value) or ".." in value:
        shown = repr(value) if len(repr(value)) <= 80 else f"{repr(value)[:60]}... ({len(repr(value))} characters)"
        raise BundleError(f"{what} {shown} is not a safe name: use letters, digits, '.', '_' or '-' (no '/' or '..')")
    return value


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """A bundle file's hash and size, as the manifest lists it."""

    sha256: str
    size: int


@dataclass(frozen=True)
class HealthCheck:
    """The on-device check: run ``file``'s ``input`` and compare to its ``expected`` output."""

    file: str = HEALTH_FILE
    atol: float = 1e-3
    rtol: float = 1e-3
    #: Latency the device must meet on the sample (None: no latency gate).
    max_latency_ms: float | None = None


def _spec_dict(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype.name}


def _spec(data: Any, where: str) -> TensorSpec:
    try:
        return TensorSpec(str(data["name"]), tuple(None if d is None else int(d) for d in data["shape"]),
                          np.dtype(data["dtype"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"manifest {where}: expected {{name, shape, dtype}}, got {data!r} ({exc})") from exc


def _floor(floor: Any, version: str) -> None:
    if floor is not None and (not isinstance(floor, str) or parse_version(floor) > parse_version(version)):
        raise BundleError(f"rollback_floor {floor!r} must be a version at or below the bundle's own {version!r} "
                          "(a device could never run it otherwise); pass e.g. --rollback-floor " + version)


def _engine(accelerator: Any, provider: Any) -> None:
    for name, value in (("accelerator", accelerator), ("provider", provider)):
        if value is not None:
            safe_name(value, f"manifest target.{name}")
    if provider is not None and accelerator in (None, "cpu"):
        raise BundleError(f"manifest target.provider {provider!r} needs target.accelerator naming what it drives")


def _threads(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BundleError(f"manifest target.threads must be an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class Manifest:
    """The parsed, validated ``manifest.json``."""

    name: str
    version: str
    model_file: str
    model_format: ModelFormat
    files: Mapping[str, FileEntry]
    source_model_sha256: str
    variant: str
    target_profile: str
    power_mode: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    quantization: Mapping[str, Any] | None = None
    preprocessing: Mapping[str, Any] = field(default_factory=dict)
    measured: Mapping[str, Any] = field(default_factory=dict)
    health_check: HealthCheck | None = None
    tool_version: str = ""
    created_at: str = ""
    format_version: int = FORMAT_VERSION
    #: The thread count the converter planned the model for (None: the runtime mode's own).
    threads: int | None = None
    #: The lowest version of this model a device that installed this release may run afterwards (None: no floor).
    rollback_floor: str | None = None
    #: Where the converter planned it: ``cpu`` or an accelerator of the profile (None: not said; the runtime's choice).
    accelerator: str | None = None
    #: The ONNX Runtime provider the plan costed on that accelerator (``TensorrtExecutionProvider``), or None.
    provider: str | None = None

    def __post_init__(self) -> None:
        safe_name(self.name, "bundle name")
        parse_version(self.version)
        _floor(self.rollback_floor, self.version)
        _engine(self.accelerator, self.provider)
        for file_name in self.files:
            safe_name(file_name, "bundle file name")
        if self.model_file not in self.files:
            raise BundleError(f"manifest lists model_file {self.model_file!r} but no hash for it in 'files'")
        if self.health_check and self.health_check.file not in self.files:
            raise BundleError(f"manifest health_check file {self.health_check.file!r} has no hash in 'files'")

    @property
    def version_tuple(self) -> tuple[int, ...]:
        """The version as integers, for comparing (``(1, 4, 0)``)."""
        return parse_version(self.version)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as ``manifest.json`` holds it (see the module doc)."""
        return {
            "format_version": self.format_version,
            "name": self.name,
            "version": self.version,
            "model_file": self.model_file,
            "model_format": self.model_format.value,
            "files": {k: dataclasses.asdict(v) for k, v in sorted(self.files.items())},
            "source_model_sha256": self.source_model_sha256,
            "variant": self.variant,
            "quantization": dict(self.quantization) if self.quantization is not None else None,
            "target": {"profile": self.target_profile, "power_mode": self.power_mode,
                       **({"threads": self.threads} if self.threads is not None else {}),
                       **({"accelerator": self.accelerator} if self.accelerator is not None else {}),
                       **({"provider": self.provider} if self.provider is not None else {})},
            "inputs": [_spec_dict(s) for s in self.inputs],
            "outputs": [_spec_dict(s) for s in self.outputs],
            "preprocessing": dict(self.preprocessing),
            "measured": dict(self.measured),
            "health_check": dataclasses.asdict(self.health_check) if self.health_check else None,
            "tool": {"name": "edgesdk", "version": self.tool_version},
            "created_at": self.created_at,
            **({"rollback_floor": self.rollback_floor} if self.rollback_floor is not None else {}),
        }

    def to_bytes(self) -> bytes:
        """Canonical bytes (sorted keys, no spaces): what is hashed and signed."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        """Parse and validate a loaded ``manifest.json``; anything malformed is a BundleError naming the field."""
        if not isinstance(data, dict):
            raise BundleError(f"manifest must be a JSON object, got {type(data).__name__}")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise BundleError(f"manifest format_version {version!r} is not supported (this edgesdk reads "
                              f"{FORMAT_VERSION}); upgrade edgesdk on this device")
        try:
            files = {str(k): FileEntry(str(v["sha256"]), int(v["size"])) for k, v in data["files"].items()}
            health = HealthCheck(**data["health_check"]) if data.get("health_check") else None
            return cls(
                name=data["name"], version=data["version"], model_file=data["model_file"],
                model_format=ModelFormat(data["model_format"]), files=files,
                source_model_sha256=data["source_model_sha256"], variant=data["variant"],
                target_profile=data["target"]["profile"], power_mode=data["target"]["power_mode"],
                inputs=tuple(_spec(s, f"inputs[{i}]") for i, s in enumerate(data["inputs"])),
                outputs=tuple(_spec(s, f"outputs[{i}]") for i, s in enumerate(data["outputs"])),
                quantization=data.get("quantization"), preprocessing=data.get("preprocessing") or {},
                measured=data.get("measured") or {}, health_check=health,
                tool_version=data.get("tool", {}).get("version", ""), created_at=data.get("created_at", ""),
                threads=_threads(data["target"].get("threads")), rollback_floor=data.get("rollback_floor"),
                accelerator=data["target"].get("accelerator"), provider=data["target"].get("provider"),
            )
        except KeyError as exc:
            raise BundleError(f"manifest is missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, BundleError):
                raise
            raise BundleError(f"manifest has a field of the wrong type or value: {exc}") from exc


@dataclass(frozen=True)
class Bundle:
    """A bundle read from disk whose files all matched the manifest's hashes."""

    path: Path
    manifest: Manifest
    #: Key ids of the signatures that verified (every one of the keys asked for that signed it); empty when no key
    #: was given or the bundle is unsigned.
    signed_by: tuple[str, ...] = ()

    @property
    def model_path(self) -> Path:
        """Where the model file is."""
        return self.path / self.manifest.model_file

    def read_model(self) -> ModelFile:
        """The model's bytes, checked again against the manifest hash (so a swapped file is caught)."""
        content = self.model_path.read_bytes()
        model = ModelFile(self.model_path, self.manifest.model_format, content)
        expected = self.manifest.files[self.manifest.model_file].sha256
        if model.sha256 != expected:
            raise SignatureError(f"{self.model_path}: sha256 {model.sha256[:16]}… does not match the manifest's "
                                 f"{expected[:16]}…; the model changed after the bundle was made: reinstall it")
        return model

    def health_sample(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The health check's inputs and expected outputs, by tensor name."""
        if self.manifest.health_check is None:
            raise BundleError(f"{self.path}: manifest has no health_check")
        with np.load(self.path / self.manifest.health_check.file, allow_pickle=False) as data:
            inputs = {s.name: data[f"input:{s.name}"] for s in self.manifest.inputs}
            outputs = {s.name: data[f"output:{s.name}"] for s in self.manifest.outputs}
        return inputs, outputs


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@dataclass(frozen=True)
class BundleSpec:
    """What a new bundle's manifest says about its model besides the files: identity, target, provenance.

    Validated at construction (a safe ``name``, a dotted-integer ``version``).
    ``source_model_sha256`` None means the bundled model is its own source.
    """

    name: str
    version: str
    variant: str
    target_profile: str
    power_mode: str
    source_model_sha256: str | None = None
    health_check: HealthCheck = HealthCheck()
    #: The full config that made the variant, or None (not quantized).
    quantization: Mapping[str, Any] | None = None
    preprocessing: Mapping[str, Any] = field(default_factory=dict)
    #: Figures from the converter; estimates are labelled as such.
    measured: Mapping[str, Any] = field(default_factory=dict)
    #: The thread count planned for the board (None: the runtime mode's own).
    threads: int | None = None
    #: Devices that install this release refuse versions of the model below this one afterwards (None: no floor).
    rollback_floor: str | None = None
    #: ``cpu`` or the accelerator the converter planned it on, and that accelerator's provider (None: not said).
    accelerator: str | None = None
    provider: str | None = None

    def __post_init__(self) -> None:
        safe_name(self.name, "bundle name")
        parse_version(self.version)
        _threads(self.threads)
        _floor(self.rollback_floor, self.version)
        _engine(self.accelerator, self.provider)

    @classmethod
    def of(cls, manifest: Manifest) -> BundleSpec:
        """The spec a bundle was written from, e.g. to re-release its model as ``replace(spec, version=...)``."""
        return cls(manifest.name, manifest.version, manifest.variant, manifest.target_profile, manifest.power_mode,
                   manifest.source_model_sha256, manifest.health_check or HealthCheck(), manifest.quantization,
                   manifest.preprocessing, manifest.measured, manifest.threads, manifest.rollback_floor,
                   manifest.accelerator, manifest.provider)


@dataclass(frozen=True)
class HealthSample:
    """A model's signature and one sample run through it: what a bundle's health check replays on the device."""

    input_specs: tuple[TensorSpec, ...]
    output_specs: tuple[TensorSpec, ...]
    #: Sample inputs by input name.
    inputs: Mapping[str, np.ndarray]
    #: The model's outputs on ``inputs``, by output name: what the device must reproduce.
    outputs: Mapping[str, np.ndarray]


def write_bundle(out_dir: str | os.PathLike[str], model: ModelFile, spec: BundleSpec, sample: HealthSample,
                 private_key: Any = None) -> Bundle:
    """Write a bundle directory atomically (temp dir + rename) and return it read back.

    ``sample`` gives the manifest's inputs/outputs and the health check's data;
    ``private_key`` (Ed25519) signs the manifest. An existing ``out_dir`` is a BundleError.
    """
    from edgesdk import __version__

    out = Path(out_dir)
    if out.exists():
        raise BundleError(f"{out} already exists; choose a new --out directory or remove it")
    health = spec.health_check
    with atomic_dir(out) as staging:
        model_name = f"model.{model.format.value}"
        _write_file(staging / model_name, model.content)
        arrays = {f"input:{k}": np.asarray(v) for k, v in sample.inputs.items()}
        arrays.update({f"output:{k}": np.asarray(v) for k, v in sample.outputs.items()})
        with open(staging / health.file, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy stubs read ** as allow_pickle
            f.flush()
            os.fsync(f.fileno())
        files = {n: FileEntry(sha256_file(staging / n), (staging / n).stat().st_size)
                 for n in (model_name, health.file)}
        manifest = Manifest(
            name=spec.name, version=spec.version, model_file=model_name, model_format=model.format, files=files,
            source_model_sha256=spec.source_model_sha256 or model.sha256, variant=spec.variant,
            target_profile=spec.target_profile, power_mode=spec.power_mode, inputs=sample.input_specs,
            outputs=sample.output_specs, quantization=spec.quantization, preprocessing=spec.preprocessing,
            measured=spec.measured, health_check=health, tool_version=__version__, threads=spec.threads,
            rollback_floor=spec.rollback_floor, accelerator=spec.accelerator, provider=spec.provider,
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        _write_file(staging / MANIFEST, json.dumps(manifest.to_dict(), indent=2, sort_keys=True).encode())
        if private_key is not None:
            _write_signature(staging, private_key)
    return read_bundle(out)


def _signatures(path: Path) -> list[tuple[str, bytes]]:
    """The (key id, signature) pairs of a bundle's signature file: ``{"signatures": [{"algorithm", "key_id",
    "signature"}, ...]}``, or the single ``{"algorithm", "key_id", "signature"}`` of earlier releases."""
    import base64

    try:
        payload = json.loads(path.read_text())
        entries = payload["signatures"] if "signatures" in payload else [payload]
        return [(str(e["key_id"]), base64.b64decode(e["signature"], validate=True)) for e in entries
                if e.get("algorithm", "ed25519") == "ed25519"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SignatureError(f"{path} is malformed ({exc}); re-sign the bundle") from exc


def signers(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The key ids a bundle's signature file lists (as written, not verified: :func:`read_bundle` verifies)."""
    signature_path = Path(path) / SIGNATURE
    return tuple(kid for kid, _ in _signatures(signature_path)) if signature_path.exists() else ()


def _write_signature(directory: Path, private_key: Any) -> None:
    """Add ``private_key``'s signature of the manifest to the bundle's signatures (replacing its own earlier one)."""
    import base64

    from edgesdk.runtime.signing import key_id, sign

    manifest_bytes = (directory / MANIFEST).read_bytes()
    kid = key_id(private_key.public_key())
    others = _signatures(directory / SIGNATURE) if (directory / SIGNATURE).exists() else []
    entries = [{"algorithm": "ed25519", "key_id": k, "signature": base64.b64encode(sig).decode()}
               for k, sig in others if k != kid]
    entries.append({"algorithm": "ed25519", "key_id": kid,
                    "signature": base64.b64encode(sign(private_key, manifest_bytes)).decode()})
    write_atomic(directory / SIGNATURE, json.dumps({"signatures": entries}, indent=2).encode())


def sign_bundle(path: str | os.PathLike[str], private_key: Any, rollback_floor: str | None = None) -> Bundle:
    """Add a signature of an existing bundle's manifest (after checking its hashes), beside the signatures of other
    keys already there (a threshold of the root's ``bundles`` role, e.g. CI and a release manager); a second
    signature by the same key replaces the first. ``rollback_floor`` first writes that floor into the manifest
    (see the module doc): refused (BundleError) when other keys signed the manifest's current bytes."""
    bundle = read_bundle(path)
    if rollback_floor is not None and rollback_floor != bundle.manifest.rollback_floor:
        _set_floor(bundle, rollback_floor, private_key)
    _write_signature(bundle.path, private_key)
    return read_bundle(path, public_key=private_key.public_key(), require_signature=True)


def _set_floor(bundle: Bundle, floor: str, private_key: Any) -> None:
    """Write ``floor`` into the manifest, unless keys other than ``private_key`` signed its present bytes."""
    from edgesdk.runtime.signing import key_id

    m = bundle.manifest
    others = [k for k in signers(bundle.path) if k != key_id(private_key.public_key())]
    if others:
        raise BundleError(f"{m.name} {m.version} is already signed by {', '.join(others)} over a manifest "
                          f"with rollback_floor {m.rollback_floor!r}; setting {floor!r} changes those bytes and "
                          "voids their signatures: set --rollback-floor with the first signature, then have the "
                          "others sign")
    data = json.loads((bundle.path / MANIFEST).read_bytes())
    data["rollback_floor"] = floor
    Manifest.from_dict(data)  # the floor is a version at or below the bundle's own
    write_atomic(bundle.path / MANIFEST, json.dumps(data, indent=2, sort_keys=True).encode())


def read_bundle(path: str | os.PathLike[str], public_key: Any = None, require_signature: bool = False,
                verify_model: bool = True) -> Bundle:
    """Read and verify a bundle: manifest schema, every file's hash, and the signatures if keys are given.

    ``public_key`` is one signer's key (its signature must be among the bundle's), or a
    :class:`~edgesdk.runtime.signing.KeySet` (a threshold of its keys must have signed, e.g. the
    ``bundles`` role of a device's root of trust). With ``require_signature`` an unsigned bundle is a
    SignatureError. ``verify_model=False``
    checks the model file's size only, for callers that load it with :meth:`Bundle.read_model`,
    which hashes the bytes it loads (one pass over a large model instead of two).
    """
    from edgesdk.runtime.signing import KeySet

    root = Path(path)
    manifest_path = root / MANIFEST
    try:
        manifest_bytes = manifest_path.read_bytes()
    except FileNotFoundError:
        raise BundleError(f"{root} is not a bundle: {MANIFEST} not found") from None
    try:
        manifest = Manifest.from_dict(json.loads(manifest_bytes))
    except json.JSONDecodeError as exc:
        raise BundleError(f"{manifest_path} is not valid JSON ({exc}); the bundle is corrupt or truncated") from exc

    signed_by: tuple[str, ...] = ()
    signature_path = root / SIGNATURE
    if signature_path.exists() and public_key is not None:
        keys = public_key if isinstance(public_key, KeySet) else KeySet.of([public_key])
        signed_by = keys.verify(manifest_bytes, _signatures(signature_path), f"{manifest.name} {manifest.version}")
    elif require_signature and not signature_path.exists():
        # Named by manifest, not path: on the server the path is an upload's temp directory.
        raise SignatureError(f"the bundle is not signed ({manifest.name} {manifest.version} has no {SIGNATURE}); "
                             "sign it with `edgesdk sign BUNDLE --key KEY`")
    elif require_signature:
        raise SignatureError(f"the bundle ({manifest.name} {manifest.version}) is signed but no public key was given "
                             "to check it; pass the signer's public key (`edgesdk verify BUNDLE --pub KEY.pub`)")

    for file_name, entry in manifest.files.items():
        file_path = root / file_name
        if not file_path.is_file():
            raise BundleError(f"{root}: manifest lists {file_name!r} but the file is missing")
        size = file_path.stat().st_size
        if size != entry.size:
            raise SignatureError(f"{file_path}: size {size} does not match the manifest's {entry.size}; "
                                 "the file is truncated or was replaced")
        if file_name == manifest.model_file and not verify_model:
            continue
        digest = sha256_file(file_path)
        if digest != entry.sha256:
            raise SignatureError(f"{file_path}: sha256 {digest[:16]}… does not match the manifest's "
                                 f"{entry.sha256[:16]}…; the bundle was modified after it was made")
    return Bundle(root, manifest, signed_by)
