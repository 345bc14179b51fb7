"""A paho-mqtt client whose network thread reads every packet already waiting, not one per wake-up.

paho's ``loop_read`` reads as many packets per wake-up as the client has QoS 1 messages in flight,
and at least one. A server that publishes little while thousands of device reports arrive (a
rollout's answers) has next to nothing in flight, so it read one report per ``select()`` and loop
pass while hundreds waited in the socket. :func:`client_class` reads on until the socket is empty,
up to :data:`READ_BURST` packets, then lets the loop write (the acknowledgements) and keep the
connection alive as usual.

It overrides paho's ``loop_read`` with paho's own private steps (``_packet_read``,
``_loop_rc_handle``, the same calls paho's version makes). A paho without them gets its own client.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["READ_BURST", "client_class"]

#: Packets read per wake-up at most: enough to empty a burst, few enough that writes and keep-alive come soon.
READ_BURST = 64


@functools.cache
def client_class() -> Any:
    """The paho ``Client`` class to instantiate: one reading bursts, or paho's own when its internals differ."""
    import paho.mqtt.client as mqtt

    if not all(hasattr(mqtt.Client, name) for name in ("_packet_read", "_loop_rc_handle")):
        return mqtt.Client

    class BurstReadingClient(mqtt.Client):  # type: ignore[misc]
        """paho's client, reading up to :data:`READ_BURST` waiting packets per wake-up."""

        def loop_read(self, max_packets: int = 1) -> Any:
            in_flight = len(getattr(self, "_out_messages", ())) + len(getattr(self, "_in_messages", ()))
            for _ in range(max(in_flight, READ_BURST)):  # paho's count, or more
                if self._sock is None:
                    return mqtt.MQTT_ERR_NO_CONN
                rc = self._packet_read()
                if rc > 0:
                    return self._loop_rc_handle(rc)
                if rc == mqtt.MQTT_ERR_AGAIN:  # the socket is empty
                    return mqtt.MQTT_ERR_SUCCESS
            return mqtt.MQTT_ERR_SUCCESS

    return BurstReadingClient
