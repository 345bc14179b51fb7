"""``edgesdk push``, ``edgesdk rollout ...``, ``edgesdk devices``: the admin API from the shell."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

_server = click.option("--server", "server_url", envvar="EDGESDK_SERVER", default="http://127.0.0.1:8080",
                       show_default=True, help="Admin API URL (env EDGESDK_SERVER).")
_token = click.option("--token", envvar="EDGESDK_TOKEN", help="Admin token (env EDGESDK_TOKEN).")
_token_file = click.option("--token-file", type=click.Path(exists=True, dir_okay=False), help="File with the token.")
_json = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def admin_client(server_url: str, token: str | None, token_file: str | None) -> Any:
    """The admin API client for --server and --token/--token-file (shared by the fleet commands and convert)."""
    from edgesdk.admin_client import AdminClient

    if not token and token_file:
        token = Path(token_file).read_text().strip()
    return AdminClient(server_url, token or "")


def _print_rollout(r: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    counts: dict[str, int] = {}
    for t in r["targets"]:
        counts[t["status"]] = counts.get(t["status"], 0) + 1
    click.echo(f"rollout {r['id']}: {r['model']} {r['version']} -> group {r['grp']}: {r['state']}"
               f" (stage {r['wave'] + 1} of {max(t['wave'] for t in r['targets']) + 1})")
    if r["reason"]:
        click.echo(f"  reason: {r['reason']}")
    click.echo("  devices: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for t in r["targets"]:
        if t["reason"]:
            click.echo(f"  {t['device_id']}: {t['status']} — {t['reason']}")


def _wait(client: Any, rollout_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    r = client.rollout(rollout_id)
    while r["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
        r = client.rollout(rollout_id)
    return r


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--group", required=True)
@click.option("--canary", default="10%", show_default=True, help="First stage, as a share of the group.")
@click.option("--waves", default="50,100", show_default=True, help="Later stages, cumulative percentages.")
@click.option("--health-window", default="60s", show_default=True, help="Wait after each stage before the next.")
@click.option("--max-failure-rate", default="5%", show_default=True, help="Abort and roll back above this.")
@click.option("--deploy-timeout", default="300s", show_default=True, help="A silent device counts as failed after it.")
@click.option("--manual", is_flag=True, help="Wait for `edgesdk rollout promote` between stages.")
@click.option("--wait", "wait_s", type=float, default=None, help="Wait up to this many seconds for the outcome.")
@_server
@_token
@_token_file
@_json
def push(bundle: str, group: str, canary: str, waves: str, health_window: str, max_failure_rate: str,
         deploy_timeout: str, manual: bool, wait_s: float | None, server_url: str, token: str | None,
         token_file: str | None, as_json: bool) -> None:
    """Upload BUNDLE (if new) and start a rollout of it to GROUP."""
    from edgesdk.bundle import read_bundle
    from edgesdk.ota import pack_bundle
    from edgesdk.ota_server.rollout import RolloutPolicy, parse_duration, parse_percent

    policy = RolloutPolicy(canary=parse_percent(canary), waves=tuple(parse_percent(w) for w in waves.split(",")),
                           health_window_s=parse_duration(health_window),
                           max_failure_rate=parse_percent(max_failure_rate),
                           deploy_timeout_s=parse_duration(deploy_timeout), auto_promote=not manual)
    manifest = read_bundle(bundle).manifest
    client = admin_client(server_url, token, token_file)
    try:
        client.upload(pack_bundle(bundle))
    except Exception as exc:
        if "already in the repository" not in str(exc):
            raise
    rollout_id = client.start_rollout(manifest.name, manifest.version, group, policy.to_dict())
    if wait_s is None:
        click.echo(json.dumps({"id": rollout_id}) if as_json else f"started rollout {rollout_id}")
        return
    _print_rollout(_wait(client, rollout_id, wait_s), as_json)


@click.group()
def rollout() -> None:
    """Inspect and steer rollouts."""


@rollout.command("status")
@click.argument("rollout_id", required=False)
@_server
@_token
@_token_file
@_json
def status(rollout_id: str | None, server_url: str, token: str | None, token_file: str | None, as_json: bool) -> None:
    """Show one rollout with its devices, or list all rollouts."""
    client = admin_client(server_url, token, token_file)
    if rollout_id:
        _print_rollout(client.rollout(rollout_id), as_json)
        return
    rows = client.rollouts()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['id']}  {r['model']} {r['version']}  group {r['grp']}  {r['state']}  {r['reason'] or ''}")


def _action(verb: str) -> Any:
    @click.argument("rollout_id")
    @_server
    @_token
    @_token_file
    @click.option("--wait", "wait_s", type=float, default=None, help="Wait for the outcome (seconds).")
    def command(rollout_id: str, server_url: str, token: str | None, token_file: str | None, wait_s: float | None,
                to: str | None = None) -> None:
        client = admin_client(server_url, token, token_file)
        result = client.act(rollout_id, verb, to)
        target = result["id"]
        click.echo(f"{verb}: rollout {target}")
        if wait_s is not None:
            _print_rollout(_wait(client, target, wait_s), False)

    return command


rollout.command("promote", help="Send the next stage now.")(_action("promote"))
rollout.command("abort", help="Stop a rollout and roll its updated devices back.")(_action("abort"))
rollout.command("rollback", help="Roll the group back (to --to VERSION or each device's previous one).")(
    click.option("--to", default=None, help="Version to return to.")(_action("rollback")))


@click.command()
@click.option("--group", default=None)
@_server
@_token
@_token_file
@_json
def devices(group: str | None, server_url: str, token: str | None, token_file: str | None, as_json: bool) -> None:
    """List devices with their status and installed version."""
    rows = admin_client(server_url, token, token_file).devices(group)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for d in rows:
        click.echo(f"{d['id']:<16} {d['grp']:<12} {d['status']:<8} {d['model'] or '-'} {d['version'] or '-'}")
