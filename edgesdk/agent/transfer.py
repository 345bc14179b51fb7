"""One incoming chunked transfer, resumable across disconnects and agent restarts.

Files in ``store/incoming``: ``<T>.cmd`` (the signed command, so a restarted agent knows
what it was fetching), ``<T>.part`` (the archive, written at each chunk's offset) and
``<T>.have`` (one byte per chunk, set after the chunk's bytes are written). A chunk is
accepted only if its SHA-256 matches the signed manifest (after zstd decompression when the
manifest flags it); on restart every chunk marked done is hashed again from ``.part`` so a
torn write is fetched again rather than trusted. Before anything is fetched, chunks this
device already holds in its slots are copied in (:meth:`IncomingTransfer.fill`), each
hashed again on the way, so a corrupted local copy is fetched instead.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

from edgesdk.agent.local_chunks import LocalChunks
from edgesdk.errors import TransferError
from edgesdk.fleet.chunk_codec import decode_chunk
from edgesdk.fleet.protocol import ArchiveInfo, Command, MeasureCommand

__all__ = ["IncomingTransfer"]


class IncomingTransfer:
    """Chunks of one archive arriving in any order, any number of times.

    Made for a transfer whose ``<T>.cmd`` exists already, it resumes from the chunks on disk
    that still hash right. :meth:`accept` and :meth:`finish` may be called from different threads.
    """

    def __init__(self, incoming: Path, command: Command | MeasureCommand) -> None:
        assert command.archive is not None
        self.command: Command | MeasureCommand = command
        self.archive: ArchiveInfo = command.archive
        tid = command.transfer_id
        self.part, self.have_path, self.cmd_path = (incoming / f"{tid}.part", incoming / f"{tid}.have",
                                                    incoming / f"{tid}.cmd")
        self._lock = threading.Lock()
        n = len(self.archive.chunks)
        fresh = not self.cmd_path.exists()
        if fresh:
            for path in (self.part, self.have_path):
                path.unlink(missing_ok=True)
        self._fd = os.open(self.part, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self._fd, self.archive.size)
        self._have_fd = os.open(self.have_path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._have_fd).st_size != n:
            os.ftruncate(self._have_fd, n)
        self.have = bytearray(os.pread(self._have_fd, n, 0).ljust(n, b"\0"))
        #: Chunks an earlier run had written that verified again, so need not be fetched.
        self.resumed_chunks = 0
        for index in range(n):  # re-verify what an earlier run recorded
            if self.have[index]:
                start, end = self.archive.chunk_range(index)
                if hashlib.sha256(os.pread(self._fd, end - start, start)).hexdigest() == self.archive.chunks[index]:
                    self.resumed_chunks += 1
                else:
                    self._mark(index, 0)
        # A newer signing of the same transfer (the server sent it again after this device slept past the old one's
        # expiry) replaces the kept command, so a restart resumes with one that is still valid.
        if fresh or self.cmd_path.read_bytes() != command.raw:
            tmp = self.cmd_path.with_suffix(".cmd.tmp")
            tmp.write_bytes(command.raw)
            os.replace(tmp, self.cmd_path)
        #: Chunks refused for a bad index or hash since this object was made.
        self.rejected = 0
        #: New chunks written since this object was made (repeats not counted).
        self.received = 0
        #: Chunks copied from this device's own slots, and local copies that failed their hash (fetched instead).
        self.local_chunks = self.local_corrupt = self.local_bytes = 0
        #: Payload bytes of the chunks that arrived over the network and were written.
        self.fetched_bytes = 0
        #: ``time.monotonic()`` of the last new chunk (or of creation), to tell a stalled transfer.
        self.last_progress = time.monotonic()
        # The whole-archive hash is advanced as chunks arrive in order, so finish() rarely re-reads the file.
        self._digest = hashlib.sha256()
        self._digested = 0  # chunks folded into _digest

    def _advance_digest(self, payload: bytes | None = None) -> None:
        """Fold consecutive finished chunks into the running hash (``payload`` is chunk ``_digested``'s bytes)."""
        n = len(self.archive.chunks)
        while self._digested < n and self.have[self._digested]:
            if payload is None:
                start, end = self.archive.chunk_range(self._digested)
                payload = os.pread(self._fd, end - start, start)
            self._digest.update(payload)
            self._digested += 1
            payload = None

    def _mark(self, index: int, value: int) -> None:
        self.have[index] = value
        os.pwrite(self._have_fd, bytes([value]), index)

    def accept(self, index: int, payload: bytes) -> bool:
        """Write chunk ``index`` if its hash matches; False (and counted in :attr:`rejected`) if it or the index is bad.

        ``payload`` is the chunk as sent (zstd-compressed when the manifest says so). A chunk
        already held is not written again and returns True.
        """
        if not 0 <= index < len(self.archive.chunks):
            self.rejected += 1
            return False
        with self._lock:
            if self.have[index]:
                return True
        try:
            data = decode_chunk(self.archive, index, payload)
        except TransferError:
            self.rejected += 1
            return False
        if not self._write(index, data):
            self.rejected += 1
            return False
        self.fetched_bytes += len(payload)
        return True

    def _write(self, index: int, data: bytes, verified: bool = False) -> bool:
        """Write chunk ``index`` if ``data`` hashes right (hashlib drops the GIL for the big buffer); False if not.

        ``verified``: the caller hashed ``data`` against this chunk's signed hash already.
        """
        if not verified and hashlib.sha256(data).hexdigest() != self.archive.chunks[index]:
            return False
        with self._lock:
            if self.have[index]:
                return True
            start, _ = self.archive.chunk_range(index)
            os.pwrite(self._fd, data, start)
            self._mark(index, 1)
            self.received += 1
            self.last_progress = time.monotonic()
            self._advance_digest(data if index == self._digested else None)
        return True

    def fill(self, local: LocalChunks) -> int:
        """Copy in every missing chunk that ``local`` holds and that hashes right; how many were copied.

        A local copy that fails its hash (a corrupted slot file) is counted in
        :attr:`local_corrupt`; without a good copy in another slot the chunk stays missing and
        is fetched like any other.
        """
        corrupt_before = local.corrupt
        for index in self.missing():
            data = local.read(self.archive.chunks[index])  # hashed against the signed hash by local
            if data is not None and self._write(index, data, verified=True):
                self.local_chunks += 1
                self.local_bytes += len(data)
                self.received -= 1  # copied, not received
        self.local_corrupt += local.corrupt - corrupt_before
        return self.local_chunks

    def missing(self, exclude: frozenset[int] = frozenset()) -> list[int]:
        """Indexes of the chunks not yet written (and not in ``exclude``), ascending."""
        return [i for i, done in enumerate(self.have) if not done and i not in exclude]

    @property
    def complete(self) -> bool:
        """True once every chunk is written (the whole-archive hash is checked by :meth:`finish`)."""
        return all(self.have)

    def finish(self) -> Path:
        """Check the whole archive's hash and return it as ``<T>.tar``; a mismatch starts over.

        No fsync here: the archive is scratch. What must survive a power cut is the unpacked
        slot, which is fsynced file by file, and a restarted transfer re-hashes its chunks.
        """
        with self._lock:
            self._advance_digest()
            digest = self._digest.copy()
        if digest.hexdigest() != self.archive.sha256:
            with self._lock:
                for index in range(len(self.have)):
                    self._mark(index, 0)
                self._digest, self._digested = hashlib.sha256(), 0
            raise TransferError(f"archive of transfer {self.command.transfer_id} hashes to {digest.hexdigest()[:16]}…, "
                                f"the signed manifest says {self.archive.sha256[:16]}…; fetching it again")
        tar = self.part.with_suffix(".tar")
        os.replace(self.part, tar)
        return tar

    def close(self) -> None:
        """Close the open files and keep them on disk, so a later run can resume the transfer."""
        for fd in (self._fd, self._have_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def discard(self) -> None:
        """Close and delete every file of the transfer (command, partial archive, chunk marks, finished tar)."""
        self.close()
        for path in (self.part, self.have_path, self.cmd_path, self.part.with_suffix(".tar")):
            path.unlink(missing_ok=True)
