"""A device's reported details as the console shows them, whatever the device sent.

The server keeps the ``runtime``, ``disk``, ``previous`` and ``energy`` parts of each online state report as the
device wrote them (``DETAIL_KEYS``). A device with a bug, an old agent or a hostile one can put anything there: a
string where a number goes, a list, NaN, nested objects, megabytes of text. :func:`parse_details` turns any such
value into typed figures (ints, finite floats, short strings, or None when missing) and names each field it had to
drop in ``malformed``, so a page shows "—" and a note instead of failing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Figures", "Energy", "Disk", "DeviceDetails", "parse_details", "TEXT_MAX", "PATHS_MAX"]

#: Longest text shown from a report (a breaker state, a version); longer is cut with an ellipsis.
TEXT_MAX = 120
#: Most offload paths shown per device (a real runtime has two: local and cloud).
PATHS_MAX = 16
#: Largest count believed (a 64-bit counter); beyond is malformed.
_COUNT_MAX = 2**63 - 1


class _Reader:
    """Coerces report values, noting where each dropped one was."""

    def __init__(self) -> None:
        self.malformed: list[str] = []

    def bad(self, where: str) -> None:
        self.malformed.append(where)

    def obj(self, value: Any, where: str) -> dict[str, Any]:
        if value is None:
            return {}
        if isinstance(value, dict):
            return value
        self.bad(where)
        return {}

    def count(self, value: Any, where: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _COUNT_MAX:
            return value
        self.bad(where)
        return None

    def number(self, value: Any, where: str, minimum: float | None = 0.0) -> float | None:
        if value is None:
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value) if abs(value) < 1e300 else math.inf
            if math.isfinite(number) and (minimum is None or number >= minimum):
                return number
        self.bad(where)
        return None

    def text(self, value: Any, where: str) -> str | None:
        if value is None:
            return None
        if isinstance(value, str):
            return value if len(value) <= TEXT_MAX else value[:TEXT_MAX - 1] + "…"
        self.bad(where)
        return None


@dataclass(frozen=True)
class Figures:
    """Runtime statistics of the model, or of one offload path (None: not reported or malformed)."""

    count: int | None = None
    errors: int | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    refused: int | None = None
    fallbacks: int | None = None
    breaker: str | None = None


@dataclass(frozen=True)
class Energy:
    """Energy per inference above idle (mJ) and average power (W) over the device's last report window."""

    energy_per_inference_mj: float | None = None
    avg_watts: float | None = None


@dataclass(frozen=True)
class Disk:
    """Free bytes on the device's store volume and bytes its store holds."""

    free_bytes: int | None = None
    store_bytes: int | None = None


@dataclass(frozen=True)
class DeviceDetails:
    """One device's details, typed; ``malformed`` names every reported field that was dropped (e.g. ``runtime.p99_ms``)."""

    previous: str | None = None
    runtime: Figures = field(default_factory=Figures)
    paths: dict[str, Figures] = field(default_factory=dict)
    energy: Energy | None = None
    disk: Disk | None = None
    malformed: tuple[str, ...] = ()


def _figures(read: _Reader, raw: dict[str, Any], where: str) -> Figures:
    return Figures(count=read.count(raw.get("count"), f"{where}.count"),
                   errors=read.count(raw.get("errors"), f"{where}.errors"),
                   p50_ms=read.number(raw.get("p50_ms"), f"{where}.p50_ms"),
                   p99_ms=read.number(raw.get("p99_ms"), f"{where}.p99_ms"),
                   refused=read.count(raw.get("refused"), f"{where}.refused"),
                   fallbacks=read.count(raw.get("fallbacks"), f"{where}.fallbacks"),
                   breaker=read.text(raw.get("breaker"), f"{where}.breaker"))


def parse_details(raw: Any) -> DeviceDetails:
    """Typed details from whatever a device reported (any JSON value, or anything the store handed back)."""
    read = _Reader()
    details = read.obj(raw, "details")
    runtime = read.obj(details.get("runtime"), "runtime")
    paths: dict[str, Figures] = {}
    for name, path in list(read.obj(runtime.get("paths"), "runtime.paths").items())[:PATHS_MAX]:
        label = read.text(name, "runtime.paths") or "?"
        paths[label] = _figures(read, read.obj(path, f"runtime.paths.{label}"), f"runtime.paths.{label}")
    energy_raw = read.obj(details.get("energy"), "energy")
    disk_raw = read.obj(details.get("disk"), "disk")
    return DeviceDetails(
        previous=read.text(details.get("previous"), "previous"),
        runtime=_figures(read, runtime, "runtime"), paths=paths,
        energy=Energy(read.number(energy_raw.get("energy_per_inference_mj"), "energy.energy_per_inference_mj", None),
                      read.number(energy_raw.get("avg_watts"), "energy.avg_watts")) if energy_raw else None,
        disk=Disk(read.count(disk_raw.get("free_bytes"), "disk.free_bytes"),
                  read.count(disk_raw.get("store_bytes"), "disk.store_bytes")) if disk_raw else None,
        malformed=tuple(dict.fromkeys(read.malformed)))
