"""What the simulated fleet's parent (benchmarks/shared/fleet_sim.py) and its workers (fleet_sim_worker.py) share:
the counters, the error, each device's role, an archive arriving in memory, and what counts as updated twice."""

from __future__ import annotations

import hashlib
import resource
from collections import Counter
from typing import Any

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.protocol import Command

__all__ = ["COUNTERS", "SimulationError", "device_role", "Transfer", "ChunkStore", "updated_twice", "raise_fd_limit"]


#: The per-device counters every worker keeps (summed over the fleet in FleetReport).
COUNTERS = ("root_updates", "roots_refused", "commands", "duplicate_commands", "rejected", "accepted", "downloaded",
            "committed", "repeated_commits",
            "failed", "rolled_back", "chunk_bytes", "chunk_data_bytes", "chunks_rejected", "need_requests",
            "measure_commands", "reconnects", "crashes")


class SimulationError(EdgeSDKError):
    """The simulated fleet was set up wrong, or its workers could not start or answer."""


def device_role(device_id: str, fail_share: float, silent_share: float) -> str:
    """``"silent"``, ``"fail"`` or ``"ok"``, from a hash of the id: the same device plays the same part every run."""
    fraction = int.from_bytes(hashlib.sha256(device_id.encode()).digest()[:8], "big") / 2**64
    if fraction < silent_share:
        return "silent"
    if fraction < silent_share + fail_share:
        return "fail"
    return "ok"


class Transfer:
    """One archive arriving in memory: chunks by index, checked against the signed hashes."""

    __slots__ = ("command", "chunks", "started", "last_progress", "rejected")

    def __init__(self, command: Command, now: float) -> None:
        self.command = command
        self.chunks: dict[int, bytes] = {}
        self.started = self.last_progress = now
        self.rejected = 0

    def missing(self, exclude: frozenset[int] = frozenset()) -> list[int]:
        assert self.command.archive is not None
        return [i for i in range(len(self.command.archive.chunks)) if i not in self.chunks and i not in exclude]

    @property
    def complete(self) -> bool:
        assert self.command.archive is not None
        return len(self.chunks) == len(self.command.archive.chunks)


class ChunkStore:
    """Chunks held by one worker's devices, by hash, and the chunk hashes of each slot they came in (once per
    worker: its devices hold the same bytes)."""

    def __init__(self) -> None:
        self.chunks: dict[str, bytes] = {}
        self.slots: dict[str, tuple[str, ...]] = {}

    def fill(self, chunk_slots: set[str], transfer: Transfer) -> int:
        """The agent's local reuse: copy in the chunks of the slots a device holds chunks of (hashed again); how
        many chunks the transfer has now."""
        archive = transfer.command.archive
        assert archive is not None
        held = {digest for slot in chunk_slots for digest in self.slots.get(slot, ())}
        for index, digest in enumerate(archive.chunks):
            if digest in held and digest in self.chunks:
                data = self.chunks[digest]
                if hashlib.sha256(data).hexdigest() == digest:
                    transfer.chunks[index] = data
        return len(transfer.chunks)

    def keep(self, slot: str, transfer: Transfer) -> None:
        """Hold a fetched archive's chunks for later reuse."""
        archive = transfer.command.archive
        assert archive is not None
        if slot not in self.slots:
            self.slots[slot] = archive.chunks
            for index, digest in enumerate(archive.chunks):
                self.chunks.setdefault(digest, transfer.chunks[index])


def updated_twice(install_log: list[list[Any]]) -> bool:
    """True when a device's log shows one version committed twice by an update (a rollback back to a version
    held before is a restore, not an update)."""
    updates = Counter(version for _, _, version, outcome, rollback in install_log
                      if outcome == "committed" and not rollback)
    return any(n > 1 for n in updates.values())


def raise_fd_limit() -> None:
    """Let this process open as many files (device sockets) as the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
