"""How the console writes a time, a stage, a target's status, a device's board and a canary verdict: one helper
each, used by every page (and mirrored by the live view's script where it redraws the same things).

Times are relative ("37 s ago", "in 30 s") with the ISO 8601 UTC time in the ``<time>`` element's ``datetime`` and
shown on hover; stages are 1-based "1 of 3", the canary being stage 1, as the CLI numbers them (the API's JSON stays
0-based); statuses read as words, and the ones that are not failures (``skipped``, ``no_artifact``,
``deferred``, ``ahead``) say why on hover.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from markupsafe import Markup

from edgesdk.fleet.records import TargetStatus, iso_time, parse_time

__all__ = ["ago", "when", "stage_label", "STATUS_TEXT", "status_text", "status_pill", "board", "verdict_view"]

#: Each target status as words, and what it means when it is not obvious (shown on hover).
STATUS_TEXT: dict[str, tuple[str, str]] = {
    s.value: (s.value.replace("_", " "), "") for s in TargetStatus
} | {
    TargetStatus.NO_ARTIFACT.value: ("no artifact", "the release has no artifact for this device's board: it was "
                                                    "not sent another board's bundle and stays on its version"),
    TargetStatus.SKIPPED.value: ("skipped", "never sent: the rollout ended before this device's stage"),
    TargetStatus.DEFERRED.value: ("deferred", "offline when its stage went out: it gets the release when it "
                                              "reports again"),
    TargetStatus.REVERTED.value: ("reverted", "sent back to its previous version after the abort"),
    TargetStatus.AHEAD.value: ("ahead", "the device runs a newer version than the release: it is "
                                        "not sent a downgrade (a rollback of the group would)"),
}


def ago(seconds: float) -> str:
    """``seconds`` since an instant as words: "37 s ago", "3 min ago", "2 h ago", "4 d ago"; negative is the
    future: "in 30 s"."""
    whole = int(abs(seconds))
    words = f"{whole} s"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if whole >= size:
            words = f"{whole // size} {unit}"
            break
    return f"in {words}" if seconds < 0 and whole else f"{words} ago"


def _epoch(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            return parse_time(value)
        except ValueError:
            return None
    return None


def when(value: Any, now: float | None = None) -> Markup:
    """The console's one way to show an instant: ``<time datetime="ISO" title="ISO">37 s ago</time>``.

    ``value`` is epoch seconds or an API time (ISO 8601); None or anything unreadable shows as "—".
    """
    at = _epoch(value)
    if at is None:
        return Markup("—")
    iso = iso_time(at)
    words = ago((time.time() if now is None else now) - at)
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(iso, words)


def stage_label(stage: int, count: int) -> str:
    """A 0-based stage index as the operator reads it: "1 of 3" (the canary is stage 1)."""
    return f"{max(stage, 0) + 1} of {max(count, stage + 1, 1)}"


def status_text(status: str) -> str:
    """A target status in words ("no artifact" for ``no_artifact``)."""
    return STATUS_TEXT.get(status, (str(status), ""))[0]


def status_pill(status: str, count: int | None = None) -> Markup:
    """A status as a pill, with its meaning on hover and its count after it when given."""
    text, hint = STATUS_TEXT.get(status, (str(status), ""))
    label = text if count is None else f"{text} {count}"
    title = Markup(' title="{0}"').format(hint) if hint else Markup("")
    return Markup('<span class="pill {0}"{1}>{2}</span>').format(status, title, label)


def board(profile: Any, arch: Any) -> str:
    """A device's board as "raspberry-pi-5 (aarch64)"; "unknown" while its agent has not said (an older agent)."""
    name = profile if isinstance(profile, str) and profile else "unknown"
    return f"{name} ({arch})" if isinstance(arch, str) and arch else name


def _figure(value: Any, longest: int = 120) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else "—"
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        text = ", ".join(str(v) for v in value) or "none"
    else:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= longest else text[:longest - 1] + "…"


#: Prefixes of flat verdict figures that name the side they were measured on (``canary_p99_ms``).
_SIDES = ("canary", "baseline")
#: Verdict keys shown apart from the figures table.
_VERDICT_META = ("passed", "outcome", "final", "reason", "stage", "version", "judged_at", "checks", "limits")
#: Verdict keys whose lists are shown apart (the boards and devices a verdict names); a number by that name is a figure.
_VERDICT_LISTS = ("boards", "devices")
#: A verdict's outcome as the page words it.
_OUTCOMES = {"passed": "passed", "failed": "failed", "inconclusive": "inconclusive: paused",
             "waiting": "waiting for evidence"}


def _checks(raw: Any) -> list[dict[str, str]]:
    """Each check of a verdict (a list of dicts such as ``{"name", "value", "limit", "passed"}``) as text."""
    if not isinstance(raw, list):
        return []
    out = []
    for check in raw[:16]:
        if isinstance(check, dict):
            passed = check.get("passed")
            out.append({"name": _figure(check.get("name", "?")), "value": _figure(check.get("value")),
                        "canary": _figure(check.get("canary")), "baseline": _figure(check.get("baseline")),
                        "limit": _figure(check.get("limit")),
                        "passed": "passed" if passed is True else "failed" if passed is False else "—"})
    return out


def _device_rows(raw: Any) -> list[dict[str, str]]:
    """The devices a verdict names (failed and thin first), as text: device, board, outcome, reason."""
    if not isinstance(raw, list):
        return []
    return [{"device": _figure(d.get("device")), "board": _figure(d.get("board")),
             "outcome": _figure(d.get("outcome")), "reason": _figure(d.get("reason"), 300)}
            for d in raw[:50] if isinstance(d, dict)]


def verdict_view(raw: Any) -> dict[str, Any] | None:
    """A canary verdict (``RolloutRecord.verdict``, any dict) as the rollout page shows it, or None when there is
    none: ``passed`` (True, False or None when unsaid), ``reason``, the stage it judged ("1 of N" is the canary),
    its checks, limits, and its figures as a table.

    Figures may be nested by side (``{"canary": {"p99_ms": 17.6}, "baseline": {"p99_ms": 5.4}}``), flat with the
    side as a prefix (``canary_p99_ms``), or plain (``devices``): sides become columns, figures rows. A value of the
    wrong type shows as text, never an error.
    """
    if not isinstance(raw, dict) or not raw:
        return None
    passed = raw.get("passed")
    columns: list[str] = []
    rows: dict[str, dict[str, str]] = {}

    def put(row: str, column: str, value: Any) -> None:
        if column not in columns:
            columns.append(column)
        rows.setdefault(row, {})[column] = _figure(value)

    for key, value in raw.items():
        name = str(key)
        if name in _VERDICT_META or (name in _VERDICT_LISTS and isinstance(value, list)):
            continue
        if isinstance(value, dict):
            for figure, number in value.items():
                put(str(figure), name, number)
            continue
        side = next((s for s in _SIDES if name.startswith(f"{s}_")), None)
        if side is not None:
            put(name[len(side) + 1:], side, value)
        elif value is not None:
            put(name, "value", value)
    stage = raw.get("stage")
    limits = raw.get("limits")
    outcome = raw.get("outcome") if raw.get("outcome") in _OUTCOMES else (
        "passed" if passed is True else "failed" if passed is False else None)
    return {"passed": passed if isinstance(passed, bool) else None,
            "outcome": outcome, "outcome_text": _OUTCOMES.get(str(outcome), "not said"),
            "devices": _device_rows(raw.get("devices")),
            "reason": _figure(raw["reason"], 1000) if raw.get("reason") is not None else None,
            "stage": stage if isinstance(stage, int) and not isinstance(stage, bool) and stage > 0 else None,
            "version": _figure(raw["version"]) if raw.get("version") is not None else None,
            "judged_at": raw.get("judged_at"), "checks": _checks(raw.get("checks")),
            "limits": [(str(k), _figure(v)) for k, v in limits.items()] if isinstance(limits, dict) else [],
            "columns": columns, "rows": [{"figure": name, "cells": [cells.get(c, "") for c in columns]}
                                         for name, cells in rows.items()]}
