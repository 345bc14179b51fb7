"""How a rollout spreads and when it stops: the :class:`RolloutPolicy` an operator gives ``edgesdk push``.

Device-side (stdlib only), like :mod:`edgesdk.fleet.records`, which re-exports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from edgesdk.errors import EdgeSDKError

__all__ = ["RolloutPolicy"]


@dataclass(frozen=True)
class RolloutPolicy:
    """How a version spreads over a group in stages, and when it stops.

    Stages are cumulative fractions of the group: ``canary`` first, then ``waves``, the
    later stages (the ``--waves`` option), which increase and end at 1.0.
    """

    canary: float = 0.1
    #: The later stages after the canary, as increasing cumulative fractions ending at 1.0.
    waves: tuple[float, ...] = (0.5, 1.0)
    #: After a stage's devices all report, wait this long for late failures before the next stage.
    health_window_s: float = 60.0
    #: Abort (and roll the stage's devices back) when more than this fraction of targets failed.
    max_failure_rate: float = 0.05
    #: A device online and silent this long after its command is sent it once more (if it was not already), and
    #: counts as failed two re-send intervals later; an offline one's target is deferred instead.
    deploy_timeout_s: float = 300.0
    #: Promote to the next stage by itself once the health window passes (else wait for `promote`).
    auto_promote: bool = True
    #: Flag the release (console, metrics, ``rollout status``) when more than this fraction of its late targets
    #: (devices that installed it after their stage, on their return) failed, and at least 3 did. A flag never
    #: reverts the group: each failed device already rolled back on its own.
    max_late_failure_rate: float = 0.2
    #: Canary analysis (:mod:`edgesdk.ota_server.rollouts.analysis`): a device fails when its p99 latency on the new
    #: version is more than this many times its board's baseline (the median p99 of the board's devices still on the
    #: old version, else kept from an earlier stage, else its own on its previous version).
    #: None: latency is not judged.
    max_p99_ratio: float | None = 1.5
    #: A device fails when its error rate (failed calls / calls on the new version) is above its board's baseline
    #: (the median rate) by more than this, with 95% confidence (an increase in points, 0.01 = one point; absolute
    #: when there is no baseline), so a fleet whose inputs already fail at some rate can still ship a release that
    #: does no worse, and 2 errors in 100 calls is not a failure. None: not judged.
    max_error_rate: float | None = 0.01
    #: A device fails when the share of its predict_async requests sent to the cloud (cloud / (local + cloud)) is
    #: more than this above its board's baseline share: a slower model saturates the device and offloads more, which
    #: costs money before it costs latency. None: not judged.
    max_offload_share: float | None = 0.25
    #: A device's figures are evidence only once it made this many calls on the new version (the app's calls, not
    #: the bundle's health check); a device failing its calls significantly more often fails with fewer.
    min_calls: int = 100
    #: Judge each stage on its devices' figures (:mod:`edgesdk.ota_server.rollouts.analysis`). False (``push
    #: --no-analysis``) is an explicit choice for fleets that report no figures: stages then pass on install reports
    #: alone, and push says what was not judged.
    analysis: bool = True
    #: A stage passes only when at least this share of its devices, and of each board's devices in it, made
    #: ``min_calls`` calls on the new version (or failed in a way that counts against it); at least one device.
    min_evidence: float = 0.5
    #: How long after its health window a stage may wait for that evidence; then its verdict is inconclusive.
    evidence_grace_s: float = 120.0
    #: What an inconclusive verdict does: ``pause`` (the rollout waits for ``promote`` or ``abort``, saying why) or
    #: ``abort``.
    on_inconclusive: str = "pause"
    #: Baseline figures (a device still on the old version, by when the server last heard from it, or a board's
    #: snapshot kept from an earlier stage) older than this are not used.
    max_baseline_age_s: float = 3600.0

    def __post_init__(self) -> None:
        fractions = (self.canary, *self.waves)
        shown = ",".join(f"{f * 100:g}%" for f in fractions)
        if not all(0 < f <= 1 for f in fractions):
            raise EdgeSDKError(f"canary and waves must be percentages in (0, 100], got {shown}")
        all_at_once = self.canary == 1.0 and self.waves in ((), (1.0,))
        if not all_at_once and (any(b <= a for a, b in zip(fractions, fractions[1:])) or fractions[-1] != 1.0):
            raise EdgeSDKError(f"stages canary,waves = {shown} must increase and end at 100%; "
                               "write e.g. --canary 10% --waves 50,100")
        if not 0 <= self.max_failure_rate < 1 or self.health_window_s < 0 or self.deploy_timeout_s <= 0:
            raise EdgeSDKError("max failure rate must be in [0, 100%), health window >= 0 and timeout > 0")
        if not 0 <= self.max_late_failure_rate <= 1:
            raise EdgeSDKError(f"max late failure rate must be in [0, 100%], got {self.max_late_failure_rate:.0%}")
        if self.max_p99_ratio is not None and not self.max_p99_ratio >= 1:
            raise EdgeSDKError(f"max p99 ratio {self.max_p99_ratio!r} must be >= 1 (1.5: 50% slower than the "
                               "baseline at most), or None to leave latency unjudged")
        for name in ("max_error_rate", "max_offload_share"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise EdgeSDKError(f"{name.replace('_', ' ')} {value!r} must be in [0, 100%] (an increase over the "
                                   "baseline), or None to leave it unjudged")
        if isinstance(self.min_calls, bool) or not isinstance(self.min_calls, int) or self.min_calls < 1:
            raise EdgeSDKError(f"min calls {self.min_calls!r} must be a whole number >= 1 (100 keeps a p99 off "
                               "the model's first, cold call)")
        if not 0 < self.min_evidence <= 1:
            raise EdgeSDKError(f"min evidence {self.min_evidence!r} must be a share in (0, 100%] of a stage's devices "
                               "(50%: half of them must have reported enough calls)")
        if not self.evidence_grace_s >= 0 or not self.max_baseline_age_s > 0:
            raise EdgeSDKError(f"evidence grace {self.evidence_grace_s!r} s must be >= 0 and max baseline age "
                               f"{self.max_baseline_age_s!r} s > 0")
        if self.on_inconclusive not in ("pause", "abort"):
            raise EdgeSDKError(f"on_inconclusive {self.on_inconclusive!r} must be pause or abort")

    @property
    def judged(self) -> bool:
        """Whether stages are judged on the devices' figures: analysis on and at least one threshold set."""
        return self.analysis and any(limit is not None for limit in
                                     (self.max_p99_ratio, self.max_error_rate, self.max_offload_share))

    def not_judged(self) -> list[str]:
        """What this policy leaves unjudged, in words (empty when everything is judged): push prints it."""
        if not self.analysis:
            return ["canary analysis is off (--no-analysis): stages pass on install reports alone"]
        names = {"max_p99_ratio": "latency (--max-p99-ratio off)", "max_error_rate": "errors (--max-error-rate off)",
                 "max_offload_share": "offload share (--max-offload-share off)"}
        unjudged = [text for name, text in names.items() if getattr(self, name) is None]
        if len(unjudged) == len(names):
            return ["every threshold is off: stages pass on install reports alone"]
        return unjudged

    @property
    def stages(self) -> tuple[float, ...]:
        """Every stage's cumulative fraction, the canary first (a repeated 1.0 counted once)."""
        return tuple(dict.fromkeys((self.canary, *self.waves)))

    def to_dict(self) -> dict[str, Any]:
        """The policy as JSON (the API's ``policy`` object and the database column)."""
        return {**asdict(self), "waves": list(self.waves)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutPolicy:
        """A policy from :meth:`to_dict`'s JSON; missing fields take their defaults."""
        return cls(**{**data, "waves": tuple(data.get("waves", (0.5, 1.0)))})
