"""The board costs of one conversion's variants: counted under emulation, or why they are scaled from this host.

Split from :mod:`.board_latency` (which turns one count into a latency at any operating point):
this module holds what one conversion decides about emulation as a whole, and which variants the
board itself refused.

**What a failure turns off.** A variant that fails on the emulated board, however it fails
(its runtime refuses it, it crashes with a signal, it does not finish in the emulator's
``timeout_s``, it exits or stops before its counted runs end), is vetoed alone: it is in
:attr:`ConversionCosts.failures` with the board's reason, and the other variants keep their
emulated figures. Emulation is turned off for every variant (:attr:`ConversionCosts.note` says
why) only when the emulator itself fails (no userland, no qemu, a profile core it cannot
emulate: an :class:`EmulatorError` that is not a :class:`BoardRuntimeError`), or when the
*reference* variant (FP32, which every variant's latency is compared with) fails on the board:
without its count no other count can be compared with anything, so every variant is costed
from this host's timings, FP32 included, and the note names FP32's failure. FP32 is not vetoed
then: its accuracy is the reference, and a board that cannot run the model at all is a finding
about the model, said in the note, not a reason to ship a variant that was never compared.

**In parallel.** :meth:`ConversionCosts.submit` starts a count and returns at once (on a
:class:`~.parallel_counts.CountPool` of ``workers`` threads, one per usable core by default);
:meth:`ConversionCosts.cost` waits for one, :meth:`ConversionCosts.wait_all` for all, with
progress. Outcomes are recorded in submission order, the reference's first, so the results are
those of counting one variant after another.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from edgesdk.converters.board.board_latency import BoardCost, board_cost
from edgesdk.converters.board.emulate import Emulator
from edgesdk.converters.board.parallel_counts import CountPool
from edgesdk.errors import BoardRuntimeError, EmulatorError
from edgesdk.runtime.profiles import DeviceProfile

__all__ = ["ConversionCosts"]

log = logging.getLogger(__name__)


class ConversionCosts:
    """The board costs of one conversion's variants, or why the conversion falls back to scaling host timings.

    ``emulate``: True requires the emulator (:class:`EmulatorError` when it is missing or a
    variant fails under it); False never uses it; None (the default) uses it when it is set up
    and ``EDGESDK_EMULATE`` is not ``0``, and otherwise says in :attr:`note` how to enable it.
    Every variant gets the same basis: a failure of the emulator itself, or of the ``reference``
    variant on the board, turns emulation off for all; a variant that fails on the board
    (:class:`BoardRuntimeError`: refused, crashed, hung, stopped) is recorded in :attr:`failures`
    and rejected, and the others keep their emulated figures (see the module doc). ``workers``
    counts run at once (default: one per usable core).
    """

    def __init__(self, emulate: bool | None, board: DeviceProfile, mode: str, sample: Mapping[str, np.ndarray],
                 emulator: Emulator | None = None, every_cluster: bool = False,
                 workers: int | None = None, reference: str = "onnx-fp32") -> None:
        self.board, self.mode, self.sample, self.required = board, mode, dict(sample), emulate is True
        self.every_cluster, self.reference = every_cluster, reference
        self.costs: dict[str, BoardCost] = {}
        #: Variants that failed on the emulated board (label -> the board's reason): rejected, while
        #: the others keep their counts. Complete once :meth:`wait_all` returned.
        self.failures: dict[str, str] = {}
        self._pool = CountPool(workers)
        self._settled: set[str] = set()
        self.emulator: Emulator | None = None
        self.note = ""
        if emulate is False or (emulate is None and os.environ.get("EDGESDK_EMULATE") == "0"):
            self.note = "board latency scaled from this host's timings (emulation turned off)"
            return
        if board.arch not in ("aarch64", "arm64"):
            self.note = f"board latency scaled from this host's timings ({board.name} is {board.arch}, not emulated)"
            if self.required:
                raise EmulatorError(f"profile {board.name!r} is {board.arch}; only aarch64 boards are emulated: leave out "
                                   "--emulate (emulate=True) to scale this host's timings")
            return
        try:
            self.emulator = emulator or Emulator()
        except EmulatorError as exc:
            if self.required:
                raise
            self.note = f"board latency scaled from this host's timings, not emulated: {exc}"
            log.warning("%s is %s and the board emulator is not set up, so its latencies are this host's timings "
                        "scaled (an int8 kernel for arm64 says little on x86): set it up once with `edgesdk emulator "
                        "setup` (%s) to count instructions on the board's own cores", board.name, board.arch, exc)

    @property
    def active(self) -> bool:
        """Variants are costed by emulation."""
        return self.emulator is not None

    def submit(self, label: str, path: Path) -> None:
        """Start counting ``path`` as ``label`` alongside whatever runs next, and return at once
        (nothing when not emulating, or when ``label`` was submitted before)."""
        emulator = self.emulator
        if emulator is None or label in self._pool:
            return
        self._pool.submit(label, lambda: board_cost(emulator, path, self.sample, self.board,
                                                    self.mode, self.every_cluster))

    def cost(self, label: str) -> BoardCost | None:
        """Wait for ``label``'s count (and the reference's): its cost, or None when it is not
        emulated (emulation off, never submitted, or vetoed: then it is in :attr:`failures`)."""
        for name in (self.reference, label):
            if name in self._pool:
                self._settle(name)
        return self.costs.get(label)

    def count(self, label: str, path: Path) -> BoardCost | None:
        """:meth:`submit` then :meth:`cost`: emulate ``path`` (cached) and wait for it."""
        self.submit(label, path)
        return self.cost(label)

    def wait_all(self, progress: Callable[[str, int, int], None] | None = None) -> None:
        """Wait for every count submitted, calling ``progress(line, done, total)`` as they finish
        (the line says how many are done and about how long is left); then :attr:`costs` and
        :attr:`failures` are complete."""
        if self.emulator is not None:
            self._pool.wait_all(progress)
        for label in (self.reference, *self._pool.labels()):
            if label in self._pool:
                self._settle(label)
        self._pool.close()

    def _settle(self, label: str) -> None:
        """Record ``label``'s finished count: its cost, its veto, or emulation turned off."""
        if label in self._settled or self.emulator is None:
            return
        self._settled.add(label)
        try:
            cost = self._pool.result(label)
        except BoardRuntimeError as exc:
            if label != self.reference:  # the variant, not the emulator: only it is rejected
                self.failures[label] = str(exc)
                log.warning("%s rejected: %s", label, exc)
                return
            if self.required:
                self._stop()
                raise BoardRuntimeError(
                    f"{label}, the reference every variant is compared with, could not be "
                    f"counted on the emulated board: {exc}. Without --emulate (emulate=True) the "
                    "converter scales this host's timings instead") from exc
            self._off(f"board latency scaled from this host's timings: {label}, the reference "
                      "every variant is compared with, could not be counted on the emulated board "
                      f"({exc})")
            return
        except EmulatorError as exc:
            if self.required:
                self._stop()
                raise
            self._off(f"board latency scaled from this host's timings: {label} could not be "
                      f"emulated ({exc})")
            return
        self.costs[label] = cost
        cpus = " and ".join(c.cpu for c in cost.counts)
        self.note = f"board latency from instructions counted on emulated {cpus} ({cost.counts[0].runtime})"

    def _off(self, note: str) -> None:
        """Emulation off for every variant: no costs, no vetoes (from an emulator not trusted)."""
        log.warning("%s", note)
        self._stop()
        self.emulator, self.costs, self.failures, self.note = None, {}, {}, note

    def _stop(self) -> None:
        """Drop the counts not started and kill the ones running (their results would not be
        used); returns when no guest of this conversion is left."""
        emulator = self.emulator
        self._pool.stop(emulator.abort if emulator is not None else lambda: None)
        self._pool.close()
