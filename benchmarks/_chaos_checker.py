"""The chaos run's checker: invariants over the history of a run, from the server's and the devices' side.

A :class:`History` holds what the run recorded: the rollouts as the database holds them at the
end, each target's statuses as the run saw them move, the server's event log, each simulated
device's own install log and final version, and the server's view of every device. :func:`check`
returns every broken invariant as a :class:`Violation`, naming the invariant, the device or
rollout, and what was seen; :func:`minimal_history` picks the lines of the history behind one.

The invariants (the issue's list, made precise):

- ``final_version``: each device ends on the version its last rollout left it on: the rollout's
  version if that rollout completed and the device committed, else the version it had before
  that rollout (an aborted rollout reverts its devices). A device no rollout targeted keeps the
  version it started on. Every fault of the run passes, so a device that never answered a
  rollout (its target timed out) was lost by the system, and counts too.
- ``installed_twice``: no device commits one version twice by updates (a signed rollback back to
  a version held before is a restore), and none installs an aborted rollout's version after its
  revert of that rollout.
- ``stuck``: every rollout started has ended within its deadline, and no target is still reverting.
- ``not_reverted``: each device that committed an aborted rollout's version went back by that
  rollout's revert (its own log shows it) unless a later rollout had already moved it on, and no
  target of an aborted rollout is left committed.
- ``server_view``: the server lists each device online, on the version the device runs.
- ``went_backwards``: a committed target stays committed (or, in an aborted rollout, moves on to
  reverting and reverted), and no target's status moves back to an earlier one.
- ``database``: the database holds every rollout the run started, with the targets it had at its
  start; each logs one start, one end, and each stage sent once (one driver at a time).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from benchmarks._sim_basics import updated_twice
from edgesdk.fleet.records import RolloutRecord, RolloutState, TargetStatus

__all__ = ["History", "Violation", "check", "minimal_history"]

_AFTER_COMMIT = frozenset({TargetStatus.COMMITTED, TargetStatus.REVERTING, TargetStatus.REVERTED,
                           TargetStatus.REVERT_FAILED})


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which, about what (a device or rollout id), and what was seen."""

    invariant: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.subject}: {self.detail}"


@dataclass
class History:
    """What one chaos run recorded (see the module docstring)."""

    initial_version: str
    #: Rollout ids in the order the run started them, with the targets each had when first seen and its deadline.
    started: list[str] = field(default_factory=list)
    planned_targets: dict[str, int] = field(default_factory=dict)
    deadline_s: dict[str, float] = field(default_factory=dict)
    #: The rollouts as the database holds them at the end, with all their targets (missing: not in the database).
    rollouts: dict[str, RolloutRecord] = field(default_factory=dict)
    #: (rollout, device) -> the distinct statuses seen, in order (polled from the database during the run).
    target_statuses: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    #: The server's event log: dicts with ts, type, rollout_id, device_id, payload.
    events: list[dict[str, Any]] = field(default_factory=list)
    #: Each device's own install log ([time, deployment, version, outcome, rollback]) and final version.
    install_log: dict[str, list[list[Any]]] = field(default_factory=dict)
    final: dict[str, str | None] = field(default_factory=dict)
    #: device -> (status, version) as the server lists it at the end.
    server_view: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    #: The faults applied, in order (for the report).
    faults: list[dict[str, Any]] = field(default_factory=list)


def check(history: History) -> list[Violation]:
    """Every invariant the history breaks (empty: the run was correct)."""
    return [*_final_versions(history), *_installed_twice(history), *_stuck(history), *_not_reverted(history),
            *_server_view(history), *_went_backwards(history), *_database(history)]


def expected_versions(history: History) -> dict[str, str | None]:
    """The version each device should end on, from the rollouts in the order they started."""
    expected: dict[str, str | None] = dict.fromkeys(history.final, history.initial_version)
    for rollout_id in history.started:
        r = history.rollouts.get(rollout_id)
        if r is None or r.state == RolloutState.RUNNING:
            continue  # reported by database/stuck; its devices' end is unknown
        for t in r.targets:
            done = r.state == RolloutState.COMPLETED and t.status == TargetStatus.COMMITTED
            expected[t.device_id] = r.version if done else t.previous_version
    return expected


def _final_versions(h: History) -> list[Violation]:
    found = [Violation("final_version", device, f"runs {h.final.get(device)!r}, its last rollout left it on {want!r}")
             for device, want in sorted(expected_versions(h).items()) if h.final.get(device) != want]
    for rollout_id in h.started:
        r = h.rollouts.get(rollout_id)
        for t in r.targets if r is not None else ():
            if t.status == TargetStatus.TIMEOUT:
                found.append(Violation("final_version", t.device_id, f"never answered rollout {rollout_id} "
                                                                     f"({r.version}): its target timed out"))
    return found


def _installed_twice(h: History) -> list[Violation]:
    found = []
    aborted = {rid for rid, r in h.rollouts.items() if r.state == RolloutState.ABORTED}
    for device, log in sorted(h.install_log.items()):
        if updated_twice(log):
            versions = Counter(v for _, _, v, outcome, rollback in log if outcome == "committed" and not rollback)
            found.append(Violation("installed_twice", device,
                                   f"committed {', '.join(v for v, n in versions.items() if n > 1)} more than once"))
        reverted: set[str] = set()
        for _, deployment, version, outcome, _ in log:
            if deployment.endswith("-rollback") and outcome == "committed":
                reverted.add(deployment.removesuffix("-rollback"))
            elif deployment in reverted and deployment in aborted and outcome == "committed":
                found.append(Violation("installed_twice", device,
                                       f"installed {version} of aborted rollout {deployment} after its revert"))
    return found


def _stuck(h: History) -> list[Violation]:
    found = []
    for rollout_id in h.started:
        r = h.rollouts.get(rollout_id)
        if r is None:
            continue  # the database invariant names it
        if r.state == RolloutState.RUNNING:
            found.append(Violation("stuck", rollout_id, f"still running at stage {r.stage + 1}: "
                                                        f"{ {k.value: v for k, v in r.counts.items()} }"))
        elif r.updated - r.created > h.deadline_s.get(rollout_id, float("inf")):
            found.append(Violation("stuck", rollout_id, f"ended after {r.updated - r.created:.0f} s, past its "
                                                        f"deadline of {h.deadline_s[rollout_id]:.0f} s"))
        reverting = [t.device_id for t in r.targets if t.status == TargetStatus.REVERTING]
        if reverting:
            found.append(Violation("stuck", rollout_id, f"{len(reverting)} targets still reverting, e.g. "
                                                        f"{', '.join(reverting[:3])}"))
    return found


def _not_reverted(h: History) -> list[Violation]:
    found = []
    for rollout_id in h.started:
        r = h.rollouts.get(rollout_id)
        if r is None or r.state != RolloutState.ABORTED:
            continue
        left = [t.device_id for t in r.targets if t.status == TargetStatus.COMMITTED and t.previous_version]
        if left:
            found.append(Violation("not_reverted", rollout_id, f"{len(left)} targets left committed after the abort, "
                                                               f"e.g. {', '.join(left[:3])}"))
    aborted = {rid for rid in h.started if (r := h.rollouts.get(rid)) is not None and r.state == RolloutState.ABORTED}
    for device, log in sorted(h.install_log.items()):
        for i, (_, deployment, version, outcome, _) in enumerate(log):
            if deployment not in aborted or outcome != "committed":
                continue
            if not log[i + 1:]:  # neither its revert nor a later rollout moved it
                found.append(Violation("not_reverted", device, f"still on {version} of aborted rollout {deployment}"))
    return found


def _server_view(h: History) -> list[Violation]:
    found = []
    for device, version in sorted(h.final.items()):
        seen = h.server_view.get(device)
        if seen != ("online", version):
            found.append(Violation("server_view", device, f"the device runs {version!r}, the server lists {seen}"))
    return found


def _went_backwards(h: History) -> list[Violation]:
    found = []
    for (rollout_id, device), statuses in sorted(h.target_statuses.items()):
        r = h.rollouts.get(rollout_id)
        seen = [TargetStatus(s) for s in statuses]
        if TargetStatus.COMMITTED in seen:
            after = seen[seen.index(TargetStatus.COMMITTED):]
            allowed = _AFTER_COMMIT if r is not None and r.state == RolloutState.ABORTED else {TargetStatus.COMMITTED}
            if any(s not in allowed for s in after):
                found.append(Violation("went_backwards", f"{rollout_id}/{device}",
                                       f"committed, then {' -> '.join(s.value for s in after[1:])}"))
                continue
        for before, now in zip(seen, seen[1:]):
            if not _forward(before, now):
                found.append(Violation("went_backwards", f"{rollout_id}/{device}", f"{before.value} -> {now.value}"))
                break
    return found


#: Where a status stands in a target's life; a target never moves to a lower rank, nor between two final ones.
_RANK = {TargetStatus.PENDING: 0, TargetStatus.SENT: 1, TargetStatus.TIMEOUT: 1, TargetStatus.DOWNLOADING: 2,
         TargetStatus.INSTALLING: 3, TargetStatus.COMMITTED: 4, TargetStatus.FAILED: 4, TargetStatus.ROLLED_BACK: 4,
         TargetStatus.REJECTED: 4, TargetStatus.REVERTING: 5, TargetStatus.REVERTED: 6, TargetStatus.REVERT_FAILED: 6}


def _forward(before: TargetStatus, after: TargetStatus) -> bool:
    """True when a target may go from ``before`` to ``after`` (a late commit after a timeout included)."""
    if _RANK[after] == _RANK[before]:
        return _RANK[after] in (1,)  # sent and timeout may follow each other; two final statuses may not
    return _RANK[after] > _RANK[before]


def _database(h: History) -> list[Violation]:
    found = []
    kinds: dict[str, Counter[str]] = defaultdict(Counter)
    stages: dict[str, Counter[int]] = defaultdict(Counter)
    for e in h.events:
        if e["rollout_id"] and e["type"] in ("rollout_started", "rollout_completed", "rollout_aborted"):
            kinds[e["rollout_id"]][e["type"]] += 1
        elif e["rollout_id"] and e["type"] == "stage_sent":
            stages[e["rollout_id"]][int(e["payload"]["stage"])] += 1
    for rollout_id in h.started:
        r = h.rollouts.get(rollout_id)
        if r is None:
            found.append(Violation("database", rollout_id, "the run started it; the database does not hold it"))
            continue
        if len(r.targets) != h.planned_targets.get(rollout_id, len(r.targets)):
            found.append(Violation("database", rollout_id, f"holds {len(r.targets)} targets, it started with "
                                                           f"{h.planned_targets[rollout_id]}"))
        ends = kinds[rollout_id]["rollout_completed"] + kinds[rollout_id]["rollout_aborted"]
        if kinds[rollout_id]["rollout_started"] != 1 or (r.state != RolloutState.RUNNING and ends != 1):
            found.append(Violation("database", rollout_id, f"logged {dict(kinds[rollout_id])}: one start and one end "
                                                           "expected"))
        twice = sorted(stage + 1 for stage, n in stages[rollout_id].items() if n > 1)
        if twice:
            found.append(Violation("database", rollout_id, f"stage(s) {twice} sent more than once: two drivers"))
    return found


def minimal_history(history: History, violation: Violation, lines: int = 12) -> list[str]:
    """The lines of the history behind ``violation``: its device's installs, targets and events, or its rollout's
    record and events (at most ``lines`` of each)."""
    subject = violation.subject.split("/")[-1] if "/" in violation.subject else violation.subject
    out = [str(violation)]
    if subject in history.final:
        out += [f"  install {entry}" for entry in history.install_log.get(subject, [])[-lines:]]
        out += [f"  target {rid}: {' -> '.join(s)}" for (rid, d), s in history.target_statuses.items() if d == subject]
        out += [f"  server lists {history.server_view.get(subject)}; device runs {history.final.get(subject)!r}"]
        out += [f"  event {e['ts']:.3f} {e['type']} {e.get('rollout_id')} {e['payload'].get('reason', '')}"
                for e in history.events if e["device_id"] == subject][-lines:]
    rollout_id = violation.subject.split("/")[0]
    r = history.rollouts.get(rollout_id)
    if r is not None:
        out.append(f"  rollout {r.id}: {r.version} {r.state.value} stage {r.stage + 1}/{len(r.stage_sizes) or '?'} "
                   f"{r.reason or ''} counts {({k.value: v for k, v in r.counts.items()})}")
        out += [f"  event {e['ts']:.3f} {e['type']} {e['payload']}" for e in history.events
                if e["rollout_id"] == rollout_id and e["device_id"] is None][-lines:]
    return out
