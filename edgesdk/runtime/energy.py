"""Energy on the board: its power sensor found and read, sampled in the background, and integrated.

The sensors edgesdk reads (the kinds of :data:`edgesdk.runtime.profiles.SENSOR_KINDS`):

==================  ===========================================================  ==========================
kind                where (below the sysfs root)                                 reading
==================  ===========================================================  ==========================
``ina3221-hwmon``   ``bus/i2c/drivers/ina3221/*/hwmon/hwmon*/in<N>_input`` and    mV × mA (JetPack 5/6; the
                    ``curr<N>_input``, channel labelled ``VDD_IN``               module's input rail)
``ina3221-iio``     ``bus/i2c/drivers/ina3221x/*/iio:device*/in_power0_input``   mW (L4T 32, POM_5V_IN)
``rapl``            ``class/powercap/intel-rapl:0/energy_uj``                    µJ counter, wraps at
                                                                                 ``max_energy_range_uj``
``power-supply``    ``class/power_supply/<battery>/power_now`` (or               µW (µA × µV), while the
                    ``current_now`` × ``voltage_now``)                           battery discharges
``pmic-adc``        ``vcgencmd pmic_read_adc`` (Raspberry Pi 5)                  V × A summed over rails
==================  ===========================================================  ==========================

A profile's ``power.sensor`` says which one a board has (:func:`find_sensor` reads it there,
with the spec's ``scale`` and ``offset_watts`` applied); without one, the locations above
are probed in that order. Every path is below ``sysfs_root``, so tests feed recorded trees.

A :class:`Sampler` reads a sensor every ``interval_s`` in a thread; its :class:`Trace`
integrates power samples with the trapezoid rule (energy counters: the sum of successive
differences, with the counter's wrap added back). :func:`measure_energy` is what ``edgesdk
bench --energy`` runs: an idle baseline with the model loaded, then an active window, and

    E_inf = (E_window − P_idle × T_window) / N

the energy per inference above idle, in the sensor's scope (module, package or board).
"""

from __future__ import annotations

import abc
import collections
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import SensorError
from edgesdk.runtime.profiles import DeviceProfile, PowerSensorSpec

__all__ = ["PowerSensor", "find_sensor", "Trace", "Sampler", "EnergyResult", "measure_energy", "sensor_read_cost"]


def _read_number(path: Path) -> float:
    """A sysfs attribute as a number; a file that cannot be read is a SensorError saying what to do."""
    try:
        text = path.read_text(encoding="ascii")
    except PermissionError:
        raise SensorError(f"cannot read {path}: permission denied; run as root or make it readable (`chmod a+r "
                          f"{path}`; RAPL counters are root-only since Linux 5.10)") from None
    except OSError as exc:
        raise SensorError(f"cannot read {path}: {exc.strerror or exc}; the sensor went away or the path is "
                          "wrong") from None
    try:
        return float(text.strip())
    except ValueError:
        raise SensorError(f"{path} holds {text.strip()[:40]!r}, not a number") from None


class PowerSensor(abc.ABC):
    """One power sensor: :meth:`read` gives watts, or cumulative joules when :attr:`cumulative`."""

    kind: str = ""
    #: "board", "module" or "package": what the reading covers.
    scope: str = "board"
    #: Energy counters (RAPL) read joules so far; the others read watts now.
    cumulative: bool = False
    #: The counter's range in joules (it wraps to 0 past it); None for power sensors.
    wrap_j: float | None = None

    def __init__(self, scope: str, scale: float = 1.0, offset_watts: float = 0.0) -> None:
        self.scope, self.scale, self.offset_watts = scope, scale, offset_watts

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """What is read, and where."""

    @abc.abstractmethod
    def raw(self) -> float:
        """The reading in watts (or joules) before calibration."""

    def read(self) -> float:
        """Watts now (calibrated), or joules so far (scaled) for an energy counter."""
        value = self.raw()
        return value * self.scale if self.cumulative else value * self.scale + self.offset_watts


class _Ina3221Iio(PowerSensor):
    kind = "ina3221-iio"

    def __init__(self, path: Path, **calibration: Any) -> None:
        super().__init__(**calibration)
        self.path = path

    @property
    def description(self) -> str:
        return f"INA3221 rail {self.path.name} (mW) at {self.path}"

    def raw(self) -> float:
        return _read_number(self.path) / 1e3


class _Ina3221Hwmon(PowerSensor):
    kind = "ina3221-hwmon"

    def __init__(self, volts: Path, amps: Path, **calibration: Any) -> None:
        super().__init__(**calibration)
        self.volts, self.amps = volts, amps

    @property
    def description(self) -> str:
        label = self.volts.with_name(self.volts.name.replace("_input", "_label"))
        name = label.read_text().strip() if label.is_file() else self.volts.name
        return f"INA3221 channel {name} (mV x mA) at {self.volts.parent}"

    def raw(self) -> float:
        return _read_number(self.volts) * _read_number(self.amps) / 1e6


class _Rapl(PowerSensor):
    kind = "rapl"
    cumulative = True

    def __init__(self, path: Path, **calibration: Any) -> None:
        super().__init__(**calibration)
        self.path = path
        limit = path.with_name("max_energy_range_uj")
        self.wrap_j = _read_number(limit) / 1e6 * self.scale if limit.is_file() else None

    @property
    def description(self) -> str:
        return f"RAPL energy counter (uJ) at {self.path}"

    def raw(self) -> float:
        return _read_number(self.path) / 1e6


class _Battery(PowerSensor):
    kind = "power-supply"

    def __init__(self, directory: Path, **calibration: Any) -> None:
        super().__init__(**calibration)
        self.directory = directory

    @property
    def description(self) -> str:
        return f"battery fuel gauge at {self.directory}"

    def raw(self) -> float:
        power = self.directory / "power_now"
        if power.is_file():
            return _read_number(power) / 1e6
        return _read_number(self.directory / "current_now") * _read_number(self.directory / "voltage_now") / 1e12


_PMIC_LINE = re.compile(r"^\s*(\S+)_([AV])\s+(?:current|volt)\(\d+\)=([-+0-9.eE]+)[AV]\s*$")


def parse_pmic_adc(text: str) -> float:
    """Watts from ``vcgencmd pmic_read_adc`` output: V × A of every rail that has both (``EXT5V_V`` has no current)."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _PMIC_LINE.match(line)
        if match is None:
            raise SensorError(f"vcgencmd pmic_read_adc line {number} is not 'RAIL_A current(n)=xA' or "
                              f"'RAIL_V volt(n)=xV': {line.strip()[:80]!r}")
        rail, unit, value = match.groups()
        (amps if unit == "A" else volts)[rail] = float(value)
    rails = sorted(set(amps) & set(volts))
    if not rails:
        raise SensorError("vcgencmd pmic_read_adc listed no rail with both a current and a volt reading")
    return sum(amps[r] * volts[r] for r in rails)


class _Pmic(PowerSensor):
    kind = "pmic-adc"

    def __init__(self, command: list[str], **calibration: Any) -> None:
        super().__init__(**calibration)
        self.command = command

    @property
    def description(self) -> str:
        return f"Raspberry Pi 5 PMIC ADC, sum of rails ({' '.join(self.command)})"

    def raw(self) -> float:
        try:
            done = subprocess.run(self.command, capture_output=True, text=True, timeout=5, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SensorError(f"{' '.join(self.command)} failed: {exc}") from None
        if done.returncode != 0:
            raise SensorError(f"{' '.join(self.command)} exited {done.returncode}: {done.stderr.strip()[:200]}")
        return parse_pmic_adc(done.stdout)


def _first(root: Path, pattern: str) -> Path | None:
    found = sorted(root.glob(pattern))
    return found[0] if found else None


def _hwmon_channel(directory: Path) -> tuple[Path, Path] | None:
    """The channel labelled VDD_IN (the module's input), else channel 1."""
    for label in sorted(directory.glob("in*_label")):
        if label.read_text().strip() == "VDD_IN":
            n = label.name[2:-len("_label")]
            return directory / f"in{n}_input", directory / f"curr{n}_input"
    volts, amps = directory / "in1_input", directory / "curr1_input"
    return (volts, amps) if volts.is_file() and amps.is_file() else None


def _from_spec(spec: PowerSensorSpec, root: Path, vcgencmd: str) -> PowerSensor | None:
    calibration = {"scope": spec.scope, "scale": spec.scale, "offset_watts": spec.offset_watts}
    if spec.kind == "pmic-adc":
        command = spec.paths[0].split()
        if command and command[0] == "vcgencmd":
            command[0] = vcgencmd
        return _Pmic(command, **calibration) if command and shutil.which(command[0]) else None
    paths = [_first(root, p) for p in spec.paths]
    if any(p is None for p in paths):
        return None
    first = paths[0]
    assert first is not None
    if spec.kind == "ina3221-iio":
        return _Ina3221Iio(first, **calibration)
    if spec.kind == "ina3221-hwmon":
        amps = paths[1] if len(paths) > 1 else first.with_name(first.name.replace("in", "curr", 1))
        assert amps is not None
        return _Ina3221Hwmon(first, amps, **calibration)
    if spec.kind == "rapl":
        return _Rapl(first, **calibration)
    return _Battery(first if first.is_dir() else first.parent, **calibration)


def _probe(root: Path, vcgencmd: str) -> PowerSensor | None:
    for directory in sorted(root.glob("bus/i2c/drivers/ina3221/*/hwmon/hwmon*")):
        channel = _hwmon_channel(directory)
        if channel:
            return _Ina3221Hwmon(*channel, scope="module")
    iio = _first(root, "bus/i2c/drivers/ina3221x/*/iio:device*/in_power0_input")
    if iio is not None:
        return _Ina3221Iio(iio, scope="module")
    rapl = root / "class/powercap/intel-rapl:0/energy_uj"
    if rapl.is_file():
        return _Rapl(rapl, scope="package")
    for supply in sorted(root.glob("class/power_supply/*")):
        kind, status = supply / "type", supply / "status"
        if (kind.is_file() and kind.read_text().strip() == "Battery" and status.is_file()
                and status.read_text().strip() == "Discharging"):
            return _Battery(supply, scope="board")
    if shutil.which(vcgencmd):
        sensor = _Pmic([vcgencmd, "pmic_read_adc"], scope="module")
        try:
            sensor.raw()
        except SensorError:
            return None  # a vcgencmd without the PMIC command: a Pi before the 5
        return sensor
    return None


def find_sensor(profile: DeviceProfile | None = None, sysfs_root: str | os.PathLike[str] = "/sys",
                vcgencmd: str = "vcgencmd") -> PowerSensor | None:
    """The board's power sensor: the profile's ``power.sensor`` when it has one, else the first one probed.

    None when there is none (or the profile's is not on this board). A sensor that is
    there but cannot be read is a :class:`SensorError` naming the file and the fix.
    """
    root = Path(sysfs_root)
    spec = profile.power.sensor if profile is not None else None
    sensor = _from_spec(spec, root, vcgencmd) if spec is not None else _probe(root, vcgencmd)
    if sensor is not None:
        sensor.read()  # unreadable (permissions) fails here, not in the sampling thread
    return sensor


@dataclass(frozen=True, eq=False)
class Trace:
    """Samples of one sensor: times (monotonic s) and watts, or cumulative joules (:attr:`cumulative`)."""

    times_s: np.ndarray
    values: np.ndarray
    cumulative: bool = False
    #: A counter's range (it wraps to 0 past it); None: a counter that goes back is an error.
    wrap_j: float | None = None

    def _energy_curve(self) -> np.ndarray:
        """Joules from the first sample to each sample."""
        if self.cumulative:
            steps = np.diff(self.values)
            back = steps < 0
            if back.any():
                if self.wrap_j is None:
                    raise SensorError(f"the energy counter went back by {-steps[back].min():.3g} J with no known range "
                                      "to wrap at (max_energy_range_uj); the counter was reset")
                steps = np.where(back, steps + self.wrap_j, steps)
            return np.concatenate([[0.0], np.cumsum(steps)])
        widths = np.diff(self.times_s)
        return np.concatenate([[0.0], np.cumsum(widths * (self.values[1:] + self.values[:-1]) / 2)])

    def energy_j(self, start: float | None = None, end: float | None = None) -> float:
        """Joules between ``start`` and ``end`` (monotonic seconds; default the whole trace), interpolated at the ends."""
        if len(self.times_s) < 2:
            raise SensorError(f"{len(self.times_s)} sensor sample(s): too few to integrate; sample for longer")
        curve = self._energy_curve()
        lo = self.times_s[0] if start is None else start
        hi = self.times_s[-1] if end is None else end
        return float(np.interp(hi, self.times_s, curve) - np.interp(lo, self.times_s, curve))

    def mean_watts(self, start: float | None = None, end: float | None = None) -> float:
        """The average power between ``start`` and ``end``."""
        lo = self.times_s[0] if start is None else start
        hi = self.times_s[-1] if end is None else end
        return self.energy_j(lo, hi) / max(hi - lo, 1e-9)

    def median_watts(self, start: float | None = None, end: float | None = None) -> float:
        """The median of the power samples (counters: of each interval's power) between ``start`` and ``end``."""
        lo = -np.inf if start is None else start
        hi = np.inf if end is None else end
        if self.cumulative:
            curve = self._energy_curve()
            inside = (self.times_s[1:] >= lo) & (self.times_s[:-1] <= hi)
            powers = np.diff(curve)[inside] / np.diff(self.times_s)[inside]
        else:
            powers = self.values[(self.times_s >= lo) & (self.times_s <= hi)]
        if len(powers) == 0:
            return self.mean_watts(None if start is None else start, None if end is None else end)
        return float(np.median(powers))


class Sampler:
    """Reads ``sensor`` every ``interval_s`` in a background thread, from ``start()`` (or ``with``) to ``stop()``.

    ``max_samples`` bounds the memory a long-running sampler keeps (the oldest go first).
    A read that fails stops sampling; :meth:`trace` then raises that error.
    """

    def __init__(self, sensor: PowerSensor, interval_s: float = 0.01, max_samples: int | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.sensor, self.interval_s = sensor, interval_s
        self._samples: collections.deque[tuple[float, float]] = collections.deque(maxlen=max_samples)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: SensorError | None = None

    def _sample(self) -> float:
        value = self.sensor.read()
        with self._lock:
            now = time.monotonic()
            self._samples.append((now, value))
        return now

    def sample_now(self) -> float:
        """Take a sample now (besides the thread's), so that a window can end at this moment; its time."""
        return self._sample()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self._sample()
        except SensorError as exc:
            self.error = exc

    def start(self) -> Sampler:
        """Take a first sample now and keep sampling in the background."""
        self._sample()
        self._thread = threading.Thread(target=self._run, name="edgesdk-energy-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling, with a last sample taken now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            if self.error is None:
                self._sample()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def trace(self) -> Trace:
        """The samples so far."""
        if self.error is not None:
            raise self.error
        with self._lock:
            samples = list(self._samples)
        times, values = (np.array(column, dtype=np.float64) for column in zip(*samples)) if samples else (
            np.empty(0), np.empty(0))
        return Trace(times, values, self.sensor.cumulative, self.sensor.wrap_j)


@dataclass(frozen=True)
class EnergyResult:
    """What :func:`measure_energy` measured: idle power, the active window, and the energy per inference above idle."""

    idle_watts: float
    idle_s: float
    window_s: float
    window_j: float
    inferences: int
    #: (window_j − idle_watts × window_s) / inferences, in mJ.
    energy_per_inference_mj: float
    #: Average power over the active window.
    active_watts: float
    sensor: str
    scope: str
    description: str
    samples: int
    sample_interval_s: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``edgesdk bench --energy --json``'s ``energy``)."""
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}


def measure_energy(sensor: PowerSensor, run_once: Callable[[], object], inferences: int, idle_s: float = 20.0,
                   rate_hz: float | None = None, interval_s: float = 0.01) -> EnergyResult:
    """Idle for ``idle_s`` (model loaded, nothing running), then ``inferences`` calls of ``run_once``, sampled throughout.

    Calls run back to back, or paced at ``rate_hz``. Idle power is the median over the idle
    window; the active window is integrated.
    """
    if inferences < 1 or idle_s < 0 or (rate_hz is not None and not rate_hz > 0):
        raise ValueError(f"need inferences >= 1, idle_s >= 0 and rate_hz > 0, got {inferences}, {idle_s}, {rate_hz}")
    with Sampler(sensor, interval_s) as sampler:
        idle_start = time.monotonic()
        time.sleep(idle_s)
        start = time.monotonic()
        for i in range(inferences):
            if rate_hz is not None:
                time.sleep(max(0.0, start + i / rate_hz - time.monotonic()))
            run_once()
        end = time.monotonic()
        time.sleep(interval_s)  # a sample after the last inference, so the window's end is interpolated, not guessed
    trace = sampler.trace()
    idle = trace.median_watts(idle_start, start) if idle_s > 0 else trace.median_watts(None, start)
    window_j = trace.energy_j(start, end)
    window_s = end - start
    inside = int(((trace.times_s >= idle_start) & (trace.times_s <= end)).sum())
    return EnergyResult(
        idle_watts=idle, idle_s=start - idle_start, window_s=window_s, window_j=window_j, inferences=inferences,
        energy_per_inference_mj=(window_j - idle * window_s) / inferences * 1e3,
        active_watts=window_j / max(window_s, 1e-9), sensor=sensor.kind, scope=sensor.scope,
        description=sensor.description, samples=inside,
        sample_interval_s=float(np.median(np.diff(trace.times_s))) if len(trace.times_s) > 1 else interval_s)


def sensor_read_cost(sensor: PowerSensor, reads: int = 1000) -> float:
    """Seconds per :meth:`PowerSensor.read`, the median of ``reads`` single reads."""
    costs = []
    for _ in range(reads):
        started = time.perf_counter()
        sensor.read()
        costs.append(time.perf_counter() - started)
    return statistics.median(costs)
