"""``edgesdk devices`` (list, ``provision``) and ``edgesdk groups``: where devices belong and how far each group is
from its release.

The devices file (one ``DEVICE_ID GROUP`` per line, ``#`` comments) is read by :func:`read_devices_file` for
``devices provision --file``, ``server --devices`` and ``server mosquitto-config --devices`` alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from edgesdk.cli.fleet import admin_client, json_option, server_option, table, token_file_option, token_option
from edgesdk.fleet.records import iso_time

__all__ = ["devices", "groups", "read_devices_file"]


def read_devices_file(path: str | Path, option: str = "--devices") -> dict[str, str]:
    """Device id -> group from a devices file: one ``DEVICE_ID GROUP`` per line; blank lines and ``#`` comments
    are skipped. A malformed line, an unsafe id or a device listed in two groups is a
    :class:`click.BadParameter` naming ``option`` and the file's line."""
    from edgesdk.errors import EdgeSDKError
    from edgesdk.fleet.protocol import check_id

    found: dict[str, str] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        parts = line.split("#", 1)[0].split()  # ids never hold '#': the rest of a line after one is a comment
        if not parts:
            continue
        where = f"{path}:{number}"
        if len(parts) != 2:
            raise click.BadParameter(f"{where}: expected 'DEVICE_ID GROUP', got {line!r}", param_hint=option)
        device, group = parts
        try:
            check_id(device, "device id")
            check_id(group, "group")
        except EdgeSDKError as exc:
            raise click.BadParameter(f"{where}: {exc}", param_hint=option) from None
        if found.get(device, group) != group:
            raise click.BadParameter(f"{where}: device {device} is in group {found[device]} on an earlier line and "
                                     f"in {group} here; a device belongs to one group", param_hint=option)
        found[device] = group
    if not found:
        raise click.BadParameter(f"{path} lists no device; write one 'DEVICE_ID GROUP' per line", param_hint=option)
    return found


@click.group(invoke_without_command=True)
@click.option("--group", default=None, help="Only the devices of this group.")
@click.option("--status", "device_status", type=click.Choice(["online", "offline"]), default=None,
              help="Only devices in this status.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True, help="Devices per page.")
@click.option("--after", metavar="DEVICE", default=None, help="Start after this device id (the next page).")
@server_option
@token_option
@token_file_option
@json_option
@click.pass_context
def devices(ctx: click.Context, group: str | None, device_status: str | None, limit: int, after: str | None,
            server_url: str, token: str | None, token_file: str | None, as_json: bool) -> None:
    """List devices with their status, board (profile and CPU arch) and installed version, a page at a time (by id);
    `devices provision` puts
    devices in groups."""
    if ctx.invoked_subcommand is not None:
        return
    page = admin_client(server_url, token, token_file).device_page(group, status=device_status, after=after, limit=limit)
    if as_json:
        click.echo(json.dumps({"devices": [d.to_json() for d in page.devices], "total": page.total, "next": page.next},
                              indent=2))
        return
    if not page.devices:
        click.echo("no devices" + (f" in group {group}" if group else "") + " have reported yet"
                   + (f" after {after}" if after else ""))
        return
    click.echo(table(("device", "group", "status", "board", "arch", "model", "version", "last seen"),
                      [(d.id, d.group, d.status, d.profile or "unknown", d.arch or "unknown", d.model or "none",
                        d.version or "none", iso_time(d.last_seen))
                       for d in page.devices]))
    if page.next is not None:
        click.echo(f"showing {len(page.devices)} of {page.total} devices; the next page: --after {page.next}")


@devices.command("provision")
@click.argument("device_id", required=False)
@click.argument("group", required=False)
@click.option("--file", "devices_file", type=click.Path(exists=True, dir_okay=False),
              help="A devices file: one 'DEVICE_ID GROUP' per line (the one `server mosquitto-config` reads).")
@server_option
@token_option
@token_file_option
@json_option
def provision(device_id: str | None, group: str | None, devices_file: str | None, server_url: str, token: str | None,
              token_file: str | None, as_json: bool) -> None:
    """Put DEVICE_ID in GROUP, or every device of --file in its group. A device's reports must name the group it is
    provisioned in (its agent's --group): the server refuses them otherwise. A device that moves gets its new group's
    release once it reports the new group."""
    if devices_file and (device_id or group):
        raise click.UsageError("give DEVICE_ID GROUP or --file FILE, not both")
    if not devices_file and not (device_id and group):
        raise click.UsageError("give DEVICE_ID GROUP, or --file FILE with one 'DEVICE_ID GROUP' per line")
    client = admin_client(server_url, token, token_file)
    if devices_file:
        wanted = read_devices_file(devices_file, "--file")
        moved = client.provision(wanted, "devices file")
    else:
        assert device_id and group
        wanted = {device_id: group}
        moved = [device_id] if client.set_group(device_id, group) else []
    if as_json:
        click.echo(json.dumps({"provisioned": len(wanted), "moved": moved}, indent=2))
        return
    click.echo(f"provisioned {len(wanted)} device{'s' if len(wanted) != 1 else ''}"
               + (f"; moved to another group: {', '.join(f'{d} -> {wanted[d]}' for d in moved)}" if moved else ""))
    if moved:
        click.echo("restart each moved device's agent with its new --group: the server refuses reports that name "
                   "the old one", err=True)


@devices.command("provisioned")
@click.option("--group", default=None, help="Only this group's devices.")
@server_option
@token_option
@token_file_option
@json_option
def provisioned(group: str | None, server_url: str, token: str | None, token_file: str | None, as_json: bool) -> None:
    """List the group each device is provisioned in, where that came from (devices file, admin api, or its first
    report) and when."""
    rows = admin_client(server_url, token, token_file).provisioning(group)
    if as_json:
        click.echo(json.dumps([{"device_id": p.device_id, "group": p.group, "source": p.source,
                                "updated": iso_time(p.updated)} for p in rows], indent=2))
        return
    if not rows:
        click.echo("no device is provisioned" + (f" in group {group}" if group else "") + " yet")
        return
    click.echo(table(("device", "group", "source", "updated"),
                      [(p.device_id, p.group, p.source, iso_time(p.updated)) for p in rows]))


@click.command()
@server_option
@token_option
@token_file_option
@json_option
def groups(server_url: str, token: str | None, token_file: str | None, as_json: bool) -> None:
    """Show each group's release (the version its devices should run), how many devices run it, how many are behind
    (online: being caught up; offline: when they report), the rollout running now and whether the release is
    flagged."""
    found = admin_client(server_url, token, token_file).groups()
    if as_json:
        click.echo(json.dumps([g.to_json() for g in found], indent=2))
        return
    if not found:
        click.echo("no groups yet: no device has reported and nothing was pushed")
        return
    click.echo(table(("group", "release", "devices", "converged", "behind online", "behind offline", "running",
                       "since"),
                      [(g.group, f"{g.model} {g.version}" if g.model else "none", str(g.devices), str(g.converged),
                        str(g.behind_online), str(g.behind_offline), g.running or "",
                        iso_time(g.since) if g.since is not None else "") for g in found]))
    for g in found:
        if g.model and g.boards:
            per_board = "; ".join(
                f"{b['profile'] or 'unknown board'} ({b['arch'] or '?'}): "
                + (f"{b['artifact']} bundle, {b['converged']}/{b['devices']} on it" if b["artifact"]
                   else f"no bundle, {b['devices']} left on their version") for b in g.boards)
            click.echo(f"{g.group} {g.model} {g.version} per board: {per_board}")
    for g in found:
        if g.flagged:
            click.echo(f"FLAGGED {g.group} ({g.model} {g.version}, rollout {g.rollout_id}): {g.flagged}")
