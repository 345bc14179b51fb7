"""Which commands are this device's: verified with its keys, judged at its time, bound to it and its group.

A command is verified with the ``commands`` role of the device's root of trust, or with the pinned
server key (:func:`edgesdk.fleet.protocol.parse_command`), and its expiry judged at the device's
time: with a root, the later of its clock and the newest signed timestamp's (a board without a
real-time clock: :meth:`~edgesdk.agent.trust_keeper.TrustKeeper.command_time`). Pinned-key mode
still takes commands of earlier servers (naming no device, never expiring): it is for development
and migration, and the agent says so once.

The device's group is the one the server put it in. A command bound to this device that names
another group means the operator moved it (``edgesdk devices provision``): from then on the agent
reports that group, kept in its store (``group.json``) across restarts, whatever ``--group`` says.
"""

from __future__ import annotations

import dataclasses
import logging

from edgesdk.agent.config import AgentConfig
from edgesdk.agent.store import ModelStore
from edgesdk.agent.trust_keeper import TrustKeeper
from edgesdk.fleet.protocol import Command, MeasureCommand, check_id, parse_command

__all__ = ["CommandReader", "with_assigned_group"]

log = logging.getLogger("edgesdk.agent.agent")


def with_assigned_group(config: AgentConfig, store: ModelStore) -> AgentConfig:
    """``config`` with the group the server moved this device to, when a command said so before (module doc)."""
    assigned = store.assigned_group()
    if assigned is None or assigned == config.group:
        return config
    log.warning("%s: the server moved this device to group %r (--group says %r): reporting %r; change --group to "
                "match", config.device_id, assigned, config.group, assigned)
    return dataclasses.replace(config, group=check_id(assigned, "group"))


class CommandReader:
    """Reads this device's commands (module doc)."""

    def __init__(self, trust: TrustKeeper | None, store: ModelStore) -> None:
        self.trust, self.store = trust, store
        self._warned = False

    def read(self, envelope: bytes, config: AgentConfig) -> Command | MeasureCommand:
        """The command ``envelope`` carries, verified for ``config``'s device; SignatureError or TransferError (a
        subclass or the other) when it is not this device's to follow."""
        if self.trust is None and config.server_key is not None and not self._warned:
            self._warned = True
            log.warning("%s: a pinned server key, no root of trust: commands of earlier servers (naming no device, "
                        "never expiring) are still taken and keys cannot be rotated; for development and migration "
                        "only, give production devices the fleet's root (--root)", config.device_id)
        keys = self.trust.command_keys() if self.trust is not None else config.server_key
        clock = config.wall_clock()
        now = self.trust.command_time(clock) if self.trust is not None else clock
        return parse_command(envelope, keys, config.allow_unsigned, now=now, to=config, strict=self.trust is not None)

    def moved(self, command: Command, config: AgentConfig) -> AgentConfig | None:
        """``config`` in the group ``command`` names, when it is bound to this device for another group (the
        operator moved it; kept in the store); None when it is not a move."""
        if command.device != config.device_id or command.group == config.group:
            return None
        log.warning("%s: moved by the server from group %r to %r (a command bound to this device says so); reporting "
                    "%r from now on; change --group to match", config.device_id, config.group, command.group,
                    command.group)
        self.store.assign_group(command.group)
        return dataclasses.replace(config, group=command.group)


