"""Device-side faults for the chaos run (benchmarks/fleet/chaos.py), applied inside the simulated fleet's workers.

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
- ``heal``: a cut-off device (partitioned, crashed, asleep) may reconnect ``seconds`` from now, sooner than its
  fault said (never later): a long partition ended at a chosen moment, e.g. just after a broker restart.

A numeric parameter may be one number for every device or a dict ``{device id: number}`` (each device its
own partition length, or its own ``offset_s``: the duty cycle begins with a sleep that long, so the fleet's
devices wake out of step).
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

__all__ = ["DeviceFaults", "FAULT_COMMANDS", "apply_fault", "cut", "wait_unblocked"]

FAULT_COMMANDS = ("partition", "crash", "corrupt", "slow", "duty", "claim_group", "heal")


class DeviceFaults:
    """The faults one simulated device is under."""

    __slots__ = ("blocked_until", "crash_for_s", "pending_install", "corrupt_left", "slow_until", "slow_delay_s",
                 "claimed_group", "sleeps", "wake")

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
        #: Set by a ``heal`` while the device waits out ``blocked_until`` (see :func:`wait_unblocked`).
        self.wake: asyncio.Event | None = None

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
    device.client = device.link = None
    client.abort()
    asyncio.get_running_loop().create_task(worker.connect_with_retry(device, first=False))


async def wait_unblocked(device: Any) -> None:
    """Sleep while ``device`` may not reconnect (a ``heal`` wakes it early)."""
    faults = device.faults
    while (blocked := faults.blocked_until - time.monotonic()) > 0:
        faults.wake = asyncio.Event()
        try:
            await asyncio.wait_for(faults.wake.wait(), blocked)
        except asyncio.TimeoutError:
            pass
        finally:
            faults.wake = None


def _heal(device: Any, seconds: float) -> None:
    faults = device.faults
    faults.blocked_until = min(faults.blocked_until, time.monotonic() + seconds)
    if faults.wake is not None:
        faults.wake.set()


async def _duty_cycle(worker: Any, device: Any, awake_s: float, sleep_s: float, cycles: int,
                      offset_s: float) -> None:
    if offset_s > 0:  # asleep first, so devices given different offsets wake out of step
        device.faults.sleeps += 1
        cut(worker, device, offset_s)
        await asyncio.sleep(offset_s)
    for _ in range(cycles):
        await asyncio.sleep(awake_s)
        if worker.stopping:
            return
        device.faults.sleeps += 1
        cut(worker, device, sleep_s)
        await asyncio.sleep(sleep_s)


def _param(request: dict[str, Any], device_id: str, name: str, default: Any = None) -> Any:
    """The request's ``name`` for one device: one value for all, or the device's own from a dict."""
    given = request.get(name, default)
    return given[device_id] if isinstance(given, dict) else given


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
        value = functools.partial(_param, request, device.id)
        if kind == "partition":
            cut(worker, device, float(value("seconds")))
        elif kind == "crash":
            faults.crash_for_s = float(value("seconds"))
        elif kind == "corrupt":
            faults.corrupt_left += int(value("chunks"))
        elif kind == "slow":
            faults.slow_until = time.monotonic() + float(value("seconds"))
            faults.slow_delay_s = float(value("delay_s"))
        elif kind == "duty":
            asyncio.get_running_loop().create_task(_duty_cycle(
                worker, device, float(value("awake_s")), float(value("sleep_s")), int(value("cycles")),
                float(value("offset_s", 0.0))))
        elif kind == "heal":
            _heal(device, float(value("seconds")))
        elif kind == "claim_group":
            faults.claimed_group = str(request["group"])
            device.publish_state()
        else:
            raise ValueError(f"unknown fault {kind!r}; one of {', '.join(FAULT_COMMANDS)}")
    return touched
