"""Applying a profile's power mode on the board: cpufreq governor, clock cap and online cores, or ``nvpmodel``.

A bundle records the runtime mode the converter planned for (``manifest.power_mode``) and the
profile names the board power state that serves it (:meth:`DeviceProfile.power_mode_for`). The
plan's latency and energy hold only when the board is in that state. :func:`apply_power_mode`
puts it there where this process is permitted to:

* a mode with an ``nvpmodel`` id (Jetson) runs ``nvpmodel -m <id>``; nvpmodel then sets the CPU
  clocks, the online cores and the GPU itself, so no cpufreq file is written besides the
  ``governor`` when the mode names one;
* any other mode writes, below ``sysfs_root``: ``devices/system/cpu/cpuN/online`` (the first
  ``online_cores`` cores of the mode's clusters on, the rest off; a core without an ``online``
  file, such as cpu0 on most boards, is left alone when it should stay on), then per cpufreq
  policy of those clusters (``devices/system/cpu/cpufreq/policyN``, matched by its
  ``related_cpus``) ``scaling_governor`` and ``scaling_max_freq`` (the mode's ``max_mhz``, else
  the cluster's top clock ``cpuinfo_max_freq``). Files that already hold the value are not
  written.

Every file is checked before anything is written: a missing file, a file without a write bit (a
sysfs attribute the kernel does not let anyone write, root included), a read-only mount or a
file this user may not write (not root) leaves the board as it was. Then, and when nvpmodel is
missing or fails, the result says ``applied=False`` with the reason, and the commands that
apply the mode by hand (``echo performance | sudo tee .../scaling_governor``, ``sudo nvpmodel -m 1``)
are logged once per process as a warning (logger ``edgesdk.runtime.power_modes``).

Stdlib only: this runs on the device.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesdk.runtime.profiles import DeviceProfile, PowerMode, RuntimeMode

__all__ = ["PowerModeResult", "apply_power_mode", "resolve_power_mode"]

log = logging.getLogger(__name__)

#: What has been logged already (the commands of a mode are logged once per process).
_told: set[tuple[str, ...]] = set()
_NVPMODEL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class PowerModeResult:
    """What :func:`apply_power_mode` did: whether the board is in the mode now, what it set, or why not."""

    profile: str
    #: The profile's power mode asked for; None when the profile declares none for the runtime mode.
    power_mode: str | None
    applied: bool
    #: Every value the mode asks for, ``{path or "nvpmodel": value}`` (all in effect when ``applied``).
    settings: dict[str, str] = field(default_factory=dict)
    #: The paths written (or ``nvpmodel`` run) by this call; settings already in effect are not rewritten.
    changed: tuple[str, ...] = ()
    #: Shell commands that apply the mode by hand (as root), in order.
    commands: tuple[str, ...] = ()
    #: Why the mode is not applied (None when it is).
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The result for a state report or JSON: ``power_mode_applied`` and the details."""
        return {"power_mode_applied": self.applied, "power_mode": self.power_mode, "settings": dict(self.settings),
                "changed": list(self.changed), "commands": list(self.commands), "reason": self.reason}


@dataclass(frozen=True)
class _Write:
    path: Path
    value: str

    @property
    def command(self) -> str:
        return f"echo {self.value} | sudo tee {self.path}"


def resolve_power_mode(profile: DeviceProfile, mode: PowerMode | RuntimeMode | str | None) -> PowerMode | None:
    """The profile's power mode for ``mode``: a PowerMode as is, a power mode's name, or a runtime mode it serves."""
    if mode is None or isinstance(mode, PowerMode):
        return mode
    for pm in profile.power_modes:
        if pm.name == mode:
            return pm
    return profile.power_mode_for(mode)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _policies(cpu_dir: Path) -> dict[Path, frozenset[int]]:
    """cpufreq policy directories and the CPUs each drives (``related_cpus``, e.g. ``4 5``)."""
    found = {}
    for policy in sorted((cpu_dir / "cpufreq").glob("policy*")):
        cpus = _read(policy / "related_cpus") or _read(policy / "affected_cpus") or ""
        found[policy] = frozenset(int(c) for c in cpus.split() if c.isdigit())
    return found


def _sysfs_writes(profile: DeviceProfile, mode: PowerMode, cpu_dir: Path) -> tuple[list[_Write], list[str]]:
    """The writes that put the board in ``mode`` (in order), and what makes the mode impossible to set here."""
    problems: list[str] = []
    cores = sorted(core for name in mode.clusters for core in profile.cluster(name).cores)
    keep = set(cores[: mode.online_cores] if mode.online_cores is not None else cores)
    on: list[_Write] = []
    off: list[_Write] = []
    if mode.nvpmodel is None:
        for core in cores:
            path = cpu_dir / f"cpu{core}" / "online"
            if path.exists():
                (on if core in keep else off).append(_Write(path, "1" if core in keep else "0"))
            elif core not in keep:
                problems.append(f"{path} is missing, so cpu{core} cannot be taken offline")
    policies = _policies(cpu_dir)
    settings: list[_Write] = []
    for name in mode.clusters:
        cluster = profile.cluster(name)
        mine = [p for p, cpus in policies.items() if cpus & set(cluster.cores)]
        wants_clock = mode.nvpmodel is None
        if not mine and (mode.governor or wants_clock):
            problems.append(f"no cpufreq policy under {cpu_dir / 'cpufreq'} drives cluster {name!r} (cores "
                            f"{list(cluster.cores)}): the kernel has no cpufreq driver here, or sysfs is not mounted")
        for policy in mine:
            if mode.governor:
                available = (_read(policy / "scaling_available_governors") or mode.governor).split()
                if mode.governor not in available:
                    problems.append(f"governor {mode.governor!r} is not offered by {policy} (it offers {available})")
                settings.append(_Write(policy / "scaling_governor", mode.governor))
            if wants_clock:
                top = _read(policy / "cpuinfo_max_freq")
                khz = mode.max_mhz.get(name, cluster.max_mhz) * 1000
                if top and top.isdigit() and (name not in mode.max_mhz or khz >= int(top)):
                    khz = int(top)  # the cluster's top clock as this kernel spells it (1510400, not 1510000)
                settings.append(_Write(policy / "scaling_max_freq", str(khz)))
    return [*on, *settings, *off], problems


def _not_writable(path: Path) -> str | None:
    """Why this process cannot write ``path``, or None when it can."""
    try:
        st = path.stat()
    except OSError as exc:
        return f"{path} is missing ({exc.strerror})"
    if not st.st_mode & 0o222:
        return f"{path} is read-only (mode {st.st_mode & 0o777:o}: the kernel lets no one write it)"
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        return f"{path} is on a read-only mount"
    if not os.access(path, os.W_OK):
        return f"{path} is not writable by this user (uid {os.geteuid()}); run as root or apply the commands below"
    return None


def _not_applied(profile: DeviceProfile, mode: PowerMode | None, reason: str, commands: list[str],
                 settings: dict[str, str] | None = None, changed: tuple[str, ...] = ()) -> PowerModeResult:
    name = mode.name if mode else None
    key = (profile.name, str(name), reason, *commands)
    if key not in _told:
        _told.add(key)
        how = ("; apply it by hand:\n  " + "\n  ".join(commands)) if commands else ""
        log.warning("power mode %s of profile %s not applied: %s%s", name, profile.name, reason, how)
    return PowerModeResult(profile.name, name, False, settings or {}, changed, tuple(commands), reason)


def _run_nvpmodel(binary: str, mode_id: int) -> str | None:
    """Run ``nvpmodel -m`` (stdin closed: a reboot prompt is answered by nobody); the failure, or None."""
    try:
        done = subprocess.run([binary, "-m", str(mode_id)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=_NVPMODEL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} -m {mode_id} failed: {exc}"
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout or "").split())[-300:]
        return f"{binary} -m {mode_id} exited {done.returncode}: {said or 'no output'}"
    return None


def apply_power_mode(profile: DeviceProfile, mode: PowerMode | RuntimeMode | str | None, sysfs_root: str = "/sys",
                     nvpmodel: str = "nvpmodel") -> PowerModeResult:
    """Put the board in the profile's power mode ``mode`` where permitted (see the module doc); never raises for that.

    ``mode`` is a :class:`PowerMode`, a power mode's name, or a runtime mode (``"power"``) whose
    serving mode is taken. ``sysfs_root`` is where sysfs is (tests pass a copy of a board's tree);
    ``nvpmodel`` the program run for a mode with an nvpmodel id (looked up on ``PATH``).
    """
    power_mode = resolve_power_mode(profile, mode)
    if power_mode is None:
        return _not_applied(profile, None, f"profile {profile.name!r} declares no power mode for {mode!r}", [])
    cpu_dir = Path(sysfs_root) / "devices" / "system" / "cpu"
    writes, problems = _sysfs_writes(profile, power_mode, cpu_dir)
    pending = [w for w in writes if _read(w.path) != w.value]
    settings = {str(w.path): w.value for w in writes}
    commands = [w.command for w in pending]
    if power_mode.nvpmodel is not None:
        settings["nvpmodel"] = str(power_mode.nvpmodel)
        commands.insert(0, f"sudo nvpmodel -m {power_mode.nvpmodel}")
    if problems:
        return _not_applied(profile, power_mode, "; ".join(problems), commands, settings)
    refusals = [why for w in pending if (why := _not_writable(w.path))]
    if refusals:
        return _not_applied(profile, power_mode, "; ".join(refusals), commands, settings)
    changed: list[str] = []
    if power_mode.nvpmodel is not None:
        binary = shutil.which(nvpmodel)
        if binary is None:
            return _not_applied(profile, power_mode, f"{nvpmodel} is not on PATH (not a Jetson, or L4T's nvpmodel "
                                f"package is not installed)", commands, settings)
        failure = _run_nvpmodel(binary, power_mode.nvpmodel)
        if failure:
            return _not_applied(profile, power_mode, failure, commands, settings)
        changed.append("nvpmodel")
    for i, write in enumerate(pending):
        try:
            write.path.write_text(write.value)
        except OSError as exc:
            return _not_applied(profile, power_mode, f"writing {write.value} to {write.path} failed: {exc.strerror}",
                                [w.command for w in pending[i:]], settings, tuple(changed))
        changed.append(str(write.path))
    log.info("power mode %s of profile %s applied: %s", power_mode.name, profile.name,
             ", ".join(f"{k}={v}" for k, v in settings.items()) or "nothing to set")
    return PowerModeResult(profile.name, power_mode.name, True, settings, tuple(changed))
