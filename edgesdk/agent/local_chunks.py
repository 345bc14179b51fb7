"""Chunks this device already holds, read back from its slots so they need not cross the network.

A slot keeps the unpacked bundle, not the archive it came in. To hand out that archive's
chunks again, the agent records once per slot (``store/layouts/<slot>.json``) the archive's
chunk table and its layout: which byte ranges are a file's content (read from the slot)
and which are tar headers and padding (a few hundred bytes each, kept in the layout).
Any chunk of any held archive can then be rebuilt from the slot's files. Every chunk read
here is hashed against the signed hash, so a damaged slot file costs a fetch (or a read
from another slot holding the same chunk), never a bad install.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
import logging
import os
import tarfile
from pathlib import Path
from typing import Any

from edgesdk.errors import EdgeSDKError
from edgesdk.files import write_atomic
from edgesdk.fleet.protocol import ArchiveInfo

__all__ = ["LocalChunks", "record_layout", "LAYOUTS"]

log = logging.getLogger(__name__)

#: Directory of the store holding one layout file per slot.
LAYOUTS = "layouts"
_FORMAT = 1


def _segments(archive: Path) -> list[list[Any]]:
    """``[start, length, kind, value]`` covering the archive: ``file`` (member name), ``zeros`` or ``bytes`` (b64)."""
    segments: list[list[Any]] = []
    with open(archive, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
        size = os.fstat(f.fileno()).st_size

        def between(start: int, end: int) -> None:
            if end > start:
                data = os.pread(f.fileno(), end - start, start)
                if data.count(0) == len(data):
                    segments.append([start, end - start, "zeros", None])
                else:
                    segments.append([start, end - start, "bytes", base64.b64encode(data).decode()])

        position = 0
        for member in tar.getmembers():
            between(position, member.offset_data)
            if member.size:
                segments.append([member.offset_data, member.size, "file", member.name])
            position = member.offset_data + member.size
        between(position, size)
    return segments


def record_layout(store_root: str | os.PathLike[str], slot: str, archive: Path, info: ArchiveInfo) -> None:
    """Remember how ``slot``'s files make up ``archive`` (whose chunk table is ``info``), for later reuse."""
    folder = Path(store_root) / LAYOUTS
    folder.mkdir(exist_ok=True)
    table = {"sha256": info.sha256, "size": info.size, "chunks": list(info.chunks), "sizes": list(info.sizes)}
    write_atomic(folder / f"{slot}.json", json.dumps({"format": _FORMAT, "archive": table,
                                                      "segments": _segments(archive)}).encode())


class _SlotArchive:
    """The archive a slot came in, rebuilt on demand from the slot's files and its recorded layout."""

    def __init__(self, slot_dir: Path, segments: list[list[Any]]) -> None:
        self.slot_dir, self.segments = slot_dir, segments
        self.starts = [s[0] for s in segments]

    def read(self, start: int, length: int) -> bytes | None:
        parts, position, end = [], start, start + length
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        while position < end and i < len(self.segments):
            seg_start, seg_length, kind, value = self.segments[i]
            take_from, take_to = max(position, seg_start), min(end, seg_start + seg_length)
            if take_from >= take_to:
                i += 1
                continue
            if kind == "file":
                try:
                    with open(self.slot_dir / Path(value).name, "rb") as f:
                        parts.append(os.pread(f.fileno(), take_to - take_from, take_from - seg_start))
                except OSError:
                    return None
            elif kind == "zeros":
                parts.append(bytes(take_to - take_from))
            else:
                parts.append(base64.b64decode(value)[take_from - seg_start:take_to - seg_start])
            position = take_to
            i += 1
        data = b"".join(parts)
        return data if len(data) == length else None


class LocalChunks:
    """Every chunk of every archive the store's slots came in, by hash (built from ``store/layouts``)."""

    def __init__(self, store_root: str | os.PathLike[str]) -> None:
        root = Path(store_root)
        #: Local copies read that did not hash right (a damaged slot file); the chunk is then fetched.
        self.corrupt = 0
        self._where: dict[str, list[tuple[_SlotArchive, int, int]]] = {}
        for path in sorted((root / LAYOUTS).glob("*.json")):
            slot_dir = root / "slots" / path.stem
            if not (slot_dir / "manifest.json").is_file():
                continue  # the slot is gone (pruned); its layout goes with the next prune
            try:
                layout = json.loads(path.read_bytes())
                info = ArchiveInfo.from_json(layout["archive"])
                source = _SlotArchive(slot_dir, layout["segments"])
            except (OSError, ValueError, KeyError, TypeError, EdgeSDKError) as exc:
                log.warning("ignoring the chunk layout %s (%s); its chunks will be fetched", path, exc)
                continue
            for index, digest in enumerate(info.chunks):
                start, end = info.chunk_range(index)
                self._where.setdefault(digest, []).append((source, start, end - start))

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, digest: object) -> bool:
        return digest in self._where

    def read(self, digest: str) -> bytes | None:
        """The bytes of the chunk with SHA-256 ``digest`` from the first slot whose copy hashes right, or None.

        Each copy that does not hash right is counted in :attr:`corrupt` and the next slot holding
        the chunk is tried.
        """
        for source, start, length in self._where.get(digest, ()):
            data = source.read(start, length)
            if data is None:
                continue
            if hashlib.sha256(data).hexdigest() == digest:
                return data
            self.corrupt += 1
        return None
