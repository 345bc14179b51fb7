"""Hostile archives against verify-then-unpack (issue 36, part 4): what a key that signs only commands can make
a device write.

Each archive carries a real bundle's signed ``manifest.json`` and ``signature.json`` (or a measurement's) and
one hostile change: a GNU sparse member claiming 64 MiB or 1 TiB, a pax sparse member, an extra undeclared
file, a member larger than its signed size, a symbolic or hard link, a device, a fifo, a manifest signed below
the bundles threshold. Each goes through the device's real paths: the store's install
(:meth:`edgesdk.agent.install.Installer.unpack`) and the measurement service's
(:func:`edgesdk.agent.measurements.run_measurement`), on a device whose root of trust asks the bundles
role for two signatures. Figures: the bytes each left on disk (the store and the scratch directory, walked:
``st_blocks * 512``, and apparent sizes), beyond the signed sizes of what it was allowed to write. Goal: 0.

The builders here (:func:`member`, :func:`gnu_sparse`, :func:`pax_sparse`, :func:`tar`) are also what
tests/unit/test_archive.py feeds the unpacker.

    .venv/bin/python -c "import json; from benchmarks.security.security_archives import run; print(json.dumps(run(True)))"
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.shared.common import goal, log  # noqa: E402

__all__ = ["run", "member", "gnu_sparse", "pax_sparse", "tar", "hostile", "signed_parts", "disk_bytes"]

MIB, TIB = 1024**2, 1024**4


# builders -------------------------------------------------------------------------------------------------------

def _pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % tarfile.BLOCKSIZE)


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "", size: int | None = None,
           pax: dict[str, str] | None = None) -> bytes:
    """One tar member's header(s) and padded data; ``size`` puts another size than ``len(data)`` in the header,
    ``pax`` adds a pax extended header before it."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    info.size = len(data) if size is None else size
    if pax:
        info.pax_headers = dict(pax)
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + _pad(data)
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape") + _pad(data)


def gnu_sparse(name: str, data: bytes, realsize: int) -> bytes:
    """A GNU sparse (type ``S``) member holding ``data`` at the end of a file of ``realsize`` bytes: the header
    is a few hundred bytes, the file it claims as large as ``realsize``."""
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode = tarfile.GNUTYPE_SPARSE, len(data), 0o644
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
    header[386:398] = tarfile.itn(realsize - len(data), 12, tarfile.GNU_FORMAT)  # sparse[0].offset
    header[398:410] = tarfile.itn(len(data), 12, tarfile.GNU_FORMAT)  # sparse[0].numbytes
    header[483:495] = tarfile.itn(realsize, 12, tarfile.GNU_FORMAT)  # realsize
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + _pad(data)


def pax_sparse(name: str, data: bytes, realsize: int) -> bytes:
    """A pax sparse member (format 1.0: ``GNU.sparse.*`` headers, the map at the start of the data) holding
    ``data`` at the end of a file of ``realsize`` bytes."""
    sparse_map = _pad(f"1\n{realsize - len(data)}\n{len(data)}\n".encode())
    pax = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": name,
           "GNU.sparse.realsize": str(realsize)}
    return member(f"GNUSparseFile.0/{name}", sparse_map + data, pax=pax)


def tar(*members: bytes) -> bytes:
    """Members joined, with the two zero blocks that end a tar."""
    return b"".join(members) + bytes(2 * tarfile.BLOCKSIZE)


def signed_parts(archive: bytes) -> dict[str, bytes]:
    """The members of a packed bundle or measurement archive by name (manifest and signature included)."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as source:
        return {m.name: source.extractfile(m).read() for m in source.getmembers()}  # type: ignore[union-attr]


def hostile(parts: dict[str, bytes], model: str) -> dict[str, bytes]:
    """Every hostile archive built from a signed archive's ``parts`` (``model`` names its model member)."""
    others = [member(n, d) for n, d in parts.items() if n != model]
    data = parts[model]

    def with_model(model_member: bytes, *extra: bytes) -> bytes:
        return tar(*others, model_member, *extra)

    return {
        "gnu_sparse_64MiB": with_model(gnu_sparse(model, data, 64 * MIB)),
        "gnu_sparse_1TiB": with_model(gnu_sparse(model, data, TIB)),
        "pax_sparse_1TiB": with_model(pax_sparse(model, data, TIB)),
        "undeclared_extra_file": with_model(member(model, data), member("extra.bin", os.urandom(64 * 1024))),
        "oversized_member": with_model(member(model, data + bytes(4 * MIB))),
        "symlink": with_model(member(model, kind=tarfile.SYMTYPE, link="/etc/passwd")),
        "hardlink": with_model(member(model, kind=tarfile.LNKTYPE, link="manifest.json")),
        "char_device": with_model(member(model, kind=tarfile.CHRTYPE)),
        "fifo": with_model(member(model, kind=tarfile.FIFOTYPE)),
        "duplicate_member": with_model(member(model, data), member(model, data)),
    }


# measuring ------------------------------------------------------------------------------------------------------

def disk_bytes(*roots: Path) -> dict[str, int]:
    """Allocated (``st_blocks * 512``) and apparent bytes of every file under ``roots``."""
    allocated = apparent = 0
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in files:
                st = os.lstat(os.path.join(folder, name))
                allocated, apparent = allocated + st.st_blocks * 512, apparent + st.st_size
    return {"allocated": allocated, "apparent": apparent}


def _fleet(work: Path) -> tuple[Any, list[Any], Any]:
    """A root of trust whose bundles role needs two of three keys; its bundles and commands private keys."""
    from edgesdk.fleet import key_ceremony
    from edgesdk.fleet.trust import parse_root
    from edgesdk.runtime.signing import load_private_key

    root_path, private = key_ceremony.init_fleet(work / "fleet", {"bundles": 3}, {"bundles": 2})
    root, _ = parse_root(Path(root_path).read_bytes())
    return root, [load_private_key(p) for p in private["bundles"]], load_private_key(private["commands"][0])


def _install(store_root: Path, archive: Path, keys: Any, slot: str) -> tuple[str | None, dict[str, int]]:
    from edgesdk.agent.install import Installer
    from edgesdk.agent.store import ModelStore
    from edgesdk.errors import EdgeSDKError
    from edgesdk.fleet.protocol import archive_info

    store = ModelStore(store_root)
    try:
        Installer(store, bundle_keys=lambda: keys).unpack(slot, archive, archive_info(archive.read_bytes()))
        refusal = None
    except EdgeSDKError as exc:
        refusal = f"{type(exc).__name__}: {exc}"
    return refusal, disk_bytes(store.slots, store.scratch)


def _measure(scratch: Path, archive: Path, keys: Any, commands_key: Any) -> tuple[str | None, dict[str, int]]:
    import json

    from edgesdk.agent.measurements import run_measurement
    from edgesdk.fleet.protocol import MeasureCommand, archive_info, parse_command, sign_measure_command
    from edgesdk.runtime.profiles import load_profile

    envelope = sign_measure_command(commands_key, measurement_id="m1", transfer_id="m1",
                                    archive=archive_info(archive.read_bytes()), mode="latency", runs=3)
    command = parse_command(envelope, commands_key.public_key())
    assert isinstance(command, MeasureCommand)
    scratch.mkdir(parents=True)
    result = json.loads(run_measurement(command, archive, scratch, load_profile("generic-x86_64"), 120.0, None, keys))
    figures = disk_bytes(scratch)
    refusal = None if result["status"] == "done" else f"{result['error_type']}: {result['error']}"
    return refusal, figures


def _legacy_unpack(archive: Path, target: Path) -> None:
    """The unpacker before verify-then-unpack (edgesdk.fleet.protocol.unpack_bundle until issue 36), kept only to
    show the baseline: every ``isfile()`` member extracted, sparse ones included."""
    target.mkdir(parents=True)
    with tarfile.open(archive, mode="r:") as source:
        for m in source.getmembers():
            if not m.isfile():
                raise ValueError(f"{m.name} is not a regular file")
            data = source.extractfile(m)
            assert data is not None
            with open(target / m.name.split("/")[-1], "wb") as out:
                while block := data.read(1 << 20):
                    out.write(block)


def run(quick: bool) -> dict[str, Any]:
    """Feed every hostile archive to the store's install and to the measurement path; bytes beyond the signed."""
    from edgesdk.fleet.archive import pack_bundle
    from edgesdk.fleet.measurement import pack_measurement
    from edgesdk.runtime.bundle import BundleSpec
    from edgesdk.runtime.bundling import bundle_from_model
    from edgesdk.runtime.signing import KeySet
    from edgesdk.testing import random_mlp, write_mlp_onnx

    work = Path(tempfile.mkdtemp(prefix="edgesdk-archives-"))
    try:
        root, bundle_signers, commands_key = _fleet(work)
        keys = root.keyset("bundles")
        assert isinstance(keys, KeySet) and keys.threshold == 2
        model = write_mlp_onnx(random_mlp([64, 32, 10], seed=3), work / "model.onnx")
        import numpy as np

        x = np.random.default_rng(3).standard_normal((1, 64)).astype(np.float32)
        bundle_from_model(work / "bundle", model, BundleSpec("digits", "1.0.0", "onnx-fp32", "generic-x86_64",
                                                             "latency"), {"input": x}, private_key=bundle_signers[0])
        from edgesdk.runtime.bundle import sign_bundle

        sign_bundle(work / "bundle", bundle_signers[1])
        bundle_archive = pack_bundle(work / "bundle")
        measure_archive = pack_measurement(model, {"input": np.repeat(x, 4, axis=0)}, bundle_signers[:2])
        cases: dict[str, dict[str, bytes]] = {
            "install": {"good": bundle_archive, **hostile(signed_parts(bundle_archive), "model.onnx")},
            "measure": {"good": measure_archive, **hostile(signed_parts(measure_archive), "model.onnx")}}
        one_signature = pack_measurement(model, {"input": x}, bundle_signers[:1])
        commands_only = pack_measurement(model, {"input": x}, [commands_key])
        cases["measure"].update(below_threshold=one_signature, commands_key_only=commands_only)
        parts = signed_parts(bundle_archive)
        cases["install"]["below_threshold"] = tar(*[member(n, d) for n, d in parts.items() if n != "signature.json"],
                                                  member("signature.json", _one_signature(parts)))
        results: dict[str, Any] = {}
        for path, archives in cases.items():
            for name, data in archives.items():
                if quick and name in ("char_device", "fifo", "hardlink"):
                    continue
                folder = work / path / name
                folder.mkdir(parents=True)
                archive = folder / "archive.tar"
                archive.write_bytes(data)
                started = time.perf_counter()
                if path == "install":
                    refusal, written = _install(folder / "store", archive, keys, "digits-1.0.0")
                else:
                    refusal, written = _measure(folder / "scratch", archive, keys, commands_key)
                allowed = _signed_total(data) if refusal is None else 0
                results[f"{path}/{name}"] = {
                    "archive_bytes": len(data), "refused": refusal is not None, "reason": (refusal or "")[:160],
                    "allocated_bytes": written["allocated"], "apparent_bytes": written["apparent"],
                    "signed_bytes_allowed": allowed,
                    "beyond_signed_bytes": max(0, written["apparent"] - allowed, written["allocated"] - _blocks(allowed)),
                    "seconds": round(time.perf_counter() - started, 4)}
                log(f"{path}/{name}: {'refused' if refusal else 'accepted'}, {written['allocated']} bytes allocated")
                shutil.rmtree(folder, ignore_errors=True)
        legacy = work / "legacy" / "archive.tar"
        legacy.parent.mkdir()
        legacy.write_bytes(cases["install"]["gnu_sparse_64MiB"])
        _legacy_unpack(legacy, work / "legacy" / "out")
        baseline = disk_bytes(work / "legacy" / "out")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    hostile_rows = {k: v for k, v in results.items() if not k.endswith("/good")}
    beyond = max(v["beyond_signed_bytes"] for v in results.values())
    return {"results": {"cases": results, "legacy_unpack_gnu_sparse_64MiB": baseline},
            "goals": [goal("hostile archives refused (install and measurement paths)", "all",
                           sum(v["refused"] for v in hostile_rows.values()) / len(hostile_rows),
                           all(v["refused"] for v in hostile_rows.values())),
                      goal("bytes written beyond the signed sizes", "0", beyond, beyond == 0),
                      goal("good bundle and measurement accepted", "both", sum(not results[k]["refused"] for k in
                                                                              ("install/good", "measure/good")),
                           not results["install/good"]["refused"] and not results["measure/good"]["refused"])]}


def _blocks(size: int, block: int = 4096) -> int:
    """A generous allocation bound for ``size`` bytes in a handful of files (a block per file of slack)."""
    return size + 8 * block


def _signed_total(archive: bytes) -> int:
    """What a good archive may put on disk: its signed files, its manifest and signature."""
    return sum(len(data) for data in signed_parts(archive).values())


def _one_signature(parts: dict[str, bytes]) -> bytes:
    """The bundle's signature document with its first signature only (one of the two the threshold asks)."""
    import json

    document = json.loads(parts["signature.json"])
    return json.dumps({"signatures": document["signatures"][:1]}).encode()


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(run(parser.parse_args().quick), indent=2))
