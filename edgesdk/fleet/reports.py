"""What devices send the server, as typed and bounded records: states, events and chunk requests.

Every message a device publishes is untrusted input: a device holding broker credentials can put
anything in its own topics. The server reads each message through one of the parsers here, which
either return a frozen record whose every field has the type, length and range the fleet store
and the rollout engine expect, or raise :class:`~edgesdk.errors.ReportError` with a short machine
``reason`` and the ``field`` at fault. A refused message is dropped whole; nothing of it reaches
the store. (Measurement results are parsed by :func:`edgesdk.fleet.measurement.parse_result`
with the same helpers and the same error.)

The bounds, each far above what the agent sends (:mod:`edgesdk.agent.state_report`,
:mod:`edgesdk.agent.events`, :mod:`edgesdk.agent.downloads`):

- a message is at most :data:`MAX_REPORT_BYTES` of strict JSON (no ``NaN``/``Infinity``, no number
  that overflows a float, nesting at most :data:`MAX_DEPTH` deep);
- ids (device, group, deployment, transfer, status, event kind) pass
  :func:`edgesdk.fleet.protocol.check_id`; model and slot names pass
  :func:`edgesdk.runtime.bundle.safe_name`; versions are dotted integers
  (:func:`edgesdk.runtime.bundle.parse_version`) of at most :data:`MAX_VERSION_CHARS`;
- whole numbers fit a signed 64-bit integer (a root version is 1 .. 2**63-1, a chunk index
  0 .. 2**31-1), figures are finite, timestamps lie in 0 .. 2**53;
- lists hold at most :data:`MAX_ITEMS` items, other strings at most :data:`MAX_TEXT_CHARS`
  characters, and the free-form parts (a state's details, an event's payload) re-serialise to at
  most :data:`MAX_DETAILS_BYTES`;
- an event's ``reason`` (an exception's text on the device) is **truncated** to
  :data:`MAX_REASON_CHARS`, not refused: a failure report must reach the rollout engine, which
  rolls back on it, even when the device's error message is long;
- a chunk request may name at most :data:`MAX_ITEMS` indices, all checked; the record keeps the
  first :data:`MAX_CHUNKS_SERVED` (the device asks again for what does not come).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgesdk.errors import EdgeSDKError, ReportError
from edgesdk.fleet.protocol import check_id
from edgesdk.runtime.bundle import parse_version, safe_name

__all__ = ["StateReport", "EventReport", "ChunkRequest", "parse_state", "parse_event", "parse_chunk_request",
           "loads", "plain", "cut_text", "report_id", "REASONS", "DETAIL_FIELDS", "MAX_REPORT_BYTES", "MAX_REASON_CHARS"]

#: Largest device state, event or chunk request (bytes of JSON); a larger one is refused unparsed.
MAX_REPORT_BYTES = 64 * 1024
#: An event's ``reason`` is cut to this many characters (and ends in "…" when it was).
MAX_REASON_CHARS = 1000
#: Any other string value.
MAX_TEXT_CHARS = 4096
MAX_VERSION_CHARS = 64
#: Items in any list or object.
MAX_ITEMS = 1024
#: Nesting of lists and objects.
MAX_DEPTH = 8
#: A state's details, or an event's payload, as compact JSON.
MAX_DETAILS_BYTES = 32 * 1024
#: Chunk indices one request is answered for.
MAX_CHUNKS_SERVED = 256
INT64_MAX = 2**63 - 1
#: The largest value a PostgreSQL INTEGER column holds (the store keeps root versions and connection numbers in one).
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
MAX_CHUNK_INDEX = 2**31 - 1
_MAX_TIMESTAMP = float(2**53)
#: The machine reasons a refusal carries (servers count refusals by them).
REASONS = ("length", "json", "type", "range", "id", "missing")
#: The keys of a state report kept as the device's details (what the console shows; ``traffic``,
#: the apps' figures per version, is what the canary judge reads: :mod:`edgesdk.fleet.traffic`).
DETAIL_FIELDS = ("runtime", "disk", "previous", "energy", "keep_slots", "pinned",
                 "power_mode_applied", "power_mode", "traffic")


def _refuse(reason: str, field_name: str, message: str) -> ReportError:
    return ReportError(message, reason=reason, field=field_name)


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number (send finite figures, or null)")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} overflows a float")
    return value


def loads(payload: bytes, what: str, max_bytes: int = MAX_REPORT_BYTES) -> Any:
    """Strict JSON of at most ``max_bytes``: finite numbers only; ReportError ``length`` or ``json`` otherwise."""
    if len(payload) > max_bytes:
        raise _refuse("length", "", f"a {len(payload)}-byte {what} is over the {max_bytes}-byte cap of device "
                                    "reports; send a smaller one")
    try:
        return json.loads(payload, parse_constant=_constant, parse_float=_float)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _refuse("json", "", f"the {what} is not JSON ({str(exc)[:200]}); send one JSON object") from None


def plain(value: Any, field_name: str, depth: int = 0) -> Any:
    """``value`` when it is JSON within the bounds (64-bit ints, finite floats, capped strings, lists and
    objects, nesting), else ReportError naming ``field_name``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return _int(value, field_name, INT64_MIN, INT64_MAX)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _refuse("range", field_name, f"{field_name} {value!r} must be a finite number")
        return value
    if isinstance(value, str):
        return _text(value, field_name, MAX_TEXT_CHARS)
    if depth >= MAX_DEPTH:
        raise _refuse("length", field_name, f"{field_name} nests deeper than {MAX_DEPTH} levels; flatten it")
    if isinstance(value, list):
        _count(value, field_name)
        return [plain(item, field_name, depth + 1) for item in value]
    if isinstance(value, dict):
        _count(value, field_name)
        return {_text(k, field_name, 256): plain(v, f"{field_name}.{k}"[:300], depth + 1) for k, v in value.items()}
    raise _refuse("type", field_name, f"{field_name} of type {type(value).__name__} is not a JSON value")


def _count(value: list[Any] | dict[str, Any], field_name: str) -> None:
    if len(value) > MAX_ITEMS:
        raise _refuse("length", field_name, f"{field_name} holds {len(value)} items; at most {MAX_ITEMS} are read")


def _text(value: Any, field_name: str, limit: int) -> str:
    if not isinstance(value, str):
        raise _refuse("type", field_name, f"{field_name} {_show(value)} must be a string")
    if len(value) > limit:
        raise _refuse("length", field_name, f"{field_name} of {len(value)} characters is over the {limit}-character "
                                            "cap; send a shorter one")
    return value


def _int(value: Any, field_name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse("type", field_name, f"{field_name} {_show(value)} must be a whole number")
    if not low <= value <= high:
        raise _refuse("range", field_name, f"{field_name} {_show(value)} is outside {low}..{high}")
    return value


def _number(value: Any, field_name: str, low: float = -math.inf, high: float = math.inf) -> float | None:
    """A finite number within [low, high] as a float, or None for null / absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse("type", field_name, f"{field_name} {_show(value)} must be a number or null")
    if not (math.isfinite(value) and low <= value <= high):
        raise _refuse("range", field_name, f"{field_name} {_show(value)} must be a finite number in {low:g}..{high:g}")
    return float(value)


def cut_text(value: Any, field_name: str, limit: int = MAX_REASON_CHARS) -> str | None:
    """A device's free text (an error message): None stays None, a longer one is cut to ``limit`` characters
    ending in "…"; anything but a string is ReportError ``type``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise _refuse("type", field_name, f"{field_name} {_show(value)} must be a string or null")
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _checked(check: Callable[[Any, str], str], value: Any, field_name: str) -> str:
    """``check(value, field_name)``, its EdgeSDKError turned into ReportError ``id`` (``type`` for a non-string)."""
    try:
        return check(value, field_name)
    except EdgeSDKError as exc:
        raise _refuse("id" if isinstance(value, str) else "type", field_name, str(exc)[:300]) from None


def report_id(value: Any, field_name: str) -> str:
    """``value`` when it is an id (:func:`~edgesdk.fleet.protocol.check_id`), else ReportError ``id`` (or ``type``)."""
    return _checked(check_id, value, field_name)


def _name(value: Any, field_name: str) -> str | None:
    return None if value is None else _checked(safe_name, value, field_name)


def _version(value: Any, field_name: str) -> str | None:
    if value is None:
        return None
    _text(value, field_name, MAX_VERSION_CHARS)
    try:
        parse_version(value)
    except EdgeSDKError as exc:
        raise _refuse("id", field_name, str(exc)[:300]) from None
    return value


def _names(value: Any, field_name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _refuse("type", field_name, f"{field_name} {_show(value)} must be a list of names")
    _count(value, field_name)
    names = []
    for item in value:
        if item is None:
            raise _refuse("type", field_name, f"{field_name} holds null; it must list names only")
        names.append(str(_name(item, field_name)))
    return tuple(names)


def _object(value: Any, field_name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _refuse("type", field_name, f"{field_name} {_show(value)} must be an object")
    return value


def _message(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _refuse("type", "", f"the {what} {_show(value)} must be a JSON object")
    return value


def _compact(value: Any, field_name: str) -> str:
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    if len(text) > MAX_DETAILS_BYTES:
        raise _refuse("length", field_name, f"{field_name} of {len(text)} bytes is over the {MAX_DETAILS_BYTES}-byte "
                                            "cap; report less")
    return text


def _show(value: Any) -> str:
    """A value for a message, cut short (it may be huge)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _device(device: Any) -> str:
    return report_id(device, "device id")


def _traffic(value: Any) -> dict[str, Any]:
    """The state's app traffic, checked (:func:`edgesdk.fleet.traffic.parse_traffic`).

    Refused figures do not refuse the state: they become ``{"refused": why}``, which the canary
    judge cites (the device's other details still count).
    """
    from edgesdk.fleet.traffic import parse_traffic

    try:
        return parse_traffic(value)
    except ReportError as exc:
        return {"refused": cut_text(str(exc), "traffic")}


@dataclass(frozen=True)
class StateReport:
    """A device's state, checked (:func:`parse_state`); ``details`` holds the :data:`DETAIL_FIELDS` it sent."""

    device: str
    group: str
    status: str
    model: str | None = None
    version: str | None = None
    slots: tuple[str, ...] = ()
    chunk_slots: tuple[str, ...] = ()
    energy_mj: float | None = None
    avg_watts: float | None = None
    root_version: int | None = None
    stale: bool | None = None
    #: When the device says it sent this, and when the run of its agent began (seconds since the epoch).
    updated: float | None = None
    session: float | None = None
    #: The device profile the agent runs as, and its CPU architecture (None from an agent too old to say).
    profile: str | None = None
    arch: str | None = None
    #: The console's part of the report, checked by :func:`plain`; compact JSON of it is at most MAX_DETAILS_BYTES.
    details: Mapping[str, Any] = field(default_factory=dict, compare=False)
    #: Which connection of that run sent it (1 for the first; its last will names the connection it ends; None from
    #: an agent too old to say).
    connection: int | None = None

    def details_json(self) -> str | None:
        """The details as compact JSON (None: the report had none)."""
        return json.dumps(dict(self.details), separators=(",", ":")) if self.details else None


def parse_state(device: str, payload: bytes) -> StateReport:
    """Check ``device``'s state message (the retained ``P/devices/D/state``, its last will included)."""
    device = _device(device)
    state = _message(loads(payload, "state"), "state")
    if "status" not in state:
        raise _refuse("missing", "status", "the state has no status; send {\"status\": \"online\", ...}")
    energy = _object(state.get("energy"), "energy")
    trust = _object(state.get("trust"), "trust")
    root_version = trust.get("root_version")
    stale = trust.get("stale")
    if stale is not None and not isinstance(stale, bool):
        raise _refuse("type", "trust.stale", f"trust.stale {_show(stale)} must be true, false or null")
    applied = state.get("power_mode_applied")
    if applied is not None and not isinstance(applied, bool):
        raise _refuse("type", "power_mode_applied", f"power_mode_applied {_show(applied)} must be true, false or null")
    details = {key: plain(state[key], key) for key in DETAIL_FIELDS
               if key in state and key != "traffic"}
    if state.get("traffic") is not None:
        details["traffic"] = _traffic(state["traffic"])
    _compact(details, "details")
    return StateReport(
        device, report_id(state.get("group", "default"), "group"), report_id(state["status"], "status"),
        _name(state.get("model"), "model"), _version(state.get("version"), "version"),
        _names(state.get("slots"), "slots"), _names(state.get("chunk_slots"), "chunk_slots"),
        _number(energy.get("energy_per_inference_mj"), "energy.energy_per_inference_mj"),
        _number(energy.get("avg_watts"), "energy.avg_watts", 0.0),
        None if root_version is None else _int(root_version, "trust.root_version", 1, INT32_MAX),
        stale, _number(state.get("updated"), "updated", 0.0, _MAX_TIMESTAMP),
        _number(state.get("session"), "session", 0.0, _MAX_TIMESTAMP), _name(state.get("profile"), "profile"),
        _name(state.get("arch"), "arch"), details,
        None if state.get("connection") is None else _int(state["connection"], "connection", 1, INT32_MAX))


@dataclass(frozen=True)
class EventReport:
    """A device's protocol event, checked (:func:`parse_event`); ``payload`` is what the event log keeps."""

    device: str
    kind: str
    #: The deployment it is about ("" for none); a rollback's ends in ``-rollback``.
    deployment_id: str
    name: str | None
    version: str | None
    #: Why (the device's error text), at most MAX_REASON_CHARS; None when the event gave none.
    reason: str | None
    time: float | None
    #: The whole event as checked, with ``reason`` cut as above (compact JSON at most MAX_DETAILS_BYTES).
    payload: Mapping[str, Any] = field(compare=False)

    @property
    def rollout_id(self) -> str | None:
        """The rollout the deployment belongs to (a rollback's deployment is its rollout's, plus ``-rollback``)."""
        return self.deployment_id.removesuffix("-rollback") or None


def parse_event(device: str, payload: bytes) -> EventReport:
    """Check ``device``'s event message (``P/devices/D/events``)."""
    device = _device(device)
    event = _message(loads(payload, "event"), "event")
    if "event" not in event:
        raise _refuse("missing", "event", "the event message has no \"event\" kind; send {\"event\": \"committed\", ...}")
    kind = report_id(event["event"], "event")
    deployment = event.get("deployment_id")
    deployment = report_id(deployment, "deployment_id") if deployment not in (None, "") else ""
    reason = cut_text(event.get("reason"), "reason")
    checked = {key: reason if key == "reason" else plain(value, key) for key, value in event.items()}
    _compact(checked, "event")
    return EventReport(device, kind, deployment, _name(event.get("name"), "name"), _version(event.get("version"),
                       "version"), reason, _number(event.get("time"), "time", 0.0, _MAX_TIMESTAMP), checked)


@dataclass(frozen=True)
class ChunkRequest:
    """A device's request for chunks it lacks (:func:`parse_chunk_request`)."""

    device: str
    transfer_id: str
    #: The indices to send, at most MAX_CHUNKS_SERVED, each 0 .. 2**31-1, in the device's order.
    chunks: tuple[int, ...]


def parse_chunk_request(device: str, payload: bytes) -> ChunkRequest:
    """Check ``device``'s chunk request (``P/devices/D/need``: ``{"transfer_id", "chunks": [i, ...]}``)."""
    device = _device(device)
    request = _message(loads(payload, "chunk request"), "chunk request")
    for key in ("transfer_id", "chunks"):
        if key not in request:
            raise _refuse("missing", key, f"the chunk request has no {key}; send {{\"transfer_id\": T, \"chunks\": "
                                          "[i, ...]}")
    chunks = request["chunks"]
    if not isinstance(chunks, list):
        raise _refuse("type", "chunks", f"chunks {_show(chunks)} must be a list of chunk indices")
    _count(chunks, "chunks")
    indices = tuple(_int(i, "chunks", 0, MAX_CHUNK_INDEX) for i in chunks)
    return ChunkRequest(device, report_id(request["transfer_id"], "transfer_id"), indices[:MAX_CHUNKS_SERVED])
