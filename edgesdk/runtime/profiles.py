"""Device profiles: what a board has and how edgesdk may use it.

A profile is one YAML file per board (``device_profiles/*.yaml``, shipped as package
data). Users add their own with a directory passed as ``profile_dirs`` or listed in the
``EDGESDK_PROFILE_PATH`` environment variable (``os.pathsep``-separated); a user profile
with the same ``name`` as a shipped one replaces it.

The YAML is read into frozen dataclasses and validated field by field: a missing field,
a wrong type or an unknown key raises :class:`~edgesdk.errors.ProfileError` naming the
file and the field path (``clusters[1].max_mhz``).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from edgesdk.errors import ProfileError
from edgesdk.runtime.board_power import SENSOR_KINDS, SENSOR_SCOPES, BoardPower, PowerSensorSpec
from edgesdk.runtime.yaml_fields import Fields

__all__ = [
    "RuntimeMode",
    "CoreCluster",
    "PowerMode",
    "PowerSensorSpec",
    "BoardPower",
    "SENSOR_KINDS",
    "SENSOR_SCOPES",
    "Accelerator",
    "DetectionHints",
    "DeviceProfile",
    "PROFILE_PATH_ENV",
    "GOVERNORS",
    "load_profile",
    "list_profiles",
    "profile_from_dict",
]

PROFILE_PATH_ENV = "EDGESDK_PROFILE_PATH"
#: The Linux cpufreq governors a power mode may name.
GOVERNORS = ("performance", "powersave", "schedutil", "ondemand", "conservative", "userspace")


class RuntimeMode(str, enum.Enum):
    """What the application asks the runtime to optimise for."""

    LATENCY = "latency"
    BALANCED = "balanced"
    POWER = "power"

    @classmethod
    def parse(cls, value: str | RuntimeMode) -> RuntimeMode:
        """The mode named ``value`` ("latency", "balanced", "power"); an unknown name raises ProfileError."""
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise ProfileError(f"unknown mode {value!r}; use one of: {choices}") from None


class AcceleratorKind(str, enum.Enum):
    """What kind of accelerator an :class:`Accelerator` is."""

    GPU = "gpu"
    NPU = "npu"
    DSP = "dsp"


@dataclass(frozen=True)
class CoreCluster:
    """CPU cores of one microarchitecture and frequency domain."""

    name: str
    #: Linux CPU ids of the cluster's cores.
    cores: tuple[int, ...]
    #: E.g. ``cortex-a76``.
    microarchitecture: str
    max_mhz: int
    #: Relative compute capacity as Linux reports it in ``cpu_capacity`` (1024 = fastest core).
    capacity: int
    #: ``CPU part`` from /proc/cpuinfo (e.g. ``0xd0b`` for Cortex-A76); None on x86.
    cpu_part: str | None = None
    #: The qemu-user CPU model the converter runs this cluster's kernels on (``cortex-a76``; ``cortex-a53``
    #: for Cortex-A55, which qemu lacks); None: chosen from ``microarchitecture``, or not emulated.
    emulated_cpu: str | None = None
    #: What each thread beyond the first adds, as a share of one thread's speed (0.7: four threads run 3.1x one);
    #: None: the converter's default (:data:`edgesdk.converters.board.emulate.PARALLEL_EFFICIENCY`). A figure measured on
    #: the board replaces the model at its point.
    parallel_efficiency: float | None = None
    #: The share of the cluster's active power drawn as soon as any of its cores is busy (shared cache,
    #: interconnect, DRAM traffic); None: the converter's default (:data:`edgesdk.converters.board.power.SHARED_ACTIVE_SHARE`).
    shared_power_share: float | None = None

    def __post_init__(self) -> None:
        if self.parallel_efficiency is not None and not 0 < self.parallel_efficiency <= 1:
            raise ProfileError(f"cluster {self.name!r}: parallel_efficiency must be in (0, 1], got "
                               f"{self.parallel_efficiency}")
        if self.shared_power_share is not None and not 0 <= self.shared_power_share < 1:
            raise ProfileError(f"cluster {self.name!r}: shared_power_share must be in [0, 1), got "
                               f"{self.shared_power_share}")
        if not self.cores:
            raise ProfileError(f"cluster {self.name!r} has no cores; list at least one core id")
        if len(set(self.cores)) != len(self.cores) or min(self.cores) < 0:
            raise ProfileError(f"cluster {self.name!r} cores {list(self.cores)} must be distinct ids >= 0")
        if self.max_mhz <= 0 or not 0 < self.capacity <= 1024:
            raise ProfileError(
                f"cluster {self.name!r}: max_mhz must be > 0 and capacity in 1..1024, "
                f"got max_mhz={self.max_mhz}, capacity={self.capacity}"
            )


@dataclass(frozen=True)
class PowerMode:
    """A board power state: the power it draws idle and per busy compute unit, and which cores it keeps running.

    Power figures are of the whole board where the profile's sources measured it at the wall
    (``DeviceProfile.power_scope``), in watts. ``active_watts`` maps a compute unit (a cluster
    name, or an accelerator name) to the power it adds above ``idle_watts`` with all of its
    cores busy at this mode's clock; :mod:`edgesdk.converters.board.power` turns those into energy
    per inference and average power.
    """

    name: str
    #: Board power with the model loaded and nothing running, in this mode.
    idle_watts: float
    #: Watts above idle per compute unit (cluster or accelerator name), all of its cores busy at this mode's clock.
    active_watts: Mapping[str, float]
    #: Names of the clusters scheduled in this mode.
    clusters: tuple[str, ...]
    #: The runtime modes this power state serves.
    serves: tuple[RuntimeMode, ...]
    #: Frequency cap per cluster name in this mode (clusters not listed run at their max).
    max_mhz: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    #: How many of the listed clusters' cores stay online (e.g. Jetson Nano 5W keeps 2).
    online_cores: int | None = None
    #: The cpufreq governor this mode sets on its clusters (one of :data:`GOVERNORS`); None: leave the OS's.
    governor: str | None = None
    #: The ``nvpmodel -m`` id of this mode on a Jetson (from NVIDIA's nvpmodel table); it then sets clocks and cores.
    nvpmodel: int | None = None

    def __post_init__(self) -> None:
        if self.idle_watts <= 0:
            raise ProfileError(f"power mode {self.name!r}: idle_watts must be > 0, got {self.idle_watts}")
        bad = {unit: w for unit, w in self.active_watts.items() if not w > 0}
        if bad:
            raise ProfileError(f"power mode {self.name!r}: active_watts must be > 0, got {bad}")
        if not self.clusters:
            raise ProfileError(f"power mode {self.name!r} lists no clusters")
        if self.online_cores is not None and self.online_cores < 1:
            raise ProfileError(f"power mode {self.name!r}: online_cores must be >= 1, got {self.online_cores}")
        if self.governor is not None and self.governor not in GOVERNORS:
            raise ProfileError(f"power mode {self.name!r}: governor {self.governor!r} is not a cpufreq governor; "
                               f"use one of {list(GOVERNORS)}")
        if self.nvpmodel is not None and (isinstance(self.nvpmodel, bool) or self.nvpmodel < 0):
            raise ProfileError(f"power mode {self.name!r}: nvpmodel must be an id >= 0 (`nvpmodel -q --verbose` "
                               f"lists them), got {self.nvpmodel!r}")


@dataclass(frozen=True)
class Accelerator:
    """A GPU/NPU/DSP and the LiteRT delegates / ONNX Runtime providers that can drive it."""

    name: str
    kind: AcceleratorKind
    #: Shared libraries for ``load_delegate``, tried in order.
    litert_delegates: tuple[str, ...] = ()
    #: ONNX Runtime execution providers, best first (CPU is always appended last).
    onnxruntime_providers: tuple[str, ...] = ()
    #: Optional data-sheet ceilings for the converter's roofline (edgesdk.converters.board.gpu_estimate): dense peak per
    #: precision (``fp32``/``fp16``/``int8``, TFLOPS or TOPS) and memory bandwidth in GB/s; empty/None: not costed.
    peak_tflops: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    memory_gbps: float | None = None
    #: The clock ``peak_tflops`` is quoted at (MHz); a power mode's ``max_mhz`` for this accelerator scales it.
    max_mhz: int | None = None


@dataclass(frozen=True)
class DetectionHints:
    """How :func:`edgesdk.detect_device` recognises the board."""

    #: Case-insensitive substrings of ``/proc/device-tree/model``.
    device_tree_model: tuple[str, ...] = ()
    #: Entries of ``/proc/device-tree/compatible`` (any one matches).
    compatible: tuple[str, ...] = ()
    #: ``CPU part`` ids expected in /proc/cpuinfo (used when the device tree is absent).
    cpu_parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceProfile:
    """Everything edgesdk knows about one kind of board."""

    name: str
    description: str
    #: ``platform.machine()`` of the board, e.g. ``aarch64``.
    arch: str
    clusters: tuple[CoreCluster, ...]
    #: Installed RAM in MiB.
    ram_mb: int
    #: Memory a model (weights + arena) may take on this board, in MiB.
    model_budget_mb: int
    power_modes: tuple[PowerMode, ...]
    accelerators: tuple[Accelerator, ...] = ()
    detect: DetectionHints = DetectionHints()
    #: Where the profile's figures come from (datasheets, kernel sources, measurements), as free text.
    sources: tuple[str, ...] = ()
    #: Where the profile came from: a file path, or ``"detected"``.
    origin: str = "<memory>"
    #: The board's power sensor and sleep figures.
    power: BoardPower = BoardPower()

    def __post_init__(self) -> None:
        names = [c.name for c in self.clusters]
        if not self.clusters:
            raise ProfileError(f"profile {self.name!r} has no CPU clusters")
        if len(set(names)) != len(names):
            raise ProfileError(f"profile {self.name!r}: cluster names {names} must be unique")
        all_cores = [core for c in self.clusters for core in c.cores]
        if len(set(all_cores)) != len(all_cores):
            raise ProfileError(f"profile {self.name!r}: a core id appears in two clusters: {sorted(all_cores)}")
        if not 0 < self.model_budget_mb <= self.ram_mb:
            raise ProfileError(
                f"profile {self.name!r}: model_budget_mb={self.model_budget_mb} must be in 1..ram_mb={self.ram_mb}"
            )
        for mode in self.power_modes:
            unknown = set(mode.clusters) - set(names)
            unknown |= set(mode.max_mhz) - set(names) - {a.name for a in self.accelerators}
            if unknown:
                raise ProfileError(
                    f"profile {self.name!r}: power mode {mode.name!r} names clusters {sorted(unknown)} "
                    f"that are not defined; defined clusters: {names} (max_mhz may also name an accelerator)"
                )
            missing = [c for c in mode.clusters if c not in mode.active_watts]
            if missing:
                raise ProfileError(f"profile {self.name!r}: power mode {mode.name!r}: no active_watts for its "
                                   f"cluster(s) {missing}; give the watts each adds above idle with all its cores busy")
            units = set(names) | {a.name for a in self.accelerators}
            if set(mode.active_watts) - units:
                raise ProfileError(
                    f"profile {self.name!r}: power mode {mode.name!r} gives active_watts for "
                    f"{sorted(set(mode.active_watts) - units)}, which is neither a cluster nor an accelerator: {sorted(units)}"
                )

    @property
    def cores(self) -> tuple[int, ...]:
        """Every core id of every cluster, sorted."""
        return tuple(sorted(core for c in self.clusters for core in c.cores))

    @property
    def is_heterogeneous(self) -> bool:
        """True when the board has clusters of different capacity (big.LITTLE)."""
        return len({c.capacity for c in self.clusters}) > 1

    def cluster(self, name: str) -> CoreCluster:
        """The cluster called ``name``; an unknown name raises ProfileError listing the known ones."""
        for c in self.clusters:
            if c.name == name:
                return c
        raise ProfileError(f"profile {self.name!r} has no cluster {name!r}; it has {[c.name for c in self.clusters]}")

    def power_mode_for(self, mode: RuntimeMode | str) -> PowerMode | None:
        """The board power state that serves a runtime mode, or None if none is declared."""
        wanted = RuntimeMode.parse(mode)
        for pm in self.power_modes:
            if wanted in pm.serves:
                return pm
        return None


# --------------------------------------------------------------------------- YAML reading


def _cluster(f: Fields) -> CoreCluster:
    cores = f.get("cores", list)
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in cores):
        f.fail(f"cores must be a list of integer core ids, got {cores!r}")
    part = f.get("cpu_part", (str, type(None)), default=None)
    cluster = CoreCluster(
        name=f.get("name", str),
        cores=tuple(cores),
        microarchitecture=f.get("microarchitecture", str),
        max_mhz=f.get("max_mhz", int),
        capacity=f.get("capacity", int),
        cpu_part=part.lower() if part else None,
        emulated_cpu=f.get("emulated_cpu", (str, type(None)), default=None),
        parallel_efficiency=_optional_float(f, "parallel_efficiency"),
        shared_power_share=_optional_float(f, "shared_power_share"),
    )
    f.done()
    return cluster


def _watts_map(f: Fields, key: str) -> dict[str, float]:
    values = f.get(key, dict)
    for k, v in values.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            f.fail(f"{key}.{k} must be a number of watts, got {type(v).__name__} {v!r}")
    return {str(k): float(v) for k, v in values.items()}


def _power_mode(f: Fields) -> PowerMode:
    if "watts" in f.data:
        f.fail("'watts' was replaced by idle_watts (the board idle in this mode) and active_watts ({cluster: watts "
               "above idle with all its cores busy}); see device_profiles/raspberry-pi-5.yaml")
    serves = []
    for value in f.strings("serves"):
        try:
            serves.append(RuntimeMode(value))
        except ValueError:
            f.fail(f"serves: {value!r} is not a runtime mode; use latency, balanced or power")
    max_mhz = f.get("max_mhz", dict, default={})
    for k, v in max_mhz.items():
        if not isinstance(v, int) or isinstance(v, bool):
            f.fail(f"max_mhz.{k} must be int, got {type(v).__name__} {v!r}")
    fields = dict(name=f.get("name", str), idle_watts=float(f.get("idle_watts", (int, float))),
                  active_watts=MappingProxyType(_watts_map(f, "active_watts")), clusters=f.strings("clusters"),
                  serves=tuple(serves), max_mhz=MappingProxyType(dict(max_mhz)),
                  online_cores=f.get("online_cores", (int, type(None)), default=None),
                  governor=f.get("governor", (str, type(None)), default=None),
                  nvpmodel=f.get("nvpmodel", (int, type(None)), default=None))
    try:
        mode = PowerMode(**fields)
    except ProfileError as exc:
        f.fail(str(exc))
    f.done()
    return mode


def _optional_float(f: Fields, key: str) -> float | None:
    value = f.get(key, (int, float, type(None)), default=None)
    return None if value is None else float(value)


def _board_power(f: Fields) -> BoardPower:
    sensor = None
    raw = f.get("sensor", (dict, type(None)), default=None)
    if raw is not None:
        s = f.sub("sensor", raw)
        sensor = PowerSensorSpec(
            kind=s.get("kind", str), paths=s.strings("paths"), scope=s.get("scope", str), unit=s.get("unit", str),
            scale=float(s.get("scale", (int, float), default=1.0)),
            offset_watts=float(s.get("offset_watts", (int, float), default=0.0)))
        s.done()
    power = BoardPower(scope=f.get("scope", str, default="board"), sensor=sensor,
                       sleep_watts=_optional_float(f, "sleep_watts"), resume_s=_optional_float(f, "resume_s"),
                       resume_mj=_optional_float(f, "resume_mj"))
    f.done()
    return power


def _accelerator(f: Fields) -> Accelerator:
    kind = f.get("kind", str)
    try:
        parsed_kind = AcceleratorKind(kind)
    except ValueError:
        f.fail(f"kind {kind!r} is not one of {[k.value for k in AcceleratorKind]}")
    acc = Accelerator(
        name=f.get("name", str),
        kind=parsed_kind,
        litert_delegates=f.strings("litert_delegates", default=[]),
        onnxruntime_providers=f.strings("onnxruntime_providers", default=[]),
        peak_tflops=MappingProxyType({str(k): float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else -1.0
                                      for k, v in f.get("peak_tflops", dict, default={}).items()}),  # -1: refused below
        memory_gbps=f.get("memory_gbps", (int, float, type(None)), default=None),
        max_mhz=f.get("max_mhz", (int, type(None)), default=None),
    )
    if acc.max_mhz is not None and acc.max_mhz <= 0:
        f.fail(f"max_mhz must be > 0, got {acc.max_mhz}")
    if any(not v > 0 for v in acc.peak_tflops.values()) or (acc.memory_gbps is not None and not acc.memory_gbps > 0):
        f.fail(f"peak_tflops and memory_gbps need numbers > 0 (-1.0: not a number): {dict(acc.peak_tflops)}, {acc.memory_gbps}")
    f.done()
    return acc


def profile_from_dict(data: Any, origin: str = "<memory>") -> DeviceProfile:
    """Build and validate a :class:`DeviceProfile` from parsed YAML."""
    top = Fields(data, "", origin)
    cpu = top.sub("cpu", top.get("cpu", dict))
    clusters = tuple(_cluster(cpu.sub(f"clusters[{i}]", c)) for i, c in enumerate(cpu.get("clusters", list)))
    cpu.done()
    memory = top.sub("memory", top.get("memory", dict))
    ram_mb, budget_mb = memory.get("ram_mb", int), memory.get("model_budget_mb", int)
    memory.done()
    modes = tuple(_power_mode(top.sub(f"power_modes[{i}]", m)) for i, m in enumerate(top.get("power_modes", list)))
    accs = tuple(
        _accelerator(top.sub(f"accelerators[{i}]", a)) for i, a in enumerate(top.get("accelerators", list, default=[]))
    )
    hints_f = top.sub("detect", top.get("detect", dict, default={}))
    hints = DetectionHints(
        device_tree_model=hints_f.strings("device_tree_model", default=[]),
        compatible=hints_f.strings("compatible", default=[]),
        cpu_parts=tuple(p.lower() for p in hints_f.strings("cpu_parts", default=[])),
    )
    hints_f.done()
    power = _board_power(top.sub("power", top.get("power", dict, default={})))
    try:
        profile = DeviceProfile(
            name=top.get("name", str),
            description=top.get("description", str),
            arch=top.get("arch", str),
            clusters=clusters,
            ram_mb=ram_mb,
            model_budget_mb=budget_mb,
            power_modes=modes,
            accelerators=accs,
            detect=hints,
            sources=top.strings("sources", default=[]),
            origin=origin,
            power=power,
        )
    except ProfileError as exc:
        if str(exc).startswith(origin):
            raise
        raise ProfileError(f"{origin}: {exc}") from None
    top.done()
    return profile


def _read_file(path: Path) -> DeviceProfile:
    import yaml  # deferred: keeps `edgesdk --help` fast

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"cannot read profile file {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from exc
    return profile_from_dict(data, origin=str(path))


def _search_dirs(profile_dirs: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """Shipped profiles first, then EDGESDK_PROFILE_PATH, then explicit dirs (later wins)."""
    shipped = Path(str(resources.files("edgesdk.device_profiles")))
    env = [Path(p) for p in os.environ.get(PROFILE_PATH_ENV, "").split(os.pathsep) if p]
    return [shipped, *env, *(Path(d) for d in profile_dirs)]


def list_profiles(profile_dirs: Iterable[str | os.PathLike[str]] = ()) -> list[DeviceProfile]:
    """Every profile found, sorted by name; user directories override shipped names."""
    found: dict[str, DeviceProfile] = {}
    for directory in _search_dirs(profile_dirs):
        if not directory.is_dir():
            raise ProfileError(
                f"profile directory {directory} does not exist or is not a directory; "
                f"fix ${PROFILE_PATH_ENV} or the profile directory option"
            )
        for path in sorted(directory.glob("*.yaml")):
            profile = _read_file(path)
            found[profile.name] = profile
    return sorted(found.values(), key=lambda p: p.name)


def load_profile(
    name_or_path: str | os.PathLike[str] | DeviceProfile,
    profile_dirs: Iterable[str | os.PathLike[str]] = (),
) -> DeviceProfile:
    """Load a profile by name (``"rk3588"``) or from a YAML file path."""
    if isinstance(name_or_path, DeviceProfile):
        return name_or_path
    text = os.fspath(name_or_path)
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        return _read_file(Path(text))
    profiles = {p.name: p for p in list_profiles(profile_dirs)}
    if text not in profiles:
        raise ProfileError(
            f"no device profile named {text!r}; known profiles: {', '.join(sorted(profiles))}. "
            f"Add your own YAML file in a directory listed in ${PROFILE_PATH_ENV}."
        )
    return profiles[text]
