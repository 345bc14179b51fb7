"""The chaos run's checker: invariants over the history of a run, from the operator's, the devices' and the server's side.

A :class:`History` holds what the run recorded: the operator's actions (each push, rollback and
abort, and how its rollout ended, timed by the run's own clock), when each device was offline (by
the faults the run applied), the rollouts as the database holds them at the end, each target's
statuses as the run saw them move, the server's event log, each simulated device's own install log
and final version, and the server's view of every device. :func:`check` returns every broken
invariant as a :class:`Violation`; :func:`minimal_history` picks the lines of the history behind
one. :func:`fault_effects` tells whether each fault the run scheduled took effect.

The invariants (the issue's list, made precise):

- ``convergence``: the group's release is the version of the last rollout that completed (a push,
  or a signed rollback), taken from the run's own record of what it did and how each rollout
  ended, never from the server's targets; an abort leaves it alone. Every device that was online
  for at least ``converge_s`` seconds in one stretch after the release last changed (and after it
  joined) ends on the release, by its own account. A device offline when the last push started,
  or provisioned after it, is no exception: the server must bring it to the release.
- ``lost``: no target times out: a device only times out while the server sees it online, and
  every fault of the run passes, so a device that never answered was lost by the system (its
  own log tells whether the command or its report was lost).
- ``group``: a device that reports another group than its provisioned one stays in its own group
  on the server, and no rollout of another group targets it.
- ``installed_twice``: no device commits one version twice by updates (a signed rollback back to
  a version held before is a restore), and none installs an aborted rollout's version after its
  revert of that rollout.
- ``stuck``: every rollout started has ended within its deadline, and no target is still reverting whose
  device was online ``converge_s`` in one stretch after the abort.
- ``not_reverted``: each device that committed an aborted rollout's version went back by that
  rollout's revert (its own log shows it) unless a later rollout had already moved it on, and no
  target of an aborted rollout is left committed.
- ``server_view``: the server lists each device online, on the version the device runs.
- ``went_backwards``: a committed target stays committed (or, in an aborted rollout, moves on to
  reverting and reverted), and no target's status moves back to an earlier one (a device going
  offline mid-install makes its target ``deferred``, from which it may be sent again; a deferred
  target never sent may go back to ``pending`` in a later stage, a re-plan).
- ``database``: the database holds every rollout the run started, with at least the targets it had
  at its start (late ones are added); each logs one start, one end, and each stage sent once (one
  driver at a time).

Devices whose reports the server refuses (``claims``: they name another group) are judged by
``group`` only: the server cannot know their version or status, by design.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from benchmarks.shared.fleet_sim_basics import updated_twice
from edgesdk.fleet.records import RolloutRecord, RolloutState, TargetStatus

__all__ = ["History", "Violation", "check", "fault_effects", "minimal_history", "releases", "online_stretch"]

_AFTER_COMMIT = frozenset({TargetStatus.COMMITTED, TargetStatus.REVERTING, TargetStatus.REVERTED,
                           TargetStatus.REVERT_FAILED})
#: Every device's offline windows under this key apply to all devices (a broker restart).
ALL = "*"


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
    """What one chaos run recorded (see the module docstring). Times are the run's wall clock (``time.time``),
    which the simulated devices' install logs share; the server's replicas may run skewed clocks."""

    initial_version: str
    #: Rollout ids in the order the run started them, with the targets each had when first seen and its deadline.
    started: list[str] = field(default_factory=list)
    planned_targets: dict[str, int] = field(default_factory=dict)
    deadline_s: dict[str, float] = field(default_factory=dict)
    #: The operator's steps in order: dicts with ``what`` (deploy, rollback, abort), ``version``, ``id`` (the
    #: rollout), ``state`` (how it ended as the run saw it), ``started_at`` and ``ended_at``.
    actions: list[dict[str, Any]] = field(default_factory=list)
    #: When the fleet was all online on ``initial_version`` (before the first step), and when the run stopped it.
    began: float = 0.0
    ended: float = 0.0
    #: Devices provisioned during the run -> when they came online (the others were there from ``began``).
    joined: dict[str, float] = field(default_factory=dict)
    #: Device (or :data:`ALL`) -> the windows it was offline in, ``(from, to)``, reconnect time included.
    offline: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: A device online this long after the release changed must run it.
    converge_s: float = 30.0
    #: The group the devices are provisioned in; devices that reported another (device -> the group claimed).
    group: str = ""
    claims: dict[str, str] = field(default_factory=dict)
    #: The rollouts as the database holds them at the end, with all their targets (missing: not in the database).
    rollouts: dict[str, RolloutRecord] = field(default_factory=dict)
    #: Rollouts of other groups than ``group`` (the run's pushes to a claimed group, if the server took one).
    other_rollouts: dict[str, RolloutRecord] = field(default_factory=dict)
    #: (rollout, device) -> the distinct statuses seen, in order (polled from the database during the run).
    target_statuses: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    #: The server's event log: dicts with ts, type, rollout_id, device_id, payload.
    events: list[dict[str, Any]] = field(default_factory=list)
    #: Each device's own install log ([time, deployment, version, outcome, rollback]) and final version.
    install_log: dict[str, list[list[Any]]] = field(default_factory=dict)
    final: dict[str, str | None] = field(default_factory=dict)
    #: device -> (status, version) and device -> group as the server lists them at the end.
    server_view: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    server_groups: dict[str, str] = field(default_factory=dict)
    #: The faults applied, in order, with what the run saw of each; the simulated fleets' summed counters.
    faults: list[dict[str, Any]] = field(default_factory=list)
    sim_counts: dict[str, int] = field(default_factory=dict)


def check(history: History) -> list[Violation]:
    """Every invariant the history breaks (empty: the run was correct)."""
    return [*_convergence(history), *_lost(history), *_group(history), *_installed_twice(history),
            *_stuck(history), *_not_reverted(history), *_server_view(history), *_went_backwards(history),
            *_database(history)]


def releases(history: History) -> list[tuple[float, str]]:
    """The group's release over the run, ``(since, version)``: the initial version, then each completed rollout's
    version from when the run saw it complete (an aborted one changes nothing)."""
    out = [(history.began, history.initial_version)]
    out += [(a["ended_at"], a["version"]) for a in history.actions if a.get("state") == RolloutState.COMPLETED.value]
    return out


def online_stretch(history: History, device: str, since: float) -> float:
    """The longest time ``device`` was online in one stretch between ``since`` and the end of the run."""
    start = max(since, history.joined.get(device, history.began))
    windows = sorted(w for key in (device, ALL) for w in history.offline.get(key, ()))
    longest, at = 0.0, start
    for begin, end in windows:
        if end <= at:
            continue
        if begin >= history.ended:
            break
        longest = max(longest, begin - at)
        at = max(at, end)
    return max(longest, history.ended - at)


def _convergence(h: History) -> list[Violation]:
    since, release = releases(h)[-1]
    found = []
    for device, version in sorted(h.final.items()):
        if device in h.claims or version == release:
            continue
        online = online_stretch(h, device, since)
        if online >= h.converge_s:
            found.append(Violation("convergence", device, f"runs {version!r}, online {online:.0f} s in one stretch "
                                                          f"after release {release} (set at +{since - h.began:.1f} s)"))
    return found


def _lost(h: History) -> list[Violation]:
    found = []
    for rollout_id in h.started:
        r = h.rollouts.get(rollout_id)
        if r is None:
            continue
        for t in r.targets:
            if t.status == TargetStatus.TIMEOUT and t.device_id not in h.claims:
                done = [f"{outcome} at +{at - h.began:.1f} s" for at, deployment, _, outcome, _ in
                        h.install_log.get(t.device_id, ()) if deployment == rollout_id]
                found.append(Violation("lost", t.device_id, f"its target in rollout {rollout_id} ({r.version}) timed "
                                                            "out while the server saw it online; its own log: "
                                                            + (", ".join(done) or "nothing installed")))
    return found


def _group(h: History) -> list[Violation]:
    found = []
    for device, claimed in sorted(h.claims.items()):
        listed = h.server_groups.get(device)
        if listed != h.group:
            found.append(Violation("group", device, f"provisioned in {h.group!r}, reported {claimed!r}: the server "
                                                    f"lists it in {listed!r}"))
        for r in [*h.rollouts.values(), *h.other_rollouts.values()]:
            if r.group != h.group and any(t.device_id == device for t in r.targets):
                found.append(Violation("group", device, f"targeted by rollout {r.id} of group {r.group!r}, which it "
                                                        "claimed"))
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
        aborted_at = next((a["ended_at"] for a in h.actions if a.get("id") == rollout_id), h.began)
        reverting = [t.device_id for t in r.targets if t.status == TargetStatus.REVERTING
                     and online_stretch(h, t.device_id, aborted_at) >= h.converge_s]
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
        if seen != ("online", version) and device not in h.claims:
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
        for i, (before, now) in enumerate(zip(seen, seen[1:])):
            if not _forward(before, now) and not _replanned(seen[: i + 1], now):
                found.append(Violation("went_backwards", f"{rollout_id}/{device}", f"{before.value} -> {now.value}"))
                break
    return found


#: Where a status stands in a target's life; a target never moves to a lower rank, nor between two final ones.
_RANK = {TargetStatus.PENDING: 0, TargetStatus.SENT: 1, TargetStatus.TIMEOUT: 1, TargetStatus.DEFERRED: 1,
         TargetStatus.DOWNLOADING: 2, TargetStatus.INSTALLING: 3, TargetStatus.COMMITTED: 4, TargetStatus.FAILED: 4,
         TargetStatus.ROLLED_BACK: 4, TargetStatus.REJECTED: 4, TargetStatus.REVERTING: 5, TargetStatus.REVERTED: 6,
         TargetStatus.REVERT_FAILED: 6, TargetStatus.NO_ARTIFACT: 4, TargetStatus.SKIPPED: 4,
         TargetStatus.AHEAD: 1}
#: A command out and unanswered: a device that goes offline mid-download is deferred, then sent the command again
#: when it returns (and a late answer follows a timeout; a device ahead of the release is sent
#: it once it went back to an older version), so these follow each other in any order (the run
#: polls, and may miss the deferral in between).
_OPEN = frozenset({TargetStatus.SENT, TargetStatus.TIMEOUT, TargetStatus.DEFERRED, TargetStatus.DOWNLOADING,
                   TargetStatus.INSTALLING, TargetStatus.AHEAD})


#: Statuses that mean the device was sent its command.
_WAS_SENT = frozenset({TargetStatus.SENT, TargetStatus.TIMEOUT, TargetStatus.DOWNLOADING, TargetStatus.INSTALLING})


def _replanned(so_far: list[TargetStatus], after: TargetStatus) -> bool:
    """A target never sent, deferred (its device offline when its stage came), may be moved to a
    later stage as pending again (the store's ``push_back``: its stage filled up with devices that
    returned first); that is a re-plan, not a step back."""
    return (so_far[-1] is TargetStatus.DEFERRED and after is TargetStatus.PENDING
            and not _WAS_SENT & set(so_far))


def _forward(before: TargetStatus, after: TargetStatus) -> bool:
    """True when a target may go from ``before`` to ``after``."""
    return (before in _OPEN and after in _OPEN) or _RANK[after] > _RANK[before]


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
        if len(r.targets) < h.planned_targets.get(rollout_id, 0):
            found.append(Violation("database", rollout_id, f"holds {len(r.targets)} targets, it started with "
                                                           f"{h.planned_targets[rollout_id]}"))
        ends = kinds[rollout_id]["rollout_completed"] + kinds[rollout_id]["rollout_aborted"]
        if kinds[rollout_id]["rollout_started"] != 1 or (r.state != RolloutState.RUNNING and ends != 1):
            found.append(Violation("database", rollout_id, f"logged {dict(kinds[rollout_id])}: one start and one end "
                                                           "expected"))
        twice = sorted(stage + 1 for stage, n in stages[rollout_id].items() if n > 1)
        if twice:
            drivers = sorted({str(e["payload"].get("holder")) for e in h.events if e["type"] == "stage_sent"
                              and e["rollout_id"] == rollout_id})
            found.append(Violation("database", rollout_id, f"stage(s) {twice} sent more than once: two drivers "
                                                           f"({', '.join(drivers)})"))
    return found


def minimal_history(history: History, violation: Violation, lines: int = 12) -> list[str]:
    """The lines of the history behind ``violation``: its device's installs, offline windows, targets and events
    and the group's releases, or its rollout's record and events (at most ``lines`` of each)."""
    subject = violation.subject.split("/")[-1] if "/" in violation.subject else violation.subject
    out = [str(violation)]
    t0 = history.began

    def rel(t: float) -> str:
        return f"+{t - t0:.1f}s"

    if subject in history.final:
        out += [f"  release {version} from {rel(since)}" for since, version in releases(history)]
        if subject in history.joined:
            out.append(f"  joined at {rel(history.joined[subject])}")
        out += [f"  offline {rel(a)} .. {rel(b)}" + (" (every device)" if key == ALL else "")
                for key in (subject, ALL) for a, b in history.offline.get(key, ())][:lines]
        out += [f"  install {rel(entry[0])} {entry[1:]}" for entry in history.install_log.get(subject, [])[-lines:]]
        out += [f"  target {rid}: {' -> '.join(s)}" for (rid, d), s in history.target_statuses.items() if d == subject]
        out += [f"  server lists {history.server_view.get(subject)} in group {history.server_groups.get(subject)!r}; "
                f"device runs {history.final.get(subject)!r}; run ended {rel(history.ended)}"]
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


def fault_effects(history: History) -> list[dict[str, Any]]:
    """For each fault of the run: whether it took effect (not only whether it was scheduled), and the evidence,
    from the devices' own logs and counters where they can tell: a crash is a device that went down mid-install
    (an install after the crash was armed, and the fleet's crash counter), a corrupt chunk one a device refused (a
    download after it was armed, and the fleet's rejected-chunk counter), a device offline at a push one whose
    target was deferred, a kill meant for the lease holder one that hit it while its rollout ran."""
    return [{"kind": f["kind"], "when": f.get("at_s", f"step {f.get('step')}"), **_effect(history, f)}
            for f in history.faults]


def _effect(h: History, f: dict[str, Any]) -> dict[str, Any]:
    kind, ids = f["kind"], f.get("ids", [])
    if "error" in f or "applied_at" not in f:
        return {"effective": False, "evidence": f"not applied: {f.get('error', 'the run never reached it')}"}
    reached = f.get("reached", 0) == len(ids) > 0
    if kind == "kill_replica":
        hit = f.get("hit_holder")
        return {"effective": bool(hit) or not f.get("must_hit_holder"),
                "evidence": f"killed {f.get('killed')}" + (f", lease holder of running rollout {hit}" if hit else
                                                           ", no running rollout's lease holder")}
    if kind in ("broker_restart", "pg_restart", "clock_skew"):
        return {"effective": "done_s" in f, "evidence": f"restarted after {f.get('down_s')} s down"}
    if kind == "crash":
        hit = [d for d in ids if any(entry[0] > f["applied_at"] for entry in h.install_log.get(d, ()))]
        crashes = h.sim_counts.get("crashes", 0)
        return {"effective": bool(hit) and crashes >= 1,
                "evidence": f"{len(hit)} of {len(ids)} went down mid-install (the fleet counted {crashes} crashes)"}
    if kind == "corrupt":
        hit = [d for d in ids if _downloaded_after(h, d, f["applied_at"])]
        rejected = h.sim_counts.get("chunks_rejected", 0)
        return {"effective": bool(hit) and rejected >= 1,
                "evidence": f"{len(hit)} of {len(ids)} fetched an archive after (the fleet refused {rejected} chunks)"}
    if kind == "offline_at_push":
        r = h.rollouts.get(f.get("rollout_id", ""))
        late = {t.device_id for t in r.targets if t.late} if r is not None else set()
        hit = [d for d in ids if d in late or "deferred" in h.target_statuses.get((f.get("rollout_id", ""), d), ())]
        return {"effective": reached and bool(hit),
                "evidence": f"{len(hit)} of {len(ids)} deferred or sent late by rollout {f.get('rollout_id')}"}
    if kind == "join":
        return {"effective": f.get("joined", 0) == f.get("devices", 0) > 0,
                "evidence": f"{f.get('joined', 0)} of {f.get('devices')} new devices came online"}
    if kind == "claim_group":
        refused = f.get("refused_states", 0)
        return {"effective": reached and refused >= 1 and str(f.get("push", "")).startswith("refused"),
                "evidence": f"{refused:g} states refused; a push to {f.get('params', {}).get('group')!r}: "
                            f"{f.get('push')}"}
    return {"effective": reached, "evidence": f"reached {f.get('reached', 0)} of {len(ids)} devices"}


def _downloaded_after(h: History, device: str, since: float) -> bool:
    """True when ``device`` installed, after ``since``, a version it had never held (so it fetched its chunks)."""
    held = {h.initial_version}
    for at, _, version, _, _ in h.install_log.get(device, ()):
        if at > since and version not in held:
            return True
        held.add(version)
    return False
