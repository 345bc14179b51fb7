"""The device's protocol events: logged as one readable line each, kept in a short history, and published."""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from edgesdk.agent.store import PendingInstall
from edgesdk.fleet.protocol import Command
from edgesdk.fleet.records import AgentEvent

__all__ = ["EventLog"]

log = logging.getLogger("edgesdk.agent.agent")  # the agent's log, as operators filter it

#: Hears each event after it was published: what it is about, and which event.
Listener = Callable[[Command | PendingInstall | None, AgentEvent], None]


#: Log levels of protocol events other than INFO: what went wrong is a warning, chunk progress is detail.
_EVENT_LEVELS = {AgentEvent.PROGRESS: logging.DEBUG, AgentEvent.REJECTED: logging.WARNING,
                 AgentEvent.FAILED: logging.WARNING, AgentEvent.ROLLED_BACK: logging.WARNING}


def _describe(device: str, event: dict[str, Any]) -> str:
    """One readable log line per protocol event, e.g. ``cam01: committed digits 1.2.0 (apply 120 ms)``."""
    what = " ".join(str(event[k]) for k in ("name", "version") if event.get(k))
    facts = []
    if event.get("apply_ms") is not None:
        facts.append(f"apply {event['apply_ms']:.0f} ms")
    if event.get("bytes"):
        facts.append(f"{event['bytes']} bytes")
    if event.get("chunks"):
        facts.append(f"{event['chunks']} chunk{'s' if event['chunks'] != 1 else ''}, {event.get('missing', 0)} to fetch")
    if event.get("restored"):
        facts.append(f"back on {event['restored']}")
    if event.get("reason"):
        facts.append(str(event["reason"]))
    return f"{device}: {event['event'].replace('_', ' ')} {what}".rstrip() + (f" ({'; '.join(facts)})" if facts else "")


class EventLog:
    """Records the protocol events of one device: a log line, :attr:`events`, and ``publish`` of the
    JSON; ``on_event(about, event)`` hears each one after."""

    def __init__(self, device_id: str, history: int, publish: Callable[[bytes], None],
                 on_event: Listener | None = None) -> None:
        self.device_id = device_id
        #: The latest events as published (oldest first), ``history`` at most.
        self.events: deque[dict[str, Any]] = deque(maxlen=history)
        self._publish = publish
        #: Hears each event after it was published (what it is about, which event), or None.
        self.on_event = on_event

    def record(self, about: Command | PendingInstall | None, event: AgentEvent, **details: Any) -> None:
        """Log and publish ``event``, naming the deployment ``about`` is part of."""
        payload = {"event": event, "time": time.time(), **details}
        if about is not None:
            payload.update(deployment_id=about.deployment_id, name=about.name, version=about.version)
        self.events.append(payload)
        log.log(_EVENT_LEVELS.get(event, logging.INFO), "%s", _describe(self.device_id, payload))
        self._publish(json.dumps(payload).encode())
        if self.on_event is not None:  # e.g. a judged commit speeds up the state's cadence
            self.on_event(about, event)
