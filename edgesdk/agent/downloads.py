"""The agent's transfers in flight: chunks routed to them, and what is missing asked for again.

Deploy and measure commands both fetch an archive this way. The group broadcast brings most
chunks; a device asks on its own ``need`` topic for what did not come (at most
``request_window`` chunk indices per request), after ``retry_interval_s`` without progress. For
``broadcast_wait_s`` after a command it asks only for the chunks the broadcast will not bring.
Chunk callbacks come from the network thread, the rest from the agent's worker: the table is
locked.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from edgesdk.agent.failpoints import failpoint
from edgesdk.agent.local_chunks import LocalChunks
from edgesdk.agent.transfer import IncomingTransfer
from edgesdk.fleet.protocol import Command

__all__ = ["Downloads", "broadcast_plan"]

log = logging.getLogger(__name__)


def broadcast_plan(command: Command) -> frozenset[int]:
    """The chunks the server said it will broadcast for ``command`` (every chunk when it said nothing)."""
    assert command.archive is not None
    return command.broadcast if command.broadcast is not None else frozenset(range(len(command.archive.chunks)))


class Downloads:
    """The incoming transfers of one agent, by transfer id."""

    def __init__(self, publish_need: Callable[[bytes], None], request_window: int = 32,
                 retry_interval_s: float = 1.0, broadcast_wait_s: float = 2.0, label: str = "agent") -> None:
        self._publish_need = publish_need
        self.request_window = request_window
        self.retry_interval_s = retry_interval_s
        self.broadcast_wait_s = broadcast_wait_s
        self._label = label
        self._transfers: dict[str, IncomingTransfer] = {}
        self._started: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, transfer: IncomingTransfer) -> None:
        """Track ``transfer`` from now (its broadcast wait and a measurement's deadline start now)."""
        with self._lock:
            self._transfers[transfer.command.transfer_id] = transfer
            self._started[transfer.command.transfer_id] = time.monotonic()

    def begin(self, incoming: Path, local: LocalChunks, command: Command) -> IncomingTransfer:
        """Open (or resume) a deploy command's transfer in ``incoming``, copy in the chunks this device holds
        already (``local``), and track it."""
        transfer = IncomingTransfer(incoming, command)
        transfer.fill(local)
        self.add(transfer)
        return transfer

    def request_first(self, transfer: IncomingTransfer, resume: bool) -> None:
        """The first request of a transfer just begun: a resumed one asks for what it lacks; a new one only for what
        the broadcast will not bring (a local copy the server counted on was damaged)."""
        if resume or not isinstance(transfer.command, Command):
            self.request(transfer)
        else:
            self.request(transfer, exclude=broadcast_plan(transfer.command))

    def get(self, transfer_id: str) -> IncomingTransfer | None:
        """The transfer tracked under ``transfer_id``, or None."""
        with self._lock:
            return self._transfers.get(transfer_id)

    def pop(self, transfer_id: str) -> IncomingTransfer | None:
        """Stop tracking a transfer (finished or failed); the caller closes or discards its files."""
        with self._lock:
            self._started.pop(transfer_id, None)
            return self._transfers.pop(transfer_id, None)

    def accept_chunk(self, topic: str, payload: bytes) -> str | None:
        """Write a chunk arriving on ``.../chunks/T/I`` into transfer T; T's id when that completed it."""
        transfer_id, index = topic.split("/")[-2:]
        transfer = self.get(transfer_id)
        if transfer is None or not index.isdigit():
            return None
        if not transfer.accept(int(index), payload):
            log.warning("%s: chunk %s of %s failed its hash check; it will be fetched again", self._label, index,
                        transfer_id)
            return None
        failpoint("after_chunks", transfer.received)
        return transfer_id if transfer.complete else None

    def request(self, transfer: IncomingTransfer, exclude: frozenset[int] = frozenset()) -> None:
        """Ask for the next window of ``transfer``'s missing chunks, leaving out ``exclude``."""
        missing = transfer.missing(exclude)[: self.request_window]
        if missing:
            self._publish_need(json.dumps({"transfer_id": transfer.command.transfer_id, "chunks": missing}).encode())
            transfer.last_progress = time.monotonic()

    def request_missing(self) -> None:
        """Ask again for what has made no progress in ``retry_interval_s``."""
        now = time.monotonic()
        with self._lock:
            transfers = [(t, self._started.get(tid, now)) for tid, t in self._transfers.items()]
        for transfer, started in transfers:
            if transfer.complete or now - transfer.last_progress < self.retry_interval_s:
                continue
            if now - started >= self.broadcast_wait_s:
                self.request(transfer)
            elif isinstance(transfer.command, Command) and transfer.command.broadcast is not None:
                self.request(transfer, exclude=transfer.command.broadcast)  # the broadcast brings the others

    def overdue(self, kind: type, timeout_s: float) -> list[IncomingTransfer]:
        """Transfers of ``kind`` commands (Command, MeasureCommand) started more than ``timeout_s`` ago."""
        now = time.monotonic()
        with self._lock:
            return [t for tid, t in self._transfers.items() if isinstance(t.command, kind)
                    and now - self._started.get(tid, now) > timeout_s]

    def expire_deploys(self, timeout_s: float) -> list[tuple[Command, str]]:
        """Give up the deploy transfers started more than ``timeout_s`` ago (their files are deleted); their commands,
        each with the reason its FAILED event gives."""
        expired = []
        for transfer in self.overdue(Command, timeout_s):
            self.pop(transfer.command.transfer_id)
            transfer.discard()
            if isinstance(transfer.command, Command):
                expired.append((transfer.command, f"the archive did not arrive within {timeout_s:g} s of its command "
                                                  "(a trickle, or chunks withheld); refused"))
        return expired

    def close(self) -> None:
        """Close every transfer's files (their progress stays on disk for a restarted agent)."""
        with self._lock:
            transfers = list(self._transfers.values())
        for transfer in transfers:
            transfer.close()
