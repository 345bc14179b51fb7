"""The board costs of one conversion's variants: counted under emulation, or why they are scaled from this host.

Split from :mod:`.board_latency` (which turns one count into a latency at any operating point):
this module holds what one conversion decides about emulation as a whole, and which variants the
board itself refused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from edgesdk.converters.board.board_latency import BoardCost, board_cost
from edgesdk.converters.board.emulate import Emulator
from edgesdk.errors import BoardRuntimeError, EmulatorError
from edgesdk.runtime.profiles import DeviceProfile

__all__ = ["ConversionCosts"]

log = logging.getLogger(__name__)


class ConversionCosts:
    """The board costs of one conversion's variants, or why the conversion falls back to scaling host timings.

    ``emulate``: True requires the emulator (:class:`EmulatorError` when it is missing or a
    variant fails under it); False never uses it; None (the default) uses it when it is set up
    and ``EDGESDK_EMULATE`` is not ``0``, and otherwise says in :attr:`note` how to enable it.
    Every variant gets the same basis: a failure of the emulator itself turns emulation off for all; a variant the
    board's own runtime refuses (:class:`BoardRuntimeError`) is recorded in :attr:`failures` and rejected, and the
    others keep their emulated figures.
    """

    def __init__(self, emulate: bool | None, board: DeviceProfile, mode: str, sample: Mapping[str, np.ndarray],
                 emulator: Emulator | None = None, every_cluster: bool = False) -> None:
        self.board, self.mode, self.sample, self.required = board, mode, dict(sample), emulate is True
        self.every_cluster = every_cluster
        self.costs: dict[str, BoardCost] = {}
        #: Variants the board's own runtime refused (label -> its error): rejected, while the others keep their counts.
        self.failures: dict[str, str] = {}
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

    def count(self, label: str, path: Path) -> BoardCost | None:
        """Emulate ``path`` (cached); None when not emulating. A failure in auto mode turns emulation off for all."""
        if self.emulator is None:
            return None
        try:
            cost = self.costs[label] = board_cost(self.emulator, path, self.sample, self.board, self.mode,
                                                       self.every_cluster)
        except BoardRuntimeError as exc:  # the variant, not the emulator: only it is rejected
            self.failures[label] = str(exc)
            log.warning("%s rejected: %s", label, exc)
            return None
        except EmulatorError as exc:
            if self.required:
                raise
            self.emulator, self.costs = None, {}
            self.note = f"board latency scaled from this host's timings: {label} could not be emulated ({exc})"
            return None
        cpus = " and ".join(c.cpu for c in cost.counts)
        self.note = f"board latency from instructions counted on emulated {cpus} ({cost.counts[0].runtime})"
        return cost
