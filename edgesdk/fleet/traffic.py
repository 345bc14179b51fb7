"""The app traffic a device reports per model version (its state's ``traffic``), and its parser.

The device agent merges what the apps on its device served (:mod:`edgesdk.agent.app_traffic`)
and publishes it in its retained state::

    "traffic": {"format": 1, "at": 1732860300.0, "horizon_s": 900,
      "versions": {
        "2.0.0": {"from": 1732860100.0, "to": 1732860300.0, "calls": 5231, "errors": 3,
                  "p50_ms": 0.21, "p95_ms": 0.35, "p99_ms": 0.61, "local": 0, "cloud": 0,
                  "apps": 2, "starts": 2, "restarts": 0, "hist": [[137, 12], [138, 40], ...]}}}

Per version, over the last ``horizon_s`` seconds: ``from``/``to`` the window the figures cover
(device clock), ``calls`` and failed ``errors`` run on the device's model, latency percentiles
of the successful ones (null when there is none), predict_async requests run ``local`` and sent
to the ``cloud``, the app sessions that served it (``apps``), those that started on it in the
window (``starts``) and those that started while an earlier session of the same app was in the
window (``restarts``: an app restarting), and, optionally, ``hist``: the successful calls' latency
histogram (:mod:`edgesdk.runtime.latency_histogram`'s sparse form), from which the server reads how
sure a p99 over few calls is.

A rollout's verdict rests on these figures, so :func:`parse_traffic` checks them as hostile
input (:class:`~edgesdk.errors.ReportError` naming the field and the value): counts are whole
numbers in 0 .. 2**53-1, ``errors <= calls``, ``from <= to``, ``to - from <= 2 * horizon_s``, no
more calls than the window allows at :data:`MAX_CALLS_PER_S`, percentiles finite, ordered and
null exactly when no call succeeded, a histogram of increasing bucket indices and positive counts
that add up to the successful calls, versions dotted integers, at most
:data:`MAX_TRAFFIC_VERSIONS` of them. Standard library only: the agent runs it too.
"""

from __future__ import annotations

import math
from typing import Any

from edgesdk.errors import EdgeSDKError, ReportError
from edgesdk.runtime.bundle import parse_version
from edgesdk.runtime.latency_histogram import N_BUCKETS

__all__ = ["TRAFFIC_FORMAT", "MAX_CALLS_PER_S", "MAX_TRAFFIC_VERSIONS", "MAX_COUNT", "COUNTS",
           "PERCENTILES", "parse_traffic", "check_count", "check_time", "check_version", "check_histogram",
           "refuse"]

TRAFFIC_FORMAT = 1
#: The stated maximum rate of calls one device serves on one version: more calls than a window
#: allows at this rate are a lie (or a bug), and the figures are refused.
MAX_CALLS_PER_S = 10_000
#: Versions one report names at most (the agent keeps those it heard of last).
MAX_TRAFFIC_VERSIONS = 8
#: Counts stay below 2**53 (exact in a double, as JSON readers hold numbers).
MAX_COUNT = 2**53 - 1
#: The whole-number fields of a version's figures.
COUNTS = ("calls", "errors", "local", "cloud", "apps", "starts", "restarts")
PERCENTILES = ("p50_ms", "p95_ms", "p99_ms")
#: Longest horizon a report may state (a week).
_MAX_HORIZON_S = 7 * 86400.0
_MAX_TIME = float(2**53)
_MAX_VERSION_CHARS = 64


def refuse(reason: str, field: str, message: str) -> ReportError:
    """A ReportError with its machine ``reason`` (type, range, length, id, missing) and field."""
    return ReportError(message, reason=reason, field=field)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_count(value: Any, field: str) -> int:
    """``value`` when it is a whole number in 0 .. :data:`MAX_COUNT`, else ReportError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise refuse("type", field, f"{field} {_show(value)} must be a whole number (a count)")
    if not 0 <= value <= MAX_COUNT:
        raise refuse("range", field,
                     f"{field} {_show(value)} is outside 0..2**53-1; a count is never negative")
    return value


def check_time(value: Any, field: str, low: float = 0.0, high: float = _MAX_TIME) -> float:
    """``value`` as a float when it is a finite number in ``low .. high``, else ReportError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise refuse("type", field, f"{field} {_show(value)} must be a number")
    if not (math.isfinite(value) and low <= value <= high):
        raise refuse("range", field,
                     f"{field} {_show(value)} must be a finite number in {low:g}..{high:g}")
    return float(value)


def check_version(value: Any, field: str) -> str:
    """``value`` when it is a version of dotted integers, else ReportError."""
    if not isinstance(value, str) or len(value) > _MAX_VERSION_CHARS:
        raise refuse("type" if not isinstance(value, str) else "length", field,
                     f"{field} {_show(value)} must be a version of at most "
                     f"{_MAX_VERSION_CHARS} characters")
    try:
        parse_version(value)
    except EdgeSDKError as exc:
        raise refuse("id", field, f"{field}: {exc}") from None
    return value


def _percentiles(entry: dict[str, Any], where: str, succeeded: int) -> dict[str, float | None]:
    values: dict[str, float | None] = {}
    for name in PERCENTILES:
        value, field = entry.get(name), f"{where}.{name}"
        if value is None:
            if succeeded:
                raise refuse("missing", field, f"{field} is null but {succeeded} calls succeeded; "
                                               "send the percentile of their latencies")
            values[name] = None
        elif not succeeded:
            raise refuse("range", field, f"{field} {_show(value)} is given for no successful call; "
                                         "send null")
        else:
            values[name] = check_time(value, field, 0.0, math.inf)
    p50, p95, p99 = (values[name] for name in PERCENTILES)
    if p50 is not None and p95 is not None and p99 is not None and not p50 <= p95 <= p99:
        raise refuse("range", f"{where}.p99_ms",
                     f"{where}: percentiles p50 {p50:g} <= p95 {p95:g} <= p99 {p99:g} ms do not "
                     "hold; send them in order")
    return values


def check_histogram(value: Any, field: str, succeeded: int) -> list[list[int]]:
    """A sparse latency histogram, checked: ``[[bucket, count], ...]`` with increasing buckets in
    0 .. N_BUCKETS-1 and positive counts adding up to ``succeeded`` calls; else ReportError."""
    if not isinstance(value, list) or len(value) > N_BUCKETS:
        raise refuse("type", field, f"{field} {_show(value)} must be a list of at most {N_BUCKETS} "
                                    "[bucket, count] pairs")
    checked, last, seen = [], -1, 0
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)):
            raise refuse("type", field, f"{field} item {_show(pair)} must be [bucket, count]")
        index, count = pair
        if not last < index < N_BUCKETS or count < 1:
            raise refuse("range", field, f"{field} item {_show(pair)}: buckets increase within "
                                         f"0..{N_BUCKETS - 1} and counts are at least 1")
        checked.append([index, count])
        last, seen = index, seen + count
    if seen != succeeded:
        raise refuse("range", field, f"{field} holds {seen} calls, not the {succeeded} that "
                                     "succeeded; send the histogram of the window's calls")
    return checked


def _window(entry: dict[str, Any], where: str, horizon_s: float) -> tuple[float, float]:
    start, end = check_time(entry["from"], f"{where}.from"), check_time(entry["to"], f"{where}.to")
    if start > end:
        raise refuse("range", f"{where}.from",
                     f"{where}.from {start:.3f} is after its to {end:.3f}; a window ends after it "
                     "starts")
    if end - start > 2 * horizon_s:
        raise refuse("range", f"{where}.to", f"{where} covers {end - start:g} s, more than twice "
                                             f"the {horizon_s:g} s horizon")
    return start, end


def _version_entry(entry: Any, where: str, horizon_s: float) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise refuse("type", where, f"{where} {_show(entry)} must be an object of figures")
    for key in ("from", "to", *COUNTS):
        if key not in entry:
            raise refuse("missing", f"{where}.{key}", f"{where} has no {key}; send every field")
    start, end = _window(entry, where, horizon_s)
    counts = {key: check_count(entry[key], f"{where}.{key}") for key in COUNTS}
    calls, errors = counts["calls"], counts["errors"]
    if errors > calls:
        raise refuse("range", f"{where}.errors",
                     f"{where}.errors {errors} is more than its {calls} calls")
    most = (end - start + 1) * MAX_CALLS_PER_S
    if calls > most:
        raise refuse("range", f"{where}.calls",
                     f"{where}.calls {calls} in {end - start:g} s is over the {MAX_CALLS_PER_S} "
                     f"calls/s one device serves ({most:.0f} at most)")
    checked: dict[str, Any] = {"from": start, "to": end, **counts, **_percentiles(entry, where, calls - errors)}
    if entry.get("hist") is not None:
        checked["hist"] = check_histogram(entry["hist"], f"{where}.hist", calls - errors)
    return checked


def parse_traffic(obj: Any) -> dict[str, Any]:
    """The checked, normalised traffic object (the fields above only); else ReportError."""
    if not isinstance(obj, dict):
        raise refuse("type", "traffic", f"traffic {_show(obj)} must be an object")
    form = obj.get("format")
    if isinstance(form, bool) or form != TRAFFIC_FORMAT:
        raise refuse("range", "traffic.format", f"traffic.format {_show(form)} is not "
                                                f"{TRAFFIC_FORMAT}, the one this reader knows")
    at = check_time(obj.get("at"), "traffic.at")
    horizon_s = check_time(obj.get("horizon_s"), "traffic.horizon_s", 1.0, _MAX_HORIZON_S)
    versions = obj.get("versions")
    if not isinstance(versions, dict):
        raise refuse("type", "traffic.versions",
                     f"traffic.versions {_show(versions)} must be an object")
    if len(versions) > MAX_TRAFFIC_VERSIONS:
        raise refuse("length", "traffic.versions",
                     f"traffic.versions names {len(versions)} versions; at most "
                     f"{MAX_TRAFFIC_VERSIONS} are read")
    checked = {}
    for version, entry in versions.items():
        where = f"traffic.versions.{str(version)[:_MAX_VERSION_CHARS]}"
        checked[check_version(version, where)] = _version_entry(entry, where, horizon_s)
    return {"format": TRAFFIC_FORMAT, "at": at, "horizon_s": horizon_s, "versions": checked}
