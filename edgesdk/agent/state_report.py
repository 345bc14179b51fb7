"""The retained state a device agent publishes: what it runs, what its store holds, how it does.

:func:`device_state` makes the document; :class:`StateReporter` holds what it is made from (the
energy account, the apps' traffic) and when it goes out besides on every change
(:class:`~edgesdk.agent.report_cadence.ReportCadence`).
"""

from __future__ import annotations

import time
from typing import Any

from edgesdk.agent.app_traffic import TrafficReporter
from edgesdk.agent.config import AgentConfig
from edgesdk.agent.energy_account import EnergyAccount, NoEnergy, runtime_energy
from edgesdk.agent.events import EventLog
from edgesdk.agent.local_chunks import LAYOUTS
from edgesdk.agent.managed import ManagedRuntime
from edgesdk.agent.power_keeper import PowerModeKeeper
from edgesdk.agent.report_cadence import ReportCadence
from edgesdk.agent.rollback_floor import RollbackFloors
from edgesdk.agent.store import ModelStore
from edgesdk.agent.trust_keeper import TrustKeeper
from edgesdk.errors import BundleError
from edgesdk.runtime.profiles import DeviceProfile

__all__ = ["device_state", "StateReporter"]


def device_state(config: AgentConfig, store: ModelStore, runtime: ManagedRuntime | None,
                 energy: EnergyAccount | NoEnergy, trust: TrustKeeper | None = None,
                 session: float | None = None, board: DeviceProfile | None = None,
                 power: PowerModeKeeper | None = None, connection: int | None = None,
                 traffic: dict[str, Any] | None = None) -> dict[str, Any]:
    """The state document: model and version, slots (and which have a chunk layout), disk and retention, and, with a
    ManagedRuntime, its statistics (calls, latency percentiles, and where predict_async requests ran: local, cloud,
    refused) and its energy per inference since the last report where the board has a power sensor
    (:mod:`edgesdk.agent.energy_account`; else ``{"sensor": None, "note": ...}``); with a root of trust, its version and
    expiry (``trust``: ``stale`` when its newest timestamp expired, ``root_expired`` when the root did, and then
    ``accepts_deploys`` is false); each model's rollback floor and the release that set it (``rollback_floors``, taken
    from the committed slot as the state is made); ``session``: when this run of the agent began and ``connection``:
    which of its connections the state goes out on (its last will says both, so the server never lists the device online
    from a state sent before that connection dropped); ``board``: the profile the agent runs as (``profile`` and
    ``arch``: the server sends the device its board's artifact of a release); ``power``: with ``--apply-power-mode``,
    whether the board is in the serving bundle's power mode (``power_mode_applied``) and ``power_mode`` (its name,
    settings, and otherwise the reason and the commands that apply it by hand;
    :class:`~edgesdk.agent.power_keeper.PowerModeKeeper`); ``traffic``: what the device's apps
    served per model version over the last 15 minutes (:mod:`edgesdk.fleet.traffic`, made by
    :class:`~edgesdk.agent.app_traffic.TrafficReporter`), which rollouts are judged on."""
    current = store.current_model()
    slots = sorted(p.name for p in store.slots.iterdir() if not p.name.startswith("."))
    state: dict[str, Any] = {
        "status": "online", "group": config.group, "model": current[0] if current else None,
        "version": current[1] if current else None, "previous": store.pointer("previous"), "slots": slots,
        "chunk_slots": [slot for slot in slots if (store.root / LAYOUTS / f"{slot}.json").is_file()],
        "disk": store.disk_usage(), "keep_slots": config.keep_slots, "pinned": list(config.pinned),
        "updated": time.time(), **({"session": session} if session is not None else {}),
        **({"connection": connection} if connection is not None else {}),
        **({"profile": board.name, "arch": board.arch} if board is not None else {})}
    if trust is not None:
        state["trust"] = trust.state()
    if power is not None:
        state.update(power.report())
    try:
        floors = RollbackFloors(store)
        floors.observe()
        state["rollback_floors"] = floors.report()
    except BundleError as exc:
        state["rollback_floors"] = {"error": str(exc)}
    if traffic is not None:
        state["traffic"] = traffic
    if runtime is not None:
        stats = runtime.stats()
        state["runtime"] = stats.as_dict()
        state["energy"] = energy.report(stats.count)
    return state


class StateReporter:
    """What a device agent publishes as its retained state, and when besides on every change.

    It owns the energy account, the app traffic reader (:class:`TrafficReporter`, which makes
    ``STORE/apps``) and the cadence (:class:`ReportCadence`), which listens to ``events``: a
    judged command's commit makes the state go out every ``traffic_every_s`` for its ``judge_s``.
    """

    def __init__(self, config: AgentConfig, store: ModelStore, runtime: ManagedRuntime | None,
                 board: DeviceProfile, trust: TrustKeeper | None, power: PowerModeKeeper | None,
                 events: EventLog | None = None) -> None:
        self.config, self.store, self.runtime, self.board = config, store, runtime, board
        self.trust, self.power = trust, power
        #: Energy per inference from the board's power sensor, or why there is none.
        self.energy = runtime_energy(board, runtime, config.sysfs_root)
        #: When this run of the agent began: its states and its will carry it
        #: (:meth:`AgentConfig.offline_state`).
        self.session = time.time()
        #: What the device's apps served per model version (their files and the agent's runtime).
        self.traffic = TrafficReporter(store.root, runtime, label=config.device_id)
        #: When the state goes out besides on changes (fast while the device is judged).
        self.cadence = ReportCadence(config.state_interval_s, config.traffic_every_s,
                                     self.traffic.judge_until)
        if events is not None:
            events.on_event = self.cadence.observe

    def state(self, connection: int | None = None) -> dict[str, Any]:
        """The state document now (:func:`device_state`), sent on ``connection``."""
        return device_state(self.config, self.store, self.runtime, self.energy, self.trust,
                            self.session, self.board, self.power, connection,
                            traffic=self.traffic.report())
