"""``edgesdk push``, ``edgesdk rollout ...``, ``edgesdk devices``: the admin API from the shell."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from edgesdk.fleet.records import (
    RolloutPolicy,
    RolloutRecord,
    RolloutState,
    TargetStatus,
    iso_time,
    parse_duration,
    parse_percent,
)

if TYPE_CHECKING:
    from edgesdk.fleet.admin_client import AdminClient

_server = click.option("--server", "server_url", envvar="EDGESDK_SERVER", default="http://127.0.0.1:8080",
                       show_default=True, help="Admin API URL (env EDGESDK_SERVER).")
_token = click.option("--token", envvar="EDGESDK_TOKEN", help="Admin token (env EDGESDK_TOKEN).")
_token_file = click.option("--token-file", envvar="EDGESDK_TOKEN_FILE", type=click.Path(exists=True, dir_okay=False),
                           help="File with the token: `edgesdk server` writes admin.token beside its --db "
                                "(env EDGESDK_TOKEN_FILE).")
_json = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
_WAIT_OUTCOME = ("Wait up to this many seconds, showing progress; exit 0 only if every device updated "
                 "(17: aborted or failed, 18: still running).")


def admin_client(server_url: str, token: str | None, token_file: str | None) -> AdminClient:
    """The admin API client for --server and --token/--token-file (shared by the fleet commands and convert)."""
    from edgesdk.fleet.admin_client import AdminClient

    if not token and token_file:
        token = Path(token_file).read_text().strip()
    return AdminClient(server_url, token or "")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Left-aligned columns under ``header``."""
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in (header, *rows))


def _counts(r: RolloutRecord) -> str:
    """``committed 3, failed 1``: how many targets are in each status, in the order a device passes through them."""
    return ", ".join(f"{status} {r.counts[status]}" for status in TargetStatus if r.counts.get(status))


def _print_rollout(r: RolloutRecord, as_json: bool) -> None:
    """The rollout as the API's JSON, or as a summary line and a table of the devices it holds by stage."""
    if as_json:
        click.echo(json.dumps(r.to_json(), indent=2))
        return
    click.echo(f"rollout {r.id}: {r.model} {r.version} -> group {r.group}: {r.state}"
               f" (stage {r.stage + 1} of {r.stage_count})")
    if r.reason:
        click.echo(f"  reason: {r.reason}")
    click.echo(f"  devices: {_counts(r)}")
    if not r.targets:
        return
    click.echo(_table(("device", "stage", "status", "from", "reason"),
                      [(t.device_id, str(t.stage + 1), t.status, t.previous_version or "none", t.reason or "")
                       for t in r.targets]))
    if r.targets_total and r.targets_total > len(r.targets):
        click.echo(f"  showing {len(r.targets)} of {r.targets_total} devices; the next page: --after "
                   f"{r.targets[-1].device_id} (or --status STATUS, --json)")


def _outcome(r: RolloutRecord) -> None:
    """Raise unless the rollout completed with every device updated (the exit code scripts rely on)."""
    from edgesdk.errors import RolloutError, RolloutTimeoutError

    if r.state == RolloutState.RUNNING:
        raise RolloutTimeoutError(f"rollout {r.id} is still running (stage {r.stage + 1} of {r.stage_count}: "
                                  f"{_counts(r)}); follow it with `edgesdk rollout status {r.id} --follow`")
    updated = r.count(TargetStatus.COMMITTED, TargetStatus.REVERTED)
    if r.state != RolloutState.COMPLETED or updated != r.targets_total:
        raise RolloutError(f"rollout {r.id} {r.state}: {r.reason or _counts(r)}")


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
    """A rollout is over when it left ``running`` and no device is still being reverted."""
    return r.state != RolloutState.RUNNING and not r.count(TargetStatus.REVERTING)


def _follow(client: AdminClient, rollout_id: str, timeout: float | None) -> RolloutRecord:
    """Poll the counts until the rollout is over (or ``timeout`` s pass), printing progress lines to stderr when they
    change; the final state comes with the first page of targets."""
    started = time.monotonic()
    last = ""
    while True:
        r = client.rollout(rollout_id, limit=0)
        line = f"{r.state} stage {max(r.stage, 0) + 1} of {r.stage_count}: {_counts(r)}"
        if line != last:
            click.echo(f"[{time.monotonic() - started:6.1f}s] {line}", err=True)
            last = line
        if _settled(r) or (timeout is not None and time.monotonic() - started >= timeout):
            return client.rollout(rollout_id)
        time.sleep(0.5)


def _finish(client: AdminClient, rollout_id: str, timeout: float | None, as_json: bool, aborted_on_purpose: bool = False) -> None:
    """Follow a rollout, print its final state (JSON on stdout with ``as_json``), then raise unless it succeeded."""
    r = _follow(client, rollout_id, timeout)
    _print_rollout(r, as_json)
    if aborted_on_purpose:
        _reverts_outcome(r)
    else:
        _outcome(r)


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--group", required=True)
@click.option("--canary", default="10%", show_default=True, help="First stage, as a share of the group.")
@click.option("--waves", default=None,
              help="The later stages after the canary: increasing cumulative percentages ending at 100 "
                   "[default: 50,100, or those of them above --canary].")
@click.option("--health-window", default="60s", show_default=True, help="Wait after each stage before the next.")
@click.option("--max-failure-rate", default="5%", show_default=True, help="Abort and roll back above this.")
@click.option("--deploy-timeout", default="300s", show_default=True, help="A silent device counts as failed after it.")
@click.option("--manual", is_flag=True, help="Wait for `edgesdk rollout promote` between stages.")
@click.option("--wait", "wait_s", type=float, default=None, help=_WAIT_OUTCOME)
@_server
@_token
@_token_file
@_json
def push(bundle: str, group: str, canary: str, waves: str | None, health_window: str, max_failure_rate: str,
         deploy_timeout: str, manual: bool, wait_s: float | None, server_url: str, token: str | None,
         token_file: str | None, as_json: bool) -> None:
    """Upload BUNDLE (unless the identical bundle is stored) and start a rollout of it to GROUP."""
    from edgesdk.fleet.protocol import pack_bundle
    from edgesdk.runtime.bundle import read_bundle

    first = parse_percent(canary)
    stages = tuple(parse_percent(w) for w in waves.split(",")) if waves else tuple(w for w in (0.5, 1.0) if w > first)
    policy = RolloutPolicy(canary=first, waves=stages,
                           health_window_s=parse_duration(health_window),
                           max_failure_rate=parse_percent(max_failure_rate),
                           deploy_timeout_s=parse_duration(deploy_timeout), auto_promote=not manual)
    manifest = read_bundle(bundle).manifest
    client = admin_client(server_url, token, token_file)
    stored = client.upload(pack_bundle(bundle))["stored"]
    click.echo(f"{'uploaded' if stored else 'already stored:'} {manifest.name} {manifest.version}", err=True)
    rollout_id = client.start_rollout(manifest.name, manifest.version, group, policy)
    if wait_s is None:
        click.echo(json.dumps({"id": rollout_id}) if as_json else f"started rollout {rollout_id}")
        return
    click.echo(f"started rollout {rollout_id}", err=True)
    _finish(client, rollout_id, wait_s, as_json)


@click.group()
def rollout() -> None:
    """Inspect and steer rollouts."""


@rollout.command("status")
@click.argument("rollout_id", required=False)
@click.option("--follow", is_flag=True, help="Show progress until the rollout ends; exit as `push --wait` does.")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Devices to show (a page; the server's default page without it, 0 for the counts alone).")
@click.option("--after", metavar="DEVICE", default=None, help="Show the devices after this id (the next page).")
@click.option("--status", "target_status", type=click.Choice([s.value for s in TargetStatus]), default=None,
              help="Show only the devices in this status.")
@_server
@_token
@_token_file
@_json
def status(rollout_id: str | None, follow: bool, limit: int | None, after: str | None, target_status: str | None,
           server_url: str, token: str | None, token_file: str | None, as_json: bool) -> None:
    """Show one rollout with its counts and devices (a page at a time), or list all rollouts."""
    client = admin_client(server_url, token, token_file)
    if rollout_id and follow:
        _finish(client, rollout_id, None, as_json)
        return
    if rollout_id:
        _print_rollout(client.rollout(rollout_id, limit=limit, after=after, status=target_status), as_json)
        return
    if follow:
        raise click.UsageError("--follow needs a rollout ID")
    rows = client.rollouts()
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows], indent=2))
        return
    if not rows:
        click.echo("no rollouts yet")
        return
    click.echo(_table(("rollout", "model", "version", "group", "state", "started", "reason"),
                      [(r.id, r.model, r.version, r.group, r.state, iso_time(r.created), r.reason or "")
                       for r in rows]))


def _action(verb: str, wait_help: str) -> Callable[..., None]:
    """The command body of ``rollout promote|abort|rollback`` (click decorators are applied by the caller)."""

    @click.argument("rollout_id")
    @_server
    @_token
    @_token_file
    @click.option("--wait", "wait_s", type=float, default=None, help=wait_help)
    @_json
    def command(rollout_id: str, server_url: str, token: str | None, token_file: str | None, wait_s: float | None,
                as_json: bool, to: str | None = None) -> None:
        client = admin_client(server_url, token, token_file)
        target = client.act(rollout_id, verb, to)
        if as_json and wait_s is None:
            click.echo(json.dumps({"id": target}))
            return
        click.echo(f"{verb}: rollout {target}", err=as_json)
        if wait_s is not None:
            # An abort is what was asked for: its outcome is whether the updated devices went back.
            _finish(client, target, wait_s, as_json, aborted_on_purpose=verb == "abort")

    return command


rollout.command("promote", help="Send the next stage now.")(_action("promote", _WAIT_OUTCOME))
rollout.command("abort", help="Stop a rollout and roll its updated devices back.")(_action(
    "abort", "Wait up to this many seconds for the updated devices to go back; exit 0 when all did "
             "(17: a revert failed, 18: still reverting)."))
rollout.command("rollback", help="Roll the group back (to --to VERSION or each device's previous one).")(
    click.option("--to", default=None, help="Version to return to.")(_action("rollback", _WAIT_OUTCOME)))


@click.command()
@click.option("--group", default=None)
@click.option("--status", "device_status", type=click.Choice(["online", "offline"]), default=None,
              help="Only devices in this status.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True, help="Devices per page.")
@click.option("--after", metavar="DEVICE", default=None, help="Start after this device id (the next page).")
@_server
@_token
@_token_file
@_json
def devices(group: str | None, device_status: str | None, limit: int, after: str | None, server_url: str,
            token: str | None, token_file: str | None, as_json: bool) -> None:
    """List devices with their status and installed version, a page at a time (by id)."""
    page = admin_client(server_url, token, token_file).device_page(group, status=device_status, after=after, limit=limit)
    if as_json:
        click.echo(json.dumps({"devices": [d.to_json() for d in page.devices], "total": page.total, "next": page.next},
                              indent=2))
        return
    if not page.devices:
        click.echo("no devices" + (f" in group {group}" if group else "") + " have reported yet"
                   + (f" after {after}" if after else ""))
        return
    click.echo(_table(("device", "group", "status", "model", "version", "last seen"),
                      [(d.id, d.group, d.status, d.model or "none", d.version or "none", iso_time(d.last_seen))
                       for d in page.devices]))
    if page.next is not None:
        click.echo(f"showing {len(page.devices)} of {page.total} devices; the next page: --after {page.next}")
