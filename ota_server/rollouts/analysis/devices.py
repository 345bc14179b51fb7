"""Each device of a stage judged on its figures against its board's baseline: pass, fail or thin.

A device **fails** when its install failed (health check, refusal, timeout), when it committed and
then went offline or silent, when its app restarted in a loop on the new version, when its error
rate is above the baseline's by more than the limit with 95% confidence, when its p99 is more than
``max_p99_ratio`` times the baseline's with 95% confidence (:mod:`.confidence`: over 100 calls a p99
is mostly its few slowest calls), or when its offload share rose by more than ``max_offload_share``.
It is **thin** (no evidence either way) while it made fewer than ``min_calls`` calls, while its
calls cannot yet tell with 95% confidence that its error rate is within the limit (with no error at
all that takes about 300 calls at a 1-point limit), while its p99 is over the limit but not surely
so, when its figures were refused or are missing, and when there is nothing to compare its latency
with. Otherwise it **passes**. The error rule needs no ``min_calls`` to fail a device: one failing
every one of its 30 calls fails already.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgesdk.fleet.policy import RolloutPolicy

from .baselines import Baseline
from .confidence import p99_lower
from .evidence import StageDevice
from .figures import VersionFigures, error_verdict, version_figures

__all__ = ["DeviceVerdict", "judge_device", "PASS", "FAIL", "THIN", "SILENT_AFTER_S",
           "RESTART_LOOP"]

PASS, FAIL, THIN = "pass", "fail", "thin"
#: A committed device the server has not heard from for this long is silent (an agent being judged
#: reports every 10 s by default: this is six missed reports).
SILENT_AFTER_S = 60.0
#: An app that restarted this many times on the new version within the agent's window is in a crash
#: loop.
RESTART_LOOP = 2


@dataclass(frozen=True)
class DeviceVerdict:
    """One device's verdict: its outcome, the reason with its figures, and those figures."""

    device_id: str
    board: str
    outcome: str
    reason: str
    figures: dict[str, Any] | None = None

    @property
    def evidence(self) -> bool:
        """True for a device that says something either way (passed or failed)."""
        return self.outcome != THIN

    def to_json(self) -> dict[str, Any]:
        """The device as a verdict lists it."""
        shown = {"device": self.device_id, "board": self.board, "outcome": self.outcome,
                 "reason": self.reason}
        return {**shown, "figures": self.figures} if self.figures else shown


def _ms(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _not_reporting(device: StageDevice, now: float) -> str | None:
    """Why a device counts against the stage before any figure is read, or None."""
    if device.status.failed:
        return f"its install failed ({device.status}): {device.reason or 'no reason given'}"
    if not device.online:
        return "went offline after it committed"
    if device.heard_at is None:
        return "never reported a state"
    if now - device.heard_at > SILENT_AFTER_S:
        committed = device.heard_at >= device.updated
        since = " after it committed" if committed else " (none since it committed)"
        return f"silent: no state for {now - device.heard_at:.0f} s{since}"
    return None


_NO_BASELINE = ("no baseline for its board (no device on the old version with figures, no figures "
                "kept from an earlier stage, none of its own previous version)")


def _latency(figures: VersionFigures, baseline: Baseline | None,
             limit: float) -> tuple[str, str]:
    """The p99 check of a device with enough calls: (outcome, reason)."""
    if figures.p99_ms is None:
        return THIN, "no successful call to time"
    if baseline is None or not baseline.p99_ms:
        return THIN, _NO_BASELINE
    ratio = figures.p99_ms / baseline.p99_ms
    succeeded = figures.calls - figures.errors
    lower = p99_lower(succeeded, figures.p95_ms, figures.p99_ms, figures.histogram) or 0.0
    surely = lower / baseline.p99_ms
    compared = (f"p99 {_ms(figures.p99_ms)} ms is {ratio:.1f}x the {baseline.source} baseline's "
                f"{_ms(baseline.p99_ms)} ms")
    if surely > limit:
        return FAIL, f"{compared} (> {limit:g}x; at least {surely:.1f}x with 95% confidence)"
    if ratio > limit:
        return THIN, f"{compared}, but over {figures.calls} calls only {surely:.1f}x is sure"
    return PASS, f"p99 {_ms(figures.p99_ms)} ms = {ratio:.2f}x the {baseline.source} baseline"


def _offload(figures: VersionFigures, baseline: Baseline | None, limit: float) -> str | None:
    """Why a device offloads too much more than its baseline, or None."""
    share = figures.offload_share
    if share is None:
        return None
    floor = baseline.offload_share if baseline is not None else None
    floor = floor if floor is not None else 0.0
    if share - floor <= limit:
        return None
    return (f"offloads {share:.0%} of its requests, {share - floor:.0%} above the baseline's "
            f"{floor:.0%} (> {limit:.0%})")


def _checks(figures: VersionFigures, baseline: Baseline | None,
            policy: RolloutPolicy) -> tuple[str, str]:
    """The latency and offload checks of a device with enough calls: (outcome, reason)."""
    said = [f"{figures.calls} calls, {figures.errors} failed"]
    if policy.max_p99_ratio is not None:
        outcome, reason = _latency(figures, baseline, policy.max_p99_ratio)
        if outcome != PASS:
            return outcome, reason
        said.append(reason)
    if policy.max_offload_share is not None:
        if (too_much := _offload(figures, baseline, policy.max_offload_share)) is not None:
            return FAIL, too_much
    return PASS, ", ".join(said)


def judge_device(device: StageDevice, version: str, baseline: Baseline | None,
                 policy: RolloutPolicy, now: float) -> DeviceVerdict:
    """The verdict on one device of the stage (see the module doc)."""
    def verdict(outcome: str, reason: str, figures: VersionFigures | None = None) -> DeviceVerdict:
        return DeviceVerdict(device.device_id, device.board, outcome, reason,
                             figures.to_json() if figures is not None else None)

    if (against := _not_reporting(device, now)) is not None:
        return verdict(FAIL, against)
    figures = version_figures(device.details, version)
    if isinstance(figures, str):
        return verdict(THIN, figures)
    if figures.restarts >= RESTART_LOOP:
        looping = f"its app restarted {figures.restarts} times on {version} (a crash loop)"
        return verdict(FAIL, looping, figures)
    floor = baseline.error_rate if baseline is not None else None
    floor = floor if floor is not None else 0.0
    limit = policy.max_error_rate
    errors_within: bool | None = True
    if limit is not None and figures.calls:
        errors_within = error_verdict(figures, floor, limit)
    rate = (f"error rate {figures.errors / max(figures.calls, 1):.2%} "
            f"({figures.errors}/{figures.calls} calls)")
    bound = f"the baseline's {floor:.2%} + {limit or 0:.2%}"
    if errors_within is False:
        return verdict(FAIL, f"{rate} is above {bound} (95% confidence)", figures)
    if figures.calls < policy.min_calls:
        short = f"made {figures.calls} of the {policy.min_calls} calls needed on {version}"
        return verdict(THIN, short, figures)
    outcome, reason = _checks(figures, baseline, policy)
    if outcome == PASS and errors_within is None:
        unsure = f"{rate}: too few calls yet to be 95% sure it is within {bound}"
        return verdict(THIN, unsure, figures)
    return verdict(outcome, reason, figures)
