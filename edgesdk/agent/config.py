"""How a device agent is configured: its broker, trust, patience, disk and reporting settings.

:class:`AgentConfig` is validated at construction (the broker credentials file of a device is
read by :func:`edgesdk.fleet.transport.load_credentials`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.errors import BrokerError, EdgeSDKError, SignatureError, StorageError
from edgesdk.fleet.protocol import PREFIX, check_id
from edgesdk.fleet.transport import parse_broker_url
from edgesdk.runtime.profiles import DeviceProfile, load_profile

if TYPE_CHECKING:
    from edgesdk.agent.managed import ManagedRuntime
    from edgesdk.fleet.transport import Transport

__all__ = ["AgentConfig", "resolve_profile"]


@dataclass(frozen=True)
class AgentConfig:
    """How one device agent connects, what it trusts, and how patiently it fetches."""

    device_id: str
    group: str
    broker: str
    store: Path
    #: A pinned server public key commands must be signed with (the alternative to ``root``).
    server_key: Any = None
    #: The fleet's root of trust (a ``root.json`` of ``edgesdk keys init``), installed into the store's
    #: ``trust/`` on the first start; later roots arrive over MQTT. Commands are then verified with its
    #: ``commands`` role. A store that holds a root keeps using it even without this.
    root: str | os.PathLike[str] | None = None
    #: Development only: accept unsigned commands when no server key is pinned.
    allow_unsigned: bool = False
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    #: Refuse a plain ``mqtt://`` broker: commands, chunks and credentials then only travel encrypted
    #: (``mqtts://``, the server's certificate checked against ``ca_file`` or the system's CAs).
    require_tls: bool = False
    #: How many missing chunks one request asks for.
    request_window: int = 32
    #: Re-request missing chunks after this long without progress.
    retry_interval_s: float = 1.0
    #: How long after a deploy command the agent waits for the group broadcast before asking for chunks itself.
    broadcast_wait_s: float = 2.0
    #: The board this device is (its state reports it; a release sends it that board's artifact) and measure commands
    #: run under: a DeviceProfile, a profile name or a YAML path. None: the
    #: ManagedRuntime's profile when the agent has one, else edgesdk.runtime.detect.detect_device().
    profile: str | os.PathLike[str] | DeviceProfile | None = None
    #: Longest a measure command may take here, once for its transfer and once for the measuring.
    measure_timeout_s: float = 600.0
    #: Longest a deploy's archive may take to arrive after its command: a transfer still incomplete then fails
    #: (a trickle of chunks, or chunks withheld), so a slow-retrieval attack cannot hold the device forever.
    transfer_timeout_s: float = 1800.0
    #: How many of its latest protocol events the agent keeps in DeviceAgent.events (the server keeps them all).
    event_history: int = 256
    #: How many of the newest installed slots the agent keeps after a commit or rollback, besides the slots in
    #: use (current, previous, pending) and the pinned ones; older slots are deleted.
    keep_slots: int = 3
    #: Slots never deleted: a slot name (``digits-1.2.0``) or a bare version (``1.2.0``, any model name).
    pinned: tuple[str, ...] = ()
    #: Bytes of disk the agent leaves free for everything else on the device; an update that would eat into
    #: them is refused (after pruning old slots) with a StorageError reason.
    min_free_bytes: int = 0
    #: Where sysfs is: the board's power sensor is found below it (edgesdk.runtime.energy.find_sensor). Tests feed a
    #: recorded tree.
    sysfs_root: str = "/sys"
    #: Publish the retained state (runtime statistics, app traffic, energy) this often besides on
    #: every change; None: only on changes. Every device's state reaches the server: minutes.
    state_interval_s: float | None = 300.0
    #: While the device is judged in a rollout (after committing a command with ``judge_s``),
    #: publish the state this often instead, and have the apps hand over their traffic as often.
    traffic_every_s: float = 10.0
    #: Put the board in the power mode of each bundle installed (cpufreq governor, clock cap, online cores below
    #: ``sysfs_root``, or ``nvpmodel -m`` on a Jetson) and report ``power_mode_applied``; off: the board is left as is.
    apply_power_mode: bool = False
    #: The device's wall clock (seconds since the epoch); a test gives a board without a real-time clock one that
    #: reads 1970 (:mod:`edgesdk.agent.trust_keeper`, "Time without a clock").
    wall_clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        check_id(self.device_id, "device id")
        check_id(self.group, "group")
        if self.require_tls and not parse_broker_url(self.broker).tls:
            raise BrokerError(f"broker {self.broker} is not TLS and this agent requires TLS (require_tls): use "
                              "mqtts://HOST:8883 with --ca-file, or drop --require-tls on a trusted network")
        for name in ("keep_slots", "min_free_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StorageError(f"{name}={value!r} is out of range; pass a whole number of 0 or more")
        if self.state_interval_s is not None and not self.state_interval_s > 0:
            raise EdgeSDKError(f"state_interval_s={self.state_interval_s!r} must be > 0 seconds, or None")
        every = self.traffic_every_s
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not 0 < every <= 3600:
            raise EdgeSDKError(f"traffic_every_s={every!r} is out of range; pass the seconds "
                               "between reports while the device is judged, in (0, 3600] "
                               "(default 10)")
        if isinstance(self.pinned, str) or not all(isinstance(p, str) and p for p in self.pinned):
            raise StorageError(f"pinned={self.pinned!r} is not a list of slot names or versions; pass e.g. "
                               "('digits-1.2.0', '1.1.0')")
        object.__setattr__(self, "pinned", tuple(self.pinned))
        if self.root is not None and self.server_key is not None:
            raise SignatureError("pass the fleet's root of trust (root) or a pinned server key (server_key), not both: "
                                 "with a root, the commands role names the server's keys")


    def offline_state(self, session: float | None = None, connection: int | None = None) -> bytes:
        """The retained state of this device while it is gone (its last will, and what it says on stopping);
        ``session`` is when this run of the agent began and ``connection`` which of its connections ends, which its
        online states say too: whichever replica writes first, the server never lets an earlier connection's will
        overwrite a later one's report, nor a report sent before a connection dropped overwrite its will."""
        state = {"status": "offline", "group": self.group, **({"session": session} if session is not None else {}),
                 **({"connection": connection} if connection is not None else {})}
        return json.dumps(state).encode()

    def connect(self, factory: Callable[..., Transport], on_connect: Callable[[], None],
                on_refused: Callable[[BrokerError], None], session: float | None = None) -> Transport:
        """A connection to the broker as this device (``factory``: :class:`~edgesdk.fleet.transport.MqttTransport`
        or a stand-in), with the retained "offline" state of each connection (of run ``session``) as its last will;
        ``on_connect`` runs on every (re)connect, since a restarted broker forgets retained messages."""
        topic = f"{PREFIX}/devices/{self.device_id}/state"
        return factory(self.broker, client_id=f"edgesdk-agent-{self.device_id}", username=self.username,
                       password=self.password, will=lambda connection: (topic, self.offline_state(session, connection)),
                       ca_file=self.ca_file, on_connect=on_connect, on_refused=on_refused)


def resolve_profile(config: AgentConfig, runtime: ManagedRuntime | None = None) -> DeviceProfile:
    """The board measure commands run under: ``config.profile``, else the ManagedRuntime's, else the detected one."""
    if config.profile is not None:
        return load_profile(config.profile)
    if runtime is not None:
        return runtime.profile
    from edgesdk.runtime.detect import detect_device

    return detect_device()
