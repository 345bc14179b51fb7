"""The file an app hands its traffic to the agent in: ``STORE/apps/<app>-<pid>.json``.

One file per app process, written atomically by the app (:mod:`edgesdk.agent.app_stats`), read
by the agent (:mod:`edgesdk.agent.app_traffic`)::

    {"format": 1, "app": "camera", "pid": 1234, "session": 1732860000.0, "written": 1732860300.0,
     "versions": {"2.0.0": {"model": "digits", "activated": 1732860100.0,
                            "slots": [[1732860060, 120, 0, 0, 0, [[17, 3], [18, 110]]], ...]}}}

A slot is ``[slot_start, calls, errors, local, cloud, sparse_histogram]``
(:mod:`edgesdk.agent.traffic_ledger`); ``session`` is when the process first served. A file is
at most :data:`MAX_APP_FILE_BYTES`: :func:`encode_app_file` leaves out the oldest slots of a
ledger that would not fit. The agent reads each file as hostile input (any local user may write
one): :func:`parse_app_file` checks every field and refuses what is inconsistent with
:class:`~edgesdk.errors.ReportError`, so the merged figures pass the server's parser
(:func:`edgesdk.fleet.traffic.parse_traffic`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgesdk.agent.traffic_ledger import HORIZON_S, MAX_VERSIONS, SLOT_S
from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.protocol import check_id
from edgesdk.fleet.reports import loads
from edgesdk.fleet.traffic import MAX_CALLS_PER_S, check_count, check_histogram, check_time, check_version, refuse
from edgesdk.runtime.bundle import safe_name

__all__ = ["APP_FORMAT", "MAX_APP_FILE_BYTES", "APPS_DIR", "CADENCE_FILE", "AppSlot", "AppVersion",
           "AppSession", "app_file_name", "encode_app_file", "parse_app_file"]

APP_FORMAT = 1
#: Largest app file; the agent leaves a larger one unread.
MAX_APP_FILE_BYTES = 64 * 1024
#: The store's directory of app files (mode 1777: any user's app may add its own file).
APPS_DIR = "apps"
#: Where the agent tells apps how often to write: ``{"every_s": 10, "until": epoch}``.
CADENCE_FILE = "cadence.json"
#: Slots one version may list: the horizon's, plus the partial ones at each end.
_MAX_SLOTS = HORIZON_S // SLOT_S + 2


@dataclass(frozen=True)
class AppSlot:
    """One slot of one version: what was served in ``[start, start + SLOT_S)``."""

    start: int
    calls: int
    errors: int
    local: int
    cloud: int
    #: Sparse latency histogram of the successful calls (``calls - errors`` samples).
    histogram: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class AppVersion:
    """One version an app session served: its model, when the session began serving it, slots."""

    model: str
    activated: float
    slots: tuple[AppSlot, ...]


@dataclass(frozen=True)
class AppSession:
    """One app process's traffic: who, since when, as of when, per version."""

    app: str
    pid: int
    session: float
    written: float
    versions: Mapping[str, AppVersion]


def app_file_name(app: str, pid: int) -> str:
    """The file name of app ``app``'s process ``pid``."""
    return f"{app}-{pid}.json"


def _oldest_slot(document: dict[str, Any]) -> str | None:
    """The version whose first slot is the oldest of a ledger document, None when there is none."""
    found = [(slots[0][0], version) for version, entry in document["versions"].items()
             if (slots := entry["slots"])]
    return min(found)[1] if found else None


def encode_app_file(app: str, pid: int, document: Mapping[str, Any], written: float) -> bytes:
    """The app file of a ledger ``document`` (:meth:`TrafficLedger.document`), compact JSON of at
    most :data:`MAX_APP_FILE_BYTES`: while it is larger, the oldest slot is left out."""
    versions = {version: {**entry, "slots": list(entry["slots"])}
                for version, entry in document["versions"].items()}
    body = {"format": APP_FORMAT, "app": app, "pid": pid, "session": document["session"],
            "written": written, "versions": versions}
    while True:
        data = json.dumps(body, separators=(",", ":")).encode()
        if len(data) <= MAX_APP_FILE_BYTES:
            return data
        oldest = _oldest_slot(body)
        if oldest is None:  # cannot happen: 4 versions without slots are a few hundred bytes
            raise EdgeSDKError(f"the traffic of app {app} does not fit in {MAX_APP_FILE_BYTES} "
                               "bytes")
        del body["versions"][oldest]["slots"][0]


def _slot(value: Any, where: str, written: float) -> AppSlot:
    if not isinstance(value, list) or len(value) != 6:
        raise refuse("type", where, f"{where} {value!r:.60} must be [start, calls, errors, local, "
                                    "cloud, histogram]")
    start = check_count(value[0], f"{where}.start")
    if start % SLOT_S or start > written:
        raise refuse("range", f"{where}.start",
                     f"{where}.start {start} is not a slot start (a multiple of {SLOT_S} s) "
                     "before the file was written")
    calls, errors, local, cloud = (check_count(v, f"{where}.{name}") for v, name in
                                   zip(value[1:5], ("calls", "errors", "local", "cloud")))
    # A slot takes what was served since the fold before it (a tick late under load): the rate rule
    # proper is the version's, over its whole window (_version).
    if errors > calls or calls > 2 * SLOT_S * MAX_CALLS_PER_S:
        raise refuse("range", f"{where}.calls", f"{where}: {errors} errors in {calls} calls is "
                                                f"impossible in a {SLOT_S} s slot")
    histogram = check_histogram(value[5], f"{where}.histogram", calls - errors)
    return AppSlot(start, calls, errors, local, cloud, tuple((i, c) for i, c in histogram))


def _version(value: Any, where: str, session: float, written: float) -> AppVersion:
    if not isinstance(value, dict):
        raise refuse("type", where, f"{where} {value!r:.60} must be an object")
    try:
        model = safe_name(value.get("model", ""), f"{where}.model")
    except EdgeSDKError as exc:
        raise refuse("id", f"{where}.model", str(exc)) from None
    activated = check_time(value.get("activated"), f"{where}.activated", session, written)
    slots = value.get("slots")
    if not isinstance(slots, list) or len(slots) > _MAX_SLOTS:
        raise refuse("type", f"{where}.slots", f"{where}.slots must be a list of at most "
                                               f"{_MAX_SLOTS} slots")
    parsed = tuple(_slot(slot, f"{where}.slots[{i}]", written) for i, slot in enumerate(slots))
    if any(a.start >= b.start for a, b in zip(parsed, parsed[1:])):
        raise refuse("range", f"{where}.slots", f"{where}.slots are not in increasing order")
    if parsed:
        since = max(parsed[0].start, activated)
        calls = sum(slot.calls for slot in parsed)
        if calls > (written - since + 1) * MAX_CALLS_PER_S:
            raise refuse("range", f"{where}.slots",
                         f"{where}: {calls} calls in {written - since:g} s is over "
                         f"{MAX_CALLS_PER_S} calls/s")
    return AppVersion(model, activated, parsed)


def parse_app_file(data: bytes) -> AppSession:
    """An app file, checked; :class:`~edgesdk.errors.ReportError` naming the field otherwise."""
    body = loads(data, "app file", MAX_APP_FILE_BYTES)
    if not isinstance(body, dict) or body.get("format") != APP_FORMAT:
        raise refuse("range", "format", f"not an app file of format {APP_FORMAT}")
    try:
        app = check_id(body.get("app", ""), "app")
    except EdgeSDKError as exc:
        raise refuse("id", "app", str(exc)) from None
    pid = check_count(body.get("pid"), "pid")
    if not 0 < pid < 2**31:
        raise refuse("range", "pid", f"pid {pid} is not a process id")
    written = check_time(body.get("written"), "written")
    session = check_time(body.get("session"), "session", 0.0, written)
    versions = body.get("versions")
    if not isinstance(versions, dict) or len(versions) > MAX_VERSIONS:
        raise refuse("type", "versions", f"versions must be an object of at most {MAX_VERSIONS}")
    parsed = {check_version(v, f"versions.{v!s:.64}"):
              _version(entry, f"versions.{v}", session, written) for v, entry in versions.items()}
    return AppSession(app, pid, session, written, parsed)


def session_of(app: str, pid: int, document: Mapping[str, Any], written: float) -> AppSession:
    """A ledger document of this process as an :class:`AppSession` (the agent's own ManagedRuntime),
    through the same checks as a file."""
    return parse_app_file(encode_app_file(app, pid, document, written))

