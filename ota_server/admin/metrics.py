"""Prometheus metrics of the OTA server, in a registry of its own, served at the admin API's ``/metrics``.

This process's counters and latency histogram::

    edgesdk_ota_commands_sent_total                      signed commands published to devices
    edgesdk_ota_commands_resent_total                    commands published again (a device did not answer)
    edgesdk_ota_chunk_bytes_total{kind}                  archive bytes published; kind: broadcast | resend
    edgesdk_ota_event_handling_seconds{kind}             handling one device message; kind: state | event | need
    edgesdk_ota_reports_refused_total{kind,reason}       device messages refused; kind: state | event | need |
                                                         measurement; reason: flood (over the device's limit:
                                                         events and chunk requests dropped, waiting states
                                                         replaced by newer), length | json | type | range | id |
                                                         missing (malformed: edgesdk.fleet.reports), store (the
                                                         fleet store refused to write it), not_target (a chunk
                                                         request for a transfer the device is not a target of),
                                                         unknown (for a transfer nothing serves)
    edgesdk_ota_states_refused_group_total{reason}       device states refused for their group; reason:
                                                         wrong_group | unprovisioned
    edgesdk_ota_console_logins_refused_total{reason}     console logins refused; reason: wrong_token |
                                                         locked_out (a client past its wrong-token allowance)
    edgesdk_ota_outbox_messages, edgesdk_ota_ingest_pending   this replica's queues (published unacknowledged;
                                                         reports not yet written)
    edgesdk_ota_catch_up_limit                           late targets that may have a command out at once
    edgesdk_ota_catch_up_in_flight                       late targets with a command out (fleet-wide)

and, read from the fleet store at scrape time (so every replica reports the whole fleet, not
what it handled itself)::

    edgesdk_ota_devices{status,model,version}            devices in each status with each installed version
    edgesdk_ota_energy_per_inference_mj{model,version}   mean energy per inference above idle the online devices
                                                         running it report (boards with a power sensor)
    edgesdk_ota_devices_reporting_energy{model,version}  how many online devices that mean is over
    edgesdk_ota_device_average_watts{model,version}      mean of their average power over their last window
    edgesdk_ota_rollouts{state}                          rollouts in each state (0 for states with none)
    edgesdk_ota_fleet_scrape_ok                          1 when the fleet store answered this scrape, else 0
    edgesdk_ota_rollout_targets{rollout,model,version,group,status}   each running rollout's targets by status
    edgesdk_ota_group_devices{group,model,version,state} each group's devices against its release; state:
                                                         converged | behind_online | behind_offline
    edgesdk_ota_release_flagged{group,rollout}           1 when the group's release is flagged (late installs
                                                         failed past its policy), else 0

With several replicas, sum the counters over replicas and take any one replica's fleet gauges
(``max by (status, model, version)``): each replica reports the same database.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.records import RolloutState

__all__ = ["ServerMetrics", "FleetCounts", "CHUNK_KINDS", "EVENT_KINDS", "REFUSED_KINDS", "REFUSAL_REASONS"]

log = logging.getLogger(__name__)

#: The ``kind`` labels of ``edgesdk_ota_chunk_bytes_total``.
CHUNK_KINDS = ("broadcast", "resend")
#: The ``reason`` labels of ``edgesdk_ota_states_refused_group_total``.
GROUP_REFUSALS = ("wrong_group", "unprovisioned")
#: The ``reason`` labels of ``edgesdk_ota_console_logins_refused_total``.
LOGIN_REFUSALS = ("wrong_token", "locked_out")
#: The ``kind`` labels of ``edgesdk_ota_event_handling_seconds`` (the device topics the server reads).
EVENT_KINDS = ("state", "event", "need")
#: The ``kind`` labels of ``edgesdk_ota_reports_refused_total``: the device topic the message came on.
REFUSED_KINDS = ("state", "event", "need", "measurement")
#: Its ``reason`` labels: the report limit's ``flood``, a parser's (edgesdk.fleet.reports), the store's refusal.
#: ``not_target``: a chunk request for a transfer (or measurement) the device is not a target of, open or not.
#: ``unknown``: a chunk request for a transfer that is not open and that no server serves (a made-up id, or a transfer
#: long closed; counted by a single server only, as a replica cannot tell another's).
REFUSAL_REASONS = ("flood", "length", "json", "type", "range", "id", "missing", "store", "not_target", "unknown")

# 50 us .. 1 s, then a tail so a stalled database still lands in a bucket of its own.
_HANDLING_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                     2.5, 5.0)


class FleetCounts(Protocol):
    """What the metrics read from a fleet store (SQLite or PostgreSQL) at scrape time."""

    def device_counts(self) -> list[tuple[str, str | None, str | None, int]]:
        """(status, model, version, count) for every combination that has devices."""
        ...

    def rollout_counts(self) -> dict[RolloutState, int]:
        """How many rollouts are in each state (states with none may be missing)."""
        ...

    def energy_by_version(self) -> list[tuple[str, str, int, float | None, float | None]]:
        """(model, version, devices reporting, mean energy per inference mJ, mean average W) of online devices."""
        ...

    def rollouts(self, state: RolloutState | None = None) -> list[Any]:
        """Rollout summaries (``id``, ``model``, ``version``, ``group``), of ``state`` if given."""
        ...

    def target_counts(self, rollout_id: str) -> dict[tuple[int, Any], int]:
        """How many targets of each (stage, status) a rollout has."""
        ...

    def trust_counts(self) -> list[tuple[int, bool, int]]:
        """(root version, stale, online devices) of the devices on a root of trust."""
        ...

    def group_releases(self) -> list[Any]:
        """Each group's release and how many of its devices run it (``GroupRelease``)."""
        ...


class ServerMetrics:
    """The OTA server's metrics; every method is safe to call from any thread.

    ``db`` is the fleet store; it is queried only when :meth:`render` runs (one scrape).
    """

    def __init__(self, db: FleetCounts) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self._commands_sent = Counter("edgesdk_ota_commands_sent", "Signed commands published to devices.",
                                      registry=self.registry)
        self._commands_resent = Counter("edgesdk_ota_commands_resent",
                                        "Commands published again because a device had not answered.",
                                        registry=self.registry)
        chunk_bytes = Counter("edgesdk_ota_chunk_bytes", "Archive chunk bytes published.", ("kind",),
                              registry=self.registry)
        handling = Histogram("edgesdk_ota_event_handling_seconds", "Time to handle one device message.", ("kind",),
                             buckets=_HANDLING_BUCKETS, registry=self.registry)
        # Children made up front: every series shows from the first scrape, and a call skips the label lookup.
        self._chunk_bytes: dict[str, Any] = {kind: chunk_bytes.labels(kind) for kind in CHUNK_KINDS}
        self._handling: dict[str, Any] = {kind: handling.labels(kind) for kind in EVENT_KINDS}
        refused = Counter("edgesdk_ota_reports_refused", "Device messages refused: over their device's report limit "
                          "(flood), malformed, or refused by the fleet store.", ("kind", "reason"), registry=self.registry)
        self._refused: dict[tuple[str, str], Any] = {(kind, reason): refused.labels(kind, reason)
                                                     for kind in REFUSED_KINDS for reason in REFUSAL_REASONS}
        group_refused = Counter("edgesdk_ota_states_refused_group", "Device states refused because the device is not "
                                "provisioned in the group it names.", ("reason",), registry=self.registry)
        self._group_refused: dict[str, Any] = {reason: group_refused.labels(reason) for reason in GROUP_REFUSALS}
        logins = Counter("edgesdk_ota_console_logins_refused", "Console logins refused: a wrong token, or a client "
                         "locked out after too many.", ("reason",), registry=self.registry)
        self._logins_refused: dict[str, Any] = {reason: logins.labels(reason) for reason in LOGIN_REFUSALS}
        self.registry.register(_FleetCollector(db))

    def watch_queues(self, outbox: Callable[[], int], ingest: Callable[[], int]) -> None:
        """Report the server's two queues at every scrape: ``outbox``, messages published and not yet acknowledged
        by the broker, and ``ingest``, device reports received and not yet written to the fleet store."""
        from prometheus_client import Gauge

        Gauge("edgesdk_ota_outbox_messages", "Messages this server published that the broker has not acknowledged "
              "yet (queued or in flight).", registry=self.registry).set_function(outbox)
        Gauge("edgesdk_ota_ingest_pending", "Device reports received and not yet written to the fleet store.",
              registry=self.registry).set_function(ingest)

    def command_sent(self, n: int = 1) -> None:
        """Count ``n`` commands published to devices."""
        self._commands_sent.inc(_count(n, "command_sent"))

    def command_resent(self, n: int = 1) -> None:
        """Count ``n`` commands published again to devices that had not answered."""
        self._commands_resent.inc(_count(n, "command_resent"))

    def chunk_bytes(self, kind: str, n: int) -> None:
        """Count ``n`` archive bytes published as a ``broadcast`` or as a ``resend`` of missing chunks."""
        child = self._chunk_bytes.get(kind)
        if child is None:
            raise EdgeSDKError(f"chunk_bytes kind={kind!r} is not one of {', '.join(CHUNK_KINDS)}; pass one of those")
        child.inc(_count(n, "chunk_bytes"))

    def watch_catch_up(self, limit: int, in_flight: Callable[[], int]) -> None:
        """Report the reconciler's cap on catch-up transfers at once, and how many run (read at every scrape)."""
        from prometheus_client import Gauge

        Gauge("edgesdk_ota_catch_up_limit", "Late targets (devices back from offline or new to their group) that "
              "may download at once across the fleet.", registry=self.registry).set(limit)
        Gauge("edgesdk_ota_catch_up_in_flight", "Late targets whose command is out and unanswered.",
              registry=self.registry).set_function(in_flight)

    def group_refused(self, reason: str) -> None:
        """Count one device state refused for its group: ``wrong_group`` or ``unprovisioned``."""
        child = self._group_refused.get(reason)
        if child is None:
            raise EdgeSDKError(f"group_refused reason={reason!r} is not one of {', '.join(GROUP_REFUSALS)}")
        child.inc()

    def console_login_refused(self, reason: str) -> None:
        """Count one console login refused: ``wrong_token``, or ``locked_out`` (refused unread during a lockout)."""
        child = self._logins_refused.get(reason)
        if child is None:
            raise EdgeSDKError(f"console_login_refused reason={reason!r} is not one of {', '.join(LOGIN_REFUSALS)}")
        child.inc()

    def report_refused(self, kind: str, reason: str = "flood") -> None:
        """Count one device message of ``kind`` (state, event, need, measurement) refused for ``reason``: ``flood``
        (its device's report limit), a parser's reason, or ``store``."""
        child = self._refused.get((kind, reason))
        if child is None:
            name, value, known = (("kind", kind, REFUSED_KINDS) if kind not in REFUSED_KINDS
                                  else ("reason", reason, REFUSAL_REASONS))
            raise EdgeSDKError(f"report_refused {name}={value!r} is not one of {', '.join(known)}; pass one of those")
        child.inc()

    def observe_event(self, kind: str, seconds: float) -> None:
        """Record that handling one device message of ``kind`` (state, event or need) took ``seconds``."""
        child = self._handling.get(kind)
        if child is None:
            raise EdgeSDKError(f"observe_event kind={kind!r} is not one of {', '.join(EVENT_KINDS)}; pass one of those")
        if not seconds >= 0:  # also refuses NaN
            raise EdgeSDKError(f"observe_event seconds={seconds!r} must be a duration >= 0 (a monotonic clock "
                               "difference)")
        child.observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition (queries the fleet store once) and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _count(n: int, method: str) -> int:
    """``n`` when it is a whole number >= 0; counters only go up."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise EdgeSDKError(f"{method}(n={n!r}): n must be a whole number >= 0 (counters only go up)")
    return n


class _FleetCollector:
    """Device and rollout gauges computed from the fleet store when Prometheus scrapes."""

    def __init__(self, db: FleetCounts) -> None:
        self._db = db

    def describe(self) -> Iterator[Any]:
        """The families without samples, so registering does not query the database."""
        yield from self._families()

    def collect(self) -> Iterator[Any]:
        """One query of device counts and one of rollout counts; a failing store reports ``scrape_ok 0``."""
        devices, rollouts, ok, energy, reporting, watts, roots, stale, targets, groups, flagged = self._families()
        try:
            device_counts = self._db.device_counts()
            rollout_counts = self._db.rollout_counts()
            running = [(r, self._db.target_counts(r.id)) for r in self._db.rollouts(RolloutState.RUNNING)]
            energy_rows = self._db.energy_by_version()
            trust_rows = self._db.trust_counts()
            releases = self._db.group_releases()
        except Exception as exc:  # a scrape must not fail because the database blinked; say so in a series
            log.warning("metrics: the fleet store did not answer (%s: %s)", type(exc).__name__, exc)
            ok.add_metric([], 0)
            yield ok
            return
        for status, model, version, count in device_counts:
            devices.add_metric([str(status), model or "", version or ""], count)
        for state in RolloutState:
            rollouts.add_metric([state.value], rollout_counts.get(state, 0))
        for model, version, count, energy_mj, avg_watts in energy_rows:
            reporting.add_metric([model, version], count)
            if energy_mj is not None:
                energy.add_metric([model, version], energy_mj)
            if avg_watts is not None:
                watts.add_metric([model, version], avg_watts)
        by_root: dict[int, int] = {}
        for root_version, _, count in trust_rows:
            by_root[root_version] = by_root.get(root_version, 0) + count
        for root_version, count in sorted(by_root.items()):
            roots.add_metric([str(root_version)], count)
        stale.add_metric([], sum(count for _, is_stale, count in trust_rows if is_stale))
        for summary, counts in running:
            by_status: dict[str, int] = {}
            for (_, status), count in counts.items():
                by_status[str(status)] = by_status.get(str(status), 0) + count
            for status, count in sorted(by_status.items()):
                targets.add_metric([summary.id, summary.model, summary.version, summary.group, status], count)
        for g in releases:
            for standing, count in (("converged", g.converged), ("behind_online", g.behind_online),
                                 ("behind_offline", g.behind_offline)):
                groups.add_metric([g.group, g.model or "", g.version or "", standing], count)
            if g.rollout_id:
                flagged.add_metric([g.group, g.rollout_id], 1 if g.flagged else 0)
        ok.add_metric([], 1)
        yield from (devices, rollouts, ok, energy, reporting, watts, roots, stale, targets, groups, flagged)

    @staticmethod
    def _families() -> tuple[Any, Any, Any, Any, Any, Any, Any, Any, Any, Any, Any]:
        from prometheus_client.core import GaugeMetricFamily

        by_version = ("model", "version")
        return (GaugeMetricFamily("edgesdk_ota_devices", "Devices by status, model and installed version.",
                                  labels=("status", "model", "version")),
                GaugeMetricFamily("edgesdk_ota_rollouts", "Rollouts by state.", labels=("state",)),
                GaugeMetricFamily("edgesdk_ota_fleet_scrape_ok", "1 when the fleet store answered this scrape."),
                GaugeMetricFamily("edgesdk_ota_energy_per_inference_mj", "Mean energy per inference above idle "
                                  "reported by online devices running the version (boards with a power sensor).",
                                  labels=by_version),
                GaugeMetricFamily("edgesdk_ota_devices_reporting_energy", "Online devices reporting energy, by "
                                  "version.", labels=by_version),
                GaugeMetricFamily("edgesdk_ota_device_average_watts", "Mean average board power over the devices' "
                                  "last report window, by version.", labels=by_version),
                GaugeMetricFamily("edgesdk_ota_devices_by_root_version", "Online devices on a root of trust, by the "
                                  "root version they hold.", labels=("root_version",)),
                GaugeMetricFamily("edgesdk_ota_devices_stale", "Online devices whose newest signed timestamp expired "
                                  "(updates withheld, or the server stopped publishing them)."),
                GaugeMetricFamily("edgesdk_ota_rollout_targets", "Devices of each running rollout by status (its "
                                  "progress).", labels=("rollout", "model", "version", "group", "status")),
                GaugeMetricFamily("edgesdk_ota_group_devices", "Devices of each group by how they stand to the group's "
                                  "release: on it, behind and online (catching up), behind and offline (deferred).",
                                  labels=("group", "model", "version", "state")),
                GaugeMetricFamily("edgesdk_ota_release_flagged", "1 when a group's release is flagged: more late "
                                  "installs failed than its policy allows.", labels=("group", "rollout")))
