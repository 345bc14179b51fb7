"""``edgesdk profile list|show|detect``."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from edgesdk.runtime.profile_json import profile_to_dict
from edgesdk.runtime.profiles import DeviceProfile, list_profiles, load_profile

_dirs_option = click.option(
    "--profile-dir", "profile_dirs", multiple=True, type=click.Path(file_okay=False),
    help="Extra directory of profile YAML files (also: $EDGESDK_PROFILE_PATH).",
)


def _describe(profile: DeviceProfile) -> str:
    lines = [f"{profile.name}: {profile.description}", f"  arch {profile.arch}, RAM {profile.ram_mb} MiB, "
             f"model budget {profile.model_budget_mb} MiB", "  clusters:"]
    for c in profile.clusters:
        lines.append(f"    {c.name:<8} cores {list(c.cores)}  {c.microarchitecture} @ {c.max_mhz} MHz, capacity {c.capacity}")
    lines.append("  power modes:")
    for m in profile.power_modes:
        online = f", {m.online_cores} cores online" if m.online_cores else ""
        active = ", ".join(f"{unit} +{w:g} W" for unit, w in m.active_watts.items())
        lines.append(f"    {m.name:<12} idle {m.idle_watts:g} W, busy {active}; on {list(m.clusters)}{online}; "
                     f"serves {[s.value for s in m.serves]}")
    power = profile.power
    sensor = power.sensor
    lines.append(f"  power figures of the {power.scope}; sensor: "
                 + (f"{sensor.kind} ({sensor.scope}, {sensor.unit}) at {', '.join(sensor.paths)}" if sensor else "none")
                 + (f"; sleeps at {power.sleep_watts:g} W, a wake takes {power.resume_s:g} s and {power.resume_mj:g} mJ"
                    if power.sleep_watts is not None else "; no sleep state (idles between wakes)"))
    if profile.accelerators:
        lines.append("  accelerators:")
        for a in profile.accelerators:
            lines.append(f"    {a.name} ({a.kind.value}): LiteRT {list(a.litert_delegates)}, ORT {list(a.onnxruntime_providers)}")
    lines.append(f"  from {profile.origin}")
    return "\n".join(lines)


@click.group()
def profile() -> None:
    """List, show and detect device profiles."""


@profile.command("list")
@_dirs_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_command(profile_dirs: tuple[str, ...], as_json: bool) -> None:
    """List every known profile (shipped and user)."""
    profiles = list_profiles(profile_dirs)
    if as_json:
        click.echo(json.dumps([profile_to_dict(p) for p in profiles], indent=2))
        return
    for p in profiles:
        cores = "+".join(f"{len(c.cores)}x{c.microarchitecture}" for c in p.clusters)
        click.echo(f"{p.name:<20} {cores:<32} {p.ram_mb:>6} MiB  {p.description}")


@profile.command("show")
@click.argument("name")
@_dirs_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show_command(name: str, profile_dirs: tuple[str, ...], as_json: bool) -> None:
    """Show one profile by name or YAML path."""
    p = load_profile(name, profile_dirs)
    click.echo(json.dumps(profile_to_dict(p), indent=2) if as_json else _describe(p))


@profile.command("detect")
@click.option("--root", default="/", show_default=True, type=click.Path(file_okay=False, exists=True),
              help="Root of the /proc and /sys tree to read (a recorded tree in tests).")
@_dirs_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def detect_command(root: str, profile_dirs: tuple[str, ...], as_json: bool) -> None:
    """Detect this board and the profile edgesdk would use."""
    from edgesdk.runtime.detect import detect

    found = detect(root, profile_dirs)
    if as_json:
        topology = asdict(found.topology)
        click.echo(json.dumps({"topology": topology, "reason": found.reason, "profile": profile_to_dict(found.profile)},
                              indent=2))
        return
    t = found.topology
    click.echo(f"model: {t.model or '(no device tree)'}  arch: {t.arch}  cpus: {len(t.cpus)}  "
               f"RAM: {t.mem_total_mb} MiB")
    click.echo(f"profile: {found.profile.name} ({found.reason})")
    click.echo(_describe(found.profile))
