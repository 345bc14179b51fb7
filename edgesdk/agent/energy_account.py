"""The running model's energy per inference, from the board's power sensor, for the agent's retained state.

The sensor is sampled in the background (a bounded :class:`~edgesdk.runtime.energy.Sampler`). Each
:meth:`EnergyAccount.report` covers the window since the previous one: its average power,
the inferences the runtime ran in it, and

    energy per inference = (E_window − P_idle × T_window) / inferences

``P_idle`` is measured on the board itself where it can be: the median average power of
the recent windows in which the runtime ran nothing (``idle_basis: "measured"``). Until
there is such a window it is the profile's idle power for the runtime's power mode
(``"profile"``), and the scopes may differ (a module sensor against a board figure), which
the report says.
"""

from __future__ import annotations

import collections
import logging
import statistics
from typing import Any

from edgesdk.errors import SensorError
from edgesdk.runtime.energy import PowerSensor, Sampler, find_sensor
from edgesdk.runtime.profiles import DeviceProfile

__all__ = ["EnergyAccount", "NoEnergy", "runtime_energy"]

log = logging.getLogger(__name__)

#: Idle windows whose average power is kept for the idle estimate.
_IDLE_WINDOWS = 8


class EnergyAccount:
    """Energy per inference of one runtime, window by window (see the module doc)."""

    def __init__(self, sensor: PowerSensor, profile_idle_watts: float | None, interval_s: float = 0.05,
                 max_samples: int = 20_000) -> None:
        self.sensor, self.profile_idle_watts = sensor, profile_idle_watts
        self._sampler = Sampler(sensor, interval_s, max_samples).start()
        self._since = self._sampler.sample_now()
        self._inferences: int | None = None
        self._idle: collections.deque[float] = collections.deque(maxlen=_IDLE_WINDOWS)

    def report(self, inferences_total: int) -> dict[str, Any]:
        """The window since the last report; ``inferences_total`` is the runtime's call count so far."""
        try:
            now = self._sampler.sample_now()
        except SensorError as exc:
            return {"sensor": self.sensor.kind, "scope": self.sensor.scope, "note": str(exc)}
        start, self._since = self._since, now
        previous, self._inferences = self._inferences, inferences_total
        base: dict[str, Any] = {"sensor": self.sensor.kind, "scope": self.sensor.scope}
        try:
            trace = self._sampler.trace()
            if len(trace.times_s) < 2:
                return {**base, "note": "the sensor has not been sampled long enough yet"}
            start = max(start, float(trace.times_s[0]))  # the oldest samples of a long window were let go
            window_j = trace.energy_j(start, now)
        except SensorError as exc:
            return {**base, "note": str(exc)}
        window_s = now - start
        ran = None if previous is None else inferences_total - previous
        average = window_j / max(window_s, 1e-9)
        if ran == 0:
            self._idle.append(average)
        if self._idle:
            idle, basis = statistics.median(self._idle), "measured"
        elif self.profile_idle_watts is not None:
            idle, basis = self.profile_idle_watts, "profile"
        else:
            idle, basis = None, None
        per_inference = None
        if ran and idle is not None:
            per_inference = (window_j - idle * window_s) / ran * 1e3
        return {**base, "window_s": round(window_s, 3), "avg_watts": round(average, 4), "inferences": ran,
                "idle_watts": None if idle is None else round(idle, 4), "idle_basis": basis,
                "energy_per_inference_mj": None if per_inference is None else round(per_inference, 4)}

    def close(self) -> None:
        """Stop sampling."""
        self._sampler.stop()


class NoEnergy:
    """What the state says where there is nothing to measure with: no runtime, or no readable sensor."""

    def __init__(self, note: str) -> None:
        self.note = note

    def report(self, inferences_total: int) -> dict[str, Any]:
        """``{"sensor": None, "note": ...}``."""
        return {"sensor": None, "note": self.note}

    def close(self) -> None:
        """Nothing to stop."""


def runtime_energy(profile: DeviceProfile, runtime: object | None, sysfs_root: str) -> EnergyAccount | NoEnergy:
    """The account of a runtime's energy on this board, or why there is none (a sensor that fails is logged)."""
    if runtime is None:
        return NoEnergy("no runtime to account for")
    try:
        sensor = find_sensor(profile, sysfs_root)
    except SensorError as exc:
        log.warning("energy not reported: %s", exc)
        return NoEnergy(str(exc))
    if sensor is None:
        return NoEnergy(f"no power sensor on {profile.name}")
    mode = getattr(runtime, "mode", None)  # a ManagedRuntime's fixed runtime mode, when it has one
    power_mode = profile.power_mode_for(mode) if mode else None
    idle = power_mode.idle_watts if power_mode else min((m.idle_watts for m in profile.power_modes), default=None)
    return EnergyAccount(sensor, idle)
