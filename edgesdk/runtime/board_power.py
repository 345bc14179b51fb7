"""A board's power facts besides its power modes: its power sensor and, for duty-cycled use, sleep and wake costs.

Part of a :class:`~edgesdk.runtime.profiles.DeviceProfile` (its ``power`` section); read by
:mod:`edgesdk.runtime.energy` (the sensor) and :mod:`edgesdk.converters.board.power` (sleep and wake).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgesdk.errors import ProfileError

__all__ = ["SENSOR_KINDS", "SENSOR_SCOPES", "PowerSensorSpec", "BoardPower"]

#: Power sensors :mod:`edgesdk.runtime.energy` reads: Jetson INA3221 (L4T 32 iio, JetPack 5/6 hwmon), the Pi 5's
#: PMIC ADC (``vcgencmd pmic_read_adc``), Intel RAPL (powercap) and a battery fuel gauge (power_supply).
SENSOR_KINDS = ("ina3221-iio", "ina3221-hwmon", "pmic-adc", "rapl", "power-supply")
#: What a sensor's reading covers: the whole board's input, a module's (SoM) input, or a CPU package.
SENSOR_SCOPES = ("board", "module", "package")


@dataclass(frozen=True)
class PowerSensorSpec:
    """The power sensor a board has: what kind, where it reads, what it covers, and its calibration.

    ``paths`` are glob patterns below the sysfs root (for ``pmic-adc``, the command run);
    ``unit`` is what the raw figure is in (``mW``, ``uJ``, ``uW``, ``mV*mA``, ``V*A``); watts
    reported = raw watts × ``scale`` + ``offset_watts`` (both 1 and 0 when nothing is published).
    """

    kind: str
    paths: tuple[str, ...]
    scope: str
    unit: str
    scale: float = 1.0
    offset_watts: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in SENSOR_KINDS:
            raise ProfileError(f"power sensor kind {self.kind!r} is not one of {list(SENSOR_KINDS)}")
        if self.scope not in SENSOR_SCOPES:
            raise ProfileError(f"power sensor scope {self.scope!r} is not one of {list(SENSOR_SCOPES)}")
        if not self.paths:
            raise ProfileError(f"power sensor {self.kind!r} lists no paths")
        if not self.scale > 0:
            raise ProfileError(f"power sensor {self.kind!r}: scale must be > 0, got {self.scale}")


@dataclass(frozen=True)
class BoardPower:
    """Board-wide power facts: the sensor (None: none known) and, for duty-cycled use, sleep and wake costs.

    ``sleep_watts`` is what the board draws between wakes (halted or suspended, None: it
    cannot sleep, so it idles); ``resume_s`` and ``resume_mj`` are one wake's time and
    energy until the model is ready again.
    """

    #: What the profile's watts are of: "board" (at its power input) or "module" (a SoM's input).
    scope: str = "board"
    sensor: PowerSensorSpec | None = None
    sleep_watts: float | None = None
    resume_s: float | None = None
    resume_mj: float | None = None

    def __post_init__(self) -> None:
        if self.scope not in SENSOR_SCOPES:
            raise ProfileError(f"power scope {self.scope!r} is not one of {list(SENSOR_SCOPES)}")
        for name in ("sleep_watts", "resume_s", "resume_mj"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ProfileError(f"power.{name} must be >= 0, got {value}")
        if (self.resume_s is None) != (self.resume_mj is None) or (self.sleep_watts is None) != (self.resume_s is None):
            raise ProfileError("power: give sleep_watts, resume_s and resume_mj together (a board that sleeps between "
                               "wakes), or none of them (it idles between wakes)")
