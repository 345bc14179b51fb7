"""Every parser that takes network input, as a fuzz target: what it parses, from what strategy, and the property.

The property is the same for all: an input is accepted as a typed record or refused with an
:class:`~edgesdk.errors.EdgeSDKError` subclass; nothing else is raised; and where a target names
its semantic bounds (``Target.bounds``), an accepted record is within them (a command bound to this
device and unexpired, a chunk index in range, a finite time...), else :class:`OutOfBounds`.
:func:`exercise` checks it for one target and one input. ``tests/fuzz/test_parsers.py`` runs each target under the CI
profile; ``benchmarks/security/security.py --part fuzz`` runs them long and counts what it tried.

Signed inputs (commands, roots, timestamps) are signed here with real keys over mutated
contents, so the fuzzer reaches the code behind the signature check, as a holder of a stolen
key would.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import strategies as st

from edgesdk.errors import EdgeSDKError
from tests.fuzz.hostile import damaged, encode, json_messages, json_values, mutated


class Keys:
    """Fresh Ed25519 keys for each role, and the root they make (built once per process)."""

    @cached_property
    def commands(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.generate()

    @cached_property
    def root_keys(self) -> list[Ed25519PrivateKey]:
        return [Ed25519PrivateKey.generate() for _ in range(2)]

    @cached_property
    def timestamp(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.generate()

    def root_signed(self, version: int) -> dict[str, Any]:
        from edgesdk.fleet.trust import new_root

        pub = [k.public_key() for k in self.root_keys]
        return new_root(version, time.time() + 86400, {"root": (pub, 2), "bundles": (pub[:1], 1),
                                                       "commands": ([self.commands.public_key()], 1),
                                                       "timestamp": ([self.timestamp.public_key()], 1)})

    @cached_property
    def root(self) -> Any:
        from edgesdk.fleet.trust import sign_metadata, trust_root

        return trust_root(sign_metadata(self.root_signed(1), self.root_keys))


KEYS = Keys()


class OutOfBounds(Exception):
    """A parser accepted a record outside its semantic bounds (what :attr:`Target.bounds` found)."""


@dataclass(frozen=True)
class Target:
    """One parser under fuzz: ``inputs()`` builds its strategy, ``parse(value)`` runs it (raising on refusal), and
    ``bounds(record)`` lists how an accepted record breaks the bounds it must keep (empty: none)."""

    name: str
    inputs: Callable[[], st.SearchStrategy[Any]]
    parse: Callable[[Any], Any]
    bounds: Callable[[Any], list[str]] | None = None


def exercise(target: Target, value: Any) -> bool:
    """Run ``target`` on ``value``: True when accepted (within its bounds), False when refused with an EdgeSDKError;
    an accepted record out of bounds raises :class:`OutOfBounds`, anything else raised propagates (the property
    fails)."""
    try:
        record = target.parse(value)
    except EdgeSDKError:
        return False
    broken = target.bounds(record) if target.bounds is not None else []
    if broken:
        raise OutOfBounds(f"{target.name}: accepted out of bounds: {'; '.join(broken)} <- {value!r:.300}")
    return True


def _finite(value: Any, low: float = float("-inf"), high: float = float("inf")) -> bool:
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and low <= value <= high


# -- messages a server sends a device ---------------------------------------------------------------------------
def _command_manifest() -> dict[str, Any]:
    now = time.time()
    return {"type": "deploy", "deployment_id": "r1", "transfer_id": "r1-w0", "name": "digits", "version": "1.2.0",
            "group": "cams", "rollback": False, "issued_at": now, "expires_at": now + 3600,
            "archive": {"sha256": "a" * 64, "size": 10, "chunks": ["b" * 64, "c" * 64], "sizes": [4, 6], "zstd": [1]},
            "broadcast": [0, 1], "offload": {"url": "http://127.0.0.1:8000", "model": "digits", "version": "1.2.0"}}


def _seal(manifest: Any) -> bytes:
    from edgesdk.runtime.signing import key_id, sign

    body = json.dumps(manifest).encode()
    return json.dumps({"manifest": base64.b64encode(body).decode(),
                       "signature": base64.b64encode(sign(KEYS.commands, body)).decode(),
                       "key_id": key_id(KEYS.commands.public_key())}).encode()


def _commands() -> st.SearchStrategy[bytes]:
    valid = _command_manifest()
    measure = {"type": "measure", "measurement_id": "m1", "transfer_id": "m1", "mode": "latency", "runs": 5,
               "issued_at": time.time(), "expires_at": time.time() + 3600, "archive": valid["archive"]}
    return st.one_of(mutated(valid).map(_seal), mutated(measure).map(_seal), json_values.map(_seal),
                     damaged(_seal(valid)), st.binary(max_size=200))


def _parse_command(envelope: bytes) -> Any:
    from edgesdk.fleet.protocol import parse_command

    return parse_command(envelope, KEYS.root.keyset("commands"))


#: The device and time the bound commands are parsed as and at (fixed: a shrunk failure replays the same way).
_ME, _NOW = ("cam0", "cams"), 1_900_000_000.0


@st.composite
def _bound_commands(draw: Any) -> bytes:
    """Commands as a server of this release seals them: bound to a device (this one, another, of another group,
    or to none) with an expiry around the parse time, over mutated manifests; some bindings damaged or spliced."""
    from edgesdk.fleet.command_scope import Binder

    manifest = draw(mutated({**_command_manifest(), "issued_at": _NOW - 60,
                             "expires_at": draw(st.sampled_from([_NOW + 600, _NOW - 1, _NOW, _NOW + 1e-3]))}))
    envelope = _seal(manifest)
    to = draw(st.sampled_from(["cam0", "cam1", "gate0", None]))
    if to is None:
        return envelope
    try:
        bound = Binder(KEYS.commands, envelope).bind(to)
    except (ValueError, KeyError, TypeError, EdgeSDKError):
        return envelope
    spliced = Binder(KEYS.commands, _seal(_command_manifest())).bind("cam0")  # a binding for another manifest
    head, _, tail = spliced.partition(b',"binding"')
    return draw(st.sampled_from([bound, bound, bound[:-1] + b',"x":1}', envelope.rstrip(b"}") + b',"binding"' + tail,
                                 head + b"}"]))


def _parse_bound_command(envelope: bytes) -> Any:
    """As the agent of a device holding a root parses them: bound to it, strict, at a fixed time."""
    from types import SimpleNamespace

    from edgesdk.fleet.protocol import parse_command

    device, group = _ME
    return parse_command(envelope, KEYS.root.keyset("commands"), now=_NOW,
                         to=SimpleNamespace(device_id=device, group=group), strict=True)


def _command_bounds(command: Any, strict: bool = False) -> list[str]:
    """What an accepted command must be: a safe name and a dotted version, a finite issue time, an archive whose
    chunk sizes add up; strictly parsed (a root-holding device), bound to this device and unexpired at the parse
    time."""
    import re

    broken = []
    version = getattr(command, "version", "0")  # a measure command has none
    if not re.fullmatch(r"\d+(\.\d+)*", str(version)):
        broken.append(f"version {version!r}")
    if not _finite(command.issued_at):
        broken.append(f"issued_at {command.issued_at!r}")
    archive = command.archive
    if archive is not None and (len(archive.chunks) != len(archive.sizes) or sum(archive.sizes) != archive.size
                                or any(s <= 0 for s in archive.sizes)):
        broken.append(f"archive {archive.size} in chunks {list(archive.sizes)[:8]}")
    if strict:
        if getattr(command, "device", None) != _ME[0]:
            broken.append(f"bound to {getattr(command, 'device', None)!r}, parsed as {_ME[0]!r}")
        manifest = json.loads(base64.b64decode(json.loads(command.raw)["manifest"]))
        expires = manifest.get("expires_at")
        if not _finite(expires) or expires <= _NOW:
            broken.append(f"expires_at {expires!r} at parse time {_NOW}")
    return broken


def _chunks() -> st.SearchStrategy[tuple[Any, int, bytes]]:
    import zstandard

    from edgesdk.fleet.protocol import ArchiveInfo

    raw = b"edgesdk chunk " * 40
    frame = zstandard.ZstdCompressor().compress(raw)
    info = ArchiveInfo("a" * 64, len(raw) + 4, ("b" * 64, "c" * 64), (len(raw), 4), frozenset({0}))
    return st.tuples(st.just(info), st.sampled_from([0, 1]),
                     st.one_of(damaged(frame), st.binary(max_size=300), st.just(frame)))


def _decode_chunk(value: tuple[Any, int, bytes]) -> bytes:
    from edgesdk.fleet.chunk_codec import decode_chunk

    return decode_chunk(*value)


def _roots() -> st.SearchStrategy[bytes]:
    from edgesdk.fleet.trust import sign_metadata

    valid = KEYS.root_signed(2)
    return st.one_of(mutated(valid).map(lambda signed: sign_metadata(signed, KEYS.root_keys)),
                     damaged(sign_metadata(valid, KEYS.root_keys)), json_messages({"signed": valid, "signatures": []}))


def _update_root(document: bytes) -> Any:
    from edgesdk.fleet.trust import update_root

    return update_root(KEYS.root, document)


def _timestamps() -> st.SearchStrategy[bytes]:
    from edgesdk.fleet.trust import new_timestamp, sign_metadata

    valid = new_timestamp(7, time.time() + 300, 1, {"cams": "d" * 64})
    return st.one_of(mutated(valid).map(lambda signed: sign_metadata(signed, [KEYS.timestamp])),
                     damaged(sign_metadata(valid, [KEYS.timestamp])), json_messages({"signed": valid}))


def _parse_timestamp(document: bytes) -> Any:
    from edgesdk.fleet.trust import parse_timestamp

    return parse_timestamp(document, KEYS.root)


# -- bundle archives ----------------------------------------------------------------------------------------------
class _Archives:
    """A real signed bundle (a small MLP, signed by the root's bundles key) packed, and where cases unpack."""

    @cached_property
    def valid(self) -> bytes:
        from edgesdk.fleet.archive import pack_bundle
        from edgesdk.runtime.bundle import BundleSpec
        from edgesdk.runtime.bundling import bundle_from_model
        from edgesdk.testing import random_mlp, write_mlp_onnx

        model = write_mlp_onnx(random_mlp([8, 4, 2]), self.work / "model.onnx")
        spec = BundleSpec("digits", "1.0.0", "onnx-fp32", "generic-x86_64", "latency")
        bundle = bundle_from_model(self.work / "bundle", model, spec,
                                   {"input": np.ones((1, 8), np.float32)}, private_key=KEYS.root_keys[0])
        return pack_bundle(bundle.path)

    @cached_property
    def work(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="edgesdk-fuzz-archives-"))


ARCHIVES = _Archives()
_TYPES = [tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE,
          tarfile.DIRTYPE, tarfile.GNUTYPE_SPARSE, tarfile.CONTTYPE, b"x"]
_NAMES = ["model.onnx", "manifest.json", "signature.json", "extra.bin", "../escape", "/abs", "a/b", ".", "", "x" * 300]


@st.composite
def _archives(draw: Any) -> bytes:
    """The valid archive, damaged; or rebuilt with members changed, added or dropped (links, devices, sparse
    files, size claims, escaping names)."""
    valid = ARCHIVES.valid
    if draw(st.booleans()):
        return draw(st.one_of(st.just(valid), damaged(valid)))
    members = []
    with tarfile.open(fileobj=io.BytesIO(valid), mode="r:") as tar:
        for member in tar.getmembers():
            members.append((member, tar.extractfile(member).read()))  # type: ignore[union-attr]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=draw(st.sampled_from([tarfile.PAX_FORMAT,
                                                                              tarfile.GNU_FORMAT]))) as out:
        for member, data in members:
            if draw(st.integers(0, 9)) == 0:
                continue  # dropped
            if draw(st.integers(0, 4)) == 0:
                data = draw(st.one_of(damaged(data), st.binary(max_size=64)))
            member.size = len(data)
            out.addfile(member, io.BytesIO(data))
        for _ in range(draw(st.integers(0, 2))):
            data = draw(st.binary(max_size=64))
            info = tarfile.TarInfo(draw(st.sampled_from(_NAMES)))
            info.type = draw(st.sampled_from(_TYPES))
            info.linkname = draw(st.sampled_from(["../../etc/passwd", "model.onnx", "/dev/zero"]))
            info.size = len(data)
            if info.type == tarfile.GNUTYPE_SPARSE:
                info.pax_headers = {"GNU.sparse.realsize": str(draw(st.sampled_from([2**26, 2**40])))}
            out.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _unpack(archive: bytes) -> Any:
    """Unpack into a fresh ``slot`` beside the archive; anything written elsewhere, or not a plain file, is a
    property failure (AssertionError), not a refusal."""
    from edgesdk.fleet.archive import unpack_bundle

    case = Path(tempfile.mkdtemp(dir=ARCHIVES.work))
    (case / "in.tar").write_bytes(archive)
    try:
        return unpack_bundle(case / "in.tar", case / "slot", keys=KEYS.root.keyset("bundles"))
    finally:
        beside = sorted(p.name for p in case.iterdir())
        odd = [p for p in (case / "slot").rglob("*") if not p.is_file() or p.is_symlink()] \
            if (case / "slot").exists() else []
        shutil.rmtree(case)
        assert set(beside) <= {"in.tar", "slot"} and not odd, f"written outside the slot: {beside}, {odd}"


# -- messages a device sends the server --------------------------------------------------------------------------
def _measurement_results() -> st.SearchStrategy[bytes]:
    from edgesdk.fleet.measurement import encode_array

    done = {"measurement_id": "m1", "status": "done", "figures": {"p50_ms": 1.5, "runs": 5},
            "outputs": {"y": encode_array(np.ones((2, 3), np.float32))}}
    failed = {"measurement_id": "m1", "status": "failed", "error": "no", "error_type": "ConversionError"}
    return st.one_of(json_messages(done), json_messages(failed))


def _parse_result(payload: bytes) -> Any:
    from edgesdk.fleet.measurement import decode_array, parse_result

    message = parse_result(payload)
    for text in (message.get("outputs") or {}).values():
        decode_array(text)  # the server decodes the outputs it hands on
    return message


_STATE = {"status": "online", "group": "cams", "model": "digits", "version": "1.0.0", "previous": "digits-0.9.0",
          "slots": ["digits-1.0.0"], "chunk_slots": ["digits-1.0.0"], "disk": {"free": 10, "used": 1}, "keep_slots": 3,
          "pinned": [], "updated": 1.0, "session": 1.0,
          "trust": {"root_version": 1, "stale": False, "expires": "2030-01-01T00:00:00Z"},
          "runtime": {"count": 3, "p50_ms": 1.0, "p99_ms": 2.0},
          "energy": {"energy_per_inference_mj": 1.5, "avg_watts": 2.0}}
_EVENT = {"event": "failed", "deployment_id": "r1", "version": "1.0.0", "reason": "health check failed"}
_NEED = {"transfer_id": "r1-w0", "chunks": [0, 1, 2]}


def _device_report(parser: str) -> Callable[[bytes], Any]:
    def parse(payload: bytes) -> Any:
        from edgesdk.fleet import reports

        return getattr(reports, parser)("cam1", payload)

    return parse


# -- the V2 inference endpoint -----------------------------------------------------------------------------------
_V2_JSON = {"id": "1", "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}], "parameters": {"binary_data_output": False}}


def _v2_binary() -> st.SearchStrategy[tuple[bytes, int | None]]:
    from edgesdk.offload.v2_codec import HEADER_LENGTH, encode_request

    body, headers = encode_request({"input": np.arange(8, dtype=np.float32).reshape(2, 4)}, binary_inputs=True)
    length = int(headers[HEADER_LENGTH])
    header = json.loads(body[:length])
    rebuilt = st.tuples(mutated(header).map(encode), st.binary(max_size=64)).map(lambda p: (p[0] + p[1], len(p[0])))
    # The untouched request is one of the choices: 150 mutated and damaged ones were all refused in some runs,
    # and a target that never accepts proves nothing about its records (test_parsers checks both happen).
    return st.one_of(st.just((body, length)), rebuilt,
                     st.tuples(damaged(body), st.one_of(st.just(length), st.integers(-5, 2**40), st.none())))


def _decode_v2(value: tuple[bytes, int | None] | bytes) -> Any:
    from edgesdk.offload.v2_codec import decode_request

    body, length = value if isinstance(value, tuple) else (value, None)
    return decode_request(body, length)


_DATATYPES = ["FP32", "FP16", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
              "BOOL", "BYTES", "", "fp32", "FP128"]


@st.composite
def _grpc_requests(draw: Any) -> bytes:
    from edgesdk.ota_server.inference import edgesdk_v2_grpc_pb2 as pb

    request = pb.ModelInferRequest(model_name=draw(st.text(max_size=8)), id=draw(st.text(max_size=8)))
    for _ in range(draw(st.integers(0, 3))):
        entry = request.inputs.add(name=draw(st.sampled_from(["input", "x", ""])),
                                   datatype=draw(st.sampled_from(_DATATYPES)))
        entry.shape.extend(draw(st.lists(st.integers(-2**63, 2**63 - 1) | st.integers(-2, 8), max_size=4)))
        field = draw(st.sampled_from(["fp32_contents", "int_contents", "int64_contents", "bool_contents",
                                      "uint_contents", "fp64_contents", "uint64_contents"]))
        values = {"fp32_contents": st.floats(width=32), "fp64_contents": st.floats(),
                  "int_contents": st.integers(-2**31, 2**31 - 1), "int64_contents": st.integers(-2**63, 2**63 - 1),
                  "uint_contents": st.integers(0, 2**32 - 1), "uint64_contents": st.integers(0, 2**64 - 1),
                  "bool_contents": st.booleans()}[field]
        getattr(entry.contents, field).extend(draw(st.lists(values, max_size=16)))
    for _ in range(draw(st.integers(0, 3))):
        request.raw_input_contents.append(draw(st.binary(max_size=64)))
    data = request.SerializeToString()
    valid = pb.ModelInferRequest(model_name="m")
    valid.inputs.add(name="input", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    good = valid.SerializeToString()
    return draw(st.one_of(st.just(data), damaged(data) if data else st.just(data), st.just(good), damaged(good)))


def _decode_grpc(data: bytes) -> Any:
    """As ModelInfer does it: the received bytes split (raw inputs as views), then decoded; a body
    that is no ModelInferRequest is an InputError from the split."""
    from edgesdk.ota_server.inference.grpc_service import decode_inputs
    from edgesdk.ota_server.inference.grpc_wire import split_request

    return decode_inputs(*split_request(data))


def _chunk_request_bounds(request: Any) -> list[str]:
    from edgesdk.fleet.reports import MAX_CHUNK_INDEX, MAX_CHUNKS_SERVED

    broken = []
    if len(request.chunks) > MAX_CHUNKS_SERVED:
        broken.append(f"{len(request.chunks)} chunks > {MAX_CHUNKS_SERVED}")
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= MAX_CHUNK_INDEX for i in request.chunks):
        broken.append(f"chunk indices {list(request.chunks)[:8]}")
    return broken


def _state_bounds(state: Any) -> list[str]:
    broken = [f"{name} {value!r}" for name, value in (("energy_mj", state.energy_mj), ("avg_watts", state.avg_watts),
                                                      ("updated", state.updated), ("session", state.session))
              if value is not None and not _finite(value)]
    if state.avg_watts is not None and state.avg_watts < 0:
        broken.append(f"avg_watts {state.avg_watts} < 0")
    if state.root_version is not None and not 1 <= state.root_version <= 2**31 - 1:
        broken.append(f"root_version {state.root_version}")
    if len(json.dumps(dict(state.details), separators=(",", ":"))) > 32 * 1024:
        broken.append("details over 32 KiB")
    return broken


def _timestamp_bounds(stamp: Any) -> list[str]:
    broken = [] if _finite(stamp.expires) else [f"expires {stamp.expires!r}"]
    if stamp.issued is not None and not (_finite(stamp.issued) and stamp.issued <= stamp.expires):
        broken.append(f"issued {stamp.issued!r} after expires {stamp.expires!r}")
    if not 1 <= stamp.version <= 2**63:
        broken.append(f"version {stamp.version}")
    return broken


TARGETS: dict[str, Target] = {t.name: t for t in [
    Target("command", _commands, _parse_command, _command_bounds),
    Target("bound_command", _bound_commands, _parse_bound_command, lambda c: _command_bounds(c, strict=True)),
    Target("chunk", _chunks, _decode_chunk),
    Target("bundle_archive", _archives, _unpack),
    Target("root", _roots, _update_root),
    Target("timestamp", _timestamps, _parse_timestamp, _timestamp_bounds),
    Target("measurement_result", _measurement_results, _parse_result),
    Target("state", lambda: json_messages(_STATE), _device_report("parse_state"), _state_bounds),
    Target("event", lambda: json_messages(_EVENT), _device_report("parse_event")),
    Target("chunk_request", lambda: json_messages(_NEED), _device_report("parse_chunk_request"), _chunk_request_bounds),
    Target("v2_json", lambda: json_messages(_V2_JSON), _decode_v2),
    Target("v2_binary", _v2_binary, _decode_v2),
    Target("v2_grpc", _grpc_requests, _decode_grpc),
]}
