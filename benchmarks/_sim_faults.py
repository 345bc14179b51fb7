"""Device-side faults for the chaos run (benchmarks/chaos.py), applied inside the simulated fleet's workers.

- ``partition``: the device's connection drops (the broker publishes its will) and it cannot
  reconnect for ``seconds``; what was sent to it meanwhile is lost, as on a cut network link.
- ``crash``: at its next install the device dies after the switch began and before it reported,
  stays down for ``seconds``, and on restart finishes that install (the agent's pending-install
  recovery). Its transfers and its replay guard survive, as they do on the agent's disk.
- ``corrupt``: the next ``chunks`` chunks the device receives arrive with a flipped byte (it must
  refuse each by its signed hash and ask again).
- ``slow``: for ``seconds``, each command reaches the device's handling ``delay_s`` late.
- ``duty``: the device sleeps on a duty cycle: awake (connected) for ``awake_s``, then cut off for ``sleep_s``,
  ``cycles`` times (a transfer it began survives each sleep, as the agent's chunk store does).
- ``claim_group``: from now on the device's state reports (and its will) name ``group`` instead of its own: a
  device that tries to put itself into another group's rollout.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = ["DeviceFaults", "FAULT_COMMANDS", "apply_fault", "cut"]

FAULT_COMMANDS = ("partition", "crash", "corrupt", "slow", "duty", "claim_group")


class DeviceFaults:
    """The faults one simulated device is under."""

    __slots__ = ("blocked_until", "crash_for_s", "pending_install", "corrupt_left", "slow_until", "slow_delay_s",
                 "claimed_group", "sleeps")

    def __init__(self) -> None:
        #: No reconnect before this time.monotonic().
        self.blocked_until = 0.0
        #: Die at the next install, for this many seconds.
        self.crash_for_s: float | None = None
        #: (command, slot, downloaded, details) of the install a crash interrupted.
        self.pending_install: tuple[Any, str, bool, dict[str, Any]] | None = None
        self.corrupt_left = 0
        self.slow_until = 0.0
        self.slow_delay_s = 0.0
        #: The group its reports name instead of its own (None: its own).
        self.claimed_group: str | None = None
        #: Sleeps of its duty cycle so far.
        self.sleeps = 0

    def corrupts(self) -> bool:
        """True when the chunk just received is to be corrupted (one of the ``corrupt`` budget used)."""
        if self.corrupt_left <= 0:
            return False
        self.corrupt_left -= 1
        return True

    def delay(self) -> float:
        """How late a command reaches the device's handling now (0: at once)."""
        return self.slow_delay_s if time.monotonic() < self.slow_until else 0.0


def cut(worker: Any, device: Any, seconds: float) -> None:
    """Drop ``device``'s connection now (the broker publishes its will); it reconnects after ``seconds``."""
    faults = device.faults
    faults.blocked_until = max(faults.blocked_until, time.monotonic() + seconds)
    client = device.client
    if client is None:
        return  # already reconnecting: that loop waits for blocked_until
    device.client = None
    client.abort()
    asyncio.get_running_loop().create_task(worker.connect_with_retry(device, first=False))


async def _duty_cycle(worker: Any, device: Any, awake_s: float, sleep_s: float, cycles: int) -> None:
    for _ in range(cycles):
        await asyncio.sleep(awake_s)
        if worker.stopping:
            return
        device.faults.sleeps += 1
        cut(worker, device, sleep_s)
        await asyncio.sleep(sleep_s)


def apply_fault(worker: Any, request: dict[str, Any]) -> int:
    """Apply the fault ``request`` names to those of its ``ids`` this worker runs; how many that was."""
    ids = set(request["ids"])
    kind = request["cmd"]
    touched = 0
    for device in worker.devices:
        if device.id not in ids:
            continue
        touched += 1
        faults = device.faults
        if kind == "partition":
            cut(worker, device, float(request["seconds"]))
        elif kind == "crash":
            faults.crash_for_s = float(request["seconds"])
        elif kind == "corrupt":
            faults.corrupt_left += int(request["chunks"])
        elif kind == "slow":
            faults.slow_until = time.monotonic() + float(request["seconds"])
            faults.slow_delay_s = float(request["delay_s"])
        elif kind == "duty":
            asyncio.get_running_loop().create_task(_duty_cycle(worker, device, float(request["awake_s"]),
                                                               float(request["sleep_s"]), int(request["cycles"])))
        elif kind == "claim_group":
            faults.claimed_group = str(request["group"])
            device.publish_state()
        else:
            raise ValueError(f"unknown fault {kind!r}; one of {', '.join(FAULT_COMMANDS)}")
    return touched
