"""Freshness for the fleet: signed timestamp metadata, published retained at an interval (issue 23, part 2).

Each timestamp (:func:`edgesdk.fleet.trust.new_timestamp`) is signed with the ``timestamp`` role's
key and carries a version that only grows, an expiry a few intervals ahead, the root version the
server runs under, and for each group a digest of its current target: the model and version of the
group's newest completed rollout. A device whose newest timestamp has expired reports itself stale:
the server stopped, or someone between them is withholding updates (an indefinite freeze).

The version is not a clock reading: it is a counter in the fleet store that every replica shares
(:meth:`~edgesdk.ota_server.store.counters.CounterStore.next_timestamp_version`), one more per
publication. A replica whose clock runs a day ahead therefore publishes the next number, not one a
day ahead that would make devices ignore every other replica's timestamps for a day, and a replica
taking over goes on from the last number any of them published. The expiry is reckoned on the
database's clock (the one clock replicas share) unless a ``clock`` is given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from edgesdk.fleet.protocol import Topics
from edgesdk.fleet.records import RolloutState
from edgesdk.fleet.trust import new_timestamp, sign_metadata, targets_digest
from edgesdk.ota_server.store.fleet_db import FleetDB

__all__ = ["TimestampPublisher"]

log = logging.getLogger(__name__)


class TimestampPublisher:
    """Signs and publishes the fleet's timestamp every ``every_s`` seconds (call :meth:`tick` often)."""

    def __init__(self, db: FleetDB, publish: Callable[..., None], key: Any, root_version: int, every_s: float = 60.0,
                 expires_s: float = 300.0, clock: Callable[[], float] | None = None) -> None:
        if not 0 < every_s < expires_s:
            raise ValueError(f"timestamps every {every_s:g} s must expire later than that, not after {expires_s:g} s")
        self.db, self._publish, self.key = db, publish, key
        self.root_version, self.every_s, self.expires_s = root_version, every_s, expires_s
        self.clock: Callable[[], float] = clock or db.now
        #: The version of the last timestamp this publisher sent (0: none yet).
        self.version = 0
        self._due = 0.0  # on time.monotonic(): when the next one is due

    def targets(self) -> dict[str, str]:
        """Group -> digest of its newest completed rollout's model and version."""
        newest: dict[str, dict[str, str]] = {}
        for rollout in self.db.rollouts(RolloutState.COMPLETED):  # oldest first: the last one per group wins
            newest[rollout.group] = {"model": rollout.model, "version": rollout.version}
        return {group: targets_digest(target) for group, target in newest.items()}

    def tick(self) -> bytes | None:
        """Publish a new timestamp when one is due; the document published, or None."""
        if time.monotonic() < self._due:
            return None
        now = self.clock()
        self.version = self.db.next_timestamp_version()
        signed = new_timestamp(self.version, now + self.expires_s, self.root_version, self.targets(), issued=now)
        document = sign_metadata(signed, [self.key])
        self._publish(Topics.TIMESTAMP, document, retain=True)
        self._due = time.monotonic() + self.every_s
        return document
