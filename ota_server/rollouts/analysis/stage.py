"""A stage's verdict from its devices', board by board: passed, failed, inconclusive or waiting.

**Per board, by majority.** ``needed`` is ``min_evidence`` of the board's devices in the stage (at
least one). A board fails when at least that many of its devices failed, more than passed, and at
least two (or its only device in the stage): noisy first figures of a few devices cannot abort a
stage. A single failing device among others is judged as if it were not there (``needed`` of the
others must pass): one device, lying or unlucky, can neither abort a stage nor hold back a board
whose other devices passed. A board passes when at least ``needed`` passed and more passed than
failed. Otherwise it is inconclusive (too little evidence, or a split).

**The stage.** It fails when any board failed; it passes when every board passed and at least
``min_evidence`` of all its devices have evidence; otherwise it is inconclusive. Before the stage's
deadline (its health window plus ``evidence_grace_s`` after it settled) an inconclusive stage is
*waiting*: the engine judges it again as figures arrive. At the deadline, inconclusive is final: the
rollout pauses (or aborts, with ``on_inconclusive="abort"``). Nothing passes on missing evidence: no
figures at all is inconclusive, not a pass.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgesdk.fleet.policy import RolloutPolicy
from edgesdk.fleet.records import iso_time

from .baselines import Baseline, live_baselines, own_baseline, snapshot_of, stored_baselines
from .devices import FAIL, PASS, THIN, DeviceVerdict, judge_device
from .evidence import BaselineDevice, StageDevice

__all__ = ["judge_stage", "BoardVerdict", "PASSED", "FAILED", "INCONCLUSIVE", "WAITING", "needed"]

PASSED, FAILED, INCONCLUSIVE, WAITING = "passed", "failed", "inconclusive", "waiting"
#: Devices a verdict lists by name (failures and thin ones first); the counts cover them all.
_LISTED = 50
#: Devices a reason names per board.
_NAMED = 3


def needed(policy: RolloutPolicy, devices: int) -> int:
    """How many of ``devices`` must have evidence: ``min_evidence`` of them, at least one."""
    return max(1, math.ceil(policy.min_evidence * devices - 1e-9))


@dataclass(frozen=True)
class BoardVerdict:
    """One board's part of a stage: its outcome and why, its devices' counts, its baseline."""

    board: str
    outcome: str
    reason: str
    devices: int
    passed: int
    failed: int
    thin: int
    needed: int
    baseline: Baseline | None
    p99_ms: float | None

    def to_json(self, now: float) -> dict[str, Any]:
        """The board as a verdict lists it."""
        counts = {"devices": self.devices, "passed": self.passed, "failed": self.failed,
                  "thin": self.thin, "needed": self.needed}
        return {"board": self.board, "outcome": self.outcome, "reason": self.reason, **counts,
                "p99_ms": self.p99_ms,
                "baseline": self.baseline.to_json(now) if self.baseline else None}

    def check(self) -> dict[str, Any]:
        """The board as one of the verdict's ``checks`` (the console's table)."""
        return {"name": f"board {self.board}",
                "value": f"{self.passed} passed, {self.failed} failed, {self.thin} thin",
                "canary": self.p99_ms, "baseline": self.baseline.p99_ms if self.baseline else None,
                "limit": f"{self.needed} with evidence",
                "passed": {PASSED: True, FAILED: False}.get(self.outcome)}


def _named(verdicts: Iterable[DeviceVerdict]) -> str:
    listed = list(verdicts)
    text = "; ".join(f"{v.device_id}: {v.reason}" for v in listed[:_NAMED])
    return text + (f"; and {len(listed) - _NAMED} more" if len(listed) > _NAMED else "")


def _median_p99(verdicts: Iterable[DeviceVerdict]) -> float | None:
    """The median p99 of the devices with evidence (None: none has one)."""
    p99s = [v.figures["p99_ms"] for v in verdicts
            if v.evidence and v.figures and v.figures.get("p99_ms") is not None]
    return statistics.median(p99s) if p99s else None


def _judge_board(board: str, verdicts: list[DeviceVerdict], policy: RolloutPolicy,
                 baseline: Baseline | None) -> BoardVerdict:
    passed = [v for v in verdicts if v.outcome == PASS]
    failed = [v for v in verdicts if v.outcome == FAIL]
    thin = [v for v in verdicts if v.outcome == THIN]
    n, fails, passes = len(verdicts), len(failed), len(passed)
    # One failing device among others is judged as if it were not there: alone it cannot steer the
    # board's verdict.
    alone = fails == 1 and n > 1
    need = needed(policy, n - 1 if alone else n)
    if not alone and fails > passes and fails >= max(need, min(2, n)):
        outcome, reason = FAILED, f"{fails} of {n} devices failed: {_named(failed)}"
    elif passes >= need and (passes > fails or alone):
        outvoted = f"; outvoted: {_named(failed)}" if failed else ""
        outcome, reason = PASSED, f"{passes} of {n} devices passed{outvoted}"
    elif passes + fails < need:
        outcome = INCONCLUSIVE
        reason = f"{passes + fails} of {n} devices have evidence, {need} needed: {_named(thin)}"
    else:
        outcome = INCONCLUSIVE
        reason = (f"{passes} passed and {fails} failed of {n} devices ({need} needed either way): "
                  f"{_named(failed or thin)}")
    return BoardVerdict(board, outcome, reason, n, passes, fails, len(thin), need, baseline,
                        _median_p99(verdicts))


def _outcome(boards: Sequence[BoardVerdict], verdicts: Sequence[DeviceVerdict],
             policy: RolloutPolicy, final: bool) -> tuple[str, str]:
    """The stage's outcome and reason from its boards."""
    evidence, need = sum(v.evidence for v in verdicts), needed(policy, len(verdicts))
    if failing := [b for b in boards if b.outcome == FAILED]:
        return FAILED, "; ".join(f"on {b.board}, {b.reason}" for b in failing)
    unsure = [b for b in boards if b.outcome != PASSED]
    if not unsure and evidence >= need:
        over = f"{len(boards)} board{'s' if len(boards) != 1 else ''}"
        each = "; ".join(f"{b.board}: {b.reason}" for b in boards)
        passes = sum(b.passed for b in boards)
        return PASSED, f"{passes} of {len(verdicts)} devices passed over {over}: {each}"
    said = "; ".join(f"on {b.board}, {b.reason}" for b in unsure) or (
        f"{evidence} of {len(verdicts)} devices have evidence, {need} needed")
    if not final:
        return WAITING, f"waiting for evidence until the stage's deadline: {said}"
    return INCONCLUSIVE, f"inconclusive: {said}"


def _summary(verdicts: Sequence[DeviceVerdict]) -> dict[str, Any]:
    return {"devices": len(verdicts), "evidence": sum(v.evidence for v in verdicts),
            "passed": sum(v.outcome == PASS for v in verdicts),
            "failed": sum(v.outcome == FAIL for v in verdicts),
            "thin": sum(v.outcome == THIN for v in verdicts), "p99_ms": _median_p99(verdicts)}


def _live_summary(live: Mapping[str, Baseline]) -> dict[str, Any] | None:
    """The live baselines over all boards, as the verdict's ``baseline`` (None: there are none)."""
    if not live:
        return None
    p99s = [b.p99_ms for b in live.values() if b.p99_ms is not None]
    return {"source": "live", "devices": sum(b.devices for b in live.values()), "boards": len(live),
            "p99_ms": statistics.median(p99s) if p99s else None}


def _limits(policy: RolloutPolicy) -> dict[str, Any]:
    return {"max_p99_ratio": policy.max_p99_ratio, "max_error_rate": policy.max_error_rate,
            "max_offload_share": policy.max_offload_share, "min_calls": policy.min_calls,
            "min_evidence": policy.min_evidence, "evidence_grace_s": policy.evidence_grace_s,
            "max_baseline_age_s": policy.max_baseline_age_s}


def judge_stage(policy: RolloutPolicy, stage: int, version: str, devices: Sequence[StageDevice],
                baseline_devices: Iterable[BaselineDevice], snapshot: Mapping[str, Any] | None,
                now: float, final: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The verdict of stage ``stage`` (0-based) of a rollout to ``version`` as JSON, and the
    snapshot of the boards' baselines to keep for the next stages (None: keep the stored one).

    ``devices``: those the stage sent the release to that are done with it (committed or failed);
    ``final``: the stage's deadline passed (an inconclusive stage is then final, else waiting). The
    verdict is ``{"stage" (1-based), "version", "outcome", "passed", "final", "reason", "judged_at",
    "canary", "baseline", "boards", "devices", "checks", "limits"}``.
    """
    base: dict[str, Any] = {"stage": stage + 1, "version": version, "judged_at": iso_time(now),
                            "limits": _limits(policy)}
    if not policy.judged:
        reason = "not judged: " + "; ".join(policy.not_judged())
        return {**base, "outcome": PASSED, "passed": True, "final": True, "reason": reason}, None
    live = live_baselines(baseline_devices, policy, now)
    stored = stored_baselines(snapshot, policy, now)
    by_board: dict[str, list[DeviceVerdict]] = defaultdict(list)
    for device in devices:
        chosen = live.get(device.board) or stored.get(device.board) or own_baseline(
            device.details, device.previous_version, policy, device.heard_at)
        by_board[device.board].append(judge_device(device, version, chosen, policy, now))
    boards = [_judge_board(board, found, policy, live.get(board) or stored.get(board))
              for board, found in sorted(by_board.items())]
    verdicts = [v for found in by_board.values() for v in found]
    outcome, reason = _outcome(boards, verdicts, policy, final)
    order = {FAIL: 0, THIN: 1, PASS: 2}
    listed = sorted(verdicts, key=lambda v: (order[v.outcome], v.device_id))[:_LISTED]
    verdict = {**base, "outcome": outcome, "passed": outcome == PASSED, "final": outcome != WAITING,
               "reason": reason, "canary": _summary(verdicts), "baseline": _live_summary(live),
               "boards": [b.to_json(now) for b in boards], "devices": [v.to_json() for v in listed],
               "checks": [b.check() for b in boards]}
    return verdict, snapshot_of(live, snapshot) if outcome == PASSED else None
