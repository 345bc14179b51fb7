"""``edgesdk push`` and ``edgesdk rollout ...``: the admin API from the shell (``edgesdk devices`` and ``groups`` are
in :mod:`edgesdk.cli.devices`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgesdk.fleet.records import (
    GroupRelease,
    RolloutRecord,
    RolloutState,
    TargetStatus,
    iso_time,
    parse_duration,
)

if TYPE_CHECKING:
    from edgesdk.fleet.admin_client import AdminClient

server_option = click.option("--server", "server_url", envvar="EDGESDK_SERVER", default="http://127.0.0.1:8080",
                             show_default=True, help="Admin API URL (env EDGESDK_SERVER).")
token_option = click.option("--token", envvar="EDGESDK_TOKEN", help="Admin token (env EDGESDK_TOKEN).")
token_file_option = click.option("--token-file", envvar="EDGESDK_TOKEN_FILE",
                                 type=click.Path(exists=True, dir_okay=False),
                                 help="File with the token: `edgesdk server` writes admin.token beside its --db "
                                      "(env EDGESDK_TOKEN_FILE).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
_WAIT_OUTCOME = ("Wait up to this many seconds, showing progress; exit 0 only if every reachable device updated, "
                 "or a manual rollout's stage passed and it waits for `edgesdk rollout promote` (devices offline "
                 "are deferred: see --wait-deferred; 17: aborted or failed, 18: still running).")
_PROMOTE_WAIT = ("Wait up to this many seconds for the stage promote sent: exit 0 once it passed its health window "
                 "and canary analysis (the rollout waits for the next promote, or completed; 17: aborted or failed, "
                 "18: still running).")


def admin_client(server_url: str, token: str | None, token_file: str | None) -> AdminClient:
    """The admin API client for --server and --token/--token-file (shared by the fleet commands and convert)."""
    from edgesdk.fleet.admin_client import AdminClient

    if not token and token_file:
        token = Path(token_file).read_text().strip()
    return AdminClient(server_url, token or "")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Left-aligned columns under ``header``."""
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in (header, *rows))


def _counts(r: RolloutRecord) -> str:
    """``committed 3, failed 1``: how many targets are in each status, in the order a device passes through them."""
    return ", ".join(f"{status} {r.counts[status]}" for status in TargetStatus if r.counts.get(status))


def _late(r: RolloutRecord) -> str:
    """``sent 1, committed 2``: the late targets (sent after their stage) by status, or empty."""
    return ", ".join(f"{status} {r.late_counts[status]}" for status in TargetStatus if r.late_counts.get(status))


def _catching_up(r: RolloutRecord) -> tuple[int, int]:
    """Targets still to update after the rollout: deferred (their device is offline), and late ones queued or with
    a command out (pending, sent, downloading, installing)."""
    late = sum(n for status, n in r.late_counts.items() if status.in_flight or status is TargetStatus.PENDING)
    return r.deferred, late


def _print_rollout(r: RolloutRecord, as_json: bool, plan: list[dict[str, Any]] | None = None) -> None:
    """The rollout as the API's JSON (with the stage ``plan`` push was given), or as a summary line and a table of
    the devices it holds by stage."""
    if as_json:
        click.echo(json.dumps({**r.to_json(), **({"plan": plan} if plan else {})}, indent=2))
        return
    phase = f", {r.phase.replace('_', ' ')}" if r.phase != r.state else ""
    click.echo(f"rollout {r.id}: {r.model} {r.version} -> group {r.group}: {r.state}{phase}"
               f" (stage {r.stage + 1} of {r.stage_count})")
    if r.reason:
        click.echo(f"  reason: {r.reason}")
    if r.verdict:
        outcome = str(r.verdict.get("outcome") or ("passed" if r.verdict.get("passed") else "failed"))
        shown = outcome if outcome == "passed" else outcome.upper()
        click.echo(f"  canary analysis, stage {r.verdict.get('stage')}: {shown}: {r.verdict.get('reason')}")
    if r.phase == "waiting_for_promote":
        after = "complete it" if r.stage + 1 >= r.stage_count else f"send stage {r.stage + 2}"
        click.echo(f"  waiting for `edgesdk rollout promote {r.id}` to {after}")
    click.echo(f"  devices: {_counts(r)}")
    if r.deferred:
        click.echo(f"  deferred: {r.deferred} (offline when their stage went out; each gets {r.version} when it "
                   "reports again)")
    if r.late_counts:
        click.echo(f"  late: {_late(r)}")
    if r.flagged:
        click.echo(f"  FLAGGED: {r.flagged}")
    if not r.targets:
        return
    click.echo(table(("device", "stage", "status", "from", "reason"),
                     [(t.device_id, str(t.stage + 1), t.status + (" (late)" if t.late else ""),
                       t.previous_version or "none", t.reason or "") for t in r.targets]))
    if r.targets_total and r.targets_total > len(r.targets):
        click.echo(f"  showing {len(r.targets)} of {r.targets_total} devices; the next page: --after "
                   f"{r.targets[-1].device_id} (or --status STATUS, --json)")


def _superseded(client: AdminClient, r: RolloutRecord) -> GroupRelease | None:
    """The group's release when a later rollout set it: ``r``'s deferred devices get that one instead (the server
    no longer sends ``r``), so waiting for them on ``r`` is pointless. None while ``r`` is the release."""
    return next((g for g in client.groups() if g.group == r.group and g.rollout_id not in (None, r.id)), None)


def _outcome(r: RolloutRecord, wait_deferred: float | None = None, superseded: GroupRelease | None = None) -> None:
    """Raise unless the rollout completed with every reachable device updated (the exit code scripts rely on), and,
    with ``wait_deferred`` (s), every deferred and late device too, unless a later release ``superseded`` it; say on
    stderr how many are still to come."""
    from edgesdk.errors import RolloutError, RolloutInconclusiveError, RolloutTimeoutError

    if r.phase == "waiting_for_promote" and (r.verdict or {}).get("outcome") == "inconclusive":
        accept = "completes it" if r.stage + 1 >= r.stage_count else f"sends stage {r.stage + 2}"
        raise RolloutInconclusiveError(f"rollout {r.id} paused at stage {r.stage + 1} of {r.stage_count}: "
                                       f"{(r.verdict or {}).get('reason')}; `edgesdk rollout promote {r.id}` accepts "
                                       f"the release as it is and {accept}, `edgesdk rollout abort {r.id}` rolls it "
                                       "back")
    if r.phase == "waiting_for_promote":
        click.echo(f"rollout {r.id}: stage {r.stage + 1} of {r.stage_count} passed; it waits for `edgesdk rollout "
                   f"promote {r.id}` to send stage {r.stage + 2}", err=True)
        return
    if r.state == RolloutState.RUNNING:
        raise RolloutTimeoutError(f"rollout {r.id} is still running (stage {r.stage + 1} of {r.stage_count}: "
                                  f"{_counts(r)}); follow it with `edgesdk rollout status {r.id} --follow`")
    deferred, late = _catching_up(r)
    updated = r.count(TargetStatus.COMMITTED, TargetStatus.REVERTED)
    # No bundle for their board (reported by push), or a newer version than the release (ahead):
    # left on their version.
    unserved = r.count(TargetStatus.NO_ARTIFACT, TargetStatus.AHEAD)
    if r.state != RolloutState.COMPLETED or updated + deferred + late + unserved != r.targets_total:
        raise RolloutError(f"rollout {r.id} {r.state}: {r.reason or _counts(r)}")
    if not deferred and not late:
        return
    still = f"{deferred} deferred (offline)" + (f" and {late} catching up (late)" if late else "")
    if superseded is not None:
        click.echo(f"rollout {r.id} completed and was superseded: group {r.group}'s release is {superseded.model} "
                   f"{superseded.version} (rollout {superseded.rollout_id}); its {still} get that one instead "
                   f"(`edgesdk groups`)", err=True)
        return
    if wait_deferred is not None:
        raise RolloutTimeoutError(f"rollout {r.id} completed, but after {wait_deferred:g} s {still} have not "
                                  f"updated yet; they get {r.version} when they report: follow them with `edgesdk "
                                  f"rollout status {r.id} --follow --wait-deferred DURATION` or `edgesdk groups`")
    click.echo(f"rollout {r.id} completed: every reachable device updated; {still} get {r.version} when they "
               "report (--wait-deferred DURATION waits for them)", err=True)


def _reverts_outcome(r: RolloutRecord) -> None:
    """After an abort: raise while devices are still being reverted, or when a revert failed."""
    from edgesdk.errors import RolloutError, RolloutTimeoutError

    counts = _counts(r)
    if r.count(TargetStatus.REVERTING):
        raise RolloutTimeoutError(f"rollout {r.id} aborted, devices still reverting ({counts}); follow it with "
                                  f"`edgesdk rollout status {r.id}`")
    if r.count(TargetStatus.REVERT_FAILED):
        raise RolloutError(f"rollout {r.id} aborted and some devices could not be reverted ({counts}); "
                           f"roll them back with `edgesdk rollout rollback {r.id} --to VERSION`")


def _settled(r: RolloutRecord) -> bool:
    """A rollout is over when it left ``running``, no device is still being reverted and, once aborted, none is
    still installing: a canary device mid-health-check when another's failure aborted the rollout reports its own
    outcome seconds later, and the final state should show it."""
    return r.state != RolloutState.RUNNING and not r.count(TargetStatus.REVERTING) and not (
        r.state == RolloutState.ABORTED and r.count(TargetStatus.INSTALLING))


def _follow(client: AdminClient, rollout_id: str, timeout: float | None,
            wait_deferred: float | None = None, from_stage: int = 0) -> RolloutRecord:
    """Poll the counts until the rollout is over or waits for promote at stage ``from_stage`` (0-based) or later (or
    ``timeout`` s pass), printing progress lines to stderr when they change; with ``wait_deferred`` a completed
    rollout is followed on until no device is deferred or catching up, or that many seconds (from the start)
    passed. The final state comes with the first page of targets."""
    started = time.monotonic()
    last = ""
    while True:
        r = client.rollout(rollout_id, limit=0)
        line = f"{r.phase.replace('_', ' ')} stage {max(r.stage, 0) + 1} of {r.stage_count}: {_counts(r)}"
        line += f"; late: {_late(r)}" if r.late_counts else ""
        if line != last:
            click.echo(f"[{time.monotonic() - started:6.1f}s] {line}", err=True)
            last = line
        elapsed = time.monotonic() - started
        if r.phase == "waiting_for_promote" and r.stage >= from_stage:
            return client.rollout(rollout_id)
        if _settled(r):
            if wait_deferred is None or r.state != RolloutState.COMPLETED or not any(_catching_up(r)) \
                    or elapsed >= wait_deferred or _superseded(client, r):
                return client.rollout(rollout_id)
        elif timeout is not None and elapsed >= timeout:
            return client.rollout(rollout_id)
        time.sleep(0.5)


def _finish(client: AdminClient, rollout_id: str, timeout: float | None, as_json: bool, aborted_on_purpose: bool = False,
            wait_deferred: float | None = None, plan: list[dict[str, Any]] | None = None, from_stage: int = 0) -> None:
    """Follow a rollout, print its final state (JSON on stdout with ``as_json``), then raise unless it succeeded (a
    stage at or after ``from_stage`` that passed and waits for promote is a success)."""
    r = _follow(client, rollout_id, timeout if timeout is not None or aborted_on_purpose else wait_deferred,
                None if aborted_on_purpose else wait_deferred, from_stage)
    _print_rollout(r, as_json, plan)
    if aborted_on_purpose:
        _reverts_outcome(r)
        return
    waiting = r.state == RolloutState.COMPLETED and any(_catching_up(r))
    _outcome(r, wait_deferred, _superseded(client, r) if waiting else None)


def positive_seconds(text: str, option: str, example: str = "10m") -> float:
    """A duration option (``90s``, ``10m``, ``2h``) in seconds; a usage error naming ``option`` when it is not
    positive."""
    seconds = parse_duration(text)
    if seconds <= 0:
        raise click.BadParameter(f"{text!r} must be a positive duration, e.g. {example}", param_hint=option)
    return seconds


_WAIT_DEFERRED = ("Once the rollout completed, also wait for the devices that were offline (deferred) or joined "
                  "late to update, up to this long from the start (e.g. 10m); 18 if some still have not.")


@click.group()
def rollout() -> None:
    """Inspect and steer rollouts."""


@rollout.command("status")
@click.argument("rollout_id", required=False)
@click.option("--group", default=None,
              help="Without ROLLOUT_ID: list this group's rollouts, or with --follow follow its newest one.")
@click.option("--follow", is_flag=True, help="Show progress until the rollout ends; exit as `push --wait` does.")
@click.option("--wait-deferred", metavar="DURATION", default=None,
              help="With --follow: " + _WAIT_DEFERRED[0].lower() + _WAIT_DEFERRED[1:])
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Devices to show (a page; the server's default page without it, 0 for the counts alone).")
@click.option("--after", metavar="DEVICE", default=None, help="Show the devices after this id (the next page).")
@click.option("--status", "target_status", type=click.Choice([s.value for s in TargetStatus]), default=None,
              help="Show only the devices in this status.")
@server_option
@token_option
@token_file_option
@json_option
def status(rollout_id: str | None, group: str | None, follow: bool, wait_deferred: str | None, limit: int | None,
           after: str | None, target_status: str | None, server_url: str, token: str | None, token_file: str | None,
           as_json: bool) -> None:
    """Show one rollout with its counts and devices (a page at a time), or list all rollouts."""
    deferred_s = None if wait_deferred is None else positive_seconds(wait_deferred, "--wait-deferred")
    if deferred_s is not None and not follow:
        raise click.UsageError("--wait-deferred goes with --follow")
    if rollout_id and group:
        raise click.UsageError("give a ROLLOUT_ID or --group, not both")
    if follow and not rollout_id and not group:
        raise click.UsageError("--follow needs a rollout ID (or --group GROUP for the group's newest rollout)")
    client = admin_client(server_url, token, token_file)
    rows = client.rollouts() if not rollout_id else []
    if group:
        rows = [r for r in rows if r.group == group]
    if follow and not rollout_id:
        if not rows:
            from edgesdk.errors import NotFoundError

            raise NotFoundError(f"group {group} has no rollout yet; `edgesdk rollout status` lists them")
        rollout_id = rows[-1].id
    if rollout_id and follow:
        _finish(client, rollout_id, None, as_json, wait_deferred=deferred_s)
        return
    if rollout_id:
        _print_rollout(client.rollout(rollout_id, limit=limit, after=after, status=target_status), as_json)
        return
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows], indent=2))
        return
    if not rows:
        click.echo("no rollouts yet" + (f" in group {group}" if group else ""))
        return
    click.echo(table(("rollout", "model", "version", "group", "kind", "state", "started", "reason"),
                     [(r.id, r.model, r.version, r.group, "rollback" if r.rollback else "push", r.state,
                       iso_time(r.created), r.reason or "") for r in rows]))


def _action(verb: str, wait_help: str) -> Callable[..., None]:
    """The command body of ``rollout promote|abort|rollback`` (click decorators are applied by the caller)."""

    @click.argument("rollout_id")
    @server_option
    @token_option
    @token_file_option
    @click.option("--wait", "wait_s", type=float, default=None, help=wait_help)
    @json_option
    def command(rollout_id: str, server_url: str, token: str | None, token_file: str | None, wait_s: float | None,
                as_json: bool, to: str | None = None) -> None:
        client = admin_client(server_url, token, token_file)
        sent = client.rollout(rollout_id, limit=0).stage + 1 if verb == "promote" else 0  # the stage promote sends
        target = client.act(rollout_id, verb, to)
        if as_json and wait_s is None:
            click.echo(json.dumps({"id": target}))
            return
        click.echo(f"{verb}: rollout {target}", err=as_json)
        if wait_s is not None:
            # An abort is what was asked for: its outcome is whether the updated devices went back.
            _finish(client, target, wait_s, as_json, aborted_on_purpose=verb == "abort", from_stage=sent)

    return command


rollout.command("promote", help="Send the next stage now.")(_action("promote", _PROMOTE_WAIT))
rollout.command("abort", help="Stop a rollout and roll its updated devices back.")(_action(
    "abort", "Wait up to this many seconds for the updated devices to go back; exit 0 when all did "
             "(17: a revert failed, 18: still reverting)."))


@rollout.command("rollback")
@click.argument("rollout_id", required=False)
@click.option("--group", default=None,
              help="Without ROLLOUT_ID: roll this group back (its running rollout, aborted first, "
                   "else its release).")
@click.option("--to", default=None,
              help="Version to return to: one the group ran, older than what it runs now (default: "
                   "the most recent such version).")
@click.option("--all-at-once", is_flag=True,
              help="An emergency: send it to every device at once, without canary analysis "
                   "(default: staged with the rolled-back rollout's policy).")
@server_option
@token_option
@token_file_option
@click.option("--wait", "wait_s", type=float, default=None, help=_WAIT_OUTCOME)
@json_option
def rollback(rollout_id: str | None, group: str | None, to: str | None, all_at_once: bool,
             server_url: str, token: str | None, token_file: str | None, wait_s: float | None,
             as_json: bool) -> None:
    """Roll a rollout's group back, or with --group GROUP the group, to a version it ran before
    (--to VERSION, or the most recent one): the rollback is a new rollout, staged with the same
    policy and analysis unless --all-at-once. The server refuses a version the group never ran,
    the one it runs, or a newer one."""
    if bool(rollout_id) == bool(group):
        raise click.UsageError("give a ROLLOUT_ID or --group GROUP, not both" if rollout_id else
                               "give the ROLLOUT_ID to roll back, or --group GROUP to roll the group back to its "
                               "previous release (`edgesdk rollout status` lists the rollouts)")
    client = admin_client(server_url, token, token_file)
    target = (client.act(rollout_id, "rollback", to, all_at_once=all_at_once) if rollout_id
              else client.rollback_group(str(group), to, all_at_once=all_at_once))
    if as_json and wait_s is None:
        click.echo(json.dumps({"id": target}))
        return
    click.echo(f"rollback: rollout {target}", err=as_json)
    if wait_s is not None:
        _finish(client, target, wait_s, as_json)


@rollout.command("resume")
@click.argument("rollout_id")
@server_option
@token_option
@token_file_option
@json_option
def resume(rollout_id: str, server_url: str, token: str | None, token_file: str | None,
           as_json: bool) -> None:
    """Let a flagged release send itself to late devices again (a flag stops its catch-up); only
    late installs that fail from now on count towards a new flag."""
    flag = admin_client(server_url, token, token_file).resume(rollout_id)
    if as_json:
        click.echo(json.dumps({"id": rollout_id, "flag": flag}))
        return
    click.echo(f"resume: rollout {rollout_id}: catch-up goes on (it was flagged: {flag})")
