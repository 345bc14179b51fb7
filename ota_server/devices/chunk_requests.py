"""A device's request for chunks, answered or refused before any work is done for it.

Every replica hears every chunk request (``P/devices/+/need``). An open transfer answers at once
(:class:`~edgesdk.ota_server.devices.chunks.ChunkDistributor`), or a measurement's
(:class:`~edgesdk.ota_server.devices.measurements.Measurements`). Otherwise the transfer is opened
again when this server drives its rollout (after a restart or a take-over), but only once the store
says the device is one of its targets: the device chooses the id, so nothing is loaded, hashed or
remembered for it before that check (an archive load runs on the MQTT network thread and stalls
every device's reports). A request for a transfer the device is no target of costs a refusal count
(``not_target``) and one store read; on a single server, one that nothing serves (an id made up, or
a transfer long closed) costs a count (``unknown``). Replicas cannot tell another's transfer from a
made-up one, so they count nothing for those.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.records import RolloutRecord, RolloutState
from edgesdk.ota_server.devices.chunks import ChunkDistributor
from edgesdk.ota_server.devices.measurements import Measurements
from edgesdk.ota_server.rollouts.stage_sender import STAGE_TRANSFER

__all__ = ["ChunkRequests"]

log = logging.getLogger("edgesdk.ota_server.server")


class Driver(Protocol):
    """What the requests need of the rollout engine: which rollouts it drives, and telling it one serves."""

    @property
    def driving(self) -> frozenset[str]:
        """The rollouts this engine holds the lease of."""
        ...

    def serving(self, rollout_id: str) -> None:
        """A completed release's transfer was opened for a late device."""
        ...


class ChunkRequests:
    """Answers chunk requests (module doc); thread-safe as its parts are."""

    def __init__(self, chunks: ChunkDistributor, measurements: Measurements, engine: Driver,
                 is_target: Callable[[str, str], bool], rollout: Callable[[str], RolloutRecord | None],
                 refuse: Callable[[str, str], None], single_server: bool) -> None:
        self.chunks, self.measurements, self.engine = chunks, measurements, engine
        self.is_target, self.rollout, self.refuse = is_target, rollout, refuse
        self.single_server = single_server

    def answer(self, device: str, transfer_id: str, indices: list[int]) -> None:
        """Send ``device`` the chunks it asked for, or count why not."""
        if self.chunks.serve(device, transfer_id, indices) or self.measurements.serve(device, transfer_id, indices):
            return
        if self._reopen(device, transfer_id):
            self.chunks.serve(device, transfer_id, indices)
        elif self.single_server and not self._driven_here(transfer_id):
            self.refuse("need", "unknown")  # a refusal by _reopen (not a target) was counted there

    def _driven_here(self, transfer_id: str) -> bool:
        match = STAGE_TRANSFER.match(transfer_id)
        return match is not None and match["rollout"] in self.engine.driving

    def _reopen(self, device: str, transfer_id: str) -> bool:
        """Open a stage's transfer again for a rollout this server drives, once ``device`` is a target of it."""
        match = STAGE_TRANSFER.match(transfer_id)
        # In memory first: every replica hears every chunk request, and only the driver answers.
        if match is None or match["revert"] or match["rollout"] not in self.engine.driving:
            return False
        if not self.is_target(device, transfer_id):
            self.chunks.refuse(device, transfer_id)
            return False
        r = self.rollout(match["rollout"])
        if r is None or r.state == RolloutState.ABORTED:  # running, or the release its group is reconciled to
            return False
        try:
            info = self.chunks.open(transfer_id, r.model, r.version, match["artifact"])
        except EdgeSDKError as exc:  # the release's bundle left the repository: no traceback per request
            log.warning("cannot serve transfer %s to %s: %s", transfer_id, device, exc)
            return False
        if r.state == RolloutState.COMPLETED:  # a late device resuming the download it began before it went away
            self.chunks.share(transfer_id, r.group)
            self.engine.serving(r.id)
            return True
        # The whole archive is the plan: which chunks the stage's devices lacked was the first driver's to know.
        self.chunks.plan(transfer_id, list(range(len(info.chunks))), r.group)
        return True
