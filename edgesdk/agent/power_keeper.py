"""The agent's side of power modes: put the board in the mode of each bundle it installs, and report the outcome.

Opt-in (``AgentConfig.apply_power_mode``, ``edgesdk agent --apply-power-mode``): the agent owns
the device, so it may change the board's clocks and cores, but only when whoever set it up says
so. The mode applied is the one the installed bundle runs in: the bundle's planned runtime mode
(``manifest.power_mode``), or the mode an app's ManagedRuntime forces, served by the agent's
profile. The installer applies it after an install commits, after a rollback (for the bundle
restored) and on start (a reboot resets cpufreq and nvpmodel); see
:mod:`edgesdk.runtime.power_modes` for what is written and when it is not permitted.
"""

from __future__ import annotations

import os
from typing import Any

from edgesdk.runtime.bundle import read_bundle
from edgesdk.runtime.power_modes import PowerModeResult, apply_power_mode
from edgesdk.runtime.profiles import DeviceProfile

__all__ = ["PowerModeKeeper"]


class PowerModeKeeper:
    """Applies installed bundles' power modes on one board and keeps the last outcome for the device state."""

    def __init__(self, profile: DeviceProfile, sysfs_root: str = "/sys", nvpmodel: str = "nvpmodel") -> None:
        self.profile, self.sysfs_root, self.nvpmodel = profile, sysfs_root, nvpmodel
        #: The outcome of the latest :meth:`apply`, None before the first.
        self.last: PowerModeResult | None = None

    def apply(self, bundle_dir: str | os.PathLike[str], mode: str | None = None) -> PowerModeResult:
        """Put the board in the power mode serving ``mode`` (default: the bundle's planned mode) where permitted."""
        wanted = mode or read_bundle(bundle_dir, verify_model=False).manifest.power_mode
        self.last = apply_power_mode(self.profile, wanted, self.sysfs_root, self.nvpmodel)
        return self.last

    def report(self) -> dict[str, Any]:
        """The state fields: ``power_mode_applied`` (None before any install) and ``power_mode`` (name, settings,
        what changed, the commands to apply it by hand, and why it is not applied)."""
        if self.last is None:
            return {"power_mode_applied": None, "power_mode": {"reason": "no bundle installed yet"}}
        details = self.last.as_dict()
        applied = details.pop("power_mode_applied")
        details["name"] = details.pop("power_mode")
        return {"power_mode_applied": applied, "power_mode": details}
