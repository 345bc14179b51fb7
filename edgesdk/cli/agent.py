"""``edgesdk agent``: run the device agent until interrupted."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click


@click.command()
@click.option("--device-id", required=True)
@click.option("--group", required=True)
@click.option("--broker", required=True, help="mqtt://HOST:PORT or mqtts://HOST:PORT")
@click.option("--store", type=click.Path(file_okay=False), required=True, help="Directory of the model store.")
@click.option("--server-key", type=click.Path(exists=True, dir_okay=False),
              help="The OTA server's Ed25519 public key (PEM); commands must be signed with it.")
@click.option("--root", type=click.Path(exists=True, dir_okay=False),
              help="The fleet's root of trust (root.json of `edgesdk keys init`), instead of --server-key: installed "
                   "into the store on the first start; later versions arrive over MQTT.")
@click.option("--credentials", type=click.Path(exists=True, dir_okay=False),
              help="JSON with username/password (from `edgesdk server mosquitto-config`).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA certificate for mqtts://.")
@click.option("--require-tls", is_flag=True, help="Refuse a plain mqtt:// broker (commands and credentials encrypted).")
@click.option("--profile", default=None,
              help="Device profile name or YAML path; models are served and measured under it (default: detect).")
@click.option("--keep-slots", type=click.IntRange(min=0), default=3, show_default=True, metavar="N",
              help="Installed versions to keep after each update besides those in use (current, previous) and pinned.")
@click.option("--pin", "pins", multiple=True, metavar="SLOT_OR_VERSION",
              help="Never delete this version: a slot name (digits-1.2.0) or a version (1.2.0). Repeatable.")
@click.option("--min-free", "min_free", type=click.IntRange(min=0), default=0, show_default=True, metavar="BYTES",
              help="Disk bytes to leave free for the rest of the device; an update that would not fit is refused.")
@click.option("--state-every", "state_every", type=click.FloatRange(min=0, min_open=True),
              default=300.0, show_default=True, metavar="S",
              help="Also publish the device's state (app traffic, runtime statistics, energy per "
                   "inference) every S seconds, besides on every change.")
@click.option("--traffic-every", "traffic_every",
              type=click.FloatRange(min=0, max=3600, min_open=True), default=10.0,
              show_default=True, metavar="S",
              help="While a rollout judges this device (after it commits a release that asks), "
                   "publish its state every S seconds instead, and have its apps hand over their "
                   "traffic as often.")
@click.option("--sysfs-root", default="/sys", show_default=True,
              help="Where sysfs is: the board's power sensor is read, and power modes written, below it.")
@click.option("--apply-power-mode", is_flag=True,
              help="Put the board in each installed bundle's power mode (cpufreq governor, clocks, online cores; "
                   "nvpmodel on a Jetson; needs root, else the commands are logged) and report power_mode_applied.")
@click.option("--allow-unsigned", is_flag=True, help="DEVELOPMENT ONLY: accept unsigned commands.")
def agent(device_id: str, group: str, broker: str, store: str, server_key: str | None, root: str | None,
          credentials: str | None, require_tls: bool,
          ca_file: str | None, profile: str | None, keep_slots: int, pins: tuple[str, ...], min_free: int,
          state_every: float, traffic_every: float, sysfs_root: str, apply_power_mode: bool,
          allow_unsigned: bool) -> None:
    """Keep this device's model up to date: verify, install, health-check, roll back, report."""
    from edgesdk.agent.agent import DeviceAgent
    from edgesdk.agent.config import AgentConfig
    from edgesdk.agent.managed import ManagedRuntime
    from edgesdk.errors import SignatureError
    from edgesdk.fleet.transport import load_credentials
    from edgesdk.logs import configure
    from edgesdk.runtime.signing import load_public_key

    configure(info_loggers=("edgesdk.agent",))  # the agent's log is the device's record of every install
    if server_key is None and root is None and not (Path(store) / "trust" / "root.json").exists() and not allow_unsigned:
        raise SignatureError("pass --root (the fleet's root.json) or --server-key (the OTA server's public key); "
                             "--allow-unsigned is for development")
    username, password = load_credentials(credentials, device_id) if credentials else (None, None)
    config = AgentConfig(device_id=device_id, group=group, broker=broker, store=Path(store),
                         server_key=load_public_key(server_key) if server_key else None, root=root,
                         allow_unsigned=allow_unsigned,
                         username=username, password=password, ca_file=ca_file, require_tls=require_tls,
                         profile=profile, keep_slots=keep_slots, pinned=pins, min_free_bytes=min_free,
                         state_interval_s=state_every, traffic_every_s=traffic_every,
                         sysfs_root=sysfs_root, apply_power_mode=apply_power_mode)
    runtime = ManagedRuntime(profile=profile)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    with DeviceAgent(config, runtime=runtime) as running:  # returns once the broker accepted everything
        click.echo(f"agent {device_id} ({group}) connected to {broker}; store {store}", err=True)
        while not done.wait(0.5):
            if running.refusal is not None:  # shut out on a reconnect: a supervisor should see the agent fail
                raise running.refusal
