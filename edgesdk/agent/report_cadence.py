"""When the device agent publishes its retained state besides on every change.

Two cadences (:class:`~edgesdk.agent.config.AgentConfig`): ``state_interval_s`` (300 s by default,
None: only on changes), and ``traffic_every_s`` (10 s) while the device is being judged in a
rollout. A deploy or rollback command may carry ``judge_s`` (signed,
:attr:`edgesdk.fleet.protocol.Command.judge_s`): once the agent reports it committed (installed, or
already running that version), the device is judged until ``commit + judge_s``. Meanwhile
``STORE/apps/cadence.json`` asks the apps to hand over their traffic as often
(:meth:`edgesdk.agent.app_traffic.TrafficReporter.judge_until`). A judged install interrupted by a
restart keeps its ``judge_s`` in the pending install it resumes from.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from edgesdk.agent.store import PendingInstall
from edgesdk.fleet.protocol import Command
from edgesdk.fleet.records import AgentEvent

__all__ = ["ReportCadence"]


class ReportCadence:
    """The agent's publishing schedule (module doc); ``observe`` hears every protocol event.

    ``tell_apps(until, every_s)`` is called when a judged window starts or grows. ``clock`` is
    wall-clock seconds (``until`` is shared with the apps), ``monotonic`` paces the publishing.
    """

    def __init__(self, state_interval_s: float | None, traffic_every_s: float,
                 tell_apps: Callable[[float, float], None] | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.state_interval_s, self.traffic_every_s = state_interval_s, traffic_every_s
        self._tell_apps, self._clock, self._monotonic = tell_apps, clock, monotonic
        #: Until when (epoch seconds) the device is judged; 0 when it never was.
        self.judged_until = 0.0
        self._due = monotonic() + (state_interval_s or 0)

    def every(self) -> float | None:
        """Seconds between publications now: ``traffic_every_s`` while judged, else
        ``state_interval_s`` (None: only on changes)."""
        if self._clock() < self.judged_until:
            return self.traffic_every_s
        return self.state_interval_s

    def judge(self, judge_s: float | None) -> None:
        """A command carrying ``judge_s`` was committed now: report fast until it has passed."""
        if judge_s is None:
            return
        until = self._clock() + judge_s
        if until <= self.judged_until:
            return
        self.judged_until = until
        self._due = min(self._due, self._monotonic() + self.traffic_every_s)
        if self._tell_apps is not None:
            self._tell_apps(until, self.traffic_every_s)

    def observe(self, about: Command | PendingInstall | None, event: AgentEvent) -> None:
        """A protocol event: a commit of a judged command starts (or extends) its judged window."""
        if event == AgentEvent.COMMITTED and about is not None:
            self.judge(about.judge_s)

    def due(self) -> bool:
        """Whether a periodic publication is due now (the next one is then scheduled)."""
        every = self.every()
        now = self._monotonic()
        if not every or now < self._due:
            return False
        self._due = now + every
        return True
