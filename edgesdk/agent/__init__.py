"""The device agent: it composes the runtime and the fleet wire into updates that never leave a device without a model.

- :mod:`~edgesdk.agent.agent`: :class:`DeviceAgent`, the MQTT protocol and the order of the steps;
  :mod:`~edgesdk.agent.config`: :class:`AgentConfig` and the broker credentials file.
- :mod:`~edgesdk.agent.admission`: the replay and downgrade rules a verified command must pass.
- :mod:`~edgesdk.agent.downloads` and :mod:`~edgesdk.agent.transfer`: transfers in flight and one resumable
  transfer; :mod:`~edgesdk.agent.local_chunks`: chunks copied from the slots a device holds.
- :mod:`~edgesdk.agent.storage_guard`: room on disk, pruning old slots; :mod:`~edgesdk.agent.store`: the slots
  and pointers; :mod:`~edgesdk.agent.install`: the install transaction with its health check and crash recovery.
- :mod:`~edgesdk.agent.measurements`: the board-measurement service; :mod:`~edgesdk.agent.events` and
  :mod:`~edgesdk.agent.state_report`: what the device publishes; :mod:`~edgesdk.agent.energy_account`: its energy.
- :mod:`~edgesdk.agent.managed` and :mod:`~edgesdk.agent.follow`: :class:`ManagedRuntime`, in the agent's process
  or in an app following the store.

Public API (imported lazily, so ``from edgesdk import ManagedRuntime`` does not load MQTT)::

    from edgesdk.agent import AgentConfig, DeviceAgent, ManagedRuntime, load_credentials

    runtime = ManagedRuntime(profile="rpi5")
    username, password = load_credentials("credentials/cam01.json", "cam01")
    config = AgentConfig(device_id="cam01", group="cams", broker="mqtts://broker:8883", store=Path("/var/lib/edgesdk"),
                         server_key=load_public_key("server.pub"), username=username, password=password)
    with DeviceAgent(config, runtime=runtime):
        ...  # the app calls runtime.predict(); the agent swaps models underneath

:class:`Installer` and :class:`ModelStore` run an install without MQTT (switch, health
check, commit or point back, crash recovery).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgesdk.lazy import lazy_exports

_EXPORTS = {
    "DeviceAgent": "edgesdk.agent.agent",
    "AgentConfig": "edgesdk.agent.config",
    "load_credentials": "edgesdk.fleet.transport",
    "ManagedRuntime": "edgesdk.agent.managed",
    "HealthReport": "edgesdk.agent.managed",
    "health_check": "edgesdk.agent.managed",
    "Installer": "edgesdk.agent.install",
    "InstallOutcome": "edgesdk.agent.install",
    "ModelStore": "edgesdk.agent.store",
    "PendingInstall": "edgesdk.agent.store",
    "StoreState": "edgesdk.agent.store",
}

__all__ = ["DeviceAgent", "AgentConfig", "load_credentials", "ManagedRuntime", "HealthReport", "health_check",
           "Installer", "InstallOutcome", "ModelStore", "PendingInstall", "StoreState"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from edgesdk.agent.agent import DeviceAgent
    from edgesdk.agent.config import AgentConfig
    from edgesdk.agent.install import Installer, InstallOutcome
    from edgesdk.agent.managed import HealthReport, ManagedRuntime, health_check
    from edgesdk.agent.store import ModelStore, PendingInstall, StoreState
    from edgesdk.fleet.transport import load_credentials
